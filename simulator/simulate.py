"""Simulate training steps of a scenario: plan, run the engine, measure, attribute.

``simulate(scenario)`` returns a :class:`SimulationResult`. With ``simulation.steps`` N > 1 the
kind's plan holds N steps: ``step_time_s`` is the makespan / N, ``step_times_s`` each step's
time (from the plan's step ends, simulator/strategies/plan.py) and the breakdown the mean per step.
Memory over time: the engine's memory counter per actor (the plan's base plus what tasks allocate
and free) gives ``simulated_peak_memory_gib`` per actor and the series ``clustersim plot`` draws;
``peak_memory_gib`` and ``fits`` stay the analytic peak (simulator/memory/analytic.py). ``simulate_point(raw)`` is the
form sweeps and searches use: it takes a raw scenario mapping and never raises for bad or
infeasible input — it returns a row with ``fits: false`` and ``infeasible_reason``.

The time breakdown walks the compute stream of the critical actor (the one whose work ends
last): busy time is compute / recompute / optimizer (and the exposed collective segments
folded into kernel tasks); every gap is charged along the chain of what the next kernel was
waiting for — the part while a collective ran to its kind (exposed tp/cp/ep/dp
communication), while a pipeline send ran to ``pp_comm``, while another stage computed to
``pipeline_bubble`` — so the parts add up to the step time exactly.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from simulator.economics.convergence import convergence_results
from simulator.economics.cost import training_economics
from simulator.engine.engine import Engine, Task, TaskPart, cyclic_gc_paused, part_spans
from simulator.errors import ConfigError
from simulator.memory.analytic import fits as memory_fits
from simulator.report.result import BREAKDOWN_KEYS, SimulationResult, TimelineEvent
from simulator.scenario import Scenario, load_scenario
from simulator.strategies.plan import MEMORY_COUNTER, Plan, step_durations, step_end_times, window_step_times
from simulator.strategies.registry import get_kind, layout_fields_read
from simulator.strategies.spmd.split import chunk_counts, split_choice
from workloads.counting import padded_total_params, total_params
from workloads.graph import ModelFlops, ShardShape
from workloads.schema import TransformerSpec

_BUSY = {"compute": "compute", "recompute": "recompute", "host_stall": "host_stall", "optimizer": "optimizer"}
_END = attrgetter("end_s")
# the categories a gap's charge keeps (:func:`_charge_gap`); every other one goes to the pipeline bubble
_CHARGED_AS_ITSELF = frozenset(BREAKDOWN_KEYS) - set(_BUSY) - {"pipeline_bubble"}


def _binding_dep(task: Task) -> Task | None:
    """The dependency that finished last (for a kernel: not its own stream's predecessor); the first
    of those that finished last (as ``max``)."""
    best = None
    if task.stream == "compute":
        actor = task.actor
        for d in task.deps:
            if d.stream == "compute" and d.actor == actor:
                continue
            if best is None or d.end_s > best.end_s:
                best = d
        return best
    for d in task.deps:
        if best is None or d.end_s > best.end_s:
            best = d
    return best


def _charge_gap(breakdown: dict[str, float], gap_start: float, gap_end: float, waited_for: Task | None) -> None:
    """Charge the idle interval [gap_start, gap_end] along the chain of what it waited for: the
    part while ``waited_for`` ran goes to its category (another stage's kernels: the pipeline
    bubble), the part before it started to whatever *it* waited for, recursively. A chain task
    (``Task.parts``) is waited for as its last part, which waited only for the part before it."""
    while gap_end - gap_start > 0:
        if waited_for is None:
            breakdown["pipeline_bubble"] += gap_end - gap_start
            return
        parts = waited_for.parts
        if parts is not None and len(parts) > 1:
            category, upstream = parts[-1].category, None
        else:
            category, upstream = waited_for.category, _binding_dep(waited_for)
        if category in _BUSY or category not in breakdown:
            category = "pipeline_bubble"  # a kernel of another rank: waiting on the pipeline
        ready = waited_for.ready_s
        if ready < waited_for.start_s and ready < gap_end:  # NaN (a mark, never run): not this branch
            # A collective that met its peers late (a rendezvous: ready, its own inputs done and its stream
            # free, at ``ready_s``; begun when the last member came, at ``start_s``): the time between was
            # another rank's work -- e.g. the tied-embedding all-reduce of the last stage waiting for the first
            # stage's backward (the pipeline's drain), not the collective's own time.
            start = waited_for.start_s
            own_start = gap_start if start <= gap_start else (gap_end if start >= gap_end else start)
            breakdown[category] += gap_end - own_start
            late = gap_start if ready <= gap_start else ready
            breakdown["pipeline_bubble"] += own_start - late
            gap_end = late
            if upstream is None or upstream.end_s <= gap_start:
                breakdown[category] += gap_end - gap_start  # queued behind its own stream: all its own
                return
            queued = upstream.end_s  # from its upstream's end until ready it sat behind its own stream: its own
            if queued < gap_end:
                breakdown[category] += gap_end - queued
                gap_end = queued
            waited_for = upstream
            continue
        if upstream is None or upstream.end_s <= gap_start:
            breakdown[category] += gap_end - gap_start  # queued behind its own stream: all its own
            return
        start = waited_for.start_s  # clipped to the gap: min(gap_end, max(gap_start, start))
        own_start = gap_start if start <= gap_start else (gap_end if start >= gap_end else start)
        # from its upstream's end to its own start it sat queued behind its own stream: its own too
        ready = upstream.end_s
        if ready < own_start:
            own_start = ready
        breakdown[category] += gap_end - own_start
        gap_end, waited_for = own_start, upstream


def time_breakdown(plan: Plan, actor: str, step_time: float) -> dict[str, float]:
    """Attribute the critical actor's step time to busy work and what it waited for."""
    breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    cursor = 0.0
    for task in plan.compute_tasks[actor]:
        if task.start_s - cursor > 0:  # an idle gap before it (what it waited for is looked up only then)
            _charge_gap(breakdown, cursor, task.start_s, _binding_dep(task))
        if task.parts is not None:  # a chain: each part as its own task would count (part_spans' sums)
            start = task.start_s
            for part in task.parts:
                end = start + part.duration_s
                if part.segments:
                    for category, seconds in part.segments:
                        breakdown[_BUSY.get(category, category)] += seconds
                else:
                    breakdown[_BUSY.get(part.category, "compute")] += end - start
                start = end
        elif task.segments:
            for category, seconds in task.segments:
                breakdown[_BUSY.get(category, category)] += seconds
        else:
            breakdown[_BUSY.get(task.category, "compute")] += task.end_s - task.start_s
        cursor = task.end_s
    if step_time > cursor:
        _charge_tail(breakdown, plan, actor, cursor, step_time)
    return breakdown


def _charge_tail(breakdown: dict[str, float], plan: Plan, actor: str, cursor: float, step_time: float) -> None:
    """After its last kernel (ending at ``cursor``) the rank waits for its DP reductions or for other stages."""
    _charge_gap(breakdown, cursor, step_time, _tail_waited_for(plan, actor, cursor))


def _tail_waited_for(plan: Plan, actor: str, cursor: float) -> Task | None:
    """What the rank waits for after its last kernel (ending at ``cursor``): its other streams' task that
    ends last (the first of those), if after ``cursor``."""
    tail = [t for (a, s), ts in plan.streams.items() if a == actor and s != "compute" for t in ts]
    last = max(tail, key=_END, default=None)
    return last if last and last.end_s > cursor else None


def pipeline_bubble_s(plan: Plan, actor: str, step_time: float) -> float:
    """``time_breakdown(plan, actor, step_time)["pipeline_bubble"]``, to the bit, without the busy sums and
    the other categories' charges: the bubble is added to by the gap charges alone (:func:`_gap_bubble`: the
    same chain walk, the same additions to it in the same order; and by a ``pipeline_bubble`` segment, which
    no spmd plan has, in its place). What :func:`_busiest_stage` and the fold (every stage of a 64-stage
    Megatron-1T run) compare across stages: ~4x cheaper per stage than the whole breakdown (GPT-3 175B pp 16,
    16 stages: 13.5 -> 3.6 ms); the walk's dependency scan inline, ~0.88x (s14, 64 stages)."""
    bubble = 0.0
    cursor = 0.0
    with_bubble: dict[int, bool] = {}  # id(parts or segments) -> whether a segment is charged to the bubble
    for task in plan.compute_tasks[actor]:
        start = task.start_s
        if start - cursor > 0:  # the gap before it, charged along the chain of what it waited for
            bubble = _gap_bubble(bubble, cursor, start, _binding_dep(task))
        shape = task.parts if task.parts is not None else task.segments
        if shape:
            found = with_bubble.get(id(shape))
            if found is None:
                found = with_bubble[id(shape)] = _segments_charge_bubble(shape)
            if found:
                if task.parts is not None:
                    for part in task.parts:
                        for category, seconds in part.segments or ():
                            if _BUSY.get(category, category) == "pipeline_bubble":
                                bubble += seconds
                else:
                    for category, seconds in task.segments:
                        if _BUSY.get(category, category) == "pipeline_bubble":
                            bubble += seconds
        cursor = task.end_s
    if step_time > cursor:
        bubble = _gap_bubble(bubble, cursor, step_time, _tail_waited_for(plan, actor, cursor))  # as _charge_tail
    return bubble


def _gap_bubble(bubble: float, gap_start: float, gap_end: float, waited_for: Task | None) -> float:
    """``bubble`` plus what :func:`_charge_gap` charges to ``pipeline_bubble`` of the gap [gap_start, gap_end]:
    the same walk along what it waited for (:func:`_binding_dep` inline: it is called ~12k times a
    Megatron-1T simulate), the same additions to the bubble in the same order; the other categories'
    charges are not made. Keep in step with :func:`_charge_gap`."""
    while gap_end - gap_start > 0:
        if waited_for is None:
            return bubble + (gap_end - gap_start)
        parts = waited_for.parts
        if parts is not None and len(parts) > 1:
            category, upstream = parts[-1].category, None
        else:
            category, upstream = waited_for.category, None
            if waited_for.stream == "compute":
                own = waited_for.actor
                for d in waited_for.deps:
                    if (d.stream != "compute" or d.actor != own) and (upstream is None or d.end_s > upstream.end_s):
                        upstream = d
            else:
                for d in waited_for.deps:
                    if upstream is None or d.end_s > upstream.end_s:
                        upstream = d
        to_bubble = category not in _CHARGED_AS_ITSELF  # as _charge_gap's category is "pipeline_bubble"
        ready = waited_for.ready_s
        if ready < waited_for.start_s and ready < gap_end:  # met its peers late (as _charge_gap)
            start = waited_for.start_s
            own_start = gap_start if start <= gap_start else (gap_end if start >= gap_end else start)
            if to_bubble:
                bubble += gap_end - own_start
            late = gap_start if ready <= gap_start else ready
            bubble += own_start - late
            gap_end = late
            if upstream is None or upstream.end_s <= gap_start:
                return bubble + (gap_end - gap_start) if to_bubble else bubble
            queued = upstream.end_s  # behind its own stream until ready: its own (as _charge_gap)
            if queued < gap_end:
                if to_bubble:
                    bubble += gap_end - queued
                gap_end = queued
            waited_for = upstream
            continue
        if upstream is None or upstream.end_s <= gap_start:
            return bubble + (gap_end - gap_start) if to_bubble else bubble
        start = waited_for.start_s  # clipped to the gap: min(gap_end, max(gap_start, start))
        own_start = gap_start if start <= gap_start else (gap_end if start >= gap_end else start)
        ready = upstream.end_s  # queued behind its own stream after its upstream ended: its own (as _charge_gap)
        if ready < own_start:
            own_start = ready
        if to_bubble:
            bubble += gap_end - own_start
        gap_end, waited_for = own_start, upstream
    return bubble


def _segments_charge_bubble(shape) -> bool:
    """Whether a chain's parts or a task's segments put seconds on ``pipeline_bubble`` (time_breakdown's busy sums)."""
    segments = [s for part in shape for s in (part.segments or ())] if isinstance(shape[0], TaskPart) else shape
    return any(_BUSY.get(category, category) == "pipeline_bubble" for category, _ in segments)


def window_breakdown(plan: Plan, actor: str) -> dict[str, float]:
    """The breakdown of a steady-state window (:attr:`Plan.window`) per step: the actor's
    busy time inside the window by category, clipped at its ends, and the rest of the window
    charged along what the next kernel waited for (as :func:`time_breakdown`), divided by the
    window's steps so that the parts add up to the step time."""
    opens, closes = plan.window
    steps = len(closes)
    start, end = max(t.end_s for t in opens), max(t.end_s for t in closes[-1])
    totals = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    cursor = start
    for task in plan.compute_tasks[actor]:
        lo, hi = max(task.start_s, start), min(task.end_s, end)
        if task.end_s <= start or task.start_s >= end:
            continue
        if lo > cursor:
            _charge_gap(totals, cursor, lo, _binding_dep(task))
        parts = task.segments or ((task.category, task.end_s - task.start_s),)
        whole = sum(seconds for _, seconds in parts) or 1.0
        for category, seconds in parts:
            totals[_BUSY.get(category, category if category in totals else "compute")] += (hi - lo) * seconds / whole
        cursor = hi
    if end > cursor:
        totals["pipeline_bubble"] += end - cursor
    return {key: value / steps for key, value in totals.items()} if steps else totals


def critical_actor(plan: Plan) -> str:
    ends = {a: max(map(_END, ts), default=0.0) for a, ts in plan.compute_tasks.items()}
    return max(ends, key=lambda a: (ends[a], -plan.stage_of[a]))


def _event_args(task: Task) -> tuple[tuple[tuple[str, Any], ...], str | None]:
    """Trace arguments of a task (its layer and FLOPs, bytes it puts on its busiest link, group size, rendezvous) and, for
    a pipeline send, the actor that receives it (from the link demands: ``{dst}:{link}_rx``)."""
    args: list[tuple[str, Any]] = list(task.info)
    if task.demands:
        args.append(("bytes", max(task.demands.values())))
    if task.rendezvous_size > 1:
        args.append(("group_size", task.rendezvous_size))
    if task.rendezvous:
        args.append(("collective", task.rendezvous.split("@")[0]))
    flow_to = None
    if task.category == "pp_comm" and task.demands:
        receivers = {k.split(":")[0] for k in task.demands if k.endswith("_rx")} - {task.actor}
        flow_to = min(receivers) if receivers else None
    return tuple(args), flow_to


def _timeline(plan: Plan) -> list[TimelineEvent]:
    events = []
    for (actor, stream), tasks in plan.other_streams.items():  # co-located jobs: when each kernel ran
        for t in tasks:
            if t.run_spans:
                events.extend(TimelineEvent(actor, stream, t.name, t.category, a, b, _event_args(t)[0])
                              for a, b in t.run_spans)
            elif t.end_s > t.start_s:  # NaN (cut off when the foreground ended): not shown
                events.append(TimelineEvent(actor, stream, t.name, t.category, t.start_s, t.end_s, _event_args(t)[0]))
    for (actor, stream), tasks in plan.streams.items():
        for t in tasks:
            if not t.end_s > t.start_s:
                continue
            if t.parts is not None:  # a chain: its parts as the tasks they stand for
                for name, part, start, end in part_spans(t):
                    if part.segments:
                        cursor = start
                        for category, seconds in part.segments:
                            seg_stream = category.removesuffix("_comm") if category.endswith("_comm") else stream
                            events.append(TimelineEvent(actor, seg_stream, name, category, cursor, cursor + seconds,
                                                        t.info if seg_stream == stream else ()))
                            cursor += seconds
                    elif end > start:
                        events.append(TimelineEvent(actor, stream, name, part.category, start, end, t.info))
                continue
            if t.segments:  # unfold kernel + TP segments onto their streams
                cursor = t.start_s
                layer = tuple(item for item in t.info if item[0] == "layer")
                for category, seconds in t.segments:
                    seg_stream = category.removesuffix("_comm") if category.endswith("_comm") else stream
                    args = t.info if seg_stream == stream else layer  # the kernel's FLOPs on its own part
                    events.append(TimelineEvent(actor, seg_stream, t.name, category, cursor, cursor + seconds, args))
                    cursor += seconds
                continue
            events.append(TimelineEvent(actor, stream, t.name, t.category, t.start_s, t.end_s, *_event_args(t)))
    events.sort(key=lambda e: (e.rank_class, e.stream, e.start_s))
    return events


ENGINES = ("full", "fast", "auto")


def _run_plan(scenario: Scenario, kind, mode: str, detail: bool, engine: str, observe=None):
    """Time the plan: the discrete-event engine (``full``), the longest path over the same task
    DAG (``fast``, simulator/strategies/spmd/fast.py), or the fast path where it is exact -- no
    transfers contending, no interference -- and the engine elsewhere (``auto``). Returns
    (makespan, plan with timed tasks or None, the critical rank's breakdown of the makespan,
    what the result adds: ``engine`` (which timed it) and, for the fast path, its lower bound (every
    transfer alone) and why it may differ from the engine, the engine that ran or None). The fast
    path counts no memory: its results have no simulated memory peaks or series. ``observe(micro_batches,
    plan)``: called with the plan before the engine runs it."""
    if engine not in ENGINES:
        raise ConfigError("--engine", f"must be one of {', '.join(ENGINES)}, got {engine!r}")
    if scenario.co_located:  # jobs sharing the GPUs: one engine run of all of them (simulator/colocation/run.py)
        if engine == "fast":  # auto: the fast path is never exact here, so the engine
            raise ConfigError("--engine", "co-located jobs are timed by the full engine (their kernels share GPUs)")
        from simulator.colocation.run import run_co_located

        return run_co_located(scenario, detail)
    if engine != "full" and scenario.simulation.stragglers is not None:
        engine = "full"  # per-device draws are simulated by the engine (the fast path prices no draws)
    if engine != "full":
        if scenario.strategy_kind != "spmd":
            raise ConfigError("--engine", f"the fast path covers the spmd strategy, not {scenario.strategy_kind!r}")
        from simulator.strategies.spmd.fast import fast_step

        estimate = fast_step(scenario, mode=mode, detail=detail)
        if engine == "fast" or estimate.exact:
            info = {"engine": "fast", "fast_path_lower_bound_s": estimate.lower_bound_s}
            if estimate.approximation:
                info["fast_path_approximation"] = estimate.approximation
            if not estimate.breakdown_exact:
                info["time_breakdown_extrapolated"] = True
            return estimate.step_time_s, estimate.plan, estimate.breakdown, info, None
    stragglers = scenario.simulation.stragglers
    # The engine runs a pass's back-to-back tasks as one chain (exact; the spmd kind's plan; per-device
    # straggler draws scale single tasks, so not then).
    chains = {"chains": True} if scenario.strategy_kind == "spmd" and stragglers is None else {}
    plan = kind.compile(scenario, mode=mode, detail=detail, **chains)
    if observe is not None:
        observe(scenario.parallelism.num_micro_batches, plan)
    straggled = {}
    if stragglers is not None:  # per-device draws scale each actor's kernels (simulator/cost/stragglers.py)
        from simulator.cost.stragglers import apply_stragglers, straggler_summary

        straggled = straggler_summary(apply_stragglers(plan, stragglers, scenario.num_gpus))
    engine_run = Engine(plan.topology.port_capacity)
    makespan = engine_run.run(plan.streams, {(a, MEMORY_COUNTER): b for a, b in plan.memory_base_bytes.items()})
    return makespan, plan, time_breakdown(plan, critical_actor(plan), makespan), {"engine": "full", **straggled}, engine_run


def simulate(scenario: Scenario, mode: str | None = None, detail: bool = False,
             run_if_oom: bool = True, engine: str = "full", fold: bool = True, observe=None) -> SimulationResult:
    """Simulate ``simulation.steps`` steps (one by default). ``mode`` overrides ``scenario.simulation.mode``; ``detail`` makes one
    task per kernel (for traces). An out-of-memory layout is still timed unless ``run_if_oom``
    is false, and is reported with ``fits: false`` and the reason. ``engine``: ``full`` (the
    discrete-event engine, the reference), ``fast`` or ``auto`` (see :func:`_run_plan`); the
    result's ``engine`` says which timed it. The fast path's folded evaluation keeps no plan:
    its breakdown is extrapolated and it has no timeline. ``fold``: the engine may run a long 1F1B or
    interleaved pipeline folded (simulator/strategies/spmd/fold.py: two runs at fewer micro-batches,
    extrapolated where every figure is affine; equal to the unrolled run to 1e-9); a folded result has
    no memory-over-time series and no timeline, and says ``engine_fold``. ``observe(micro_batches, plan)``:
    called with every plan the engine runs, before it runs (the fast path walks the same plans,
    :func:`simulator.strategies.spmd.fast.fast_beside_engine`)."""
    model, par = scenario.model, scenario.parallelism
    mode = mode or scenario.simulation.mode
    kind = get_kind(scenario.strategy_kind)
    stage, peak, per_stage = kind.memory(scenario)
    ok, reason = memory_fits(scenario, peak, per_stage)
    if ok and scenario.co_located:
        from simulator.colocation.run import shared_memory_fits

        ok, reason = shared_memory_fits(scenario)
    flops = kind.step_flops(scenario) if kind.step_flops else _step_flops(scenario)
    step_time = makespan = None
    steps_run = scenario.simulation.steps  # a kind may round it up to whole periods (Plan.steps)
    steps_rounding = None  # why it did (Plan.steps_rounding)
    step_times: list[float] = []
    memory_peaks: dict[str, float] = {}
    memory_series: dict[str, list[tuple[float, float]]] = {}
    actor_stage: dict[str, int] = {}
    kind_report: dict[str, float] = {}
    breakdown: dict[str, float | None] = dict.fromkeys(BREAKDOWN_KEYS)  # not simulated: no times (NaN in a table)
    timeline_builder = None
    kind_extra: dict[str, Any] = {}
    busiest_stage, busiest = None, {}
    layers_per_chunk = chunk_counts(scenario, scenario.layer_graph())
    extra: dict[str, Any] = {}
    if getattr(par, "pp_split", "even") == "balanced" and par.pp * par.virtual_stages > 1:
        # which cut the schedule estimate chose, and the even cut's estimate beside it (printed on
        # the layers/stage line): a balanced plan never hides that the even one would be faster
        extra["pp_split_choice"] = split_choice(scenario, scenario.layer_graph()).to_dict()
    folded = None
    if (ok or run_if_oom) and fold and engine == "full" and not detail:
        from simulator.strategies.spmd.fold import folded_engine_run

        with cyclic_gc_paused():
            folded = folded_engine_run(scenario, mode, observe)
    if folded is not None:
        makespan = step_time = folded.makespan_s
        step_times = [step_time]
        breakdown = dict(folded.breakdown)
        memory_peaks = {a: b / 2**30 for a, b in folded.memory_peak_bytes.items()}
        actor_stage = dict(folded.stage_of)
        mode = folded.mode or mode
        busiest_stage, busiest = folded.busiest_stage, dict(folded.busiest)
        extra.update({"engine": "full", "engine_fold": {
            "micro_batches_evaluated": list(folded.micro_batches_evaluated),
            "note": "steady state folded: figures extrapolated from the engine at these micro-batch counts "
                    "(no memory-over-time series, no timeline)"}})
    elif ok or run_if_oom:
        with cyclic_gc_paused():  # the plan's tasks and the engine's events: no cycles among them to find
            makespan, plan, total_breakdown, info, engine_run = _run_plan(scenario, kind, mode, detail, engine,
                                                                          observe)
        if engine_run is not None:  # the engine counts memory as tasks allocate and free it
            memory_peaks = {a: engine_run.counter_peaks[(a, MEMORY_COUNTER)] / 2**30 for a in plan.memory_base_bytes}
            memory_series = {a: engine_run.counter_series[(a, MEMORY_COUNTER)] for a in plan.memory_base_bytes}
        if plan is not None:
            actor_stage = dict(plan.stage_of)
            kind_report = plan.report() if plan.report else {}
            steps_run, steps_rounding = plan.steps, plan.steps_rounding
            mode = plan.mode or mode
        if plan is not None and plan.window is not None:  # a steady-state window (asynchronous kinds)
            step_times = window_step_times(plan)
            step_time = sum(step_times) / len(step_times)
            breakdown = window_breakdown(plan, critical_actor(plan))
        else:
            step_time = makespan / steps_run
            # the fast path folds only single steps (simulator/strategies/spmd/fast.py): a plan is kept for many
            step_times = (step_durations(step_end_times(plan, makespan)) if plan is not None
                          else [step_time] * steps_run)
            breakdown = {k: v / steps_run for k, v in (total_breakdown or dict.fromkeys(BREAKDOWN_KEYS, 0.0)).items()}
            if plan is not None and plan.stage_of:  # the fast path keeps no plan: no second stage shown
                busiest_stage, busiest = _busiest_stage(plan, critical_actor(plan), breakdown, makespan)
        extra.update(info)
        if plan is not None:
            timeline_builder = lambda: _timeline(plan)  # noqa: E731
            kind_extra = dict(plan.extra)
            if plan.after_run is not None:
                kind_extra.update(plan.after_run())
    result = SimulationResult(
        scenario_name=scenario.name,
        run=run_identity(scenario),
        layout_fields_read=layout_fields_read(get_kind(scenario.strategy_kind), scenario.strategy),
        num_gpus=scenario.num_gpus,
        num_parameters=_total_params(scenario),
        num_parameters_padded=_held_params(scenario),
        num_trained_parameters=(int(round(_unsharded_graph(scenario).trained_params()))
                                if scenario.training.finetune is not None else None),
        parallelism=par.model_dump(),
        step_time_s=step_time,
        steps=steps_run,
        steps_requested=scenario.simulation.steps,
        steps_rounding=steps_rounding,
        step_times_s=step_times,
        makespan_s=makespan,
        simulated_peak_memory_gib=memory_peaks,
        memory_series_bytes=memory_series,
        actor_stage=actor_stage,
        tokens_per_step=par.global_batch_size * tokens if (tokens := _tokens_per_sample(scenario)) else None,
        samples_per_step=par.global_batch_size,
        sample=getattr(model, "sample", "sequence"),
        model_flops_per_step=flops.model_flops,
        flops_counted_layers=(None if flops.layers_counted is None or flops.layers_counted == flops.layers_total
                              else (flops.layers_counted, flops.layers_total)),
        hardware_flops_per_step=flops.hardware_flops,
        peak_tflops_per_gpu=mean_peak_tflops(scenario),
        peak_memory_gib=peak.total_bytes / 2**30,
        peak_memory_stage=stage,
        memory_gib=peak.gib(),
        memory_per_stage_gib=[b.total_bytes / 2**30 for b in per_stage],
        hbm_gib=_stage_hbm_gib(scenario, stage),
        fits=ok,
        infeasible_reason=reason,
        time_breakdown_s=breakdown,
        layer_split=layers_per_chunk,
        layers_per_stage=[sum(layers_per_chunk[c * par.pp + i] for c in range(par.virtual_stages))
                          for i in range(par.pp)],
        mode=mode,
        tokens_to_train=scenario.training.tokens,
        extra={**kind_report, **kind_extra},
        busiest_stage=busiest_stage,
        busiest_stage_breakdown_s=busiest,
        timeline_builder=timeline_builder,
    )
    result.extra.update(extra)
    if scenario.mixed:
        result.extra["node_groups"] = node_groups(scenario)
    return _with_economics(scenario, result)


def _stage_hbm_gib(scenario: Scenario, stage: int | None) -> float:
    """HBM of the GPUs holding the peak stage (on a mixed cluster the smallest of its groups')."""
    if not scenario.mixed:
        return scenario.accelerator.hbm_gib
    from simulator.memory.analytic import stage_group_indices

    return min(scenario.groups[i].accelerator.hbm_gib for i in stage_group_indices(scenario, stage or 0))


def mean_peak_tflops(scenario: Scenario) -> float:
    """The datasheet peak per GPU at the training precision; on a mixed cluster the mean over its
    ranks (so MFU = model FLOPs / (step time x the sum of every GPU's peak))."""
    precision = "tf32" if scenario.training.tf32 else scenario.training.precision
    return sum(g.accelerator.peak_tflops[precision] * g.num_gpus for g in scenario.groups) / scenario.num_gpus


def node_groups(scenario: Scenario) -> list[dict[str, Any]]:
    """A mixed cluster's groups as the report names them (ranks fill them in order)."""
    return [{"node": g.node.name, "accelerator": g.accelerator.name, "nodes": g.num_nodes, "gpus": g.num_gpus,
             "ranks": [g.first_rank, g.first_rank + g.num_gpus - 1], "hbm_gib": g.accelerator.hbm_gib,
             "peak_tflops": g.accelerator.peak_tflops[scenario.training.precision]} for g in scenario.groups]


def _unsharded_graph(scenario: Scenario):
    """The model's graph for one sample on one device (no split): what FLOPs and parameters count; a
    transformer's vocabulary padded as the layout's tp pads it (``TransformerSpec.padded_vocab_size``:
    Megatron-LM counts the padded vocabulary in its FLOPs, and the padded rows are held)."""
    return scenario.model.layer_graph(ShardShape(micro_batch=1, seq_length=scenario.seq_length or 1,
                                                 precision=scenario.training.precision,
                                                 flash_attention=scenario.training.attention == "flash",
                                                 vocab_padding_tp=scenario.parallelism.tp,
                                                 lora=scenario.shard.lora,
                                                 document_tokens=scenario.shard.document_tokens))


def _tokens_per_sample(scenario: Scenario) -> int | None:
    """The sequence length, or the tokens a network cuts a sample into (a ViT's patches and class
    token); None where the model has no token sequence (a CNN)."""
    return scenario.seq_length or getattr(scenario.model, "tokens_per_sample", None)


def _total_params(scenario: Scenario) -> int:
    """The model's parameters: the sum over its unsplit layer graph (a transformer's cached per model,
    workloads/counting.py; its own vocabulary, without Megatron's padding)."""
    if isinstance(scenario.model, TransformerSpec):
        return total_params(scenario.model)
    return int(round(_unsharded_graph(scenario).total_params()))


def _held_params(scenario: Scenario) -> int:
    """The parameters the layout holds over all its shards: a transformer's with the vocabulary padded
    for the layout's tp (``TransformerSpec.make_vocab_size_divisible_by``); any other model's own count."""
    if isinstance(scenario.model, TransformerSpec):
        return padded_total_params(scenario.model, scenario.parallelism.tp)
    return _total_params(scenario)


def _step_flops(scenario: Scenario) -> ModelFlops:
    """FLOPs per optimizer step summed over the ops of the unsplit layer graph (GEMMs, convolutions,
    attention; :meth:`workloads.layer_graph.LayerGraph.step_flops`, cached on the graph): model FLOPs
    forward + backward by the graph's rule (a transformer's 3 x forward), hardware FLOPs with the
    recomputed forward. The same sum for every network."""
    par = scenario.parallelism
    graph = _unsharded_graph(scenario)
    if getattr(par, "recompute_method", None) is None:
        return graph.step_flops(par.global_batch_size, par.recompute_mode)
    # partial full recompute: which layers are re-run depends on the chunks' layers
    return graph.step_flops(par.global_batch_size, par.recompute_mode, tuple(chunk_counts(scenario, graph)))


def stage_breakdowns(plan: Plan, critical: str, makespan: float) -> dict[int, dict[str, float]]:
    """Each pipeline stage's breakdown per step (its first actor's), but the critical actor's own
    stage; empty when the plan has fewer than two stages."""
    first_actor: dict[int, str] = {}
    for actor in plan.compute_tasks:
        first_actor.setdefault(plan.stage_of[actor], actor)
    if len(first_actor) < 2:
        return {}
    return {stage: {k: v / plan.steps for k, v in time_breakdown(plan, actor, makespan).items()}
            for stage, actor in sorted(first_actor.items()) if actor != critical}


def least_waiting_stage(stages: dict[int, dict[str, float]],
                        critical_breakdown: dict[str, float]) -> tuple[int | None, dict[str, float]]:
    """The pipeline stage that waits least (the most time busy or in its own communication): what
    bounds a pipeline, when the critical rank (the one finishing last) mostly waits for it. DeepSeek-V3
    on 2048 H800s: stage 0 (3 dense layers) finishes last and spends 58% of the step in the bubble,
    while the MoE stages spend it in their expert all-to-alls. ``stages``: per stage but the critical
    rank's, its breakdown per step (:func:`stage_breakdowns`). Returns (stage, its breakdown per step),
    or (None, {}) when that is the critical rank's own stage."""
    def waiting(b: dict[str, float]) -> float:
        return b.get("pipeline_bubble", 0.0)

    best_stage, best = None, critical_breakdown
    for stage, b in sorted(stages.items()):
        if waiting(b) < waiting(best) - 1e-12:
            best_stage, best = stage, b
    return (best_stage, best) if best_stage is not None else (None, {})


def _busiest_stage(plan: Plan, critical: str, critical_breakdown: dict[str, float],
                   makespan: float) -> tuple[int | None, dict[str, float]]:
    """:func:`least_waiting_stage` of the plan's stages (:func:`stage_breakdowns`): the stages compared by
    their bubbles alone (:func:`pipeline_bubble_s`, the same floats), the winner's whole breakdown after."""
    first_actor: dict[int, str] = {}
    for actor in plan.compute_tasks:
        first_actor.setdefault(plan.stage_of[actor], actor)
    if len(first_actor) < 2:
        return None, {}
    bubbles = {stage: {"pipeline_bubble": pipeline_bubble_s(plan, actor, makespan) / plan.steps}
               for stage, actor in sorted(first_actor.items()) if actor != critical}
    stage, _ = least_waiting_stage(bubbles, critical_breakdown)
    if stage is None:
        return None, {}
    return stage, {k: v / plan.steps for k, v in time_breakdown(plan, first_actor[stage], makespan).items()}


def run_identity(scenario: Scenario) -> dict[str, Any]:
    """What the run is, beyond its layout: model, hardware, sequence and precision (every result row
    and the table carry them, swept or not). ``seq_length_source`` says where the sequence came from."""
    model = scenario.model
    notes = getattr(model, "notes", None) or ""
    if not scenario.seq_length:
        source = None  # a network without a sequence (images)
    elif scenario.training.seq_length:
        source = "training.seq_length"
    elif notes.startswith("sequence length"):
        source = notes.split(" from ", 1)[-1]
    else:
        source = "the model's seq_length"
    accelerators = " + ".join(dict.fromkeys(g.accelerator.name for g in scenario.groups))
    out = {"model": model.name, "node": scenario.cluster_label, "accelerator": accelerators,
           "num_nodes": scenario.num_nodes, "seq_length": scenario.seq_length,
           "precision": scenario.training.precision + (" (TF32 tensor cores)" if scenario.training.tf32 else ""),
           "strategy": scenario.strategy_kind, "seq_length_source": source}
    if scenario.training.packing is not None:  # attention per document (workloads/packing.py)
        out["document_tokens"] = scenario.training.packing.document_tokens
    if scenario.frameworks:  # training.framework and whether its factors were fitted here (simulator/cost/framework.py)
        out["framework"] = scenario.frameworks[0].name
        out["framework_state"] = " + ".join(dict.fromkeys(c.state for c in scenario.frameworks))
    return out


def _with_economics(scenario: Scenario, result: SimulationResult) -> SimulationResult:
    """Add time, cost and energy to train (and goodput under failures) when tokens are given, and
    steps / time to target when the scenario has a ``convergence:`` block."""
    if scenario.training.tokens and result.step_time_s:
        result.extra.update(training_economics(scenario, result.to_dict()))
    if scenario.convergence is not None:
        kind = get_kind(scenario.strategy_kind)
        inputs = kind.convergence_inputs(scenario) if kind.convergence_inputs else {}
        if result.extra.get("staleness_steps_mean") is not None:  # measured in the run (simulator/strategies/plan.py)
            inputs = {**inputs, "staleness_steps": result.extra["staleness_steps_mean"]}
        result.extra.update(convergence_results(
            scenario.convergence, result.step_time_s, scenario.parallelism.global_batch_size, scenario.seq_length,
            staleness_steps=float(inputs.get("staleness_steps", 0.0)), local_steps=int(inputs.get("local_steps", 1))))
    if scenario.reliability is not None and result.step_time_s:
        from simulator.economics.simulated_goodput import simulated_goodput

        result.extra["reliability"] = simulated_goodput(scenario, result.step_time_s,
                                                        result.num_parameters_padded or result.num_parameters)
    return result


def simulate_point(raw: dict[str, Any], overrides: list[str] | None = None, run_if_oom: bool = False,
                   engine: str = "full", messages: bool = False) -> dict[str, Any]:
    """Simulate a raw scenario mapping; bad input becomes a row with the reason (for sweeps).
    ``engine``: as for :func:`simulate`, or ``full+fast``: the engine's row with the fast path's
    ``fast_step_time_s`` and ``fast_path_lower_bound_s`` from the same plans
    (:func:`simulator.strategies.spmd.fast.fast_beside_engine`; None where it does not apply).
    ``messages``: the row also carries the scenario's ``warnings`` and ``notes`` (lists, as
    ``clustersim simulate --json`` has them; :func:`simulator.report.messages.scenario_messages`),
    which search, sweep and scale print once each."""
    try:
        scenario = load_scenario(raw, overrides)
        if engine == "full+fast":
            from simulator.strategies.spmd.fast import fast_beside_engine

            result, estimate = fast_beside_engine(scenario, run_if_oom=run_if_oom)
            row = result.to_dict()
            row["fast_step_time_s"] = estimate.step_time_s if estimate is not None else None
            row["fast_path_lower_bound_s"] = estimate.lower_bound_s if estimate is not None else None
            if estimate is not None and estimate.approximation:
                row["fast_path_approximation"] = estimate.approximation
        else:
            row = simulate(scenario, run_if_oom=run_if_oom, engine=engine).to_dict()
        if messages:
            from simulator.report.messages import scenario_messages

            said = scenario_messages(scenario)
            row["warnings"], row["notes"] = said["warnings"], said["notes"]
        return row
    except ConfigError as exc:
        return {"fits": False, "infeasible_reason": str(exc), "step_time_s": None}
