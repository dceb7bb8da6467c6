"""The fast path's walk (simulator/strategies/spmd/fast.py ``_Dag``) and the busiest-stage pick
(simulator/simulate.py): the shortcuts give the same floats as the whole computation.

- ``_Dag.rerun`` re-times only the tasks that contention delays reach; on random task graphs
  (streams, cross-stream dependencies, transfers sharing ports, propagation, rendezvous) with random
  non-negative delays it returns exactly what ``_Dag.run`` returns: the end, every task's times and
  every port's byte windows.
- ``pipeline_bubble_s`` equals ``time_breakdown(...)["pipeline_bubble"]`` to the bit on every actor,
  and ``_busiest_stage`` picks the stage and breakdown that comparing whole breakdowns picks."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.engine.engine import Engine, Task
from simulator.scenario import load_scenario
from simulator.simulate import (
    _busiest_stage,
    critical_actor,
    least_waiting_stage,
    pipeline_bubble_s,
    stage_breakdowns,
    time_breakdown,
)
from simulator.strategies.plan import MEMORY_COUNTER
from simulator.strategies.registry import get_kind
from simulator.strategies.spmd import fast

PORTS = ("nvl0", "nvl1", "nic0", "nic1")
CAPACITY = {"nvl0": 300e9, "nvl1": 300e9, "nic0": 25e9, "nic1": 25e9}


@st.composite
def task_graphs(draw):
    """Streams of fixed tasks and transfers; each task may wait for earlier tasks of other streams (so
    the graph is acyclic); now and then a rendezvous across 2-3 streams, created together so that no
    member waits for another."""
    n_streams = draw(st.integers(2, 5))
    streams: dict[tuple[str, str], list[Task]] = {(f"a{k // 2}", f"s{k}"): [] for k in range(n_streams)}
    keys = list(streams)
    made: list[Task] = []
    meeting = 0
    for _ in range(draw(st.integers(4, 40))):
        if draw(st.integers(0, 9)) == 0 and n_streams >= 2:  # a rendezvous
            members = draw(st.lists(st.sampled_from(keys), min_size=2, max_size=3, unique=True))
            earlier = list(made)
            for key in members:
                before = streams[key][-1:]
                extra = draw(st.lists(st.sampled_from(earlier), max_size=1)) if earlier else []
                task = Task(f"r{meeting}", key[0], key[1], "dp_comm", rendezvous=f"r{meeting}",
                            rendezvous_size=len(members), latency_s=draw(st.sampled_from([0.0, 1e-5])),
                            demands={draw(st.sampled_from(PORTS)): draw(st.floats(1e6, 1e9))},
                            deps=before + extra)
                streams[key].append(task)
                made.append(task)
            meeting += 1
            continue
        key = draw(st.sampled_from(keys))
        before = streams[key][-1:] if draw(st.booleans()) or not streams[key] else []
        others = [t for t in made if (t.actor, t.stream) != key]
        extra = draw(st.lists(st.sampled_from(others), max_size=2, unique=True)) if others else []
        if draw(st.booleans()):
            ports = draw(st.lists(st.sampled_from(PORTS), min_size=1, max_size=2, unique=True))
            task = Task(f"t{len(made)}", key[0], key[1], "pp_comm", deps=before + extra,
                        demands={p: draw(st.floats(1e6, 1e9)) for p in ports},
                        latency_s=draw(st.sampled_from([0.0, 5e-6])),
                        propagation_s=draw(st.sampled_from([0.0, 0.0, 2e-4])))
        else:
            task = Task(f"t{len(made)}", key[0], key[1], "compute", deps=before + extra,
                        duration_s=draw(st.floats(1e-5, 1e-2)))
        streams[key].append(task)
        made.append(task)
    return {k: v for k, v in streams.items() if v}


def _same(a, b) -> bool:
    """Two walks' results: the end, every task's times, every port's byte windows (in any order)."""
    windows = [{p: sorted(w) for p, w in r[1].items() if w} for r in (a, b)]
    return a[0] == b[0] and a[3] == b[3] and windows[0] == windows[1]


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(task_graphs(), st.data())
def test_rerun_times_what_delays_reach_exactly(monkeypatch_share, streams, data):
    dag = fast._Dag(streams, CAPACITY.__getitem__)
    alone = dag.run({})
    transfers = [i for i, k in enumerate(dag.kind) if k]
    if not transfers:
        return
    found = fast._contention_delays(alone[1])
    chosen = data.draw(st.lists(st.sampled_from(transfers), min_size=1, max_size=4, unique=True))
    picked = {i: data.draw(st.floats(0.0, 5e-3)) for i in chosen}
    for delays in (found, picked) if found else (picked,):
        assert _same(dag.run(delays), dag.rerun(alone, delays))


@pytest.fixture(scope="module")
def monkeypatch_share():
    """Never fall back to the whole walk: every rerun takes the partial path."""
    before = fast.RERUN_SHARE
    fast.RERUN_SHARE = 1.0
    yield
    fast.RERUN_SHARE = before


def test_longest_path_with_rerun_equals_whole_walks():
    """The contention rounds of GPT-3 175B's default layout at pp 16 (its ~100 delayed transfers the DP
    collectives and last sends): the same step, and every task's times, as rounds of whole walks."""
    scenario = load_scenario(None, ["parallelism.pp=16", "parallelism.global_batch_size=512"])
    plan = get_kind("spmd").compile(scenario, chains=True)
    capacity = functools.lru_cache(maxsize=None)(plan.topology.port_capacity)
    dag = fast._Dag(plan.streams, capacity)
    alone = dag.run({})
    assert fast._any_overlap(alone[1], alone[0])
    delays = fast._contention_delays(alone[1])
    whole, part = dag.run(delays), dag.rerun(alone, delays)
    assert _same(whole, part)
    assert sum(1 for x, y in zip(alone[3][1], part[3][1], strict=True) if x != y) < len(dag.flat) / 10


@pytest.mark.parametrize("overrides", [["parallelism.pp=16", "parallelism.global_batch_size=512"],
                                       ["parallelism.pp=8", "parallelism.virtual_stages=1",
                                        "parallelism.schedule=1f1b", "parallelism.global_batch_size=256"]])
def test_busiest_stage_compares_bubbles_to_the_bit(overrides):
    scenario = load_scenario(None, overrides)
    plan = get_kind("spmd").compile(scenario, chains=True)
    makespan = Engine(plan.topology.port_capacity).run(
        plan.streams, {(a, MEMORY_COUNTER): b for a, b in plan.memory_base_bytes.items()})
    for actor in plan.compute_tasks:
        assert pipeline_bubble_s(plan, actor, makespan) == time_breakdown(plan, actor, makespan)["pipeline_bubble"]
    critical = critical_actor(plan)
    breakdown = time_breakdown(plan, critical, makespan)
    assert _busiest_stage(plan, critical, breakdown, makespan) == least_waiting_stage(
        stage_breakdowns(plan, critical, makespan), breakdown)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 3)), max_size=30))
def test_overlapping_runs_are_the_runs_of_windows_starting_before_an_earlier_end(spans):
    windows = sorted((start, start + length, k, length) for k, (start, length) in enumerate(spans))
    late = [k for k in range(1, len(windows)) if windows[k][0] < max(w[1] for w in windows[:k])]
    runs = []
    for k in late:
        runs = runs[:-1] + [(runs[-1][0], k + 1)] if runs and runs[-1][1] == k else runs + [(k - 1, k + 1)]
    assert fast._overlapping_runs(windows) == runs


def _timed(name: str, actor: str, stream: str, category: str, start: float, end: float, deps=()) -> Task:
    task = Task(name, actor, stream, category, duration_s=end - start, deps=list(deps))
    task.start_s, task.end_s = start, end
    return task


def test_bubble_walk_charges_every_category_as_the_whole_breakdown():
    """The chains ``pipeline_bubble_s`` walks without the whole breakdown: a gap waiting on a task whose own
    category is ``pipeline_bubble`` (swarm's barriers), on another rank's kernel, on a send, on a chain of
    parts and on a category outside the breakdown, and the tail after the last kernel; the bubble is
    time_breakdown's to the bit (the cheaper walk once left out the first of these)."""
    y = _timed("y", "c", "dp", "dp_comm", 0.5, 3.0)
    barrier = _timed("barrier", "b", "compute", "pipeline_bubble", 2.0, 4.0, [y])
    other = _timed("other", "b", "compute", "compute", 3.5, 6.5, [barrier])
    send = _timed("send", "b", "pp", "pp_comm", 6.5, 7.25, [other])
    odd = _timed("odd", "d", "misc", "no_such_category", 6.0, 8.5, [send])
    k1 = _timed("k1", "a", "compute", "compute", 0.0, 1.0)
    k2 = _timed("k2", "a", "compute", "compute", 5.0, 6.0, [k1, barrier])
    k3 = _timed("k3", "a", "compute", "compute", 9.0, 10.0, [k2, odd])
    tail = _timed("reduce", "a", "dp", "dp_comm", 10.0, 11.5, [k3, send])

    class _Plan:
        compute_tasks = {"a": [k1, k2, k3]}
        streams = {("a", "compute"): [k1, k2, k3], ("a", "dp"): [tail], ("b", "compute"): [barrier, other],
                   ("b", "pp"): [send], ("c", "dp"): [y], ("d", "misc"): [odd]}

    whole = time_breakdown(_Plan, "a", 12.0)
    assert whole["pipeline_bubble"] > 0 and whole["dp_comm"] > 0
    assert pipeline_bubble_s(_Plan, "a", 12.0) == whole["pipeline_bubble"]
