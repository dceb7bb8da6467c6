"""The hardware and model catalogs: every entry loads, required names exist, datasheet
figures and parameter counts match their published sources, and bad references fail
with a ConfigError that names the field."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from hardware_specs.catalog import ACCELERATORS, FABRICS, NODES, node_accelerator
from simulator.errors import ConfigError
from validation.closed_forms import narayanan_params
from workloads.catalog import MODELS, resolve_model
from workloads.counting import active_params, total_params

ROOT = Path(__file__).resolve().parents[1]
TABLE1 = ROOT / "validation" / "data" / "narayanan2021_megatron_table1.csv"
CATALOGS = {"accelerator": ACCELERATORS, "node": NODES, "fabric": FABRICS, "model": MODELS}

REQUIRED = {
    "accelerator": ["v100-sxm-32g", "a100-sxm-40g", "a100-sxm-80g", "h100-sxm-80g", "h800-sxm-80g",
                    "h200-sxm-141g", "b200", "mi250x-gcd", "mi300x"],
    "node": ["dgx-a100-80g", "dgx-a100-40g", "dgx-h100", "hgx-h800", "hgx-h200", "dgx-b200",
             "dgx2-v100", "mi300x-8", "p5-h100-efa"],
    "fabric": ["fat-tree", "fat-tree-2to1", "fat-tree-4to1"],
    "model": ["gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b", "gpt-39.1b", "gpt-76.1b", "gpt-145.6b",
              "gpt-310.1b", "gpt-529.6b", "gpt-1t", "gpt3-175b", "gpt-22b",
              "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
              "llama-1b", "llama-3b", "llama-13b", "llama-30b", "llama-65b",
              "mixtral-8x7b", "mixtral-8x22b"],
}

ALL_ENTRIES = [(kind, name) for kind, cat in CATALOGS.items() for name in cat.names()]
FP8_HARDWARE = {"h100-sxm-80g", "h100-pcie-80g", "h800-sxm-80g", "h200-sxm-141g", "gh200", "b200", "b300", "gb200", "gb300", "mi300x",
                "mi325x", "mi355x", "l4", "rtx-4090"}
NO_BF16 = {"v100-sxm-32g", "v100-sxm2-16g", "v100-pcie-16g", "t4", "rtx-2080ti"}  # Volta/Turing tensor cores: fp16 only
FP32_ONLY = {"gtx-1080ti"}  # Pascal GP102: no tensor cores, fp16 at 1/64 rate


# --- every entry -------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "name"), ALL_ENTRIES, ids=[f"{k}:{n}" for k, n in ALL_ENTRIES])
def test_entry_loads_and_is_documented(kind, name):
    spec = CATALOGS[kind].get(name)
    assert spec.name == name, "file stem must equal the name field"
    assert spec.source.strip()
    text = (CATALOGS[kind].folder / f"{name}.yaml").read_text()
    assert text.lstrip().startswith("#"), "every catalog file starts with a comment header"


@pytest.mark.parametrize(("kind", "names"), REQUIRED.items())
def test_required_names_exist(kind, names):
    missing = sorted(set(names) - set(CATALOGS[kind].names()))
    assert not missing


# --- accelerators ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ACCELERATORS.names())
def test_accelerator_precisions(name):
    acc = ACCELERATORS.get(name)
    peaks = acc.peak_tflops
    if name in FP32_ONLY:
        assert set(peaks) == {"fp32"}
        return
    if name in NO_BF16:
        assert "bf16" not in peaks and "fp16" in peaks
    else:
        assert "bf16" in peaks
        assert peaks.get("fp16", peaks["bf16"]) == peaks["bf16"]
    assert ("fp8" in peaks) == (name in FP8_HARDWARE)
    if "fp8" in peaks:
        assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=1e-3)
    # dense peaks only: tensor-core rates rise with lower precision, never the other way
    assert peaks.get("fp32", 0) <= max(peaks.get("bf16", 0), peaks.get("fp16", 0))


@pytest.mark.parametrize("name", ACCELERATORS.names())
def test_efficiency_is_fitted_or_says_assumed(name):
    eff = ACCELERATORS.get(name).efficiency
    if eff.fitted_on is None:
        assert "assumed" in eff.source.lower()


@pytest.mark.parametrize(("name", "bf16", "hbm_gib", "hbm_gb_per_s"), [
    ("a100-sxm-80g", 312, 80, 2039),
    ("a100-sxm-40g", 312, 40, 1555),
    ("h100-sxm-80g", 989, 80, 3350),
    ("h200-sxm-141g", 989, 140.4, 4800),
    ("b200", 2250, 179, 8000),
    ("mi300x", 1307.4, 192, 5300),
])
def test_datasheet_values(name, bf16, hbm_gib, hbm_gb_per_s):
    acc = ACCELERATORS.get(name)
    assert acc.peak_tflops["bf16"] == bf16
    assert acc.hbm_gib == hbm_gib
    assert acc.hbm_bandwidth_gb_per_s == hbm_gb_per_s


def test_h100_fp8_and_v100_fp16():
    assert ACCELERATORS.get("h100-sxm-80g").peak_tflops["fp8"] == 1979
    assert ACCELERATORS.get("v100-sxm-32g").peak_tflops["fp16"] == 125


# --- nodes and fabrics -------------------------------------------------------------------

@pytest.mark.parametrize("name", NODES.names())
def test_node_accelerator_resolves(name):
    node = NODES.get(name)
    acc = node_accelerator(node)
    assert acc.name == (node.accelerator if isinstance(node.accelerator, str) else node.accelerator.name)
    if node.intra_node.supports_nvls:
        assert acc.vendor == "nvidia"


@pytest.mark.parametrize(("name", "per_dir_gb_per_s", "nics", "nic_gbit", "nvls"), [
    ("dgx-a100-80g", 300, 8, 200, False),
    ("dgx-h100", 450, 8, 400, True),
    ("hgx-h800", 200, 8, 400, True),
    ("dgx-b200", 900, 8, 400, True),
    ("p5-h100-efa", 450, 32, 100, True),
])
def test_node_links(name, per_dir_gb_per_s, nics, nic_gbit, nvls):
    node = NODES.get(name)
    assert node.intra_node.bandwidth_per_gpu_gb_per_s == per_dir_gb_per_s
    assert node.nics_per_node == nics and node.nic_bandwidth_gbit_per_s == nic_gbit
    assert node.intra_node.supports_nvls is nvls


def test_p5_has_3200_gbit_per_node():
    node = NODES.get("p5-h100-efa")
    assert node.nics_per_node * node.nic_bandwidth_gbit_per_s == 3200


def test_dgx_h100_efficiencies_follow_nccl_reference():
    node = NODES.get("dgx-h100")
    assert node.intra_node.collective_efficiency == pytest.approx(370 / 450, abs=0.01)
    assert node.nic_efficiency == pytest.approx(47 / 50, abs=0.01)


@pytest.mark.parametrize(("name", "oversub", "pod"), [
    ("fat-tree", 1.0, None), ("fat-tree-2to1", 2.0, 32), ("fat-tree-4to1", 4.0, 16)])
def test_fabrics(name, oversub, pod):
    fabric = FABRICS.get(name)
    assert fabric.oversubscription == oversub and fabric.pod_size_nodes == pod


# --- models: parameter counts against the literature --------------------------------------

def _table1_rows() -> list[dict[str, str]]:
    with TABLE1.open(newline="") as f:
        return list(csv.DictReader(f))


TABLE1_NAMES = {1.7: "gpt-1.7b", 3.6: "gpt-3.6b", 7.5: "gpt-7.5b", 18.4: "gpt-18.4b", 39.1: "gpt-39.1b",
                76.1: "gpt-76.1b", 145.6: "gpt-145.6b", 310.1: "gpt-310.1b", 529.6: "gpt-529.6b",
                1008.0: "gpt-1t"}


@pytest.mark.parametrize("row", _table1_rows(), ids=lambda r: f"{r['model_params_billion']}B")
def test_gpt_table1_params(row):
    billions = float(row["model_params_billion"])
    model = MODELS.get(TABLE1_NAMES[billions])
    h, layers, heads = int(row["hidden_size"]), int(row["num_layers"]), int(row["attention_heads"])
    vocab, seq = int(row["vocab_size"]), int(row["seq_len"])
    assert (model.hidden_size, model.num_layers, model.num_attention_heads) == (h, layers, heads)
    assert (model.vocab_size, model.seq_length, model.ffn_size) == (vocab, seq, 4 * h)
    count = total_params(model)
    assert count == pytest.approx(narayanan_params(layers, h, vocab, seq), rel=0.005)
    # The table prints one decimal (1.65B is printed "1.7"): allow 0.5% or half a printed unit.
    assert abs(count / 1e9 - billions) <= max(0.005 * billions, 0.05 + 1e-9)


def test_table1_csv_has_all_ten_rows():
    assert sorted(float(r["model_params_billion"]) for r in _table1_rows()) == sorted(TABLE1_NAMES)


@pytest.mark.parametrize(("name", "billions", "rel"), [
    ("llama2-7b", 6.74, 0.02), ("llama2-13b", 13.0, 0.02), ("llama2-70b", 69.0, 0.02),
    ("llama3-8b", 8.03, 0.02), ("llama3-70b", 70.6, 0.02), ("llama3-405b", 405.9, 0.02),
    ("mixtral-8x7b", 46.7, 0.02), ("mixtral-8x22b", 141.0, 0.02),
    ("gpt3-175b", 175.0, 0.01), ("gpt-22b", 22.0, 0.01),
    ("llama-13b", 13.0, 0.02), ("llama-30b", 32.5, 0.02), ("llama-65b", 65.2, 0.02),
    ("llama-1b", 1.24, 0.02), ("llama-3b", 3.21, 0.02), ("qwen2.5-7b", 7.61, 0.002),
])
def test_published_param_counts(name, billions, rel):
    assert total_params(MODELS.get(name)) / 1e9 == pytest.approx(billions, rel=rel)


def test_mixtral_is_moe_with_note():
    model = MODELS.get("mixtral-8x7b")
    assert model.moe is not None and model.moe.num_experts == 8 and model.moe.top_k == 2
    assert "expert parallelism" in (model.notes or "")
    assert active_params(model) / 1e9 == pytest.approx(12.9, rel=0.02)


def test_llama_shapes():
    l70 = MODELS.get("llama2-70b")
    assert (l70.kv_heads, l70.gated_mlp, l70.linear_bias, l70.tied_embeddings) == (8, True, False, False)
    assert (l70.norm, l70.position_embedding) == ("rmsnorm", "rope")
    l405 = MODELS.get("llama3-405b")
    assert (l405.num_layers, l405.hidden_size, l405.kv_heads, l405.ffn_size, l405.vocab_size) == (
        126, 16384, 8, 53248, 128256)


# --- references and errors ---------------------------------------------------------------

def test_unknown_names_raise_config_error_naming_the_field():
    with pytest.raises(ConfigError) as exc:
        ACCELERATORS.get("h100-sxm-81g", "cluster.node.accelerator")
    assert exc.value.field == "cluster.node.accelerator"
    assert "h100-sxm-81g" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        resolve_model("gpt-9000b")
    assert exc.value.field == "model"
    with pytest.raises(ConfigError) as exc:
        NODES.get("dgx-z100")
    assert exc.value.field == "node"


def _yaml_mapping(kind: str, name: str) -> dict:
    return yaml.safe_load((CATALOGS[kind].folder / f"{name}.yaml").read_text())


@pytest.mark.parametrize(("kind", "name"), [("accelerator", "h100-sxm-80g"), ("node", "dgx-h100"),
                                            ("fabric", "fat-tree-2to1"), ("model", "llama3-8b")])
def test_inline_mapping_unknown_key(kind, name):
    data = _yaml_mapping(kind, name)
    assert CATALOGS[kind].get(data) == CATALOGS[kind].get(name)
    with pytest.raises(ConfigError) as exc:
        CATALOGS[kind].get({**data, "peak_tflop": 1}, f"scenario.{kind}")
    assert "unknown key" in str(exc.value)
    assert exc.value.field == f"scenario.{kind}.peak_tflop"


def test_inline_nested_unknown_key_names_the_path():
    data = _yaml_mapping("node", "dgx-h100")
    data["intra_node"] = {**data["intra_node"], "bandwith_per_gpu_gb_per_s": 450}
    with pytest.raises(ConfigError) as exc:
        NODES.get(data, "cluster.node")
    assert "unknown key" in str(exc.value)
    assert "intra_node.bandwith_per_gpu_gb_per_s" in exc.value.field


def test_yaml_path_reference(tmp_path):
    model = _yaml_mapping("model", "llama2-7b")
    model["name"] = "my-llama"
    path = tmp_path / "my-llama.yaml"
    path.write_text(yaml.safe_dump(model))
    spec = resolve_model(str(path))
    assert spec.name == "my-llama" and spec.hidden_size == 4096
    acc = ACCELERATORS.get(str(ACCELERATORS.folder / "mi300x.yaml"))
    assert acc.peak_tflops["fp8"] == 2614.9


def test_missing_yaml_path_is_config_error(tmp_path):
    with pytest.raises(ConfigError) as exc:
        resolve_model(str(tmp_path / "nope.yaml"))
    assert exc.value.field == "model"
