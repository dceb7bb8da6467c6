"""Measured per-layer profiles as layer graphs whose layers carry measured times.

Two formats, as their repositories write them (``../shared/published/seeds/README.md`` decodes them;
the files the tests use are in ``validation/data/profiles/``):

- **PipeDream / DAPPLE ``graph.txt``** (msr-fiddle/pipedream ``graph/graph.py``): node lines
  ``nodeN -- <desc> -- forward_compute_time=F, backward_compute_time=B, activation_size=A,
  parameter_size=P[ -- stage_id=S]`` and edge lines ``\\tnodeA -- nodeB``. F, B: ms for the whole
  profiled minibatch; A: bytes of the output (fp32, whole minibatch; ``[a; b]`` for several
  outputs, summed); P: 4 × parameters. ``Input`` nodes' forward time is data loading: they become
  one ``input`` layer with no time. The profiled batch is not in the file: the spec names it.
- **DeepPool** (``*LayerGpuProfileA100*.txt``, ``profile/A100_*.prof``): one block per profiled
  batch size, each line ``<type>{params}[batch][input dims]`` then the forward+backward ms (``avg``;
  the ``.prof`` files then forward and backward µs). Blocks end with ``SUM(avg) x`` or ``sum: x``.
  Layers are listed in execution order (no edges): the graph is that chain. Convolutions, linear
  layers, pools and ReLUs get their kernels from the builder too (FLOPs, for MFU and calibration).
  A ``ResnetBottleneck`` line (a whole block measured as one) gets the kernels of torchvision's
  ``Bottleneck`` (``torchvision/models/resnet.py``, whose arguments DeepPool's parameters repeat:
  ``inplanes``, ``planes``, ``stride``, ``groups``, ``base_width``, ``dilation``; He et al. 2016,
  arXiv:1512.03385, Table 1): width = planes·base_width/64·groups; conv1 1×1 inplanes→width, conv2 3×3
  width→width at ``stride`` (``groups``; a dilation d pads d, so the output size and FLOPs are those
  of d = 1), conv3 1×1 width→4·planes, BN after each, ReLUs, and where ``downsampleParams``
  ``[[in, out, stride], bn]`` is given a 1×1 conv in→out at that stride plus BN on the shortcut,
  then the add and the last ReLU — merged into one layer, whose backward ends with autograd's sum
  of the two gradients of the block's input (workloads/layer_graph.py). A bottleneck line without ``inplanes`` and
  ``planes`` has no shapes to count: its FLOPs stay uncounted (``Layer.flops_counted`` False), and
  the result prints MFU as n/a naming how many layers were counted.

Times at another micro-batch than profiled: PipeDream's are scaled in proportion to the batch
(PipeDream's own assumption); DeepPool's come from the block of that batch, or are interpolated
linearly between the two nearest profiled batches (in proportion beyond the largest). Where a
file gives only forward+backward, the split is 1 : 2 (the FLOP ratio of a layer with weights) —
an assumption. Times are as measured whatever ``precision`` the shard asks; bytes scale with it.
Saved bytes of a profiled layer are its output bytes (PipeDream's activation stash) — an estimate.

Parameters: a graph.txt states P for each node and names no kernel that could hold them, so its
layers' parameters stay the file's (``Layer.stated_params``, the only source); a DeepPool line is
built by the builder, whose ops hold its weights as every built layer's do (a bare line, with no
shapes, holds none).

The measured times are on the layer (``measured_forward_s``/``measured_backward_s``) and on its
ops (``Op.measured_s``: the first op of each pass carries the pass's time, the others 0; a layer
without kernels gets one ``<name>.measured`` op), so a planner that prices ops gets them too.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pydantic import Field

from simulator.errors import ConfigError
from workloads.graph import Op, ShardShape
from workloads.layer_graph import Layer, LayerGraph, gradient_sum_ops, with_gradient_sums
from workloads.networks.builder import NetBuilder, Tensor
from workloads.networks.spec import NetworkSpec, refuse_split

_NODE = re.compile(r"^(?P<id>node\d+) -- (?P<desc>.*) -- forward_compute_time=(?P<f>[-\d.e]+), "
                   r"backward_compute_time=(?P<b>[-\d.e]+), activation_size=(?P<a>\[[^\]]*\]|[-\d.e]+), "
                   r"parameter_size=(?P<p>[-\d.e]+)(?: -- stage_id=\d+)?\s*$")
_EDGE = re.compile(r"^\t(?P<src>node\d+) -- (?P<dst>node\d+)\s*$")
_DEEPPOOL_ID = re.compile(r"^(?P<type>[A-Za-z0-9_]+)(?P<params>\{.*\})\[(?P<batch>\d+)\](?P<dim>.*)$")

PIPEDREAM_KINDS = (  # description prefix -> layer kind
    ("Conv2d", "conv2d"), ("ConvTranspose2d", "conv_transpose2d"), ("BatchNorm", "batchnorm"),
    ("ReLU", "relu"), ("MaxPool", "maxpool"), ("AvgPool", "avgpool"), ("AdaptiveAvgPool", "adaptive_avgpool"),
    ("Linear", "linear"), ("Dropout", "dropout"), ("Add", "add"), ("Concat", "concat"), ("LSTM", "lstm"),
    ("EmuBidirLSTM", "lstm"), ("RecurrentAttention", "attention"), ("Embedding", "embedding"),
    ("LayerNorm", "layernorm"), ("Softmax", "softmax"), ("View", "flatten"), ("Size", "flatten"),
    ("Flatten", "flatten"), ("GELU", "activation"), ("Tanh", "activation"), ("Sigmoid", "activation"),
    ("__getitem__", "other"),   # PipeDream's tuple indexing (LSTM outputs): no kernel
)
# A description written as a leaf module call, ``Name(args)``, names a PyTorch module kind; a bare name
# (DAPPLE's ``cell_3``, ``layer_12``, ``Prediction``) or a container module's repr listing its
# submodules (``Classifier(  (classifier): Linear(...))``) is a block measured as a whole.
_MODULE_CALL = re.compile(r"^(?P<kind>[A-Za-z_][\w.]*)\(")
_SUBMODULE = re.compile(r"\(\w+\): [A-Za-z_]")
DEEPPOOL_KINDS = {"conv2d": "conv2d", "maxPool2d": "maxpool", "avgPool2d": "avgpool", "adAvgPool2d": "adaptive_avgpool",
                  "ReLU2d": "relu", "ReLU1d": "relu", "linear": "linear", "flatten": "flatten", "concat": "concat",
                  "ResnetBottleneck": "other"}   # a whole bottleneck block, measured as one line


@dataclass(frozen=True)
class ProfiledNode:
    """One node of a graph.txt: times in ms and bytes for the profiled minibatch."""

    node_id: str
    desc: str
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    parameter_bytes: float


def parse_graph_txt(text: str, source: str) -> tuple[list[ProfiledNode], list[tuple[str, str]]]:
    """Nodes (in file order) and edges of a PipeDream/DAPPLE graph.txt; a bad line is a ConfigError."""
    nodes: list[ProfiledNode] = []
    edges: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        edge = _EDGE.match(line)
        if edge:
            edges.append((edge["src"], edge["dst"]))
            continue
        node = _NODE.match(line)
        if not node:
            raise ConfigError("model.profile", f"{source} line {number}: not a graph.txt node or edge line")
        sizes = node["a"].strip("[]").split(";")
        nodes.append(ProfiledNode(node["id"], node["desc"].strip(), float(node["f"]), float(node["b"]),
                                  sum(float(s) for s in sizes if s.strip()), float(node["p"])))
    known = {n.node_id for n in nodes}
    for src, dst in edges:
        for end in (src, dst):
            if end not in known:
                raise ConfigError("model.profile", f"{source}: edge {src} -- {dst} names {end}, which has no node line")
    return nodes, edges


def _topological(nodes: list[ProfiledNode], edges: list[tuple[str, str]], source: str) -> list[ProfiledNode]:
    """Nodes in dependency order, file order among the ready ones (Kahn); a cycle is a ConfigError."""
    order = {n.node_id: i for i, n in enumerate(nodes)}
    preds: dict[str, set[str]] = {n.node_id: set() for n in nodes}
    succs: dict[str, list[str]] = {n.node_id: [] for n in nodes}
    for src, dst in edges:
        preds[dst].add(src)
        succs[src].append(dst)
    ready = sorted((order[n], n) for n, p in preds.items() if not p)
    out: list[str] = []
    waiting = {n: len(p) for n, p in preds.items()}
    while ready:
        _, name = ready.pop(0)
        out.append(name)
        for nxt in succs[name]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                bisect.insort(ready, (order[nxt], nxt))
    if len(out) != len(nodes):
        stuck = sorted(set(preds) - set(out), key=order.get)[0]
        raise ConfigError(f"model.layers.{stuck}", f"{source}: a cycle through {stuck}")
    by_id = {n.node_id: n for n in nodes}
    return [by_id[n] for n in out]


def _with_measured(layer: Layer, forward_s: float, backward_s: float) -> Layer:
    """``layer`` with its measured times on it and on its ops (see the module docstring)."""
    def timed(ops: tuple[Op, ...], seconds: float, phase: str) -> tuple[Op, ...]:
        if not ops:
            return (Op(f"{layer.name}.measured_{phase}", "memory", measured_s=seconds),)
        return (replace(ops[0], measured_s=seconds), *(replace(op, measured_s=0.0) for op in ops[1:]))
    return replace(layer, forward=timed(layer.forward, forward_s, "forward"),
                   backward=timed(layer.backward, backward_s, "backward"),
                   measured_forward_s=forward_s, measured_backward_s=backward_s)


def _kind(node: ProfiledNode, source: str) -> str:
    """The layer kind of a graph.txt node; a module call of a kind not in PIPEDREAM_KINDS is refused
    (a misspelt or unsupported module would otherwise be priced as an anonymous block)."""
    for prefix, kind in PIPEDREAM_KINDS:
        if node.desc.startswith(prefix):
            return kind
    call = _MODULE_CALL.match(node.desc)
    if call and not _SUBMODULE.search(node.desc):
        known = ", ".join(sorted({prefix for prefix, _ in PIPEDREAM_KINDS}))
        raise ConfigError(f"model.layers.{node.node_id}", f"{source}: unknown layer kind {call['kind']!r} "
                                                          f"(known module kinds: {known}; a block measured as a "
                                                          "whole is a bare name or a container's repr)")
    return "other"


def pipedream_graph(text: str, name: str, profile_batch: int, shard: ShardShape, sample: str = "image",
                    seq_length: int | None = None, source: str = "graph.txt") -> LayerGraph:
    """A graph.txt as a layer graph for ``shard.micro_batch`` samples (see the module docstring)."""
    nodes, edges = parse_graph_txt(text, source)
    preds: dict[str, list[str]] = {n.node_id: [] for n in nodes}
    for src, dst in edges:
        preds[dst].append(src)
    inputs = {n.node_id for n in nodes if n.desc.startswith("Input")}
    scale = shard.micro_batch / profile_batch
    byte_scale = scale * shard.act_bytes / 4.0   # PipeDream sizes are fp32
    layers = [Layer("input", "other", output_bytes=0.0, flops_counted=False)]  # a graph.txt names no kernels
    for node in _topological(nodes, edges, source):
        if node.node_id in inputs:
            continue
        reads = tuple(dict.fromkeys("input" if p in inputs else p for p in preds[node.node_id])) or ("input",)
        out_bytes = node.activation_bytes * byte_scale
        # the file states the parameters and names no kernels that could hold them: they stay stated
        layer = Layer(name=node.node_id, kind=_kind(node, source), stated_params=round(node.parameter_bytes / 4),
                      saved_bytes=out_bytes, output_bytes=out_bytes, inputs=reads, flops_counted=False,
                      passes_gradient=not node.desc.startswith("Size"))   # x.size(): no gradient to x
        layers.append(_with_measured(layer, node.forward_ms * scale / 1e3, node.backward_ms * scale / 1e3))
    return with_gradient_sums(LayerGraph(name, tuple(layers), shard.micro_batch, sample, seq_length).check())


@dataclass(frozen=True)
class DeepPoolLayer:
    """One line of a DeepPool profile block."""

    layer_type: str
    params: dict
    batch: int
    input_dim: tuple[int, ...]
    total_ms: float
    forward_us: float | None
    backward_us: float | None


def parse_deeppool(text: str, source: str) -> dict[int, list[DeepPoolLayer]]:
    """Blocks of a DeepPool profile by batch size (the layers in file order)."""
    blocks: dict[int, list[DeepPoolLayer]] = {}
    current: list[DeepPoolLayer] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith(("SUM(avg)", "sum:")):
            if current:
                blocks[current[0].batch] = current
            current = []
            continue
        fields = stripped.split()
        match = _DEEPPOOL_ID.match(fields[0])
        try:
            numbers = [float(f) for f in fields[1:]]
            params = json.loads(match["params"]) if match else None
            dim = json.loads(match["dim"]) if match else None
        except (ValueError, TypeError):
            match = None
        if not match or not numbers:
            raise ConfigError("model.profile", f"{source} line {number}: not a DeepPool profile line")
        dims = tuple(dim) if isinstance(dim, list) else (int(dim),)
        split = len(numbers) == 3  # avg ms, forward us, backward us (profile/*.prof)
        layer = DeepPoolLayer(match["type"], params, int(match["batch"]), dims, numbers[0],
                              numbers[1] if split else None, numbers[2] if split else None)
        if current and layer.batch != current[0].batch:
            raise ConfigError("model.profile", f"{source} line {number}: batch {layer.batch} inside a block of "
                                               f"batch {current[0].batch} (a missing footer)")
        current.append(layer)
    if current:
        blocks[current[0].batch] = current
    if not blocks:
        raise ConfigError("model.profile", f"{source}: no profile blocks")
    return blocks


def _deeppool_ops(net: NetBuilder, index: int, layer: DeepPoolLayer, first: bool, after_block: bool = False) -> Layer:
    """The builder's layer for a DeepPool line (kernels and parameters), or a bare one; ``after_block``:
    the line before is a bottleneck, whose last ReLU already saved this line's input."""
    name, p = f"{index}.{layer.layer_type}", layer.params
    x = Tensor(layer.input_dim, None if first else "previous", -1 - index)
    try:
        if layer.layer_type == "conv2d":
            net.conv2d(name, x, p["out_channels"], p["kernel_size"], p.get("stride", 1), p.get("padding", 0))
        elif layer.layer_type in ("maxPool2d", "avgPool2d"):
            pool = net.maxpool if layer.layer_type == "maxPool2d" else net.avgpool
            pool(name, x, p["kernel_size"], p.get("stride") or p["kernel_size"], p.get("padding", 0))
        elif layer.layer_type == "linear":
            net.linear(name, x, p["out_features"])
        elif layer.layer_type in ("ReLU2d", "ReLU1d"):
            net.relu(name, x, inplace=False)
        elif layer.layer_type == "adAvgPool2d":
            net.adaptive_avgpool(name, x, p.get("output_height", 1))
        elif layer.layer_type == "ResnetBottleneck":
            return _bottleneck(net, name, x, p, input_saved=after_block)
        else:
            return Layer(name, DEEPPOOL_KINDS[layer.layer_type])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"model.layers.{name}", f"DeepPool parameters {p} do not describe a {layer.layer_type}") \
            from None
    return net.layers[-1]


def _bottleneck(net: NetBuilder, name: str, x: Tensor, p: dict, input_saved: bool = False) -> Layer:
    """A ``ResnetBottleneck`` line as one layer holding the kernels of torchvision's ``Bottleneck``
    (see the module docstring), or a bare block with its FLOPs uncounted where the line gives no
    ``inplanes``/``planes``. The sub-layers are built on a builder of their own (same batch and
    precision) and merged: forward ops in order, backward ops in reverse layer order. ``input_saved``:
    the block's input is already saved by the layer before (a bottleneck's last ReLU): not counted again."""
    if "inplanes" not in p or "planes" not in p:
        return Layer(name, "other", flops_counted=False)
    groups, stride = p.get("groups", 1), p.get("stride", 1)
    width = int(p["planes"] * (p.get("base_width", 64) / 64.0)) * groups
    sub = NetBuilder(name, net.batch, net.elem, net.sample, net.seq_length)
    entry = Tensor(x.shape, "previous" if x.producer else None, -1)
    if input_saved:
        sub.mark_saved(entry)
    out = sub.conv2d(f"{name}.conv1", entry, width, 1)
    out = sub.relu(f"{name}.relu1", sub.batchnorm(f"{name}.bn1", out))
    out = sub.conv2d(f"{name}.conv2", out, width, 3, stride=stride, padding=1, groups=groups)
    out = sub.relu(f"{name}.relu2", sub.batchnorm(f"{name}.bn2", out))
    out = sub.batchnorm(f"{name}.bn3", sub.conv2d(f"{name}.conv3", out, 4 * p["planes"], 1))
    identity = entry
    if p.get("downsampleParams"):
        (_, shortcut_out, shortcut_stride), _ = p["downsampleParams"]
        identity = sub.batchnorm(f"{name}.downsample.1",
                                 sub.conv2d(f"{name}.downsample.0", entry, shortcut_out, 1, stride=shortcut_stride))
    sub.relu(f"{name}.relu3", sub.add(f"{name}.add", out, identity, inplace=True))
    parts = sub.layers
    # the block's input feeds conv1 and the shortcut: autograd adds their gradients (when it needs one)
    readers = sum(entry.producer in part.inputs for part in parts) if entry.producer else 0
    sums = gradient_sum_ops(f"{name}.input", readers, float(net.batch * math.prod(x.shape) * net.elem))
    return Layer(name, "other", forward=tuple(op for part in parts for op in part.forward),
                 backward=tuple(op for part in reversed(parts) for op in part.backward) + sums,
                 saved_bytes=sum(part.saved_bytes for part in parts),
                 output_bytes=parts[-1].output_bytes)


def _check_block(source: str, block: list[DeepPoolLayer]) -> None:
    """Every line of a profile block is a known kind, its own parameters agree with the input it
    lists (a conv's in_channels, a linear's in_features), and in a chain (a block with no concat:
    every line reads the line before) each line's input has the channels the conv before it gives."""
    chain = not any(line.layer_type == "concat" for line in block)  # Inception's branches: no order given
    for i, line in enumerate(block):
        where, p, dims = f"model.layers.{i}.{line.layer_type}", line.params, line.input_dim
        if line.layer_type not in DEEPPOOL_KINDS:
            raise ConfigError(where, f"{source}: unknown DeepPool layer kind {line.layer_type!r} (batch {line.batch} "
                                     f"block; known: {', '.join(sorted(DEEPPOOL_KINDS))})")
        for key, have, what in (("in_channels", dims[0], "channels"), ("in_features", dims[-1], "features")):
            if key in p and line.layer_type in ("conv2d", "linear") and p[key] != have:
                raise ConfigError(where, f"{source}: shapes do not chain: {key} {p[key]} but its input "
                                         f"{list(dims)} has {have} {what} (batch {line.batch} block)")
        if line.layer_type == "ResnetBottleneck" and p.get("inplanes", dims[0]) != dims[0]:
            raise ConfigError(where, f"{source}: shapes do not chain: inplanes {p['inplanes']} but its input "
                                     f"{list(dims)} has {dims[0]} channels (batch {line.batch} block)")
        before = block[i - 1] if i else None
        if chain and before and before.layer_type == "conv2d" and len(dims) == 3 \
                and dims[0] != before.params.get("out_channels", dims[0]):
            raise ConfigError(where, f"{source}: shapes do not chain: input {list(dims)} after {i - 1}.conv2d, "
                                     f"which gives {before.params['out_channels']} channels (batch {line.batch} block)")


def deeppool_graph(text: str, name: str, shard: ShardShape, sample: str = "image", seq_length: int | None = None,
                   source: str = "profile") -> LayerGraph:
    """A DeepPool profile as a chain for ``shard.micro_batch`` samples (see the module docstring)."""
    blocks = parse_deeppool(text, source)
    for block in blocks.values():
        _check_block(source, block)
    batches = sorted(blocks)
    b = shard.micro_batch
    if b in blocks:
        weights = {b: 1.0}
    elif b > batches[-1]:
        weights = {batches[-1]: b / batches[-1]}
    elif b < batches[0]:
        weights = {batches[0]: 1.0}
    else:
        hi = batches[bisect.bisect(batches, b)]
        lo = batches[bisect.bisect(batches, b) - 1]
        weights = {lo: (hi - b) / (hi - lo), hi: (b - lo) / (hi - lo)}
    reference = blocks[max(weights, key=weights.get)]
    for batch in weights:
        if len(blocks[batch]) != len(reference):
            raise ConfigError("model.profile", f"{source}: blocks of batch {batch} and {reference[0].batch} list "
                                               "different layers; cannot interpolate")
    net = NetBuilder(name, b, shard.act_bytes, sample, seq_length)
    layers: list[Layer] = []
    for i, line in enumerate(reference):
        built = _deeppool_ops(net, i, line, first=i == 0,
                              after_block=i > 0 and reference[i - 1].layer_type == "ResnetBottleneck")
        forward = backward = 0.0
        for batch, weight in weights.items():
            row = blocks[batch][i]
            if row.forward_us is not None:
                f, bw = row.forward_us / 1e6, row.backward_us / 1e6
            else:
                f, bw = row.total_ms / 3e3, 2 * row.total_ms / 3e3
            forward += weight * f
            backward += weight * bw
        layers.append(_with_measured(replace(built, inputs=(layers[-1].name,) if layers else (), input_shape=None,
                                             output_shape=None), forward, backward))
    return with_gradient_sums(LayerGraph(name, tuple(layers), b, sample, seq_length).check())


#: Layer names that say what a profiled network's sample is, most specific first: a recurrent network
#: translates or models sentences (GNMT, BigLSTM), a network with token embeddings or attention reads
#: sequences (BERT, XLNet), any other (convolutions) images.
_SAMPLE_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sentence", ("lstm", "gru", "rnn(")),
    ("sequence", ("embedding", "embed-", "embeddings", "attention", "input_ids")),
)


@functools.lru_cache(maxsize=64)
def profile_sample_kind(path: str) -> str:
    """What one sample of a profiled network is, from its layer names (:data:`_SAMPLE_WORDS`): a
    PipeDream GNMT graph.txt (``EmuBidirLSTM``, ``Embedding``) is sentences, DAPPLE's BERT-24 sequences,
    VGG or a DeepPool convolution profile images. A file that cannot be read says image (its layer
    graph then names the missing file)."""
    try:
        text = Path(path).read_text().lower()
    except OSError:
        return "image"
    names = [line.split(" -- ")[1] if " -- " in line else line.split("{", 1)[0] for line in text.splitlines()]
    for kind, words in _SAMPLE_WORDS:
        if any(word in name for name in names for word in words):
            return kind
    return "image"


class ProfiledModelSpec(NetworkSpec):
    """A network known by a measured per-layer profile file (``format``: "pipedream" for PipeDream
    and DAPPLE graph.txt, "deeppool" for DeepPool's). ``profile_batch``: the minibatch a graph.txt
    was profiled at (required for "pipedream")."""

    family: Literal["profile"] = "profile"
    format: Literal["pipedream", "deeppool"]
    path: str = Field(min_length=1)
    profile_batch: int | None = Field(default=None, gt=0)
    sample_kind: Literal["image", "sequence", "sentence"] | None = Field(
        default=None, description="what one sample is (samples/s is said in it); default: read from the profile's "
                                  "layers (an LSTM: sentence, an embedding or attention: sequence, else image)")
    sequence_length: int | None = Field(default=None, gt=0)

    @property
    def seq_length(self) -> int | None:
        return self.sequence_length

    @property
    def sample(self) -> str:  # type: ignore[override]
        return self.sample_kind or profile_sample_kind(self.path)

    def layer_graph(self, shard: ShardShape) -> LayerGraph:
        refuse_split(self.name, shard)
        path = Path(self.path)
        if not path.is_file():
            raise ConfigError("model.path", f"profile file not found: {path} (a relative path is read from the "
                                            "scenario file's folder, else from the current directory)")
        text = path.read_text()
        if self.format == "pipedream":
            if self.profile_batch is None:
                raise ConfigError("model.profile_batch", "a graph.txt does not say its minibatch: give profile_batch")
            return pipedream_graph(text, self.name, self.profile_batch, shard, self.sample,
                                   self.sequence_length, path.name)
        return deeppool_graph(text, self.name, shard, self.sample, self.sequence_length, path.name)
