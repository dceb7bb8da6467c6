"""validation/blackwell_sanity.py --other-parts: the same NeMo H100 runs on H200, MI300X and MI355X beside H100
(issue 23's audit of predictions from specs and microbenchmarks alone; printed, not judged)."""

from __future__ import annotations

from validation import blackwell_sanity as bs


def test_table_ratios_precisions_and_measured_gemm_ratio(monkeypatch):
    tflops = {"dgx-h100": 400.0, "hgx-h200": 420.0, "mi300x-8": 320.0, "mi355x-8": 800.0}
    monkeypatch.setattr(bs, "_other_run", lambda raw, node, training: {
        "model_tflops_per_gpu": tflops[node] * (2 if training["precision"] == "fp8" else 1),
        "tokens_per_s": 8000.0, "fits": True})
    t = bs.other_parts_table([("Llama3 8B", ("nemo", 66))]).set_index(["precision", "part"])
    assert t.loc[("BF16", "MI300X"), "ratio_vs_h100"] == 0.8
    assert t.loc[("FP8", "MI355X"), "ratio_vs_h100"] == 2.0
    assert t.loc[("MXFP8", "MI355X"), "ratio_vs_h100"] == 2.0        # over H100's per-tensor FP8
    assert {p for (prec, p) in t.index if prec == "MXFP8"} == {"MI355X"}  # CDNA4's MX formats; Hopper and CDNA3 none
    assert t.loc[("BF16", "MI300X"), "gemm_mamf_ratio"] == round(668.4 / 794.5, 2)   # MAMF rows 13 / 6
    assert t.loc[("FP8", "H200"), "gemm_mamf_ratio"] == round(1453.4 / 1402.6, 2)    # rows 19 / 21
    assert t.loc[("BF16", "H200"), "tokens_per_s_per_gpu"] == 1000.0               # 8,000 over 8 GPUs


def test_amd_runs_leave_cudnn_to_the_parts_default():
    # NeMo's rows name cuDNN fused attention (NVIDIA's library): an AMD part would be refused (exit 2) with it
    raw = bs._h100_scenario(("nemo", 66))
    assert raw["training"]["attention_kernel"] == "cudnn"
    result = bs._other_run(raw, "mi300x-8", {"precision": "bf16"})
    assert result["fits"] and 0 < result["model_tflops_per_gpu"] < 668.4  # below MI300X's best GEMM (MAMF row 13)
    assert raw["training"]["attention_kernel"] == "cudnn"  # the H100 scenario is not changed
