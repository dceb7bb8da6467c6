"""Importing models from Hugging Face ``config.json`` files (fixtures in tests/data/hf/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from workloads.catalog import MODELS, resolve_model
from workloads.counting import active_params, total_params

HF = Path(__file__).parent / "data" / "hf"


def test_llama2_7b_config():
    spec = resolve_model(str(HF / "llama-2-7b.json"))
    assert spec.name == "meta-llama/Llama-2-7b-hf"
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.kv_heads) == (32, 4096, 32, 32)
    assert (spec.ffn_size, spec.vocab_size, spec.seq_length) == (11008, 32000, 4096)
    assert spec.gated_mlp and not spec.linear_bias and not spec.tied_embeddings
    assert (spec.norm, spec.position_embedding) == ("rmsnorm", "rope")
    assert total_params(spec) == 6_738_415_616  # the parameter count of meta-llama/Llama-2-7b-hf
    assert total_params(spec) == total_params(MODELS.get("llama2-7b"))


def test_gpt2_config():
    spec = resolve_model(str(HF / "gpt2.json"))
    assert spec.name
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (12, 768, 12)
    assert (spec.ffn_size, spec.vocab_size, spec.seq_length) == (3072, 50257, 1024)
    assert not spec.gated_mlp and spec.linear_bias and spec.tied_embeddings
    assert (spec.norm, spec.position_embedding) == ("layernorm", "learned")
    assert total_params(spec) == 124_439_808  # GPT-2 small, as counted by transformers


def test_mixtral_config():
    spec = resolve_model(str(HF / "mixtral-8x7b.json"))
    assert spec.name == "mistralai/Mixtral-8x7B-v0.1"
    assert spec.moe is not None and (spec.moe.num_experts, spec.moe.top_k) == (8, 2)
    assert (spec.kv_heads, spec.ffn_size, spec.seq_length) == (8, 14336, 32768)
    assert spec.gated_mlp and not spec.linear_bias
    assert total_params(spec) == 46_702_792_704  # Mixtral-8x7B-v0.1 safetensors total
    assert active_params(spec) / 1e9 == pytest.approx(12.9, rel=0.01)
    assert total_params(spec) == total_params(MODELS.get("mixtral-8x7b"))


def test_missing_hidden_size_is_named(tmp_path):
    config = json.loads((HF / "llama-2-7b.json").read_text())
    del config["hidden_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError) as exc:
        resolve_model(str(path), field="scenario.model")
    assert exc.value.field == "scenario.model.hidden_size"
    assert "hidden_size" in str(exc.value)


def test_invalid_json_is_config_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096, "num_hidden_layers": 32,')
    with pytest.raises(ConfigError) as exc:
        resolve_model(str(path))
    assert exc.value.field == "model" and "invalid JSON" in str(exc.value)


def test_json_not_an_object_is_config_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(ConfigError):
        resolve_model(str(path))


def test_missing_json_file_is_config_error(tmp_path):
    with pytest.raises(ConfigError) as exc:
        resolve_model(str(tmp_path / "absent" / "config.json"))
    assert "file not found" in str(exc.value)


def test_inconsistent_config_is_config_error(tmp_path):
    config = json.loads((HF / "llama-2-7b.json").read_text())
    config["num_attention_heads"] = 30  # 4096 is not divisible by 30
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError):
        resolve_model(str(path))
