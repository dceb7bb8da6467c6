"""Width-wise (neuron) masks on a layer graph: which of each layer's input and output channels
a subnetwork keeps, for ``subnetwork_dp``'s ``mask: neuron`` (simulator/strategies/subnetwork_dp.py).

A neuron-masked layer computes the fraction k of its output channels (neurons, heads, units).
Its consumers then see those channels masked, so a layer's weights connect a kept fraction
c_in of its input channels to a kept fraction c_out of its outputs: a convolution or linear layer
whose inputs and outputs are both masked keeps k² of its weights and FLOPs (the width-scaled
subnetworks of HeteroFL, Diao, Ding & Tarokh 2021, ICLR, Sec. 3: every hidden channel count
shrinks by one ratio r, so a hidden layer keeps about r² of its weights; cited from memory), a layer with one masked side keeps k
(the first masked layer after an unmasked stem, the classifier reading masked features). Read
from the graph, layer by layer in topological order:

- ``masked_out`` m_out: the share of a layer's own output channels masked: 1 for a layer of
  the mask set; for a layer outside it, its input's share when it works channel by channel
  (normalisation, activation, pooling, dropout, add, a depthwise convolution: its channels are
  its input's), else 0 (a dense layer outside the set computes all its outputs);
- ``masked_in`` m_in: for a dense layer (convolution, linear, LSTM, attention, embedding), the
  share of its input channels that come masked: its input's output share, for a concatenation
  the channel-weighted mean of its inputs' (channels: the first dimension of a (C, H, W) shape,
  the last of a (tokens, hidden) one), for several inputs of an add the smallest (a channel is
  there when any input has it); 0 for a channel-wise layer (its weights are per channel);
- a whole ``transformer_block`` / ``mlp_block`` layer of the set keeps k of its weights and
  FLOPs: its hidden units and heads are masked, its residual stream stays whole (each of its
  GEMMs has one masked side), so its consumers see no masked channel. Of the activations a
  transformer block saves (workloads/transformer_graph.py ``block_saved_tensors``, Korthikanti
  et al. 2022 Sec. 4.1) only those as wide as its heads or MLP units keep k (Q, K, V, the output
  projection's input, FC1's output, FC2's input, a materialised attention core); those as wide as
  the residual stream stay whole (the two norms' inputs, the QKV and FC1 inputs, i.e. the norms'
  outputs, the dropout masks; MLA's latents), :func:`block_activation_shares`. With FlashAttention,
  16-bit activations and a plain 4h MLP that is (10 + 24k)·sbh bytes of Korthikanti's 34·sbh, not
  k of them; an ``mlp_block`` (no tensors stated) keeps k.

**Transformers built layer by layer** (BERT, ViT from the catalog, a traced transformer): when the
mask set holds an ``attention`` layer, the graph follows the same rule as a whole block, read from
its wiring: the residual stream (embeddings, layer norms, residual adds, dropouts on the stream,
the head's input) is not masked, only heads and MLP hidden units are (Singh et al. 2025 mask the
neurons of hidden layers; a residual dimension cannot be dropped in one block without dropping it
in all). So a channel-wise layer of the set (norm, dropout, add, activation) takes its input's
share instead of masking its own; a dense layer of the set masks its outputs unless they are
added into the stream (:func:`stream_writers`: the layers an add of two or more inputs reads
through channel-wise layers only, e.g. BERT's ``output.dense``, ViT's ``mlp.3``), which then keep
k on their masked input side only; an ``attention`` layer with weights (Q, K, V, core and output
projection as one layer) keeps k of its weights and FLOPs like a block, its output whole, and of
its activations its saved input (``Layer.saved_input_bytes``, the stream) whole and k of the rest
(Q, K, V, the core's output, its statistics, a materialised score matrix). BERT-large's GEMMs are
then one-sided (k), as GPT's are; before, every width was masked (k² for most of them).

The kept fraction of a side is c = 1 - m·(1 - k); a layer keeps c_in·c_out of its weights and
FLOPs and, of the activations it saves, c_in for a dense layer (it saves its input) and c_out for
a channel-wise one. Its weights split into a shared part (1 - m_in)(1 - m_out), one-sided slices
(m_in + m_out - 2 m_in m_out: cut in S slices by the masked side) and two-sided pieces m_in m_out
(cut in S × S by both sides; a worker keeps a piece when it keeps both slices).
"""

from __future__ import annotations

import dataclasses

from workloads.layer_graph import Layer, LayerGraph
from workloads.transformer_graph import SavedTensor

#: Layers whose weights connect every input channel to every output channel.
DENSE_KINDS = frozenset({"conv2d", "conv_transpose2d", "linear", "lstm", "attention", "embedding",
                         "patch_embedding", "lm_head"})
#: Layers that are a whole residual block (workloads/transformer_graph.py).
BLOCK_KINDS = frozenset({"transformer_block", "mlp_block"})


#: A transformer block's saved tensors as wide as its heads or MLP units (names of
#: workloads/transformer_graph.py ``block_saved_tensors``): a neuron mask keeps k of each.
HEAD_AND_UNIT_TENSORS = frozenset({"q", "k_v", "q_k_v", "qk_norm_input", "attn_out_input", "fc1_output",
                                   "fc2_input", "attention_core"})

#: A transformer block's memory-bound ops on the residual stream (or MLA's latents, MoE's token
#: permutation) (workloads/graph.py): whole under a neuron mask, with their backward (``.grad``).
RESIDUAL_STREAM_OPS = frozenset({"ln1", "ln2", "dropout_residual1", "dropout_residual2", "q_norm", "kv_norm",
                                 "router_topk_permute", "unpermute_weighted_sum"})


def block_activation_shares(tensors: tuple[SavedTensor, ...], factors: dict[str, float],
                            recompute: str) -> tuple[float, float]:
    """(share of what a transformer block keeps under ``recompute``, share of all it saves) when it
    keeps ``factors[name]`` of each tensor named there and all of the others: k of
    :data:`HEAD_AND_UNIT_TENSORS` under a neuron mask (the module docstring), none of the tensors
    only a weight gradient reads in a frozen block (simulator/strategies/subnetwork_dp.py). Full
    recompute keeps the block's input, the residual stream: whole (share 1); the working set it
    re-creates is the second share."""
    def share(weights: list[float]) -> float:
        total = sum(weights)
        kept = sum(w * factors.get(t.name, 1.0) for w, t in zip(weights, tensors, strict=True))
        return kept / total if total else 1.0
    saved = share([t.nbytes for t in tensors])
    if recompute == "full":
        return 1.0, saved
    if recompute == "selective":
        return share([0.0 if t.selective_drops else t.nbytes for t in tensors]), saved
    if recompute == "selective_op":
        return share([t.nbytes * t.op_sac_kept for t in tensors]), saved
    return saved, saved


#: Memory ops of an ``attention`` layer with weights (workloads/networks/builder.py) as wide as the
#: residual stream: whole under a neuron mask (names after the layer's, with their ``.grad``).
ATTENTION_STREAM_OPS = frozenset({"input.gradient_sum", "pad_roll_partition_copies"})


@dataclasses.dataclass(frozen=True)
class NeuronMask:
    """The masked shares of one layer's input and output channels (see the module docstring).
    ``whole_activations``: the share of its saved activations as wide as the residual stream,
    kept whole (an attention layer's input)."""

    masked_in: float
    masked_out: float
    dense: bool           # its weights connect input to output channels (saves its input)
    whole_activations: float = 0.0

    def kept_in(self, k: float) -> float:
        return 1 - self.masked_in * (1 - k)

    def kept_out(self, k: float) -> float:
        return 1 - self.masked_out * (1 - k)

    def kept(self, k: float) -> float:
        """Share of the layer's weights and FLOPs a worker keeping k of the neurons runs."""
        return self.kept_in(k) * self.kept_out(k)

    def kept_activations(self, k: float) -> float:
        masked = self.kept_in(k) if self.dense else self.kept_out(k)
        return self.whole_activations + (1 - self.whole_activations) * masked

    @property
    def two_sided(self) -> float:
        return self.masked_in * self.masked_out

    @property
    def one_sided(self) -> float:
        return self.masked_in + self.masked_out - 2 * self.two_sided


def channels(shape: tuple[int, ...] | None) -> int | None:
    """Channels of a per-sample shape: C of (C, H, W), the hidden size of (tokens, hidden)."""
    if not shape:
        return None
    return shape[0] if len(shape) == 3 else shape[-1]


def is_depthwise(layer: Layer) -> bool:
    """A convolution with one filter per channel (its weights: C × kh × kw, plus a bias)."""
    if layer.kind != "conv2d" or layer.window is None or not layer.output_shape:
        return False
    c = channels(layer.output_shape)
    return layer.params <= c * (layer.window[0] * layer.window[1] + 1)


def is_dense(layer: Layer) -> bool:
    return layer.kind in DENSE_KINDS and layer.params > 0 and not is_depthwise(layer)


def is_attention_unit(layer: Layer) -> bool:
    """An attention layer holding its projections (heads inside, input and output on the stream)."""
    return layer.kind == "attention" and layer.params > 0


def stream_writers(graph: LayerGraph) -> set[str]:
    """Layers whose output is added into a residual stream: from each input of an add of two or
    more inputs, back through single-input channel-wise layers (a dropout) to the first layer that
    is not one (a dense layer or an attention layer; another add is the stream itself)."""
    writers: set[str] = set()
    for layer in graph.layers:
        if layer.kind != "add" or len(layer.inputs) < 2:
            continue
        for name in layer.inputs:
            source = graph.layer(name)
            while not is_dense(source) and not is_attention_unit(source) and len(source.inputs) == 1 \
                    and source.kind != "add":
                source = graph.layer(source.inputs[0])
            if is_dense(source) or is_attention_unit(source):
                writers.add(source.name)
    return writers


def neuron_masks(graph: LayerGraph, masked: set[str] | frozenset[str]) -> dict[str, NeuronMask]:
    """Every layer with a masked side (absent: the layer is whole), from the set of layers whose
    neurons are masked (see the module docstring)."""
    stream: dict[str, float] = {}  # masked share of a layer's output channels as its consumers see them
    masks: dict[str, NeuronMask] = {}
    transformer = any(is_attention_unit(graph.layer(name)) for name in masked)
    writers = stream_writers(graph) if transformer else set()
    for layer in graph.layers:
        inputs = [name for name in layer.inputs if name in stream]
        if not inputs:
            m_in = 0.0
        elif len(inputs) == 1:
            m_in = stream[inputs[0]]
        elif layer.kind == "concat":
            sizes = [channels(graph.layer(name).output_shape) or 1 for name in inputs]
            m_in = sum(stream[name] * size for name, size in zip(inputs, sizes, strict=True)) / sum(sizes)
        else:
            m_in = min(stream[name] for name in inputs)
        dense = is_dense(layer)
        if layer.kind in BLOCK_KINDS:
            mask, stream[layer.name] = NeuronMask(0.0, 1.0 if layer.name in masked else 0.0, False), m_in
        elif transformer and layer.name in masked and is_attention_unit(layer):
            whole = min(1.0, layer.saved_input_bytes / layer.saved_bytes) if layer.saved_bytes else 0.0
            mask, stream[layer.name] = NeuronMask(0.0, 1.0, False, whole), m_in
        elif transformer and layer.name in masked and dense and layer.name in writers:
            mask, stream[layer.name] = NeuronMask(m_in, 0.0, True), 0.0
        elif layer.name in masked and (dense or not transformer):
            mask = NeuronMask(m_in if dense else 0.0, 1.0, dense)
            stream[layer.name] = 1.0
        elif dense:
            mask, stream[layer.name] = NeuronMask(m_in, 0.0, True), 0.0
        else:
            mask, stream[layer.name] = NeuronMask(0.0, m_in, False), m_in
        if mask.masked_in or mask.masked_out:
            masks[layer.name] = mask
    return masks
