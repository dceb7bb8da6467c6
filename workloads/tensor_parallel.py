"""Tensor parallelism for a general layer graph, the Megatron way (Shoeybi et al. 2019, Sec. 3).

``tensor_parallel_graph(graph, tp)`` takes a network's graph built for one rank at tp 1 and
returns what one of ``tp`` tensor-parallel ranks runs, layer by layer. Each layer's output is
either *replicated* (every rank holds the whole activation) or *split* (each rank holds 1/tp of
its last dimension: features, heads, vocabulary):

- ``linear`` on a replicated input whose output only reaches layers that take a split
  (``_takes_split``: a linear, a softmax cross-entropy, or elementwise layers leading to them)
  is **column-parallel**: N/tp outputs, weight and bias ÷tp, its input gradient all-reduced over
  tp in the backward (Megatron's ``f``), issued after its input-gradient GEMM and overlapping
  the weight gradient as ``workloads.graph._backward_of`` does. A linear on a split input is
  **row-parallel**: K/tp, weight ÷tp, bias replicated, its output all-reduced over tp in the
  forward (Megatron's ``g``; identity in the backward). Any other linear runs replicated
  (BERT's masked-LM transform and pooler, ViT's classifier, as in Megatron-LM).
- ``attention`` with a ``heads`` split (multi-head self-attention) runs heads/tp per rank: its
  first GEMM (Q, K, V) column-, its last (the output projection) row-parallel, the core between
  ÷tp, one forward all-reduce of the output and one backward all-reduce of the input gradient.
  Parameters (its ops'): 4h²/tp + 3h/tp + h (the output bias replicated). Heads must divide by tp.
- ``activation``, ``relu``, ``dropout`` and views on a split input follow the split (÷tp).
- ``loss`` on split logits is Megatron's vocab-parallel cross-entropy: its kernels ÷tp plus
  three fp32 all-reduces per token (maximum, target logit, sum of exponentials;
  ``_VocabParallelCrossEntropy``; ``workloads.graph.head_work`` for decoders).
- ``embedding`` whose table has more rows than the sample has tokens (a vocabulary) is
  vocab-parallel: table ÷tp, its output all-reduced in the forward; position and segment tables
  stay replicated (Megatron-LM's ``VocabParallelEmbedding`` beside plain position embeddings).
- Layer norms, residual adds, concatenations and every other element-wise or norm layer run
  replicated on the whole activation, as Megatron does without sequence parallelism.
- A convolution that reads the network's input (a ViT's patch projection, a CNN's stem) runs
  replicated, as Megatron-LM's ViT keeps its patch projection. Any other convolution, LSTMs,
  additive attention and anything else that has no honest TP split here is refused with a
  ConfigError naming the layer (``parallelism.tp``).

Autograd's gradient sums at fan-outs (workloads/layer_graph.py) are taken out before the split
and put back after it, at the sizes each rank holds.

Activation bytes: a split layer keeps its saved bytes ÷tp except its replicated input (a
column-parallel linear or attention saves its whole input: ``min(saved, input bytes)`` is kept
whole, the rest ÷tp); where the builder counted that input as another layer's storage the
split part is an approximation of at most the input's bytes.
"""

from __future__ import annotations

import math
from dataclasses import replace

from simulator.errors import ConfigError
from workloads.graph import Op
from workloads.layer_graph import Layer, LayerGraph, with_gradient_sums, without_gradient_sums

#: Element-wise layers that run on whatever split their input has.
FOLLOW_KINDS = frozenset({"activation", "relu", "dropout", "flatten"})
#: Layers that run replicated on a replicated input (their whole activation on every rank).
REPLICATED_KINDS = frozenset({"add", "layernorm", "groupnorm", "batchnorm", "dropout", "activation", "relu",
                              "flatten", "concat", "softmax", "maxpool", "avgpool", "adaptive_avgpool",
                              "upsample", "loss", "linear"})
LOSS_FP32_BYTES = 4
VOCAB_PARALLEL_CE_ALL_REDUCES = ("logits_max", "target_logit", "sum_exp")


def _refuse(graph: LayerGraph, layer: Layer, why: str = "") -> ConfigError:
    return ConfigError("parallelism.tp", f"tensor parallelism is not modelled for {layer.kind} layers "
                                         f"({graph.name} layer {layer.name!r}){why}; use tp: 1")


def _consumers(graph: LayerGraph) -> dict[str, list[Layer]]:
    out: dict[str, list[Layer]] = {layer.name: [] for layer in graph.layers}
    for layer in graph.layers:
        for name in layer.inputs:
            out[name].append(layer)
    return out


def _takes_split(layer: Layer, consumers: dict[str, list[Layer]]) -> bool:
    """Whether a split output of ``layer`` can flow on without gathering: every consumer is a
    linear (row-parallel), a loss (vocab-parallel) or an element-wise layer whose own consumers
    take it, and none reads a second tensor (a residual add of a split and a whole tensor)."""
    users = consumers[layer.name]
    if not users:
        return False
    for user in users:
        if len(user.inputs) != 1:
            return False
        if user.kind == "linear" or (user.kind == "loss" and user.forward and user.forward[-1].kind == "memory"
                                     and len(user.forward) == 1):
            continue
        if user.kind in FOLLOW_KINDS and _takes_split(user, consumers):
            continue
        return False
    return True


def _split_gemm(op: Op, tp: int, dim: str) -> Op:
    """A GEMM with one of its dimensions (``"m"``, ``"n"`` or ``"k"``) ÷tp, rounded up (Megatron
    pads a vocabulary to a multiple of tp); FLOPs from the new shape, HBM bytes scaled by the
    operand sizes m·k + m·n + k·n (input, output, weight). The weight it holds follows the split
    (k x n ÷tp: where the dimension does not divide, the rank's mean share of it, not the rounded-up
    shape); a column split (n) splits the bias, a row split (k) keeps it whole (added after the
    all-reduce)."""
    dims = {"m": op.m, "n": op.n, "k": op.k}
    whole = dims[dim]
    dims[dim] = math.ceil(whole / tp)
    old = op.m * op.k + op.m * op.n + op.k * op.n
    new = dims["m"] * dims["k"] + dims["m"] * dims["n"] + dims["k"] * dims["n"]
    held = {}
    if dim in ("n", "k") and (op.weights or op.bias):
        held = {"weights": op.weights * (whole / tp) / dims[dim] if whole % tp else op.weights,
                "bias": op.bias / tp if dim == "n" else op.bias}
    return replace(op, **dims, **held, flops=op.flops * dims[dim] / max(1, whole),
                   bytes_moved=op.bytes_moved * new / old if old else op.bytes_moved)


#: The dimension a forward split lands on in the backward GEMMs of C[M,N] = A[M,K]·B[K,N]:
#: dgrad is dA = dC·Bᵀ (M, K, N), wgrad is dB = Aᵀ·dC (K, N, M).
_BACKWARD_DIM = {("n", "dgrad"): "k", ("n", "wgrad"): "n", ("k", "dgrad"): "n", ("k", "wgrad"): "m"}


def _split_backward(op: Op, tp: int, forward_dim: str) -> Op:
    which = "dgrad" if op.name.endswith(".dgrad") else "wgrad"
    return _split_gemm(op, tp, _BACKWARD_DIM[(forward_dim, which)])


def _all_reduce(name: str, payload: float, overlaps_next: bool = False) -> Op:
    return Op(name, "collective", collective="all_reduce", group="tp", comm_bytes=float(payload),
              overlaps_next=overlaps_next)


def _split_saved(layer: Layer, tp: int, whole: float) -> float:
    keep = min(layer.saved_bytes, whole)
    return keep + (layer.saved_bytes - keep) / tp


def _with_input_grad_comm(backward: list[Op], dgrad_index: int | None, comm: Op) -> list[Op]:
    """``comm`` issued right after the input-gradient GEMM (none: the layer reads the network's
    input, no gradient to send)."""
    if dgrad_index is None or not comm.comm_bytes:
        return backward
    return backward[:dgrad_index + 1] + [comm] + backward[dgrad_index + 1:]


def _column_linear(layer: Layer, tp: int, input_bytes: float, whole: float) -> Layer:
    (gemm,) = layer.forward
    bwd = [_split_backward(op, tp, "n") for op in layer.backward]
    dgrad = next((i for i, op in enumerate(bwd) if op.name.endswith(".dgrad")), None) if input_bytes else None
    bwd = _with_input_grad_comm(bwd, dgrad, _all_reduce(f"{layer.name}.input_grad.all_reduce", input_bytes, True))
    return replace(layer, forward=(_split_gemm(gemm, tp, "n"),), backward=tuple(bwd),
                   saved_bytes=_split_saved(layer, tp, whole), output_bytes=layer.output_bytes / tp)


def _row_linear(layer: Layer, tp: int) -> Layer:
    (gemm,) = layer.forward
    return replace(layer, forward=(_split_gemm(gemm, tp, "k"), _all_reduce(f"{layer.name}.all_reduce",
                                                                          layer.output_bytes)),
                   backward=tuple(_split_backward(op, tp, "k") for op in layer.backward),
                   saved_bytes=layer.saved_bytes / tp)


def _scaled(op: Op, tp: int) -> Op:
    """A kernel over heads/tp (the attention core) or 1/tp of the features (element-wise): one that
    holds parameters is refused (no layer that follows a split holds any)."""
    if op.params:
        raise ConfigError("parallelism.tp", f"tensor parallelism is not modelled for {op.name!r}, which holds "
                                            "parameters, on a split activation; use tp: 1")
    return replace(op, flops=op.flops / tp, bytes_moved=op.bytes_moved / tp,
                   batch=max(1, op.batch // tp) if op.kind == "attention" else op.batch)


def _attention(graph: LayerGraph, layer: Layer, tp: int, input_bytes: float, whole: float) -> Layer:
    """Self-attention split by heads: Q/K/V column-, output projection row-parallel, core ÷tp.
    The builder orders the backward as output projection, core, Q/K/V."""
    first = next(op for op in layer.forward if op.kind == "gemm")
    last = next(op for op in reversed(layer.forward) if op.kind == "gemm")
    core = next(op for op in layer.forward if op.kind == "attention")
    heads = first.k // max(1, core.k)
    if heads % tp:
        raise ConfigError("parallelism.tp", f"{tp} does not divide the {heads} heads of {graph.name} layer "
                                            f"{layer.name!r}")
    fwd = [_split_gemm(op, tp, "n") if op is first else _split_gemm(op, tp, "k") if op is last
           else _scaled(op, tp) for op in layer.forward]
    fwd.append(_all_reduce(f"{layer.name}.all_reduce", layer.output_bytes))
    core_seen = False
    qkv_dgrad = None
    bwd: list[Op] = []
    for op in layer.backward:
        if op.kind == "gemm":
            if core_seen and op.name.endswith(".dgrad"):
                qkv_dgrad = len(bwd)
            bwd.append(_split_backward(op, tp, "n" if core_seen else "k"))
        else:
            core_seen = True
            bwd.append(_scaled(op, tp))
    bwd = _with_input_grad_comm(bwd, qkv_dgrad, _all_reduce(f"{layer.name}.input_grad.all_reduce", input_bytes, True))
    return replace(layer, forward=tuple(fwd), backward=tuple(bwd), saved_bytes=_split_saved(layer, tp, whole))


def _follow(layer: Layer, tp: int) -> Layer:
    return replace(layer, forward=tuple(_scaled(op, tp) for op in layer.forward),
                   backward=tuple(_scaled(op, tp) for op in layer.backward),
                   saved_bytes=layer.saved_bytes / tp, output_bytes=layer.output_bytes / tp)


def _vocab_parallel_loss(layer: Layer, tp: int, micro_batch: int) -> Layer:
    rows = micro_batch * (math.prod(layer.input_shape[:-1]) if layer.input_shape else 1)
    comms = tuple(_all_reduce(f"{layer.name}.{what}.all_reduce", LOSS_FP32_BYTES * rows)
                  for what in VOCAB_PARALLEL_CE_ALL_REDUCES)
    split = _follow(layer, tp)
    return replace(split, forward=split.forward + comms, output_bytes=layer.output_bytes)


def _vocab_parallel_embedding(layer: Layer, tp: int) -> Layer:
    """The lookup's table split by rows (its mean share V/tp on a rank), its output all-reduced."""
    ops = tuple(replace(op, tables=tuple((rows / tp, *rest) for rows, *rest in op.tables)) if op.tables else op
                for op in layer.forward)
    return replace(layer, forward=ops + (_all_reduce(f"{layer.name}.all_reduce", layer.output_bytes),))


def _table_rows(layer: Layer) -> float:
    """Rows of the first table the layer's kernels hold (an embedding's vocabulary or positions; 0: none)."""
    return next((op.tables[0][0] for op in layer.forward if op.tables), 0)


def tensor_parallel_graph(graph: LayerGraph, tp: int) -> LayerGraph:
    """What one of ``tp`` tensor-parallel ranks runs of ``graph`` (module docstring); ``graph``
    is the tp-1 graph. Raises a ConfigError naming the first layer without a TP split."""
    if tp == 1:
        return graph
    graph = without_gradient_sums(graph)   # split by kernels; the sums come back at the split sizes
    consumers = _consumers(graph)
    split: dict[str, bool] = {}
    layers: list[Layer] = []
    for layer in graph.layers:
        inputs_split = [split[n] for n in layer.inputs]
        any_split = any(inputs_split)
        # what the layer reads whole on every rank (the network's input: what it saves of it)
        input_bytes = graph.input_bytes(layer)
        whole = input_bytes if layer.inputs else layer.saved_bytes
        kind = layer.kind
        if any_split and (len(layer.inputs) != 1):
            raise _refuse(graph, layer, " (reads a tensor-split activation beside another)")
        if kind == "linear":
            if any_split:
                new, out_split = _row_linear(layer, tp), False
            elif _takes_split(layer, consumers):
                new, out_split = _column_linear(layer, tp, input_bytes, whole), True
            else:
                new, out_split = layer, False
        elif kind == "attention" and "heads" in layer.splittable and not any_split:
            new, out_split = _attention(graph, layer, tp, input_bytes, whole), False
        elif kind == "embedding":
            tokens = layer.output_shape[0] if layer.output_shape and len(layer.output_shape) > 1 else 1
            new = _vocab_parallel_embedding(layer, tp) if _table_rows(layer) > tokens else layer
            out_split = False
        elif any_split and kind in FOLLOW_KINDS:
            new, out_split = _follow(layer, tp), True
        elif any_split and kind == "loss":
            new, out_split = _vocab_parallel_loss(layer, tp, graph.micro_batch), False
        elif not any_split and kind in REPLICATED_KINDS:
            new, out_split = layer, False
        elif kind in ("conv2d", "conv_transpose2d", "patch_embedding") and not layer.inputs:
            new, out_split = layer, False   # the stem / patch projection, replicated (Megatron ViT)
        else:
            raise _refuse(graph, layer)
        split[layer.name] = out_split
        layers.append(new)
    return with_gradient_sums(replace(graph, layers=tuple(layers), tensor_parallel=tp))
