"""The ``subnetwork_dp`` strategy kind: subnetwork data parallelism (Singh, Khalid, Oyallon &
Belilovsky 2025, "Subnetwork Data Parallelism"): each data-parallel worker trains a masked
subnetwork of the model instead of the whole of it, and each part of the model is averaged only
over the workers that train it.

Masks (``strategy.mask``), as the paper's two constructions:

- ``block``: the units are the graph's residual identity blocks (simulator/strategies/residual_blocks.py:
  a ResNet's bottlenecks without downsampling, a transformer's blocks); the stem, the
  downsampling blocks and the head are trained by every worker;
- ``neuron``: the units are the hidden neurons (output channels, heads, MLP units) of every
  layer inside a residual block (of every layer but the classifier for a plain chain such as
  VGG), each layer masked at the same fraction k. A layer then keeps k of its output channels
  and, where its inputs come from masked layers, k of its input channels: k² of the weights and
  FLOPs of a convolution or linear layer masked on both sides, k of one masked on one side (the
  first masked layer, the classifier), k of a channel-wise layer; the channels are read from the
  graph layer by layer (simulator/strategies/neuron_masks.py). A transformer block (one layer of
  the graph) keeps k: its heads and MLP units are masked, its residual stream is whole (its
  norms and residual dropouts run whole, and it keeps their activations). A transformer built
  layer by layer (BERT, ViT, a traced one: the mask set holds attention layers) follows the same
  rule, read from its wiring: only heads and MLP units are masked, so its attention layers, FC1
  and FC2 keep k (one side each) and its embeddings, norms, residual adds, stream dropouts and
  head stay whole.

Assignment (the paper's fixed masks, made concrete here): the units are cut into ``subnetworks``
S slices (blocks round-robin: slice i holds blocks i, i + S, ...; neurons: 1/S of each layer),
subnetwork j keeps the r = ``keep_fraction``·S slices j, j+1, ..., j+r-1 (mod S) (``keep_fraction``
defaults to 1/S when only S is given: disjoint subnetworks; to 1/2 when neither is), and worker w
(of N = ``parallelism.dp``) trains subnetwork w mod S. Every slice is kept by r subnetworks, i.e.
by a group of k·N workers (k = keep fraction); the shared layers by all N. Weights masked on both
sides (neuron masks) are cut in S × S pieces; a subnetwork keeps piece (a, b) when it keeps
slices a and b, so it keeps r² of them.

Masking (``strategy.masking``), per masked unit of a worker:

- ``backward``: the forward runs the whole network; the backward skips the weight-gradient GEMMs
  (``*.wgrad``) of masked units and keeps their input-gradient GEMMs (the gradient still flows
  through them to the kept units before); activations are those of data parallelism, less what
  only the weight gradients of a frozen (block-masked) transformer block read, its linear layers'
  inputs (WEIGHT_GRADIENT_ONLY_TENSORS, workloads/transformer_graph.py, the rule LoRA's frozen base
  follows too: measured, PyTorch keeps them only for a weight that needs a gradient; a frozen
  convolution keeps its input, so a CNN's block keeps all). The worker holds every weight (its
  forward reads them) but gradients and optimizer state only of what it trains. Masked weights change on the workers that train them, so after the update each worker
  receives every masked slice's new weights (a broadcast of the slice's weights over the N
  workers; our completion: the paper does not say how a backward-masked replica refreshes them);
- ``forward_backward``: masked units are not run at all (a block becomes the identity; a layer
  computes only its kept neurons): forward, input- and weight-gradient FLOPs of a neuron-masked
  layer scale by its kept share (k² or k above) and its saved activations by the kept share of
  the tensor it saves (a transformer block's: k of those as wide as its heads or MLP units, its
  residual-stream tensors whole, neuron_masks.py), a masked block's by 0, and the worker holds
  only its subnetwork's weights.
  This is the paper's construction as far as the issue reconstructs it (a worker trains a
  structured subnetwork that it also runs forward; the paper's exact settings are not in the
  data): the examples use it. Layers outside the mask set run whole (a classifier reading masked
  features keeps only its kept inputs' weights).

Per worker and step: weights·w + trained·(g + o) bytes of model state (w, g, o bytes per parameter
of weights, gradients, optimizer state; ZeRO's Sec. 3 counts), the activations above; after the
last backward, an all-reduce of the gradients of the shared layers over the N workers and one
all-reduce of each kept slice's gradients over its k·N workers (bytes = the slice's parameters ×
gradient bytes; a two-sided piece over the workers keeping both its slices), priced on the topology for the real ranks of each group; then the optimizer
over the trained parameters. The reductions start after the last backward (not overlapped with
it as DDP's buckets are: a block slice is spread over the whole depth, a neuron slice over every
layer, so a slice is complete only at the end of the backward anyway). Every subnetwork is one simulated actor (workers of one subnetwork
do the same work at the same time); block slices may differ in size, so actors may differ.

Memory reduction: the issue quotes 30–75% less memory per worker than data parallelism for the
paper's masking settings; ``sdp_memory_reduction`` is that fraction for this scenario (1 - peak per
worker / the data-parallel peak of the same layout), ``sdp_model_state_reduction`` and
``sdp_activation_reduction`` its two parts apart (weights, gradients and optimizer state; the
activations), printed under the memory table too. The FLOPs every worker runs are reported
(``sdp_flops_per_step``); the result's model FLOPs (and MFU) stay those of the full model.
Statistical efficiency (what masking costs in accuracy) is not modelled.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict, defaultdict
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.collectives import collective_cost
from simulator.cost.compute import ComputeModel
from simulator.cost.topology import Topology
from simulator.engine.engine import Task
from simulator.memory.analytic import (
    MemoryBreakdown,
    bytes_per_param,
    held_gradient_bytes,
    peak_stage,
    rank_memory,
)
from simulator.memory.checkpoints import graph_kept_bytes, kept_per_layer, stage_bytes
from simulator.memory.over_time import MemoryLedger
from simulator.scenario import gradient_bytes
from simulator.strategies.framework_terms import (
    NO_PIPELINE,
    dropped_terms_extra,
    input_task,
    is_moe_layer,
    kernel_stretch,
    layer_floor_stretch,
    mark_interference,
)
from simulator.strategies.neuron_masks import (
    ATTENTION_STREAM_OPS,
    HEAD_AND_UNIT_TENSORS,
    RESIDUAL_STREAM_OPS,
    NeuronMask,
    block_activation_shares,
    is_attention_unit,
    neuron_masks,
)
from simulator.strategies.plan import Plan
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.residual_blocks import no_residual_reason, residual_chain
from simulator.strategies.spmd.plan import OPTIMIZER_BYTES_PER_PARAM
from simulator.strategies.tasklists import require
from workloads.graph import ModelFlops, Op
from workloads.layer_graph import Layer
from workloads.schema import TransformerSpec
from workloads.transformer_graph import WEIGHT_GRADIENT_ONLY_TENSORS, SavedTensor, block_saved_tensors


class SubnetworkDpConfig(BaseModel):
    """``strategy: {kind: subnetwork_dp, mask: block|neuron, masking: backward|forward_backward, ...}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["subnetwork_dp"] = "subnetwork_dp"
    mask: Literal["block", "neuron"] = Field(
        default="block", description="block: residual blocks are the masked units; neuron: hidden neurons of each layer")
    masking: Literal["backward", "forward_backward"] = Field(
        default="backward", description="backward: masked units run forward, get no weight gradient; "
                                        "forward_backward: masked units are not run at all")
    keep_fraction: float | None = Field(
        default=None, gt=0, le=1, description="k: share of the units each worker trains; default: 1/subnetworks when "
                                              "subnetworks is given (the model cut into S disjoint subnetworks), else 1/2")
    subnetworks: int | None = Field(
        default=None, ge=1, description="S distinct subnetworks (workers w and w + S share one); default: one per "
                                        "worker (parallelism.dp)")


@dataclasses.dataclass(frozen=True)
class Scale:
    """How much of one layer a worker runs and holds (1 shared or kept, 0 skipped)."""

    forward: float = 1.0
    dgrad: float = 1.0
    wgrad: float = 1.0
    activations: float = 1.0
    trained: float = 1.0
    held: float = 1.0
    n_keep: float | None = None   # the GEMMs' N and K shrink by the output and input channels kept
    k_keep: float | None = None   # (None: N by the op's scale, as for a block or a whole layer)


FULL = Scale()


@dataclasses.dataclass(frozen=True)
class Assignment:
    """The masks of one scenario: per subnetwork the scale of every layer, and the slices."""

    subnetworks: int
    kept_slices: int                                   # r
    workers: int                                       # N
    layer_slice: dict[str, int]                        # masked layer -> its slice (block masks)
    neuron_layers: dict[str, NeuronMask]               # neuron masks: each layer with a masked side
    slice_params: list[float]                          # parameters of each slice
    shared_params: float                               # trained by every worker
    piece_params: float = 0.0                          # each of the S × S two-sided pieces (neuron masks)

    def keeps(self, subnetwork: int, slice_index: int) -> bool:
        return (slice_index - subnetwork) % self.subnetworks < self.kept_slices

    def sharers(self, slice_index: int) -> tuple[int, ...]:
        """Ranks of the workers that train a slice."""
        return tuple(w for w in range(self.workers) if self.keeps(w % self.subnetworks, slice_index))

    def piece_sharers(self, a: int, b: int) -> tuple[int, ...]:
        """Ranks of the workers that train two-sided piece (a, b)."""
        return tuple(w for w in range(self.workers)
                     if self.keeps(w % self.subnetworks, a) and self.keeps(w % self.subnetworks, b))


def _config(scenario) -> SubnetworkDpConfig:
    return scenario.strategy


def _check(scenario) -> SubnetworkDpConfig:
    cfg, par = _config(scenario), scenario.parallelism
    require(not getattr(scenario, "mixed", False), "cluster.groups",
            "subnetwork_dp prices every worker on one accelerator: give cluster.node")
    require(par.pp == 1 and par.tp == 1 and par.cp == 1 and par.ep == 1, "parallelism",
            "subnetwork_dp is data parallelism: tp, pp, cp and ep must be 1")
    require(par.zero_stage == 0, "parallelism.zero_stage", "subnetwork_dp keeps each worker's state whole: needs 0")
    n = par.dp_degree
    s = cfg.subnetworks or n
    require(n % s == 0, "strategy.subnetworks", f"{s} does not divide the {n} workers (parallelism.dp)")
    r = keep_fraction(cfg) * s
    require(abs(r - round(r)) < 1e-9 and round(r) >= 1, "strategy.keep_fraction",
            f"keep_fraction × subnetworks must be a whole number of slices ≥ 1, got {keep_fraction(cfg):g} × {s}")
    return cfg


def keep_fraction(cfg: SubnetworkDpConfig) -> float:
    """k as given, else 1/S with S given (disjoint subnetworks), else 1/2."""
    if cfg.keep_fraction is not None:
        return cfg.keep_fraction
    return 1 / cfg.subnetworks if cfg.subnetworks else 0.5


#: Results computed once per scenario object (a :class:`simulator.scenario.Scenario` is a frozen dataclass: the same
#: object reads the same specs): its :func:`assignment` and each distinct worker's :func:`worker_work`. compile,
#: memory and step FLOPs each ask for every subnetwork's work (3·S walks of the graph, ~2 ms of Python per layer
#: each); subnetworks whose layers all have the same :class:`Scale` (every neuron mask: the k of a layer does not
#: depend on which slices are kept) do the same work, so it is computed once. Keyed on the object's identity,
#: checked (the entry holds the object, so the id is not reused while it is here); only the 2 latest scenarios are
#: kept (a simulate asks for one; holding more kept their ops alive and slowed the next scenarios' garbage collection).
_MEMO: OrderedDict[int, tuple[object, dict]] = OrderedDict()
_MEMO_SCENARIOS = 2


def _memo(scenario) -> dict:
    entry = _MEMO.get(id(scenario))
    if entry is None or entry[0] is not scenario:
        entry = _MEMO[id(scenario)] = (scenario, {})
        while len(_MEMO) > _MEMO_SCENARIOS:
            _MEMO.popitem(last=False)
    else:
        _MEMO.move_to_end(id(scenario))
    return entry[1]


def assignment(scenario) -> Assignment:
    """The slices and which subnetwork keeps which (see the module docstring); computed once per scenario
    object (:data:`_MEMO`)."""
    memo = _memo(scenario)
    if "assignment" not in memo:
        memo["assignment"] = _assignment(scenario)
    return memo["assignment"]


def _assignment(scenario) -> Assignment:
    cfg = _check(scenario)
    graph = scenario.layer_graph()
    n = scenario.parallelism.dp_degree
    s = cfg.subnetworks or n
    r = round(keep_fraction(cfg) * s)
    layer_slice: dict[str, int] = {}
    neuron: set[str] = set()
    masks: dict[str, NeuronMask] = {}
    slice_params = [0.0] * s
    piece = 0.0
    if cfg.mask == "block":
        _, blocks, _ = residual_chain(graph)
        maskable = [b for b in blocks if b.identity]
        require(bool(maskable), "strategy.mask", f"{no_residual_reason(graph)}, so no block can be dropped "
                                                 "(a dropped residual block is the identity): use mask: neuron")
        require(len(maskable) >= s, "strategy.subnetworks",
                f"{graph.name} has {len(maskable)} residual identity blocks to mask, fewer than {s} subnetworks")
        for i, block in enumerate(maskable):
            for layer in block.layers:
                layer_slice[layer.name] = i % s
            slice_params[i % s] += block.params
    else:
        _, blocks, _ = residual_chain(graph)
        if blocks:
            neuron = {layer.name for b in blocks if b.residual for layer in b.layers}
        else:  # a plain chain: every layer but the last with parameters (the classifier's outputs are the classes)
            with_params = [layer.name for layer in graph.layers if layer.params > 0]
            neuron = set(with_params[:-1])
        require(bool(neuron), "strategy.mask", f"{graph.name} has no layers whose neurons can be masked")
        masks = neuron_masks(graph, neuron)
        one_sided = sum(graph.layer(name).params * mask.one_sided for name, mask in masks.items())
        piece = sum(graph.layer(name).params * mask.two_sided for name, mask in masks.items()) / s ** 2
        slice_params = [one_sided / s] * s
    shared = sum(layer.params for layer in graph.layers if layer.name not in layer_slice and layer.name not in masks)
    shared += sum(graph.layer(name).params * (1 - m.masked_in) * (1 - m.masked_out) for name, m in masks.items())
    return Assignment(s, r, n, layer_slice, masks, slice_params, shared, piece)


def layer_scale(cfg: SubnetworkDpConfig, assign: Assignment, subnetwork: int, layer: Layer) -> Scale:
    """What the worker of ``subnetwork`` runs and holds of ``layer`` (the module docstring's rules)."""
    k = assign.kept_slices / assign.subnetworks
    forward_too = cfg.masking == "forward_backward"
    mask = assign.neuron_layers.get(layer.name)
    if mask is not None:
        kept, n_keep, k_keep = mask.kept(k), mask.kept_out(k), mask.kept_in(k)
        if forward_too:
            return Scale(kept, kept, kept, mask.kept_activations(k), kept, kept, n_keep, k_keep)
        return Scale(wgrad=kept, trained=kept, n_keep=n_keep, k_keep=k_keep)
    index = assign.layer_slice.get(layer.name)
    if index is None or assign.keeps(subnetwork, index):
        return FULL
    if forward_too:
        return Scale(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return Scale(wgrad=0.0, trained=0.0)


def _replaced(op: Op, **changes) -> Op:
    """``dataclasses.replace(op, **changes)`` without its per-call field walk (it was 0.65 of 3.6 CPU-s at 2,000
    layers): :class:`Op` is a frozen dataclass with no ``__post_init__``, slots or cached properties, so a copy of
    its fields with ``changes`` over them is the object ``__init__`` would build."""
    if type(op) is not Op:  # a subclass may add what this copy would skip
        return dataclasses.replace(op, **changes)
    new = object.__new__(Op)
    fields = new.__dict__
    fields.update(op.__dict__)
    fields.update(changes)
    return new


def scaled_op(op: Op, factor: float, n_keep: float | None = None, k_keep: float | None = None) -> Op | None:
    """``op`` computing ``factor`` of its outputs (None when nothing is left): FLOPs and bytes
    scale, and the GEMM's N (an attention's heads) so that its efficiency sees the smaller shape;
    with ``n_keep``/``k_keep`` (a neuron mask on both sides) N and K shrink by those."""
    if factor >= 1.0:
        return op
    if factor <= 0.0:
        return None
    if op.kind == "gemm":
        n = op.n * (factor if n_keep is None else n_keep)
        k = op.k * (1.0 if k_keep is None else k_keep)
        return _replaced(op, flops=op.flops * factor, bytes_moved=op.bytes_moved * factor,
                         n=max(1, round(n)), k=max(1, round(k)))
    if op.kind == "attention":
        return _replaced(op, flops=op.flops * factor, bytes_moved=op.bytes_moved * factor,
                         batch=max(1, round(op.batch * factor)))
    return _replaced(op, flops=op.flops * factor, bytes_moved=op.bytes_moved * factor)


def _is_wgrad(op: Op) -> bool:
    return op.name.endswith("wgrad")


def _factor(layer: Layer, op: Op, factor: float, scale: Scale) -> float:
    """``factor``, except for a neuron-masked transformer block's or attention layer's ops on its
    residual stream (norms, residual dropouts, an input-gradient sum: neuron_masks.RESIDUAL_STREAM_OPS,
    ATTENTION_STREAM_OPS), which run whole."""
    if scale.n_keep is None or op.kind != "memory":
        return factor
    if layer.kind == "transformer_block" and op.name.split(".")[0] in RESIDUAL_STREAM_OPS:
        return 1.0
    if is_attention_unit(layer) and op.name.startswith(layer.name + "."):
        own = op.name[len(layer.name) + 1:].removesuffix(".grad")
        if own in ATTENTION_STREAM_OPS:
            return 1.0
    return factor


def masked_ops(layer: Layer, scale: Scale) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """(forward ops, backward ops) the worker runs of ``layer``."""
    if scale.forward >= 1.0 and scale.dgrad >= 1.0 and scale.wgrad >= 1.0:  # scaled_op keeps every op as it is
        return tuple(layer.forward), tuple(layer.backward)
    shape = (scale.n_keep, scale.k_keep)
    forward = tuple(o for o in (scaled_op(op, _factor(layer, op, scale.forward, scale), *shape)
                                for op in layer.forward) if o is not None)
    backward = tuple(o for o in (scaled_op(op, _factor(layer, op, scale.wgrad if _is_wgrad(op) else scale.dgrad, scale),
                                           *shape) for op in layer.backward) if o is not None)
    return forward, backward


@dataclasses.dataclass(frozen=True)
class WorkerWork:
    """One subnetwork's work per micro-batch and its state."""

    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    measured_forward_s: float
    measured_backward_s: float
    held_params: float
    trained_params: float
    kept_activation_bytes: float
    recompute: tuple[Op, ...] = ()        # re-run before the backward (full: the masked forward)
    measured_recompute_s: float = 0.0
    working_bytes: float = 0.0            # the recompute working set (its largest unit, masked)
    # each op-priced layer's masked (forward, backward, recompute) ops: the eager host floor is per layer pass
    layer_passes: tuple[tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]], ...] = ()

    @functools.cached_property
    def flops(self) -> float:
        """GEMM and attention FLOPs of one micro-batch (what model FLOPs count, workloads/graph.py); summed once
        per object (compile and the step's FLOPs each read it for every subnetwork)."""
        return sum(op.flops for op in self.forward + self.backward if op.kind in ("gemm", "attention"))


def worker_work(scenario, subnetwork: int, assign: Assignment | None = None) -> WorkerWork:
    """The masked ops, parameters and activations of one subnetwork's worker (per micro-batch). It reads the
    scenario, ``assign`` and the subnetwork only through each layer's :func:`layer_scale`, so it is computed once
    per scenario object, ``assign`` object and tuple of layer scales (:data:`_MEMO`)."""
    cfg = _config(scenario)
    assign = assign or assignment(scenario)
    graph = scenario.layer_graph()
    memo = _memo(scenario)
    known = memo.setdefault("scales", {}).get((id(assign), subnetwork))
    if known is not None and known[0] is assign:
        scales = known[1]
    else:
        scales = tuple(layer_scale(cfg, assign, subnetwork, layer) for layer in graph.layers)
        memo["scales"][(id(assign), subnetwork)] = (assign, scales)
    works = memo.setdefault("works", {})
    key = (id(assign), scales)
    hit = works.get(key)
    if hit is not None and hit[0] is assign:
        return hit[1]
    work = _worker_work(scenario, assign, graph, scales)
    works[key] = (assign, work)
    return work


def _worker_work(scenario, assign: Assignment, graph, scales: tuple[Scale, ...]) -> WorkerWork:
    recompute = scenario.parallelism.recompute
    forward: list[Op] = []
    backward: list[Op] = []
    again: list[Op] = []
    measured_f = measured_b = measured_r = held = trained = kept = 0.0
    every_kept = kept_per_layer(graph, recompute)  # full recompute: the graph's checkpoint units
    shares, saved_shares = [], []
    layer_passes = []
    k = assign.kept_slices / assign.subnetworks
    # a block's shares read only the kind, whether it has experts and its saved bytes (_block_tensors), the
    # factors and the recompute: priced once per such block in the scenario, not once per layer and worker
    block_shares = _memo(scenario).setdefault("block_shares", {})
    for layer, layer_kept, scale in zip(graph.layers, every_kept, scales, strict=True):
        kept_share = saved_share = scale.activations
        factors = which = None
        if 0 < scale.activations < 1 and layer.name in assign.neuron_layers:
            factors, which = dict.fromkeys(HEAD_AND_UNIT_TENSORS, k), ("neuron", k)  # residual stream whole
        elif scale.activations == 1 and scale.trained == 0:
            factors, which = dict.fromkeys(WEIGHT_GRADIENT_ONLY_TENSORS, 0.0), ("frozen",)  # a frozen block
        if factors:
            key = (layer.kind, layer.expert_params > 0, layer.saved_bytes, which, recompute)
            if key not in block_shares:
                tensors = _block_tensors(scenario, layer)
                block_shares[key] = None if tensors is None else block_activation_shares(tensors, factors, recompute)
            if block_shares[key] is not None:
                kept_share, saved_share = block_shares[key]
        f, b = masked_ops(layer, scale)
        rerun = {id(op) for op in layer.recompute_ops(recompute)}
        if layer.measured_forward_s is not None:  # a profiled layer: its times scale with its work
            measured_f += layer.measured_forward_s * scale.forward
            measured_b += (layer.measured_backward_s or 0.0) * max(scale.dgrad, scale.wgrad)
            if recompute == "full":
                measured_r += layer.measured_forward_s * scale.forward
        else:
            forward.extend(f)
            backward[:0] = b  # the backward runs the layers in reverse
            # what recompute re-runs of the worker's masked forward (full: all of it)
            r = tuple(o for o in (scaled_op(op, _factor(layer, op, scale.forward, scale), scale.n_keep, scale.k_keep)
                                  for op in layer.forward if id(op) in rerun) if o is not None)
            again.extend(r)
            layer_passes.append((tuple(f), tuple(b), r))
        held += layer.params * scale.held
        trained += layer.params * scale.trained
        kept += layer_kept * kept_share
        shares.append(kept_share)
        saved_shares.append(saved_share)
    working = stage_bytes(graph, recompute, list(range(len(graph.layers))), shares, saved_shares)[1]
    return WorkerWork(tuple(forward), tuple(backward), measured_f, measured_b, held, trained, kept,
                      tuple(again), measured_r, working, tuple(layer_passes))


def pass_seconds(compute: ComputeModel, work: WorkerWork, jitter: float, host_dispatch_us: float | None,
                 moe_fixed_us: float | None = None, times: dict[int, float] | None = None) -> tuple[float, float, float]:
    """Seconds of a worker's forward, backward and recompute pass of one micro-batch: the kernels
    stretched by the wait for the slowest rank (``jitter``) and each layer's passes by its host floor
    under an eager framework (its issue floor) or NeMo's fixed time per MoE layer pass (``moe_fixed_us``,
    for a layer whose masked forward still runs expert GEMMs: a masked-out MoE block runs nothing and pays
    nothing), as spmd applies them (simulator/strategies/framework_terms.py). ``times``: each op's
    ``compute.time_s`` by ``id(op)``, shared by the calls of one :func:`worker_prices` (a block-masked
    subnetwork's kept layers run the graph's own op objects, the same in every subnetwork keeping them); the
    caller keeps the ops alive while it holds the dict."""
    times = {} if times is None else times

    def time_s(op: Op) -> float:
        t = times.get(id(op))
        if t is None:
            t = times[id(op)] = compute.time_s(op)
        return t

    def kernels(ops) -> list[float]:
        return [time_s(op) * jitter for op in ops if op.kind != "collective"]

    if host_dispatch_us or moe_fixed_us:
        f_s = b_s = r_s = 0.0
        for f, b, r in work.layer_passes:
            kf, kb, kr = kernels(f), kernels(b), kernels(r)
            factor = layer_floor_stretch([p for p in (kf, kb, kr) if p], host_dispatch_us,
                                         moe_fixed_us if is_moe_layer(f) else None)
            f_s, b_s, r_s = f_s + sum(kf) * factor, b_s + sum(kb) * factor, r_s + sum(kr) * factor
    else:
        # compute.ops_time_s's sum, in its order, of the shared prices
        f_s, b_s, r_s = (sum(time_s(op) for op in ops if op.kind != "collective") * jitter
                         for ops in (work.forward, work.backward, work.recompute))
    return (f_s + work.measured_forward_s * jitter, b_s + work.measured_backward_s * jitter,
            r_s + work.measured_recompute_s * jitter)




def _block_tensors(scenario, layer: Layer) -> tuple[SavedTensor, ...] | None:
    """The tensors a transformer block of the scenario's model saves (workloads/transformer_graph.py),
    None for any other layer or where they do not add up to the layer's saved bytes."""
    model = scenario.model
    if layer.kind != "transformer_block" or not isinstance(model, TransformerSpec):
        return None
    tensors = block_saved_tensors(model, scenario.shard, layer.expert_params > 0, model.dropout)
    total = sum(t.nbytes for t in tensors)
    return tensors if abs(total - layer.saved_bytes) <= 1e-9 * max(total, 1.0) else None


def unmasked_work(scenario) -> WorkerWork:
    """Data parallelism's worker: the whole graph (for the reductions reported)."""
    graph = scenario.layer_graph()
    recompute = scenario.parallelism.recompute
    forward = tuple(op for layer in graph.layers for op in layer.forward)
    backward = tuple(op for layer in reversed(graph.layers) for op in layer.backward)
    params = graph.total_params()
    again = tuple(op for layer in graph.layers for op in layer.recompute_ops(recompute))
    working = stage_bytes(graph, recompute, list(range(len(graph.layers))))[1]
    return WorkerWork(forward, backward, 0.0, 0.0, params, params, graph_kept_bytes(graph, recompute), again,
                      0.0, working)


def _dp_memory(scenario) -> MemoryBreakdown:
    """Data parallelism's rank 0 (``rank_memory(scenario, 0)``), once per scenario object (:data:`_MEMO`): every
    worker's breakdown reads its buffers and the result its peak."""
    memo = _memo(scenario)
    if "dp_memory" not in memo:
        memo["dp_memory"] = rank_memory(scenario, 0)
    return memo["dp_memory"]


def worker_memory(scenario, work: WorkerWork, subnetwork: int) -> MemoryBreakdown:
    """Bytes one worker holds: held weights, trained gradients and optimizer state, its kept
    activations of one micro-batch and its recompute working set (a worker runs each micro-batch's
    forward and backward before the next one's forward, :func:`compile_subnetwork_dp`, whatever
    ``parallelism.schedule`` says), and data parallelism's buffers."""
    tr = scenario.training
    base = _dp_memory(scenario)
    per = bytes_per_param(tr.precision, tr.optimizer, tr.param_dtype == "fp32")  # as data parallelism's
    activations = work.kept_activation_bytes + work.working_bytes
    held_grad = held_gradient_bytes(gradient_bytes(tr), tr.precision, tr.optimizer, tr.param_dtype == "fp32")
    return MemoryBreakdown(work.held_params * per["weights"], work.trained_params * held_grad,
                           work.trained_params * per["optimizer"], activations, base.other_bytes,
                           stage=subnetwork)


def _model_state(m: MemoryBreakdown) -> float:
    return m.weights_bytes + m.gradients_bytes + m.optimizer_bytes


def memory_reductions(worker: MemoryBreakdown, dp: MemoryBreakdown) -> dict[str, float]:
    """The worker's peak against data parallelism's: in all, model state, activations (fractions saved)."""
    return {"sdp_memory_reduction": 1 - worker.total_bytes / dp.total_bytes,
            "sdp_model_state_reduction": 1 - _model_state(worker) / _model_state(dp),
            "sdp_activation_reduction": 1 - worker.activations_bytes / dp.activations_bytes
            if dp.activations_bytes else 0.0}


def memory_subnetwork_dp(scenario):
    assign = assignment(scenario)
    return peak_stage([worker_memory(scenario, worker_work(scenario, j, assign), j)
                       for j in range(assign.subnetworks)])


class _Comms:
    """Collectives over explicit rank groups, priced on the topology (one task per actor)."""

    def __init__(self, scenario, topo: Topology):
        self.sc, self.topo = scenario, topo
        self._cache: dict = {}

    def task(self, actor: str, name: str, collective: str, ranks: tuple[int, ...], payload: float,
             rendezvous: str, members: int) -> Task | None:
        key = (collective, ranks, payload)
        cost = self._cache.get(key)
        if cost is None:
            node = self.sc.node
            cost = self._cache[key] = collective_cost(
                collective, payload, self.topo.placement(ranks), self.topo.links, node.intra_laws,
                node.inter_node_collectives, node.nvls_all_reduce,
                mesh_peers=node.gpus_per_node - 1 if node.intra_node.kind == "xgmi" else None)
        demands: dict[str, float] = defaultdict(float)
        for link, b in cost.bytes_by_link.items():
            demands[f"{actor}:{link}_tx"] += b
            demands[f"{actor}:{link}_rx"] += b
        if not any(demands.values()) and cost.latency_s == 0.0:
            return None
        return Task(name, actor, "dp", "dp_comm", demands=dict(demands), latency_s=cost.latency_s,
                    rendezvous=rendezvous if members > 1 else None, rendezvous_size=members)


def _kept_pieces(assign: Assignment, subnetwork: int) -> list[tuple[int, int]]:
    """The off-diagonal two-sided pieces a subnetwork keeps (none without two-sided weights)."""
    if not assign.piece_params:
        return []
    kept = [i for i in range(assign.subnetworks) if assign.keeps(subnetwork, i)]
    return [(a, b) for a in kept for b in kept if a != b]


def worker_prices(scenario, assign: Assignment) -> tuple[ComputeModel, list[WorkerWork], list, list[float]]:
    """(the compute model, each subnetwork's work, its (forward, backward, recompute) seconds of one micro-batch
    (:func:`pass_seconds`, the framework's stretch and floors), its optimizer step's seconds): the durations of a
    worker's compute tasks in :func:`compile_subnetwork_dp`."""
    tr = scenario.training
    compute = ComputeModel(scenario.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)
    opt_per_param = OPTIMIZER_BYTES_PER_PARAM[tr.optimizer] * (32 / 28 if tr.precision == "fp32" else 1)
    works = [worker_work(scenario, j, assign) for j in range(assign.subnetworks)]
    efficiency = scenario.accelerator.efficiency
    jitter = kernel_stretch(efficiency, scenario.num_gpus)
    priced: dict[int, tuple[tuple[float, float, float], float]] = {}  # subnetworks doing the same work: priced once
    times: dict[int, float] = {}  # each op object's seconds (pass_seconds); ``works`` holds the ops
    for work in works:
        if id(work) not in priced:
            priced[id(work)] = (pass_seconds(compute, work, jitter, efficiency.host_dispatch_us_per_kernel,
                                             efficiency.moe_layer_fixed_us, times),
                                compute.optimizer_step_s(work.trained_params, opt_per_param))
    return compute, works, [priced[id(w)][0] for w in works], [priced[id(w)][1] for w in works]


def step_lower_bound_subnetwork_dp(scenario, prices) -> float:
    """A lower bound on the simulated step (seconds), compute alone: the largest over the subnetworks of
    m x (F + R + B) + the optimizer step, its worker's masked passes of one micro-batch (:func:`worker_prices`).

    Why it bounds the step: the step is the run's end over ``simulation.steps`` (no window: steps from time 0,
    simulator/simulate.py), and each subnetwork's actor runs, every step, its m forward, recompute and backward
    tasks and its optimizer step one after another on its compute stream (:func:`compile_subnetwork_dp`), each
    a fixed-duration task of exactly these seconds; the engine never runs one in less (interference only slows
    it; simulator/engine/engine.py). The reductions, weight refreshes and input loads only add (not counted:
    their flow time was not argued here). ``prices`` (:class:`simulator.explore.bounds.KindPrices`) is not read.
    tests/test_kind_bounds.py checks it against the engine."""
    _check(scenario)
    m = scenario.parallelism.num_micro_batches
    _, _, seconds, updates = worker_prices(scenario, assignment(scenario))
    return max(m * sum(passes) + update for passes, update in zip(seconds, updates, strict=True))


def compile_subnetwork_dp(scenario, mode: str | None = None, detail: bool = False) -> Plan:
    cfg = _config(scenario)
    assign = assignment(scenario)
    par, tr = scenario.parallelism, scenario.training
    s, n, m = assign.subnetworks, assign.workers, par.num_micro_batches
    compute, works, seconds, updates = worker_prices(scenario, assign)
    topo = Topology(scenario.node, scenario.fabric, scenario.num_gpus)
    comms = _Comms(scenario, topo)
    gb = gradient_bytes(tr)
    wb = bytes_per_param(tr.precision, tr.optimizer, tr.param_dtype == "fp32")["weights"]
    actors = [f"subnet{j}" for j in range(s)]
    streams: dict[tuple[str, str], list[Task]] = defaultdict(list)
    compute_tasks: dict[str, list[Task]] = defaultdict(list)
    step_ends: list[list[Task]] = []
    previous: dict[str, Task] = {}
    loaded: dict[str, Task] = {}
    everyone = tuple(range(n))
    efficiency = scenario.accelerator.efficiency
    # memory over time from each worker's analytic breakdown (simulator/memory/over_time.py)
    ledgers = [MemoryLedger(worker_memory(scenario, work, j), work.kept_activation_bytes, work.working_bytes)
               for j, work in enumerate(works)]
    for k in range(scenario.simulation.steps):
        ends = []
        for j, actor in enumerate(actors):
            f_s, b_s, r_s = seconds[j]
            passes = []
            for mb in range(m):
                passes.append(Task(f"F.step{k}.mb{mb}", actor, "compute", "compute", duration_s=f_s))
                ledgers[j].forward(passes[-1])
                entry = None
                if r_s > 0:  # full recompute: the masked forward again before the backward
                    passes.append(entry := Task(f"R.step{k}.mb{mb}", actor, "compute", "recompute", duration_s=r_s))
                passes.append(Task(f"B.step{k}.mb{mb}", actor, "compute", "compute", duration_s=b_s))
                ledgers[j].backward(entry or passes[-1], passes[-1])
            if actor in previous:
                passes[0].deps.append(previous[actor])
            if actor in loaded:  # this step's samples, loaded during the last one
                passes[0].deps.append(loaded[actor])
            streams[(actor, "compute")].extend(passes)
            compute_tasks[actor].extend(passes)
            reduces = []
            shared = comms.task(actor, f"shared_all_reduce.step{k}", "all_reduce", everyone,
                                assign.shared_params * gb, f"shared.step{k}", s)
            for index in range(s):
                if not assign.keeps(j, index):
                    continue
                owners = sum(assign.keeps(o, index) for o in range(s))
                reduces.append(comms.task(actor, f"slice{index}_all_reduce.step{k}", "all_reduce",
                                          assign.sharers(index), (assign.slice_params[index] + assign.piece_params) * gb,
                                          f"slice{index}.step{k}", owners))  # with the diagonal piece (same sharers)
            for a, b in _kept_pieces(assign, j):
                owners = sum(assign.keeps(o, a) and assign.keeps(o, b) for o in range(s))
                reduces.append(comms.task(actor, f"piece{a}_{b}_all_reduce.step{k}", "all_reduce",
                                          assign.piece_sharers(a, b), assign.piece_params * gb,
                                          f"piece{a}_{b}.step{k}", owners))
            reduces = [t for t in [shared, *reduces] if t is not None]
            for t in reduces:
                t.deps.append(passes[-1])
            streams[(actor, "dp")].extend(reduces)
            update = Task(f"optimizer.step{k}", actor, "compute", "optimizer", duration_s=updates[j],
                          deps=list(reduces))
            streams[(actor, "compute")].append(update)
            compute_tasks[actor].append(update)
            ledgers[j].update(update)
            last = update
            if cfg.masking == "backward" and assign.kept_slices < s:
                # every slice's new weights go from its owners to the others: all take part
                for index in range(s):
                    refresh = comms.task(actor, f"slice{index}_weights.step{k}", "broadcast", everyone,
                                         assign.slice_params[index] * wb, f"weights{index}.step{k}", s)
                    if refresh is not None:
                        refresh.deps.append(update)
                        streams[(actor, "dp")].append(refresh)
                        last = refresh
            previous[actor] = last
            ends.append(last)
            # the next step's samples, loaded beside this step (framework_terms.py): both end the step
            load = input_task(efficiency, actor, par.micro_batch_size * m, f"input.next_batch.step{k}")
            if load is not None:
                streams[(actor, "input")].append(load)
                loaded[actor] = load
                ends.append(load)
        step_ends.append(ends)
    full = unmasked_work(scenario)
    dp = _dp_memory(scenario)
    peak = max((worker_memory(scenario, w, j) for j, w in enumerate(works)), key=lambda m: m.total_bytes)
    worker_flops = sum(w.flops for w in works) / s
    extra = {"sdp_subnetworks": s, "sdp_keep_fraction": assign.kept_slices / s,
             "sdp_slice_group_size": n * assign.kept_slices // s,
             **memory_reductions(peak, dp),
             "sdp_flops_per_worker_fraction": worker_flops / full.flops if full.flops else 1.0,
             "sdp_gradient_bytes_per_worker": sum(w.trained_params for w in works) / s * gb,
             **dropped_terms_extra(efficiency, "subnetwork_dp", {"cross_node_pipeline_floor": NO_PIPELINE})}
    mark_interference(efficiency, streams)  # kernels beside the reductions (framework_terms.py)
    return Plan(dict(streams), {a: j for j, a in enumerate(actors)}, dict.fromkeys(actors, 0),
                [len(scenario.layer_graph().pipelined)], topo, dict(compute_tasks),
                steps=scenario.simulation.steps, step_ends=step_ends, extra=extra, mode="symmetric",
                memory_base_bytes={a: ledgers[j].base_bytes for j, a in enumerate(actors)})


def step_flops_subnetwork_dp(scenario) -> ModelFlops:
    """FLOPs of a step as the workers run them: each worker its masked forward and backward for
    every micro-batch (the full model's FLOPs would overstate MFU by up to 1/k). Hardware FLOPs
    add data parallelism's recompute share."""
    assign = assignment(scenario)
    par = scenario.parallelism
    per_worker = sum(worker_work(scenario, j, assign).flops for j in range(assign.subnetworks)) / assign.subnetworks
    model = per_worker * par.num_micro_batches * par.dp_degree
    graph = scenario.layer_graph()
    gemm = ("gemm", "attention")
    full = sum(op.flops for layer in graph.layers for op in layer.forward + layer.backward if op.kind in gemm)
    again = sum(op.flops for layer in graph.layers for op in layer.recompute_ops(par.recompute) if op.kind in gemm)
    return ModelFlops(model, model * (1 + again / full) if full else model)


#: The fields of ``clustersim search``'s space that change what subnetwork_dp simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): a worker is data parallelism's (tp, pp, cp and ep refused unless 1,
#: ``zero_stage`` unless 0), so the batch, its micro-batches and the recompute; not ``schedule`` (a worker runs one
#: micro-batch at a time whatever it says), nor the TP switches (no TP), nor the overlap switches: the kind builds
#: its own per-block reductions.
SUBNETWORK_DP_SEARCHED_FIELDS: tuple[str, ...] = ("micro_batch_size", "recompute", "global_batch_size")


SUBNETWORK_DP = register(StrategyKind(
    name="subnetwork_dp",
    config=SubnetworkDpConfig,
    summary="subnetwork data parallelism (Singh et al. 2025): each worker trains a block or neuron mask "
            "(backward-only or forward+backward), each slice all-reduced over the workers that keep it",
    compile=compile_subnetwork_dp,
    memory=memory_subnetwork_dp,
    step_flops=step_flops_subnetwork_dp,
    searched_layout_fields=lambda config: SUBNETWORK_DP_SEARCHED_FIELDS,
    derives_layout=True,
    step_lower_bound=step_lower_bound_subnetwork_dp,
))
