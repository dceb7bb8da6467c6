"""A layout search too wide to list: every candidate counted, only the best k returned.

``search`` (simulator/explore/search.py) returns a row per candidate; Calculon's search space for
GPT-3 175B on 1,024 GPUs (every tp, pp, dp, micro-batch, interleave, recompute, ZeRO stage and
overlap option, Isaev et al. SC'23 Sec. 5) has on the order of a million, too many rows to build.
:func:`wide_search` searches such a space by branch and bound and returns counts and the top k:

1. the layouts of :func:`~simulator.explore.search.enumerate_layouts` (the *bases*) times every
   combination of the overlap switches asked for; every one is a candidate
   (``SearchSpace``'s switch fields);
2. divisibility and memory are decided once per base and ``tp_comm_overlap`` (the only switch a
   layout's validity or memory depends on: it needs sequence parallelism and changes the layer
   graph; the memory model reads no other switch), in the worker pool, by the search's checks
   (simulator/explore/checks.py: the layout resolved on the scenario validated once, every stage's
   memory at once);
3. for each layout that fits, the step-time lower bound (simulator/explore/bounds.py) is priced
   once per TP-overlap setting (``overlap_tp_grad_comm``, ``tp_comm_overlap``: they change the
   exposed collectives of a pass); the gradient-reduction and weight-gather switches only change
   the step's tail and are combined without pricing (:meth:`BoundParts.bound_s`);
   ``overlap_p2p_comm`` does not enter the bound;
4. branch and bound as in ``search`` (:func:`simulator.explore.bounds.engine_branch_and_bound`):
   the engine best bound per token first while the next bound is at most the k-th best engine time
   (the 2k smallest bounds with the fast path beside it on the same plans), then
   the fast path on the top k that lack it. Exact (the top k of the engine over every candidate)
   because the bound is never above the engine's step (tests/test_search_bounds.py).
   Candidates that differ only in switches that cannot change their plan (:func:`inert_switches`:
   no pipeline to block on sends, no data parallelism or ZeRO stage the gather/reduction switches
   act on, no tensor parallelism) are one plan, timed once.

Candidates that build one plan are folded as ``search`` folds them (:class:`simulator.explore.checks.PlanFolds`
by :func:`~simulator.explore.checks.plan_key`: ZeRO-1/2 without data parallelism, a balanced cut equal to the even
one): per ``tp_comm_overlap`` slice, a base whose plan an earlier base builds is folded into it switch for switch,
never bounded nor priced; a top row lists its folded candidates in ``folded_layouts``.

Counts: ``evaluated`` (every candidate not folded), ``folded_as_same_plan``, ``invalid``, ``pruned_by_memory``, ``pruned_by_bound``
(never priced), ``timed`` (by the engine), ``priced_by_fast_path`` (the top k, beside the engine),
``engine_resimulated`` (candidates), ``fast_path_runs`` and ``engine_runs`` (distinct plans timed; an
engine run with the fast path beside it counts once in each); plus ``bases``, the
distinct layouts whose scenario was built, and ``bounds_priced``, the bounds priced by a planner.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import time
from collections.abc import Callable
from typing import Any

from simulator.errors import ConfigError
from simulator.explore.checks import PlanFolds
from simulator.explore.search import BESIDE_FIRST, SWITCHES


@dataclasses.dataclass
class WideResult:
    """What :func:`wide_search` found: ``counts`` (module docstring), ``top`` (the engine's k best rows,
    best first, each with its ``parallelism``), ``seconds`` per phase (wall, this process)."""

    counts: dict[str, int]
    top: list[dict[str, Any]]
    seconds: dict[str, float]


def _check_base(args: tuple[dict[str, Any], list[bool], list[bool], float | None]) -> dict[str, Any]:
    """One base layout: per ``tp_comm_overlap`` value, invalid (reason), out of memory, or the
    bound's parts per ``overlap_tp_grad_comm`` value. Runs in the worker pool."""
    from simulator.explore.bounds import bound_parts, passes_key
    from simulator.explore.checks import build_layout, layout_fits, layout_memory, plan_key

    point, tco_values, otgc_values, max_memory_gib = args
    par = point["parallelism"]
    out: dict[str, Any] = {"slices": {}, "plan_keys": {}}
    for tco in tco_values:
        if tco and not par.get("sequence_parallel"):
            out["slices"][tco] = ("invalid", "tp_comm_overlap needs sequence_parallel")
            continue
        sliced = copy.deepcopy(point)
        sliced["parallelism"]["tp_comm_overlap"] = tco
        try:
            sc = build_layout(sliced)
            stage, peak, per_stage = layout_memory(sc)  # may refuse a split the graph cannot take
            out["plan_keys"][tco] = plan_key(sc)
        except ConfigError as exc:
            out["slices"][tco] = ("invalid", str(exc))
            continue
        ok, _ = layout_fits(sc, peak, per_stage)
        if ok and max_memory_gib is not None and peak.total_gib > max_memory_gib:
            ok = False
        if not ok:
            out["slices"][tco] = ("memory", peak.total_gib)
            continue
        parts = {}
        for otgc in otgc_values:
            if parts and sc.parallelism.tp == 1 and sc.parallelism.cp == 1:
                parts[otgc] = next(iter(parts.values()))  # no TP/CP collective: the switch changes nothing
                continue
            variant = dataclasses.replace(sc, parallelism=sc.parallelism.model_copy(
                update={"overlap_tp_grad_comm": otgc}))
            keyed = {**sliced, "parallelism": {**sliced["parallelism"], "overlap_tp_grad_comm": otgc}}
            parts[otgc] = bound_parts(variant, key=passes_key(keyed))
        out["slices"][tco] = ("fits", parts)
        out["tokens"] = sc.parallelism.global_batch_size * (sc.seq_length or 1)
        out["inert"] = inert_switches(sc.parallelism)
    return out


def inert_switches(par) -> frozenset[str]:
    """The overlap switches that cannot change this layout's plan (simulator/strategies/spmd/plan.py),
    so that candidates differing only in them are one plan, priced once:

    - ``overlap_p2p_comm`` without a pipeline (pp 1: no sends to block on);
    - ``overlap_grad_reduce`` and ``overlap_param_gather`` with one data-parallel rank (dp·cp 1: no
      gradient reduction, no weight gather); ``overlap_grad_reduce`` from ZeRO-2 on (the planner reads
      it only as ``overlap_grad_reduce or zero >= 2``); ``overlap_param_gather`` without ZeRO (only the
      ZeRO-1/2 weight gather and the ZeRO-3 per-layer gathers read it);
    - ``overlap_tp_grad_comm`` with neither tensor, expert-tensor nor context parallelism (no TP
      collective to overlap).

    The memory model reads none of them (module docstring), nor does the step-time bound differ
    between the values of an inert switch (:class:`~simulator.explore.bounds.BoundParts`)."""
    inert = set()
    if par.pp == 1:
        inert.add("overlap_p2p_comm")
    if par.dp_degree * par.cp == 1:
        inert.update(("overlap_grad_reduce", "overlap_param_gather"))
    if par.zero_stage >= 2:
        inert.add("overlap_grad_reduce")
    if par.zero_stage == 0:
        inert.add("overlap_param_gather")
    if par.tp == 1 and par.cp == 1 and getattr(par, "etp", 1) == 1:
        inert.add("overlap_tp_grad_comm")
    return frozenset(inert)


def _fast_task(raw: dict[str, Any]) -> dict[str, Any]:
    from simulator.explore.search import _timed_row

    return _timed_row(raw, "fast")


def _engine_task(raw: dict[str, Any]) -> dict[str, Any]:
    from simulator.explore.search import _timed_row

    return _timed_row(raw, "full")


def _engine_fast_task(raw: dict[str, Any]) -> dict[str, Any]:
    from simulator.explore.search import _timed_row

    return _timed_row(raw, "full+fast")


def wide_search(source: str | dict[str, Any] | None = None, *, overrides: list[str] | None = None,
                num_gpus: int | None = None, space=None, constraints=None, top_k: int = 20,
                workers: int | None = None, log: Callable[[str], None] | None = None) -> WideResult:
    """Branch and bound over ``space`` (module docstring): its layouts times its overlap switches
    (:data:`~simulator.explore.search.SWITCHES`; one left None keeps the scenario's value).
    ``log``: called with a line after each phase and wave (progress of a long search)."""
    log = log or (lambda line: None)
    from simulator.explore.search import SearchConstraints, SearchSpace, prepare
    from simulator.explore.sweep import parallel_map, process_pool

    if top_k < 1:
        raise ConfigError("--top-k", f"must be at least 1, got {top_k}")
    space = space or SearchSpace()
    constraints = constraints or SearchConstraints()
    switches = {name: getattr(space, name) for name in SWITCHES if getattr(space, name)}
    clock = time.perf_counter()
    seconds: dict[str, float] = {}
    raw, scenario, bases = prepare(source, overrides, num_gpus,
                                   space.model_copy(update=dict.fromkeys(SWITCHES)), constraints)
    if scenario.simulation.stragglers is not None:
        raise ConfigError("simulation.stragglers", "a wide search ranks by bounds that know nothing of straggler draws")
    from simulator.strategies.registry import get_kind

    kind = get_kind(scenario.strategy_kind)
    if kind.searched_layout_fields is not None:  # its switches' inertness and bounds are spmd's layout's
        raise ConfigError("strategy.kind", f"a wide search enumerates spmd's layouts; strategy kind {kind.name} reads "
                                           f"only {', '.join(kind.searched_layout_fields(scenario.strategy))} of them: "
                                           "use `clustersim search`")
    values = {name: list(dict.fromkeys(switches.get(name, [getattr(scenario.parallelism, name)])))
              for name in SWITCHES}
    tail_combos = list(itertools.product(values["overlap_grad_reduce"], values["overlap_param_gather"],
                                         values["overlap_p2p_comm"]))
    per_slice = len(tail_combos) * len(values["overlap_tp_grad_comm"])
    seconds["enumerate"] = time.perf_counter() - clock

    counts = {"evaluated": len(bases) * per_slice * len(values["tp_comm_overlap"]), "bases": len(bases),
              "invalid": 0, "pruned_by_memory": 0, "pruned_by_bound": 0, "priced_by_fast_path": 0,
              "engine_resimulated": 0, "bounds_priced": 0}
    # feasible candidates: (bound per token, base index, tco, otgc, ogr, opg, p2p), tokens per base
    bounds: list[float] = []
    keys: list[tuple[int, bool, bool, bool, bool, bool]] = []
    tokens: dict[int, int] = {}
    inert: dict[int, frozenset[str]] = {}  # per base: the switches that cannot change its plan
    folds = PlanFolds()  # (base, tp_comm_overlap) slices that build one plan (simulator/explore/checks.py)
    n_workers = workers or os.cpu_count() or 1
    clock = time.perf_counter()
    with process_pool(workers) as pool:
        points = []
        for cand in bases:
            point = copy.deepcopy(raw)
            point["parallelism"] = cand
            points.append(point)
        items = [(p, values["tp_comm_overlap"], values["overlap_tp_grad_comm"], constraints.max_memory_gib)
                 for p in points]
        checked = sorted(parallel_map(_check_base, items, workers=workers, pool=pool,
                                      chunk_size=max(1, len(items) // (n_workers * 16))), key=lambda item: item[0])
        for b, ok, result in checked:  # in enumeration order: the first of a plan is kept, as search keeps it
            if not ok:
                raise RuntimeError(f"checking layout {bases[b]}: {result}")
            for tco, (status, detail) in result["slices"].items():
                if folds.fold((b, tco), result["plan_keys"].get(tco), {**bases[b], "tp_comm_overlap": tco}):
                    continue  # the same plan as an earlier base's slice, switch for switch: folded into it
                if status == "invalid":
                    counts["invalid"] += per_slice
                elif status == "memory":
                    counts["pruned_by_memory"] += per_slice
                else:
                    tokens[b] = result["tokens"]
                    inert[b] = result["inert"]
                    priced = set()
                    for otgc, parts in detail.items():
                        priced.add(id(parts))
                        for ogr, opg, p2p in tail_combos:
                            bounds.append(parts.bound_s(ogr, opg) / result["tokens"])
                            keys.append((b, tco, otgc, ogr, opg, p2p))
                    counts["bounds_priced"] += len(priced)
        seconds["prune_and_bound"] = time.perf_counter() - clock
        log(f"pruned in {seconds['prune_and_bound']:.1f} s: {counts['invalid']:,} invalid, "
            f"{counts['pruned_by_memory']:,} out of memory, {len(bounds):,} fit ({counts['bounds_priced']:,} bounds priced)")

        def point_of(pos: int) -> dict[str, Any]:
            b, tco, otgc, ogr, opg, p2p = keys[pos]
            point = copy.deepcopy(points[b])
            point["parallelism"].update(tp_comm_overlap=tco, overlap_tp_grad_comm=otgc, overlap_grad_reduce=ogr,
                                        overlap_param_gather=opg, overlap_p2p_comm=p2p)
            return point

        def plan_of(pos: int) -> tuple:
            """The candidate with its inert switches blanked: equal for candidates that are one plan."""
            b, *switch_values = keys[pos]
            return (b, *(None if name in inert[b] else value for name, value in zip(_KEY_SWITCHES, switch_values,
                                                                                    strict=True)))

        clock = time.perf_counter()
        def folded_of(pos: int) -> list[dict[str, Any]]:
            """The candidates folded into ``pos``: its slice's folded bases with its switch values."""
            b, tco, *switch_values = keys[pos]
            return [{**layout, **dict(zip(_KEY_SWITCHES[1:], switch_values, strict=True))}
                    for layout in folds.folded.get((b, tco), [])]

        top, priced, engined, timed, runs = _branch_and_bound(bounds, keys, tokens, point_of, plan_of, top_k,
                                                              workers, pool, n_workers, log, folded_of)
        seconds["price"] = time.perf_counter() - clock
    counts["priced_by_fast_path"] = priced
    counts["engine_resimulated"] = engined
    counts["timed"] = timed
    counts["fast_path_runs"], counts["engine_runs"] = runs
    counts["pruned_by_bound"] = len(bounds) - timed
    counts["folded_as_same_plan"] = folds.count * per_slice
    counts["evaluated"] -= counts["folded_as_same_plan"]
    return WideResult(counts, top, seconds)


_KEY_SWITCHES = ("tp_comm_overlap", "overlap_tp_grad_comm", "overlap_grad_reduce", "overlap_param_gather",
                 "overlap_p2p_comm")
"""The switches of a candidate's key, after its base index, in order."""


def _branch_and_bound(bounds, keys, tokens, point_of, plan_of, top_k, workers, pool, n_workers, log, folded_of):
    """The engine best bound first until the top k cannot change, the fast path beside it on the
    2k smallest bounds and then on the top k that lack it (module docstring, step 4). Candidates that are
    one plan (``plan_of`` equal: they differ only in inert switches, :func:`inert_switches`) are timed
    once and share the result; ``folded_of(pos)``: the candidates folded into a row (its ``folded_layouts``). Returns (the top k engine rows, candidates priced by the fast path, by
    the engine, by either, (fast-path runs, engine runs))."""
    from simulator.explore.bounds import engine_branch_and_bound
    from simulator.explore.sweep import parallel_map

    order = sorted(range(len(bounds)), key=bounds.__getitem__)
    engine: dict[int, dict[str, Any]] = {}
    timed: dict[tuple[str, tuple], dict[str, Any]] = {}  # (path, plan_of) -> its row, parallelism aside
    runs = {"fast": 0, "engine": 0}

    def run(task, positions: list[int]) -> None:
        if not positions:
            return
        path = "fast" if task is _fast_task else "engine"
        todo: dict[tuple, int] = {}  # one position per plan not timed yet
        for pos in positions:
            if (path, plan_of(pos)) not in timed:
                todo.setdefault(plan_of(pos), pos)
        firsts = list(todo.values())
        for j, ok, result in parallel_map(task, [point_of(pos) for pos in firsts], workers=workers, pool=pool):
            row = dict(result) if ok else {"fits": False, "infeasible_reason": f"simulation failed: {result}"}
            timed[(path, plan_of(firsts[j]))] = row
        runs[path] += len(firsts)
        if task is _engine_fast_task:
            runs["fast"] += len(firsts)
        for pos in positions:
            row = dict(timed[(path, plan_of(pos))])
            if path == "fast":  # the fast path's step beside the engine's row
                engine[pos]["fast_step_time_s"] = row.get("step_time_s") if row.get("fits") else None
                engine[pos]["fast_path_lower_bound_s"] = row.get("fast_path_lower_bound_s")
                continue
            # the candidate's own switch values (the row's may be another candidate's of the same plan)
            row["parallelism"] = {**(row.get("parallelism") or point_of(pos)["parallelism"]),
                                  **dict(zip(_KEY_SWITCHES, keys[pos][1:], strict=True))}
            row.setdefault("fast_step_time_s", None)
            engine[pos] = row
        log(f"{'fast path' if path == 'fast' else 'engine' if task is _engine_task else 'engine + fast path'}: "
            f"{len(positions)} priced in {len(todo)} runs ({len(engine)} by the engine so far)")

    def per_tok(pos: int, row: dict[str, Any] | None, key: str) -> float:
        value = row.get(key) if row and row.get("fits") else None
        return value / tokens[keys[pos][0]] if value else math.inf

    done = engine_branch_and_bound(order, bounds, lambda batch: run(_engine_task, batch),
                                   lambda pos: per_tok(pos, engine.get(pos), "step_time_s"), top_k, 2 * n_workers,
                                   lambda batch: run(_engine_fast_task, batch), BESIDE_FIRST * top_k)
    ranked = sorted((pos for pos, row in engine.items() if math.isfinite(per_tok(pos, row, "step_time_s"))),
                    key=lambda pos: (per_tok(pos, engine[pos], "step_time_s"), pos))[:top_k]
    run(_fast_task, [pos for pos in ranked if engine[pos].get("fast_step_time_s") is None])
    top = []
    for pos in ranked:
        row = dict(engine[pos])
        row["engine_step_time_s"] = row.get("step_time_s")
        row["step_time_lower_bound_s"] = bounds[pos] * tokens[keys[pos][0]]
        if folded_of(pos):
            row["folded_layouts"] = folded_of(pos)
        top.append(row)
    fast = sum(1 for row in engine.values() if row.get("fast_step_time_s") is not None)
    return top, fast, len(engine), len(done), (runs["fast"], runs["engine"])
