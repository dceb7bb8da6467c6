"""Chains (simulator/engine/engine.py ``Task.parts``): a pass's back-to-back tasks run as one engine
task give the same timeline to the bit as the separate tasks.

- the engine: a chain ends where its last part would have ended (parts summed in order), its
  dependents start then, counters move at its start and end only;
- the SPMD planner (``chains=True``, what ``simulate`` asks for): on random layouts (tp, pp, schedule,
  recompute, ZeRO, overlaps, micro-batches) and on every spmd example, the coarse plan (a backward with
  recompute as one task) and the fine plan (one task per pass part) give the same makespan, the same
  critical rank, the same time breakdown of every rank, the same memory peaks and series, and the same
  timeline (event names, categories, starts and ends), compared with ``==``, not a tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_simulate import toy_raw

from simulator.engine.engine import Engine, Task, TaskPart, part_spans
from simulator.scenario import load_scenario
from simulator.simulate import _timeline, critical_actor, time_breakdown
from simulator.strategies.plan import MEMORY_COUNTER
from simulator.strategies.registry import get_kind

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _spmd_examples() -> list[str]:
    """The examples the SPMD planner compiles alone: the default kind and no co-located jobs (read from the YAML,
    so collection builds no scenario)."""
    names = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        if (raw.get("strategy") or {}).get("kind", "spmd") == "spmd" and not raw.get("co_located_jobs"):
            names.append(path.name)
    return names


def _engine_run(streams, counters=None):
    engine = Engine(lambda port: 1e9)
    makespan = engine.run(streams, counters or {})
    return engine, makespan


def test_a_chain_ends_where_its_parts_would_have_ended():
    # After a first task of 0.1 s: (0.1 + 0.7) + 0.2 = 1.0, but 0.1 + (0.7 + 0.2) = 0.9999999999999999.
    durations = (0.7, 0.2)
    first = Task("first", "a", "compute", "compute", duration_s=0.1)
    fine = [Task(f"p{i}", "a", "compute", "compute", duration_s=d) for i, d in enumerate(durations)]
    for before, task in zip([first, *fine], fine, strict=False):
        task.deps.append(before)
    fine[0].alloc_bytes, fine[-1].free_bytes = 5.0, 5.0
    after = Task("after", "a", "other", "compute", duration_s=1.0, deps=[fine[-1]])
    _, fine_end = _engine_run({("a", "compute"): [first, *fine], ("a", "other"): [after]})

    first2 = Task("first", "a", "compute", "compute", duration_s=0.1)
    chain = Task("p", "a", "compute", "compute", duration_s=sum(durations), alloc_bytes=5.0, free_bytes=5.0,
                 deps=[first2], parts=tuple(TaskPart(f"{i}", "compute", d) for i, d in enumerate(durations)))
    after2 = Task("after", "a", "other", "compute", duration_s=1.0, deps=[chain])
    engine, chain_end = _engine_run({("a", "compute"): [first2, chain], ("a", "other"): [after2]})

    assert chain.end_s == fine[-1].end_s == 1.0 and after2.start_s == after.start_s and chain_end == fine_end
    assert chain.start_s + chain.duration_s != chain.end_s  # the parts' order of summation is kept
    assert [(n, s, e) for n, _, s, e in part_spans(chain)] == [(t.name, t.start_s, t.end_s) for t in fine]
    assert engine.counter_series[("a", "memory")] == [(0.1, 5.0), (1.0, 0.0)]


def _figures(scenario, chains: bool):
    plan = get_kind("spmd").compile(scenario, chains=chains)
    engine = Engine(plan.topology.port_capacity)
    makespan = engine.run(plan.streams, {(a, MEMORY_COUNTER): b for a, b in plan.memory_base_bytes.items()})
    timeline = [(e.rank_class, e.stream, e.name, e.category, e.start_s, e.end_s, e.args, e.flow_to)
                for e in _timeline(plan)]
    chained = sum(1 for tasks in plan.streams.values() for t in tasks if t.parts is not None)
    return {"makespan": makespan, "critical": critical_actor(plan),
            "breakdowns": {a: time_breakdown(plan, a, makespan) for a in plan.compute_tasks},
            "peaks": dict(engine.counter_peaks), "series": dict(engine.counter_series),
            "timeline": timeline}, chained


def _same_to_the_bit(scenario) -> int:
    fine, none = _figures(scenario, chains=False)
    coarse, chained = _figures(scenario, chains=True)
    assert none == 0
    for key in fine:
        assert coarse[key] == fine[key], key
    return chained


@pytest.mark.slow
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]),
       st.sampled_from(["full", "selective", "none"]), st.sampled_from([0, 1, 2, 3]), st.booleans(),
       st.sampled_from([1, 3, 8]), st.sampled_from(["symmetric", "full"]))
def test_random_layouts_coarse_equals_fine(tp, pp, v, recompute, zero, overlap, m, mode):
    dp = 16 // (tp * pp)
    if dp < 1 or (v > 1 and (pp < 2 or m % pp)):
        return
    schedule = "interleaved" if v > 1 else "1f1b"
    scenario = load_scenario(None, [
        "model=llama-1b", "cluster.node=dgx-h100", "cluster.num_gpus=16", "training.seq_length=512",
        f"parallelism.tp={tp}", f"parallelism.pp={pp}", f"parallelism.virtual_stages={v}",
        f"parallelism.schedule={schedule}", f"parallelism.recompute={recompute}", f"parallelism.zero_stage={zero}",
        f"parallelism.overlap_grad_reduce={str(overlap).lower()}", f"parallelism.global_batch_size={m * dp}",
        f"simulation.mode={mode}"])
    _same_to_the_bit(scenario)


def test_a_deep_pipeline_with_recompute_is_chained_and_exact():
    scenario = load_scenario(None, ["parallelism.schedule=1f1b", "parallelism.virtual_stages=1",
                                    "parallelism.global_batch_size=256"])
    # GPT-3 on 1,024 GPUs: tp 8, pp 8, dp 16, 256/16 = 16 micro-batches per replica, full recompute. Every
    # stage's backward of micro-batches 0..14 is one chain task (recompute, then backward); the last
    # micro-batch's runs layer by layer (its gradients reduced as each layer finishes): 8 x 15 chains.
    assert _same_to_the_bit(scenario) == 8 * 15


@pytest.mark.slow
@pytest.mark.parametrize("example", _spmd_examples())
def test_every_spmd_example_coarse_equals_fine(example):
    scenario = load_scenario(EXAMPLES / example)
    assert scenario.strategy_kind == "spmd" and not scenario.co_located
    _same_to_the_bit(scenario)


@pytest.mark.parametrize("recompute", ["full", "none"])
def test_passes_with_host_floor_stalls_are_chained_and_exact(recompute):
    """An eager framework's host floor (``host_dispatch_us_per_kernel``) adds a stall task after each pass
    part: the forward and its stall, the recompute, the backward and their stalls become one chain each."""
    raw = toy_raw(16, pp=2, dp=8, global_batch_size=32, recompute=recompute)
    raw["cluster"]["node"]["accelerator"]["efficiency"]["host_dispatch_us_per_kernel"] = 200.0
    scenario = load_scenario(raw)
    assert _same_to_the_bit(scenario) > 0
    plan = get_kind("spmd").compile(scenario, chains=True)
    shapes = {tuple(p.suffix for p in t.parts) for tasks in plan.streams.values() for t in tasks if t.parts}
    assert ("", ".host_floor") in shapes
