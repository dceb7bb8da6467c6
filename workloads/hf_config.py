"""Build a :class:`TransformerSpec` from a Hugging Face ``config.json`` mapping.

Understands the keys of Llama/Mistral/Mixtral (``hidden_size``, ``num_hidden_layers``,
``num_key_value_heads``, ``intermediate_size``, ``num_local_experts``), GPT-2
(``n_embd``, ``n_layer``, ``n_head``, ``n_inner``, ``n_positions``) and DeepSeek-V2/V3
(``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``, and the MLA keys
``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``).
The multi-token-prediction layers of DeepSeek-V3 (``num_nextn_predict_layers``) are not imported.

A key absent from the file takes the default of that architecture's ``transformers`` config
class (``_ARCH_DEFAULTS``, read from transformers' ``GemmaConfig``, ``Qwen2Config``, ...), and
what the modelling code hard-wires is added (Qwen2's biases on q, k and v only:
``Qwen2Attention``). ``tests/test_hf_config.py`` checks the parameter counts against
``transformers`` itself (a model built on the meta device) when it is installed. A
``model_type`` whose layers this schema cannot describe (encoder-decoders, vision models, Gemma 2's
extra norms and soft-capping, ...) is refused by name, never simulated as some other model. A
``bert`` config becomes the BERT encoder network (workloads/hf_bert.py).

Dropout (``model.dropout``: the 1-byte masks kept for the backward pass) comes from the file's
dropout probabilities (:data:`DROPOUT_KEYS`): on when any is above 0. Llama, Mistral, Mixtral, Qwen2/3,
Gemma and DeepSeek-V2/V3 configs have only ``attention_dropout`` (0.0 in their released configs and
their config classes' default; the modelling code has no hidden dropout), so they import without
masks; GPT-2's ``resid_pdrop``/``embd_pdrop``/``attn_pdrop`` default to 0.1 (``GPT2Config``).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from simulator.errors import ConfigError, from_pydantic
from workloads.schema import TransformerSpec

_GATED_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "deepseek_v2", "deepseek_v3"}
SUPPORTED_TYPES = ("deepseek_v2", "deepseek_v3", "gemma", "gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen3",
                   "qwen3_moe")
"""Decoder-only language models whose every weight the schema counts (checked against transformers)."""

_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    # transformers.GemmaConfig: head_dim=256, tie_word_embeddings=True (Gemma-7B: hidden 3072, 16 heads)
    "gemma": {"head_dim": 256, "tie_word_embeddings": True, "attention_bias": False},
    # transformers.Qwen2Config: tie_word_embeddings=False; Qwen2Attention: q/k/v with bias, o without
    "qwen2": {"tie_word_embeddings": False, "_qkv_bias": True},
    # transformers.Qwen3Config: head_dim=128, untied, no biases; Qwen3Attention: RMSNorm over each head's
    # q and k (q_norm, k_norm of head_dim); Qwen3MoeConfig the same attention (its head_dim given per model)
    "qwen3": {"head_dim": 128, "tie_word_embeddings": False, "attention_bias": False, "_qk_norm": True},
    "qwen3_moe": {"tie_word_embeddings": False, "attention_bias": False, "_qk_norm": True},
    "llama": {"tie_word_embeddings": False, "attention_bias": False},
    "mistral": {"tie_word_embeddings": False},
    "mixtral": {"tie_word_embeddings": False},
    # transformers.GPT2Config: resid_pdrop = embd_pdrop = attn_pdrop = 0.1 (the others' attention_dropout: 0.0)
    "gpt2": {"tie_word_embeddings": True, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
    "deepseek_v2": {"tie_word_embeddings": False},
    "deepseek_v3": {"tie_word_embeddings": False},
}

#: Dropout probabilities of the language-model path (GPT-2's ``summary_first_dropout`` belongs to the
#: sequence-classification head and is not read).
DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")


def _pick(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _has_dropout(config: dict[str, Any], field: str) -> bool:
    """Whether any of :data:`DROPOUT_KEYS` is a probability above 0 (a non-number is a ConfigError)."""
    on = False
    for key in DROPOUT_KEYS:
        value = config.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise ConfigError(f"{field}.{key}", f"expected a dropout probability in [0, 1], got {value!r}")
        on = on or value > 0.0
    return on


def spec_from_hf_config(config: dict[str, Any], name: str = "hf-model", field: str = "model") -> Any:
    """Map an HF config onto the schema; a missing required key is a ConfigError naming it."""
    if not isinstance(config, dict):
        raise ConfigError(field, "config.json must hold a JSON object")
    model_type = str(config.get("model_type", "")).lower()
    if model_type == "bert":  # the encoder network (workloads/networks/bert.py)
        from workloads.hf_bert import bert_from_hf_config

        return bert_from_hf_config(config, name, field)
    if model_type not in SUPPORTED_TYPES:
        what = f"model_type {model_type!r}" if model_type else "a config.json without model_type"
        raise ConfigError(f"{field}.model_type", f"{what} cannot be represented (decoder-only language models "
                                                 f"{', '.join(SUPPORTED_TYPES)}, and the bert encoder)")
    config = {**_ARCH_DEFAULTS.get(model_type, {}), **{k: v for k, v in config.items() if v is not None}}
    hidden = _pick(config, "hidden_size", "n_embd", "d_model")
    layers = _pick(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _pick(config, "num_attention_heads", "n_head")
    vocab = _pick(config, "vocab_size")
    for key, value in (("hidden_size", hidden), ("num_hidden_layers", layers),
                       ("num_attention_heads", heads), ("vocab_size", vocab)):
        if value is None:
            raise ConfigError(f"{field}.{key}", "required key missing from config.json")
    gated = model_type in _GATED_TYPES
    seq_key = next((k for k in ("max_position_embeddings", "n_positions", "n_ctx") if config.get(k)), None)
    if seq_key is None:
        raise ConfigError(f"{field}.max_position_embeddings", "required key missing from config.json (the "
                                                              "sequence length; or set training.seq_length)")
    seq_length = config[seq_key]
    data: dict[str, Any] = {
        "name": config.get("_name_or_path") or name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": _pick(config, "num_key_value_heads"),
        "ffn_hidden_size": _pick(config, "intermediate_size", "n_inner"),
        "gated_mlp": bool(gated),
        "vocab_size": vocab,
        "seq_length": seq_length,
        "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
        "position_embedding": "rope" if gated or "rope_theta" in config else "learned",
        "norm": "rmsnorm" if "rms_norm_eps" in config else "layernorm",
        "linear_bias": bool(config.get("attention_bias", not gated)),
        "dropout": _has_dropout(config, field),
        "source": "Hugging Face config.json",
        "notes": f"sequence length {seq_length} from config.json's {seq_key}",
    }
    if config.get("_qk_norm"):
        data["qk_norm"] = True
    if config.get("_qkv_bias") and not data["linear_bias"]:
        data["qkv_bias"] = True
    head_dim = config.get("head_dim")
    if head_dim is not None and not config.get("kv_lora_rank") and head_dim * heads != hidden:
        data["attention_head_dim"] = head_dim
    experts = _pick(config, "num_local_experts", "num_experts", "n_routed_experts")
    if experts:
        data["moe"] = {
            "num_experts": experts,
            "top_k": _pick(config, "num_experts_per_tok", default=2),
            "expert_ffn_hidden_size": _pick(config, "moe_intermediate_size"),
            "num_shared_experts": _pick(config, "n_shared_experts", default=0),
            "first_dense_layers": _pick(config, "first_k_dense_replace", default=0),
        }
        if _pick(config, "decoder_sparse_step", default=1) != 1:
            raise ConfigError(f"{field}.decoder_sparse_step", "only 1 is imported (every layer MoE)")
        if config.get("mlp_only_layers"):
            raise ConfigError(f"{field}.mlp_only_layers", "dense layers among MoE layers are only imported as "
                                                          "the first ones (first_k_dense_replace)")
        if _pick(config, "moe_layer_freq", default=1) != 1:
            # HF DeepSeek: MoE where i % freq == 0; this schema: (i + 1) % freq == 0.
            raise ConfigError(f"{field}.moe_layer_freq", "only 1 is imported (the layer numbering differs)")
    if config.get("kv_lora_rank"):
        data["mla"] = {key: config.get(key) for key in
                       ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
        data["num_kv_heads"] = None  # every MLA head has its own keys and values
    try:
        return TransformerSpec.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, field) from None
