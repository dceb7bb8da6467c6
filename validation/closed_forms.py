"""Closed-form parameter counts and FLOP formulas of the literature: test oracles, not the runtime.

A model's parameters, FLOPs and activation bytes are read from its layer graph
(workloads/layer_graph.py; a transformer's from workloads/transformer_graph.py, summed by
workloads/counting.py). The formulas here state the same counts a second way, per op (attention
projections, MLP matrices, norms, embeddings: GQA, MLA, SwiGLU, untied embeddings and MoE), and the
papers' closed forms: Narayanan 2021's P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) (they omit the
final norm, 2h parameters) and Korthikanti 2022 / Narayanan 2021's FLOPs per step. Tests and the
published cases check the graph against them; nothing under simulator/ or workloads/ imports this
module (tests/test_counting_from_graph.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.layer_kinds import layer_kind_counts
from workloads.schema import TransformerSpec


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer, split by where they live under tensor parallelism."""

    attention: int          # QKV + output projection (+ biases); split by tp
    mlp_dense: int          # dense FFN matrices (+ biases); split by tp
    mlp_experts: int        # routed experts of a MoE layer (all experts); split by ep (and tp)
    router: int             # MoE gate; replicated
    norms: int              # layer norms (and per-head q/k norms); replicated across tp
    attention_replicated: int = 0  # MLA down-projections W_DQ, W_DKV and their latent norms; replicated

    @property
    def total(self) -> int:
        return self.attention + self.mlp_dense + self.mlp_experts + self.router + self.norms + self.attention_replicated


def mla_attention_params(model: TransformerSpec) -> tuple[int, int]:
    """(tensor-parallel, replicated) parameters of one MLA block (DeepSeek-V2 Sec. 2.1):
    split by tp (per head): W_UQ q_lora x heads·(nope+rope) (or a full-rank W_Q h x
    heads·(nope+rope)), W_UK/W_UV kv_lora x heads·(nope+v), W_O heads·v x h; replicated
    (Megatron-LM's MLA keeps the down-projections whole on every TP rank): W_DQ h x q_lora
    and its RMSNorm (q_lora), W_DKV h x (kv_lora + rope) incl. the shared RoPE key, and the
    kv RMSNorm (kv_lora). LayerNorm instead of RMSNorm doubles the latent norms."""
    mla, h, heads = model.mla, model.hidden_size, model.num_attention_heads
    norm = 2 if model.norm == "layernorm" else 1
    q_in = mla.q_lora_rank or h
    split = q_in * heads * mla.qk_head_dim + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    split += heads * mla.v_head_dim * h
    replicated = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + norm * mla.kv_lora_rank
    if mla.q_lora_rank:
        replicated += h * mla.q_lora_rank + norm * mla.q_lora_rank
    return split, replicated


def _norm_params(model: TransformerSpec) -> int:
    return 2 * model.hidden_size if model.norm == "layernorm" else model.hidden_size


def _ffn_matrix_params(model: TransformerSpec, ffn: int) -> int:
    h = model.hidden_size
    mats = 3 if model.gated_mlp else 2
    bias = (ffn * (2 if model.gated_mlp else 1) + h) if model.linear_bias else 0
    return mats * h * ffn + bias


def layer_params(model: TransformerSpec, moe_layer: bool | None = None) -> LayerParams:
    """Parameters of one layer; ``moe_layer`` defaults to whether the model has experts."""
    h, kv_dim = model.hidden_size, model.kv_heads * model.head_dim
    attn_replicated = 0
    if model.mla is not None:
        attn, attn_replicated = mla_attention_params(model)
    else:
        q_dim = model.attention_width
        attn = h * (q_dim + 2 * kv_dim) + q_dim * h
        if model.has_qkv_bias:
            attn += q_dim + 2 * kv_dim
        if model.linear_bias:
            attn += h
        if model.attention_sinks:  # one learned logit per head (GPT-OSS)
            attn += model.num_attention_heads
    moe_layer = model.is_moe if moe_layer is None else moe_layer
    if moe_layer and model.moe is not None:
        expert_ffn = model.moe.expert_ffn_hidden_size or model.ffn_size
        experts = model.moe.num_experts * _ffn_matrix_params(model, expert_ffn)
        dense = model.moe.num_shared_experts * _ffn_matrix_params(model, expert_ffn)
        router = (h + model.moe.router_bias) * model.moe.num_experts
    else:
        experts, router = 0, 0
        dense = _ffn_matrix_params(model, model.ffn_size)
    norms = 2 * _norm_params(model) + model.qk_norm_params
    return LayerParams(attn, dense, experts, router, norms, attn_replicated)


def embedding_params(model: TransformerSpec) -> int:
    """Token embedding plus learned positions (if any)."""
    positions = model.seq_length * model.hidden_size if model.position_embedding == "learned" else 0
    return model.vocab_size * model.hidden_size + positions


def output_head_params(model: TransformerSpec) -> int:
    """Final norm plus the LM head when it is not tied to the embedding."""
    head = 0 if model.tied_embeddings else model.vocab_size * model.hidden_size
    return _norm_params(model) + head


def total_params(model: TransformerSpec) -> int:
    """All parameters: each layer kind's count x its parameters, plus embedding and head."""
    layers = sum(n * layer_params(model, kind).total for kind, n in layer_kind_counts(model).items())
    return layers + embedding_params(model) + output_head_params(model)


def active_params(model: TransformerSpec) -> int:
    """Parameters touched per token ("activated parameters" of DeepSeek-V3): everything but
    the routed experts a token is not sent to, i.e. a MoE layer counts its top-k routed
    experts plus the shared ones. Embedding and LM head are included."""
    if model.moe is None:
        return total_params(model)
    total = embedding_params(model) + output_head_params(model)
    expert_ffn = model.moe.expert_ffn_hidden_size or model.ffn_size
    for kind, n in layer_kind_counts(model).items():
        lp = layer_params(model, kind)
        if kind:
            active = lp.total - lp.mlp_experts + model.moe.top_k * _ffn_matrix_params(model, expert_ffn)
        else:
            active = lp.total
        total += n * active
    return total


@dataclass(frozen=True)
class RankParams:
    """What one tensor/expert-parallel rank holds of a transformer, split the Megatron way."""

    embedding: float          # word table ÷tp (vocab-parallel) + learned positions (replicated)
    block: dict[bool, tuple[float, float]]   # one block of each kind (False dense, True MoE): (all, routed experts)
    head: float               # final norm + the untied LM head ÷tp
    tied_copy: float          # the word table a last pipeline stage copies for a tied head (0 untied)


def params_per_rank(model: TransformerSpec, tp: int = 1, ep: int = 1, etp: int = 1) -> RankParams:
    """A rank's parameters by the Megatron-LM split (Shoeybi et al. 2019; Megatron-Core MoE): Q/O and
    FFN matrices ÷tp, K/V per KV head (one per rank, replicated, when tp > kv heads), column-parallel
    biases ÷tp, row-parallel biases and norms replicated, MLA down-projections and their norms
    replicated, routed experts ÷ep with each one's FFN ÷etp, shared experts ÷tp, router (and its bias)
    replicated, attention sinks ÷tp with their heads;
    the word embedding and the untied head ÷tp over the vocabulary Megatron pads to a multiple of
    ``make_vocab_size_divisible_by`` x tp (``_vocab_size_with_padding``), learned positions
    replicated. The simulator's runtime
    states these only as its ops' weight shapes (workloads/graph.py); this is the oracle."""
    h, d = model.hidden_size, model.head_dim
    g_rank = model.kv_heads // tp if model.kv_heads % tp == 0 else 1

    def ffn(width: int, split: int) -> float:
        mats = 3 if model.gated_mlp else 2
        bias = width * (2 if model.gated_mlp else 1) if model.linear_bias else 0
        return (mats * h * width + bias) / split + (h if model.linear_bias else 0)

    if model.mla is not None:
        split, replicated = mla_attention_params(model)
        attn = split / tp + replicated
    else:
        width = model.attention_width
        attn = 2 * h * width / tp + 2 * h * d * g_rank
        if model.has_qkv_bias:
            attn += width / tp + 2 * d * g_rank
        if model.linear_bias:
            attn += h
        if model.attention_sinks:  # one per head: ÷tp with the heads
            attn += model.num_attention_heads / tp
    norms = 2 * _norm_params(model) + model.qk_norm_params
    block = {False: (attn + ffn(model.ffn_size, tp) + norms, 0.0)}
    if model.moe is not None:
        expert_ffn = model.moe.expert_ffn_hidden_size or model.ffn_size
        experts = model.moe.num_experts / ep * ffn(expert_ffn, etp)
        shared = model.moe.num_shared_experts * ffn(expert_ffn, tp)
        router = (h + model.moe.router_bias) * model.moe.num_experts
        block[True] = (attn + shared + router + norms + experts, experts)
    word = model.padded_vocab_size(tp) * h / tp
    positions = model.seq_length * h if model.position_embedding == "learned" else 0
    head = _norm_params(model) + (0 if model.tied_embeddings else word)
    return RankParams(word + positions, block, head, word if model.tied_embeddings else 0.0)


def narayanan_params(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Narayanan et al. 2021 Sec. 5.1: P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))."""
    return 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (vocab + seq) / (12 * layers * hidden))


def korthikanti_model_flops(batch: int, layers: int, seq: int, hidden: int, vocab: int) -> float:
    """Model FLOPs per step, Korthikanti et al. 2022 Eq. 7: 72·B·L·s·h²·(1 + s/(6h) + V/(12·h·L))."""
    return 72 * batch * layers * seq * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers))


def korthikanti_hardware_flops_selective(batch: int, layers: int, seq: int, hidden: int, vocab: int) -> float:
    """Hardware FLOPs with selective recompute, Korthikanti Eq. 8: 72·B·L·s·h²·(1 + s/(3h) + V/(12·h·L))."""
    return 72 * batch * layers * seq * hidden**2 * (1 + seq / (3 * hidden) + vocab / (12 * hidden * layers))


def narayanan_flops_with_recompute(batch: int, layers: int, seq: int, hidden: int, vocab: int) -> float:
    """FLOPs per step counting the full-recompute forward, Narayanan et al. 2021 Eq. 3:
    96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def forward_flops_per_sequence(model: TransformerSpec, seq: int, tp: int = 1) -> float:
    """Forward FLOPs of one sequence of ``seq`` tokens, 2 per multiply-add (no MLA): 2·s x each
    GEMM's weights — QKV h·(a·d + 2·g·d), the output projection a·d·h, a dense FFN's matrices, a MoE
    layer's router h·E, its top-k routed experts (k·s tokens spread evenly, no capacity padding) and
    shared experts — plus the attention core 4·s²·a·d (QK^T and AV over the full square, Korthikanti
    2022's count) in every layer, and the LM head 2·s·V·h (tied or not) over the vocabulary padded as
    a run at tensor parallelism ``tp`` pads it (Megatron-LM counts ``args.padded_vocab_size``)."""
    if model.mla is not None:
        raise NotImplementedError("the MLA layer's FLOPs are checked by hand in tests/test_deepseek_v3.py")
    h, width, kv_width = model.hidden_size, model.attention_width, model.kv_heads * model.head_dim
    mats = 3 if model.gated_mlp else 2
    attention = 2 * seq * (h * (width + 2 * kv_width) + width * h) + 4 * seq * seq * width
    total = 0.0
    for kind, n in layer_kind_counts(model).items():
        if kind:
            moe = model.moe
            ffn_e = moe.expert_ffn_hidden_size or model.ffn_size
            ffn = 2 * seq * h * moe.num_experts + 2 * seq * (moe.top_k + moe.num_shared_experts) * mats * h * ffn_e
        else:
            ffn = 2 * seq * mats * h * model.ffn_size
        total += n * (attention + ffn)
    return total + 2 * seq * model.padded_vocab_size(tp) * h
