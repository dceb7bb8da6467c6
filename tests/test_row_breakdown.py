"""validation/modern/row_breakdown.py: a row's assumed settings and kernel seconds by op class, and
whether a row follows its own model's sequence-length trend (MPT-13B does; MPT-30B's 8K rows do not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from validation.modern.row_breakdown import breakdown, marginal_attention, trend

ROOT = Path(__file__).resolve().parents[1]


def test_mpt30b_8k_row_shows_its_settings_and_the_padded_head():
    b = breakdown("llmfoundry", 79)  # MPT-30b, 8 A100 80 GB, s8192 mbs1 gbs168, FULL_SHARD, checkpointing
    s = b.settings
    assert (s["zero_stage"], s["micro_batch"], s["global_batch"], s["micro_batches_per_step"]) == (3, 1, 168, 21)
    assert (s["recompute"], s["precision"], s["grad_dtype"], s["seq_length"]) == ("full", "bf16", "fp32", 8192)
    assert s["head_size"] == "112 (runs 128)"
    classes = {c for c, _ in b.seconds}
    assert {"fused attention", "gemm:mlp", "gemm:attention_proj"} <= classes
    assert b.total() == pytest.approx(sum(b.seconds.values()))
    assert b.step_per_micro_batch_s >= b.total()  # the step adds exposed communication and the optimizer
    # full recompute re-runs every forward kernel once
    for c in classes:
        assert b.seconds[(c, "rec")] == pytest.approx(b.seconds[(c, "fwd")])


@pytest.mark.parametrize(("fit_rows", "row"), [([89, 87, 86], 85), ([33, 28], 27)])  # A100 80 GB, H100
def test_mpt13b_long_rows_follow_the_trend_of_its_shorter_ones(fit_rows, row):
    _, _, target, predicted = trend("llmfoundry", fit_rows, row)
    assert abs(target.measured_per_micro_batch_s / predicted - 1) < 0.03


@pytest.mark.parametrize(("fit_rows", "row"), [([83, 82, 81, 80], 79), ([25, 24, 21], 20)])  # A100 80 GB, H100
def test_mpt30b_8k_rows_carry_a_cost_no_rate_of_its_shorter_rows_explains(fit_rows, row):
    # +25% (A100 80 GB) and +20% (H100) with Composer's FSDP1 kernels priced (+30 / +28% with FSDP2's copies),
    # against < 3% for MPT-13b's long rows above
    _, _, target, predicted = trend("llmfoundry", fit_rows, row)
    assert target.measured_per_micro_batch_s / predicted - 1 > 0.15


def test_cli_prints_the_breakdown_and_the_trend():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "validation.modern.row_breakdown", "--set", "llmfoundry",
                          "--rows", "80", "--trend", "81,80", "--predict", "79", "--marginal", "80,79"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "head_size 112 (runs 128)" in out.stdout and "fused attention" in out.stdout
    assert "row 79 MPT-30b a100_80gb" in out.stdout and "rate error +" in out.stdout
    assert "rows 80 -> 79 (s4096 mbs1 -> s8192 mbs1)" in out.stdout and "TFLOP/s counted" in out.stdout


def test_head_128_rows_pay_their_added_attention_at_one_rate_from_4k_to_32k():
    steps = marginal_attention("llmfoundry", [87, 86, 85, 84])  # MPT-13b, 8 A100 80 GB, s4096 .. s32768
    assert [(m.shorter.row, m.longer.row) for m in steps] == [(87, 86), (86, 85), (85, 84)]
    rates = [m.tflops for m in steps]
    assert all(95 < r < 115 for r in rates), rates
    assert all(m.added_s_per_token > 0 and m.added_attention_flops_per_token > 0 for m in steps)


@pytest.mark.parametrize(("rows", "ratio"), [([82, 81, 80, 79], 0.35), ([25, 24, 21, 20], 0.5)])  # A100 80 GB, H100
def test_mpt30b_pays_its_added_attention_slower_at_every_longer_sequence(rows, ratio):
    rates = [m.tflops for m in marginal_attention("llmfoundry", rows)]
    assert rates == sorted(rates, reverse=True), rates
    assert rates[-1] < ratio * rates[0], rates  # 4K -> 8K against 1K -> 2K
