"""The cyclic_dp kind on the toy GPT of tests/test_simulate.py (a step of one micro-batch: forward
4T, backward 8T, T = T_LAYER; optimizer ~1e-13 s): the one-step gradient delay hides the
all-reduce, and the uniformly delayed workers' summed activations are flat where data
parallelism's peak at N times one worker's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.memory.analytic import rank_memory
from simulator.report.result import render_table
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.cyclic_dp import activation_profile, summed_activations
from simulator.strategies.registry import get_kind

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import T_LAYER, TOY_PARAMS, toy_raw  # noqa: E402

GIB = 2**30


def _cyclic(num_gpus: int, **kw):
    raw = toy_raw(num_gpus, **kw)
    raw["strategy"] = {"kind": "cyclic_dp"}
    return load_scenario(raw)


def test_three_workers_sum_to_a_flat_one_and_a_half_peaks():
    # One worker's activations rise to A over the forward [0, 4T] and fall over the backward
    # [4T, 12T]. Delayed by 0, 4T and 8T, at t in [0, 4T) the three hold A·t/4T, A·(4T - t)/8T and
    # A·(8T - t)/8T: together 1.5A at every t (and likewise in the other thirds); started together
    # (data parallelism) they peak at 3A.
    r = simulate(_cyclic(3, dp=3, global_batch_size=3))
    a = rank_memory(load_scenario(toy_raw(3, dp=3, global_batch_size=3)), 0).activations_bytes / GIB
    assert r.extra["cyclic_activation_peak_gib"] == pytest.approx(1.5 * a, rel=1e-9)
    assert r.extra["cyclic_activation_min_gib"] == pytest.approx(1.5 * a, rel=1e-9)
    assert r.extra["simultaneous_activation_peak_gib"] == pytest.approx(3 * a, rel=1e-9)
    assert r.extra["gradient_delay_steps"] == 1


def test_two_workers_swing_between_three_quarters_and_five_quarters():
    # Delays 0 and 6T: at t in [0, 2T] the sum is A·t/4T + A·(6T - t)/8T, from 0.75A to 1.25A.
    points = activation_profile([(0.0, 4.0, 1.0), (4.0, 12.0, -1.0)])
    series = summed_activations(points, 12.0, 2)
    assert max(v for _, v in series) == pytest.approx(1.25)
    assert min(v for _, v in series) == pytest.approx(0.75)
    assert max(v for _, v in summed_activations(points, 12.0, 2, delayed=False)) == pytest.approx(2.0)


def test_the_delayed_update_hides_the_all_reduce_until_it_is_longer_than_the_step():
    # dp 2 on NVLink with 1 us latency: the all-reduce of 2P bytes takes t = 2 us + 2P/B. At
    # B = 100 GB/s (t = 66.6 us) it runs under the next step's 12T: the step is 12T (data
    # parallelism without overlap: 12T + t). At B = 0.1 GB/s (t = 64.6 ms) the reductions follow
    # each other on their stream and set the step: t.
    for gb_per_s, expected in ((100, 12 * T_LAYER), (0.1, 2e-6 + 2 * TOY_PARAMS / 0.1e9)):
        r = simulate(_cyclic(2, nvl_gb_per_s=gb_per_s, nvl_latency_us=1, dp=2, global_batch_size=2))
        assert r.step_time_s == pytest.approx(expected, rel=1e-9)
        assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    ddp = simulate(load_scenario(toy_raw(2, nvl_gb_per_s=100, nvl_latency_us=1, dp=2, global_batch_size=2,
                                         overlap_grad_reduce=False)))
    assert ddp.step_time_s == pytest.approx(12 * T_LAYER + 2e-6 + 2 * TOY_PARAMS / 100e9, rel=1e-9)


def test_memory_keeps_a_second_gradient_buffer():
    scenario = _cyclic(2, dp=2, global_batch_size=2)
    _, peak, _ = get_kind("cyclic_dp").memory(scenario)
    ddp = rank_memory(load_scenario(toy_raw(2, dp=2, global_batch_size=2)), 0)
    assert peak.gradients_bytes == 2 * ddp.gradients_bytes
    assert peak.total_bytes == ddp.total_bytes + ddp.gradients_bytes


def test_pipelines_are_refused():
    with pytest.raises(ConfigError, match=r"parallelism\.pp: cyclic_dp"):
        simulate(_cyclic(2, pp=2, global_batch_size=2))


def test_the_summed_activations_line_under_the_memory_table():
    # three workers (see above): cyclic flat at 1.5A; data parallelism from 0 (no activations at the
    # step's start) to 3A; the --json field and the table's line carry both ranges
    r = simulate(_cyclic(3, dp=3, global_batch_size=3))
    a = rank_memory(load_scenario(toy_raw(3, dp=3, global_batch_size=3)), 0).activations_bytes / GIB
    summed = r.to_dict()["summed_activation_gib"]
    assert summed["workers"] == 3
    assert (summed["cyclic_min"], summed["cyclic_max"]) == pytest.approx((1.5 * a, 1.5 * a), rel=1e-9)
    assert (summed["data_parallel_min"], summed["data_parallel_max"]) == pytest.approx((0.0, 3 * a), abs=1e-12)
    table = render_table(r)
    line = next(x for x in table.splitlines() if x.strip().startswith("activations sum"))
    assert table.index(line) > table.index("memory per GPU")
    assert (f"{1.5 * a:.2f}-{1.5 * a:.2f} GiB over the step, summed over the 3 workers "
            f"(data parallelism: 0.00-{3 * a:.2f} GiB)") in line


def test_data_parallelism_prints_no_summed_activations():
    r = simulate(load_scenario(toy_raw(3, dp=3, global_batch_size=3)))
    assert "summed_activation_gib" not in r.to_dict()
    assert "activations sum" not in render_table(r)
