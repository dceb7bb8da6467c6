"""The discrete-event engine (simulator/engine/engine.py) on toy task graphs with exact end times."""

from __future__ import annotations

import pytest

from simulator.engine.engine import Engine, Task

GB = 1e9


def _engine(capacities: dict[str, float] | None = None) -> Engine:
    caps = capacities or {}
    return Engine(lambda port: caps[port])


def _streams(*tasks: Task) -> dict[tuple[str, str], list[Task]]:
    """Group tasks into (actor, stream) lists in the given order."""
    out: dict[tuple[str, str], list[Task]] = {}
    for t in tasks:
        out.setdefault((t.actor, t.stream), []).append(t)
    return out


def test_chain_on_one_stream_runs_back_to_back():
    # a (1 s), b (2 s), c (0.5 s) on one stream, in order: ends 1, 3, 3.5.
    a = Task("a", "r0", "compute", "compute", duration_s=1.0)
    b = Task("b", "r0", "compute", "compute", duration_s=2.0)
    c = Task("c", "r0", "compute", "compute", duration_s=0.5)
    end = _engine().run(_streams(a, b, c))
    assert (a.start_s, a.end_s) == (0.0, 1.0)
    assert (b.start_s, b.end_s) == (1.0, 3.0)
    assert (c.start_s, c.end_s) == (3.0, 3.5)
    assert end == 3.5


def test_two_streams_run_in_parallel_and_dependency_waits():
    # compute: k1 (2 s) -> k2 (1 s, depends on comm c1);  comm: c1 (3 s, fixed duration).
    # k1 0..2, c1 0..3, k2 waits for c1: 3..4. Step = 4.
    k1 = Task("k1", "r0", "compute", "compute", duration_s=2.0)
    c1 = Task("c1", "r0", "dp", "dp_comm", duration_s=3.0)
    k2 = Task("k2", "r0", "compute", "compute", duration_s=1.0, deps=[c1])
    end = _engine().run(_streams(k1, k2, c1))
    assert k2.ready_s == 3.0
    assert (k2.start_s, k2.end_s) == (3.0, 4.0)
    assert end == 4.0


def test_stream_order_is_kept_even_when_a_later_task_is_ready():
    # Stream s: x (depends on y, which takes 5 s on another stream), then z (no deps, 1 s).
    # z is ready at 0 but must wait for x: x 5..6, z 6..7.
    y = Task("y", "r1", "compute", "compute", duration_s=5.0)
    x = Task("x", "r0", "s", "compute", duration_s=1.0, deps=[y])
    z = Task("z", "r0", "s", "compute", duration_s=1.0)
    _engine().run(_streams(y, x, z))
    assert (x.start_s, x.end_s) == (5.0, 6.0)
    assert (z.start_s, z.end_s) == (6.0, 7.0)


def test_cross_actor_dependency_diamond():
    # a (r0, 1 s) -> b (r1, 2 s) and c (r2, 4 s) both depend on a; d (r0, 1 s) depends on b and c.
    # a 0..1; b 1..3; c 1..5; d after a on r0's stream and after b, c: 5..6.
    a = Task("a", "r0", "compute", "compute", duration_s=1.0)
    b = Task("b", "r1", "compute", "compute", duration_s=2.0, deps=[a])
    c = Task("c", "r2", "compute", "compute", duration_s=4.0, deps=[a])
    d = Task("d", "r0", "compute", "compute", duration_s=1.0, deps=[b, c])
    end = _engine().run(_streams(a, b, c, d))
    assert (b.start_s, b.end_s) == (1.0, 3.0)
    assert (c.start_s, c.end_s) == (1.0, 5.0)
    assert (d.start_s, d.end_s) == (5.0, 6.0)
    assert end == 6.0


def test_network_task_moves_bytes_with_latency():
    # A task moving 2 GB over port p (1 GB/s) with 10 us latency after a 1 s kernel:
    # kernel 0..1, transfer starts at 1 and ends at 1 + 10e-6 + 2.
    k = Task("k", "r0", "compute", "compute", duration_s=1.0)
    t = Task("t", "r0", "comm", "dp_comm", demands={"p": 2 * GB}, latency_s=10e-6, deps=[k])
    end = _engine({"p": 1 * GB}).run(_streams(k, t))
    assert t.start_s == 1.0
    assert t.end_s == pytest.approx(1.0 + 10e-6 + 2.0, rel=1e-12)
    assert end == t.end_s


def test_network_tasks_of_two_actors_share_a_port():
    # Two actors send 1 GB each over the same port (1 GB/s) at t=0: each at 0.5 GB/s, both end at 2 s.
    t0 = Task("t0", "r0", "pp", "pp_comm", demands={"link": 1 * GB})
    t1 = Task("t1", "r1", "pp", "pp_comm", demands={"link": 1 * GB})
    _engine({"link": 1 * GB}).run(_streams(t0, t1))
    assert t0.end_s == pytest.approx(2.0, rel=1e-12)
    assert t1.end_s == pytest.approx(2.0, rel=1e-12)


def test_rendezvous_starts_at_the_later_arrival_and_ends_together():
    # r0 computes 1 s, r1 computes 3 s, then both join collective "ar" (size 2) moving 1 GB over
    # their own ports (1 GB/s each) with 2 us latency. Both start at max(1, 3) = 3 and end at
    # 3 + 2e-6 + 1 (one flow over both ports; each port carries its member's 1 GB).
    k0 = Task("k0", "r0", "compute", "compute", duration_s=1.0)
    k1 = Task("k1", "r1", "compute", "compute", duration_s=3.0)
    c0 = Task("c0", "r0", "tp", "tp_comm", demands={"r0:nvl_tx": 1 * GB}, latency_s=2e-6, deps=[k0],
              rendezvous="ar", rendezvous_size=2)
    c1 = Task("c1", "r1", "tp", "tp_comm", demands={"r1:nvl_tx": 1 * GB}, latency_s=2e-6, deps=[k1],
              rendezvous="ar", rendezvous_size=2)
    end = _engine({"r0:nvl_tx": 1 * GB, "r1:nvl_tx": 1 * GB}).run(_streams(k0, k1, c0, c1))
    assert c0.ready_s == 1.0 and c1.ready_s == 3.0
    assert c0.start_s == 3.0 and c1.start_s == 3.0
    assert c0.end_s == pytest.approx(3.0 + 2e-6 + 1.0, rel=1e-12)
    assert c1.end_s == c0.end_s
    assert end == c0.end_s


def test_rendezvous_without_bytes_is_a_barrier():
    # A zero-byte rendezvous: both members leave at the later arrival (2 s); the next kernels
    # (1 s each) then end at 3 s on both actors.
    k0 = Task("k0", "r0", "compute", "compute", duration_s=0.5)
    k1 = Task("k1", "r1", "compute", "compute", duration_s=2.0)
    b0 = Task("b0", "r0", "compute", "barrier", demands={}, deps=[k0], rendezvous="bar", rendezvous_size=2)
    b1 = Task("b1", "r1", "compute", "barrier", demands={}, deps=[k1], rendezvous="bar", rendezvous_size=2)
    n0 = Task("n0", "r0", "compute", "compute", duration_s=1.0)
    n1 = Task("n1", "r1", "compute", "compute", duration_s=1.0)
    _engine().run(_streams(k0, b0, n0, k1, b1, n1))
    assert b0.end_s == 2.0 and b1.end_s == 2.0
    assert n0.end_s == 3.0 and n1.end_s == 3.0


def test_dependency_cycle_raises_deadlock():
    a = Task("a", "r0", "compute", "compute", duration_s=1.0)
    b = Task("b", "r1", "compute", "compute", duration_s=1.0, deps=[a])
    a.deps.append(b)
    with pytest.raises(RuntimeError, match="deadlock"):
        _engine().run(_streams(a, b))


def test_stream_order_against_dependency_deadlocks():
    # On one stream x comes before y, but x depends on y: y can never start.
    y = Task("y", "r0", "compute", "compute", duration_s=1.0)
    x = Task("x", "r0", "compute", "compute", duration_s=1.0, deps=[y])
    with pytest.raises(RuntimeError, match="deadlock"):
        _engine().run({("r0", "compute"): [x, y]})


def test_rendezvous_missing_a_member_deadlocks():
    # Size 2 but only one member exists: it waits forever.
    c0 = Task("c0", "r0", "tp", "tp_comm", demands={"p": 1.0}, rendezvous="ar", rendezvous_size=2)
    with pytest.raises(RuntimeError, match="deadlock"):
        _engine({"p": 1.0}).run(_streams(c0))


def test_empty_run_ends_at_zero():
    assert _engine().run({}) == 0.0


def test_counters_without_series_keep_the_same_peaks():
    """``Engine(counter_series=False)`` (the folded pipeline's runs read only peaks): the same values
    and peaks, no series."""
    def tasks():
        a = Task("a", "r0", "compute", "compute", duration_s=1.0, alloc_bytes=3.0)
        b = Task("b", "r0", "compute", "compute", duration_s=1.0, alloc_bytes=2.0, free_bytes=4.0, deps=[a])
        c = Task("c", "r0", "other", "compute", duration_s=0.5, alloc_bytes=1.0, free_bytes=1.0)
        return {("r0", "compute"): [a, b], ("r0", "other"): [c]}
    full, lean = Engine(lambda port: 1e9), Engine(lambda port: 1e9, counter_series=False)
    assert full.run(tasks(), {("r0", "memory"): 1.0}) == lean.run(tasks(), {("r0", "memory"): 1.0}) == 2.0
    assert full.counter_peaks == lean.counter_peaks == {("r0", "memory"): 6.0}
    assert full.counters == lean.counters
    assert full.counter_series and not lean.counter_series
