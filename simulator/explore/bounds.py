"""A lower bound on an SPMD layout's step time, priced and not simulated (search's branch and bound).

The search (simulator/explore/search.py) skips a layout without pricing it when this bound, per
token, is above the k-th best step time found: that keeps its top k identical to evaluating every
layout only because the bound is never above the engine's step time. Every term below is time the
planner (simulator/strategies/spmd/plan.py) puts on one actor's chain of dependent tasks, priced
as the planner prices it with each transfer alone on its links (contention, host stalls,
point-to-point sends and the slow-down of kernels beside collectives only add to it):

- **the pipeline chain** (after :func:`simulator.strategies.spmd.fast.compute_bound_s`, with
  the chunk passes priced like the planner's tasks, kernels *plus* the exposed share of their
  tensor-/context-/expert-parallel collectives, :meth:`Planner.chunk_pass_s`): stage s is busy
  m·Σ_chunks (F + R + B [+ W]) and cannot start before micro-batch 0's forward has passed the
  stages before it, nor end before the last backward on it has passed them again (every
  schedule but ZB-H1, whose weight-gradient passes may come last: there only the fill counts);
- **the step's tail on a stage** (one step, ``optimizer_fusion: none``): after the last backward
  of the stage, the gradient reduction when it is not overlapped (``overlap_grad_reduce`` off,
  ZeRO < 2, not ZB-H1: the whole stage's gradients reduced after the backward, Megatron-LM's
  ``finalize_model_grads``), or, where it is overlapped with the backward, the reduction of the
  last gradient bucket, which the planner flushes when the stage's last backward pass ends (its
  first layer's gradients, or the rest of a bucket with the embedding's; the optimizer step waits
  for it: GPT-3 175B tp 8 pp 4 vp 12 on 1,024 A100s, +8.6 ms of the 17.42 s step), then the optimizer
  step, then, for ZeRO-1/2 without ``overlap_param_gather``, the all-gather of the updated weights.
  The pipeline chain ends on stage 0 (the last backward passes it last), so its tail is stage 0's.

The bound is multiplied by (1 - 1e-9) so that round-off in a different summation order can never
put it above an engine time it equals (a layout with no communication).
``tests/test_search_bounds.py`` checks bound ≤ engine over random layouts of several models and
clusters (hypothesis).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
from collections.abc import Callable, Sequence

ROUND_OFF = 1e-9


@dataclasses.dataclass(frozen=True)
class BoundParts:
    """The terms of the bound for one layout, so that the two gradient/weight overlap switches,
    which change only the tail, are combined without pricing again (:meth:`bound_s`).

    ``chains``: per stage, the pipeline chain ending on the stage itself and the one ending on
    stage 0 after the drain (None under ZB-H1); ``optimizer_s``, ``grad_reduce_s`` (the stage's
    whole gradient reduction alone, counted where it is not overlapped), ``param_gather_s`` (its
    updated-weight all-gather alone, counted for ZeRO-1/2 without ``overlap_param_gather``);
    ``last_bucket_s`` (where the reduction is overlapped with the backward, the reduction of the last
    gradient bucket of the stage's last backward pass alone: flushed when that pass ends, waited for by
    the optimizer step; the least over the stage's chunks, whichever pass comes last);
    ``tail``: False where the plan is not the plain one-step, one-update-per-step case (no tail);
    ``reduce_exposable``/``gather_exposable``: whether the switches can expose them at all."""

    chains: tuple[tuple[float, float | None], ...]
    optimizer_s: tuple[float, ...]
    grad_reduce_s: tuple[float, ...]
    param_gather_s: tuple[float, ...]
    tail: bool
    reduce_exposable: bool
    gather_exposable: bool
    start_gather_s: float = 0.0
    last_bucket_s: tuple[float, ...] = ()
    always_overlapped: bool = False  # ZeRO-2/3: the gradients are reduced during the backward whatever the switch

    def bound_s(self, overlap_grad_reduce: bool, overlap_param_gather: bool) -> float:
        """The step-time lower bound with these two switches (seconds, module docstring)."""
        tails = [0.0] * len(self.chains)
        if self.tail:
            for stage in range(len(self.chains)):
                tails[stage] = (self.optimizer_s[stage]
                                + (self.grad_reduce_s[stage] if self.reduce_exposable and not overlap_grad_reduce
                                   else 0.0)
                                + (self.param_gather_s[stage] if self.gather_exposable and not overlap_param_gather
                                   else 0.0)
                                + (self.last_bucket_s[stage] if self.last_bucket_s
                                   and (overlap_grad_reduce or self.always_overlapped) else 0.0))
        # ZeRO-1/2 with overlap_param_gather: stage 0's first forward waits for its chunk's weights
        start = self.start_gather_s if self.gather_exposable and overlap_param_gather else 0.0
        best = 0.0
        for stage, (own, drained) in enumerate(self.chains):
            best = max(best, own + tails[stage], (drained + tails[0]) if drained is not None else 0.0)
        return (start + best) * (1 - ROUND_OFF)


def step_lower_bound_s(scenario, planner=None, key: str | None = None, tail: tuple[str, str] | None = None) -> float:
    """Seconds: never above the engine's step time of ``scenario`` (an SPMD layout); module docstring.
    ``key``, ``tail``: as for :func:`bound_parts`."""
    par = scenario.parallelism
    return bound_parts(scenario, planner, key, tail).bound_s(par.overlap_grad_reduce, par.overlap_param_gather)


_PASSES: dict[str, dict[int, dict[str, float]]] = {}
_PASSES_KEPT = 4096
# What a chunk pass costs does not depend on these layout fields: the ZeRO stage and the overlap of
# the gradient reduction, weight gather and sends act on the data-parallel and pipeline streams, not
# on a pass's kernels and TP/CP/EP collectives, and GPipe and 1F1B run the same passes in another
# order (ZB-H1 splits the backward: kept apart). tests/test_search_bounds.py checks it.
_PASS_INERT = {"zero_stage": 0, "overlap_grad_reduce": True, "overlap_param_gather": True, "overlap_p2p_comm": True}


def passes_key(point: dict) -> str:
    """A key of the chunk passes of the scenario built from the raw mapping ``point`` (what search
    and wide search build each layout from): the mapping with the layout fields a pass's cost does
    not read set to one value, so that layouts differing only in them (a search's ZeRO stages, GPipe
    or 1F1B, overlap switches) share the passes. Two mappings that differ otherwise only miss."""
    par = dict(point.get("parallelism") or {})
    par.update(_PASS_INERT)
    if par.get("schedule") == "gpipe" and par.get("pp_split") != "balanced":
        par["schedule"] = "1f1b"  # a balanced cut minimises the schedule's own estimate: GPipe may cut elsewhere
    return json.dumps({**point, "parallelism": par}, sort_keys=True, default=str)


# What the step's tail costs (optimizer step, gradient reduction, weight gather, last bucket: the
# stage's parameters and its data-parallel groups) does not depend on these layout fields: they change
# the micro-batches and the passes' kernels, not the parameters a stage holds or its groups. The search
# varies them within every (tp, pp, dp, vp, ZeRO) layout, so the tail is priced once for all of them
# (tests/test_search_checks.py compares every candidate's bound with one priced afresh). Not under a
# balanced split (``pp_split: balanced``): it cuts the model by the layers' kernel seconds, which the
# micro-batch, the recompute and sequence parallelism change, and with the cut the parameters of every
# stage (BERT-large on 8 A100s: a tail shared across recompute modes put bounds 4e-4 above the engine's
# or below the bound's own, as the candidates happened to come).
_TAIL_INERT = ("micro_batch_size", "recompute", "recompute_modules", "recompute_method", "recompute_num_layers",
               "sequence_parallel", "global_batch_size")
_TAILS: dict[tuple[str, str], tuple] = {}
_TAILS_KEPT = 4096
_REST: dict[str, object] = {}  # the sections of the last point but its layout, and their JSON


def tail_key(point: dict) -> tuple[str, str]:
    """A key of the step's tail (:func:`bound_parts`) of the scenario built from the raw mapping
    ``point``: its sections but the layout (a search's points share them: known by identity), and its
    layout without the fields the tail does not read (:data:`_TAIL_INERT`), the schedule reduced to
    whether it is zero bubble (whose weight-gradient passes change what the tail can expose)."""
    rest = {k: v for k, v in point.items() if k != "parallelism"}
    same = _REST.get("rest")
    if not (isinstance(same, dict) and same.keys() == rest.keys() and all(same[k] is v for k, v in rest.items())):
        _REST.update(rest=rest, json=json.dumps(rest, sort_keys=True, default=str))
    layout = point.get("parallelism") or {}
    balanced = layout.get("pp_split") == "balanced"
    par = {k: v for k, v in layout.items() if balanced or k not in _TAIL_INERT}
    if not balanced:  # a balanced cut follows the schedule's estimate, and the stages' parameters with it
        par["schedule"] = "zb-h1" if par.get("schedule") == "zb-h1" else "other"
    return str(_REST["json"]), json.dumps(par, sort_keys=True, default=str)


_CHUNK_PASSES: dict[tuple, float] = {}
_CHUNK_PASSES_KEPT = 65536
_SHAPES: dict[str, str] = {}
# Fields of a passes_key that set which chunks a stage holds, not what one layer's pass costs
_CHUNKING = ("pp", "virtual_stages", "first_stage_layers", "last_stage_layers", "pp_split")


def shape_key(passes: str) -> str:
    """The :func:`passes_key` ``passes`` without the fields that only cut the model into chunks
    (pipeline and virtual stages, the end stages' layer counts) and with the schedule reduced to
    what a pass's ops read (zero bubble splits the backward; the others run the same passes): the
    layers' passes of every layout with this key cost the same (:func:`_shared_pass_s`)."""
    hit = _SHAPES.get(passes)
    if hit is None:
        point = json.loads(passes)
        par = dict(point.get("parallelism") or {})
        for name in _CHUNKING:
            par.pop(name, None)
        par["schedule"] = "zb-h1" if par.get("schedule") == "zb-h1" else "other"
        if len(_SHAPES) >= _PASSES_KEPT:
            _SHAPES.clear()
        hit = _SHAPES[passes] = json.dumps({**point, "parallelism": par}, sort_keys=True, default=str)
    return hit


def _shared_pass_s(planner, shape: str, phase: str, chunk: int, rank: int) -> float:
    """Seconds of chunk ``chunk``'s ``phase`` pass (kernels plus exposed collectives, as
    ``planner.pass_cost_s`` prices it), shared by every layout of the search with the same
    :func:`shape_key`. A chunk of one kind of layer repeated c times costs P(1) + (c-1)·(P(2) - P(1)):
    each added layer brings the same kernels and one more layer-to-layer boundary (the only place
    where a collective's overlap with the next kernel sees another layer), so two small passes
    price every chunk length; chunks of several kinds of layer, and passes whose all-to-alls hide
    behind the pass's own kernels (:func:`_additive`), are priced whole. The same seconds
    as pricing the chunk's ops (tests/test_search_checks.py: within 1e-12 relative)."""
    first, last = chunk == 0, chunk == planner.chunks - 1
    runs = planner.chunk_runs(chunk)
    key = (shape, phase, first, last, runs)
    hit = _CHUNK_PASSES.get(key)
    if hit is None:
        def price(chunk_runs) -> float:
            ops = planner.pass_ops(phase, first, last, chunk_runs)
            return sum(planner.pass_cost_s(rank, ops)) if ops else 0.0

        if len(runs) == 1 and runs[0][1] > 2 and _additive(planner, phase, runs[0][0]):
            kind, count = runs[0]
            one, two = (_CHUNK_PASSES.get((shape, phase, first, last, ((kind, n),))) for n in (1, 2))
            if one is None:
                one = _CHUNK_PASSES[(shape, phase, first, last, ((kind, 1),))] = price(((kind, 1),))
            if two is None:
                two = _CHUNK_PASSES[(shape, phase, first, last, ((kind, 2),))] = price(((kind, 2),))
            hit = one + (count - 1) * (two - one)
        else:
            hit = price(runs)
        if len(_CHUNK_PASSES) >= _CHUNK_PASSES_KEPT:
            _CHUNK_PASSES.clear()
        _CHUNK_PASSES[key] = hit
    return hit


def _additive(planner, phase: str, kind) -> bool:
    """Whether a pass over repeated layers of ``kind`` costs the sum of its layers' shares (see
    :func:`_shared_pass_s`): not where the expert all-to-alls are hidden behind the pass's own kernels
    (``overlap_moe_comm``: the exposed share depends on the whole pass's kernels and all-to-alls, and
    on the prologue or epilogue the chunk carries, Planner._paired_moe_exposure)."""
    if not planner.par.overlap_moe_comm:
        return True
    return not any(op.collective == "all_to_all" for op in planner.layer_pass_ops(kind, phase))


class _Representatives:
    """Each stage's representative rank (:meth:`Planner.stage_representative`), asked of the planner once per
    stage: called as ``rep(stage)``."""

    def __init__(self, planner) -> None:
        self.planner, self.ranks = planner, {}

    def __call__(self, stage: int) -> int:
        rank = self.ranks.get(stage)
        if rank is None:
            rank = self.ranks[stage] = self.planner.stage_representative(stage)
        return rank


def chunk_pass_prices(scenario, planner=None, key: str | None = None) -> tuple[dict[int, dict[str, float]], object]:
    """Per global chunk, the seconds of each of its passes ("F", "R", "B", and "W" under ZB-H1): kernels plus
    the exposed share of their collectives, as :meth:`Planner.chunk_pass_s` prices them (each transfer alone),
    shared over a search's layouts by ``key`` (:func:`passes_key`). Returns them and the planner (None where
    every price came from the cache). The pipeline chain of :func:`bound_parts` and the kinds' own bounds
    (``StrategyKind.step_lower_bound``) are sums of them."""
    from simulator.strategies.spmd.plan import Planner

    par = scenario.parallelism
    pp, v = par.pp, par.virtual_stages
    phases = ("F", "R", "B", "W") if par.schedule == "zb-h1" else ("F", "R", "B")
    # A search's layouts (a key) on one kind of GPU: stages that hold the same chunks (the same runs of
    # layers, the ends or not) have the same passes and tail, priced once per layout; the passes are
    # shared with every layout of the same shape (_shared_pass_s). Otherwise every stage on its own.
    shared = key is not None and not scenario.mixed

    def pass_s(phase: str, chunk: int) -> float:
        ops = planner._chunk_ops(phase, chunk)
        return sum(planner.pass_cost_s(rep(chunk % pp), ops)) if ops else 0.0

    per_chunk = _PASSES.get(key) if key is not None else None
    if per_chunk is None:
        planner = planner or Planner(scenario)
        rep = _Representatives(planner)
        if shared:
            shape, alike = shape_key(key), {}
            per_chunk = {}
            for g in range(pp * v):
                what = (g == 0, g == pp * v - 1, planner.chunk_runs(g))
                hit = alike.get(what)
                if hit is None:
                    hit = alike[what] = {ph: _shared_pass_s(planner, shape, ph, g, rep(g % pp)) for ph in phases}
                per_chunk[g] = hit
        else:
            per_chunk = {g: {ph: pass_s(ph, g) for ph in phases} for g in range(pp * v)}
        if key is not None:
            if len(_PASSES) >= _PASSES_KEPT:
                _PASSES.clear()
            _PASSES[key] = per_chunk
    return per_chunk, planner


_KIND_OPS: dict[tuple, float] = {}
_KIND_OPS_KEPT = 65536


class KindPrices:
    """What a strategy kind's own step-time bound (``StrategyKind.step_lower_bound(scenario, prices)``) prices
    with, each price asked for only when the kind reads it: ``passes``, spmd's chunk pass prices
    (:func:`chunk_pass_prices`: global chunk -> phase -> seconds, kernels plus exposed collectives, each transfer
    alone), and :meth:`stage_ops_s`, other op tuples (an auxiliary head's pass) on a stage's representative rank,
    priced as ``planner.pass_cost_s`` prices them. ``key`` (:func:`passes_key`, None: nothing shared) shares both
    over a search's layouts that build the same passes; a kind with its own cost model (per_layer, MGRIT, ...)
    reads ``scenario`` alone."""

    def __init__(self, scenario, key: str | None = None, planner=None) -> None:
        self.scenario, self.key, self._planner, self._passes = scenario, key, planner, None

    @property
    def passes(self) -> dict[int, dict[str, float]]:
        if self._passes is None:
            self._passes, planner = chunk_pass_prices(self.scenario, self._planner, self.key)
            self._planner = self._planner or planner
        return self._passes

    def planner(self):
        """The scenario's :class:`Planner` (built once, where nothing cached answers)."""
        if self._planner is None:
            from simulator.strategies.spmd.plan import Planner

            self._planner = Planner(self.scenario)
        return self._planner

    def stage_ops_s(self, name: str, stage: int, ops_of: Callable[[object], tuple]) -> float:
        """Seconds of the ops ``ops_of(planner)`` (kernels plus exposed collectives, ``Planner.pass_cost_s``) on
        ``stage``'s representative rank (:meth:`Planner.stage_representative`), cached under ``name`` for the
        layouts sharing ``key``; ``name`` must say everything ``ops_of`` reads beyond the scenario's passes."""
        cache = self.key is not None
        hit = _KIND_OPS.get((self.key, name, stage)) if cache else None
        if hit is None:
            planner = self.planner()
            ops = ops_of(planner)
            hit = sum(planner.pass_cost_s(planner.stage_representative(stage), ops)) if ops else 0.0
            if cache:
                if len(_KIND_OPS) >= _KIND_OPS_KEPT:
                    _KIND_OPS.clear()
                _KIND_OPS[(self.key, name, stage)] = hit
        return hit


def bound_parts(scenario, planner=None, key: str | None = None, tail: tuple[str, str] | None = None) -> BoundParts:
    """The bound's terms for ``scenario`` (priced by ``planner``, built if not given and something is
    not yet priced). ``key``: its :func:`passes_key`, to price its chunk passes once for every layout of
    a search that shares them; ``tail``: its :func:`tail_key`, to price the step's tail once for them."""
    from simulator.strategies.spmd.plan import Planner

    par = scenario.parallelism
    pp, v, m = par.pp, par.virtual_stages, par.num_micro_batches
    zero_bubble = par.schedule == "zb-h1"
    per_chunk, planner = chunk_pass_prices(scenario, planner, key)
    shared = key is not None and not scenario.mixed
    chains = []
    fill, drain = 0.0, 0.0
    for stage in range(pp):
        busy = m * sum(sum(per_chunk[c * pp + stage].values()) for c in range(v))
        chains.append((fill + busy, None if zero_bubble else fill + busy + drain))
        fill += per_chunk[stage]["F"]
        drain += per_chunk[stage]["R"] + per_chunk[stage]["B"]

    ends = _TAILS.get(tail) if shared and tail is not None else None
    if ends is None:
        planner = planner or Planner(scenario)
        ends = _tail_parts(scenario, planner, shared, _Representatives(planner))
        if shared and tail is not None:
            if len(_TAILS) >= _TAILS_KEPT:
                _TAILS.clear()
            _TAILS[tail] = ends
    tail_on, reduce_exposable, gather_exposable, bucket_exposable, tails, start = ends
    optimizer, reduce, gather, last_bucket = (tuple(t[i] for t in tails) for i in range(4))
    return BoundParts(tuple(chains), optimizer, reduce, gather, tail_on, reduce_exposable, gather_exposable, start,
                      last_bucket if bucket_exposable else (), par.zero_stage >= 2)


def _tail_parts(scenario, planner, shared: bool, rep) -> tuple:
    """The step's tail of :func:`bound_parts`: (whether there is one, whether the gradient reduction,
    the weight gather and the last bucket can be exposed, per stage its (optimizer step, gradient
    reduction, weight gather, last bucket) seconds, the first chunk's weight gather before the step).
    ``rep(stage)``: the stage's representative rank."""
    from simulator.scenario import gradient_bytes
    from simulator.strategies.spmd.plan import WEIGHT_BYTES

    par = scenario.parallelism
    pp, v = par.pp, par.virtual_stages
    zero_bubble = par.schedule == "zb-h1"
    zero = par.zero_stage
    dp_size = par.dp_degree * par.cp if planner.sync_gradients else 1
    tail = scenario.simulation.steps == 1 and scenario.training.optimizer_fusion == "none" and planner.local_update
    reduce_exposable = tail and dp_size > 1 and not (zero >= 2 or zero_bubble)
    gather_exposable = tail and dp_size > 1 and zero in (1, 2)
    bucket_exposable = tail and dp_size > 1 and not zero_bubble
    grad = gradient_bytes(scenario.training)

    def stage_tail(stage: int) -> tuple[float, float, float]:
        """(optimizer step, gradient reduction, weight gather) seconds of ``stage``, each alone."""
        rank = rep(stage)
        optimizer_s = planner.optimizer_step_s(stage) if tail else 0.0
        local_params = planner.stage_params_local(stage)
        reduce_s = 0.0
        if reduce_exposable:
            kinds: dict = {}
            for c in range(v):
                for kind, count in planner.chunk_runs(c * pp + stage):
                    kinds[kind] = kinds.get(kind, 0) + count
            expert = planner._layers_params(kinds.items(), expert_only=True) * grad
            dense = local_params * grad - expert
            group = planner.shard_group if zero >= 1 else planner.grad_group
            collective = "all_reduce" if zero == 0 else "reduce_scatter"
            # the dense and the expert reductions queue on the one dp stream; the larger alone is a bound
            reduce_s = max(planner._isolated_comm_s(rank, [(group, collective, dense)]) if dense > 0 else 0.0,
                           planner._isolated_comm_s(rank, [("edp", collective, expert)]) if expert > 0 else 0.0)
        gather_s = (planner._isolated_comm_s(rank, [(planner.shard_group, "all_gather",
                                                     local_params * WEIGHT_BYTES[planner.precision])])
                    if gather_exposable else 0.0)
        last_s = min(last_bucket_s(c * pp + stage, rank) for c in range(v)) if bucket_exposable else 0.0
        return optimizer_s, reduce_s, gather_s, last_s

    def last_bucket_s(g: int, rank: int) -> float:
        """The reduction of the last bucket chunk ``g``'s backward flushes, each of its dense and expert
        parts alone, one after the other on the dp stream. Overlapped reduction fills buckets layer
        by layer, last layer first, flushes one once it holds ``gradient_bucket_mb``, and the rest
        (with the embedding's gradients on the first chunk) when the pass ends
        (simulator/strategies/spmd/plan_tasks.py): the last bucket is that rest, or, where nothing is left,
        the one flushed after the chunk's first layer, its last kernel (not on the first chunk, whose
        embedding backward comes after it)."""
        limit = par.gradient_bucket_mb * 1e6
        size = planner.epilogue_params * grad if g == planner.chunks - 1 else 0.0
        expert = 0.0
        flushed = (0.0, 0.0)
        for layer in reversed(range(planner.layers_per_chunk[g])):
            kind = planner.chunk_layer_kind(g, layer)
            size += planner.layer_params_local(kind) * grad
            expert += planner.layer_params_split(kind)[1] * grad
            if size >= limit:
                flushed = (size, expert) if layer == 0 and g != 0 else (0.0, 0.0)
                size = expert = 0.0
        if g == 0:
            size += planner.prologue_params * grad
        total, expert = (size, expert) if size > 0 else flushed
        dense = total - expert
        group = planner.shard_group if zero >= 1 else planner.grad_group
        collective = "all_reduce" if zero == 0 else "reduce_scatter"
        return ((planner._isolated_comm_s(rank, [(group, collective, dense)]) if dense > 0 else 0.0)
                + (planner._isolated_comm_s(rank, [("edp", collective, expert)]) if expert > 0 else 0.0))

    tails, alike_tails = [], {}
    for stage in range(pp):
        if shared:
            what = (stage == 0, stage == pp - 1, tuple(planner.chunk_runs(c * pp + stage) for c in range(v)))
            hit = alike_tails.get(what)
            if hit is None:
                hit = alike_tails[what] = stage_tail(stage)
            tails.append(hit)
        else:
            tails.append(stage_tail(stage))
    start = (planner._isolated_comm_s(rep(0), [(planner.shard_group, "all_gather",
                                                planner.chunk_params_local(0) * WEIGHT_BYTES[planner.precision])])
             if gather_exposable else 0.0)
    return tail, reduce_exposable, gather_exposable, bucket_exposable, tuple(tails), start


def price_best_bound_first(order: Sequence[int], bounds: Sequence[float], price: Callable[[list[int]], None],
                           kth_best: Callable[[], float], first_wave: int, next_wave: int,
                           threshold: float = math.inf, owed: Callable[[], int] | None = None) -> int:
    """Price candidates in order of their lower bound, in waves (``first_wave`` of them, then
    ``next_wave`` at a time, or an eighth of those priced so far if more), while the next bound is at most the k-th best time priced so far
    (``kth_best()``, re-read after each wave): a candidate whose bound exceeds it cannot enter the top k.
    ``order`` lists positions by increasing ``bounds``. Returns how many of ``order`` were priced; search
    and wide search continue from there with the engine's exact stopping rule. ``threshold``: the
    k-th best time known before the first wave (inf: none). ``owed()``: how many more candidates will
    be priced whatever their times (while fewer than k times are finite, the k-th is infinite and
    every next candidate is priced: k minus the finite ones); a wave is at least that long, so that
    the workers are not stopped at a barrier between waves whose every candidate was due anyway."""
    cursor, wave = 0, first_wave
    while cursor < len(order) and bounds[order[cursor]] <= threshold:
        batch = []
        while cursor < len(order) and len(batch) < wave and bounds[order[cursor]] <= threshold:
            batch.append(order[cursor])
            cursor += 1
        price(batch)
        threshold = kth_best()
        # a wave waits for its slowest candidate: past a few waves, an eighth of what is priced so far
        # (at most that much priced beyond need; the Calculon-size search prices ~1,400 in waves of 4)
        wave = max(next_wave, cursor // 8, owed() if owed is not None and math.isinf(threshold) else 0)
    return cursor


def engine_branch_and_bound(order: Sequence[int], bounds: Sequence[float], price_engine: Callable[[list[int]], None],
                            engine_time: Callable[[int], float], top_k: int, wave: int,
                            price_beside: Callable[[list[int]], None] | None = None,
                            beside_first: int = 0) -> set[int]:
    """The search's branch and bound (search and wide search): which candidates the engine times so
    that its top k over every candidate is found. ``order`` lists positions by increasing step-time
    lower bound ``bounds`` (per token); ``engine_time`` reads a timed position's engine step (per
    token; inf where not timed or infeasible).

    The engine times candidates best bound first, in waves (:func:`price_best_bound_first`), while
    the next bound is at most the k-th best engine time so far (infinite until k are finite): the
    bound is never above the engine's step (tests/test_search_bounds.py), so no candidate left out
    could enter the top k. The first wave is k long (at least ``wave``), and so is every wave while
    fewer than k times are finite (k minus those): those candidates are timed whatever comes back, and
    one wave lets the pool keep every worker busy (longest first) instead of stopping it at a barrier
    every ``wave`` runs (GPT-3 175B's default search: 24 engine runs in 2 waves instead of 6). The ``beside_first`` smallest bounds go to ``price_beside`` when given: the
    engine with the fast path walking the same plans, for the rows most likely to be reported (in the
    top k) with both times: a walk costs ~0.4 of an engine run, a fast-path run of its own ~1.

    Why not the fast path first, as until 2026-12-05: its run costs as much as the engine's (both
    build the same plans and fold the same steady state; 72 random layouts of 9 cases, CPU-s: fast
    path 8.73, engine 8.80), and its lower bound (each transfer alone) sits within ~0.02% of the
    engine, under the k-th engine time for nearly every candidate it timed near the top, so those
    cost both runs (Calculon-size search: 670 fast-path runs, then 575 engine runs).

    Returns the positions the engine timed."""
    done: set[int] = set()
    rank = {pos: i for i, pos in enumerate(order)}

    def kth_best() -> float:
        finite = heapq.nsmallest(top_k, (engine_time(p) for p in done if math.isfinite(engine_time(p))))
        return finite[-1] if len(finite) >= top_k else math.inf

    def owed() -> int:  # while the k-th time is infinite, the next k - (finite times) are priced anyway
        return top_k - sum(1 for p in done if math.isfinite(engine_time(p)))

    def price(batch: list[int]) -> None:
        beside = [pos for pos in batch if price_beside is not None and rank[pos] < beside_first]
        plain = [pos for pos in batch if pos not in beside]
        for group, how in ((beside, price_beside), (plain, price_engine)):
            if group:
                how(group)
                done.update(group)

    price_best_bound_first(list(order), bounds, price, kth_best, max(wave, top_k), wave, owed=owed)
    return done
