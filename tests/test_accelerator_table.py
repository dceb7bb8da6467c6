"""The table per accelerator in docs/validation.md (issue 23: "calibrated on what, held-out error, and what is still assumed") is
the output of validation/modern/by_accelerator.py and has a row for every catalog accelerator.

The end-to-end column reads the cached per-row errors (validation/modern/heldout_errors.csv): simulating the
~1,100 held-out rows takes ~40 CPU-s, so this file does not; tests/test_modern_validation.py,
tests/test_derived_parts.py and tests/test_validation_published.py compare the cache with the errors their own
runs compute (``test_cached_*_errors_are_current``), so a change that moves a figure fails there until
``python -m validation.modern.by_accelerator --write`` rewrites the cache and this table. Everything else
(provenance states, framework entries, microbenchmark halves) is computed here, ~3 CPU-s.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hardware_specs.catalog import ACCELERATORS
from validation.modern import by_accelerator as table
from validation.modern.registry import SETS
from validation.published_cases import CASE_SETS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def doc_rows() -> dict[str, list[str]]:
    lines = table.doc_table().splitlines()
    assert lines[0].startswith("| accelerator |") and set(lines[1]) <= set("|-")
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:])}


def test_every_catalog_accelerator_has_one_row(doc_rows):
    assert sorted(doc_rows) == sorted(ACCELERATORS.names())
    assert len(doc_rows) >= 28
    assert all(len(cells) == len(table.HEADER) for cells in doc_rows.values())


def test_the_doc_table_is_the_generators_output():
    # end to end, as docs/validation.md says to run it
    done = subprocess.run([sys.executable, "-m", "validation.modern", "--by-accelerator"], capture_output=True,
                          text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip("\n") == table.doc_table(), (
        "docs/validation.md's accelerator table differs from `python -m validation.modern --by-accelerator`: run "
        "`python -m validation.modern.by_accelerator --doc` (or `--write` where a figure moved)")


def test_cache_holds_every_set_and_line():
    rows = table.load_cache()
    assert {r["set"] for r in rows} == set(SETS) | set(CASE_SETS)
    assert {r["set"] for r in rows if r["line"] == table.DERIVED_LINE} == {"cnn_dle", "cnn_lambda"}
    assert len({(r["set"], r["line"], r["row"]) for r in rows}) == len(rows)


def test_a_part_without_published_rows_says_none(doc_rows):
    # no training run on these parts is in the data: the cell says so, it does not borrow a sibling's figure
    for part in ("t4", "l4", "a10g", "a40", "rtx-3090", "rtx-4090", "gtx-1080ti", "rtx-2080ti", "mi250x-gcd",
                 "v100-pcie-16g", "b200", "b300", "gb200", "gb300", "h800-sxm-80g", "mi325x", "mi355x"):
        assert doc_rows[part][4] == "none", part
    # the derived boards carry only their own derived-parts rows
    assert doc_rows["h100-pcie-80g"][4].startswith("cnn_lambda derived-parts line n=12 ")
    assert "cnn_dle derived-parts line n=16 " in doc_rows["v100-sxm-32g"][4]


def test_end_to_end_cell_counts_a_variant_under_its_part_and_names_it():
    rows = [{"set": "torchtitan", "line": table.SET_LINE, "row": i, "accelerator": "h100-96g-500w",
             "precision": p, "relative_error": e, "fits": True}
            for i, (p, e) in enumerate((("bf16", 0.1), ("bf16", -0.3), ("fp8", 0.2)))]
    rows.append({"set": "nemo", "line": table.SET_LINE, "row": 0, "accelerator": "h100-sxm-80g",
                 "precision": "fp8", "relative_error": -0.05, "fits": False})
    rows.append({"set": "nemo", "line": table.SET_LINE, "row": 1, "accelerator": "h100-sxm-80g",
                 "precision": "fp8", "relative_error": None, "fits": False})
    assert table.end_to_end_cell("h100-sxm-80g", rows) == (
        "nemo n=1 5.0 / 5.0% (1 predicted OOM) (1 not simulated); torchtitan (on h100-96g-500w) n=3 20.0 / 30.0% "
        "(bf16 n=2 20.0 / 30.0%, fp8 n=1 20.0 / 20.0%)")
    assert table.end_to_end_cell("h200-sxm-141g", rows) == "none"


def test_states_come_from_the_specs(doc_rows):
    # derived from the sibling, by the spec's own marker; never listed as calibrated
    assert "b200 x 1.00" in doc_rows["b300"][2] and doc_rows["b300"][1] == "none"
    # measured nowhere: the part's GEMM curves and collectives are assumed
    assert "gemm (fp16, fp32)" in doc_rows["t4"][6] and "intra_node_collectives (g4dn-12xlarge)" in doc_rows["t4"][6]
    # a constant measured for some runs only: where it is, and assumed otherwise (B200's grouped kernel: torchtitan)
    assert "grouped_gemm in bf16 torchtitan: gemm_microbench.csv" in doc_rows["b200"][1]
    assert "grouped_gemm otherwise" in doc_rows["b200"][6]
    # no grouped kernel measured on Hopper and B200's not carried there: assumed for every framework, none derived
    assert "grouped_gemm" not in doc_rows["h100-sxm-80g"][2] and "b200 by rule" not in doc_rows["h100-sxm-80g"][2]
    assert "grouped_gemm," in doc_rows["h100-sxm-80g"][6]
    assert "grouped_gemm," in doc_rows["a100-sxm-80g"][6]  # nothing carried outside Hopper and Blackwell
    # a framework profile entry fitted on the part's rows is named with its rows
    assert "megatron-deepspeed fp16 (783 fit-half rows of vtrain2024_ground_truth_single.csv" in doc_rows["a100-sxm-80g"][1]


def test_provenance_matches_what_simulate_reports():
    from simulator.cost.provenance import ASSUMED, efficiency_provenance
    from simulator.scenario import load_scenario

    scenario = load_scenario({"model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "num_gpus": 16},
                              "training": {"precision": "bf16"}})
    provenance = efficiency_provenance(scenario)
    part = table.part_provenance("h100-sxm-80g")
    assert provenance.pop("framework_factors") == ASSUMED  # no framework named; the table lists profiles apart
    for component, where in provenance.items():
        key = f"{component}[dgx-h100]" if component in table.NODE_COMPONENTS else component
        if where == ASSUMED:
            assert key in part.assumed, component
        else:
            assert key in part.calibrated or key in part.derived or key in part.stated, component


@pytest.mark.parametrize(("where", "short"), [
    ("validation/data/microbench/gemm_microbench.csv rows 6", "gemm_microbench.csv row 6"),
    ("validation/data/microbench/collectives_bandwidth.csv rows 44,48,56,58", "collectives_bandwidth.csv (4 rows)"),
    ("validation/data/korthikanti2022_table4_layer_times.csv rows 'Baseline no recompute', 'Sequence Parallelism' "
     "(22B layer, TP=8)", "korthikanti2022_table4_layer_times.csv (2 rows)"),
    ("llmfoundry_throughput.csv (validation/data/), fit half (md5 of the row key even): 40 rows (llmfoundry:139)",
     "llmfoundry_throughput.csv (40 fit-half rows)"),
])
def test_short_source(where, short):
    assert table.short_source(where) == short


def test_stale_rows_name_every_difference():
    cached = [{"set": "s", "line": table.SET_LINE, "row": r, "accelerator": "a", "precision": "bf16",
               "relative_error": e, "fits": True} for r, e in ((1, 0.1), (2, -0.2), (3, None))]
    assert table.stale_rows("s", table.SET_LINE, [(1, 0.10004, True), (2, -0.2, None), (3, None, True)], cached) == []
    stale = table.stale_rows("s", table.SET_LINE, [(1, 0.1003, True), (2, -0.2, False), (4, 0.0, True)], cached)
    assert [m.split(":")[0] for m in stale] == ["s set row 1", "s set row 2", "s set row 4", "s set row 3"]
