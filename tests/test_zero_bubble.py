"""Zero-bubble pipeline schedule (Qi et al. 2024): B/W split, list-scheduled orders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulator.memory.analytic import peak_rank_memory
from simulator.simulate import simulate
from simulator.strategies.spmd.schedule import zero_bubble

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import toy  # noqa: E402


def replay(orders, t_f, t_b, t_w):
    """Independent replay of per-stage orders with the pipeline dependencies; returns the makespan."""
    p = len(orders)
    end: dict = {}
    free = [0.0] * p
    pos = [0] * p
    durations = {"F": t_f, "B": t_b, "W": t_w}
    while any(pos[i] < len(orders[i]) for i in range(p)):
        progressed = False
        for i in range(p):
            if pos[i] == len(orders[i]):
                continue
            kind, mb, _ = orders[i][pos[i]]
            deps = {"F": [("F", i - 1, mb)] if i else [],
                    "B": [("B", i + 1, mb)] if i < p - 1 else [("F", i, mb)],
                    "W": [("B", i, mb)]}[kind]
            if all(d in end for d in deps):
                start = max([free[i]] + [end[d] for d in deps])
                end[(kind, i, mb)] = free[i] = start + durations[kind]
                pos[i] += 1
                progressed = True
        assert progressed, "orders deadlock"
    return max(free)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (4, 8), (8, 16), (8, 32)])
def test_equal_pass_times_reach_the_zb_h1_step(p, m):
    # ZB-H1 (Qi et al. 2024, Sec. 3): m(F+B+W) + (p-1)(F+B-W) = 3m + p - 1 with F = B = W = 1,
    # against 1F1B's (m+p-1)(F+B+W) = 3(m+p-1).
    orders = zero_bubble(m, p, 1.0, 1.0, 1.0)
    for i, order in enumerate(orders):
        assert sorted(order) == sorted((k, mb, 0) for k in "FBW" for mb in range(m))
        in_flight = 0
        for kind, mb, _ in order:
            in_flight += {"F": 1, "B": -1, "W": 0}[kind]
            assert in_flight <= p - i  # 1F1B's activation memory
            if kind == "W":
                assert order.index(("B", mb, 0)) < order.index(("W", mb, 0))
    assert replay(orders, 1.0, 1.0, 1.0) == pytest.approx(3 * m + p - 1)


def test_zero_bubble_shrinks_the_simulated_bubble_at_the_same_memory():
    one = simulate(toy(4, pp=4, global_batch_size=16, schedule="1f1b"))
    zb = simulate(toy(4, pp=4, global_batch_size=16, schedule="zb-h1"))
    assert zb.time_breakdown_s["pipeline_bubble"] < 0.7 * one.time_breakdown_s["pipeline_bubble"]
    assert zb.step_time_s < one.step_time_s
    assert sum(zb.time_breakdown_s.values()) == pytest.approx(zb.step_time_s, rel=1e-9)
    assert peak_rank_memory(zb_scenario := toy(4, pp=4, global_batch_size=16, schedule="zb-h1"))[1].total_bytes == \
        peak_rank_memory(toy(4, pp=4, global_batch_size=16, schedule="1f1b"))[1].total_bytes
    assert zb_scenario.parallelism.schedule == "zb-h1"
