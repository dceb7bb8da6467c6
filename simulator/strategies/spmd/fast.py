"""The fast evaluation path of the ``spmd`` kind: the step time without the discrete-event engine.

The planner (:mod:`.plan`) prices every pass, collective and send and returns per-(actor, stream)
task lists; the engine (simulator/engine/) runs them. Where no two transfers share a port at the
same time and no kernel/communication interference is configured, the engine's schedule is the
earliest-start schedule of that task DAG: a task starts when its stream's previous task and its
dependencies have finished (a rendezvous when all its members are ready) and takes its fixed
duration, or, for a transfer, its latency plus its bytes at its own bottleneck port
(``max over ports of bytes / capacity``: the rate the flow network gives a flow alone). So the
step is the longest path through the DAG, computed here in one topological pass over the same
tasks -- the planner's pricing, unchanged, is what both paths read.

Two things the engine does that this pass does not:

- *contention*: transfers that overlap in time on a port share its bandwidth (max-min fair,
  simulator/engine/network.py). The pass detects it (two transfers' byte phases overlap on a
  port) and reports ``contended``. Its time with each transfer alone on its ports is a lower
  bound on the engine's (start times only grow with durations in a DAG of fixed stream orders):
  ``lower_bound_s``, what the search prunes with. Its ``step_time_s`` then slows each pair of
  transfers that overlapped on a port by what that port's max-min fair share gives them (none
  where their loads fit on it together) and re-times the DAG (a few rounds,
  :func:`_contention_delays`): an approximation, within 3% of the engine in
  tests/test_fast_path.py and benchmarks/bench_fast_path.py;
- *interference* (``overlap_compute_slowdown`` / ``overlap_comm_slowdown`` > 0): ignored and
  reported (``interference``).

Folding the steady state: a pipeline of p stages running m micro-batches is a max-plus linear
system; its step time is eventually affine in m (periodic with a period that divides p for
these schedules). The planner is asked for the step at m_a, m_a + q and m_a + 2q micro-batches
(q = p for the interleaved schedule, 1 otherwise; m_a ≡ m mod q, m_a > p, past the fill); when
the two differences agree, the step at m is extrapolated, else the full m is evaluated (always
for ZB-H1, whose list schedule is not periodic). The critical rank's time breakdown is
extrapolated the same way (``breakdown_exact`` says whether each part was affine too). Cost then grows with p², not p·m.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from itertools import accumulate, compress, islice
from operator import itemgetter, lt

from simulator.engine.engine import Task, cyclic_gc_paused
from simulator.scenario import Scenario

# Relative tolerance of the affine check of the folded evaluation (float round-off of sums of
# thousands of durations is ~1e-13 relative; a real change of period is far larger).
_AFFINE_RTOL = 1e-9
# Overlap of two transfers on a port shorter than this fraction of the step is round-off.
_OVERLAP_RTOL = 1e-12


@dataclass(frozen=True)
class FastEstimate:
    """The fast path's step time and how far to trust it.

    ``exact``: no transfers contended and no interference is configured, so the engine gives the
    same step time (to float round-off). ``micro_batches_evaluated``: the micro-batch counts the
    DAG was evaluated at (one entry: not folded)."""

    step_time_s: float
    contended: bool
    interference: bool
    micro_batches_evaluated: tuple[int, ...]
    lower_bound_s: float = 0.0  # every transfer alone on its ports: never above the engine's step
    plan: object | None = None  # the evaluated plan (tasks timed) when not folded
    breakdown: dict[str, float] | None = None  # the critical rank's time breakdown, extrapolated when folded
    breakdown_exact: bool = True  # False: folded, and how gaps are charged shifted between the points

    @property
    def exact(self) -> bool:
        return not (self.contended or self.interference)

    @property
    def approximation(self) -> str | None:
        """Why the engine may differ, or None."""
        parts = []
        if self.contended:
            parts.append("transfers share a link (fast path: a contention correction, not the flow network)")
        if self.interference:
            parts.append("kernel/communication interference ignored")
        return "; ".join(parts) or None


@dataclass(frozen=True)
class DagTimes:
    """End of the last task with contention corrected (``end_s``) and with every transfer alone on
    its ports (``alone_end_s``, a lower bound on the engine's), and whether transfers overlapped."""

    end_s: float
    alone_end_s: float
    contended: bool
    interference: bool


# A re-timing with delays (:meth:`_Dag.rerun`) walks only what they reach unless more than this share of the
# byte windows start after the earliest delayed transfer was ready, or they reach twice this share of the
# tasks: then the whole walk is cheaper.
RERUN_SHARE = 0.25

_START, _END = itemgetter(0), itemgetter(1)  # of a byte window (start, end, task, seconds on the port)

# Rounds of the contention correction (each re-times the DAG with the delays the last found; it
# stops early at a fixed point, where the delays found equal those the round ran with: in the
# default GPT-3 search most graphs reach it after one or two rounds).
CONTENTION_ROUNDS = 3


def longest_path(streams: dict[tuple[str, str], list[Task]], capacity, write: bool = True) -> DagTimes:
    """Earliest-start schedule of the task lists (the engine's semantics without link sharing),
    then, where transfers overlapped on a port, re-timed with a contention correction (below);
    writes ``start_s``/``end_s`` on the tasks, as the engine does, unless ``write`` is false (the
    engine runs the same tasks next and writes its own). The cyclic garbage collector
    is paused meanwhile: the pass allocates lists per task and frees none."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        dag = _Dag(streams, functools.lru_cache(maxsize=None)(capacity))
        first = dag.run({})
        alone, busy, interference, times = first
        contended = _any_overlap(busy, alone)
        end = alone
        if contended:
            delays: dict[int, float] = {}  # the run above: no transfer delayed (found none: it stands)
            for _ in range(CONTENTION_ROUNDS):
                found = _contention_delays(busy)
                if found == delays:  # a fixed point: another round would time every task the same
                    break
                delays = found
                end, busy, _, times = dag.rerun(first, delays)
        if write:
            dag.write(times)
        return DagTimes(end, alone, contended, interference)
    finally:
        if enabled:
            gc.enable()


class _Dag:
    """The task graph, built once and timed as often as the contention correction asks. Every
    task's constants (its duration, or its latency and its seconds on each port alone) are read
    once here; :meth:`run` walks plain lists (the same float operations in the same order as the
    per-task version, so the times are bit-identical)."""

    def __init__(self, streams, capacity):
        flat: list[Task] = [task for tasks in streams.values() for task in tasks]
        index = {id(task): i for i, task in enumerate(flat)}
        n = len(flat)
        successors: list[list[int]] = [[] for _ in range(n)]
        missing = [0] * n
        stream_next = [-1] * n
        # per task: 0 a fixed duration, 1 a transfer alone, 2 a member of a rendezvous
        kind = [0] * n
        duration = [0.0] * n
        latency = [0.0] * n
        propagation = [0.0] * n
        ports: list[tuple[tuple[str, float], ...]] = [()] * n
        byte_s = [0.0] * n
        seconds_on: dict[tuple[str, float], float] = {}  # (port, bytes) -> seconds alone (repeats often)
        # a demands mapping -> its ports' seconds alone and its byte phase (planners share one mapping among
        # every send of a pipeline edge: worked out once)
        on_demands: dict[int, tuple[dict, tuple[tuple[str, float], ...], float]] = {}
        interference = False
        i = 0
        for tasks in streams.values():
            prev = -1
            for task in tasks:
                count = 0
                if prev >= 0:
                    successors[prev].append(i)
                    stream_next[prev] = i
                    count = 1
                for dep in task.deps:
                    successors[index[id(dep)]].append(i)
                    count += 1
                missing[i] = count
                prev = i
                if task.slowdown_while_contended > 0 or task.comm_slowdown_while_computing > 0:
                    interference = True
                propagation[i] = task.propagation_s
                latency[i] = task.latency_s
                if task.rendezvous is not None and task.rendezvous_size > 1:
                    kind[i] = 2
                elif task.demands is not None:
                    kind[i] = 1
                    demands = task.demands
                    hit = on_demands.get(id(demands))
                    if hit is None or hit[0] is not demands:
                        on_port = []
                        phase_s = 0.0
                        for p, b in demands.items():
                            if b > 0:
                                s = seconds_on.get((p, b))
                                if s is None:
                                    s = seconds_on[(p, b)] = b / capacity(p)
                                on_port.append((p, s))
                                if s > phase_s:
                                    phase_s = s
                        hit = on_demands[id(demands)] = (demands, tuple(on_port), phase_s)
                    ports[i] = hit[1]
                    byte_s[i] = hit[2]
                else:
                    duration[i] = task.duration_s
                i += 1
        self.capacity = capacity
        self.flat, self.successors, self.missing, self.stream_next = flat, successors, missing, stream_next
        self.kind, self.duration, self.latency, self.propagation = kind, duration, latency, propagation
        self.ports, self.byte_s, self.interference = ports, byte_s, interference
        self.roots = [i for i in range(n) if missing[i] == 0]
        self._meetings: dict[tuple, tuple[float, tuple[tuple[str, float], ...], float]] = {}
        self._met_with: dict[int, list[int]] = {}  # rendezvous member -> its meeting's members, as they arrived

    def _meeting(self, key: str, members: list[int]) -> tuple[float, tuple[tuple[str, float], ...], float]:
        """A rendezvous' latency (its slowest member's), seconds on each port (all members' bytes)
        and byte phase. Members arrive in the same order in every run (the walk's order depends
        on the graph alone), so the sums are computed once."""
        memo = (key, *members)  # a key may come back later for other members: keyed by both
        found = self._meetings.get(memo)
        if found is None:
            flat, capacity = self.flat, self.capacity
            demands: dict[str, float] = defaultdict(float)
            for j in members:
                for port, b in (flat[j].demands or {}).items():
                    demands[port] += b
            on_port = tuple((p, b / capacity(p)) for p, b in demands.items() if b > 0)
            found = (max(self.latency[j] for j in members), on_port, max((s for _, s in on_port), default=0.0))
            self._meetings[memo] = found
        return found

    def run(self, delays: dict[int, float]):
        """Time every task; a transfer ``i`` takes ``delays.get(i, 0)`` more. Returns the end of the
        last task, each port's byte phases ``(start, end of its bytes alone, task, seconds on the
        port)``, whether any task asks for interference, and what :meth:`write` puts on the tasks."""
        n = len(self.flat)
        ready, arrive = [0.0] * n, [0.0] * n
        met: dict[int, tuple[float, float]] = {}  # rendezvous member -> (start, end when its bytes are out)
        busy: dict[str, list[tuple[float, float, int, float]]] = defaultdict(list)
        missing = list(self.missing)
        meetings = self._walk(list(self.roots), missing, ready, arrive, met, busy, delays, None)
        if meetings or any(missing):
            never = sum(1 for left in missing if left)
            first = next((self.flat[i] for i in range(n) if missing[i] > 0), None)
            name = f"{first.actor}/{first.name}" if first is not None else next(iter(meetings))
            raise RuntimeError(f"deadlock: {never} tasks never ran, first {name}")
        return max(arrive, default=0.0), busy, self.interference, (ready, arrive, met)

    def rerun(self, alone, delays: dict[int, float]):
        """:meth:`run` with ``delays``, re-timing only what they reach: ``alone`` is :meth:`run`'s
        result without delays. Delays are never negative, so every task ends no earlier than alone
        (IEEE sums and max are monotone); a task no delayed transfer precedes keeps its times, and one
        it precedes is ready at the latest of its time alone (the same dependencies' ends, or earlier
        ones) and its delayed dependencies' new ends: the same floats as the whole run (tested). On
        GPT-3 175B's pp-16 layouts the ~110 delayed transfers are the DP collectives and sends of the
        step's last ~4%: ~800 of 24,469 tasks re-timed. Where they may reach more, the whole run."""
        if min(delays.values(), default=0.0) < 0:
            return self.run(delays)
        alone_end, alone_busy, interference, (ready0, arrive0, met0) = alone
        # every task a delay reaches starts after the earliest delayed one was ready, and so do their byte
        # windows: where a quarter of the windows start after it, the whole run is cheaper
        earliest = (min(ready0[i] for i in delays),)
        cuts = {}
        for port, windows in alone_busy.items():
            windows.sort()
            cuts[port] = bisect_left(windows, earliest)
        if sum(len(w) - cuts[p] for p, w in alone_busy.items()) > RERUN_SHARE * sum(map(len, alone_busy.values())):
            return self.run(delays)
        successors, met_with = self.successors, self._met_with
        n = len(self.flat)
        reached = bytearray(n)
        todo = []
        for i in delays:
            for j in met_with.get(i, (i,)):
                if not reached[j]:
                    reached[j] = 1
                    todo.append(j)
        missing = [0] * n
        for u in todo:  # grows as it goes: every task after a delayed one, a meeting's members together
            for v in successors[u]:
                missing[v] += 1
                if not reached[v]:
                    for j in met_with.get(v, (v,)):
                        if not reached[j]:
                            reached[j] = 1
                            todo.append(j)
            if len(todo) > 2 * RERUN_SHARE * n:
                return self.run(delays)
        ready, arrive, met = list(ready0), list(arrive0), dict(met0)
        busy: dict[str, list[tuple[float, float, int, float]]] = defaultdict(list)
        for port, windows in alone_busy.items():  # the windows of the tasks not reached stay
            cut = cuts[port]
            kept = windows[:cut]
            kept.extend(w for w in windows[cut:] if not reached[w[2]])
            if kept:
                busy[port] = kept
        self._walk([j for j in todo if not missing[j]], missing, ready, arrive, met, busy, delays, met_with)
        return max(alone_end, max(arrive[j] for j in todo)), busy, interference, (ready, arrive, met)

    def _walk(self, stack, missing, ready, arrive, met, busy, delays, order) -> dict[str, list[int]]:
        """Time the tasks from ``stack`` on (each once every dependency counted in ``missing`` is
        timed), updating ``ready``/``arrive``/``met``/``busy`` in place; returns the rendezvous that
        never met. ``order``: each rendezvous member's meeting as it first met (a partial walk meets the
        members in another order: their bytes are summed in the first one's)."""
        flat, successors, stream_next = self.flat, self.successors, self.stream_next
        kind, duration, latency, propagation = self.kind, self.duration, self.latency, self.propagation
        ports, byte_s = self.ports, self.byte_s
        push, pop = stack.append, stack.pop
        meetings: dict[str, list[int]] = {}
        delay = delays.get
        while stack:
            i = pop()
            k = kind[i]
            if k == 0:
                t_end = ready[i] + duration[i]
            elif k == 1:
                start = ready[i]
                lat, phase_s = latency[i], byte_s[i]
                for port, seconds in ports[i]:
                    busy[port].append((start + lat, start + lat + phase_s, i, seconds))
                t_end = start + lat + phase_s + delay(i, 0.0)
            else:
                key = flat[i].rendezvous
                members = meetings.setdefault(key, [])
                members.append(i)
                if len(members) < flat[i].rendezvous_size:
                    continue
                del meetings[key]
                if order is None:
                    for j in members:
                        self._met_with[j] = members
                else:
                    members = order[i]
                start = max(ready[j] for j in members)
                lat, on_port, phase_s = self._meeting(key, members)
                for port, seconds in on_port:
                    busy[port].append((start + lat, start + lat + phase_s, members[0], seconds))
                t_end = start + lat + phase_s + delay(members[0], 0.0)
                for j in members:
                    met[j] = (start, t_end)  # a member's recorded end: its bytes out (the engine's join)
                    arrived = arrive[j] = t_end + propagation[j]
                    after = stream_next[j]
                    for s in successors[j]:
                        t = t_end if s == after else arrived
                        if ready[s] < t:
                            ready[s] = t
                        left = missing[s] - 1
                        missing[s] = left
                        if not left:
                            push(s)
                continue
            hop = propagation[i]
            if hop:  # dependents wait for the bytes to land, the stream does not
                arrived = arrive[i] = t_end + hop
                after = stream_next[i]
                for s in successors[i]:
                    t = t_end if s == after else arrived
                    if ready[s] < t:
                        ready[s] = t
                    left = missing[s] - 1
                    missing[s] = left
                    if not left:
                        push(s)
            else:
                arrive[i] = t_end
                for s in successors[i]:
                    if ready[s] < t_end:
                        ready[s] = t_end
                    left = missing[s] - 1
                    missing[s] = left
                    if not left:
                        push(s)
        return meetings

    def write(self, times) -> None:
        """Write a run's ready/start/end times on the tasks (a task starts when ready, but a
        rendezvous member when the last member is)."""
        ready, arrive, met = times
        for i, task in enumerate(self.flat):
            task.ready_s = ready[i]
            if i in met:
                task.start_s, task.end_s = met[i]
            else:
                task.start_s = ready[i]
                task.end_s = arrive[i]


def _contention_delays(busy) -> dict[int, float]:
    """Extra seconds per transfer from sharing its ports, pair by pair as the engine's max-min fair
    port would share it (simulator/engine/network.py; Bertsekas & Gallager, *Data Networks*,
    Sec. 6.5.2). Alone, a transfer uses the fraction ``u = seconds on the port / its byte window``
    of a port (1 on its bottleneck port). While two overlap on a port for ``T`` seconds and
    ``u_i + u_j > 1``, the port gives each its fair share ``g = min(u, level)`` with
    ``g_i + g_j = 1``, so each runs ``u/g`` times slower there: ``T * (u/g - 1)`` more; when the
    two fit (``u_i + u_j <= 1``, e.g. a collective bottlenecked on its NIC crossing a TP
    all-reduce on NVLink) neither is slowed. A transfer is delayed by the most any one of its ports
    adds. (Two equal transfers started together: each alone 10 ms, each +10 ms, both end at 20 ms
    as in the engine; one started 5 ms into the other: +5 ms each, ends at 15 and 20 ms, as in the
    engine.) Windows are the transfers' byte phases *alone* at their current starts, so a round
    does not feed on itself.

    Only the runs of windows that overlap are swept pair by pair (:func:`_overlapping_runs`): a window
    that starts once every earlier one has ended meets none of them (on GPT-3 175B's pp-16 layouts ~100
    of 24,000 windows overlap: the pipeline's sends on a NIC follow one another), and sweeping a run from
    its first window adds the same terms in the same order as sweeping the whole port."""
    delays: dict[int, float] = {}
    for intervals in busy.values():
        if len(intervals) < 2:
            continue
        intervals.sort()
        for first, last in _overlapping_runs(intervals):
            active: list[tuple[float, int, float]] = []  # (end, task, its share of the port alone)
            added: dict[int, float] = defaultdict(float)
            for s, e, i, seconds in intervals[first:last]:
                active = [a for a in active if a[0] > s]
                u = seconds / max(e - s, 1e-30)
                for a_e, j, a_u in active:
                    overlap = min(a_e, e) - s
                    if overlap <= 0:
                        continue
                    if u + a_u <= 1.0:
                        continue  # both fit on the port: max-min gives each what it asks
                    small = min(u, a_u)
                    level = small if small <= 0.5 else 0.5
                    share_i = u if u <= level else 1.0 - level
                    share_j = a_u if a_u <= level else 1.0 - level
                    added[i] += overlap * (u / share_i - 1.0)
                    added[j] += overlap * (a_u / share_j - 1.0)
                active.append((e, i, u))
            for i, extra in added.items():
                if extra > delays.get(i, 0.0):
                    delays[i] = extra
    return delays


def _overlapping_runs(intervals) -> list[tuple[int, int]]:
    """``(first, last + 1)`` of each maximal run of byte windows ``(start, end, ...)``, sorted by start,
    in which every window but the first starts before an earlier one of the run has ended. A window in
    no run starts once every earlier window has ended, and every later one starts after it has: it
    overlaps none."""
    reach = accumulate(map(_END, intervals), max)  # the latest end so far (up to the window before each)
    late = list(compress(range(1, len(intervals)), map(lt, map(_START, islice(intervals, 1, None)), reach)))
    runs: list[tuple[int, int]] = []
    for k in late:
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k - 1, k + 1))
    return runs


def _any_overlap(busy, step_s: float) -> bool:
    """Whether two byte phases overlap on one port (by more than round-off): a window that starts more
    than the slack before the latest end of the windows before it, and is not empty."""
    slack = _OVERLAP_RTOL * max(step_s, 1e-30)
    for intervals in busy.values():
        if len(intervals) < 2:
            continue
        intervals.sort()
        reach = accumulate([w[1] for w in intervals], max)  # the latest end up to each window
        if any(w[0] < r - slack and w[1] > w[0] for w, r in zip(intervals[1:], reach, strict=False)):  # reach: one more
            return True
    return False


def _with_micro_batches(scenario: Scenario, micro_batches: int) -> Scenario:
    """``scenario`` at ``micro_batches`` per replica (the fold's and the fast path's points), with the pipeline
    cut of ``scenario`` itself: a ``balanced`` cut is chosen by a schedule estimate that reads the
    micro-batch count (simulator/strategies/spmd/split.py), and re-chosen at the points it could cut another
    way (GPT-3 5B, pp 4, 32 micro-batches: [6, 6, 6, 6], at 6 and 7: [7, 6, 6, 5]), so the fold
    extrapolated another plan's figures (0.69312 s against the unrolled plan's 0.69411 s;
    tests/test_search_fold.py)."""
    from simulator.strategies.spmd.split import chunk_counts

    par = scenario.parallelism
    batch = micro_batches * par.dp_degree * par.micro_batch_size
    cut = {}
    if scenario.pipeline_cut is None and par.pp_split == "balanced" and par.pp * par.virtual_stages > 1:
        cut = {"pipeline_cut": tuple(chunk_counts(scenario, scenario.layer_graph()))}
    return dataclasses.replace(scenario, parallelism=par.model_copy(update={"global_batch_size": batch}), **cut)


def _dag_times(scenario: Scenario, mode: str | None = None, detail: bool = False):
    from simulator.strategies.registry import get_kind

    enabled = gc.isenabled()
    gc.disable()  # the planner allocates tens of thousands of tasks and frees none: no cycles to look for
    try:
        plan = get_kind("spmd").compile(scenario, mode=mode, detail=detail)
    finally:
        if enabled:
            gc.enable()
    return longest_path(plan.streams, plan.topology.port_capacity), plan


def _periodic_insertions(evaluated, steps: list[float]) -> bool:
    """Whether each further period is an insertion into a periodic schedule, task by task (the
    engine fold's check, :func:`.fold._one_period_later`): a step that is affine over three points
    is not enough. A pipeline whose increments repeat every few micro-batches (gpt-7.5b, tp 8, pp 16:
    +21.417, +21.417, +21.051 ms, ...) or a stream that falls a little further behind each
    micro-batch until it reaches the critical path (gpt-7.5b, tp 4, pp 32: +16.720 ms per
    micro-batch at 33-38, +19.283 on average up to 64) passed it and came out 0.35% and -8.6% off."""
    from simulator.strategies.spmd.fold import _one_period_later

    runs = [{key: [(t.start_s, t.end_s) for t in tasks] for key, tasks in plan.streams.items()}
            for _, plan in evaluated]
    scale = steps[2]
    return (_one_period_later(runs[0], runs[1], steps[1] - steps[0], scale)
            and _one_period_later(runs[1], runs[2], steps[2] - steps[1], scale))


def fold_points(micro_batches: int, pp: int, interleaved: bool) -> tuple[int, int, int] | None:
    """The three micro-batch counts the folded evaluation uses for ``micro_batches`` on ``pp``
    stages, or None when folding would not save work: m_a, m_a + q, m_a + 2q with q = p for the
    interleaved schedule (it needs m divisible by p) and 1 otherwise, m_a ≡ m (mod q), m_a > p
    (past the pipeline's fill)."""
    period = max(1, pp) if interleaved else 1
    first = pp + 1 if period == 1 else period + (micro_batches - period) % period
    points = (first, first + period, first + 2 * period)
    if sum(points) >= 0.8 * micro_batches:
        return None
    return points


def fast_step(scenario: Scenario, fold: bool = True, mode: str | None = None, detail: bool = False) -> FastEstimate:
    """The step time of ``scenario`` by the longest path over the planner's task DAG (module
    docstring); ``mode``/``detail`` as for the planner (``detail`` never folds: a trace needs every
    task; nor do several steps, whose per-step ends are read from the plan). ``step_time_s`` is
    the makespan of the plan's ``simulation.steps`` steps. The cyclic garbage collector is paused
    throughout and the folded points' plans are freed before it resumes: re-enabled between the
    planner and the walk, or with the plans alive, its first pass scans every task (~6% of the time)."""
    with cyclic_gc_paused():
        return _fast_step(scenario, fold, mode, detail)


def _fast_step(scenario: Scenario, fold: bool, mode: str | None, detail: bool) -> FastEstimate:
    par = scenario.parallelism
    fold = fold and not detail and scenario.simulation.steps == 1
    m = par.num_micro_batches
    interleaved = par.schedule == "interleaved"
    fold = fold and not any(g.accelerator.efficiency.input_us_per_sample for g in scenario.groups)  # max(GPU, input)
    points = fold_points(m, par.pp, interleaved) if fold and par.schedule != "zb-h1" else None
    if points is not None:
        from simulator.simulate import critical_actor, time_breakdown

        evaluated = [_dag_times(_with_micro_batches(scenario, k), mode) for k in points]
        times = [t for t, _ in evaluated]
        series = {"step": [t.end_s for t in times], "alone": [t.alone_end_s for t in times]}
        scale = _AFFINE_RTOL * series["step"][2]

        def affine(a: float, b: float, c: float) -> bool:
            return math.isclose(b - a, c - b, rel_tol=_AFFINE_RTOL, abs_tol=scale)

        if all(affine(*values) for values in series.values()) and _periodic_insertions(evaluated, series["step"]):
            periods = (m - points[2]) // (points[1] - points[0])
            # The breakdown's parts add up to the step at every point, but how a gap is charged
            # (bubble or the collective it waited for) may shift between them: extrapolated from
            # the last two points, it still adds up to the step; ``breakdown_exact`` says if affine.
            parts = [time_breakdown(plan, critical_actor(plan), t.end_s) for t, plan in evaluated]
            parts_exact = len({critical_actor(plan) for _, plan in evaluated}) == 1
            breakdown = {}
            for key in parts[0]:
                a, b, c = (p[key] for p in parts)
                parts_exact = parts_exact and affine(a, b, c)
                breakdown[key] = c + periods * (c - b)
            step, alone = (c + periods * (c - b) for _, b, c in (series["step"], series["alone"]))
            evaluated.clear()  # the plans go now, while the collector is paused (fast_step)
            return FastEstimate(step, any(t.contended for t in times), any(t.interference for t in times),
                                points, lower_bound_s=alone, breakdown=breakdown, breakdown_exact=parts_exact)
        evaluated.clear()
    full, plan = _dag_times(scenario, mode, detail)
    from simulator.simulate import critical_actor, time_breakdown

    breakdown = time_breakdown(plan, critical_actor(plan), full.end_s)
    return FastEstimate(full.end_s, full.contended, full.interference, (m,), full.alone_end_s, plan, breakdown)


def compute_bound_s(scenario: Scenario, planner=None) -> float:
    """A lower bound on the step time from the kernels alone (no communication, no host floor,
    no optimizer), priced by the planner: stage s is busy m·Σ_chunks (F + R + B [+ W]) and cannot
    start before the first micro-batch's forward has passed the stages before it, nor finish before
    the last micro-batch's recompute and backward have passed them again (1F1B, GPipe and interleaved
    all end a stage on its first chunk's backward; for ZB-H1 only the fill is counted). Every
    term is a kernel time the engine also spends in that order, so bound ≤ fast path ≤ engine."""
    from simulator.strategies.spmd.plan import Planner

    planner = planner or Planner(scenario)
    par = scenario.parallelism
    pp, v, m = par.pp, par.virtual_stages, par.num_micro_batches
    phases = ("F", "R", "B", "W") if par.schedule == "zb-h1" else ("F", "R", "B")

    def kernels_s(phase: str, chunk: int) -> float:
        ops = planner._chunk_ops(phase, chunk)
        rank = planner.stage_representative(chunk % pp)  # a mixed cluster: the stage's slowest group
        return planner._compute_time(tuple(op for op in ops if op.kind != "collective"), rank) if ops else 0.0

    per_chunk = {g: {ph: kernels_s(ph, g) for ph in phases} for g in range(pp * v)}
    best, fill, drain = 0.0, 0.0, 0.0
    for stage in range(pp):
        busy = m * sum(sum(per_chunk[c * pp + stage].values()) for c in range(v))
        best = max(best, fill + busy + (0.0 if par.schedule == "zb-h1" else drain))
        fill += per_chunk[stage]["F"]
        drain += per_chunk[stage]["R"] + per_chunk[stage]["B"]
    return best


def fast_beside_engine(scenario: Scenario, run_if_oom: bool = False):
    """The engine's result for ``scenario`` and the fast path's estimate beside it: unrolled, the plan
    the engine runs is walked by :func:`longest_path` just before the engine
    runs it, so the fast path costs its walk, not the planner's build; folded, the plans at the fold's
    two points, built for this walk alone (the engine runs one plan, two periods past them:
    simulator/strategies/spmd/fold.py) (``search`` reports both times for every row the engine timed).
    Folded, the fast path's step is extrapolated from those two points (two points suffice where one
    more period is an insertion into a periodic schedule, checked on the walk's own task times); where that check refuses, the
    fast path runs on its own (:func:`fast_step`). Returns (the engine's
    :class:`~simulator.simulate.SimulationResult`, the :class:`FastEstimate` or None where the fast
    path does not apply: another strategy kind, straggler draws, co-located jobs, or nothing timed)."""
    from simulator.simulate import simulate
    from simulator.strategies.spmd.fold import _one_period_later

    applies = (scenario.strategy_kind == "spmd" and scenario.simulation.stragglers is None
               and not scenario.co_located)
    m = scenario.parallelism.num_micro_batches
    walked: dict[int, tuple[DagTimes, dict | None]] = {}

    def observe(micro_batches: int, plan) -> None:
        # a fold point's task times are compared with the next point's (below); else only the end counts
        folded_point = micro_batches != m or scenario.simulation.steps != 1
        times = longest_path(plan.streams, plan.topology.port_capacity, write=folded_point)
        walked[micro_batches] = (times, {key: [(t.start_s, t.end_s) for t in tasks]
                                         for key, tasks in plan.streams.items()} if folded_point else None)

    with cyclic_gc_paused():
        result = simulate(scenario, run_if_oom=run_if_oom, observe=observe if applies else None)
    if not applies or not walked:
        return result, None
    fold = result.extra.get("engine_fold")
    if fold is None:
        if m not in walked or scenario.simulation.steps != 1:
            return result, fast_step(scenario)
        times = walked[m][0]
        return result, FastEstimate(times.end_s, times.contended, times.interference, (m,), times.alone_end_s)
    mid, last = list(walked)[-2:]  # the fold's two points whose plans it observed last (its engine ran one more period)
    (t_mid, run_mid), (t_last, run_last) = walked[mid], walked[last]
    if not _one_period_later(run_mid, run_last, t_last.end_s - t_mid.end_s, t_last.end_s):
        return result, fast_step(scenario)
    periods = (m - last) // (last - mid)
    step, alone = (c + periods * (c - b) for b, c in ((t_mid.end_s, t_last.end_s),
                                                      (t_mid.alone_end_s, t_last.alone_end_s)))
    return result, FastEstimate(step, t_mid.contended or t_last.contended, t_last.interference, (mid, last),
                                lower_bound_s=alone)
