"""Model schemas: a decoder-only transformer (GPT, Llama, Mixtral shapes).

Covers multi-head and grouped-query attention (``num_kv_heads``), multi-head latent
attention (``mla``, DeepSeek-V2/V3), causal sliding-window attention on every layer or on
alternating ones (``sliding_window_tokens``, ``window_every``: Mistral 7B, GPT-OSS) and learned
attention sinks (``attention_sinks``, GPT-OSS), plain and gated (SwiGLU) MLPs, learned or rotary
positions, tied or untied embeddings, and mixture-of-experts feed-forward blocks, on every
layer or on some (``moe_layer_frequency``, ``first_dense_layers``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.errors import no_bool_numbers


def padded_vocab(vocab_size: int, divisible_by: int, tp: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``divisible_by`` x tp, as Megatron-LM pads a vocabulary
    so each TP rank holds an equal slice (``_vocab_size_with_padding``; megatron-bridge 0.3.1
    ``utils/vocab_utils.py`` ``calculate_padded_vocab_size``: ``multiple = make_vocab_size_divisible_by *
    tensor_model_parallel_size; ceil(vocab_size / multiple) * multiple``)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


class MoESpec(BaseModel):
    """Mixture-of-experts feed-forward: ``num_experts`` routed experts, ``top_k`` per token."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)  # `num_layers: true` is an error, not 1

    num_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    num_shared_experts: int = Field(default=0, ge=0)
    expert_ffn_hidden_size: int | None = Field(default=None, gt=0, description="default: ffn_hidden_size")
    capacity_factor: float | None = Field(default=None, gt=0)
    router_bias: bool = Field(default=False, description="the router's linear layer adds a bias per expert "
                                                         "(GPT-OSS: HF GptOssTopKRouter's ``bias``)")
    activation_clamp: float | None = Field(
        default=None, gt=0, description="the experts' GLU inputs clamped to this limit before the activation: the "
                                        "gate half from above, the linear half on both sides (GPT-OSS: HF "
                                        "GptOssConfig ``swiglu_limit`` 7.0; Megatron-Core "
                                        "``activation_func_clamp_value``). No parameters or FLOPs; Megatron-Core "
                                        "runs the clamps as kernels of their own (workloads/graph.py)")
    moe_layer_frequency: int = Field(
        default=1, gt=0, description="every k-th layer is MoE: 0-based layer i when (i + 1) % k == 0")
    first_dense_layers: int = Field(
        default=0, ge=0,
        description="the first k layers keep a dense FFN of ffn_hidden_size (DeepSeek's first_k_dense_replace)")

    @model_validator(mode="after")
    def _k_le_experts(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError("top_k must not exceed num_experts")
        return self


class MLASpec(BaseModel):
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 Sec. 2.1; DeepSeek-V3,
    arXiv:2412.19437 Sec. 2.1.1). Queries and keys/values are projected through low-rank
    latents: c_Q = W_DQ·h (``q_lora_rank``; none: a full-rank W_Q as in DeepSeek-V2-Lite),
    c_KV = W_DKV·h (``kv_lora_rank``) plus a decoupled RoPE key k_R = W_KR·h shared by all
    heads (``qk_rope_head_dim``); per head q = [W_UQ·c_Q] of ``qk_nope_head_dim`` +
    ``qk_rope_head_dim``, k = [W_UK·c_KV, k_R], v = W_UV·c_KV of ``v_head_dim``; output W_O
    (heads·v_head_dim x hidden). RMSNorms on both latents. No biases."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)  # `num_layers: true` is an error, not 1

    q_lora_rank: int | None = Field(default=None, gt=0, description="query latent; none: full-rank W_Q")
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(ge=0)
    v_head_dim: int = Field(gt=0)

    @property
    def qk_head_dim(self) -> int:
        """Head size of the attention scores: non-positional plus RoPE part."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


#: Upper bounds on a transformer's sizes: each 20-1000x past any model trained (figures as of 2026), so
#: none refuses a real model; they catch a typo (extra zeros, bytes for a count) that would otherwise
#: make the simulator's per-layer and per-token work, or a run's simulated horizon, astronomically
#: large and never finish (10**6 layers: over a minute in per-layer loops; 10**30: for ever).
MODEL_SIZE_LIMITS: dict[str, tuple[int, str]] = {
    # 20x, not more: the simulator's per-layer work is linear in the layers, ~0.1-0.25 ms of Python per layer (subnetwork_dp
    # ~0.2 ms since the fifteenth session, ~2-3.6 ms before), so 10**5 layers took 10-15 s to run; 20,000 take ~4 CPU-s
    "num_layers": (20_000, "the deepest transformer trained has 1,000 layers (DeepNet, Wang et al. 2022)"),
    "hidden_size": (1_000_000, "the widest trained has 25,600 (PaLM 540B: 18,432; Megatron-1T: 25,600)"),
    "num_attention_heads": (100_000, "the most heads trained is 160 (Megatron-1T)"),
    "ffn_hidden_size": (10_000_000, "the widest FFN trained has ~100,000 (Megatron-1T: 102,400)"),
    "vocab_size": (10_000_000, "the largest vocabularies trained hold ~260,000 tokens (Gemma: 256,000)"),
    "seq_length": (100_000_000, "the longest context trained is 10 M tokens (Llama 4 Scout)"),
}


def model_size_bound(value, info):
    """Refuse a model size past :data:`MODEL_SIZE_LIMITS` with the bound and why (see there)."""
    limit, why = MODEL_SIZE_LIMITS[info.field_name]
    if isinstance(value, int) and value > limit:
        raise ValueError(f"{value:,} is past the limit of {limit:,} ({why}; a larger figure is likely a typo "
                         "and would make the simulation run for ever)")
    return value


class TransformerSpec(BaseModel):
    """A decoder-only transformer language model."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)  # `num_layers: true` is an error, not 1
    _size_bound = field_validator(*MODEL_SIZE_LIMITS)(model_size_bound)

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(default=None, gt=0, description="GQA; default = attention heads")
    ffn_hidden_size: int | None = Field(default=None, gt=0, description="default: 4 x hidden")
    gated_mlp: bool = Field(default=False, description="SwiGLU-style: three FFN matrices")
    vocab_size: int = Field(gt=0)
    make_vocab_size_divisible_by: int = Field(
        default=128, gt=0,
        description="the vocabulary the embedding table, the LM head and the logits hold is padded with dummy "
                    "rows to a multiple of this x tp, as Megatron-LM, Megatron-Core, NeMo and Megatron-DeepSpeed "
                    "do (--make-vocab-size-divisible-by, default 128; megatron-bridge utils/vocab_utils.py "
                    "calculate_padded_vocab_size: ceil(V / (128·tp))·128·tp, e.g. GPT-2's 50,257 is 50,304 at "
                    "tp 1 and 51,200 at tp 8). The padded rows cost memory and FLOPs (Megatron counts them in "
                    "its TFLOP/s); the model's own parameter count leaves them out and both are reported where "
                    "they differ. 1: pad only to a multiple of tp (frameworks that do not pad: llm-foundry, "
                    "torchtitan, whose busiest TP rank holds ceil(V/tp) rows)")
    seq_length: int = Field(gt=0)
    tied_embeddings: bool = False
    position_embedding: Literal["learned", "rope", "alibi", "none"] = "learned"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    linear_bias: bool = True
    attention_head_dim: int | None = Field(
        default=None, gt=0, validation_alias=AliasChoices("attention_head_dim", "head_dim"),
        description="width of one attention head when it is not hidden / heads (Gemma-7B: 256 with hidden 3072 "
                    "and 16 heads: q is 4096 wide; Mistral NeMo 12B: 128 with hidden 5120 and 32 heads; HF "
                    "``head_dim``, Megatron/NeMo ``kv_channels``; YAML key ``head_dim`` or "
                    "``attention_head_dim``); q is heads x head_dim, k and v kv_heads x head_dim, the output "
                    "projection heads x head_dim -> hidden; default hidden / heads")
    qk_norm: bool = Field(
        default=False, description="a norm (the model's ``norm``) over each head's q and k before attention "
                                   "(Qwen3, Megatron ``qk_layernorm``): two weight vectors of head_dim per "
                                   "layer, shared by the heads")
    qkv_bias: bool | None = Field(
        default=None, description="biases on the q, k and v projections only, none elsewhere (Qwen2); "
                                  "default: as linear_bias")
    dropout: bool = Field(
        default=True, description="dropout after the embedding, the attention projection and the MLP (and on "
                                  "the attention probabilities without FlashAttention), keeping a 1-byte mask "
                                  "per element for the backward (Korthikanti 2022 Sec. 4.1; GPT-2/3, Megatron "
                                  "GPT); false: probabilities 0, no masks (MPT: attn/resid/emb_pdrop 0; Llama, Mistral/"
                                  "Mixtral, Qwen, DeepSeek, Nemotron-4). Default true (Megatron-LM's --hidden-dropout and "
                                  "--attention-dropout 0.1); every catalog model states its own with the source, and a HF "
                                  "config.json import reads its dropout probabilities (workloads/hf_config.py)")
    sliding_window_tokens: int | None = Field(
        default=None, gt=0,
        description="causal sliding-window attention: a query attends to itself and the w - 1 tokens before it "
                    "(w keys at most; HF ``sliding_window``, whose mask keeps keys k > q - w: GPT-OSS 128, "
                    "Mistral 7B 4096) on the layers ``window_every`` picks; the others attend to the whole causal "
                    "prefix. None: every layer full (workloads/graph.py prices the windowed core)")
    window_every: int = Field(
        default=1, gt=0,
        description="which layers are windowed: 0-based layer i when (i + 1) % window_every != 0, every layer "
                    "when 1. 2: layers 0, 2, 4, ... windowed and 1, 3, 5, ... full, GPT-OSS's alternation "
                    "(HF GptOssConfig ``layer_types``: 'sliding_attention' if (i + 1) % 2 else 'full_attention'; "
                    "Megatron-Core ``window_attn_skip_freq = 2``: 1-based layer n full when n % 2 == 0)")
    attention_sinks: bool = Field(
        default=False,
        description="a learned logit per attention head added to every softmax denominator (GPT-OSS model card, "
                    "arXiv:2508.10925 Sec. 2; Megatron-Core ``softmax_type: learnable``): one parameter per head "
                    "per layer, one exp and add per query and head inside the fused kernel, which is negligible "
                    "beside the 4·d·keys FLOPs of the same query and head (1 in 32,768 for d 64 and 128 keys): "
                    "counted as parameters, not as FLOPs or time")
    moe: MoESpec | None = None
    mla: MLASpec | None = Field(default=None, description="multi-head latent attention instead of MHA/GQA")
    source: str = "user"
    notes: str | None = None

    @model_validator(mode="after")
    def _shape_consistent(self) -> TransformerSpec:
        if self.mla is None and self.attention_head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError("num_attention_heads must be divisible by num_kv_heads")
        if self.mla is not None:
            if self.num_kv_heads not in (None, self.num_attention_heads):
                raise ValueError("mla: every head has its own keys and values; leave num_kv_heads unset")
            if self.linear_bias:
                raise ValueError("mla: projections without biases only (set linear_bias: false)")
            if self.qk_norm:
                raise ValueError("mla: qk_norm is not modelled with latent attention; leave it false")
            if self.attention_head_dim is not None:
                raise ValueError("mla: head sizes come from mla (qk_nope/qk_rope/v_head_dim); leave head_dim unset")
        if self.sliding_window_tokens is None and self.window_every != 1:
            raise ValueError("window_every picks the windowed layers: set sliding_window_tokens too")
        if self.sliding_window_tokens is not None and self.mla is not None:
            raise ValueError("mla: sliding-window attention is not modelled with latent attention; leave "
                             "sliding_window_tokens unset")
        if self.moe is not None:
            if self.moe.first_dense_layers >= self.num_layers:
                raise ValueError("moe.first_dense_layers must be less than num_layers")
            if not any(self.is_moe_layer(i) for i in range(self.num_layers)):
                raise ValueError("moe: no layer is a MoE layer with this moe_layer_frequency")
        return self

    def is_moe_layer(self, layer_index: int) -> bool:
        """Whether 0-based layer ``layer_index`` has a MoE FFN: not one of the first
        ``first_dense_layers``, and (i + 1) % ``moe_layer_frequency`` == 0 (so with frequency 2
        layers 1, 3, 5, ... are MoE, as in GShard's every-other-layer placement)."""
        moe = self.moe
        return (moe is not None and layer_index >= moe.first_dense_layers
                and (layer_index + 1) % moe.moe_layer_frequency == 0)

    def is_window_layer(self, layer_index: int) -> bool:
        """Whether 0-based layer ``layer_index`` attends through the sliding window (``window_every``)."""
        return self.sliding_window_tokens is not None and (
            self.window_every == 1 or (layer_index + 1) % self.window_every != 0)

    def padded_vocab_size(self, tp: int = 1) -> int:
        """The vocabulary as held under tensor parallelism ``tp`` (:func:`padded_vocab`)."""
        return padded_vocab(self.vocab_size, self.make_vocab_size_divisible_by, tp)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_attention_heads

    @property
    def attention_width(self) -> int:
        """Width of the concatenated heads: q's output and the attention output projection's input."""
        return self.num_attention_heads * self.head_dim

    @property
    def qk_norm_params(self) -> int:
        """The q and k norms' weights of one layer (``qk_norm``): head_dim each, twice for LayerNorm."""
        if not self.qk_norm:
            return 0
        return 2 * self.head_dim * (2 if self.norm == "layernorm" else 1)

    @property
    def has_qkv_bias(self) -> bool:
        return self.linear_bias if self.qkv_bias is None else self.qkv_bias

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def sample(self) -> str:
        """What one sample of the global batch is: a sequence of ``seq_length`` tokens."""
        return "sequence"

    def layer_graph(self, shard):
        """The model as a :class:`~workloads.layer_graph.LayerGraph` (embedding -> blocks -> head)
        for one micro-batch on one rank after ``shard`` (workloads/transformer_graph.py)."""
        from workloads.transformer_graph import transformer_layer_graph  # the builder imports this module

        return transformer_layer_graph(self, shard)
