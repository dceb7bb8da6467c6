"""The step-time lower bounds of the strategy kinds that have one of their own (``StrategyKind.step_lower_bound``:
local_learning, cyclic_dp, async_pipeline; simulator/explore/checks.py ``kind_step_bound_s``) are never above
the engine's step, on random layouts of each example's search space (with the search's shared pass prices and
without), with the optimizer fused into the backward or the forward, and with a barrier between steps; and a
search pruned by them returns the same top rows as one that times every layout."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from simulator.explore.checks import build_layout, check_layout, kind_step_bound_s
from simulator.explore.search import SearchConstraints, SearchSpace, prepare, search
from simulator.report.search_table import summarize
from simulator.simulate import simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CASES = [
    ("gpt-1.7b-local-learning-a100.yaml", []),
    ("gpt-1.7b-local-learning-a100.yaml", ["strategy.sync_steps=true", "strategy.aux_layers=1"]),
    ("gpt-1.7b-local-learning-a100.yaml", ["training.optimizer_fusion=forward"]),
    ("gpt-1.7b-cyclic-dp-a100.yaml", []),
    ("gpt-1.7b-cyclic-dp-a100.yaml", ["training.optimizer_fusion=backward"]),
    ("gpt-1.7b-pipedream-a100.yaml", []),
    ("gpt-1.7b-pipedream-2bw-a100.yaml", []),
    ("gpt-1.7b-pipedream-2bw-a100.yaml", ["training.optimizer_fusion=forward", "simulation.steps=2"]),
    ("gpt-1.7b-pipelined-backprop-a100.yaml", []),
]


@pytest.mark.parametrize("name, overrides", CASES)
def test_the_kind_bound_never_exceeds_the_engine_step(name, overrides):
    raw, scenario, candidates = prepare(str(EXAMPLES / name), overrides, None, SearchSpace(), SearchConstraints())
    rng = random.Random(22)
    rng.shuffle(candidates)
    checked, ratios = 0, []
    for cand in candidates:
        if checked >= 12:
            break
        point = {**raw, "parallelism": cand}
        found = check_layout(point, None, True, True)
        if "invalid" in found or "row" in found:
            continue
        sc = build_layout(point)
        step = simulate(sc).step_time_s
        for bound in (found["bound_s"], kind_step_bound_s(sc, point, reference=True)):
            assert 0 < bound <= step, (cand, bound, step)
        ratios.append(found["bound_s"] / step)
        checked += 1
    assert checked >= 3
    assert max(ratios) > 0.3  # a bound, not a zero


def test_a_pruned_search_returns_the_rows_of_one_that_times_every_layout():
    # the same top rows, in the same order, as every feasible layout timed (the replacement simulator runs
    # every layout: no bound)
    from simulator.explore.sweep import default_simulate

    source = str(EXAMPLES / "gpt-1.7b-local-learning-a100.yaml")
    space = SearchSpace(tp=[1, 2], pp=[2, 4], micro_batch_size=[1, 2, 4])
    pruned = search(source, space=space, workers=1, top_k=5)
    every = search(source, space=space, workers=1, top_k=5, simulate_fn=default_simulate)
    s = summarize(pruned)
    assert s["pruned_by_bound"] > 0 and s["engine_resimulated"] < summarize(every)["simulated"]
    top = [(r["parallelism"], r["step_time_s"]) for r in pruned[:5]]
    assert top == [(r["parallelism"], r["step_time_s"]) for r in every[:5]]
