"""Build a :class:`TransformerSpec` from a Hugging Face ``config.json`` mapping.

Understands the keys of Llama/Mistral/Mixtral (``hidden_size``, ``num_hidden_layers``,
``num_key_value_heads``, ``intermediate_size``, ``num_local_experts``), GPT-2
(``n_embd``, ``n_layer``, ``n_head``, ``n_inner``, ``n_positions``) and DeepSeek-V2/V3
(``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``, and the MLA keys
``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``) and
GPT-OSS (``gpt_oss``: biases on q/k/v/o and the experts, a router bias, a learned attention sink per head,
the experts' GLU inputs clamped at ``swiglu_limit``: ``moe.activation_clamp``).
The multi-token-prediction layers of DeepSeek-V3 (``num_nextn_predict_layers``) are not imported.

Sliding-window attention (:func:`window_layout`) is read as transformers builds its masks: the window
``sliding_window`` and, per layer, ``layer_types`` ("sliding_attention" / "full_attention") where the file
has it, else the list each config class derives -- GPT-OSS every even 0-based layer windowed
(``GptOssConfig``), Mistral and Mixtral every layer when ``sliding_window`` is set (their modelling code
builds one sliding mask for all layers; MistralConfig's default window 4096, MixtralConfig's none),
Qwen2/Qwen3 only with ``use_sliding_window`` and from layer ``max_window_layers`` on, Qwen3-MoE every layer
with ``use_sliding_window``. The windowed layers become ``sliding_window_tokens`` and ``window_every``
(the schema's layout: every layer, or all but each p-th); a list no such p describes is refused naming
the key it came from. Llama, Gemma, GPT-2 and DeepSeek have no sliding window in transformers: a
``sliding_window`` key there is ignored as transformers ignores it.

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

_GATED_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "deepseek_v2", "deepseek_v3",
                "gpt_oss"}
SUPPORTED_TYPES = ("deepseek_v2", "deepseek_v3", "gemma", "gpt2", "gpt_oss", "llama", "mistral", "mixtral", "qwen2",
                   "qwen3", "qwen3_moe")
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
    # transformers.GptOssConfig (5.x; 4.56.2 the same defaults): head_dim 64, untied, attention_bias true,
    # sliding_window 128, 128 experts top-4, rms_norm_eps 1e-5; modeling_gpt_oss.py hard-wires the rest:
    # GptOssAttention.sinks (one logit per head), GptOssTopKRouter's bias, GptOssExperts' gate_up / down biases
    # (attention_bias covers q/k/v/o only in the config; the experts always carry theirs)
    "gpt_oss": {"tie_word_embeddings": False, "attention_bias": True, "head_dim": 64, "sliding_window": 128,
                "num_local_experts": 128, "num_experts_per_tok": 4, "rms_norm_eps": 1e-5, "swiglu_limit": 7.0,
                "_attention_sinks": True, "_router_bias": True},
}

#: Sliding window of a key absent from the file, by model_type (the config class's default): MistralConfig
#: ``sliding_window = 4096``; MixtralConfig None; GptOssConfig 128 (in ``_ARCH_DEFAULTS``); Qwen2/Qwen3/Qwen3-MoE
#: 4096 but only with ``use_sliding_window``.
_WINDOW_DEFAULT = {"mistral": 4096, "qwen2": 4096, "qwen3": 4096, "qwen3_moe": 4096}
_WINDOW_TYPES = ("gpt_oss", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe")
LAYER_TYPES = ("sliding_attention", "full_attention")

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


def _derived_layer_types(raw: dict[str, Any], model_type: str, layers: int, window: int | None) -> list[str]:
    """The per-layer list each transformers config class builds when the file has no ``layer_types``."""
    if window is None:
        return ["full_attention"] * layers
    if model_type == "gpt_oss":  # GptOssConfig.__post_init__
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if model_type in ("qwen2", "qwen3"):  # Qwen2Config / Qwen3Config.__post_init__
        first = raw.get("max_window_layers", 28)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    return ["sliding_attention"] * layers  # Mistral, Mixtral, Qwen3-MoE: one sliding mask for every layer


def window_layout(raw: dict[str, Any], model_type: str, layers: int, field: str) -> tuple[int | None, int]:
    """``(sliding_window_tokens, window_every)`` of a config (module docstring), or a ConfigError naming the
    key whose pattern the schema cannot hold."""
    if model_type not in _WINDOW_TYPES:
        return None, 1
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and not raw.get("use_sliding_window", False):
        window = None  # Qwen2Config: sliding_window = sliding_window if use_sliding_window else None
    elif "sliding_window" in raw:
        window = raw["sliding_window"]
    else:
        window = _WINDOW_DEFAULT.get(model_type, _ARCH_DEFAULTS.get(model_type, {}).get("sliding_window"))
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise ConfigError(f"{field}.sliding_window", f"expected a positive number of tokens or null, got {window!r}")
    types = raw.get("layer_types")
    source = "layer_types"
    if types is None:
        types = _derived_layer_types(raw, model_type, layers, window)
        source = "max_window_layers" if model_type in ("qwen2", "qwen3") else "layer_types"
    elif not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise ConfigError(f"{field}.layer_types", f"expected a list of {layers} entries, each one of "
                                                  f"{', '.join(LAYER_TYPES)}")
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if not windowed:
        return None, 1
    if window is None:
        raise ConfigError(f"{field}.layer_types", "names sliding_attention layers but sliding_window is null")
    if len(windowed) == layers:
        return window, 1
    for every in range(2, layers + 1):
        if windowed == [i for i in range(layers) if (i + 1) % every]:
            return window, every
    raise ConfigError(f"{field}.{source}", f"windowed layers {windowed} cannot be represented: "
                                           "sliding_window_tokens with window_every windows every layer, or all but "
                                           "each p-th (0-based layer i full when (i + 1) % p == 0)")


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
    raw = config
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
    if model_type == "gpt_oss" and not data["linear_bias"]:
        # GptOssExperts carry their biases whatever attention_bias says; the schema has one flag for both
        raise ConfigError(f"{field}.attention_bias", "false cannot be represented for gpt_oss: its experts keep "
                                                      "their biases (linear_bias covers attention and experts)")
    window, every = window_layout(raw, model_type, layers, field)
    if window is not None:
        data["sliding_window_tokens"] = window
        data["window_every"] = every
    if config.get("_attention_sinks"):
        data["attention_sinks"] = True
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
        if config.get("_router_bias"):
            data["moe"]["router_bias"] = True
        if model_type == "gpt_oss":  # GptOssExperts clamps its GLU inputs at swiglu_limit
            data["moe"]["activation_clamp"] = config.get("swiglu_limit", 7.0)
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
