"""A node given as a variant of a catalog node, ``{base, overrides}`` (hardware_specs/variants.py): inline in
``cluster.node`` and as the catalog node grand-teton-h100 (torchtitan's 500 W, 96 GB H100 hosts), which must stay
the node validation simulates torchtitan's H100 rows on (validation/modern/torchtitan.py GRAND_TETON)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hardware_specs.catalog import ACCELERATORS, NODES, node_accelerator
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from validation.modern.profiles import with_constants
from validation.modern.torchtitan import GRAND_TETON

ROOT = Path(__file__).resolve().parents[1]
LABELS = ("name", "source", "notes")


def _scenario(node) -> dict:
    return {"model": "llama3-8b", "cluster": {"node": node, "num_gpus": 8}, "training": {"precision": "bf16"}}


def test_grand_teton_is_dgx_h100_with_the_torchtitan_boards_hbm_and_power_limit():
    node, base = NODES.get("grand-teton-h100"), NODES.get("dgx-h100")
    part, h100 = node_accelerator(node), ACCELERATORS.get("h100-sxm-80g")
    assert (part.hbm_gib, part.hbm_bandwidth_gb_per_s, part.tdp_watts) == (96, 2400, 500)
    # everything else is the base's: the part's name (the framework profiles are keyed by it) and calibration
    assert part.model_dump(exclude={"hbm_gib", "hbm_bandwidth_gb_per_s", "tdp_watts"}) == \
        h100.model_dump(exclude={"hbm_gib", "hbm_bandwidth_gb_per_s", "tdp_watts"})
    assert node.model_dump(exclude={*LABELS, "accelerator"}) == base.model_dump(exclude={*LABELS, "accelerator"})
    assert node.name == "grand-teton-h100" and "torchtitan_perf.csv" in node.source


def test_the_catalog_node_is_the_one_validation_simulates_torchtitans_h100_rows_on():
    validation = NODES.get(GRAND_TETON)  # the {base, overrides} mapping the torchtitan set uses
    labels = {"source", "notes"}
    assert validation.model_dump(exclude=labels) == NODES.get("grand-teton-h100").model_dump(exclude=labels)
    # and the mapping validation builds with a profile's constants (profiled_node) resolves to the same node
    raw = with_constants(type("C", (), {"scenario": _scenario(GRAND_TETON)})(), {})
    assert NODES.get(raw["cluster"]["node"]).model_dump(exclude=set(LABELS)) == validation.model_dump(exclude=set(LABELS))


def test_inline_variant_in_cluster_node_merges_nested_values_key_by_key():
    sc = load_scenario(_scenario({"base": "dgx-h100", "overrides": {"intra_node": {"latency_us": 4},
                                                                    "accelerator": {"hbm_gib": 96}}}))
    base = NODES.get("dgx-h100")
    assert sc.node.intra_node.latency_us == 4
    assert sc.node.intra_node.bandwidth_per_gpu_gb_per_s == base.intra_node.bandwidth_per_gpu_gb_per_s
    assert sc.accelerator.hbm_gib == 96 and sc.accelerator.name == "h100-sxm-80g"
    # the variant keeps the part's efficiencies (H100's: no grouped kernel, and why torchtitan's is not carried)
    catalog = ACCELERATORS.get("h100-sxm-80g").efficiency
    assert sc.accelerator.efficiency == catalog and catalog.grouped_gemm_not_carried
    # the scenario then keeps the grouped-GEMM kernels of its own framework only (simulator/scenario.py
    # with_grouped_gemm_kernels: B200's are torchtitan's; this run names none)
    b200 = ACCELERATORS.get("b200").efficiency
    variant = {"base": "dgx-b200", "overrides": {"accelerator": {"hbm_gib": 96}}}
    plain = load_scenario(_scenario(variant))
    assert b200.grouped_gemm and not plain.accelerator.efficiency.grouped_gemm
    assert plain.accelerator.efficiency.model_dump(exclude={"grouped_gemm"}) == b200.model_dump(exclude={"grouped_gemm"})
    torchtitan = load_scenario(_scenario(variant) | {"training": {"precision": "bf16", "framework": "torchtitan"}})
    assert torchtitan.accelerator.efficiency.grouped_gemm == b200.grouped_gemm


@pytest.mark.parametrize(("node", "field", "words"), [
    ({"base": "dgx-h101", "overrides": {}}, "cluster.node.base", "unknown node 'dgx-h101'"),
    ({"base": "dgx-h100", "overides": {}}, "cluster.node.overides", "unknown key"),
    ({"base": "dgx-h100", "overrides": [1]}, "cluster.node.overrides", "expected a mapping"),
    ({"base": "dgx-h100", "overrides": {"accelerator": {"hbm_gb": 96}}}, "cluster.node.accelerator.hbm_gb", ""),
    ({"base": "dgx-h100", "overrides": {"accelerator": {"hbm_gib": -1}}}, "cluster.node.accelerator.hbm_gib", ""),
])
def test_a_bad_variant_is_one_error_naming_the_field(node, field, words):
    with pytest.raises(ConfigError) as info:
        load_scenario(_scenario(node))
    assert info.value.field == field and words in str(info.value)


def test_cli_runs_the_torchtitan_example_on_grand_teton_and_refuses_a_bad_base_with_exit_2():
    example = str(ROOT / "examples" / "llama3-8b-torchtitan-sac-h100.yaml")
    good = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", example],
                          capture_output=True, text=True, cwd=ROOT)
    assert good.returncode == 0, good.stderr
    assert "8 x grand-teton-h100 (h100-sxm-80g)" in good.stdout and "of 96 GiB HBM" in good.stdout
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", example, "--set",
                          "cluster.node.base=nowhere"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr


def test_torchtitans_h100_factors_are_calibrated_on_the_board_they_were_fitted_on_and_derived_elsewhere():
    def state(node: str) -> tuple[str, str]:
        sc = load_scenario({**_scenario(node), "training": {"precision": "bf16", "framework": "torchtitan"}})
        return sc.frameworks[0].state, sc.frameworks[0].note

    on_board, elsewhere = state("grand-teton-h100"), state("dgx-h100")
    assert on_board[0] == "calibrated" and "node grand-teton-h100" in on_board[1]
    assert elsewhere[0] == "derived" and "another board" in elsewhere[1] and "grand-teton-h100" in elsewhere[1]
    # an inline variant that is not that board (no name of it) stays derived
    assert state({"base": "dgx-h100", "overrides": {"accelerator": {"hbm_gib": 96}}})[0] == "derived"
