"""Goodput under failures (simulator/economics/goodput.py): exact numbers from the formulas, and the
Llama 3 Table 5 inputs (Dubey et al. 2024: 419 unexpected interruptions, 54 days, 16,384 H100)."""

from __future__ import annotations

import csv
import math

import pytest

from simulator.economics import goodput as gp
from simulator.errors import ConfigError


def test_llama3_counts_sum_to_419_unexpected():
    counts = gp.llama3_interruption_counts()
    assert sum(counts.values()) == 419
    assert counts["Faulty GPU"] == 148 and counts["GPU HBM3 Memory"] == 72
    with gp.LLAMA3_TABLE5.open(newline="") as fh:
        rows = {r["component"]: r for r in csv.DictReader(fh)}
    assert int(rows["unexpected interruptions"]["interruption_count"]) == 419


def test_llama3_rates_scale_per_gpu():
    rates = gp.llama3_failure_rates_per_gpu_hour()
    per_gpu_hour = sum(rates.values())
    assert per_gpu_hour == pytest.approx(419 / (54 * 24 * 16384), rel=1e-12)
    # On the whole 16,384-GPU job: 419/54 = 7.76 interruptions per day, one every 3.09 h.
    job = gp.job_interruption_rate_per_hour(16384, rates)
    assert job * 24 == pytest.approx(419 / 54, rel=1e-12)
    # A 1,024-GPU job sees 1/16 of that: MTBF 49.5 h.
    assert 1 / gp.job_interruption_rate_per_hour(1024, rates) == pytest.approx(54 * 24 * 16 / 419, rel=1e-12)
    assert gp.job_interruption_rate_per_hour(1024, rates, scale=2.0) == pytest.approx(2 * 1024 * per_gpu_hour)


def test_checkpoint_time_and_young_interval():
    # 1T parameters x 14 B = 14 TB at Narayanan's 273 GB/s: 51.28 s.
    assert gp.checkpoint_write_seconds(14e12, 273.0) == pytest.approx(14e12 / 273e9)
    # Young: sqrt(2 * 60 s * 10 h) = sqrt(4.32e6) = 2078.46 s.
    assert gp.young_daly_interval_s(60.0, 36000.0) == pytest.approx(math.sqrt(2 * 60 * 36000))
    assert gp.young_daly_interval_s(60.0, 36000.0) == pytest.approx(2078.4609690826525)


def test_goodput_fraction_exact():
    # M = 10 h, delta = 60 s, tau = 1800 s, R = 600 s:
    # loss = (600 + (1800 + 60)/2)/36000 = 1530/36000 = 0.0425; goodput = 0.9575 / (1 + 60/1800)
    g = gp.goodput_fraction(36000.0, 60.0, 1800.0, 600.0)
    assert g == pytest.approx(0.9575 / (1 + 1 / 30), rel=1e-12)
    assert g == pytest.approx(0.926612903, rel=1e-8)
    # No failures: only the checkpoint overhead.
    assert gp.goodput_fraction(math.inf, 60.0, 1800.0, 600.0) == pytest.approx(30 / 31)
    # Failures faster than restarts: never finishes.
    assert gp.goodput_fraction(500.0, 60.0, 1800.0, 600.0) == 0.0


def test_young_interval_is_optimal():
    m, d, r = 36000.0, 60.0, 600.0
    best = gp.young_daly_interval_s(d, m)
    g_best = gp.goodput_fraction(m, d, best, r)
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert gp.goodput_fraction(m, d, best * factor, r) < g_best


def test_llama3_405b_goodput_about_92_percent():
    """Llama 3 405B on 16,384 H100 (2,048 nodes): 405e9 x 14 B checkpoints at Narayanan's
    per-node bandwidths, a 10-minute restart: ~92%, consistent with the paper's '>90% effective
    training time' over the 54-day snapshot."""
    nodes = 2048
    report = gp.analyse_goodput(
        num_gpus=16384,
        checkpoint_bytes=405e9 * 14,
        write_gb_per_s=273 / 384 * nodes,
        read_gb_per_s=1000 / 384 * nodes,
        restart_overhead_s=600.0,
        rates_per_gpu_hour=gp.llama3_failure_rates_per_gpu_hour(),
    )
    mtbf_s = 54 * 86400 / 419
    delta = 405e9 * 14 / (273e9 / 384 * nodes)
    tau = math.sqrt(2 * delta * mtbf_s)
    restart = 600 + 405e9 * 14 / (1e12 / 384 * nodes)
    expected = (1 - (restart + (tau + delta) / 2) / mtbf_s) / (1 + delta / tau)
    assert report.job_mtbf_hours == pytest.approx(mtbf_s / 3600)
    assert report.checkpoint_write_s == pytest.approx(delta)
    assert report.checkpoint_interval_s == pytest.approx(tau)
    assert report.restart_s == pytest.approx(restart)
    assert report.goodput == pytest.approx(expected, rel=1e-12)
    assert 0.90 < report.goodput < 0.94


def test_no_failures_no_interval_is_full_goodput():
    report = gp.analyse_goodput(
        num_gpus=8, checkpoint_bytes=1e9, write_gb_per_s=1.0, read_gb_per_s=1.0,
        restart_overhead_s=0.0, rates_per_gpu_hour={},
    )
    assert report.goodput == 1.0 and report.job_mtbf_hours is None and report.checkpoint_interval_s is None


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(write_gb_per_s=0.0), "economics.checkpoint_write_gb_per_s_per_node"),
        (dict(read_gb_per_s=-1.0), "economics.checkpoint_read_gb_per_s_per_node"),
        (dict(rates_per_gpu_hour={"GPU": -1.0}), "economics.failure_rates_per_gpu_hour.GPU"),
        (dict(num_gpus=0), "cluster.num_gpus"),
    ],
)
def test_bad_inputs_name_the_field(kwargs, field):
    args = dict(num_gpus=8, checkpoint_bytes=1e9, write_gb_per_s=1.0, read_gb_per_s=1.0,
                restart_overhead_s=0.0, rates_per_gpu_hour={"GPU": 1e-5})
    args.update(kwargs)
    with pytest.raises(ConfigError) as info:
        gp.analyse_goodput(**args)
    assert info.value.field == field
