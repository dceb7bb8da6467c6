"""The discrete-event engine on a folded pipeline: the steady state's identical micro-batches
evaluated at two counts and extrapolated, instead of unrolled.

A pipeline of p stages running m micro-batches under 1F1B or interleaved 1F1B repeats the same
work for every micro-batch once the pipeline is full, and the engine is time-invariant: once the
schedule is periodic, each further period adds the same time to every later event. This module
runs the engine (unchanged, the reference) on the plan at m_b = m_a + q and m_c = m_a + 2q micro-batches
(m_a ≡ m mod q, past the fill: every stage's micro-batches in flight, so its memory peak, at their
steady count; m_b one period further) and folds only where both of these hold:

- one more period is an insertion into a periodic schedule: on every stream of every actor, the
  run with q more micro-batches starts and ends each task up to some position exactly when the
  shorter run did, every later task exactly one period (the makespan's increment) later, and the
  new period's tasks exactly one period after the tasks just before them (to 1e-9 of the step;
  round-off of thousands of sums is ~1e-13). The last part matters: a stream that falls a little
  further behind every micro-batch (ZeRO-3 gathers on gpt-1.7b, pp 2) grows the step by the same
  amount at 3, 4 and 5 micro-batches and by more from 10 on (the drift reaches the critical path);
  extrapolated from 3-5 it was 0.7% short at 40;
- the critical rank is the same at both points and at m (picked from the extrapolated last kernel
  ends), and so is the set of stages; the simulated memory peaks are equal at both.

Then each figure f is extrapolated to m as f(m_c) + (m - m_c)/q · (f(m_c) - f(m_b)); otherwise the
caller runs the unrolled plan. Two points suffice where the insertion check holds: every task after
the insertion moves by exactly one period and the new period repeats the one before it, so every
figure computed from the task times grows by that period's share per period. Until 2026-12-05 the
engine also ran m_a and required every figure to be affine over the three points; the extrapolation
was the same formula from the same two points, so wherever that folded, this gives the same figures
bit for bit, at two thirds of the engine work (tests/test_engine_fold.py compares every figure with
the unrolled run, 1e-9). The period q is
tried as one micro-batch, then p, for 1F1B (a pipeline's increments may repeat only every p
micro-batches: a toy pipeline grows by 5.652, 5.637, 5.652, 5.652 ms per micro-batch, over and over),
p for the interleaved schedule (its order repeats per group of p). Folded and unrolled agree to 1e-9
relative (tests/test_engine_fold.py: toy and real layouts, 1F1B and interleaved, shared links, sync
jitter, full and symmetric mode). Kernel/communication interference is refused by the checks (its
increments wander without a period) and runs unrolled.

Not folded: several steps, traces (``detail``), stragglers (per-device draws), GPipe (its memory
grows with m: no steady peak), ZB-H1 (a list schedule, not periodic), and plans where the points
tried would not at least halve the engine's work (of ``examples/``, only llama3-70b-gb200-nvl72 and
gpt-oss-120b-nemo-64xh100 fold). A folded result has no memory-over-time series and no
timeline (the result says ``engine_fold``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter

from simulator.engine.engine import Engine
from simulator.scenario import Scenario
from simulator.strategies.plan import MEMORY_COUNTER
from simulator.strategies.spmd.fast import _with_micro_batches

# Relative tolerance of the insertion check (as the fast path's: round-off is ~1e-13 relative).
AFFINE_RTOL = 1e-9
# Fold only where the points tried cost at most this share of the unrolled plan's micro-batches.
MAX_WORK_SHARE = 0.5
FOLDED_SCHEDULES = ("1f1b", "interleaved")
_END, _SPAN = attrgetter("end_s"), attrgetter("start_s", "end_s")  # read in C: 17k tasks a Megatron-1T point


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
    micro_batches_evaluated: tuple[int, int]


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


def _point(scenario: Scenario, micro_batches: int, mode: str | None, observe=None):
    """One engine run on the plan at ``micro_batches``: its figures, as the unrolled run reports them.
    ``observe(micro_batches, plan)``: called with the plan before the engine runs it."""
    from simulator.simulate import pipeline_bubble_s, time_breakdown
    from simulator.strategies.registry import get_kind

    plan = get_kind("spmd").compile(_with_micro_batches(scenario, micro_batches), mode=mode, chains=True)
    if observe is not None:
        observe(micro_batches, plan)
    engine = Engine(plan.topology.port_capacity, counter_series=False)  # a folded result has no series
    makespan = engine.run(plan.streams, {(a, MEMORY_COUNTER): b for a, b in plan.memory_base_bytes.items()})
    ends = {a: max(map(_END, ts), default=0.0) for a, ts in plan.compute_tasks.items()}
    critical = max(ends, key=lambda a: (ends[a], -plan.stage_of[a]))
    first_actor: dict[int, str] = {}  # each stage's first actor (simulate.stage_breakdowns)
    for actor in plan.compute_tasks:
        first_actor.setdefault(plan.stage_of[actor], actor)
    return {
        "makespan": makespan,
        "ends": ends,
        "critical": critical,
        "breakdown": time_breakdown(plan, critical, makespan),
        # every other stage's bubble per step, to the bit its breakdown's (simulate.pipeline_bubble_s): the stages
        # are compared by it (simulate.least_waiting_stage), and only the winner's whole breakdown is made,
        # from the plan kept here (Megatron-1T: 63 stages' breakdowns at both points were 7% of a simulate)
        "stages": ({stage: {"pipeline_bubble": pipeline_bubble_s(plan, actor, makespan) / plan.steps}
                    for stage, actor in sorted(first_actor.items()) if actor != critical}
                   if len(first_actor) >= 2 else {}),
        "stage_breakdown": lambda stage: {k: v / plan.steps for k, v in
                                          time_breakdown(plan, first_actor[stage], makespan).items()},
        "peaks": {a: engine.counter_peaks[(a, MEMORY_COUNTER)] for a in plan.memory_base_bytes},
        "stage_of": dict(plan.stage_of),
        "mode": plan.mode,
        "times": {key: list(map(_SPAN, tasks)) for key, tasks in plan.streams.items()},
    }


def _one_period_later(before: dict, after: dict, shift_s: float, scale: float) -> bool:
    """Whether the run with one more period (``after``) is the run ``before`` with that period
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
    """The engine's figures for ``scenario`` from two runs of its folded plan, or None where it is
    not folded or the checks refuse (run the unrolled plan then). ``observe(micro_batches, plan)``:
    called with each plan before the engine runs it (the search's fast path walks the same plans)."""
    for points in engine_fold_points(scenario):
        folded = _folded(scenario, points, mode, observe)
        if folded is not None:
            return folded
    return None


def _folded(scenario: Scenario, points: tuple[int, int], mode: str | None, observe=None) -> FoldedRun | None:
    runs = [_point(scenario, k, mode, observe) for k in points]
    mid, last = runs
    periods = (scenario.parallelism.num_micro_batches - points[1]) // (points[1] - points[0])

    def extrapolated(b: float, c: float) -> float:
        return c + periods * (c - b)

    def extrapolated_dict(b: dict, c: dict) -> dict | None:
        if b.keys() != c.keys():
            return None
        return {key: extrapolated(b[key], c[key]) for key in c}

    if mid["critical"] != last["critical"] or mid["mode"] != last["mode"]:
        return None
    critical = last["critical"]
    scale = last["makespan"]
    if not _one_period_later(mid["times"], last["times"], last["makespan"] - mid["makespan"], scale):
        return None
    makespan = extrapolated(mid["makespan"], last["makespan"])
    ends = extrapolated_dict(mid["ends"], last["ends"])
    if ends is None or max(ends, key=lambda a: (ends[a], -last["stage_of"][a])) != critical:
        return None  # another rank's last kernel would end last at m
    breakdown = extrapolated_dict(mid["breakdown"], last["breakdown"])
    if breakdown is None or mid["stages"].keys() != last["stages"].keys():
        return None
    stages = {stage: extrapolated_dict(mid["stages"][stage], last["stages"][stage]) for stage in last["stages"]}
    peaks = last["peaks"]
    if mid["peaks"].keys() != peaks.keys() or any(
            not math.isclose(mid["peaks"][a], peaks[a], rel_tol=AFFINE_RTOL) for a in peaks):
        return None  # memory still growing with the micro-batches: no steady peak
    from simulator.simulate import least_waiting_stage

    busiest_stage, _ = least_waiting_stage(stages, breakdown)
    busiest = ({} if busiest_stage is None else
               extrapolated_dict(mid["stage_breakdown"](busiest_stage), last["stage_breakdown"](busiest_stage)))
    return FoldedRun(makespan, critical, breakdown, busiest_stage, busiest, dict(peaks), last["stage_of"],
                     last["mode"], points)
