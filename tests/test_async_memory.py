"""Memory over time of the asynchronous kinds (async_pipeline, local_learning, cyclic_dp): their
tasks allocate and free through the engine's counters as the spmd planner's do (weights,
optimizer state, buffers and stashed weight versions held from time 0; a micro-batch's activations
from its forward to the end of its backward; gradients from the first backward after an update to
that update). The simulated peak equals each kind's analytic peak (its ``memory()``) exactly on
every toy scenario below: both count the same analytic sizes (simulator/memory/analytic.py) and
the peak falls where the analytic count puts it (PipeDream/2BW/fine-grained: a stage's backward
with p - i micro-batches in flight; local learning: a step's first head pass, or its first
backward with recompute; cyclic DP: a step's first backward, with the previous step's gradient
buffer still waiting for its delayed update).

Model: the toy GPT of tests/test_simulate.py (4 layers, h = 256, V = 1024, bf16, Adam).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from simulator.engine.engine import Engine
from simulator.memory.analytic import rank_memory
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.plan import MEMORY_COUNTER
from simulator.strategies.registry import get_kind
from simulator.strategies.tasklists import StageTasks

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import toy_raw  # noqa: E402


def _scenario(num_gpus: int, strategy: dict, steps: int = 1, **par):
    raw = toy_raw(num_gpus, **par)
    raw["strategy"] = strategy
    scenario = load_scenario(raw)
    return dataclasses.replace(scenario, simulation=scenario.simulation.model_copy(update={"steps": steps}))


def _run(scenario):
    """The kind's plan run through the engine with its held bytes: (plan, engine)."""
    plan = get_kind(scenario.strategy_kind).compile(scenario)
    engine = Engine(plan.topology.port_capacity)
    engine.run(plan.streams, {(a, MEMORY_COUNTER): b for a, b in plan.memory_base_bytes.items()})
    return plan, engine


def _after_frees(plan, engine, actor: str, t: float) -> float:
    """The actor's memory at ``t`` after the frees of the tasks ending at ``t`` and before the
    allocations of those starting at ``t`` (the series keeps one point per instant, after both)."""
    value = [v for time, v in engine.counter_series[(actor, MEMORY_COUNTER)] if time <= t][-1]
    starting = {id(task): task for tasks in plan.streams.values() for task in tasks
                if task.actor == actor and task.start_s == t}
    return value - sum(task.alloc_bytes for task in starting.values())


def _assert_peaks_equal_analytic(scenario, pp: int):
    r = simulate(scenario)
    simulated = [r.simulated_peak_memory_gib[f"stage{i}"] for i in range(pp)]
    assert simulated == pytest.approx(r.memory_per_stage_gib, rel=1e-12)
    for series in r.memory_series_bytes.values():
        assert min(v for _, v in series) >= 0
    return r


ASYNC = [
    ("pipedream", dict(pp=2, global_batch_size=4)),
    ("pipedream", dict(pp=4, global_batch_size=8)),
    ("pipedream", dict(pp=4, global_batch_size=2, recompute="full")),  # m < p: p - i in flight regardless
    ("pipedream", dict(pp=2, dp=2, global_batch_size=8, recompute="selective")),
    ("2bw", dict(pp=2, global_batch_size=4)),
    ("2bw", dict(pp=4, global_batch_size=2)),
    ("fine_grained", dict(pp=4, global_batch_size=4)),
]


@pytest.mark.parametrize("variant,par", ASYNC)
@pytest.mark.parametrize("steps", [1, 3])
def test_async_pipeline_simulated_peak_equals_the_analytic_peak(variant, par, steps):
    gpus = par["pp"] * par.get("dp", 1)
    _assert_peaks_equal_analytic(_scenario(gpus, {"kind": "async_pipeline", "variant": variant}, steps, **par),
                                 par["pp"])


def test_pipedream_stage0_peak_by_hand():
    # pp 2: stage 0 holds p - 0 = 2 weight versions and, at a backward in steady state, 2 micro-batches'
    # activations (as flushed 1F1B's stage 0 with m >= p) and the stage's gradients.
    r = simulate(_scenario(2, {"kind": "async_pipeline", "variant": "pipedream"}, pp=2, global_batch_size=4))
    flushed = rank_memory(load_scenario(toy_raw(2, pp=2, global_batch_size=4)), 0)
    expected = 2 * flushed.weights_bytes + flushed.total_bytes - flushed.weights_bytes
    assert r.simulated_peak_memory_gib["stage0"] * 2**30 == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("variant", ["pipedream", "2bw", "fine_grained"])
def test_async_pipeline_memory_between_updates_and_at_the_end(variant):
    # After each update before the drain stage i holds its base and the p - i - 1 micro-batches still
    # in flight (PipeDream, fine-grained: an update every micro-batch; 2BW: every m); after the drain,
    # its base.
    p, m = 4, 4
    scenario = _scenario(p, {"kind": "async_pipeline", "variant": variant}, 2, pp=p, global_batch_size=m)
    plan, engine = _run(scenario)
    tasks = StageTasks(scenario)
    for i, actor in enumerate(plan.actors):
        base = plan.memory_base_bytes[actor]
        updates = [t for t in plan.compute_tasks[actor] if t.name.startswith("optimizer.")]
        n = len(updates) if variant != "2bw" else 2 * p + 2 * m  # micro-batches run

        def last_backward(update):  # the micro-batch whose backward the update follows
            index = int(update.name.split(".")[1].lstrip("mbstep"))
            return index if variant != "2bw" else index * m + m - 1

        # 1F1B: after B_j stage i has run min(j + p - i, n) forwards and j + 1 backwards
        steady = [t for t in updates if last_backward(t) + p <= n]
        assert len(steady) >= 2
        for update in steady:
            assert _after_frees(plan, engine, actor, update.end_s) == pytest.approx(
                base + (p - i - 1) * tasks.activation_bytes(i), rel=1e-12)
        assert engine.counter_series[(actor, MEMORY_COUNTER)][-1][1] == pytest.approx(base, rel=1e-12)


def test_stashed_versions_are_held_from_the_start():
    # PipeDream stage i of p keeps p - i versions, 2BW two, fine-grained one: the held bytes differ by
    # whole copies of the stage's weights.
    p = 4
    held = {}
    for variant in ("pipedream", "2bw", "fine_grained"):
        scenario = _scenario(p, {"kind": "async_pipeline", "variant": variant}, pp=p, global_batch_size=4)
        held[variant] = get_kind("async_pipeline").compile(scenario).memory_base_bytes
    weights = [StageTasks(scenario).planner.stage_memory(i).weights_bytes for i in range(p)]
    for i in range(p):
        actor = f"stage{i}"
        assert held["pipedream"][actor] - held["fine_grained"][actor] == pytest.approx((p - i - 1) * weights[i])
        assert held["2bw"][actor] - held["fine_grained"][actor] == pytest.approx(weights[i])


LOCAL = [
    dict(pp=2, global_batch_size=4),
    dict(pp=4, global_batch_size=8),
    dict(pp=2, global_batch_size=4, aux_layers=1),
    dict(pp=4, global_batch_size=4, recompute="full"),
    dict(pp=2, global_batch_size=4, recompute="selective", aux_layers=1),
    dict(pp=2, dp=2, global_batch_size=4),
]


@pytest.mark.parametrize("par", LOCAL)
@pytest.mark.parametrize("steps", [1, 3])
def test_local_learning_simulated_peak_equals_the_analytic_peak(par, steps):
    par = dict(par)
    strategy = {"kind": "local_learning", "aux_layers": par.pop("aux_layers", 0)}
    gpus = par["pp"] * par.get("dp", 1)
    _assert_peaks_equal_analytic(_scenario(gpus, strategy, steps, **par), par["pp"])


@pytest.mark.parametrize("sync_steps", [False, True])
def test_local_learning_returns_to_its_base_after_every_update(sync_steps):
    scenario = _scenario(2, {"kind": "local_learning", "sync_steps": sync_steps}, 3, pp=2, global_batch_size=4)
    plan, engine = _run(scenario)
    for actor in plan.actors:
        updates = [t for t in plan.compute_tasks[actor] if t.name.startswith("optimizer.")]
        assert len(updates) == 4
        for update in updates:
            assert _after_frees(plan, engine, actor, update.end_s) == pytest.approx(
                plan.memory_base_bytes[actor], rel=1e-12)


@pytest.mark.parametrize("par", [dict(dp=2, global_batch_size=4), dict(dp=4, global_batch_size=4),
                                 dict(dp=2, global_batch_size=4, recompute="full"), dict(global_batch_size=2)])
@pytest.mark.parametrize("steps", [1, 3])
def test_cyclic_dp_simulated_peak_equals_the_analytic_peak(par, steps):
    _assert_peaks_equal_analytic(_scenario(par.get("dp", 1), {"kind": "cyclic_dp"}, steps, **par), 1)


def test_cyclic_dp_carries_one_gradient_buffer_across_every_step_end():
    # The update ending step k applies step k - 1's gradient and frees its buffer; step k's waits for
    # the next update: after every update the worker holds its base plus one gradient buffer.
    scenario = _scenario(2, {"kind": "cyclic_dp"}, 3, dp=2, global_batch_size=4)
    plan, engine = _run(scenario)
    grads = StageTasks(scenario).gradient_bytes(0)
    updates = [t for t in plan.compute_tasks["stage0"] if t.name.startswith("optimizer.")]
    assert len(updates) == 4
    for update in updates:
        assert _after_frees(plan, engine, "stage0", update.end_s) == pytest.approx(
            plan.memory_base_bytes["stage0"] + grads, rel=1e-12)


def test_plot_draws_the_kinds_own_analytic_peaks(monkeypatch, tmp_path):
    # clustersim plot's dotted lines are the kind's memory() per stage (PipeDream's stashed versions
    # and p - i micro-batches in flight), which the simulated peaks reach, not the spmd count.
    from simulator.report import plots

    drawn = {}

    def spy(series, hbm_gib, analytic_peak_gib=None, title=""):
        drawn.update(analytic_peak_gib)
        return plots.Figure()

    monkeypatch.setattr(plots, "memory_over_time_figure", spy)
    scenario = _scenario(4, {"kind": "async_pipeline", "variant": "pipedream"}, pp=4, global_batch_size=8)
    result = simulate(scenario)
    plots.plot_scenario(scenario, tmp_path, formats=("svg",), result=result)
    assert drawn == pytest.approx(result.simulated_peak_memory_gib, rel=1e-12)
