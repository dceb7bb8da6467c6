"""The event-loop engine (simulator/engine/engine.py) against the SimPy engine it replaced
(simulator/engine/simpy_engine.py, kept as the reference): on random task lists with every feature
the engine has (dependencies within and across streams, rendezvous, transfers on shared ports with
latency and propagation, interference both ways, shared executors with priorities, counters,
``until_done``), both give the same ready, start and end time of every task, the same run spans,
counter series and peaks, and the same makespan or the same deadlock. The loop orders events as
SimPy does, so the times are equal to the bit (the brief allowed 1e-12 relative; none is needed).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.engine.engine import Engine, Task
from simulator.engine.simpy_engine import SimPyEngine

GB = 1e9
PORTS = {"a": 1 * GB, "b": 2 * GB, "c": 0.5 * GB, "d": 3 * GB}
ACTORS = ("r0", "r1", "r2")
STREAMS = ("compute", "comm", "p2p")
# Durations from a small set of values (ties at one instant are where orders can differ) and a few odd ones.
DURATIONS = st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 0.25, 1e-3, 0.3, 1.7])


@st.composite
def task_lists(draw):
    """Random tasks: kinds, deps on earlier tasks (so no cycles except those streams make), rendezvous
    groups over distinct actors, counters, interference and shared executors."""
    n = draw(st.integers(1, 24))
    specs = []
    rendezvous_groups: list[list[int]] = []
    for i in range(n):
        actor = draw(st.sampled_from(ACTORS))
        stream = draw(st.sampled_from(STREAMS))
        kind = draw(st.sampled_from(["fixed", "fixed", "transfer", "rendezvous"]))
        spec = {"i": i, "actor": actor, "stream": stream, "kind": kind,
                "duration_s": draw(DURATIONS),
                "deps": sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3)))) if i else [],
                "alloc": draw(st.sampled_from([0.0, 0.0, 1.0, 2.0])),
                "free": draw(st.sampled_from([0.0, 0.0, 1.0, 2.0])),
                "counter": draw(st.sampled_from(["memory", "memory", "other"]))}
        if kind in ("transfer", "rendezvous"):
            ports = draw(st.lists(st.sampled_from(sorted(PORTS)), min_size=0, max_size=3, unique=True))
            spec["demands"] = {p: draw(st.sampled_from([0.0, 0.5 * GB, 1 * GB, 1.3 * GB])) for p in ports}
            spec["latency_s"] = draw(st.sampled_from([0.0, 0.0, 1e-5, 0.2]))
            spec["propagation_s"] = draw(st.sampled_from([0.0, 0.0, 0.1]))
            spec["contends"] = draw(st.booleans())
            spec["comm_slowdown"] = draw(st.sampled_from([0.0, 0.0, 0.5]))
        else:
            spec["slowdown"] = draw(st.sampled_from([0.0, 0.0, 0.4]))
            spec["slows_comm"] = draw(st.booleans())
            if draw(st.integers(0, 3)) == 0:
                spec["shares"] = draw(st.sampled_from(["x", "y"]))
                spec["priority"] = draw(st.integers(0, 2))
                spec["interferes"] = draw(st.sampled_from([0.0, 0.3]))
        if kind == "rendezvous":
            open_groups = [g for g in rendezvous_groups if len(g) < 3 and all(specs[j]["actor"] != actor for j in g)]
            if open_groups and draw(st.booleans()):
                open_groups[0].append(i)
            else:
                rendezvous_groups.append([i])
        specs.append(spec)
    until = draw(st.one_of(st.none(), st.lists(st.integers(0, n - 1), max_size=4)))
    return specs, rendezvous_groups, until


def _build(specs, groups) -> tuple[list[Task], dict[tuple[str, str], list[Task]]]:
    group_of = {i: (f"g{k}", len(g)) for k, g in enumerate(groups) for i in g}
    tasks: list[Task] = []
    for s in specs:
        kw = {"duration_s": s["duration_s"], "alloc_bytes": s["alloc"], "free_bytes": s["free"],
              "counter": s["counter"], "deps": [tasks[j] for j in s["deps"]]}
        if s["kind"] == "fixed":
            kw.update(slowdown_while_contended=s["slowdown"], slows_comm=s["slows_comm"])
            if "shares" in s:
                kw.update(shares=s["shares"], priority=s["priority"], interferes=s["interferes"])
        else:
            kw.update(demands=s["demands"], latency_s=s["latency_s"], propagation_s=s["propagation_s"],
                      contends=s["contends"], comm_slowdown_while_computing=s["comm_slowdown"])
            if s["kind"] == "rendezvous":
                kw.update(rendezvous=group_of[s["i"]][0], rendezvous_size=group_of[s["i"]][1])
        tasks.append(Task(f"t{s['i']}", s["actor"], s["stream"], "x", **kw))
    streams: dict[tuple[str, str], list[Task]] = {}
    for t in tasks:
        streams.setdefault((t.actor, t.stream), []).append(t)
    return tasks, streams


def _outcome(engine_class, specs, groups, until):
    tasks, streams = _build(specs, groups)
    engine = engine_class(lambda port: PORTS[port])
    counters_start = {("r0", "memory"): 5.0, ("r1", "other"): 1.0}
    try:
        makespan = engine.run(streams, counters_start, None if until is None else [tasks[i] for i in until])
    except RuntimeError as exc:
        makespan = str(exc)
    times = [(t.ready_s, t.start_s, t.end_s, tuple(t.run_spans)) for t in tasks]
    return makespan, times, engine.counter_series, engine.counter_peaks


def _same(a, b) -> bool:
    """Equal, NaN included (a task that never started has NaN times in both)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_lists())
def test_event_loop_engine_equals_simpy_engine(case):
    specs, groups, until = case
    ours = _outcome(Engine, specs, groups, until)
    reference = _outcome(SimPyEngine, specs, groups, until)
    assert _same(ours[0], reference[0])
    for i, (a, b) in enumerate(zip(ours[1], reference[1], strict=True)):
        assert _same(a, b), f"task t{i}: {a} vs {b}"
    assert _same(ours[2], reference[2])
    assert _same(ours[3], reference[3])


@pytest.mark.parametrize("until", [None, [0]])
def test_rendezvous_transfer_with_interference_both_ways_matches(until):
    # A hand-made case with every interference path at once: a slowed collective over two actors while
    # both compute, a contending transfer that slows a kernel, a shared executor with two priorities.
    specs = [
        {"i": 0, "actor": "r0", "stream": "compute", "kind": "fixed", "duration_s": 2.0, "deps": [], "alloc": 1.0,
         "free": 0.0, "counter": "memory", "slowdown": 0.4, "slows_comm": True},
        {"i": 1, "actor": "r0", "stream": "comm", "kind": "rendezvous", "duration_s": 0.0, "deps": [], "alloc": 0.0,
         "free": 1.0, "counter": "memory", "demands": {"a": 1 * GB}, "latency_s": 0.2, "propagation_s": 0.1,
         "contends": True, "comm_slowdown": 0.5},
        {"i": 2, "actor": "r1", "stream": "comm", "kind": "rendezvous", "duration_s": 0.0, "deps": [], "alloc": 0.0,
         "free": 0.0, "counter": "memory", "demands": {"a": 1 * GB, "b": 1 * GB}, "latency_s": 0.0,
         "propagation_s": 0.0, "contends": True, "comm_slowdown": 0.5},
        {"i": 3, "actor": "r1", "stream": "compute", "kind": "fixed", "duration_s": 1.0, "deps": [], "alloc": 0.0,
         "free": 0.0, "counter": "memory", "slowdown": 0.0, "slows_comm": True, "shares": "x", "priority": 1,
         "interferes": 0.3},
        {"i": 4, "actor": "r2", "stream": "compute", "kind": "fixed", "duration_s": 1.0, "deps": [0], "alloc": 0.0,
         "free": 0.0, "counter": "memory", "slowdown": 0.0, "slows_comm": False, "shares": "x", "priority": 0,
         "interferes": 0.3},
    ]
    ours = _outcome(Engine, specs, [[1, 2]], until)
    reference = _outcome(SimPyEngine, specs, [[1, 2]], until)
    assert isinstance(ours[0], float)
    assert _same(ours, reference)
