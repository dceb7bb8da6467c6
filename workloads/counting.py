"""A transformer's parameter and FLOP counts, read from its layer graph (the one description).

Nothing here states what a layer holds: the builder does (workloads/transformer_graph.py, per rank
after a layout's split); these are the sums of its graph unsplit (tp = ep = cp = 1, one sequence of
``model.seq_length`` tokens): every layer's ``params`` (``expert_params`` of them routed experts),
and the ops' FLOPs (:meth:`workloads.layer_graph.LayerGraph.step_flops`), as a CNN's or a traced
module's counts are read from theirs. Each model's counts are summed once (cached): the simulator,
the search, economics and the CLI ask for them per layout. The literature's closed forms
(Narayanan 2021's 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)), the per-op counts) are test oracles in
validation/closed_forms.py, not a second source.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from workloads.graph import ModelFlops, ShardShape
from workloads.layer_graph import LayerGraph
from workloads.layer_kinds import is_moe_layer, layer_kind_counts, layer_kind_runs, layer_kinds  # noqa: F401 (as before)
from workloads.schema import TransformerSpec


@dataclass(frozen=True)
class ParamCounts:
    """A model's parameters, summed over its unsplit layer graph."""

    total: int
    active: int        # touched per token: a MoE layer's top-k routed experts of its E (plus the rest)
    embedding: int     # the graph's prologue (token embedding + learned positions)
    head: int          # its epilogue (final norm + untied LM head)
    block: dict[bool, int]   # one block of each kind (False dense, True MoE)


def unsharded_graph(model: TransformerSpec, vocab_padding_tp: int = 0) -> LayerGraph:
    """The model's graph for one sequence on one device, nothing split: what its counts are read from.
    ``vocab_padding_tp`` 0 (default): the model's own vocabulary; t > 0: padded as a run at tp t holds it
    (``TransformerSpec.padded_vocab_size``: Megatron's dummy rows, in memory and FLOPs)."""
    return model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length, vocab_padding_tp=vocab_padding_tp))


def counts_of(graph: LayerGraph, top_k: int = 1, num_experts: int = 1) -> ParamCounts:
    """The sums of ``graph``'s layers; a token passes through ``top_k`` of a layer's
    ``num_experts`` routed experts (their share of its ``expert_params``)."""
    block: dict[bool, int] = {}
    total = active = 0.0
    for layer in graph.layers:
        total += layer.params
        active += layer.params - layer.expert_params + layer.expert_params * top_k / num_experts
    for layer in graph.pipelined:
        block.setdefault(layer.expert_params > 0, int(round(layer.params)))
    return ParamCounts(int(round(total)), int(round(active)), int(round(graph.layers[0].params)),
                       int(round(graph.layers[-1].params)), block)


@cache
def param_counts(model: TransformerSpec, vocab_padding_tp: int = 0) -> ParamCounts:
    """``model``'s parameter counts (cached per model): its own (``vocab_padding_tp`` 0), or as held by
    a run at tp t with the vocabulary padded (``vocab_padding_tp`` t; :func:`unsharded_graph`)."""
    moe = model.moe
    return counts_of(unsharded_graph(model, vocab_padding_tp),
                     *((moe.top_k, moe.num_experts) if moe is not None else ()))


def total_params(model: TransformerSpec) -> int:
    """All parameters: the sum of the graph's layers (the model's own vocabulary, no padding)."""
    return param_counts(model).total


def padded_total_params(model: TransformerSpec, tp: int = 1) -> int:
    """All parameters as a run at tensor parallelism ``tp`` holds them: the embedding table and an
    untied LM head over the padded vocabulary (``TransformerSpec.make_vocab_size_divisible_by`` x tp,
    Megatron's dummy rows). Equal to :func:`total_params` where the vocabulary needs no padding."""
    return param_counts(model, tp).total


def active_params(model: TransformerSpec) -> int:
    """Parameters touched per token ("activated parameters" of DeepSeek-V3): everything but the
    routed experts a token is not sent to, i.e. a MoE layer counts its top-k routed experts plus the
    shared ones. Embedding and LM head are included."""
    return param_counts(model).active


def layer_params(model: TransformerSpec, moe_layer: bool | None = None) -> int:
    """Parameters of one block of the graph; ``moe_layer`` (a MoE block or a dense one) defaults to
    whether the model has experts."""
    return param_counts(model).block[model.is_moe if moe_layer is None else moe_layer]


def embedding_params(model: TransformerSpec) -> int:
    """Token embedding plus learned positions (if any): the graph's embedding layer."""
    return param_counts(model).embedding


def output_head_params(model: TransformerSpec) -> int:
    """Final norm plus the LM head when it is not tied to the embedding: the graph's head layer."""
    return param_counts(model).head


def step_flops(model: TransformerSpec, seq_length: int, global_batch: int, recompute: str,
               flash_attention: bool = False, tp: int = 1) -> ModelFlops:
    """Whole-model FLOPs per optimizer step, summed over the ops of the unsplit graph for one
    sequence of ``seq_length`` tokens (:meth:`LayerGraph.step_flops`: model FLOPs 3 x forward,
    hardware FLOPs what the kernels run, recompute included), the vocabulary padded as a run at
    tensor parallelism ``tp`` pads it (Megatron-LM counts its padded vocabulary in its TFLOP/s)."""
    shard = ShardShape(micro_batch=1, seq_length=seq_length, flash_attention=flash_attention, vocab_padding_tp=tp)
    return model.layer_graph(shard).step_flops(global_batch, recompute)
