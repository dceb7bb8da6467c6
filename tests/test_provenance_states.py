"""Every efficiency a run reports is calibrated (fitted on rows measured on that part), derived (from another
part or a ratio, saying which) or assumed, and the text output of ``clustersim simulate`` says which (issue 23:
a level carried from B200 or scaled by a ratio must not print as calibrated)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hardware_specs.catalog import ACCELERATORS, NODES, node_accelerator
from simulator.cost.provenance import (
    ASSUMED,
    CALIBRATED,
    DERIVED,
    STATED,
    efficiency_provenance,
    provenance_state,
)
from simulator.errors import ConfigError
from simulator.report.result import unwrap_table
from simulator.scenario import load_scenario

DERIVATION_MARKERS = ("(sibling ", "(transferred from ", "; x", "(derived by rule from ")


def _nodes() -> dict[str, str | dict]:
    """Every catalog node, plus an 8-GPU node (DGX H100's links) for an accelerator no catalog node holds."""
    nodes: dict[str, str | dict] = {name: name for name in NODES.names()}
    held = {node_accelerator(node).name for node in NODES.all().values()}  # a node variant inlines its part
    for accel in sorted(set(ACCELERATORS.names()) - held):
        nodes[f"dgx-h100 links with {accel}"] = {**NODES.get("dgx-h100").model_dump(exclude_none=True),
                                                 "accelerator": accel}
    return nodes


def _runs():
    """(node, precision, provenance) for every node of :func:`_nodes` and every precision its accelerator runs."""
    for label, node in _nodes().items():
        for precision in ("bf16", "fp16", "fp8", "fp32"):
            try:
                scenario = load_scenario({"model": "gpt-1.7b", "cluster": {"node": node, "num_gpus": 8},
                                          "training": {"precision": precision}})
            except ConfigError:
                continue  # e.g. fp8 on a part without fp8 (tests/test_bad_input.py)
            yield label, precision, efficiency_provenance(scenario)


RUNS = list(_runs())


def test_the_runs_cover_every_catalog_node_and_accelerator():
    assert set(NODES.names()) <= {label for label, _, _ in RUNS}
    assert {label.split(" with ")[-1] for label, _, _ in RUNS if " with " in label} == \
        set(ACCELERATORS.names()) - {node_accelerator(node).name for node in NODES.all().values()}
    assert len(RUNS) > 40


@pytest.mark.parametrize("node,precision,provenance", RUNS, ids=[f"{n}-{p}" for n, p, _ in RUNS])
def test_every_reported_efficiency_is_in_one_honest_state(node, precision, provenance):
    for component, where in provenance.items():
        state, source = provenance_state(where)
        assert state in (CALIBRATED, DERIVED, STATED, ASSUMED)
        marked = any(marker in where for marker in DERIVATION_MARKERS)
        if state == CALIBRATED:  # names the data it was fitted on, and none of the "carried from" markers
            assert not marked, (component, where)
            assert "validation/" in where or ".csv" in where, (component, where)
        elif state == DERIVED:  # says from what part or ratio
            assert marked and source, (component, where)
        elif state == STATED:  # a datasheet or external figure: the spec's source, no fit of this project
            assert where.startswith("stated in the spec: ") and not marked, (component, where)
        else:
            assert where == ASSUMED


def _state(node: str, component: str, precision: str = "fp8") -> tuple[str, str]:
    scenario = load_scenario({"model": "gpt-1.7b", "cluster": {"node": node, "num_gpus": 8},
                              "training": {"precision": precision}})
    return provenance_state(efficiency_provenance(scenario)[component])


def test_levels_carried_from_another_part_are_derived_and_say_from_which():
    assert _state("gb300-nvl72", "gemm_fp8")[0] == DERIVED and _state("gb300-nvl72", "gemm_fp8")[1].startswith("b200")
    assert _state("gb300-nvl72", "gemm_bf16")[1].startswith("b200")
    assert _state("mi355x-8", "gemm_fp8") == (DERIVED, "bf16 x 0.958")
    assert _state("gb200-nvl72", "intra_node_collectives")[1].startswith("dgx-b200")
    assert _state("dgx-b200", "gemm_fp8")[0] == CALIBRATED  # B200's own rows
    assert _state("dgx-b200", "intra_node_collectives")[0] == CALIBRATED


@pytest.mark.parametrize("node", ["gb200-nvl72", "dgx-b200", "dgx-h100", "hgx-h200"])
def test_datasheet_collectives_are_stated_not_calibrated(node):
    """issue 23: a node's cross-node link rate from its datasheet printed as "calibrated (fitted on rows
    measured on this part)"; it is a stated figure."""
    scenario = load_scenario({"model": "gpt-1.7b", "cluster": {"node": node, "num_gpus": 128},
                              "parallelism": {"tp": 8, "pp": 1}})
    where = efficiency_provenance(scenario)["inter_node_collectives"]
    assert where.startswith("stated in the spec: NVIDIA ") and "datasheet" in where
    assert provenance_state(where) == (STATED, "")


def test_simulate_prints_the_three_states():
    out = subprocess.run([sys.executable, "-m", "simulator", "simulate", "examples/gpt3-175b-fp8-512-h100.yaml"],
                         capture_output=True, text=True, check=True).stdout
    lines = {line.split(":")[0].strip(): line for line in unwrap_table(out)
             if "calibrated (" in line or "derived (" in line or "ASSUMED (" in line}
    calibrated = next(v for k, v in lines.items() if k.endswith("calibrated (fitted on rows measured on this part)"))
    derived = next(v for k, v in lines.items() if k.startswith("derived"))
    assert "gemm_bf16" in calibrated and "gemm_fp8" not in calibrated
    assert "gemm_fp8 (bf16 x 0.958)" in derived
    assert "intra_node_collectives (hgx-h200" in derived


def test_json_carries_the_states():
    doc = json.loads(subprocess.run(
        [sys.executable, "-m", "simulator", "simulate", "--set", "cluster.node=gb300-nvl72", "--set", "cluster.num_gpus=64",
         "--set", "training.precision=fp8", "--json"], capture_output=True, text=True, check=True).stdout)
    states = doc["efficiency_states"]
    assert states["gemm_fp8"].startswith("derived: b200")
    assert set(states) == set(doc["efficiency_provenance"])
