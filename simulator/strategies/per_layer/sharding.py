"""The sharding algebra of per-layer parallelism: sizes, per-device work, tensor layouts, reshards.

**Dimensions of a layer.** ``batch`` is the global batch; for a feature map (C, H, W) output,
``channels`` is C and ``rows`` × ``cols`` are H × W; for tokens (S, F) ``sequence`` is S and
``channels`` F; ``reduction`` is the input's C (or F); ``heads`` an attention layer's heads.

**Per-device work** (:func:`shard_ops`). Every kernel of the layer is cut by the split: its FLOPs
and HBM bytes scale by ``ratio`` = Π ceil(size/cut)/size over the cut dimensions (1/devices when
the cuts divide; with ``uneven: round_up`` the first device's larger block, which sets the pace).
GEMM shapes follow the roles of the implicit GEMM (cuDNN, Chetlur et al. 2014): forward
M = N·H·W (or N·S) cut by batch·rows·cols·sequence, N = C_out cut by channels (and heads, except
an output projection, whose K they cut), K = C_in·kh·kw cut by reduction; the data gradient swaps
N and K, the weight gradient has (C_in·kh·kw, C_out, N·H·W). Attention cores: the (sample × head)
batch cut by batch·heads, the queries by sequence.

**Tensor layouts.** An activation between two layers is the tensor (N, C, H, W), (N, S, F) or
(N, F). A producer leaves it cut by (batch, channels·[heads of non-attention], rows, cols,
sequence) with partial sums pending over its ``reduction`` (and an attention layer's heads: the
row-parallel output projection). A consumer reads it cut by (batch, reduction, rows, cols,
sequence) if it mixes channels (convolution, linear, attention...), and then replicated over its
channels·heads; a per-channel layer (normalisation, activation, pooling, add) reads C cut by its
``channels``.

**Reshard volume** (:func:`exact_volume`): every block is an index box (per dimension, part i
of a size d cut in p is [i·ceil(d/p), (i+1)·ceil(d/p)) clipped to d; a device's part along a
dimension is the mixed-radix number of its coordinates on the fields that cut it, as
:func:`subgroup` numbers the devices). Device r receives the elements of its new block that its
old block lacks, ``|D_r| - |D_r ∩ S_r|`` (all of ``D_r`` if it is new to the layer), and each
element a device lacks is sent by its h = devices / Π parts holders in equal shares; the busiest
receiver and sender set the volume, counted exactly by intersecting boxes (tested against
element-by-element ownership on small shapes, cuts that do not divide and bursts included).
Where the cuts nest (each new block holds the old or lies inside it) this is the closed form
``|T|·(1/Π q - 1/Π max(p, q))``; where they do not (2×2 batch×channels to 4 channel parts) a
device may hold none of its new block. Partial sums are resolved first: a reduce-scatter over
the partial group when the new layout cuts the tensor that much finer on the same devices (group
member j keeps the j-th slice), else an all-reduce. The rest is an all-gather (nested blocks,
each device keeping its own), an all-to-all over n (equal blocks, each device keeping 1/n of its
own), a general all-to-all over the changed fields' sub-communicator whose bus volume is the
exact volume, or, between device sets of different sizes (bursts), a point-to-point
scatter/gather. Each collective's NCCL bus volume (simulator/cost/collectives.py) equals the
exact volume (tested).

**Backward** is the adjoint (DistDL, Hewett & Grady 2020, Sec. 3): the gradient goes from the
consumer's layout, partial over the consumer's channel group (each output-channel shard
contributes part of the input gradient), back to the producer's, replicated over its partial
group: all-gather ↔ reduce-scatter, all-reduce ↔ nothing, all-to-all ↔ all-to-all.
"""

from __future__ import annotations

import fnmatch
import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from simulator.errors import ConfigError
from simulator.strategies.per_layer.config import (
    REPLICA_FIELDS,
    SPLIT_FIELDS,
    SPLITTABLE_OF,
    PerLayerConfig,
    Split,
)
from workloads.graph import Op
from workloads.layer_graph import Layer, LayerGraph

#: Layer kinds whose output channels mix all input channels (their input is replicated over
#: their output-channel cut); every other kind works per channel.
CHANNEL_MIXING: frozenset[str] = frozenset({
    "conv2d", "conv_transpose2d", "linear", "attention", "lstm", "embedding", "transformer_block", "lm_head",
    "mlp_block", "patch_embedding", "loss", "softmax",
})


# --------------------------------------------------------------------------- sizes


def layer_sizes(layer: Layer, batch: int) -> dict[str, int]:
    """The size of each split dimension of ``layer`` at global batch ``batch`` (those it has)."""
    sizes = {"batch": batch}
    out = layer.output_shape or ()
    if len(out) == 3:
        sizes.update(channels=out[0], rows=out[1], cols=out[2])
    elif len(out) == 2:
        sizes.update(sequence=out[0], channels=out[1])
    elif len(out) == 1:
        sizes["channels"] = out[0]
    inp = layer.input_shape or ()
    if inp:
        sizes["reduction"] = inp[0] if len(inp) == 3 else inp[-1]
    heads = [op.batch // batch for op in layer.forward if op.kind == "attention" and op.batch >= batch]
    if heads:
        sizes["heads"] = heads[0]
    return sizes


def rule_of(graph: LayerGraph, cfg: PerLayerConfig, index: int) -> int | None:
    """The index of the last rule of ``strategy.layers`` that names layer ``index`` (None: the default)."""
    layer, found = graph.layers[index], None
    for i, rule in enumerate(cfg.layers):
        if (rule.match is not None and fnmatch.fnmatchcase(layer.name, rule.match)) or (
                rule.range is not None and rule.range[0] <= index <= rule.range[1]):
            found = i
    return found


def resolve_split(graph: LayerGraph, cfg: PerLayerConfig, index: int, num_gpus: int) -> Split:
    """The split of layer ``index``: the last rule that names it, else the default (dimensions the
    layer cannot cut folded into batch); checked against the layer and the cluster."""
    layer = graph.layers[index]
    rule = rule_of(graph, cfg, index)
    if rule is None:
        chosen, where = _fold_into_batch(cfg.default, layer, graph.micro_batch), "strategy.default"
    else:
        chosen, where = cfg.layers[rule].resolved, f"strategy.layers.{rule}"
    return check_split(layer, chosen, graph.micro_batch, num_gpus, cfg.uneven, where)


def default_folds(graph: LayerGraph, cfg: PerLayerConfig) -> tuple[int, dict[tuple[str, str], dict[str, int]]]:
    """How the default split lands: the number of layers no rule names (they take ``strategy.default``),
    and for those on which a cut of the default folds into batch (:func:`_fold_into_batch`: the layer
    cannot make it), ``(default label, split run) -> {layer kind: count}``. What the plan says it runs
    (simulator/strategies/per_layer/kind.py, :func:`split_report`)."""
    takers, folded = 0, {}
    for index, layer in enumerate(graph.layers):
        if rule_of(graph, cfg, index) is not None:
            continue
        takers += 1
        run = _fold_into_batch(cfg.default, layer, graph.micro_batch)
        if run != cfg.default:
            kinds = folded.setdefault((cfg.default.label(), run.label()), {})
            kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
    return takers, folded


def refuse_default_cut_no_layer_takes(graph: LayerGraph, cfg: PerLayerConfig) -> None:
    """A cut of ``strategy.default`` (other than batch) that no layer taking the default can make is
    refused, naming the field: folded into batch on every such layer, it would run a different plan
    than the one written without a word (``default: {heads: 8}`` on a decoder LLM, whose transformer
    blocks have no shapes in the graph, ran batch-split on every layer). A cut some of those layers make
    stays, folded on the others (Gholami et al. 2018 Sec. 3.4's integrated layout), and the plan says
    where (:func:`default_folds`)."""
    cuts = {f: n for f, n in cfg.default.cuts().items() if f != "batch"}
    if not cuts:
        return
    takers = [i for i in range(len(graph.layers)) if rule_of(graph, cfg, i) is None]
    if not takers:
        return
    for field, n in cuts.items():
        if any(getattr(_fold_into_batch(cfg.default, graph.layers[i], graph.micro_batch), field) > 1 for i in takers):
            continue
        kinds: dict[str, int] = {}
        for i in takers:
            kinds[graph.layers[i].kind] = kinds.get(graph.layers[i].kind, 0) + 1
        shapeless = all(graph.layers[i].output_shape is None for i in takers)
        why = ("they have no shapes in the graph (a transformer builder's blocks) and split by batch only"
               if shapeless else f"{'it' if len(kinds) == 1 else 'they'} cannot be split by {field}")
        folded = _fold_into_batch(cfg.default, graph.layers[takers[0]], graph.micro_batch)
        raise ConfigError(f"strategy.default.{field}",
                          f"no layer of {graph.name} that takes the default can be split by {field} "
                          f"({len(takers)} layers: {', '.join(f'{k} x{c}' for k, c in kinds.items())}; {why}): "
                          f"{field} {n} would fold into batch and every such layer run {folded.label()}; give "
                          f"{{batch: {folded.batch}}} to mean that"
                          + (", or the spmd kind's tp for Megatron's split" if shapeless else ""))


def check_rules_name_layers(graph: LayerGraph, cfg: PerLayerConfig) -> None:
    """Refuse a rule that names no layer of the graph (a misspelt ``match`` pattern, a ``range``
    past the last layer): it would leave the default split in place without a word."""
    count = len(graph.layers)
    for i, rule in enumerate(cfg.layers):
        if rule.match is not None and not any(fnmatch.fnmatchcase(layer.name, rule.match) for layer in graph.layers):
            near = [layer.name for layer in graph.layers][:3]
            raise ConfigError(f"strategy.layers.{i}.match", f"{rule.match!r} matches no layer of {graph.name} "
                                                            f"(its {count} layers are named like {', '.join(near)}, ...)")
        if rule.range is not None and rule.range[0] >= count:
            raise ConfigError(f"strategy.layers.{i}.range", f"{list(rule.range)} names no layer of {graph.name} "
                                                            f"(layers 0 to {count - 1})")


def _fold_into_batch(split: Split, layer: Layer, batch_size: int) -> Split:
    """The default's cuts that ``layer`` cannot make (not splittable, or a dimension its output
    lacks: rows of a token sequence), moved into its batch cut (same devices)."""
    folded, batch = {}, split.batch
    sizes = layer_sizes(layer, batch_size) if layer.output_shape is not None else {"batch": batch_size}
    for field in SPLIT_FIELDS[1:]:
        n = getattr(split, field)
        if n > 1 and (SPLITTABLE_OF[field] not in layer.splittable or field not in sizes):
            batch *= n
            folded[field] = 1
    return split.model_copy(update={**folded, "batch": batch}) if folded else split


def check_split(layer: Layer, split: Split, batch: int, num_gpus: int, uneven: str, where: str) -> Split:
    """Refuse a split that names a dimension the layer cannot cut, cuts one into more parts than it
    has, does not divide it (``uneven: refuse``) or needs more devices than the cluster has."""
    sizes = layer_sizes(layer, batch)
    for field, n in split.cuts().items():
        if layer.output_shape is None and field != "batch":
            raise ConfigError(f"{where}.split.{field}", f"layer {layer.name} ({layer.kind}) has no shapes in its graph "
                                                        "(a transformer builder's block): it splits by batch only")
        if SPLITTABLE_OF[field] not in layer.splittable or field not in sizes:
            raise ConfigError(f"{where}.split.{field}", f"layer {layer.name} ({layer.kind}) cannot be split by "
                                                        f"{field} (it splits: {', '.join(sorted(layer.splittable))})")
        size = sizes[field]
        if n > size:
            raise ConfigError(f"{where}.split.{field}", f"layer {layer.name}: {n} parts of a dimension of {size}")
        if size % n and (uneven == "refuse" or field == "batch"):
            raise ConfigError(f"{where}.split.{field}", f"layer {layer.name}: {n} does not divide {field} {size}"
                              + ("" if field == "batch" else " (uneven: round_up lets the first device take the "
                                                             "larger part)"))
    if split.devices > num_gpus:
        raise ConfigError(f"{where}.split", f"layer {layer.name} needs {split.devices} devices; the cluster has "
                                            f"{num_gpus}")
    return split


# --------------------------------------------------------------------------- per-device work


def work_ratio(layer: Layer, split: Split, batch: int) -> float:
    """The first device's share of the layer's work: Π ceil(size/cut)/size over its cuts."""
    sizes = layer_sizes(layer, batch)
    ratio = 1.0
    for field, n in split.cuts().items():
        size = sizes[field]
        ratio *= math.ceil(size / n) / size
    return ratio


def _cut(value: int, parts: int) -> int:
    return max(1, math.ceil(value / parts)) if value else value


def shard_ops(layer: Layer, split: Split, batch: int, phase: str) -> tuple[Op, ...]:
    """The kernels the first device runs for ``layer``'s ``phase`` ("forward" | "backward")."""
    ops = layer.forward if phase == "forward" else layer.backward
    if split.devices == 1:
        return ops
    ratio = work_ratio(layer, split, batch)
    rows = split.batch * split.rows * split.cols * split.sequence
    out_cut = split.channels
    in_cut = split.reduction
    shards = []
    for op in ops:
        scaled = replace(op, flops=op.flops * ratio, bytes_moved=op.bytes_moved * ratio)
        if op.kind == "gemm":
            heads_out = split.heads if "out_proj" not in op.name else 1
            heads_in = split.heads if "out_proj" in op.name else 1
            o, i = out_cut * heads_out, in_cut * heads_in
            if op.name.endswith(".dgrad"):
                m, n, k = _cut(op.m, rows), _cut(op.n, i), _cut(op.k, o)
            elif op.name.endswith(".wgrad"):
                m, n, k = _cut(op.m, i), _cut(op.n, o), _cut(op.k, rows)
            else:
                m, n, k = _cut(op.m, rows), _cut(op.n, o), _cut(op.k, i)
            scaled = replace(scaled, m=m, n=n, k=k)
        elif op.kind == "attention":
            scaled = replace(scaled, batch=_cut(op.batch, split.batch * split.heads), m=_cut(op.m, split.sequence))
        shards.append(scaled)
    return tuple(shards)


# --------------------------------------------------------------------------- tensor layouts


@dataclass(frozen=True)
class TensorLayout:
    """An activation over a device set: ``parts`` per tensor dimension, on ``devices`` GPUs,
    with partial sums pending over ``partial`` of them (a source) or replicated over
    ``replicas`` (a destination); ``groups`` names, per tensor dimension, the split field that
    cuts it (for the sub-communicator's ranks)."""

    dims: tuple[int, ...]          # sizes (N, C, H, W), (N, S, F) or (N, F)
    parts: tuple[int, ...]
    devices: int
    split: Split
    fields: tuple[str, ...]        # the split field cutting each dim
    partial: int = 1
    partial_fields: tuple[str, ...] = ()
    #: per tensor dimension, the split fields (outermost first) whose coordinates number a
    #: device's part along it; () means ``(fields[k],)`` for every k
    index_fields: tuple[tuple[str, ...], ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    def block(self) -> float:
        """Elements of the first device's block (the ceiling where a cut does not divide)."""
        return float(math.prod(math.ceil(d / p) for d, p in zip(self.dims, self.parts, strict=True)))

    def copies(self) -> float:
        """How many devices hold each element (replication), the partial group counted as holders."""
        return self.devices * self.block() / self.numel

    def indexing(self) -> tuple[tuple[str, ...], ...]:
        return self.index_fields or tuple((f,) for f in self.fields)

    def part_indices(self) -> np.ndarray:
        """(devices × dims) array: the part of each tensor dimension that each device holds
        (devices numbered mixed-radix over :data:`SPLIT_FIELDS`, as :func:`subgroup`)."""
        return _part_indices(self.split, self.devices, self.indexing())

    def intervals(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the parts of dimension ``k``: part i is [i·c, min((i+1)·c, size)),
        c = ceil(size / parts) (the first parts take the ceiling; a last part may be short or empty)."""
        return _intervals(self.dims[k], self.parts[k])


@functools.lru_cache(maxsize=4096)
def _part_indices(split: Split, devices: int, indexing: tuple[tuple[str, ...], ...]) -> np.ndarray:
    ranks = np.arange(devices)
    coords, stride = {}, 1
    for field in reversed(SPLIT_FIELDS):
        n = getattr(split, field)
        coords[field] = (ranks // stride) % n
        stride *= n
    out = np.zeros((devices, len(indexing)), dtype=np.int64)
    for k, fields in enumerate(indexing):
        index = np.zeros(devices, dtype=np.int64)
        for field in fields:
            index = index * getattr(split, field) + coords[field]
        out[:, k] = index
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=4096)
def _same_block(split: Split, devices: int, indexing: tuple[tuple[str, ...], ...]) -> np.ndarray:
    """(devices × devices): whether two devices hold the same block."""
    a = _part_indices(split, devices, indexing)
    out = (a[:, None, :] == a[None, :, :]).all(axis=2)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=4096)
def _intervals(size: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    chunk = -(-size // parts)
    starts = np.minimum(np.arange(parts) * chunk, size)
    ends = np.minimum(starts + chunk, size)
    starts.flags.writeable = ends.flags.writeable = False
    return starts, ends


def _tensor_dims(shape: tuple[int, ...], batch: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if len(shape) == 3:
        return (batch, *shape), ("batch", "C", "rows", "cols")
    if len(shape) == 2:
        return (batch, *shape), ("batch", "sequence", "C")
    return (batch, math.prod(shape) if shape else 1), ("batch", "C")


def edge_shape(layer: Layer, batch: int, elem_bytes: float) -> tuple[int, ...]:
    """The per-sample shape of ``layer``'s output; a layer without shapes (a transformer builder's
    block) hands on a flat vector of ``output_bytes / (batch · element bytes)`` elements."""
    if layer.output_shape is not None:
        return layer.output_shape
    return (max(1, round(layer.output_bytes / (batch * elem_bytes))),)


def output_layout(layer: Layer, split: Split, batch: int, shape: tuple[int, ...] | None = None) -> TensorLayout:
    """How ``layer`` leaves its output (per-sample ``shape``, default its output shape) under
    ``split`` (see the module docstring)."""
    dims, names = _tensor_dims(shape if shape is not None else layer.output_shape or (), batch)
    attention = layer.kind == "attention"
    channel_fields = ("channels",) if attention else ("channels", "heads")
    fields = tuple(channel_fields[0] if n == "C" else n for n in names)
    parts = tuple(math.prod(getattr(split, f) for f in channel_fields) if n == "C" else getattr(split, n)
                  for n in names)
    partial_fields = ("heads", "reduction") if attention else ("reduction",)
    partial = math.prod(getattr(split, f) for f in partial_fields)
    index_fields = tuple(channel_fields if n == "C" else (n,) for n in names)
    return TensorLayout(dims, parts, split.devices, split, fields, partial, partial_fields, index_fields)


def input_layout(layer: Layer, split: Split, batch: int, shape: tuple[int, ...]) -> TensorLayout:
    """How ``layer`` needs an input of per-sample ``shape`` under ``split``."""
    dims, names = _tensor_dims(shape, batch)
    mixing = layer.kind in CHANNEL_MIXING
    c_field = "reduction" if mixing else "channels"
    fields = tuple(c_field if n == "C" else n for n in names)
    parts = tuple(getattr(split, f) for f in fields)
    return TensorLayout(dims, parts, split.devices, split, fields)


# --------------------------------------------------------------------------- reshards


@dataclass(frozen=True)
class Collective:
    """One collective of a reshard: ``kind`` (all_reduce, reduce_scatter, all_gather, all_to_all,
    send_recv) of ``payload_bytes`` (NCCL's S) over the devices ``ranks``; ``volume_bytes``: what
    the busiest device receives (its bus volume)."""

    kind: str
    payload_bytes: float
    ranks: tuple[int, ...]
    volume_bytes: float


@functools.lru_cache(maxsize=4096)
def subgroup(split: Split, fields: tuple[str, ...]) -> tuple[int, ...]:
    """The ranks of device 0's sub-communicator along ``fields`` (devices numbered mixed-radix
    over :data:`SPLIT_FIELDS`, outermost first)."""
    strides, stride = {}, 1
    for field in reversed(SPLIT_FIELDS):
        strides[field] = stride
        stride *= getattr(split, field)
    ranks = [0]
    for field in fields:
        n = getattr(split, field)
        ranks = [r + i * strides[field] for r in ranks for i in range(n)]
    return tuple(sorted(ranks))


def exact_volume(src: TensorLayout, dst: TensorLayout, elem_bytes: float) -> tuple[float, float]:
    """(bytes the busiest device receives, bytes the busiest device sends) to go from ``src``
    (complete: no partial sums) to ``dst`` (see the module docstring): device r receives the part
    of its new block D_r that its old block S_r does not hold, |D_r| - |D_r ∩ S_r| (all of D_r if
    it is new); each element a device lacks is sent by its h = devices / Π parts holders in equal
    shares, so r sends Σ_{r'} |S_r ∩ D_r'| / h over the r' that do not hold S_r themselves (a
    device holds one block, and two different blocks of a layout are disjoint). Blocks are index
    boxes (:meth:`TensorLayout.intervals` per dimension, :meth:`TensorLayout.part_indices` per
    device), so each count is a product of interval overlaps."""
    recv, send = _exact_elements(src, dst)
    return recv * elem_bytes, send * elem_bytes


@functools.lru_cache(maxsize=65536)
def _exact_elements(src: TensorLayout, dst: TensorLayout) -> tuple[float, float]:
    """Element counts of :func:`exact_volume` (memoized: layouts recur across a planner's calls), in
    O(devices), not O(devices²) (16,384 GPUs: a 16,384² matrix per dimension, 2 GiB each):

    - device r receives |D_r| - |D_r ∩ S_r|: one overlap per device, its own blocks';
    - device r sends Σ_{r'} |S_r ∩ D_r'| over every r', less the r' that hold S_r themselves. The
      first sum is h_dst · |S_r| where every block of ``dst`` is held by the same number h_dst of
      devices (the blocks of a layout tile the tensor: Σ over one copy of them is |S_r|), which a
      layout's mixed-radix numbering gives (checked; otherwise :func:`_dense_elements`); in the
      second, |S_r ∩ D_r'| = |S_r' ∩ D_r'| since S_r' = S_r, the device's own overlap again.

    Integer sums in both, so the figures equal :func:`_dense_elements`' to the bit (tested)."""
    if (src.devices == dst.devices and src.parts == dst.parts and src.split == dst.split
            and src.indexing() == dst.indexing()):
        return 0.0, 0.0  # the same blocks on the same devices
    a, b = src.part_indices(), dst.part_indices()
    holders_dst = _uniform_holders(b, dst.parts)
    if holders_dst is None or _uniform_holders(a, src.parts) is None:
        return _dense_elements(src, dst)
    both = min(src.devices, dst.devices)
    own_int = np.ones(both, dtype=np.int64)  # |S_r ∩ D_r| of the devices in both layouts
    need = np.ones(dst.devices, dtype=np.int64)  # |D_r'|
    have = np.ones(src.devices, dtype=np.int64)  # |S_r|
    for k in range(len(src.dims)):
        s0, s1 = src.intervals(k)
        d0, d1 = dst.intervals(k)
        ak, bk = a[:both, k], b[:both, k]
        own_int *= np.maximum(np.minimum(s1[ak], d1[bk]) - np.maximum(s0[ak], d0[bk]), 0)
        need *= (d1 - d0)[b[:, k]]
        have *= (s1 - s0)[a[:, k]]
    own = np.zeros(dst.devices)
    own[:both] = own_int
    recv = need - own
    blocks = np.ravel_multi_index(tuple(a.T), src.parts)
    same = np.zeros(math.prod(src.parts), dtype=np.int64)
    np.add.at(same, blocks[:both], own_int)  # Σ over the devices in both layouts holding each source block
    holders = src.devices / math.prod(src.parts)
    send = (holders_dst * have - same[blocks]) / holders
    return max(float(recv.max()), 0.0), max(float(send.max()), 0.0)


def _uniform_holders(indices: np.ndarray, parts: tuple[int, ...]) -> int | None:
    """How many devices hold each block of a layout (``indices``: devices × dims part indices over
    ``parts``), or None where blocks have unequal numbers of holders."""
    if not (indices < np.array(parts)).all():
        return None  # a part index beyond the layout's parts: let the definition handle it
    counts = np.bincount(np.ravel_multi_index(tuple(indices.T), parts), minlength=math.prod(parts))
    return int(counts[0]) if counts.min() == counts.max() else None


def _dense_elements(src: TensorLayout, dst: TensorLayout) -> tuple[float, float]:
    """:func:`_exact_elements` over the full (source devices × destination devices) overlap matrix:
    the definition, kept for layouts whose blocks have unequal numbers of holders and as the tests'
    reference."""
    a, b = src.part_indices(), dst.part_indices()
    overlap = need = None  # |S_r ∩ D_r'| (src devices × dst devices), |D_r'|
    for k in range(len(src.dims)):
        s0, s1 = src.intervals(k)
        d0, d1 = dst.intervals(k)
        per_part = np.minimum.outer(s1, d1) - np.maximum.outer(s0, d0)
        np.maximum(per_part, 0, out=per_part)
        term = per_part[a[:, k, None], b[None, :, k]]
        length = (d1 - d0)[b[:, k]]
        overlap = term if overlap is None else overlap * term
        need = length if need is None else need * length
    both = min(src.devices, dst.devices)
    own = np.zeros(dst.devices)
    own[:both] = overlap[np.arange(both), np.arange(both)]
    recv = need - own
    holds_same = np.zeros((src.devices, dst.devices), dtype=bool)
    holds_same[:, :both] = _same_block(src.split, src.devices, src.indexing())[:, :both]
    holders = src.devices / math.prod(src.parts)
    send = (overlap * ~holds_same).sum(axis=1) / holders
    return max(float(recv.max()), 0.0), max(float(send.max()), 0.0)


def plan_reshard(src: TensorLayout, dst: TensorLayout, elem_bytes: float) -> tuple[Collective, ...]:
    """The collectives that take ``src`` (possibly partial) to ``dst`` (see the module docstring)."""
    steps: list[Collective] = []
    if src.partial > 1:
        group = subgroup(src.split, src.partial_fields)
        block = src.block() * elem_bytes
        finer = [k for k, (p, q) in enumerate(zip(src.parts, dst.parts, strict=True)) if q >= p * src.partial]
        scatter = (src.devices == dst.devices and finer
                   and all(q >= p for p, q in zip(src.parts, dst.parts, strict=True)))
        if scatter:  # the new layout cuts one dimension r times finer: reduce-scatter into it
            k = finer[0]
            steps.append(Collective("reduce_scatter", block, group, block * (src.partial - 1) / src.partial))
            parts = tuple(p * src.partial if i == k else p for i, p in enumerate(src.parts))
            # member j of the partial group keeps the j-th slice of its block along dimension k
            index = tuple(f + src.partial_fields if i == k else f for i, f in enumerate(src.indexing()))
            src = replace(src, parts=parts, partial=1, index_fields=index)
        else:
            steps.append(Collective("all_reduce", block, group, 2 * block * (src.partial - 1) / src.partial))
            src = replace(src, partial=1)
    recv, send = exact_volume(src, dst, elem_bytes)
    volume = max(recv, send)
    if volume <= 0:
        return tuple(steps)
    if src.devices != dst.devices:  # burst: scatter / gather between device sets
        ranks = tuple(range(max(src.devices, dst.devices)))
        steps.append(Collective("send_recv", volume, ranks, volume))
        return tuple(steps)
    have, need = src.block() * elem_bytes, dst.block() * elem_bytes
    changed = tuple(dict.fromkeys(
        f for f, p, q, g in zip(src.fields, src.parts, dst.parts, dst.fields, strict=True) if p != q
        for f in (f, g) if getattr(src.split, f) > 1))
    ranks = subgroup(src.split, changed) if changed else tuple(range(src.devices))
    contains = all(q <= p for p, q in zip(src.parts, dst.parts, strict=True))
    exact = 1e-9 * max(need, have)
    gather_n = need / have
    if contains and need > have and abs(recv - (need - have)) <= exact and abs(send - recv) <= exact \
            and abs(gather_n - round(gather_n)) < 1e-9:
        # nested blocks: every device keeps its own and gathers the rest of the new one
        steps.append(Collective("all_gather", need, _fit(ranks, round(gather_n)), recv))
    elif (abs(need - have) <= exact and 0 < recv < have and abs(send - recv) <= exact
          and abs(have / (have - recv) - round(have / (have - recv))) < 1e-9):
        # equal blocks, each device keeping 1/n of its own: an all-to-all over n
        steps.append(Collective("all_to_all", have, _fit(ranks, round(have / (have - recv))), recv))
    else:
        n = max(2, len(ranks))
        steps.append(Collective("all_to_all", volume * n / (n - 1), _fit(ranks, n), volume))
    return tuple(steps)


def _fit(ranks: tuple[int, ...], n: int) -> tuple[int, ...]:
    """``n`` ranks of a sub-communicator (its first n; the first n devices when it has fewer)."""
    return ranks[:n] if len(ranks) >= n else tuple(range(n))


def adjoint(src: TensorLayout, dst: TensorLayout) -> tuple[TensorLayout, TensorLayout]:
    """The backward reshard's (source, destination): the gradient in the consumer's layout,
    partial over its channel (and heads) cut, back to the producer's layout."""
    consumer_split = dst.split
    partial_fields = tuple(f for f in ("channels", "heads") if f not in dst.fields and getattr(consumer_split, f) > 1)
    partial = math.prod(getattr(consumer_split, f) for f in partial_fields)
    grad_src = replace(dst, partial=partial, partial_fields=partial_fields)
    grad_dst = replace(src, partial=1, partial_fields=())
    return grad_src, grad_dst


def gradient_group(split: Split) -> tuple[int, ...]:
    """The devices that hold copies of the same weight shard (batch, sequence and spatial cuts)."""
    return subgroup(split, REPLICA_FIELDS)
