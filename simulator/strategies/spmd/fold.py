"""The discrete-event engine on a folded pipeline: the steady state's identical micro-batches
run once, checked to be periodic, and extrapolated, instead of unrolled.

A pipeline of p stages running m micro-batches under 1F1B or interleaved 1F1B repeats the same
work for every micro-batch once the pipeline is full, and the engine is deterministic and
time-invariant. :func:`engine_fold_points` picks a period q (one micro-batch, then p, for 1F1B; p for
the interleaved schedule) and points m_b = m_a + q, m_c = m_a + 2q past the fill (m_a ≡ m mod q: every
stage's micro-batches in flight, so its memory peak, at their steady count). The engine (unchanged,
the reference) runs once, on the plan at r = m_c + q micro-batches for q = 1, m_c + 2q for a longer
period (the fewest with enough clean periods for the check, ``_more``), and the run folds only where it
shows one period repeating exactly around the point t* where a plan with q more micro-batches would
first do something else:

- t*: on each compute stream, the plan with more micro-batches differs first after the backward
  pass that follows the last forward (the schedules run warm-up forwards, then one forward and one
  backward alternately, then the cool-down backwards; past the fill only the alternation grows with
  m), or at that backward where it is the last micro-batch's (the planner builds those apart: their
  gradient reductions). t* is the earliest time a compute stream reaches that place (tests check the
  place against the plan with q more micro-batches); every task of a new period waits for a pass of it.
- the check: the period delta is that stream's last task before t* against its like q micro-batches
  before. Every task of every stream that runs in [t* - 2.75 delta, t*] must be one of the planner's
  per-micro-batch tasks (named ``.mbN.``) whose like q micro-batches before started and ended exactly
  delta earlier, and every one in [t* - 2.75 delta, t* - 1.5 delta] one whose like q micro-batches
  later runs exactly delta later, with the same duration, allocation and free (to 1e-9 of the step;
  round-off of thousands of sums is ~1e-13); each actor's memory comes back to its value after one
  period (what it allocates and frees over one period of each stream is equal); every rank's last
  kernel ends after t*.

Why that is the run with more micro-batches: up to t* the run with q more micro-batches is this one
(the same tasks in the same order; nothing new has started). At t* the engine's state -- what each
stream is running or waiting for, every transfer on the network, the memory counters -- is its state
at t* - delta, every task one period on (every task over the window has its like one period before
and after), and what is left to run is the same plan one period on (the new period goes in where the
alternation ends). The engine being deterministic and time-invariant, everything after t* runs
exactly as everything after t* - delta did in this run, delta later: the run with q more micro-batches
is this run with one period inserted at t*, and that run again shows the same window (one period
later), so by induction the run at m is this run with (m - r)/q periods inserted. So the makespan and
every rank's last kernel end grow by (m - r)/q · delta; each breakdown f grows by f's share of one
period: f(m) = f(r) + (m - r)/q · (what the breakdown adds over one period of the rank's compute
stream in the window: each task and the gap before it); the memory peaks are this run's. Otherwise
the caller runs the unrolled plan. A stream that falls a little further behind every micro-batch
(ZeRO-3 gathers on gpt-1.7b, pp 2: the step grows by the same amount at 3, 4 and 5 micro-batches and
by more from 10 on), a pipeline whose increments repeat only every p micro-batches (a toy pipeline
grows by 5.652, 5.637, 5.652, 5.652 ms per micro-batch, over and over) and kernel/communication
interference (increments that wander without a period) fail the window and run unrolled. Until
2026-12-06 the engine ran the plans at m_b and m_c and checked that the second was the first with a
period inserted; one run of r = m_c + 2q micro-batches costs about half of that (Megatron-1T, pp 64:
69 micro-batches against 66 + 67), and its figures differ from the two-run extrapolation by round-off
(examples: at most 2e-13 relative); since 2026-12-06 (trim24) q = 1 runs m_c + q (Megatron-1T: 68). Folded and unrolled agree to 1e-9 relative (tests/test_engine_fold.py:
toy and real layouts, 1F1B and interleaved, shared links, sync jitter, full and symmetric mode).

Not folded: several steps, traces (``detail``), stragglers (per-device draws), GPipe (its memory
grows with m: no steady peak), ZB-H1 (a list schedule, not periodic), and plans where the points
tried would not at least halve the engine's work (of ``examples/``, only llama3-70b-gb200-nvl72 and
gpt-oss-120b-nemo-64xh100 fold). A folded result has no memory-over-time series and no
timeline (the result says ``engine_fold``: the micro-batch count the engine ran).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from operator import attrgetter

from simulator.engine.engine import Engine
from simulator.scenario import Scenario
from simulator.strategies.plan import MEMORY_COUNTER
from simulator.strategies.spmd.fast import _with_micro_batches

# Relative tolerance of the periodicity check (as the fast path's: round-off is ~1e-13 relative).
AFFINE_RTOL = 1e-9
# The checked window: the last _BACK periods before t* (one-run check, module docstring).
_BACK = 2.75
# The run: periods past the second point, the fewest with which stage 0 of a 1F1B pipeline has over _BACK + 1
# clean periods of the alternation past its first backward (which allocates the gradients): one past it
# leaves 3 + 1/q (fold24, 2026-12-06), enough for q = 1 alone; two leave 4 + 1/q. No run shorter than
# that folds (Megatron-1T, q = 1: 68 folds, 67 is refused by the check).
def _more(q: int) -> int:
    return 1 if q == 1 else 2

# Fold only where the points tried (m_b + m_c each, as when the engine ran both; it now runs m_c + 2q)
# cost at most this share of the unrolled plan's micro-batches.
MAX_WORK_SHARE = 0.5
FOLDED_SCHEDULES = ("1f1b", "interleaved")
_END, _START = attrgetter("end_s"), attrgetter("start_s")  # read in C: 17k tasks a Megatron-1T point


@dataclass(frozen=True)
class FoldedRun:
    """What :func:`simulator.simulate.simulate` reports from an engine run, extrapolated to the
    scenario's micro-batches. Breakdowns are per step (one step)."""

    makespan_s: float
    critical_actor: str
    breakdown: dict[str, float]
    # :func:`simulator.simulate.least_waiting_stage` of the stages' extrapolated breakdowns: the stage (None:
    # the critical rank's own) and its first actor's breakdown per step ({} with None)
    busiest_stage: int | None
    busiest: dict[str, float]
    memory_peak_bytes: dict[str, float]
    stage_of: dict[str, int]
    mode: str | None
    micro_batches_evaluated: tuple[int, ...]


def engine_fold_points(scenario: Scenario) -> tuple[tuple[int, int], ...]:
    """The micro-batch counts the engine may be run at, one pair per period tried in order, or ()
    where the plan is not folded (module docstring). The period q: one micro-batch, then p, for 1F1B
    (a pipeline's increments may repeat only every p micro-batches); p for the interleaved schedule
    (its order repeats per group of p). The first point is past the fill: 1F1B from m = p + 1 (stage i
    keeps min(p - i, m) micro-batches in flight: all saturated from m = p), interleaved from 3p (stage
    i's warm-up, 2(p - i - 1) + (v - 1)p chunk passes, fits in m·v from m = 2p; at 2p stage 0's period
    before the new one is still warm-up, which the insertion check refuses), then from 4p, 6p and 10p
    where the earlier start is refused (a pipeline of uneven chunks settles later); all ≡ m (mod q). The
    engine runs one period past that first point and one more (module docstring). Pairs are kept
    while all tried so far cost at most half the unrolled plan's micro-batches."""
    par, sim = scenario.parallelism, scenario.simulation
    if (sim.steps != 1 or sim.stragglers is not None or scenario.co_located or par.pp < 2
            or par.schedule not in FOLDED_SCHEDULES or scenario.strategy_kind != "spmd"
            or any(g.accelerator.efficiency.input_us_per_sample for g in scenario.groups)):  # max(GPU, input): not affine
        return ()
    m, p = par.num_micro_batches, par.pp
    # interleaved: from 3p, else later (a pipeline of uneven chunks, ResNet-50 at pp 2-8, v 2, is still
    # settling at 3p + p: its new period runs 1.5 us short of the one before it; folds from 4p-10p)
    lowests = (3 * p, 4 * p, 6 * p, 10 * p) if par.schedule == "interleaved" else (p + 1,)
    periods = (p,) if par.schedule == "interleaved" else (1, p)
    out, work = [], 0
    for lowest in lowests:
        for q in dict.fromkeys(periods):
            first = lowest + (m - lowest) % q
            points = (first + q, first + 2 * q)
            work += sum(points)
            if work > MAX_WORK_SHARE * m:
                return tuple(out)
            out.append(points)
    return tuple(out)


def _plan(scenario: Scenario, micro_batches: int, mode: str | None):
    from simulator.strategies.registry import get_kind

    return get_kind("spmd").compile(_with_micro_batches(scenario, micro_batches), mode=mode, chains=True)


def _point(scenario: Scenario, micro_batches: int, mode: str | None):
    """One engine run on the plan at ``micro_batches``: the plan (its tasks timed), the engine (its
    counter peaks) and the makespan."""
    plan = _plan(scenario, micro_batches, mode)
    engine = Engine(plan.topology.port_capacity, counter_series=False)  # a folded result has no series
    makespan = engine.run(plan.streams, {(a, MEMORY_COUNTER): b for a, b in plan.memory_base_bytes.items()})
    return plan, engine, makespan


def _label(name: str) -> tuple[str, int] | None:
    """(the task's name without its micro-batch, the micro-batch) from the planner's names
    (``F.mb12.c0``, ``send_grad.mb12.c0``, ``B.mb12.c0.L1.dp_grad_all_reduce``); None where it has none
    (``optimizer_step``)."""
    parts = name.split(".", 2)  # the common shape first: kind.mbN.rest
    if len(parts) == 3 and parts[1][:2] == "mb" and parts[1][2:].isdigit():
        return f"{parts[0]}.{parts[2]}", int(parts[1][2:])
    i = name.find(".mb")
    if i < 0:
        return None
    j = name.find(".", i + 3)
    digits = name[i + 3:] if j < 0 else name[i + 3:j]
    if not digits.isdigit():
        return None
    return (name[:i] if j < 0 else name[:i] + name[j:]), int(digits)


def _item(name: str) -> list[str]:
    """A pass's name without what follows its chunk (``B.mb12.c0`` of ``B.mb12.c0.L1.recompute``): the tasks
    of one schedule item (a pass of a micro-batch through a chunk) share it."""
    return name.split(".", 3)[:3]


def _divergence(tasks: list, micro_batches: int) -> int | None:
    """Where a compute stream of the plan at ``micro_batches`` and of the plan with more of them first
    differ: after the backward pass that follows the last forward, or at that backward where it is the
    last micro-batch's. 1F1B and interleaved 1F1B (simulator/strategies/spmd/schedule.py) run warm-up
    forwards, then one forward and one backward alternately, then the cool-down backwards; past the fill
    only the alternation grows with the micro-batches, so with more of them another forward comes there
    and every earlier pass is the same, but that the planner builds the last micro-batch's backward
    passes apart (its gradient reductions, a fused update: simulator/strategies/spmd/plan_tasks.py), and
    every one of them comes after the last forward. None without a forward."""
    f = len(tasks) - 1
    while f >= 0 and not tasks[f].name.startswith("F."):
        f -= 1
    if f < 0:
        return None
    d = f + 1
    if d < len(tasks) and tasks[d].name.startswith("B."):
        item = _item(tasks[d].name)
        if item[1] == f"mb{micro_batches - 1}":
            return d
        while d < len(tasks) and _item(tasks[d].name) == item:
            d += 1
    return d


def _window(tasks: list, lo: float, hi: float) -> range:
    """Positions of a stream's tasks that run at some time in [lo, hi] (start < hi, end > lo), widened to
    every task ending after lo (a stream's tasks start in order; their ends too, but for propagation)."""
    first = bisect_left(tasks, hi, key=_START)
    i = first
    while i > 0 and tasks[i - 1].end_s > lo:
        i -= 1
    return range(i, first)


def _periodic_window(plan, micro_batches: int, q: int, tol: float):
    """The one-run check (module docstring) on the plan at ``micro_batches``, run: (delta, t*), the
    period in seconds and the time at which a run with q more micro-batches first does something
    else, or None where the run is not one period repeating over [t* - 2.75 delta, t*]."""
    t_star, first = math.inf, None
    for tasks in plan.compute_tasks.values():
        d = _divergence(tasks, micro_batches)
        if d is None or d == 0:
            return None
        if tasks[d - 1].end_s < t_star:
            t_star, first = tasks[d - 1].end_s, tasks[d - 1]
    # the period: that stream's last task before t* against its like q micro-batches before
    label = _label(first.name)
    stream = plan.streams[(first.actor, first.stream)]
    if label is None:
        return None
    before = next((t for t in reversed(stream) if _label(t.name) == (label[0], label[1] - q)), None)
    if before is None:
        return None
    delta = t_star - before.end_s
    if not delta > 0:
        return None
    lo, mid = t_star - _BACK * delta, t_star - 1.5 * delta
    net: dict[str, float] = {}
    for (actor, _), stream in plan.streams.items():
        span = _window(stream, lo - 1.25 * delta, t_star)
        if not span:
            continue
        where = {}
        labels = [_label(stream[i].name) for i in span]  # each task's (shape, micro-batch), parsed once
        for i, label in zip(span, labels, strict=True):
            if label is not None:
                where[label] = i
        period_start = None
        for i, label in zip(span, labels, strict=True):
            task = stream[i]
            if task.end_s <= lo:
                continue
            if label is None:
                return None  # something that is not a micro-batch's runs in the steady state
            for step in (-q, q):
                if step > 0 and task.start_s >= mid:
                    continue
                other = where.get((label[0], label[1] + step))
                if other is None:
                    return None
                o = stream[other]
                shift = delta if step > 0 else -delta
                if (abs(o.start_s - task.start_s - shift) > tol or abs(o.end_s - task.end_s - shift) > tol
                        or o.duration_s != task.duration_s or o.alloc_bytes != task.alloc_bytes
                        or o.free_bytes != task.free_bytes):
                    return None
                if step > 0 and period_start is None:
                    period_start = (i, other)
        if period_start is not None:  # one period of this stream: what it allocates and frees
            a, b = period_start
            net[actor] = net.get(actor, 0.0) + sum(t.alloc_bytes - t.free_bytes for t in stream[a:b])
    for actor, change in net.items():
        if abs(change) > AFFINE_RTOL * max(1.0, abs(plan.memory_base_bytes.get(actor, 0.0))):
            return None  # memory grows (or shrinks) every period: no steady peak
    return delta, t_star


class _Period:
    """What the breakdown functions read of a plan: one actor's compute tasks of one period, after a mark
    standing for the task before them (it ends where that task ended; the breakdown charges the time
    before it, from 0, to the pipeline bubble, and nothing else: it waited for nothing and ran for 0 s)."""

    __slots__ = ("compute_tasks",)

    def __init__(self, actor: str, before, tasks: list):
        self.compute_tasks = {actor: [_Mark(actor, before.end_s), *tasks]}


class _Mark:
    __slots__ = ("actor", "start_s", "end_s")
    stream, category, deps, parts, segments = "compute", "compute", (), None, None

    def __init__(self, actor: str, end_s: float):
        self.actor, self.start_s, self.end_s = actor, end_s, end_s


def _one_period(plan, actor: str, q: int, t_star: float, delta: float, fn):
    """``fn``'s figures (a breakdown function of (plan, actor, step)) added by one period of ``actor``'s
    compute stream: its tasks from the first starting after t* - 2.25 delta (whose gap before it lies in
    the checked window) to the one q micro-batches after it, each with the gap before it (what the
    time breakdown adds per task). None where that period is not inside the checked window."""
    tasks = plan.compute_tasks[actor]
    lo = t_star - _BACK * delta
    j = max(1, bisect_left(tasks, t_star - 2.25 * delta, key=_START))
    while j < len(tasks) and (_label(tasks[j].name) is None or tasks[j - 1].end_s <= lo):
        j += 1  # the gap before it (and what it waited for) inside the checked window
    if j >= len(tasks) or tasks[j].start_s >= t_star - 1.5 * delta:
        return None
    shape, micro_batch = _label(tasks[j].name)
    k = next((i for i in range(j + 1, len(tasks)) if _label(tasks[i].name) == (shape, micro_batch + q)), None)
    if k is None or tasks[k].start_s >= t_star:
        return None
    mark = tasks[j - 1].end_s
    one = fn(_Period(actor, tasks[j - 1], tasks[j:k]), actor, tasks[k - 1].end_s)
    if isinstance(one, dict):
        one["pipeline_bubble"] -= mark
        return one
    return one - mark


def _one_period_later(before: dict, after: dict, shift_s: float, scale: float) -> bool:
    """(The fast path's fold check, simulator/strategies/spmd/fast.py: its walks of two plans; the engine's
    fold checks one run, :func:`_periodic_window`.) Whether the run with one more period (``after``) is the run ``before`` with that period
    inserted: on every stream, its tasks up to some position start and end exactly when they did
    (what came before the new period), and every later one exactly ``shift_s`` later (what came
    after it, now one period on). A schedule that is not yet periodic, or periodic over several
    periods (a pipeline whose increments repeat every few micro-batches), moves its later tasks by
    other amounts, and is not folded."""
    if before.keys() != after.keys():
        return False
    tol = AFFINE_RTOL * scale

    def shifted(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return abs(b[0] - a[0] - shift_s) <= tol and abs(b[1] - a[1] - shift_s) <= tol

    for key, old in before.items():
        new = after[key]
        inserted = len(new) - len(old)
        if inserted < 0:
            return False
        cut = len(old)  # the first task that moved: where the new period went in
        for j, (start, end) in enumerate(old):
            s, e = new[j]
            if abs(s - start) > tol or abs(e - end) > tol:
                cut = j
                break
        if any(not shifted(old[j], new[j + inserted]) for j in range(cut, len(old))):
            return False
        # The new period itself runs one period after the one before it (the schedule is periodic
        # where it went in, not drifting: a stream that falls further behind every micro-batch fails).
        if inserted and (cut < inserted or any(not shifted(new[j - inserted], new[j])
                                               for j in range(cut, cut + inserted))):
            return False
    return True


def folded_engine_run(scenario: Scenario, mode: str | None = None, observe=None) -> FoldedRun | None:
    """The engine's figures for ``scenario`` from one run of its folded plan, or None where it is
    not folded or the checks refuse (run the unrolled plan then). ``observe(micro_batches, plan)``:
    called with the plans at the fold's two points (the search's fast path extrapolates its walks of
    them, as it did beside the two-run fold); they are built for it alone."""
    for points in engine_fold_points(scenario):
        folded = _folded(scenario, points, mode, observe)
        if folded is not None:
            return folded
    return None


def _folded(scenario: Scenario, points: tuple[int, int], mode: str | None, observe=None) -> FoldedRun | None:
    from simulator.simulate import least_waiting_stage, pipeline_bubble_s, time_breakdown

    q = points[1] - points[0]
    ran = points[1] + _more(q) * q
    if observe is not None:  # the search's fast path extrapolates its walks of the plans at both points
        for k in points:
            observe(k, _plan(scenario, k, mode))
    plan, engine, makespan = _point(scenario, ran, mode)
    periods = (scenario.parallelism.num_micro_batches - ran) // q
    ends = {a: max(map(_END, ts), default=0.0) for a, ts in plan.compute_tasks.items()}
    stage_of = plan.stage_of
    critical = max(ends, key=lambda a: (ends[a], -stage_of[a]))
    found = _periodic_window(plan, ran, q, AFFINE_RTOL * makespan)
    if found is None:
        return None
    delta, t_star = found
    if any(end <= t_star for end in ends.values()):
        return None  # a rank whose last kernel ran before the new period would not move
    shift = periods * delta

    def grown(actor: str, fn, value):
        step = _one_period(plan, actor, q, t_star, delta, fn)
        if step is None:
            return None
        if isinstance(value, dict):
            return {key: value[key] + periods * step[key] for key in value}
        return value + periods * step

    breakdown = grown(critical, time_breakdown, time_breakdown(plan, critical, makespan))
    if breakdown is None:
        return None
    first_actor: dict[int, str] = {}  # each stage's first actor (simulate.stage_breakdowns)
    for actor in plan.compute_tasks:
        first_actor.setdefault(stage_of[actor], actor)
    stages = {}
    if len(first_actor) >= 2:
        # every other stage's bubble, to the bit its breakdown's (simulate.pipeline_bubble_s): the stages are
        # compared by it (simulate.least_waiting_stage), and only the winner's whole breakdown is made
        for stage, actor in sorted(first_actor.items()):
            if actor == critical:
                continue
            bubble = grown(actor, pipeline_bubble_s, pipeline_bubble_s(plan, actor, makespan))
            if bubble is None:
                return None
            stages[stage] = {"pipeline_bubble": bubble / plan.steps}
    busiest_stage, _ = least_waiting_stage(stages, breakdown)
    busiest = {}
    if busiest_stage is not None:
        actor = first_actor[busiest_stage]
        whole = grown(actor, time_breakdown, time_breakdown(plan, actor, makespan))
        if whole is None:
            return None
        busiest = {k: v / plan.steps for k, v in whole.items()}
    peaks = {a: engine.counter_peaks[(a, MEMORY_COUNTER)] for a in plan.memory_base_bytes}
    return FoldedRun(makespan + shift, critical, breakdown, busiest_stage, busiest, peaks, dict(stage_of),
                     plan.mode, (ran,))
