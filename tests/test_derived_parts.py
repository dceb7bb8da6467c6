"""The boards of the published CNN rows the catalog lacked (DGX-1 V100 32 GB, H100 PCIe, A100 PCIe 80/40 GB,
GH200 hosts): their specs load, carry the datasheet figures, hold exactly what validation/derive_parts.py
derives from their SXM siblings (so a refit of a sibling cannot leave them stale), say so in the output, and
simulate ResNet-50 end to end; bad combinations on them stay exit-2 errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hardware_specs.catalog import ACCELERATORS, NODES, node_accelerator
from simulator.cost.provenance import DERIVED, efficiency_provenance, provenance_state
from simulator.scenario import load_scenario
from validation.derive_parts import DERIVED_PARTS, SPECS, rendered

NEW_NODES = {"dgx1-v100-32g": ("v100-sxm-32g", 8), "h100-pcie-8": ("h100-pcie-80g", 8),
             "a100-80g-pcie-8": ("a100-pcie-80g", 8), "a100-40g-pcie-8": ("a100-pcie-40g", 8), "gh200-1": ("gh200", 1)}


@pytest.mark.parametrize("name", sorted(DERIVED_PARTS))
def test_derived_spec_is_what_the_rule_gives_from_the_current_sibling(name):
    assert (SPECS / f"{name}.yaml").read_text() == rendered(name), \
        f"run python -m validation.derive_parts --write ({DERIVED_PARTS[name]} changed)"


@pytest.mark.parametrize(("name", "bf16", "hbm_gib", "hbm_gb_per_s", "tdp"), [
    ("h100-pcie-80g", 756, 80, 2000, 350),
    ("a100-pcie-80g", 312, 80, 1935, 300),
    ("a100-pcie-40g", 312, 40, 1555, 250),
])
def test_datasheet_values(name, bf16, hbm_gib, hbm_gb_per_s, tdp):
    acc = ACCELERATORS.get(name)
    assert (acc.peak_tflops["bf16"], acc.hbm_gib, acc.hbm_bandwidth_gb_per_s, acc.tdp_watts) == \
        (bf16, hbm_gib, hbm_gb_per_s, tdp)


def test_rule_scales_the_size_axis_by_the_peak_ratio_and_keeps_fractions_of_peak():
    pcie, sxm = ACCELERATORS.get("h100-pcie-80g").efficiency, ACCELERATORS.get("h100-sxm-80g").efficiency
    ratio = 756 / 989
    for mine, theirs in zip(pcie.gemm_curve, sxm.gemm_curve, strict=True):
        assert mine.efficiency == theirs.efficiency
        assert mine.gflop == pytest.approx(theirs.gflop * ratio, rel=1e-3)
    assert pcie.conv_efficiency["tf32"].level == sxm.conv_efficiency["tf32"].level
    assert pcie.memory_bound_efficiency == sxm.memory_bound_efficiency
    a100 = ACCELERATORS.get("a100-pcie-40g").efficiency
    assert [p.gflop for p in a100.gemm_curve] == [p.gflop for p in ACCELERATORS.get("a100-sxm-80g").efficiency.gemm_curve]


@pytest.mark.parametrize("node", sorted(NEW_NODES))
def test_new_node_loads_with_its_part(node):
    spec = NODES.get(node)
    assert spec.name == node
    assert node_accelerator(spec).name == NEW_NODES[node][0]
    assert spec.gpus_per_node == NEW_NODES[node][1]


def test_dgx1_32g_is_p3_16xlarge_links_with_the_32gb_part():
    dgx1, p3 = NODES.get("dgx1-v100-32g"), NODES.get("p3-16xlarge")
    assert dgx1.intra_node == p3.intra_node
    assert node_accelerator(dgx1).hbm_gib == 32 and node_accelerator(p3).hbm_gib == 16
    assert dgx1.nics_per_node * dgx1.nic_bandwidth_gbit_per_s == 400


def test_pcie_hosts_talk_over_pcie():
    assert NODES.get("h100-pcie-8").intra_node.kind == "pcie"
    assert NODES.get("h100-pcie-8").intra_node.bandwidth_per_gpu_gb_per_s == 63.0  # Gen5 x16
    assert NODES.get("a100-80g-pcie-8").intra_node.bandwidth_per_gpu_gb_per_s == 31.5  # Gen4 x16


@pytest.mark.parametrize("node", ["h100-pcie-8", "a100-40g-pcie-8"])
def test_derived_constants_print_as_derived_and_the_clock_as_assumed(node):
    sc = load_scenario({"model": "resnet50", "cluster": {"node": node, "num_gpus": 8},
                        "parallelism": {"dp": 8, "micro_batch_size": 64, "global_batch_size": 512},
                        "training": {"precision": "fp16", "optimizer": "sgd"}})
    prov = efficiency_provenance(sc)
    assert provenance_state(prov["gemm_fp16"])[0] == DERIVED
    assert prov["sustained_clock"] == "assumed"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("node", sorted(NEW_NODES))
def test_resnet50_simulates_on_the_new_node(node):
    gpus = NEW_NODES[node][1]
    run = _cli("simulate", "examples/resnet50-8xa100.yaml", "--set", f"cluster.node={node}",
               "--set", f"cluster.num_gpus={gpus}", "--set", f"parallelism.dp={gpus}",
               "--set", f"parallelism.global_batch_size={256 * gpus}", "--set", "training.precision=fp16", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["samples_per_s"] > 0 and out["fits"]


@pytest.mark.parametrize(("node", "precision"), [("a100-80g-pcie-8", "fp8"), ("dgx1-v100-32g", "bf16")])
def test_bad_combinations_stay_exit_2(node, precision):
    run = _cli("simulate", "examples/resnet50-8xa100.yaml", "--set", f"cluster.node={node}",
               "--set", f"training.precision={precision}")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "precision" in run.stderr
