"""Parameter counts and the closed-form FLOP formulas of the literature.

Counts are per op (attention projections, MLP matrices, norms, embeddings), so GQA, MLA,
SwiGLU, untied embeddings and MoE are handled; for the GPT shapes of Narayanan 2021 the
total agrees with their P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) (they omit the final
norm, 2h parameters). Models whose layers differ (MoE every k-th layer, dense first layers)
are summed per layer kind (:func:`layer_kind_counts`): at most two kinds, dense and MoE.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _norm_params(model: TransformerSpec) -> int:
    return 2 * model.hidden_size if model.norm == "layernorm" else model.hidden_size


def _ffn_matrix_params(model: TransformerSpec, ffn: int) -> int:
    h = model.hidden_size
    mats = 3 if model.gated_mlp else 2
    bias = (ffn * (2 if model.gated_mlp else 1) + h) if model.linear_bias else 0
    return mats * h * ffn + bias


def is_moe_layer(model: TransformerSpec, layer_index: int) -> bool:
    """Whether layer ``layer_index`` (0-based) has a MoE feed-forward block
    (see :meth:`TransformerSpec.is_moe_layer`)."""
    return model.is_moe_layer(layer_index)


def layer_kinds(model: TransformerSpec) -> tuple[bool, ...]:
    """The kind of every layer, in order: True for a MoE layer, False for a dense one."""
    return tuple(model.is_moe_layer(i) for i in range(model.num_layers))


def layer_kind_runs(kinds: tuple[bool, ...], start: int, count: int) -> tuple[tuple[bool, int], ...]:
    """Layers ``start .. start+count-1`` as runs of equal kind, in order: ((kind, n), ...).
    A dense-only (or every-layer MoE) chunk of n layers is ((kind, n),)."""
    runs: list[tuple[bool, int]] = []
    for kind in kinds[start:start + count]:
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + 1)
        else:
            runs.append((kind, 1))
    return tuple(runs)


def layer_kind_counts(model: TransformerSpec) -> dict[bool, int]:
    """How many layers of each kind (False dense, True MoE); kinds absent are left out."""
    counts: dict[bool, int] = {}
    for kind in layer_kinds(model):
        counts[kind] = counts.get(kind, 0) + 1
    return counts


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
    moe_layer = model.is_moe if moe_layer is None else moe_layer
    if moe_layer and model.moe is not None:
        expert_ffn = model.moe.expert_ffn_hidden_size or model.ffn_size
        experts = model.moe.num_experts * _ffn_matrix_params(model, expert_ffn)
        dense = model.moe.num_shared_experts * _ffn_matrix_params(model, expert_ffn)
        router = h * model.moe.num_experts
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
