"""Where the grouped-GEMM pricing of MoE experts comes from, per part (issue 23): torchtitan's grouped kernels
(torch._grouped_mm, torchao's MXFP8 grouped GEMM) were measured on B200 only (its sm100 build); Hopper does not carry
their level (validation/calibrate_microbench.py ``grouped_not_carried``): its experts are dense GEMMs, *assumed*,
and the spec and the output say why. The run's output says so per accelerator (simulator/cost/provenance.py
``grouped_gemm_kernels``), the Blackwell sanity table judges the like-for-like ratios, flags (exit 1) one out of
its parts' ratios, and prints one that sets a measured kernel against an assumed one as NOT JUDGED (no exit 1;
validation/blackwell_sanity.py), and the fit's level is relative to the dense curve at each row's own per-expert
shape (validation/calibrate_microbench.py ``grouped_level_by_row``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import kernel_gemm_efficiency
from simulator.cost.provenance import ASSUMED, CALIBRATED, DERIVED, grouped_gemm_kernels, provenance_state
from simulator.report.result import unwrap_table
from simulator.scenario import load_scenario
from validation import blackwell_sanity as bs
from validation.calibrate_microbench import (
    BLACKWELL,
    GROUPED_CARRY_PARTS,
    GROUPED_CARRY_RULE,
    HOPPER_PARTS,
    MIXTRAL_EXPERT_GEMM,
    fit_grouped,
    grouped_block,
    grouped_level_by_row,
    grouped_not_carried,
)

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL = str(ROOT / "examples" / "mixtral-8x7b-ep8-h100.yaml")


def _kernels(node: str, framework: str = "torchtitan", **training) -> list[dict]:
    sets = [f"cluster.node={node}", f"training.framework={framework}",
            *(f"training.{k}={v}" for k, v in training.items())]
    return grouped_gemm_kernels(load_scenario(MIXTRAL, sets))


def test_each_part_says_whether_its_grouped_kernel_was_measured():
    # H100: no Hopper measurement of torch._grouped_mm, and B200's level is not carried: dense, assumed, and why
    (h100,) = _kernels("dgx-h100")
    assert h100["state"] == ASSUMED and h100["accelerator"] == "h100-sxm-80g" and "level" not in h100
    assert not ACCELERATORS.get("h100-sxm-80g").efficiency.grouped_gemm
    assert h100["not_carried"].startswith("no Hopper measurement of torch._grouped_mm; B200's measured level "
                                          "(0.37 of dense) not carried: sm100 build")
    assert "not carried here: no Hopper measurement of torch._grouped_mm" in h100["note"]
    assert "measured kernel against an assumed one" in h100["note"]
    assert set(h100["parts_with_kernel"]) == set(BLACKWELL)
    (b200,) = _kernels("dgx-b200")
    entry = ACCELERATORS.get("b200").efficiency.grouped_gemm["bf16"]
    assert b200["state"] == CALIBRATED and b200["level"] == entry.level and b200["fitted_on"] == entry.fitted_on
    assert "not_carried" not in b200
    (gb200,) = _kernels("gb200-nvl72", precision="fp8", fp8_recipe="mxfp8")
    assert gb200["state"] == DERIVED and gb200["precision"] == "mxfp8"
    # per-tensor FP8 on B200: torch._scaled_grouped_mm's MXFP8 path carried (it was dense, and 1.43x MXFP8)
    (current,) = _kernels("dgx-b200", precision="fp8", fp8_recipe="current")
    mx = ACCELERATORS.get("b200").efficiency.grouped_gemm["mxfp8"]
    assert current["state"] == DERIVED and current["level"] == mx.level
    assert current["quantise_efficiency"] == mx.quantise_efficiency
    # ... but not to Hopper's per-tensor FP8 (the same reason printed)
    (h100_fp8,) = _kernels("dgx-h100", precision="fp8", fp8_recipe="current")
    assert h100_fp8["state"] == ASSUMED and "not carried: sm100 build" in h100_fp8["note"]
    # not carried: NVFP4 (no torchtitan grouped kernel known): dense on every part, but a recipe comparison on the
    # part is said to be uneven
    (k,) = _kernels("dgx-b200", precision="fp8", fp8_recipe="nvfp4")
    assert k["state"] == ASSUMED and k["parts_with_kernel"] == [], k
    assert "run a grouped kernel priced from rows" in k["note"] and "fp8_rowwise" in k["note"]
    (k,) = _kernels("dgx-h100", precision="fp8", fp8_recipe="blockwise")
    assert k["state"] == ASSUMED and k["parts_with_kernel"] == [] and "priced from rows" not in k["note"], k
    (mi300x,) = _kernels("mi300x-8")
    assert mi300x["state"] == ASSUMED and "measured kernel against an assumed one" in mi300x["note"]
    assert "not_carried" not in mi300x  # nothing was decided for AMD: plainly not measured
    # Megatron-Core (Transformer Engine's grouped GEMM) was measured nowhere: dense everywhere, nothing to set beside
    (core,) = _kernels("dgx-b200", framework="megatron-core")
    assert core["state"] == ASSUMED and core["parts_with_kernel"] == []
    (core,) = _kernels("dgx-h100", framework="megatron-core")
    assert "not_carried" not in core  # the reason is torchtitan's kernel's, not every framework's
    dense = load_scenario({"model": "llama3-8b", "cluster": {"node": "dgx-b200", "num_gpus": 8},
                           "training": {"framework": "torchtitan"}})
    assert grouped_gemm_kernels(dense) == []  # no MoE, nothing to say


def test_the_carried_entries_name_the_rows_and_the_rule():
    """Every carried entry (per-tensor / rowwise FP8 on Blackwell) is the B200 MXFP8 fit (level, per-group cost,
    quantisation share) with its rows, marked derived by the rule; no end-to-end row is named (none of torchtitan's
    MoE runs is in the data). The Hopper parts (and the H100 PCIe derived from H100 SXM) hold no grouped entry and
    say why, in the words the module writes."""
    fits = fit_grouped()
    assert set(GROUPED_CARRY_PARTS) == set(BLACKWELL)
    for name in GROUPED_CARRY_PARTS:
        grouped = ACCELERATORS.get(name).efficiency.grouped_gemm
        for key in ("fp8", "fp8_rowwise"):
            f = fits["mxfp8"]
            e = grouped[key]
            assert (e.level, e.per_group_us, e.quantise_efficiency) == (f.level, f.per_group_us, f.quantise_efficiency)
            assert e.fitted_on.startswith(f.fitted_on) and e.fitted_on.endswith("(derived by rule from b200)")
            assert e.source == GROUPED_CARRY_RULE and e.frameworks == ["torchtitan"]
            assert provenance_state(e.fitted_on)[0] == DERIVED
    reason = grouped_not_carried()
    assert f"({fits['bf16'].level:.2f} of dense) not carried: sm100 build" in reason
    for name in (*HOPPER_PARTS, "h100-pcie-80g"):
        eff = ACCELERATORS.get(name).efficiency
        assert not eff.grouped_gemm and grouped_block(name) == {}, name
        assert eff.grouped_gemm_not_carried == {"torchtitan": reason}, name
    assert grouped_block("mi300x") == {} and not ACCELERATORS.get("a100-sxm-80g").efficiency.grouped_gemm
    assert not ACCELERATORS.get("b200").efficiency.grouped_gemm_not_carried


def test_the_text_output_prints_the_grouped_kernel_of_each_part():
    for node, words in (("dgx-h100", "h100-sxm-80g bf16, torchtitan: no torchtitan grouped-GEMM kernel was measured "
                                     "on h100-sxm-80g in bf16 or carried to it: the experts run as dense GEMMs of one "
                                     "expert's shape (assumed) -- not carried here: no Hopper measurement of "
                                     "torch._grouped_mm; B200's measured level (0.37 of dense) not carried: sm100 "
                                     "build"),
                        ("dgx-b200", "b200 bf16, torchtitan: torch._grouped_mm"),
                        ("mi300x-8", "mi300x bf16, torchtitan: no torchtitan grouped-GEMM kernel was measured")):
        out = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", MIXTRAL, "--set",
                              f"cluster.node={node}", "--set", "training.framework=torchtitan"],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        line = next(x for x in unwrap_table(out.stdout) if x.startswith("  grouped GEMM"))
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


def _row(ratio, dense=2.1, state="calibrated", h100="derived", low=1.77, high=2.39, **extra) -> dict:
    return {"ratio_vs_h100": ratio, "ratio_both_dense": dense, "grouped": state, "grouped_h100": h100,
            "parts_min": low, "parts_max": high, "part": "B200", **extra}


@pytest.mark.parametrize(("row", "verdict"), [
    (_row(2.1), "consistent"),
    (_row(2.1, h100="assumed"), bs.NOT_JUDGED),                   # within the parts, but not like for like
    (_row(0.97, 2.12, h100="assumed"), bs.NOT_JUDGED),            # B200 BF16 against H100's dense experts today
    (_row(5.0, 2.12, h100="assumed"), bs.NOT_JUDGED),             # not judged either way
    (_row(0.97, 2.12, state="assumed", h100="assumed"), "FLAG ratio<parts"),  # both assumed: nothing explains it
    (_row(0.97, 2.12), "FLAG ratio<parts"),                      # like for like and still slower: a failure
    (_row(2.9, 2.9, state="assumed", h100="assumed"), "FLAG ratio>parts"),
    # MXFP8 over H100's per-tensor FP8: the like-for-like FP8 ratio times the part's own recipe gain
    (_row(2.58, recipe_gain=1.15, ratio_like_for_like=2.25, high=2.45), "consistent: 2.58x"),
    (_row(2.58, recipe_gain=1.15, ratio_like_for_like=1.5, high=2.45), "FLAG ratio<parts"),
    (_row(3.5, recipe_gain=1.9, ratio_like_for_like=2.25, high=2.45), "FLAG recipe-gain"),
    # across parts not judged, the part's own recipe gain still is
    (_row(1.43, h100="assumed", recipe_gain=1.15, ratio_like_for_like=1.24, high=2.45), bs.NOT_JUDGED),
    (_row(1.43, h100="assumed", recipe_gain=1.9, ratio_like_for_like=1.24, high=2.45), "FLAG recipe-gain"),
])
def test_a_ratio_out_of_its_parts_is_flagged_and_asymmetric_evidence_not_judged(row, verdict):
    assert bs._titan_verdict(row).startswith(verdict)


def test_torchtitan_mixtral_b200_over_h100_is_not_judged_while_h100_is_assumed():
    """H100's experts are dense (assumed; B200's torch._grouped_mm level not carried), B200's run the measured
    kernel: each Blackwell ÷ H100 ratio is printed as NOT JUDGED, with the both-dense bracket beside it (like for
    like, within the parts' ratios), and the module's exit code does not count them."""
    t = bs.titan_moe_table()
    rows = t[t.part != "H100"]
    assert (t[t.part == "H100"].grouped == ASSUMED).all() and (rows.grouped != ASSUMED).all()
    assert (rows.grouped_h100 == ASSUMED).all()
    assert rows.verdict.str.startswith(bs.NOT_JUDGED).all(), rows.verdict.tolist()
    b200 = rows[(rows.part == "B200") & (rows.precision == "BF16")].iloc[0]
    assert b200.ratio_vs_h100 < 1 < b200.ratio_both_dense  # the measured kernel against a dense H100: not judged
    assert b200.parts_min / bs.RATIO_MARGIN <= b200.ratio_both_dense <= b200.parts_max * bs.RATIO_MARGIN
    h100 = t[(t.part == "H100") & (t.precision == "BF16")].iloc[0]
    assert h100.mfu > 0.3  # 270,013 tokens/s (35.4%), not 118,370 (15.5%) as with B200's level carried
    assert "6 of 6 not judged (evidence asymmetric: one side measured, one assumed" in bs.titan_summary(t)


def test_not_judged_rows_leave_the_exit_code_to_the_judged_ones(monkeypatch, capsys):
    """A NOT JUDGED torchtitan row prints and exits 0; a judged one out of its parts still exits 1."""
    import pandas as pd

    tflops = {"H100": 300.0, "B200": 600.0, "GB200": 660.0}  # the dense table within every part ratio
    monkeypatch.setattr(bs, "simulate_run", lambda raw, part, training: {"model_tflops_per_gpu": tflops[part],
                                                                          "fits": True})
    base = {"run": "Mixtral 8x7B", "precision": "BF16", "tflops": 300.0, "mfu": 0.15}
    h100 = {**base, "part": "H100", "grouped": "assumed"}

    def titan(row):
        return lambda: pd.DataFrame([h100, {**base, **row, "verdict": bs._titan_verdict(row)}])

    monkeypatch.setattr(bs, "titan_moe_table", titan(_row(0.97, 2.12, h100="assumed")))
    assert bs.main([]) == 0
    out = capsys.readouterr().out
    assert f"{bs.NOT_JUDGED}: torchtitan Mixtral 8x7B BF16 on B200" in out and out.rstrip().endswith("CONSISTENT")
    monkeypatch.setattr(bs, "titan_moe_table", titan(_row(0.97, 2.12)))  # like for like and slower: judged
    assert bs.main([]) == 1
    out = capsys.readouterr().out
    assert "FLAG ratio<parts" in out and out.rstrip().endswith("FLAGGED")


B200_PARTS = {"gemm_bf16": 2.20, "gemm_fp8": 2.45, "attention": 1.87, "hbm": 2.39, "nvls_all_reduce": 1.77,
              "nvlink_p2p": 1.98}


@pytest.mark.parametrize(("ratio", "same_fabric", "nic", "flags"), [
    (2.15, True, None, []),
    (2.6, True, None, ["ratio>parts"]),
    (2.6, False, None, []),                     # IB -> NVLink: no upper bound holds
    (1.5, True, None, ["ratio<parts"]),         # one node: slower than every part it is made of
    (1.5, True, 1.0, []),                       # across nodes: the NICs are the same 400 Gb/s per GPU
    (0.9, False, 1.0, ["ratio<parts"]),         # slower than H100 although no part is
])
def test_the_dense_table_flags_a_ratio_out_of_its_parts_either_way(ratio, same_fabric, nic, flags):
    assert bs.part_flags(ratio, B200_PARTS, "bf16", same_fabric, nic) == flags
    assert bs.nic_ratio("B200") == 1.0
