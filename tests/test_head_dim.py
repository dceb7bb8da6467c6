"""A head width decoupled from hidden / heads (``head_dim``: Gemma, Qwen3, Mistral NeMo 12B;
NeMo's ``kv_channels``): parameters as transformers counts them, one layer's FLOPs and saved
activations by hand, and bad values refused naming the field (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hf_models import transformers_or_skip

from simulator.errors import ConfigError
from validation.closed_form_activations import activation_bytes_per_layer
from workloads.catalog import resolve_model
from workloads.counting import total_params
from workloads.graph import ShardShape
from workloads.hf_config import spec_from_hf_config
from workloads.schema import TransformerSpec

ROOT = Path(__file__).resolve().parents[1]

# A tiny Mistral with Mistral NeMo's proportions: 4 heads of 32 = 128 wide, hidden 64, 2 KV heads.
TINY_MISTRAL = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 32, "intermediate_size": 96, "num_hidden_layers": 3, "vocab_size": 100,
                "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
                "tie_word_embeddings": False}


def _tiny(**kw) -> TransformerSpec:
    base = dict(name="t", num_layers=1, hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=32,
                ffn_hidden_size=96, gated_mlp=True, vocab_size=100, seq_length=16, position_embedding="rope",
                norm="rmsnorm", linear_bias=False)
    return TransformerSpec.model_validate({**base, **kw})


def test_yaml_key_head_dim_sets_the_width():
    spec = _tiny()
    assert spec.head_dim == 32 and spec.attention_width == 128 and spec.attention_head_dim == 32
    assert _tiny(head_dim=None).head_dim == 16  # unset: hidden / heads, as before


def test_parameters_equal_transformers_own_count():
    spec = spec_from_hf_config(TINY_MISTRAL, name="tiny-mistral")
    assert spec.head_dim == 32 and spec.attention_width == 128
    # by hand per layer: q 64x128, k and v 64x64 each, o 128x64, SwiGLU 3x64x96, two RMSNorms 2x64
    layer = 64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 96 + 2 * 64
    expected = 3 * layer + 2 * 100 * 64 + 64
    assert total_params(spec) == expected == 142_272
    # the model's own count (no vocabulary padding), as transformers holds it
    assert spec.layer_graph(ShardShape(micro_batch=1, seq_length=16, vocab_padding_tp=0)).total_params() == expected
    transformers = transformers_or_skip()
    torch = pytest.importorskip("torch")
    cfg = transformers.MistralConfig(**{k: v for k, v in TINY_MISTRAL.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize("tp", [1, 2])
def test_one_layers_flops_by_hand(tp):
    spec = _tiny()
    s, b = 16, 2
    graph = spec.layer_graph(ShardShape(micro_batch=b, seq_length=s, tp=tp))
    got = {op.name: op.flops for op in graph.layers[1].forward if op.kind in ("gemm", "attention")}
    tokens, heads, kv = b * s, 4 // tp, 2 // tp
    assert got["qkv"] == 2 * tokens * 64 * (heads + 2 * kv) * 32   # q 128, k and v 64 wide (÷tp)
    assert got["attn_scores"] == 2 * b * heads * s * s * 32        # Q K^T with head size 32
    assert got["attn_values"] == 2 * b * heads * s * s * 32
    assert got["attn_out"] == 2 * tokens * heads * 32 * 64         # heads x 32 -> hidden 64
    assert got["fc1"] == 2 * tokens * 64 * 2 * 96 // tp and got["fc2"] == 2 * tokens * 96 // tp * 64


def test_saved_activations_use_the_attention_width():
    spec = _tiny()
    s, b, e = 16, 1, 2
    block = spec.layer_graph(ShardShape(micro_batch=b, seq_length=s)).layers[1]
    width = 128
    # Korthikanti's selective count with q and the projection input a·d wide, K and V g·d wide:
    # (4e + 2m)·sbh + e·sb·w + 2e·sb·d·g + e·sb·w + 3e·sbf (SwiGLU)
    by_hand = (4 * e + 2) * s * b * 64 + 2 * e * s * b * width + 2 * e * s * b * 32 * 2 + 3 * e * s * b * 96
    assert activation_bytes_per_layer(s, b, 64, 4, recompute="selective", ffn=96, kv_heads=2, gated=True,
                                      head_dim=32) == by_hand
    graph = spec.layer_graph(ShardShape(micro_batch=b, seq_length=s))
    assert block.kept_bytes("selective", graph.input_bytes(block)) == by_hand


@pytest.mark.parametrize("value", [0, -8, 12.5, "wide"])
def test_bad_head_dim_is_a_config_error_naming_the_field(value):
    with pytest.raises(ConfigError) as err:
        resolve_model({**_tiny().model_dump(exclude={"attention_head_dim"}), "head_dim": value})
    assert "head_dim" in str(err.value)


def test_head_dim_with_mla_is_refused():
    with pytest.raises(ConfigError, match="leave head_dim unset"):
        resolve_model({**resolve_model("deepseek-v3").model_dump(exclude={"attention_head_dim"}), "head_dim": 128})


def test_bad_head_dim_exits_2_naming_the_field(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: hd\nmodel: {name: t, num_layers: 2, hidden_size: 64, num_attention_heads: 4,\n"
                        "  head_dim: 12.5, vocab_size: 100, seq_length: 16}\n"
                        "cluster: {node: dgx-a100-80g, num_gpus: 1}\n"
                        "parallelism: {global_batch_size: 1, micro_batch_size: 1}\n")
    run = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(scenario)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "head_dim" in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


# Qwen3 (per-head q/k RMSNorm, head width 128 unlike hidden / heads); totals as transformers counts
# them on the meta device (30.5B and 235B as Qwen publishes), and the catalog entries equal them.
QWEN3 = {"qwen3-30b-a3b": 30_532_122_624, "qwen3-235b-a22b": 235_093_634_560}
HF = ROOT / "tests" / "data" / "hf"


def _transformers_count(config: dict) -> int:
    transformers = transformers_or_skip()
    torch = pytest.importorskip("torch")
    cfg = transformers.CONFIG_MAPPING[config["model_type"]](**{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(QWEN3))
def test_qwen3_moe_configs_and_catalog_entries_count_as_transformers(name):
    spec = resolve_model(str(HF / f"{name}.json"))
    assert spec.head_dim == 128 and spec.qk_norm and spec.attention_width != spec.hidden_size
    assert total_params(spec) == total_params(resolve_model(name)) == QWEN3[name]
    graph = resolve_model(name).layer_graph(ShardShape(micro_batch=1, seq_length=128))
    assert graph.total_params() == pytest.approx(QWEN3[name], rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QWEN3))
def test_qwen3_moe_counts_are_transformers_own(name):
    assert _transformers_count(json.loads((HF / f"{name}.json").read_text())) == QWEN3[name]


def test_tiny_qwen3_dense_counts_as_transformers():
    config = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 24, "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 100,
              "max_position_embeddings": 16, "rms_norm_eps": 1e-6}
    spec = spec_from_hf_config(config)
    # per layer: q 64x96, k and v 64x48 each, o 96x64, q/k norms 2x24, SwiGLU 3x64x96, two RMSNorms 2x64
    layer = 64 * 96 + 2 * 64 * 48 + 96 * 64 + 2 * 24 + 3 * 64 * 96 + 2 * 64
    assert total_params(spec) == 2 * layer + 2 * 100 * 64 + 64 == _transformers_count(config)
    graph = spec.layer_graph(ShardShape(micro_batch=1, seq_length=16, vocab_padding_tp=0))  # the model's own rows
    assert graph.total_params() == total_params(spec)
    assert any(op.name == "qk_norm" for op in graph.layers[1].forward)
    # a run at tp 1 holds Megatron's padded vocabulary: 100 rows -> 128, twice (embedding and untied head)
    padded = spec.layer_graph(ShardShape(micro_batch=1, seq_length=16))
    assert padded.total_params() == total_params(spec) + 2 * 28 * 64


@pytest.mark.parametrize("key, value", [("decoder_sparse_step", 2), ("mlp_only_layers", [0])])
def test_qwen3_moe_layouts_the_schema_cannot_hold_are_refused_by_key(key, value):
    config = {**json.loads((HF / "qwen3-30b-a3b.json").read_text()), key: value}
    with pytest.raises(ConfigError, match=key):
        spec_from_hf_config(config)
