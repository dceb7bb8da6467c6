"""A run that names no ``training.framework`` is told so: the default used (megatron-core, the catalog constants)
and how far those constants were from held-out runs of named frameworks on its accelerator and model family
(simulator/cost/default_framework.py; the figures are data, hardware_specs/frameworks/default_heldout.csv, written
by validation/modern/default_framework.py and checked against fresh runs in tests/test_catalog_only_validation.py).
Session 9 audit, gap 3: torchtitan's Llama-3-8B example with the field unset printed 436,284 tok/s and
"ASSUMED: none"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.cost.default_framework import (
    FrameworkSummary,
    framework_text,
    load,
    part_block,
    summaries,
)

ROOT = Path(__file__).resolve().parents[1]
TORCHTITAN_H100 = ROOT / "examples" / "llama3-8b-torchtitan-sac-h100.yaml"
RESNET_A100 = ROOT / "examples" / "resnet50-8xa100.yaml"
PREFIX = "no training.framework named: priced as megatron-core"


def _cli(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "simulator", "simulate", *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def unnamed_json() -> dict:
    return json.loads(_cli(str(TORCHTITAN_H100), "--set", "training.framework=null", "--json").stdout)


@pytest.fixture(scope="module")
def named_json() -> dict:
    return json.loads(_cli(str(TORCHTITAN_H100), "--json").stdout)


def _warning_lines(text: str) -> list[str]:
    """The no-framework WARNING as printed: its first line and the lines indented under it."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  WARNING: " + PREFIX))
    block = [lines[first]]
    for line in lines[first + 1:]:
        if not line.startswith("      "):
            break
        block.append(line)
    return block


def test_warning_without_a_framework_with_the_shipped_heldout_figures():
    text = _cli(str(TORCHTITAN_H100), "--set", "training.framework=null").stdout
    lines = _warning_lines(text)
    warning = " ".join(line.strip() for line in lines)
    expected = {s.framework: s for s in summaries(load(), "h100-sxm-80g", "llm", "16-bit")}
    assert {"torchtitan", "llm-foundry"} <= set(expected)
    from hardware_specs.catalog import ACCELERATORS
    from workloads.catalog import resolve_model

    block = part_block(ACCELERATORS.get("h100-sxm-80g"), resolve_model("llama3-8b"), "bf16", load())
    assert block["by_framework"] == [s.as_dict() for s in expected.values()]
    for summary in expected.values():  # every framework's figures, as the shipped rows give them, two lines at most
        said = framework_text(summary)
        assert said in warning and said.startswith(f"{summary.framework} (") and "held-out row" in said
    assert expected["torchtitan"].median_error > 0.2  # the gap the audit found: much too optimistic, now said
    assert "- 16-bit decoder-transformer runs on h100-sxm-80g:" in warning
    # under the table, whose framework line says what the default is: said once, the WARNING adds the names
    assert "priced as megatron-core, as the framework line says; name the run's framework for its fitted factors " \
           "(training.framework: " in warning
    assert text.count("Transformer Engine reaches") == 1  # the framework line's words, not the WARNING's too
    # readable: no line of it wider than the table (it was one line of 900-2,100 characters before session 11)
    starts = [line for line in lines if line.startswith(" " * 10) and line[10] != " "]
    assert len(starts) == len(expected) and max(map(len, lines)) <= 110
    assert sum(line.startswith(" " * 10) for line in lines) <= 2 * len(expected)
    assert "ASSUMED (not measured): framework_factors" in text


def test_no_warning_when_a_framework_is_named(named_json):
    text = _cli(str(TORCHTITAN_H100)).stdout
    assert PREFIX not in text
    assert "default_framework" not in named_json
    assert "framework_factors" not in named_json["assumed_efficiencies"]


def test_json_carries_the_default_and_its_heldout_errors(unnamed_json):
    block = unnamed_json["default_framework"]
    assert block["named"] is False and block["used"] == "megatron-core"
    (part,) = block["heldout_catalog_only"]
    assert (part["accelerator"], part["family"], part["precision"], part["rows_from"]) == (
        "h100-sxm-80g", "llm", "bf16", "this part")
    assert part["by_framework"] == [s.as_dict() for s in summaries(load(), "h100-sxm-80g", "llm", "16-bit")]
    assert "torchtitan" in block["shipped_profiles"] and "dle-pytorch" not in block["shipped_profiles"]
    assert any(w.startswith(PREFIX) for w in unnamed_json["warnings"])
    assert "framework_factors" in unnamed_json["assumed_efficiencies"]


def test_the_warning_changes_no_figure(unnamed_json):
    # the same run with megatron-core named: the same constants, so every figure is the same, and nothing is said
    named = json.loads(_cli(str(TORCHTITAN_H100), "--set", "training.framework=megatron-core", "--json").stdout)
    assert "default_framework" not in named
    differ = {k for k in set(named) | set(unnamed_json) if named.get(k) != unnamed_json.get(k)}
    assert differ == {"default_framework", "warnings", "efficiency_provenance", "assumed_efficiencies",
                      "efficiency_states"}


def test_set_null_is_the_same_as_leaving_the_field_out(tmp_path, unnamed_json):
    raw = yaml.safe_load(TORCHTITAN_H100.read_text())
    assert raw["training"].pop("framework") == "torchtitan"
    path = tmp_path / "no-framework.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert json.loads(_cli(str(path), "--json").stdout) == unnamed_json


def test_a_cnn_is_told_the_cnn_rows_of_its_part_and_precision():
    out = json.loads(_cli(str(RESNET_A100), "--set", "training.framework=null", "--json").stdout)
    (part,) = out["default_framework"]["heldout_catalog_only"]
    assert (part["accelerator"], part["family"], part["rows_precisions"]) == ("a100-sxm-80g", "cnn", "16-bit")
    assert {s["framework"] for s in part["by_framework"]} >= {"dle-pytorch"}
    assert out["default_framework"]["shipped_profiles"] == ["dle-mxnet", "dle-pytorch", "lambda-pytorch"]
    assert "framework_factors" in out["assumed_efficiencies"]


def test_a_part_without_rows_takes_its_derivation_base_or_every_part():
    from hardware_specs.catalog import ACCELERATORS
    from workloads.catalog import resolve_model

    rows, gpt = load(), resolve_model("gpt-1.7b")
    b200 = part_block(ACCELERATORS.get("b200"), gpt, "bf16", rows)
    assert b200["rows_from"].startswith("other parts") and "b200" not in b200["rows_on"]
    assert b200["by_framework"] == [s.as_dict() for s in summaries(rows, None, "llm", "16-bit")]
    pcie = ACCELERATORS.get("h100-pcie-80g")
    assert pcie.derived_from == "h100-sxm-80g"
    block = part_block(pcie, gpt, "fp8", rows)
    assert block["rows_from"].startswith("h100-sxm-80g") and block["rows_on"] == ["h100-sxm-80g"]
    assert block["by_framework"] == [s.as_dict() for s in summaries(rows, "h100-sxm-80g", "llm", "fp8")]


def test_a_precision_without_rows_on_the_part_takes_every_precision():
    from hardware_specs.catalog import ACCELERATORS
    from workloads.catalog import resolve_model

    rows = load()
    assert not summaries(rows, "mi300x", "llm", "16-bit")  # torchtitan's held-out MI300X rows are fp8
    block = part_block(ACCELERATORS.get("mi300x"), resolve_model("gpt-1.7b"), "bf16", rows)
    assert block["rows_from"] == "this part" and block["rows_precisions"].startswith("all")
    assert block["by_framework"] == [s.as_dict() for s in summaries(rows, "mi300x", "llm")]


def test_summaries_are_the_median_and_max_of_the_rows():
    from simulator.cost.default_framework import HeldoutRow

    rows = tuple(HeldoutRow("s", i, "fw", "p", "p", "llm", "bf16", e, True) for i, e in enumerate((0.1, -0.3, 0.5)))
    (s,) = summaries(rows, "p", "llm", "16-bit")
    assert (s.rows, s.median_error, s.median_abs_error, s.max_abs_error) == (3, 0.1, 0.3, 0.5)
    assert s == FrameworkSummary("fw", 3, 0.1, 0.3, 0.5, ("bf16",), ("s",), None, "s", 2, 0.5)
    assert not summaries(rows, "p", "cnn") and not summaries(rows, "q", "llm")


def test_the_shipped_rows_are_every_heldout_row_of_the_framework_sets():
    # the values are checked against fresh catalog-only runs in tests/test_catalog_only_validation.py (slow)
    from tests.test_catalog_only_validation import MEASURED
    from validation.modern.default_framework import heldout_cases
    from validation.modern.framework_table import FRAMEWORK_SETS

    assert set(MEASURED) == set(FRAMEWORK_SETS)  # each set's shipped rows are compared with a fresh run there
    shipped = {(r.set, r.row) for r in load()}
    expected = {(c.case_set, c.row) for name in FRAMEWORK_SETS for c in heldout_cases(name)}
    assert shipped == expected
    assert all(r.family == ("cnn" if r.set.startswith("cnn_") else "llm") for r in load())


def test_moe_only_fields_on_a_dense_model_are_noted_and_change_nothing():
    plain = json.loads(_cli(str(TORCHTITAN_H100), "--json").stdout)
    moe = json.loads(_cli(str(TORCHTITAN_H100), "--set", "parallelism.moe_dispatch=deepep",
                          "--set", "parallelism.overlap_moe_comm=true", "--json").stdout)
    assert moe["step_time_s"] == plain["step_time_s"] and moe["peak_memory_gib"] == plain["peak_memory_gib"]
    assert not plain.get("notes")
    (note,) = moe["notes"]
    assert "parallelism.overlap_moe_comm, parallelism.moe_dispatch act only on a mixture-of-experts model" in note
    # on an MoE model the fields act: no note
    mixtral = json.loads(_cli(str(ROOT / "examples" / "mixtral-8x7b-mxfp8-dgx-b200.yaml"),
                              "--set", "parallelism.moe_load_imbalance=1.2", "--json").stdout)
    assert not any("mixture-of-experts" in n for n in mixtral.get("notes", ()))


def _profile_run(tmp_path, file_name: str, fmt: str, batch: int) -> dict:
    scenario = tmp_path / f"{file_name}.yaml"
    scenario.write_text(yaml.safe_dump({
        "model": {"family": "profile", "name": file_name, "profile_batch": batch, "format": fmt,
                  "path": str(ROOT / "validation" / "data" / "profiles" / file_name)},
        "cluster": {"node": "dgx-a100-40g", "num_gpus": 8},
        "parallelism": {"dp": 8, "micro_batch_size": batch, "global_batch_size": 8 * batch},
        "training": {"precision": "fp32"}}))
    return json.loads(_cli(str(scenario), "--json").stdout)


def test_a_measured_profile_is_not_called_a_network_without_convolution(tmp_path):
    """A DAPPLE graph.txt of bare block names gives no kernels, so the warning must not say the network has no
    convolution (the session-9 audit's gap 10c), and a framework of the published rows that `training.framework`
    cannot name (DLE's TensorFlow rows) says so."""
    doc = _profile_run(tmp_path, "dapple_vgg-19-pbs-32.txt", "pipedream", 32)
    block = doc["default_framework"]["heldout_catalog_only"][0]
    assert block["family_note"].endswith("a measured profile names no kernels")
    warning = next(w for w in doc["warnings"] if w.startswith(PREFIX))
    assert "has no convolution" not in warning
    joined = " ".join(line.strip() for line in warning.split("\n"))
    assert ("dle-tf1-xla (NVIDIA DeepLearningExamples' CNN throughput, TensorFlow 1 XLA, no shipped "
            "training.framework profile)") in joined
    from hardware_specs.framework import framework_names

    unnamed = [s["framework"] for s in block["by_framework"] if s["framework"] not in framework_names()]
    assert joined.count("no shipped training.framework profile") == len(unnamed) >= 1


def test_a_profile_whose_layers_give_kernels_is_judged_by_them(tmp_path):
    """PipeDream's graph.txt names each layer's PyTorch module, so its kernels are known (session 10): VGG-16's
    convolutions make it a CNN like the held-out rows (no family note); GNMT's LSTMs make it a network without
    convolution, said as for a catalog GNMT."""
    vgg = _profile_run(tmp_path, "pipedream_vgg16_graph.txt", "pipedream", 128)
    assert "family_note" not in vgg["default_framework"]["heldout_catalog_only"][0]
    gnmt = _profile_run(tmp_path, "pipedream_gnmt_large_graph.txt", "pipedream", 128)
    assert gnmt["default_framework"]["heldout_catalog_only"][0]["family_note"].endswith(
        "this network has no convolution")


def test_a_calibrated_profile_of_the_users_machine_gets_no_default_framework_warning(tmp_path):
    """A ``cluster.profile`` written by ``clustersim calibrate`` prices the kernels from that machine's own
    microbenchmarks, so the held-out errors of the catalog constants do not describe the run (the session-10
    newcomer walk: ``clustersim compare`` on a harness trace printed them); a catalog node still warns."""
    scenario = tmp_path / "own.yaml"
    scenario.write_text(yaml.safe_dump({
        "model": "gpt3-5b", "cluster": {"profile": str(ROOT / "tests" / "data" / "harness" / "profile.yaml"),
                                        "num_gpus": 2},
        "parallelism": {"dp": 2, "micro_batch_size": 1, "global_batch_size": 2},
        "training": {"precision": "fp32"}}))
    own = json.loads(_cli(str(scenario), "--json").stdout)
    assert own.get("default_framework") is None
    assert not any(w.startswith(PREFIX) for w in own.get("warnings", ()))
    catalog = json.loads(_cli(str(scenario), "--set", "cluster.profile=null", "--set", "cluster.node=dgx-a100-80g",
                              "--json").stdout)
    assert any(w.startswith(PREFIX) for w in catalog["warnings"])
