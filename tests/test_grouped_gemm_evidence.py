"""Where the grouped-GEMM pricing of MoE experts comes from, per part (issue 23): torchtitan's grouped kernels
(torch._grouped_mm, torchao's MXFP8 grouped GEMM) were measured on B200 only, H100's are priced dense (assumed).
The run's output says so per accelerator (simulator/cost/provenance.py ``grouped_gemm_kernels``), the Blackwell
sanity table says a B200 / H100 ratio of such a run sets a measured kernel against an assumed one
(validation/blackwell_sanity.py), and the fit's level is relative to the dense curve at each row's own per-expert
shape (validation/calibrate_microbench.py ``grouped_level_by_row``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import kernel_gemm_efficiency
from simulator.cost.provenance import ASSUMED, CALIBRATED, DERIVED, grouped_gemm_kernels
from simulator.scenario import load_scenario
from validation import blackwell_sanity as bs
from validation.calibrate_microbench import MIXTRAL_EXPERT_GEMM, fit_grouped, grouped_level_by_row

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL = str(ROOT / "examples" / "mixtral-8x7b-ep8-h100.yaml")


def _kernels(node: str, framework: str = "torchtitan", **training) -> list[dict]:
    sets = [f"cluster.node={node}", f"training.framework={framework}",
            *(f"training.{k}={v}" for k, v in training.items())]
    return grouped_gemm_kernels(load_scenario(MIXTRAL, sets))


def test_each_part_says_whether_its_grouped_kernel_was_measured():
    (h100,) = _kernels("dgx-h100")
    assert h100["state"] == ASSUMED and h100["accelerator"] == "h100-sxm-80g"
    assert "b200" in h100["parts_with_kernel"] and "measured kernel against an assumed one" in h100["note"]
    (b200,) = _kernels("dgx-b200")
    entry = ACCELERATORS.get("b200").efficiency.grouped_gemm["bf16"]
    assert b200["state"] == CALIBRATED and b200["level"] == entry.level and b200["fitted_on"] == entry.fitted_on
    (gb200,) = _kernels("gb200-nvl72", precision="fp8", fp8_recipe="mxfp8")
    assert gb200["state"] == DERIVED and gb200["precision"] == "mxfp8"
    # Megatron-Core (Transformer Engine's grouped GEMM) was measured nowhere: dense everywhere, nothing to set beside
    (core,) = _kernels("dgx-b200", framework="megatron-core")
    assert core["state"] == ASSUMED and core["parts_with_kernel"] == []
    dense = load_scenario({"model": "llama3-8b", "cluster": {"node": "dgx-b200", "num_gpus": 8},
                           "training": {"framework": "torchtitan"}})
    assert grouped_gemm_kernels(dense) == []  # no MoE, nothing to say


def test_the_text_output_prints_the_grouped_kernel_of_each_part():
    for node, words in (("dgx-h100", "h100-sxm-80g bf16, torchtitan: no torchtitan grouped-GEMM kernel was measured"),
                        ("dgx-b200", "b200 bf16, torchtitan: torch._grouped_mm")):
        out = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", MIXTRAL, "--set",
                              f"cluster.node={node}", "--set", "training.framework=torchtitan"],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        line = next(x for x in out.stdout.splitlines() if x.startswith("  grouped GEMM"))
        assert words in line


def test_the_fitted_level_is_over_the_dense_curve_at_each_rows_own_per_expert_shape():
    rows = grouped_level_by_row()
    b200, level = ACCELERATORS.get("b200"), fit_grouped()["bf16"].level
    for r in rows.itertuples():  # the curve the fit divides by is the simulator's at the row's per-group GEMM
        assert r.dense_eff == pytest.approx(kernel_gemm_efficiency(b200, r.tokens_per_group, r.n, r.k, "bf16"),
                                            abs=1e-4)
    fit = rows[rows.half == "fit"]
    assert fit.implied_level.min() - 0.01 <= level <= fit.implied_level.max() + 0.01
    # Mixtral's busiest expert GEMM is inside the rows' per-group sizes: the level is not extrapolated in size
    m, n, k = MIXTRAL_EXPERT_GEMM
    assert rows.group_gflop.min() < 2.0 * m * n * k / 1e9 < rows.group_gflop.max()


def _row(ratio, dense, grouped=None, state="calibrated", h100="assumed", low=1.77, high=2.39) -> dict:
    return {"ratio_vs_h100": ratio, "ratio_both_dense": dense, "ratio_both_grouped": grouped, "grouped": state,
            "grouped_h100": h100, "parts_min": low, "parts_max": high, "part": "B200"}


@pytest.mark.parametrize(("row", "verdict"), [
    (_row(2.1, 2.1, 2.2), "consistent"),
    (_row(0.97, 2.12, 2.21), "measured-vs-assumed"),           # B200 slower only as a user gets it
    (_row(0.97, 2.12, 2.21, state="assumed"), "FLAG ratio<parts"),   # both assumed: nothing explains it
    (_row(0.97, 1.2, 2.21), "FLAG ratio<parts"),              # like for like is out of the parts' ratios too
    (_row(2.9, 2.9, None, state="assumed"), "FLAG ratio>parts"),
])
def test_a_ratio_out_of_its_parts_is_flagged_unless_the_evidence_asymmetry_explains_it(row, verdict):
    assert bs._titan_verdict(row).startswith(verdict)


def test_torchtitan_mixtral_on_b200_is_slower_than_h100_only_against_an_assumed_h100_kernel():
    t = bs.titan_moe_table()
    b200 = t[(t.part == "B200") & (t.precision == "BF16")].iloc[0]
    assert b200.ratio_vs_h100 < 1 and b200.verdict.startswith("measured-vs-assumed")
    assert b200.parts_min <= b200.ratio_both_dense <= b200.parts_max * bs.RATIO_MARGIN
    assert not t.verdict.fillna("").str.startswith("FLAG").any()
