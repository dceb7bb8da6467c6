"""Importing models from Hugging Face ``config.json`` files (fixtures in tests/data/hf/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_models import transformers_or_none, transformers_or_skip

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


# Parameter counts as transformers counts them (a model built from the config on the meta device);
# Qwen2-7B's is 7,615,616,512 (its q/k/v biases included, untied embeddings).
PARAMETER_COUNTS = {
    "llama-3-8b": 8_030_261_248,
    "mixtral-8x7b": 46_702_792_704,
    "gpt2": 124_439_808,
    "gemma-7b": 8_537_680_896,
    "qwen2-7b": 7_615_616_512,
    "llama-2-7b": 6_738_415_616,
}


@pytest.mark.parametrize("name", sorted(PARAMETER_COUNTS))
def test_parameter_counts_of_hf_configs(name):
    assert total_params(resolve_model(str(HF / f"{name}.json"))) == PARAMETER_COUNTS[name]


def _transformers_count(config: dict) -> int:
    transformers = transformers_or_skip()
    torch = pytest.importorskip("torch")
    cfg = transformers.CONFIG_MAPPING[config["model_type"]](
        **{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(PARAMETER_COUNTS))
def test_parameter_counts_agree_with_transformers(name):
    config = json.loads((HF / f"{name}.json").read_text())
    assert _transformers_count(config) == PARAMETER_COUNTS[name]


@pytest.mark.parametrize("name, absent", [("gemma-7b", ("head_dim",)), ("gemma-7b", ("head_dim", "attention_bias")),
                                          ("qwen2-7b", ("tie_word_embeddings",)), ("llama-3-8b", ("tie_word_embeddings",
                                                                                                  "attention_bias"))])
def test_an_absent_key_takes_the_architectures_default(tmp_path, name, absent):
    config = json.loads((HF / f"{name}.json").read_text())
    for key in absent:
        config.pop(key, None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert total_params(resolve_model(str(path))) == PARAMETER_COUNTS[name]
    if name == "gemma-7b":
        spec = resolve_model(str(path))
        assert spec.head_dim == 256 and spec.attention_width == 4096 and spec.tied_embeddings
    if transformers_or_none() is None:
        return
    assert _transformers_count(config) == PARAMETER_COUNTS[name]


def test_qwen2_biases_on_qkv_only():
    spec = resolve_model(str(HF / "qwen2-7b.json"))
    assert spec.has_qkv_bias and not spec.linear_bias and spec.qkv_bias


@pytest.mark.parametrize("name, model_type", [("t5-small", "t5"), ("vit-base", "vit"), ("resnet-50", "resnet")])
def test_an_unrepresentable_model_type_is_refused_by_name(name, model_type):
    with pytest.raises(ConfigError) as exc:
        resolve_model(str(HF / f"{name}.json"))
    assert exc.value.field == "model.model_type"
    assert f"model_type {model_type!r} cannot be represented" in str(exc.value)


def test_the_sequence_length_says_where_it_came_from():
    assert resolve_model(str(HF / "qwen2-7b.json")).notes == (
        "sequence length 131072 from config.json's max_position_embeddings")


# BERT: the encoder network (workloads/hf_bert.py). Counts as transformers gives them (meta device).
BERT_COUNTS = {"BertForPreTraining": 110_106_428, "BertForMaskedLM": 109_514_298, "BertModel": 109_482_240}


def _bert_params(spec) -> int:
    from workloads.graph import ShardShape

    return int(spec.layer_graph(ShardShape(micro_batch=1, seq_length=spec.seq_length)).total_params())


@pytest.mark.parametrize("architecture", sorted(BERT_COUNTS))
def test_bert_config_is_the_encoder_network_with_its_heads(tmp_path, architecture):
    config = json.loads((HF / "bert-base-uncased.json").read_text())  # architectures: BertForMaskedLM
    config["architectures"] = [architecture]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = resolve_model(str(path))
    assert (spec.family, spec.num_layers, spec.hidden_size, spec.num_attention_heads) == ("bert", 12, 768, 12)
    assert spec.seq_length == 512 and spec.notes == "sequence length 512 from config.json's max_position_embeddings"
    assert _bert_params(spec) == BERT_COUNTS[architecture]
    transformers = transformers_or_none()
    if transformers is None:
        return
    import torch
    with torch.device("meta"):
        model = getattr(transformers, architecture)(transformers.BertConfig(**config))
    assert sum(p.numel() for p in model.parameters()) == BERT_COUNTS[architecture]


def test_bert_large_config_is_the_catalogs_bert_large(tmp_path):
    config = {**json.loads((HF / "bert-base-uncased.json").read_text()), "hidden_size": 1024, "num_hidden_layers": 24,
              "num_attention_heads": 16, "intermediate_size": 4096}
    config.pop("architectures")  # absent: BertForPreTraining, as the catalog's bert-large
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert _bert_params(resolve_model(str(path))) == _bert_params(resolve_model("bert-large"))


@pytest.mark.parametrize("change, field", [
    ({"architectures": ["BertForSequenceClassification"]}, "model.architectures"),
    ({"is_decoder": True}, "model.is_decoder"),
    ({"position_embedding_type": "relative_key"}, "model.position_embedding_type"),
    ({"hidden_act": "relu"}, "model.hidden_act"),
    ({"attention_probs_dropout_prob": 0.0}, "model.attention_probs_dropout_prob"),
    ({"num_attention_heads": 7}, "model"),
])
def test_what_the_bert_network_does_not_describe_is_refused(tmp_path, change, field):
    config = {**json.loads((HF / "bert-base-uncased.json").read_text()), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError) as exc:
        resolve_model(str(path))
    assert exc.value.field.startswith(field), str(exc.value)


def test_a_bert_config_simulates_and_says_where_its_sequence_came_from():
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    result = simulate(load_scenario({"model": str(HF / "bert-base-uncased.json"),
                                     "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
                                     "parallelism": {"dp": 8, "micro_batch_size": 8, "global_batch_size": 64}}))
    assert result.fits and result.tokens_per_s > 0
    assert result.run["seq_length"] == 512
    assert result.run["seq_length_source"] == "config.json's max_position_embeddings"


# Dropout: the 1-byte masks a model keeps for its backward (model.dropout), read from the config's
# dropout probabilities; Llama-family configs have only attention_dropout (0.0), GPT-2 0.1 throughout.
@pytest.mark.parametrize("name, dropout", [("gpt2", True), ("llama-2-7b", False), ("llama-3-8b", False),
                                           ("mixtral-8x7b", False), ("qwen2-7b", False), ("gemma-7b", False),
                                           ("qwen3-30b-a3b", False), ("qwen3-235b-a22b", False)])
def test_dropout_comes_from_the_configs_probabilities(name, dropout):
    assert resolve_model(str(HF / f"{name}.json")).dropout is dropout


def _write(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_any_dropout_probability_above_zero_keeps_masks(tmp_path):
    config = json.loads((HF / "llama-3-8b.json").read_text())
    assert resolve_model(_write(tmp_path, {**config, "attention_dropout": 0.1})).dropout
    gpt2 = json.loads((HF / "gpt2.json").read_text())
    off = {**gpt2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    assert not resolve_model(_write(tmp_path, off)).dropout
    assert not resolve_model(_write(tmp_path, {**off, "summary_first_dropout": 0.1})).dropout  # classifier head only
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):  # absent: GPT2Config's 0.1
        assert resolve_model(_write(tmp_path, {k: v for k, v in gpt2.items() if k != key} | {
            k: 0.0 for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop") if k != key})).dropout


@pytest.mark.parametrize("value", ["0.1", -0.1, 1.5, True])
def test_a_dropout_that_is_not_a_probability_is_named(tmp_path, value):
    config = json.loads((HF / "llama-3-8b.json").read_text())
    with pytest.raises(ConfigError) as exc:
        resolve_model(_write(tmp_path, {**config, "attention_dropout": value}))
    assert exc.value.field == "model.attention_dropout" and "dropout probability" in str(exc.value)


def test_the_dropout_defaults_are_transformers():
    transformers = transformers_or_skip()
    from workloads.hf_config import _ARCH_DEFAULTS, DROPOUT_KEYS, SUPPORTED_TYPES

    for model_type in SUPPORTED_TYPES:
        defaults = transformers.CONFIG_MAPPING[model_type]().to_dict()
        ours = _ARCH_DEFAULTS.get(model_type, {})
        for key in DROPOUT_KEYS:
            if key in defaults:
                assert ours.get(key, 0.0) == defaults[key], (model_type, key)


@pytest.mark.parametrize("catalog, config", [("llama2-7b", "llama-2-7b"), ("llama3-8b", "llama-3-8b"),
                                             ("mixtral-8x7b", "mixtral-8x7b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"),
                                             ("qwen3-235b-a22b", "qwen3-235b-a22b")])
def test_catalog_dropout_agrees_with_the_hf_config(catalog, config):
    assert MODELS.get(catalog).dropout is resolve_model(str(HF / f"{config}.json")).dropout is False


def test_every_catalog_transformer_says_whether_it_has_dropout_and_why():
    # The schema's default (True: Megatron-LM's 0.1) must not decide a catalog model silently.
    folder = Path(MODELS.folder)
    for path in sorted(folder.glob("*.yaml")):
        lines = [line for line in path.read_text().splitlines() if line.startswith("dropout:")]
        assert len(lines) == 1 and "#" in lines[0], path.name
