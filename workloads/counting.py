"""Parameter counts and the closed-form FLOP formulas of the literature.

Counts are per op (attention projections, MLP matrices, norms, embeddings), so GQA,
SwiGLU, untied embeddings and MoE are handled; for the GPT shapes of Narayanan 2021 the
total agrees with their P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) (they omit the final
norm, 2h parameters).
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
    norms: int              # layer norms; replicated across tp

    @property
    def total(self) -> int:
        return self.attention + self.mlp_dense + self.mlp_experts + self.router + self.norms


def _norm_params(model: TransformerSpec) -> int:
    return 2 * model.hidden_size if model.norm == "layernorm" else model.hidden_size


def _ffn_matrix_params(model: TransformerSpec, ffn: int) -> int:
    h = model.hidden_size
    mats = 3 if model.gated_mlp else 2
    bias = (ffn * (2 if model.gated_mlp else 1) + h) if model.linear_bias else 0
    return mats * h * ffn + bias


def is_moe_layer(model: TransformerSpec, layer_index: int) -> bool:
    """Whether layer ``layer_index`` (0-based) has a MoE feed-forward block."""
    return model.moe is not None and (layer_index + 1) % model.moe.moe_layer_frequency == 0


def layer_params(model: TransformerSpec, moe_layer: bool | None = None) -> LayerParams:
    """Parameters of one layer; ``moe_layer`` defaults to whether the model has experts."""
    h, kv_dim = model.hidden_size, model.kv_heads * model.head_dim
    attn = h * (h + 2 * kv_dim) + h * h
    if model.linear_bias:
        attn += (h + 2 * kv_dim) + h
    moe_layer = model.is_moe if moe_layer is None else moe_layer
    if moe_layer and model.moe is not None:
        expert_ffn = model.moe.expert_ffn_hidden_size or model.ffn_size
        experts = model.moe.num_experts * _ffn_matrix_params(model, expert_ffn)
        dense = model.moe.num_shared_experts * _ffn_matrix_params(model, expert_ffn)
        router = h * model.moe.num_experts
    else:
        experts, router = 0, 0
        dense = _ffn_matrix_params(model, model.ffn_size)
    return LayerParams(attn, dense, experts, router, 2 * _norm_params(model))


def embedding_params(model: TransformerSpec) -> int:
    """Token embedding plus learned positions (if any)."""
    positions = model.seq_length * model.hidden_size if model.position_embedding == "learned" else 0
    return model.vocab_size * model.hidden_size + positions


def output_head_params(model: TransformerSpec) -> int:
    """Final norm plus the LM head when it is not tied to the embedding."""
    head = 0 if model.tied_embeddings else model.vocab_size * model.hidden_size
    return _norm_params(model) + head


def total_params(model: TransformerSpec) -> int:
    layers = sum(layer_params(model, is_moe_layer(model, i)).total for i in range(model.num_layers))
    return layers + embedding_params(model) + output_head_params(model)


def active_params(model: TransformerSpec) -> int:
    """Parameters touched per token (MoE: top-k routed experts plus shared)."""
    if model.moe is None:
        return total_params(model)
    total = embedding_params(model) + output_head_params(model)
    expert_ffn = model.moe.expert_ffn_hidden_size or model.ffn_size
    for i in range(model.num_layers):
        lp = layer_params(model, is_moe_layer(model, i))
        if is_moe_layer(model, i):
            total += lp.attention + lp.norms + lp.router + lp.mlp_dense
            total += model.moe.top_k * _ffn_matrix_params(model, expert_ffn)
        else:
            total += lp.total
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
