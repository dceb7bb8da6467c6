"""Many steps (``simulation.steps``, ``clustersim simulate --steps N``): the spmd kind unrolls N
synchronous steps back to back, the optimizer step of step k before the forward of step k+1.

Toy cluster of tests/test_simulate.py: a layer's forward takes t = 939.524096 us, its backward 2t,
L = 4 layers, the optimizer ~1e-13 s; NVLink 100 GB/s with 1 us latency where communication matters.
"""

from __future__ import annotations

import pytest
from test_simulate import T_LAYER, TOY_PARAMS, L, toy_raw

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.plan import Planner

# m = 3 micro-batches of f + 2f with f = L·t: one step's compute.
T_COMPUTE = 3 * 3 * L * T_LAYER
# all-reduce of 2P bf16 bytes over 2 ranks: 2(n-1)·1 us + 2(n-1)/n · 2P / 100 GB/s; a ZeRO-1 reduce-scatter
# of the gradients plus the all-gather of the updated weights cost half of that each.
T_ALL_REDUCE = 2e-6 + 2 * TOY_PARAMS / 100e9
DP2 = dict(nvl_gb_per_s=100, nvl_latency_us=1, dp=2, global_batch_size=6, overlap_grad_reduce=False)


def scenario(num_gpus: int, steps: int, **kw):
    raw = toy_raw(num_gpus, **kw)
    raw["simulation"] = {"steps": steps}
    return load_scenario(raw)


@pytest.mark.parametrize("mode", ["symmetric", "full"])
def test_single_gpu_steps_follow_one_another(mode):
    r = simulate(scenario(1, 4, global_batch_size=3), mode=mode)
    assert r.steps == 4
    assert r.step_times_s == pytest.approx([T_COMPUTE] * 4, rel=1e-9)
    assert r.makespan_s == pytest.approx(4 * T_COMPUTE, rel=1e-9)
    assert r.step_time_s == pytest.approx(T_COMPUTE, rel=1e-9)
    assert r.time_breakdown_s["compute"] == pytest.approx(T_COMPUTE, rel=1e-9)  # the mean per step


@pytest.mark.parametrize("mode", ["symmetric", "full"])
def test_next_forward_waits_for_the_gradient_all_reduce_and_optimizer(mode):
    r = simulate(scenario(2, 3, **DP2), mode=mode)
    assert r.step_times_s == pytest.approx([T_COMPUTE + T_ALL_REDUCE] * 3, rel=1e-9)
    assert r.time_breakdown_s["dp_comm"] == pytest.approx(T_ALL_REDUCE, rel=1e-6)


@pytest.mark.parametrize("mode", ["symmetric", "full"])
def test_zero1_next_forward_waits_for_the_parameter_all_gather(mode):
    # reduce-scatter after the backward, optimizer on the shard, all-gather of the weights: the
    # next step's first forward waits for that gather, so each step is compute + RS + AG.
    r = simulate(scenario(2, 3, zero_stage=1, overlap_param_gather=False, **DP2), mode=mode)
    assert r.step_times_s == pytest.approx([T_COMPUTE + T_ALL_REDUCE] * 3, rel=1e-9)


def test_pipeline_steps_repeat_the_single_step():
    one = simulate(scenario(2, 1, nvl_gb_per_s=100, nvl_latency_us=1, pp=2, global_batch_size=4))
    three = simulate(scenario(2, 3, nvl_gb_per_s=100, nvl_latency_us=1, pp=2, global_batch_size=4))
    assert three.step_times_s == pytest.approx([one.step_time_s] * 3, rel=1e-9)


def test_plan_marks_the_end_of_every_step():
    plan = Planner(scenario(2, 2, zero_stage=1, overlap_param_gather=False, **DP2)).build()
    assert plan.steps == 2 and len(plan.step_ends) == 2
    names = [t.name for t in plan.step_ends[1]]
    assert names == ["s1.optimizer_step", "s1.param_all_gather"]
    first_forward = plan.compute_tasks["stage0"][len(plan.compute_tasks["stage0"]) // 2]
    assert first_forward.name.startswith("s1.F.") and plan.step_ends[0][1] in first_forward.deps


def test_symmetric_cost_does_not_grow_with_dp():
    small = Planner(scenario(2, 3, **DP2)).build()
    large = Planner(scenario(8, 3, **{**DP2, "dp": 8, "global_batch_size": 24})).build()
    assert sum(map(len, small.streams.values())) == sum(map(len, large.streams.values()))


def test_steps_must_be_positive():
    with pytest.raises(ConfigError, match="simulation.steps"):
        scenario(1, 0)
