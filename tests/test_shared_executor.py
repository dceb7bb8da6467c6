"""Shared executors in the engine (simulator/engine/engine.py): tasks of several actors on one key,
held back by lower priority numbers and slowed by the ``interferes`` of waiting lower-priority work;
exact timelines on toy task graphs."""

from __future__ import annotations

import math

import pytest

from simulator.engine.engine import Engine, Task


def _run(*tasks: Task, until_done: list[Task] | None = None) -> float:
    streams: dict[tuple[str, str], list[Task]] = {}
    for t in tasks:
        streams.setdefault((t.actor, t.stream), []).append(t)
    return Engine(lambda port: 1.0).run(streams, until_done=until_done)


def _foreground(gpu: str = "gpu0"):
    """k1 (1 s) on the GPU, then a 2 s wait off it (communication), then k2 (1 s) on the GPU."""
    k1 = Task("k1", "fg", "compute", "compute", duration_s=1.0, shares=gpu)
    c1 = Task("c1", "fg", "net", "dp_comm", duration_s=2.0, deps=[k1])
    k2 = Task("k2", "fg", "compute", "compute", duration_s=1.0, deps=[c1], shares=gpu)
    return k1, c1, k2


def test_background_fills_exactly_the_foregrounds_idle_gap():
    # fg: k1 0..1, c1 1..3, k2 3..4 (as alone). bg (2.5 s of work, priority 1): held 0..1, runs
    # in the gap 1..3 (2 s done), held 3..4, finishes its last 0.5 s at 4..4.5.
    k1, c1, k2 = _foreground()
    bg = Task("b", "bg", "compute", "compute", duration_s=2.5, shares="gpu0", priority=1)
    end = _run(k1, c1, k2, bg)
    assert (k1.start_s, k1.end_s, c1.end_s, k2.start_s, k2.end_s) == (0.0, 1.0, 3.0, 3.0, 4.0)
    assert bg.end_s == pytest.approx(4.5)
    assert end == pytest.approx(4.5)


def test_interference_slows_the_foreground_while_background_work_waits():
    # bg interferes 0.5: fg kernels run at 1/1.5 while the bg kernel is ready. k1 0..1.5, c1 1.5..3.5,
    # bg runs 1.5..3.5 (2 s of its 2.5), k2 3.5..5.0 (slowed: bg still waits), bg 5.0..5.5.
    k1, c1, k2 = _foreground()
    bg = Task("b", "bg", "compute", "compute", duration_s=2.5, shares="gpu0", priority=1, interferes=0.5)
    _run(k1, c1, k2, bg)
    assert k1.end_s == pytest.approx(1.5)
    assert (c1.start_s, c1.end_s) == (pytest.approx(1.5), pytest.approx(3.5))
    assert (k2.start_s, k2.end_s) == (pytest.approx(3.5), pytest.approx(5.0))
    assert bg.end_s == pytest.approx(5.5)


def test_interference_stops_when_the_background_has_nothing_waiting():
    # bg's 1 s kernel ends in the gap (1..2): k2 at 3..4 runs at full speed again.
    k1, c1, k2 = _foreground()
    bg = Task("b", "bg", "compute", "compute", duration_s=1.0, shares="gpu0", priority=1, interferes=0.5)
    _run(k1, c1, k2, bg)
    assert k1.end_s == pytest.approx(1.5)
    assert bg.end_s == pytest.approx(2.5)
    assert (k2.start_s, k2.end_s) == (pytest.approx(3.5), pytest.approx(4.5))


def test_priorities_order_three_jobs_and_other_executors_are_free():
    # fg gap 1..3; job 1 (priority 1, 1.5 s) takes 1..2.5; job 2 (priority 2, 1 s) gets 2.5..3 and,
    # after k2 (3..4), 4..4.5. A job on another GPU is not held back at all.
    k1, c1, k2 = _foreground()
    j1 = Task("j1", "bg1", "compute", "compute", duration_s=1.5, shares="gpu0", priority=1)
    j2 = Task("j2", "bg2", "compute", "compute", duration_s=1.0, shares="gpu0", priority=2)
    other = Task("o", "bg3", "compute", "compute", duration_s=1.0, shares="gpu1", priority=5)
    _run(k1, c1, k2, j1, j2, other)
    assert (k2.start_s, k2.end_s) == (3.0, 4.0)
    assert j1.end_s == pytest.approx(2.5)
    assert j2.end_s == pytest.approx(4.5)
    assert (other.start_s, other.end_s) == (0.0, 1.0)


def test_gap_time_adds_up_across_many_background_kernels():
    # bg: ten 0.3 s kernels back to back. The GPU is never idle while bg has work: fg busy 2 s,
    # bg 3 s, so the last bg kernel ends at exactly 5 s; fg's timeline is unchanged.
    k1, c1, k2 = _foreground()
    kernels = [Task(f"b{i}", "bg", "compute", "compute", duration_s=0.3, shares="gpu0", priority=1)
               for i in range(10)]
    _run(k1, c1, k2, *kernels)
    assert k2.end_s == 4.0
    assert kernels[-1].end_s == pytest.approx(5.0)
    done_by_4 = sum(1 for b in kernels if b.end_s <= 4.0 + 1e-12)
    assert done_by_4 == 6  # 2 s of gap hold six 0.3 s kernels (the seventh is cut by k2)


def test_run_until_done_leaves_the_background_unfinished():
    k1, c1, k2 = _foreground()
    kernels = [Task(f"b{i}", "bg", "compute", "compute", duration_s=1.0, shares="gpu0", priority=1)
               for i in range(10)]
    end = _run(k1, c1, k2, *kernels, until_done=[k1, c1, k2])
    assert end == 4.0
    assert [b.end_s for b in kernels[:2]] == [pytest.approx(2.0), pytest.approx(3.0)]
    assert all(math.isnan(b.end_s) for b in kernels[2:])


def test_equal_priorities_do_not_arbitrate():
    a = Task("a", "x", "compute", "compute", duration_s=1.0, shares="gpu0", priority=1, interferes=9.0)
    b = Task("b", "y", "compute", "compute", duration_s=1.0, shares="gpu0", priority=1, interferes=9.0)
    _run(a, b)
    assert a.end_s == b.end_s == 1.0
