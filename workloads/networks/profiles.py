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
  the run's NOTE names it (TFLOP/s and MFU count the others).

Times at another micro-batch than profiled: PipeDream's are scaled in proportion to the batch
(PipeDream's own assumption); DeepPool's come from the block of that batch, or are interpolated
linearly between the two nearest profiled batches (in proportion beyond the largest). Where a
file gives only forward+backward, the split is 1 : 2 (the FLOP ratio of a layer with weights) —
an assumption. Times are as measured whatever ``precision`` the shard asks; bytes scale with it.
Saved bytes of a profiled layer are its output bytes (PipeDream's activation stash) — an estimate.

**Kernels of a graph.txt node** (issue 19: MFU from counted FLOPs for every workload). A node's
description is the PyTorch module's ``repr`` (PipeDream's profiler writes ``str(module)``), which gives
the layer's sizes but not its input's; its ``activation_size`` is its output's fp32 bytes for the
``profile_batch`` samples, so the missing dimension is ``activation_size / (4 · profile_batch · width)``
(e.g. VGG-16 node12 ``Conv2d(128, 256, kernel_size=(3, 3), ...)``: 411,041,792 / (4 · 128 · 256) = 3,136 =
56² output pixels). From these the builder (workloads/networks/builder.py) makes the node's kernels,
as it does a catalog network's, at the micro-batch asked:

- ``Conv2d(in, out, kernel_size, stride, padding, groups, bias)``: an implicit GEMM of M = batch ·
  H_out·W_out (from the output bytes), N = out/groups, K = in/groups · kh·kw (Chetlur et al. 2014);
  its backward a data and a weight gradient of the same M·N·K, so 2× the forward (the builder's
  convolution; none for the data gradient of a node that reads the network's input, which PyTorch
  skips, as the catalog networks count it);
- ``Linear(in_features, out_features, bias)``: a GEMM of batch · rows × out × in, rows per sample =
  output bytes / (4 · profile_batch · out); backward dgrad + wgrad = 2× the forward;
- ``LSTM(in, hidden[, num_layers][, bidirectional=True])``: the builder's LSTM (per direction and
  step the input and recurrent GEMMs, gates memory-bound; backward each GEMM's two gradients), over
  T = first output's bytes / (4 · profile_batch · directions · hidden) steps; ``EmuBidirLSTM`` (GNMT's
  encoder, whose ``layer1``/``layer2`` share the ``bidir`` LSTM's weights: the file's parameter_size is
  that one bidirectional LSTM's) is its ``bidir`` LSTM; ``RecurrentAttention`` is its ``rnn`` LSTM and
  the builder's additive (Bahdanau) attention over T_k = the scores' bytes (its last output, batch ·
  T_q · T_k) / (4 · profile_batch · T_q) encoder steps; a container whose one leaf with weights is a
  ``Linear`` (GNMT's ``Classifier``) is that linear layer;
- ``Embedding(num, dim)`` (a gather: no FLOPs) and ``BatchNorm2d(C)`` (memory-bound) hold their tables
  (V·D; γ and β);
- ReLU, pooling, dropout, Add, Concat, views (``View``, ``Size``, ``__getitem__``), softmax, layer
  norm and other activations run no GEMM: 0 model FLOPs, as every network's memory-bound ops count
  (workloads/layer_graph.py ``FLOPS_KINDS``); so does a node with no time, no parameters and no output
  (GNMT's ``hidden``: an input).

A node whose description gives no shapes — a bare name (DAPPLE's ``cell_3``, ``layer_12``,
``Conv2d_1_1``, ``embeddings``), a container whose leaves are not the above, or a module whose
kernels are not derived here (``ConvTranspose2d``, ``EmbeddingBag``, an LSTM without biases or with a
projection) — counts 0 FLOPs
(``Layer.flops_counted`` False), and the run says so once in a NOTE naming how many layers and which
(:func:`uncounted_flops_note`): TFLOP/s and MFU then count the other layers (a lower bound). A graph
none of whose layers count (the DAPPLE AmoebaNet, BERT, XLNet and VGG-19 files: bare names only)
prints them n/a, the NOTE naming its layers. A description of a known module whose arguments do not parse, or whose sizes
disagree with the node's ``activation_size`` (not a whole number of pixels, steps or rows: a wrong
``profile_batch`` shows this way) or with its ``parameter_size`` is refused, naming the node (exit 2):
the profiler writes these strings, so a mismatch is a broken or edited file, and counting it 0 would
hide that. These counts are the model FLOPs only: the times stay the measured ones.

Parameters: a node whose kernels are built holds its parameters in its ops, as every built layer
does, and they must equal the file's ``parameter_size`` / 4 (the PipeDream VGG-16 file: 138,357,544,
the catalog ``vgg16``'s); any other node's stay the file's (``Layer.stated_params``: a bare name
names no kernel that could hold them). A DeepPool line is built by the builder, whose ops hold its
weights as every built layer's do (a bare line, with no shapes, holds none).

The measured times are on the layer (``measured_forward_s``/``measured_backward_s``) and on its
ops (``Op.measured_s``: the first op of each pass carries the pass's time, the others 0; a layer
without kernels gets one ``<name>.measured`` op), so a planner that prices ops gets them too.
"""

from __future__ import annotations

import ast
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
from workloads.layer_graph import FLOPS_KINDS, Layer, LayerGraph, gradient_sum_ops, with_gradient_sums
from workloads.networks.builder import NetBuilder, Tensor, conv_out
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
    activation_sizes: tuple[float, ...] = ()   # each output's bytes where the node has several (``[a; b]``)


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
        outputs = tuple(float(s) for s in sizes if s.strip())
        nodes.append(ProfiledNode(node["id"], node["desc"].strip(), float(node["f"]), float(node["b"]),
                                  sum(outputs), float(node["p"]), outputs))
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


#: graph.txt layer kinds that run no GEMM: 0 model FLOPs by kind (workloads/layer_graph.py ``FLOPS_KINDS``)
_NO_GEMM_KINDS = frozenset({"relu", "maxpool", "avgpool", "adaptive_avgpool", "dropout", "add", "concat", "flatten",
                            "softmax", "layernorm", "activation"})
_SUBMODULE_AT = re.compile(r"\((?P<attr>\w+)\): (?P<kind>[A-Za-z_]\w*)\(")


def _closing(text: str, start: int) -> int:
    """The index of the parenthesis that closes the one at ``text[start]`` (-1: none)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return -1


def _submodules(desc: str) -> list[tuple[str, str]]:
    """A container module's repr's direct children as (attribute, repr): ``EmuBidirLSTM(  (bidir):
    LSTM(1024, 1024, bidirectional=True)  (layer1): ...)`` -> [("bidir", "LSTM(1024, ...)"), ...]."""
    children, i = [], desc.find("(") + 1
    while (match := _SUBMODULE_AT.search(desc, i)) is not None:
        end = _closing(desc, match.end() - 1)
        if end < 0:
            break
        children.append((match["attr"], desc[match.start("kind"):end + 1]))
        i = end + 1
    return children


class _Unparsed(ValueError):
    """A known module's description whose arguments do not parse."""


def _call(desc: str) -> tuple[str, list, dict]:
    """A leaf module's repr ``Name(a, b, key=value)`` as (name, positional, keyword) values; bare names
    (``ReLU(inplace)``) read as strings."""
    try:
        call = ast.parse(desc, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        raise _Unparsed(f"{desc!r} is not a module call") from None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise _Unparsed(f"{desc!r} is not a module call")

    def value(node: ast.AST):
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return ast.unparse(node)   # a name (``inplace``, ``same``) or an expression: as written
    return call.func.id, [value(a) for a in call.args], {k.arg: value(k.value) for k in call.keywords}


def _int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Unparsed(f"{what} is {value!r}, not a positive whole number")
    return value


def _pair(value, what: str, least: int = 1) -> tuple[int, int]:
    pair = value if isinstance(value, tuple) else (value, value)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < least for v in pair):
        raise _Unparsed(f"{what} is {value!r}, not one or two whole numbers")
    return pair


def _arg(args: list, kwargs: dict, index: int, key: str, default=None):
    if key in kwargs:
        return kwargs[key]
    if index < len(args):
        return args[index]
    if default is None:
        raise _Unparsed(f"it gives no {key}")
    return default


class _Sizes:
    """Per-sample sizes from a node's output bytes: fp32 (PipeDream profiles in fp32) for
    ``profile_batch`` samples (module docstring)."""

    def __init__(self, node: ProfiledNode, profile_batch: int):
        self.node, self.batch = node, profile_batch
        self.outputs = node.activation_sizes or (node.activation_bytes,)

    def per_sample(self, width: int, what: str, output: int = 0) -> int:
        size = self.outputs[output]
        elements = size / (4.0 * self.batch * width)
        whole = round(elements)
        if whole < 1 or abs(elements - whole) > 1e-9 * elements:
            raise _Unparsed(f"its output of {size:,.0f} bytes is not 4 (fp32) x profile_batch {self.batch} x {width} "
                            f"{what} x a whole number (is profile_batch right?)")
        return whole


def _leaf(net: NetBuilder, name: str, desc: str, x_producer: str | None, sizes: _Sizes) -> bool:
    """Build the kernels of a leaf module's repr on ``net`` (module docstring); False: a kind whose
    kernels are not derived here."""
    kind, args, kwargs = _call(desc)

    def tensor(*shape: int) -> Tensor:
        return Tensor(shape, x_producer, -1 - len(net.layers))
    if kind == "Conv2d":
        cin, cout = _int(_arg(args, kwargs, 0, "in_channels"), "in_channels"), \
            _int(_arg(args, kwargs, 1, "out_channels"), "out_channels")
        kh, kw = _pair(_arg(args, kwargs, 2, "kernel_size"), "kernel_size")
        stride = _pair(_arg(args, kwargs, 3, "stride", 1), "stride")
        padding = _arg(args, kwargs, 4, "padding", 0)
        # PyTorch's padding="same" (stride 1: the output is the input's size) / "valid" (none)
        padding = {"same": ((kh - 1) // 2, (kw - 1) // 2), "valid": 0}.get(padding, padding) \
            if isinstance(padding, str) else padding
        ph, pw = _pair(padding, "padding", least=0)
        groups = _int(_arg(args, kwargs, 6, "groups", 1), "groups")
        pixels = sizes.per_sample(cout, "output channels")
        ho = math.isqrt(pixels)
        ho, wo = (ho, ho) if ho * ho == pixels else (pixels, 1)   # only H_out x W_out enters the FLOPs
        # an input that gives (ho, wo) at this window and stride (the builder takes one stride)
        hin, win = (ho - 1) * stride[0] + kh - 2 * ph, (wo - 1) * stride[0] + kw - 2 * pw
        if hin < 1 or win < 1 or conv_out(hin, kh, stride[0], ph) != ho or conv_out(win, kw, stride[0], pw) != wo:
            raise _Unparsed(f"no input gives its {ho}x{wo} output pixels at this kernel and padding")
        net.conv2d(name, tensor(cin, hin, win), cout, (kh, kw), stride[0], (ph, pw), groups,
                   bias=kwargs.get("bias", True) is True)
    elif kind == "Linear":
        fin, fout = _int(_arg(args, kwargs, 0, "in_features"), "in_features"), \
            _int(_arg(args, kwargs, 1, "out_features"), "out_features")
        rows = sizes.per_sample(fout, "out_features")
        net.linear(name, tensor(rows, fin), fout, bias=kwargs.get("bias", True) is True)
    elif kind.startswith("BatchNorm"):
        channels = _int(_arg(args, kwargs, 0, "num_features"), "num_features")
        if kwargs.get("affine", True) is not True:
            return True   # no γ, β; memory-bound: nothing to count
        net.batchnorm(name, tensor(channels, sizes.per_sample(channels, "channels"), 1))
    elif kind == "Embedding":
        vocab, dim = _int(_arg(args, kwargs, 0, "num_embeddings"), "num_embeddings"), \
            _int(_arg(args, kwargs, 1, "embedding_dim"), "embedding_dim")
        net.embedding(name, sizes.per_sample(dim, "embedding_dim"), vocab, dim)
    elif kind == "LSTM":
        fin, hidden = _int(_arg(args, kwargs, 0, "input_size"), "input_size"), \
            _int(_arg(args, kwargs, 1, "hidden_size"), "hidden_size")
        layers = _int(_arg(args, kwargs, 2, "num_layers", 1), "num_layers")
        if kwargs.get("bias", True) is not True or kwargs.get("proj_size", 0):
            return False   # the builder's LSTM has both biases and no projection here
        directions = 2 if kwargs.get("bidirectional", False) is True else 1
        steps = sizes.per_sample(directions * hidden, "directions x hidden_size")
        x = tensor(steps, fin)
        for i in range(layers):
            x = net.lstm(name if layers == 1 else f"{name}.l{i}", x, hidden, bidirectional=directions == 2)
    else:
        return False
    return True


def _node_kernels(net: NetBuilder, node: ProfiledNode, kind: str, x_producer: str | None, profile_batch: int,
                  source: str) -> tuple[tuple[Op, ...], tuple[Op, ...], int] | None:
    """The forward and backward kernels of a graph.txt node built from its description and output
    bytes, and the parameters its description does not show (a container's bare ``nn.Parameter`` s);
    ((), (), stated) for a node that runs no GEMM; None where the description gives no shapes
    (module docstring). A known module whose arguments do not parse, or disagree with the node's
    sizes, is a ConfigError naming the node."""
    stated = round(node.parameter_bytes / 4)
    desc = node.desc
    if kind in _NO_GEMM_KINDS or desc.startswith("__getitem__") or \
            not (node.forward_ms or node.backward_ms or node.parameter_bytes or node.activation_bytes):
        return (), (), stated
    sizes = _Sizes(node, profile_batch)
    start = len(net.layers)
    children = _submodules(desc)
    try:
        if not children:
            if not _MODULE_CALL.match(desc) or not _leaf(net, node.node_id, desc, x_producer, sizes):
                return None
        elif desc.startswith("EmuBidirLSTM"):
            bidir = dict(children).get("bidir", "")
            if not bidir.startswith("LSTM(") or not _leaf(net, node.node_id, bidir, x_producer, sizes):
                return None
        elif desc.startswith("RecurrentAttention"):
            parts = dict(children)
            attention = dict(_submodules(parts.get("attn", "")))
            if not parts.get("rnn", "").startswith("LSTM(") or not {"linear_q", "linear_k"} <= set(attention):
                return None
            _, rnn_args, rnn_kwargs = _call(parts["rnn"])
            if rnn_kwargs.get("bidirectional") is True or _arg(rnn_args, rnn_kwargs, 2, "num_layers", 1) != 1:
                return None
            _leaf(net, f"{node.node_id}.rnn", parts["rnn"], x_producer, sizes)
            query = Tensor(net.layers[-1].output_shape, f"{node.node_id}.rnn", -1 - len(net.layers))
            _, k_args, k_kwargs = _call(attention["linear_k"])
            keys_width = _int(_arg(k_args, k_kwargs, 0, "in_features"), "linear_k in_features")
            key_steps = sizes.per_sample(query.shape[0], "query steps (the scores, its last output)", output=-1)
            net.additive_attention(f"{node.node_id}.attn", query, Tensor((key_steps, keys_width), "keys", -2))
        else:   # a container whose one leaf with weights is a Linear (GNMT's Classifier)
            leaves = [child for _, child in children if not child.startswith(("Dropout(", "ReLU(", "Identity("))]
            if len(leaves) != 1 or not leaves[0].startswith("Linear(") or _submodules(leaves[0]):
                return None
            _leaf(net, node.node_id, leaves[0], x_producer, sizes)
    except (_Unparsed, ConfigError) as why:
        raise ConfigError(f"model.layers.{node.node_id}",
                          f"{source}: {desc[:80]!r}: {getattr(why, 'reason', why)}") from None
    parts = net.layers[start:]
    forward = tuple(op for part in parts for op in part.forward)
    backward = tuple(op for part in reversed(parts) for op in part.backward)
    derived = sum(part.params for part in parts)
    if derived != stated and (not children or derived > stated):
        raise ConfigError(f"model.layers.{node.node_id}",
                          f"{source}: {desc[:80]!r} holds {derived:,} parameters but its parameter_size says "
                          f"{stated:,} ({node.parameter_bytes:,.0f} bytes / 4)")
    return forward, backward, stated - derived


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
    layers = [Layer("input", "other", output_bytes=0.0)]   # the data loading, dropped: no kernel
    net = NetBuilder(name, shard.micro_batch, shard.act_bytes, sample, seq_length)
    for node in _topological(nodes, edges, source):
        if node.node_id in inputs:
            continue
        reads = tuple(dict.fromkeys("input" if p in inputs else p for p in preds[node.node_id])) or ("input",)
        out_bytes = node.activation_bytes * byte_scale
        kind = _kind(node, source)
        # kernels from the description (module docstring); a node that reads only the network's input
        # computes no data gradient, as PyTorch skips it
        kernels = _node_kernels(net, node, kind, None if reads == ("input",) else "previous", profile_batch, source)
        forward, backward, stated = kernels or ((), (), round(node.parameter_bytes / 4))
        # parameters the kernels hold are theirs; what they do not show (all of a bare name's) stay stated
        layer = Layer(name=node.node_id, kind=kind, forward=forward, backward=backward, stated_params=stated,
                      saved_bytes=out_bytes, output_bytes=out_bytes, inputs=reads, flops_counted=kernels is not None,
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


def uncounted_flops_note(graph: LayerGraph, descriptions: dict[str, str] | None = None) -> str | None:
    """The NOTE a run on a profile with layers whose FLOPs are not counted prints once: how many and
    which (``descriptions``: a graph.txt node's description by layer name; else the layer's name),
    and what TFLOP/s and MFU then are (a lower bound, or n/a where no layer counts a FLOP); None where
    every layer is counted."""
    uncounted = [layer for layer in graph.layers if not layer.flops_counted]
    if not uncounted:
        return None
    names = list(dict.fromkeys((descriptions or {}).get(layer.name, layer.name)[:40] for layer in uncounted))
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    total, missing = len(graph.layers), len(uncounted)
    if not any(op.kind in FLOPS_KINDS and op.flops for layer in graph.layers for op in layer.forward):
        return (f"FLOPs counted for no layer of the profile: {missing} of its {total} layers give no shapes ({shown}) "
                "and the others run no GEMM; TFLOP/s and MFU are n/a")
    return (f"FLOPs counted for {total - missing} of {total} layers of the profile: {missing} "
            f"give{'s' if missing == 1 else ''} no shapes and count{'s' if missing == 1 else ''} 0 ({shown}); "
            "TFLOP/s and MFU count the others (a lower bound)")


@functools.lru_cache(maxsize=64)
def _descriptions(path: str) -> dict[str, str]:
    nodes, _ = parse_graph_txt(Path(path).read_text(), Path(path).name)
    return {node.node_id: node.desc for node in nodes}


def profile_flops_notes(scenario) -> list[str]:
    """:func:`uncounted_flops_note` of a scenario whose model is a measured profile ([] otherwise)."""
    model = scenario.model
    if getattr(model, "family", None) != "profile":
        return []
    graph = scenario.layer_graph()
    if graph.flops_counted_layers() == len(graph.layers):
        return []
    text = uncounted_flops_note(graph, _descriptions(model.path) if model.format == "pipedream" else None)
    return [text] if text else []

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
