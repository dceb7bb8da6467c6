"""Fused attention kernels: the A100 FlashAttention-2 and Triton FlashAttention and Hopper
FlashAttention-3 specs, their per-shape held-out errors, and ``training.attention_kernel`` (FA3 only
where it runs, exit 2 elsewhere)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import validation.calibrate_microbench as cm
from hardware_specs.catalog import ACCELERATORS
from simulator.cost.attention_kernel import with_attention_kernel
from simulator.cost.compute import ComputeModel
from simulator.cost.provenance import efficiency_provenance
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from workloads.graph import Op

ROOT = Path(__file__).resolve().parents[1]
ATTENTION_MEDIAN, ATTENTION_MAX = 0.06, 0.35  # as tests/test_microbench_calibration.py


def _scenario(node: str, **training) -> dict:
    return {"model": "llama3-8b", "cluster": {"node": node, "num_gpus": 8},
            "parallelism": {"tp": 1, "pp": 1, "global_batch_size": 8, "micro_batch_size": 1, "zero_stage": 3},
            "training": {"seq_length": 8192, **training}}


def test_specs_hold_the_fits():
    # the written blocks are the fits (python -m validation.calibrate_microbench --write), not hand edits
    fa3 = cm.fit_fa3()
    for name in cm.FA3_ACCELERATORS:
        assert ACCELERATORS.get(name).efficiency.attention_kernels["fa3"] == fa3
    for name, source in cm.ATTENTION_ONLY.items():  # A100: FlashAttention-2 and Triton as options, not the default
        eff = ACCELERATORS.get(name).efficiency
        assert eff.attention is None
        assert set(eff.attention_kernels) == set(cm.ATTENTION_ONLY_KERNELS) == {"fa2", "triton"}
        for key, kernel in cm.ATTENTION_ONLY_KERNELS.items():
            assert eff.attention_kernels[key].model_dump(exclude={"assumed"}) == cm.attention_block(source, kernel)


def test_fa3_fit_uses_fit_rows_only_and_says_what_is_assumed():
    fa3 = cm.fit_fa3()
    used = {int(r) for r in fa3.fitted_on.rsplit(" ", 1)[1].split(",")}
    assert used == {r.row + 2 for r in cm.fa3_rows(heldout=False)}
    assert not used & {r.row + 2 for r in cm.fa3_rows(heldout=True)}
    assert set(fa3.assumed) == {"bwd_efficiency", "half_seq_len"}
    assert fa3.fwd_efficiency > ACCELERATORS.get("h100-sxm-80g").efficiency.attention.fwd_efficiency


def test_heldout_table_has_every_kernel_per_shape_within_tolerance():
    table = cm.attention_heldout_table()
    assert set(zip(table.accelerator, table.kernel, strict=True)) == {
        ("a100-sxm-80g", "FlashAttention-2"), ("h100-sxm-80g", "FlashAttention-2"),
        ("h100-sxm-80g", "FlashAttention-3")}
    fa3 = table[table.kernel == "FlashAttention-3"]
    assert len(fa3) == 3 and set(fa3.head_dim) == {128}
    assert fa3.error.abs().max() <= ATTENTION_MAX, fa3.to_string()
    for _, group in table.groupby("accelerator"):
        assert group.error.abs().median() <= ATTENTION_MEDIAN, group.to_string()


def _fwd_bwd_row_against_its_passes(kernel: str) -> pd.Series:
    """How far each fwd+bwd row of ``kernel`` on A100 lies from its own shape's fwd and bwd rows
    combined (time adds: 3.5 / (1/fwd + 2.5/bwd)): the transcription's own consistency."""
    df = pd.read_csv(ROOT / "validation/data/microbench/attention_kernels.csv")
    rows = df[(df.kernel == kernel) & (df.gpu == cm.A100_KERNEL_GPU)]
    p = rows.pivot_table(index=["causal", "head_dim", "seq_len"], columns="pass", values="achieved_tflops")
    return (p["fwd+bwd"] / (3.5 / (1 / p["fwd"] + 2.5 / p["bwd"])) - 1).abs()


def test_triton_heldout_within_what_its_transcription_agrees_with_itself():
    # The FA2 paper's Triton bars (Figs 4-6) as transcribed: a fwd+bwd row differs from the fwd and bwd
    # rows of its own shape by a median 15% (FlashAttention-2's rows: 3.5%), so no model of the kernel
    # can be held closer than that; the fit must not be further off than the data's own disagreement.
    triton = cm.triton_heldout_table()
    assert len(triton) >= 30 and set(triton.accelerator) == {"a100-sxm-80g"}
    fit = cm.fit_attention(cm.TRITON_KERNEL, cm.A100_KERNEL_GPU, 312.0)  # fitted on the fit half only
    assert not set(fit.rows) & set(triton.row)
    assert _fwd_bwd_row_against_its_passes("FlashAttention-2").median() < 0.05
    assert triton.error.abs().median() <= _fwd_bwd_row_against_its_passes(cm.TRITON_KERNEL).median(), \
        triton.to_string()


def test_triton_runs_at_about_half_flashattention2_on_a100():
    # the paper's point (Dao 2023 Figs 4-6): FA2 is ~2x the Triton kernel; MPT-30B's head shape at 8K, causal
    eff = ACCELERATORS.get("a100-sxm-80g").efficiency.attention_kernels
    for pass_ in ("fwd", "bwd"):
        ratio = eff["triton"].efficiency(pass_, 8192, 112, True) / eff["fa2"].efficiency(pass_, 8192, 112, True)
        assert 0.35 < ratio < 0.7, (pass_, ratio)


def test_fa3_kernel_prediction_is_above_its_in_step_measurement():
    # the H200 row is FA3's share of a measured Llama-3.1-8B step: a kernel benchmark (the spec) can
    # only be faster than the same kernel inside a step, and not by much
    row = cm.in_step_table().set_index("accelerator").loc["h200-sxm-141g"]
    assert row.priced_with == "FlashAttention-3"
    assert 0.0 <= row.error <= 0.25


def test_fa3_prices_flash_ops_with_its_own_spec():
    h100 = ACCELERATORS.get("h100-sxm-80g")
    fa3 = with_attention_kernel(h100, "fa3", "flash")
    spec = fa3.efficiency.attention
    assert spec.kernel == "FlashAttention-3"
    s, d, heads = 16384, 128, 16
    flops = 4.0 * s * s * d * heads
    op = Op("flash_attention", "attention", flops, 0, s, s, d, heads)
    launch_s = h100.efficiency.kernel_launch_overhead_us * 1e-6
    seconds = ComputeModel(fa3, "bf16").time_s(op) - launch_s
    assert seconds == pytest.approx(flops / (989e12 * spec.efficiency("fwd", s, d, False)))
    assert seconds < ComputeModel(h100, "bf16").time_s(op) - launch_s  # faster than FA2
    # auto and fa2 keep the default kernel (FlashAttention-2) on Hopper
    assert with_attention_kernel(h100, "auto", "flash") is h100
    assert with_attention_kernel(h100, "fa2", "flash") is h100


def test_fa3_scenario_runs_faster_on_hopper_and_lists_its_assumptions():
    from simulator.simulate import simulate_point

    fa2 = load_scenario(_scenario("dgx-h100"))
    fa3 = load_scenario(_scenario("dgx-h100", attention_kernel="fa3"))
    assert fa3.accelerator.efficiency.attention.kernel == "FlashAttention-3"
    assert fa2.accelerator.efficiency.attention.kernel == "FlashAttention-2"
    prov = efficiency_provenance(fa3)
    assert prov["attention_kernel.bwd_efficiency"] == "assumed"
    assert "rows 409" in prov["attention_kernel"]
    t2 = simulate_point(_scenario("dgx-h100"))["step_time_s"]
    t3 = simulate_point(_scenario("dgx-h100", attention_kernel="fa3"))["step_time_s"]
    assert t3 < t2


def test_fa2_on_a100_is_the_measured_kernel_and_auto_the_fallback():
    fa2 = load_scenario(_scenario("dgx-a100-80g", attention_kernel="fa2"))
    assert fa2.accelerator.efficiency.attention.kernel == "FlashAttention-2"
    assert "attention_kernels.csv rows 16," in efficiency_provenance(fa2)["attention_kernel"]
    auto = load_scenario(_scenario("dgx-a100-80g"))
    assert auto.accelerator.efficiency.attention is None
    assert efficiency_provenance(auto)["attention_efficiency_factor"] == "assumed"


@pytest.mark.parametrize("kernel", ["fa2", "triton"])
def test_a_kernel_without_a_measurement_keeps_the_assumed_fallback(kernel):
    sc = load_scenario(_scenario("mi300x-8", attention_kernel=kernel))
    assert sc.accelerator.efficiency.attention is None
    assert efficiency_provenance(sc)["attention_efficiency_factor"] == "assumed"


def test_triton_on_a100_is_its_measured_kernel_and_slower_than_fa2():
    from simulator.simulate import simulate_point

    triton = load_scenario(_scenario("dgx-a100-80g", attention_kernel="triton"))
    assert triton.accelerator.efficiency.attention.kernel == "FlashAttention Triton"
    assert "attention_kernels.csv rows 5," in efficiency_provenance(triton)["attention_kernel"]
    t_triton = simulate_point(_scenario("dgx-a100-80g", attention_kernel="triton"))["step_time_s"]
    t_fa2 = simulate_point(_scenario("dgx-a100-80g", attention_kernel="fa2"))["step_time_s"]
    assert t_triton > t_fa2
    # on Hopper no Triton row was measured: the fallback, listed as assumed
    h100 = load_scenario(_scenario("dgx-h100", attention_kernel="triton"))
    assert h100.accelerator.efficiency.attention is None


@pytest.mark.parametrize("node, training, words", [
    ("dgx-a100-80g", {"attention_kernel": "fa3"}, "FlashAttention-3 runs on Hopper"),
    ("dgx-b200", {"attention_kernel": "fa3"}, "FlashAttention-3 runs on Hopper"),
    ("dgx-h100", {"attention_kernel": "fa3", "attention": "standard"}, "needs training.attention: flash"),
    ("dgx-a100-80g", {"attention_kernel": "triton", "attention": "standard"}, "needs training.attention: flash"),
])
def test_a_kernel_where_it_cannot_run_is_an_error(node, training, words):
    with pytest.raises(ConfigError) as err:
        load_scenario(_scenario(node, **training))
    assert err.value.field == "training.attention_kernel" and words in err.value.reason


@pytest.mark.parametrize(("node", "kernel", "words"), [
    ("dgx-a100-80g", "fa3", "FlashAttention-3 runs on Hopper"),
    ("mi300x-8", "cudnn", "cuDNN fused attention is NVIDIA's library and runs on NVIDIA GPUs only; mi300x (vendor "
                          "amd) has no cuDNN fused attention kernel (use auto, fa2 or triton)"),
])
def test_cli_exits_2_in_one_line_naming_the_field(tmp_path, node, kernel, words):
    path = tmp_path / f"{kernel}-{node}.yaml"
    path.write_text(f"model: llama3-8b\ncluster: {{node: {node}, num_gpus: 8}}\n"
                    "parallelism: {tp: 1, global_batch_size: 8, micro_batch_size: 1}\n"
                    f"training: {{attention_kernel: {kernel}}}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(path)], capture_output=True,
                          text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: training.attention_kernel: ")
    assert words in lines[0]


@pytest.mark.parametrize(("kernel", "head_dim", "compiled"), [
    ("FlashAttention-2", 112, 128), ("FlashAttention-2", 80, 96), ("FlashAttention-2", 128, 128),
    ("FlashAttention-2", 72, 96), ("FlashAttention Triton", 80, 128), ("FlashAttention Triton", 96, 128),
    ("FlashAttention-3", 112, 128), ("FlashAttention-3", 160, 192), ("cuDNN fused attention", 112, 112)])
def test_a_head_size_runs_the_next_compiled_kernel(kernel, head_dim, compiled):
    from hardware_specs.schema import kernel_head_dim

    assert kernel_head_dim(kernel, head_dim) == compiled


def test_a_padded_head_runs_the_larger_kernel_at_its_rate_on_the_padded_flops():
    # MPT-30B's heads of 112 run FlashAttention-2's 128 kernel: the same time as heads of 128 doing the same
    # work per head, so 128/112 of the time of its counted FLOPs at the 128 kernel's rate
    h100 = ACCELERATORS.get("h100-sxm-80g")
    spec = h100.efficiency.attention
    assert spec.efficiency("fwd", 8192, 112, True) == pytest.approx(spec.efficiency("fwd", 8192, 128, True) * 112 / 128)
    compute = ComputeModel(h100, "bf16")
    s, heads = 8192, 64

    def seconds(d: int) -> float:
        return compute.time_s(Op("flash_attention", "attention", 4.0 * s * s * d * heads, 0, s, s, d, heads))

    assert seconds(112) == pytest.approx(seconds(128), rel=1e-9)
    assert seconds(96) < seconds(112)  # 96 is compiled: no padding


def test_the_gemm_curve_estimate_pads_as_flashattention2():
    a100 = ACCELERATORS.get("a100-sxm-80g")
    assert a100.efficiency.attention is None  # auto on A100: the GEMM-curve estimate
    compute = ComputeModel(a100, "bf16")
    s, heads = 4096, 64

    def seconds(d: int) -> float:
        return compute.time_s(Op("flash_attention", "attention", 4.0 * s * s * d * heads, 0, s, s, d, heads))

    assert seconds(112) == pytest.approx(seconds(128), rel=1e-9)
    assert seconds(96) < seconds(112)


# Which fused kernel runs where (every named kernel on a representative node of each family): None = it loads,
# else the words of its one-line refusal. FlashAttention-3 is Hopper-only (sm90 wgmma/TMA; Shah et al. 2024);
# cuDNN is NVIDIA's library (AMD runs ROCm's CK/AITER port of FlashAttention: fa2 / triton); a part without bf16
# tensor cores (V100, T4) runs no fused kernel at all.
NOT_HOPPER = "FlashAttention-3 runs on Hopper"
NVIDIA_ONLY, NO_FUSED = "runs on NVIDIA GPUs only", "cannot run (no bf16 tensor cores)"
KERNEL_TABLE = {  # node: {kernel: refusal words or None}
    "dgx-a100-80g":  {"fa2": None, "fa3": NOT_HOPPER, "triton": None, "cudnn": None},
    "g5-12xlarge":   {"fa2": None, "fa3": NOT_HOPPER, "triton": None, "cudnn": None},       # A10G (Ampere)
    "g6-12xlarge":   {"fa2": None, "fa3": NOT_HOPPER, "triton": None, "cudnn": None},       # L4 (Ada)
    "dgx-h100":      {"fa2": None, "fa3": None, "triton": None, "cudnn": None},
    "hgx-h200":      {"fa2": None, "fa3": None, "triton": None, "cudnn": None},
    "gh200-1":       {"fa2": None, "fa3": None, "triton": None, "cudnn": None},
    "dgx-b200":      {"fa2": None, "fa3": NOT_HOPPER, "triton": None, "cudnn": None},
    "gb200-nvl72":   {"fa2": None, "fa3": NOT_HOPPER, "triton": None, "cudnn": None},
    "mi300x-8":      {"fa2": None, "fa3": NOT_HOPPER, "triton": None, "cudnn": NVIDIA_ONLY},
    "mi325x-8":      {"fa2": None, "fa3": NOT_HOPPER, "triton": None, "cudnn": NVIDIA_ONLY},
    "mi355x-8":      {"fa2": None, "fa3": NOT_HOPPER, "triton": None, "cudnn": NVIDIA_ONLY},
    "dgx1-v100-32g": {"fa2": NO_FUSED, "fa3": NO_FUSED, "triton": NO_FUSED, "cudnn": NO_FUSED},
    "g4dn-12xlarge": {"fa2": NO_FUSED, "fa3": NO_FUSED, "triton": NO_FUSED, "cudnn": NO_FUSED},   # T4
}


@pytest.mark.parametrize(("node", "kernel"), [(n, k) for n, row in KERNEL_TABLE.items() for k in row])
def test_each_attention_kernel_runs_only_where_it_exists(node, kernel):
    precision = "bf16" if node not in ("dgx1-v100-32g", "g4dn-12xlarge") else "fp16"
    raw = _scenario(node, attention_kernel=kernel, precision=precision)
    words = KERNEL_TABLE[node][kernel]
    if words is None:
        load_scenario(raw)
        return
    with pytest.raises(ConfigError) as err:
        load_scenario(raw)
    assert err.value.field == "training.attention_kernel" and words in err.value.reason


@pytest.mark.parametrize(("node", "precision"), [("mi300x-8", "bf16"), ("dgx1-v100-32g", "fp16")])
def test_a_framework_filled_kernel_that_cannot_run_there_falls_back_to_auto_and_says_so(node, precision):
    # NeMo's profile fills in cudnn (Transformer Engine's Hopper+ choice); the user named no kernel: on an AMD part
    # NeMo runs ROCm's fused attention (the part's default), on a V100 none: auto, and the settings warning names it
    from simulator.cost.provenance import framework_setting_warnings

    sc = load_scenario(_scenario(node, framework="nemo", precision=precision))
    assert sc.training.attention_kernel == "auto"
    assert any("training.attention_kernel=auto (fitted with cudnn)" in w for w in framework_setting_warnings(sc))
    on_h100 = load_scenario(_scenario("dgx-h100", framework="nemo"))
    assert on_h100.training.attention_kernel == "cudnn"
    with pytest.raises(ConfigError):  # named by the user, the same kernel is refused
        load_scenario(_scenario(node, framework="nemo", precision=precision, attention_kernel="cudnn"))
