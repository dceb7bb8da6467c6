"""``search --rank-by time_to_target_s`` prunes by a bound too: time to target = steps to target x
step time, the steps depend on the global batch and the convergence block alone (not on how fast a
layout runs), so their floor times the step-time lower bound is never above the engine's time to
target, and the top k equal those of a search that times every layout."""

import copy

import pytest

from simulator.explore.bounds import step_lower_bound_s
from simulator.explore.search import SearchSpace, search, steps_to_target_floor
from simulator.report.search_table import summarize
from simulator.scenario import load_scenario
from simulator.simulate import simulate

TINY = {
    "name": "tiny-target",
    "model": {"name": "tiny", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4,
              "vocab_size": 1024, "seq_length": 256},
    "cluster": {"node": "dgx-a100-80g", "fabric": "fat-tree", "num_gpus": 8},
    "parallelism": {"tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 1, "global_batch_size": 64},
    "convergence": {"source": "test numbers", "batch": {"s_min": 100, "b_noise": 64},
                    "staleness": {"per_step_of_delay": 0.5}},
}
SPACE = SearchSpace(tp=[1, 2], pp=[1, 2], virtual_stages=[1], micro_batch_size=[1, 2], zero_stage=[0, 1],
                    recompute=["none", "full"], sequence_parallel=[False], global_batch_size=[16, 64, 256])


@pytest.mark.parametrize("overrides", [
    [],
    ["parallelism.tp=2", "parallelism.pp=2", "parallelism.dp=2", "parallelism.global_batch_size=16"],
    ["parallelism.pp=2", "parallelism.dp=4", "parallelism.recompute=full", "parallelism.global_batch_size=256"],
])
def test_the_floor_times_the_step_bound_is_below_the_time_to_target(overrides):
    sc = load_scenario(copy.deepcopy(TINY), overrides)
    result = simulate(sc).to_dict()
    floor = steps_to_target_floor(sc)
    assert floor == pytest.approx(result["steps_to_target"])  # synchronous: no staleness to leave out
    assert floor * step_lower_bound_s(sc) <= result["time_to_target_s"]


def test_the_floor_leaves_out_staleness_and_keeps_local_steps():
    raw = {**copy.deepcopy(TINY), "strategy": {"kind": "local_sgd", "local_steps": 8, "overlap_inner_steps": 1},
           "convergence": {"source": "test numbers", "steps_to_target": 1000,
                           "local_steps": {"per_extra_local_step": 0.01}, "staleness": {"per_step_of_delay": 0.5}}}
    sc = load_scenario(raw)
    result = simulate(sc).to_dict()
    assert steps_to_target_floor(sc) == pytest.approx(1000 * (1 + 0.01 * 7))
    assert result["steps_to_target"] == pytest.approx(1000 * (1 + 0.01 * 7) * (1 + 0.5 * 1))
    assert steps_to_target_floor(sc) * step_lower_bound_s(sc) <= result["time_to_target_s"]
    assert steps_to_target_floor(load_scenario({k: v for k, v in TINY.items() if k != "convergence"})) is None


def test_ranked_by_time_to_target_the_pruned_top_k_equal_the_unpruned(monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_CACHE", "0")
    everything = search(copy.deepcopy(TINY), space=SPACE, workers=1, rank_by="time_to_target_s", top_k=10_000)
    counts = summarize(everything)
    assert counts["pruned_by_bound"] == 0 and counts["engine_resimulated"] >= 30
    pruned = search(copy.deepcopy(TINY), space=SPACE, workers=1, rank_by="time_to_target_s", top_k=3)
    assert 0 < summarize(pruned)["engine_resimulated"] < counts["engine_resimulated"]
    assert summarize(pruned)["pruned_by_bound"] > 0
    for got, want in zip(pruned[:3], everything[:3], strict=True):
        assert got["parallelism"] == want["parallelism"]
        assert got["time_to_target_s"] == pytest.approx(want["time_to_target_s"], rel=1e-12)
    times = [r["time_to_target_s"] for r in pruned[:3]]
    assert times == sorted(times)
    skipped = [r for r in pruned if r.get("evaluated_by") == "bound"]
    assert skipped and all("time-to-target lower bound" in r["infeasible_reason"] for r in skipped)
    # every skipped layout's bound is above the third best time to target: it could not have entered
    kth = pruned[2]["time_to_target_s"]
    for row in skipped:
        gbs = row["parallelism"]["global_batch_size"]
        steps = 100 * (1 + 64 / gbs)
        assert steps * row["step_time_lower_bound_s"] > kth
