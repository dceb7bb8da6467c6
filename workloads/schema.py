"""Model schemas: a decoder-only transformer (GPT, Llama, Mixtral shapes).

Covers multi-head and grouped-query attention (``num_kv_heads``), plain and gated (SwiGLU)
MLPs, learned or rotary positions, tied or untied embeddings, and mixture-of-experts
feed-forward blocks (described here; the simulator marks MoE models not-yet-simulated
until expert parallelism lands).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MoESpec(BaseModel):
    """Mixture-of-experts feed-forward: ``num_experts`` routed experts, ``top_k`` per token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    num_shared_experts: int = Field(default=0, ge=0)
    expert_ffn_hidden_size: int | None = Field(default=None, gt=0, description="default: ffn_hidden_size")
    capacity_factor: float | None = Field(default=None, gt=0)
    moe_layer_frequency: int = Field(default=1, gt=0, description="every k-th layer is MoE")

    @model_validator(mode="after")
    def _k_le_experts(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError("top_k must not exceed num_experts")
        return self


class TransformerSpec(BaseModel):
    """A decoder-only transformer language model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(default=None, gt=0, description="GQA; default = attention heads")
    ffn_hidden_size: int | None = Field(default=None, gt=0, description="default: 4 x hidden")
    gated_mlp: bool = Field(default=False, description="SwiGLU-style: three FFN matrices")
    vocab_size: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    tied_embeddings: bool = False
    position_embedding: Literal["learned", "rope", "alibi", "none"] = "learned"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    linear_bias: bool = True
    moe: MoESpec | None = None
    source: str = "user"
    notes: str | None = None

    @model_validator(mode="after")
    def _shape_consistent(self) -> TransformerSpec:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError("num_attention_heads must be divisible by num_kv_heads")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def is_moe(self) -> bool:
        return self.moe is not None
