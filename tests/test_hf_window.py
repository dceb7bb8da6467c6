"""Sliding-window attention, attention sinks and GPT-OSS from Hugging Face configs (workloads/hf_config.py).

The fixture tests/data/hf/gpt-oss-120b.json holds openai/gpt-oss-120b's config keys as transformers'
``GptOssConfig`` defaults give them (no network here), without ``layer_types`` (the derivation path);
the transformers tests build configs with ``AutoConfig.for_model`` from a dict (no network) and count a
tiny GPT-OSS on the meta device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hf_models import transformers_or_skip

from simulator.errors import ConfigError
from workloads.catalog import resolve_model
from workloads.counting import active_params, total_params
from workloads.hf_config import spec_from_hf_config

ROOT = Path(__file__).resolve().parent.parent
HF = Path(__file__).parent / "data" / "hf"
GPT_OSS = json.loads((HF / "gpt-oss-120b.json").read_text())
TINY_OSS = {"model_type": "gpt_oss", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 96,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_local_experts": 8,
            "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 512, "sliding_window": 16}


def _layout(spec) -> tuple:
    """What attention each layer runs, and the attention / MoE shape the schema holds."""
    return (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.kv_heads, spec.head_dim,
            spec.sliding_window_tokens, spec.window_every, spec.attention_sinks, spec.linear_bias,
            spec.moe.num_experts, spec.moe.top_k, spec.moe.router_bias,
            spec.moe.expert_ffn_hidden_size or spec.ffn_size,
            tuple(spec.is_window_layer(i) for i in range(spec.num_layers)))


def test_gpt_oss_config_is_the_catalogs_attention_layout():
    spec = spec_from_hf_config(GPT_OSS, "gpt-oss-120b")
    catalog = resolve_model("gpt-oss-120b")
    assert _layout(spec) == _layout(catalog)
    assert [spec.is_window_layer(i) for i in range(4)] == [True, False, True, False]  # GptOssConfig layer_types
    assert spec.attention_sinks and spec.moe.router_bias and not spec.dropout
    assert total_params(spec) == total_params(catalog) == 116_829_156_672  # model card: 116.83B
    assert active_params(spec) == active_params(catalog)
    assert spec.seq_length == 131072 and catalog.seq_length == 4096  # max_position_embeddings vs pre-training


def test_absent_gpt_oss_keys_take_gpt_oss_config_defaults():
    config = {k: v for k, v in GPT_OSS.items()
              if k not in ("sliding_window", "head_dim", "attention_bias", "tie_word_embeddings")}
    assert _layout(spec_from_hf_config(config)) == _layout(resolve_model("gpt-oss-120b"))


def test_layer_types_from_the_file_are_read():
    # every layer windowed; a Gemma-3-like pattern (five windowed, one full) is window_every 6
    spec = spec_from_hf_config({**GPT_OSS, "layer_types": ["sliding_attention"] * 36})
    assert (spec.sliding_window_tokens, spec.window_every) == (128, 1)
    sixth = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(36)]
    spec = spec_from_hf_config({**GPT_OSS, "layer_types": sixth})
    assert spec.window_every == 6 and [spec.is_window_layer(i) for i in range(6)] == [True] * 5 + [False]
    spec = spec_from_hf_config({**GPT_OSS, "layer_types": ["full_attention"] * 36})
    assert spec.sliding_window_tokens is None


@pytest.mark.parametrize("change, field", [
    ({"layer_types": ["full_attention"] + ["sliding_attention"] * 35}, "model.layer_types"),  # first full only
    ({"layer_types": ["sliding_attention"] * 35}, "model.layer_types"),                        # wrong length
    ({"layer_types": ["chunked_attention"] * 36}, "model.layer_types"),
    ({"sliding_window": None, "layer_types": ["sliding_attention"] * 36}, "model.layer_types"),
    ({"sliding_window": -8}, "model.sliding_window"),
    ({"attention_bias": False}, "model.attention_bias"),  # the experts keep their biases
])
def test_an_unrepresentable_window_is_refused_by_name(change, field):
    with pytest.raises(ConfigError) as exc:
        spec_from_hf_config({**GPT_OSS, **change})
    assert exc.value.field == field, str(exc.value)


def _mistral(**change) -> dict:
    config = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, **change}
    return {k: v for k, v in config.items() if v != "absent"}


def test_mistral_windows_every_layer_as_its_modelling_code():
    spec = spec_from_hf_config(_mistral(sliding_window=4096))  # Mistral-7B-v0.1
    assert (spec.sliding_window_tokens, spec.window_every) == (4096, 1)
    assert spec_from_hf_config(_mistral(sliding_window="absent")).sliding_window_tokens == 4096  # MistralConfig
    assert spec_from_hf_config(_mistral(sliding_window=None)).sliding_window_tokens is None      # v0.2 / v0.3


def test_qwen_windows_only_with_use_sliding_window():
    qwen2 = json.loads((HF / "qwen2-7b.json").read_text())  # sliding_window 131072, use_sliding_window false
    assert spec_from_hf_config(qwen2).sliding_window_tokens is None
    every = spec_from_hf_config({**qwen2, "use_sliding_window": True, "max_window_layers": 0})
    assert (every.sliding_window_tokens, every.window_every) == (131072, 1)
    assert spec_from_hf_config({**qwen2, "use_sliding_window": True}).sliding_window_tokens is None  # 28 of 28 full
    with pytest.raises(ConfigError) as exc:  # Qwen2Config: layers 0..19 full, 20..27 windowed
        spec_from_hf_config({**qwen2, "use_sliding_window": True, "max_window_layers": 20})
    assert exc.value.field == "model.max_window_layers"
    moe = json.loads((HF / "qwen3-30b-a3b.json").read_text())
    assert spec_from_hf_config(moe).sliding_window_tokens is None
    assert spec_from_hf_config({**moe, "use_sliding_window": True, "sliding_window": 4096}).window_every == 1


def test_an_unrepresentable_window_exits_2_naming_the_key(tmp_path):
    qwen2 = {**json.loads((HF / "qwen2-7b.json").read_text()), "use_sliding_window": True, "max_window_layers": 20}
    (tmp_path / "config.json").write_text(json.dumps(qwen2))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"name: w\nmodel: {tmp_path / 'config.json'}\ncluster: {{node: dgx-a100-80g, num_gpus: 8}}\n"
                        "parallelism: {global_batch_size: 8, micro_batch_size: 1}\ntraining: {seq_length: 4096}\n")
    run = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(scenario)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "max_window_layers" in run.stderr and "Traceback" not in run.stderr


def test_transformers_gpt_oss_config_imports_as_the_catalog():
    transformers = transformers_or_skip()
    config = transformers.AutoConfig.for_model("gpt_oss").to_dict()  # openai/gpt-oss-120b's values, layer_types set
    assert config["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert _layout(spec_from_hf_config(config)) == _layout(resolve_model("gpt-oss-120b"))


def test_tiny_gpt_oss_counts_as_transformers():
    transformers = transformers_or_skip()
    torch = pytest.importorskip("torch")
    config = transformers.AutoConfig.for_model(**TINY_OSS)
    spec = spec_from_hf_config(config.to_dict())
    assert (spec.sliding_window_tokens, spec.window_every, spec.attention_sinks) == (16, 2, True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert total_params(spec) == sum(p.numel() for p in model.parameters())
