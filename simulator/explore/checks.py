"""The per-candidate checks of a layout search (search steps 1-3): valid, fits, step-time bound.

``search`` (simulator/explore/search.py) and ``wide_search`` (simulator/explore/wide.py) check
every candidate layout before any is timed: its scenario is built (divisibility: an invalid layout
is a row with the reason), its peak memory priced (out of memory: a row), and for the rest the
step-time lower bound (simulator/explore/bounds.py) that orders and prunes the timing. On GPT-3
175B / 1,024 A100s that is 1,638 scenarios, 1,158 memory models (20,340 pipeline stages) and 381
bounds; priced one by one they cost as much CPU as the 24 engine runs of the search. Here:

- the scenario mapping is validated once per search and each candidate only validates and resolves
  its layout (:class:`simulator.scenario.LayoutVariants`: the same Scenario, the same errors; not
  under a ``training.framework`` profile, which fills layout fields a mapping leaves out);
- the memory model prices every pipeline stage at once (simulator/memory/vectorised.py: the same
  numbers as ``rank_memory``, stage by stage);
- the bound's chunk passes are priced once per distinct pass, and its tail once per layout whatever the
  micro-batch, recompute and sequence parallelism (simulator/explore/bounds.py), the planner built only
  where something is left to price.

``reference=True`` runs the checks as they were (``build_scenario``, ``peak_rank_memory``, the bound
priced without the shared passes): tests/test_search_checks.py compares both over every candidate of
several searches, and benchmarks/bench_search_fast.py times both.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from hardware_specs.framework import DEFAULT_FRAMEWORK
from simulator.errors import ConfigError
from simulator.explore.bounds import (
    ROUND_OFF,
    KindPrices,
    bound_parts,
    passes_key,
    step_lower_bound_s,
    tail_key,
)
from simulator.memory.analytic import fits as memory_fits
from simulator.memory.analytic import peak_rank_memory
from simulator.memory.vectorised import peak_memory
from simulator.scenario import LayoutVariants, build_scenario, cluster_gpus
from simulator.strategies.registry import DEFAULT_KIND

_VARIANTS: dict[str, Any] = {}
_VARIANTS_KEPT = 16
_LAST: dict[str, Any] = {}  # the sections of the last point and their variants


def layout_variants(point: dict[str, Any]):
    """The :class:`~simulator.scenario.LayoutVariants` of ``point`` without its layout (cached per
    process: a search's candidates differ only in ``parallelism``), or None where the mapping
    cannot be built with a trivial layout (then every candidate is built whole)."""
    rest = {k: v for k, v in point.items() if k != "parallelism"}
    # a search's points share these sections (and a pickled chunk of them does again): known by identity
    same = _LAST.get("rest")
    if same is not None and same.keys() == rest.keys() and all(same[k] is v for k, v in rest.items()):
        return _LAST["variants"]
    key = json.dumps(rest, sort_keys=True, default=str)
    _LAST.update(rest=rest, variants=_variants_of(key, rest))
    return _LAST["variants"]


def _variants_of(key: str, rest: dict[str, Any]):
    if key in _VARIANTS:
        return _VARIANTS[key]
    training = rest.get("training")
    if isinstance(training, dict) and training.get("framework", DEFAULT_FRAMEWORK) != DEFAULT_FRAMEWORK:
        # a framework's profile fills the settings a mapping leaves out, layout fields among them (and
        # records which): every candidate is built whole
        _VARIANTS[key] = None
        return None
    probe = copy.deepcopy(rest)
    try:
        n = (probe.get("cluster") or {}).get("num_gpus") or cluster_gpus(probe)
        probe["parallelism"] = {"global_batch_size": n if isinstance(n, int) and n > 0 else 1}
        variants = LayoutVariants(probe)
    except (ConfigError, TypeError, AttributeError):
        variants = None
    if len(_VARIANTS) >= _VARIANTS_KEPT:
        _VARIANTS.clear()
    _VARIANTS[key] = variants
    return variants


def build_layout(point: dict[str, Any], reference: bool = False):
    """``build_scenario(point)`` (raises its ConfigError), the layout alone resolved unless ``reference``."""
    variants = None if reference else layout_variants(point)
    if variants is None:
        return build_scenario(point)
    return variants.build(point.get("parallelism") or {})


def layout_memory(scenario, reference: bool = False):
    """(peak stage, its breakdown, every stage's): the memory model ``simulate`` judges the layout by,
    the strategy kind's own (``StrategyKind.memory``: local_sgd adds DiLoCo's outer state, a pipeline
    kind its own in-flight count). Only the spmd kind's (``peak_rank_memory``) is priced vectorised
    (simulator/memory/vectorised.py: the same numbers stage by stage); a kind with its own model is
    priced by that model, so a layout the search passes as fitting fits when simulated, and a layout
    skipped by the step-time bound may say ``fits: true``."""
    from simulator.strategies.registry import get_kind

    kind_memory = get_kind(scenario.strategy_kind).memory
    if kind_memory is not peak_rank_memory:
        return kind_memory(scenario)
    if reference:
        return peak_rank_memory(scenario)
    return peak_memory(scenario)


def layout_fits(scenario, peak, per_stage) -> tuple[bool, str | None]:
    """``memory_fits`` as ``simulate`` judges it (simulator/simulate.py): with co-located jobs, their
    shared HBM too."""
    ok, reason = memory_fits(scenario, peak, per_stage)
    if ok and scenario.co_located:
        from simulator.colocation.run import shared_memory_fits

        ok, reason = shared_memory_fits(scenario)
    return ok, reason


def kind_step_bound_s(sc, point: dict[str, Any], reference: bool = False) -> float:
    """The step-time lower bound that orders and prunes a search's timing, by strategy kind:

    - spmd: :func:`step_lower_bound_s` (never above the engine's step: tests/test_search_bounds.py);
    - a kind with ``spmd_chain_bound`` (local_sgd, parameter_server: every step runs spmd's passes in spmd's
      schedule on spmd's planner, without or with other reductions): spmd's pipeline chain alone, without the
      step's tail (optimizer step, gradient reduction: the kind replaces them). On 30 random layouts of each
      example's search (DiLoCo Llama-3-8B, GPT-3 XL parameter server) it stays below the step (at most 0.997
      and 0.999 of it; tests/test_kind_layout_fields.py);
    - a kind with its own ``step_lower_bound`` (``StrategyKind.step_lower_bound(scenario, prices)``, each kind's
      module says why it holds; tests/test_kind_bounds.py checks it never exceeds the engine's step on random
      layouts of each kind's examples): local_learning, cyclic_dp, async_pipeline (a stage's compute stream runs a
      known count of spmd's chunk passes, and local learning's heads, inside the kind's measured window: priced by
      :class:`simulator.explore.bounds.KindPrices`, shared over a search's layouts); subnetwork_dp, per_layer,
      layer_parallel_mgrit, replicated_pipeline, swarm (the fixed-duration tasks their own cost models put on one
      compute stream, or a pipeline chain of them; swarm's pools' passes and NIC bytes, 0 with preemptions);
    - any other kind: 0, nothing pruned, every feasible layout timed. spmd's bound is no bound for the kinds
      above: it is above the simulated step on 29 of the 38 examples of the other kinds (DAPPLE's GNMT 99x,
      per_layer's Inception 50x: their own stages or splits, not the layout's; async pipelines 1.05-1.27x,
      cyclic_dp 1.004x). Pruning by it dropped better layouts: local learning's search on GPT-1.7B returned
      58.25 samples/s at best, 60.37 with every layout timed."""
    from simulator.strategies.registry import get_kind

    if sc.strategy_kind == DEFAULT_KIND:
        return step_lower_bound_s(sc, key=passes_key(point), tail=tail_key(point))
    kind = get_kind(sc.strategy_kind)
    if kind.step_lower_bound is not None:
        return kind.step_lower_bound(sc, KindPrices(sc, key=None if reference else passes_key(point))) * (1 - ROUND_OFF)
    if not kind.spmd_chain_bound:
        return 0.0
    par = sc.parallelism
    parts = bound_parts(sc) if reference else bound_parts(sc, key=passes_key(point), tail=tail_key(point))
    return dataclasses.replace(parts, tail=False).bound_s(par.overlap_grad_reduce, par.overlap_param_gather)


def effective_zero_stage(par) -> int:
    """The ZeRO stage a resolved spmd layout acts on: 0 for ZeRO-1/2 where nothing is sharded (one data-parallel
    rank, ``dp x cp = 1``, and one rank per routed-expert shard): every gradient reduction, weight all-gather and
    optimizer-state split of the planner (simulator/strategies/spmd/plan.py: gated on ``dp x cp > 1``, shards of
    ``shard_size`` 1) and of the memory model (simulator/memory/analytic.py: states divided by 1) is the same as
    ZeRO 0's. ZeRO-3 is kept (the memory model holds its gathered-module buffers whatever the shard)."""
    if par.zero_stage in (1, 2) and par.dp_degree * par.cp == 1 and par.expert_data_parallel_size == 1:
        return 0
    return par.zero_stage


def plan_key(sc) -> str | None:
    """What makes an spmd layout's plan: its resolved ``parallelism`` with ``pp_split`` replaced by the pipelined
    layers of each chunk it cuts (:func:`simulator.strategies.spmd.split.chunk_counts`, the only place the label
    is read: a ``balanced`` cut equal to the ``even`` one builds the same plan) and ``zero_stage`` by
    :func:`effective_zero_stage`. Two layouts with one key simulate to the same step and peak, bit for bit
    (tests/test_search_fold.py): ``search`` keeps the first and folds the other into it. None for other kinds."""
    if sc.strategy_kind != DEFAULT_KIND:
        return None
    from simulator.strategies.spmd.split import chunk_counts

    par = sc.parallelism
    fields = par.model_dump()
    fields.update(pp_split=chunk_counts(sc, sc.layer_graph()), zero_stage=effective_zero_stage(par))
    return json.dumps(fields, sort_keys=True, default=str)


class PlanFolds:
    """Candidates folded by plan (:func:`plan_key`), as ``search`` and ``wide_search`` fold them: the first
    candidate seen with a key is kept, each later one with the same key is folded into it (never priced; the
    kept row lists it in ``folded_layouts``). Feed candidates in enumeration order."""

    def __init__(self) -> None:
        self.first_of: dict[str, Any] = {}
        self.folded: dict[Any, list[dict[str, Any]]] = {}

    def fold(self, kept: Any, key: str | None, layout: dict[str, Any]) -> bool:
        """True where ``key`` was seen before: ``layout`` is recorded under the first candidate's ``kept`` id;
        False (the candidate ``kept`` is the first of its plan, or has no key: not an spmd layout or invalid)."""
        if key is None:
            return False
        first = self.first_of.setdefault(key, kept)
        if first == kept:
            return False
        self.folded.setdefault(first, []).append(dict(layout))
        return True

    @property
    def count(self) -> int:
        """Candidates folded so far (``folded_as_same_plan``)."""
        return sum(len(same) for same in self.folded.values())


TIMED_TWIN_FIELDS = ("fits", "evaluated_by", "layer_split", "step_time_s", "peak_memory_gib", "memory_per_stage_gib",
                     "time_breakdown_s")
"""What two timed rows of a strategy kind's search must share, besides their layout up to :func:`_plan_layout`, to
be one plan (:func:`fold_timed_twins`): the cut the run took (``layer_split``, pipelined layers per chunk), and the
step, its breakdown and the memory the run reported, bit for bit."""


def _plan_layout(layout: dict[str, Any]) -> dict[str, Any]:
    """A timed row's resolved ``parallelism`` without the two names that may run one plan: ``pp_split`` (the cut
    the run took is compared instead) and ZeRO-1/2 read as 0 where nothing is sharded (dp, cp and ep 1, as
    :func:`effective_zero_stage` reads spmd's; a kind's own sharding that the stage changes shows in the memory
    compared beside it)."""
    out = {k: v for k, v in layout.items() if k != "pp_split"}
    if out.get("zero_stage") in (1, 2) and out.get("dp") == 1 and out.get("cp", 1) == 1 and out.get("ep", 1) == 1:
        out["zero_stage"] = 0
    return out


def timed_twin_key(row: dict[str, Any] | None) -> str | None:
    """What makes a timed row of a strategy kind other than spmd one plan: its ``parallelism`` read by
    :func:`_plan_layout` and the figures of :data:`TIMED_TWIN_FIELDS`. None for a row that was not timed (invalid,
    out of memory, skipped by the bound)."""
    if not (row and row.get("fits") and row.get("evaluated_by") in ("engine", "fast") and row.get("step_time_s")):
        return None
    layout = _plan_layout(row.get("parallelism") or {})
    return json.dumps([layout, *(row.get(k) for k in TIMED_TWIN_FIELDS)], sort_keys=True, default=str)


def fold_timed_twins(rows: list[dict[str, Any] | None], candidates: list[dict[str, Any]]) -> int:
    """Fold the timed rows of a strategy kind's search that differ only in ``pp_split``, or in a ZeRO stage that
    shards nothing, and ran one plan (:func:`timed_twin_key`): the first in enumeration order (``even``, ZeRO 0) is
    kept, the others become None and are listed in its ``folded_layouts`` (their candidate layouts, as
    :class:`PlanFolds` lists them), and the kept row counts them in ``folded_after_timing``. Returns how many were
    folded.

    Why after timing, where spmd's layouts are folded before (:func:`plan_key`): a kind reads the cut not
    only on the layout's own scenario but on scenarios it derives with another schedule or micro-batch
    count (local learning's and the asynchronous pipelines' memory at 1F1B with the in-flight batch, SWARM's
    prices at GPipe with one micro-batch, the step-in-backward gradients with one micro-batch), where a
    ``balanced`` cut is chosen anew and may differ from the even one while the layout's own does not
    (simulator/strategies/spmd/split.py: the cut minimises the schedule's estimate, which depends on both);
    and what a kind does with a ZeRO stage is its own. Only the run tells; two rows that report the same cut
    and the same step, step breakdown and memory, bit for bit, with everything else of their layout equal, are
    one plan listed twice (local learning on GPT-1.7B, pp 2: ``even`` and ``balanced`` both [12, 12], 60.4
    samples/s; tp 2 pp 4: ZeRO 0 and 1 without data parallelism)."""
    first_of: dict[str, int] = {}
    folded = 0
    for i, row in enumerate(rows):
        key = timed_twin_key(row)
        if key is None:
            continue
        kept = first_of.setdefault(key, i)
        if kept == i:
            continue
        keeper = rows[kept]
        keeper.setdefault("folded_layouts", []).append(dict(candidates[i]))
        keeper["folded_layouts"].extend(row.get("folded_layouts") or [])
        keeper["folded_after_timing"] = keeper.get("folded_after_timing", 0) + 1
        rows[i] = None
        folded += 1
    return folded


def check_layout(point: dict[str, Any], max_memory_gib: float | None, simulate: bool, want_bound: bool,
                 reference: bool = False) -> dict[str, Any]:
    """Build one layout's scenario and check its memory (search steps 1-2). Returns ``{"invalid":
    reason}``, ``{"row": row}`` (out of memory, or not to be timed), or, for a layout to time, its
    ``work`` estimate, ``tokens`` per step, step-time lower bound ``bound_s`` (if ``want_bound``) and the
    ``template`` row it gets if it is not timed; both with its ``plan_key`` (:func:`plan_key`). Runs in the search's
    worker processes."""
    from simulator.explore.search import _work_estimate, rows_template, steps_to_target_floor
    from simulator.explore.sweep import empty_result
    from simulator.simulate import run_identity

    try:
        sc = build_layout(point, reference)
        # a layout the model refuses only when its graph is split (bert-large's layers under sequence
        # parallelism) raises here, not while building
        stage, peak, per_stage = layout_memory(sc, reference)
        key = plan_key(sc)
    except ConfigError as exc:
        return {"invalid": str(exc)}
    ok, reason = layout_fits(sc, peak, per_stage)
    if ok and max_memory_gib is not None and peak.total_gib > max_memory_gib:
        ok, reason = False, (f"needs {peak.total_gib:.1f} GiB, above the max_memory_gib constraint "
                             f"({max_memory_gib:g} GiB)")
    if not ok or not simulate:
        row = empty_result()
        row.update({k: v for k, v in run_identity(sc).items() if k != "seq_length_source"})
        row.update(parallelism=sc.parallelism.model_dump(), num_gpus=sc.num_gpus, fits=ok,
                   infeasible_reason=reason, peak_memory_gib=peak.total_gib, peak_memory_stage=stage,
                   memory_gib=peak.gib(), memory_per_stage_gib=[b.total_gib for b in per_stage],
                   hbm_gib=sc.accelerator.hbm_gib)
        return {"row": row, "plan_key": key}
    bound_s = None
    if want_bound:
        bound_s = (step_lower_bound_s(sc) if reference and sc.strategy_kind == DEFAULT_KIND
                   else kind_step_bound_s(sc, point, reference))
    return {"work": _work_estimate(sc), "tokens": sc.parallelism.global_batch_size * (sc.seq_length or 1),
            "bound_s": bound_s, "steps_floor": steps_to_target_floor(sc) if want_bound else None,
            "template": rows_template(sc, (stage, peak, per_stage)), "plan_key": key}
