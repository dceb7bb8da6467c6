"""Layout search: every valid parallel layout of a scenario's model on N GPUs, best first.

The space (each a list; ``None`` means "derive it from the model and the cluster"):

- ``tp``: powers of two up to the GPUs of one node (tensor parallelism stays on NVLink, as
  Megatron-LM advises, Narayanan et al. 2021 Sec. 3.3 takeaway #1) that divide N;
- ``pp``: divisors of N/(tp·cp) up to the number of layers;
- ``ep``: for a mixture-of-experts model, the powers of two that divide both its routed experts
  and dp (experts are carved out of the data-parallel ranks, as Megatron-LM's ``tp-cp-ep-dp-pp``
  order does; ``simulator.strategies.spmd.layout``), up to the ``max_ep`` constraint; [1] for a dense model;
- ``micro_batch_size``: the scenario's own and the powers of two, each one dividing the replica's
  share of the global batch (global batch / dp), so that the scenario's own layout is always a
  candidate and a network trained at hundreds of images per GPU is not searched at 1, 2 and 4 only;
  the large ones that do not fit are pruned by memory like any layout;
- ``pp_split``: ``even``, and ``balanced`` (cut by cost,
  :mod:`simulator.strategies.spmd.split`) where it cuts the model otherwise at that pipeline depth
  (:func:`derived_splits`: a CNN's uneven layers; not a uniform transformer stack whose output layer
  weighs less than a layer, GPT-3's, where the two coincide); without a pipeline the split is moot;
- ``cp`` [1], ``virtual_stages`` [1, 2],
  ``zero_stage`` [0, 1], ``recompute`` [none, selective, full],
  ``sequence_parallel`` [false, true], ``schedule`` (derived: interleaved when virtual stages > 1,
  else the scenario's own unless that is interleaved, then 1f1b; zb-h1 may be asked for);
- the overlap switches (:data:`SWITCHES`: ``overlap_grad_reduce``, ``overlap_param_gather``,
  ``overlap_tp_grad_comm``, ``overlap_p2p_comm``, ``tp_comm_overlap``): the scenario's unless a list
  is given (then every value with every layout). For spaces too wide to list (a million candidates),
  :func:`simulator.explore.wide.wide_search` counts every candidate and returns only the top k.

Combinations that are the same layout under another name are not enumerated (sequence
parallel without tp, virtual stages or a schedule without pp). Those that turn out to be the same
plan once built are folded before anything is priced: ZeRO-1 or -2 without data parallelism (nothing
to shard) and a ``balanced`` cut equal to the ``even`` one (the plan key,
:func:`simulator.explore.checks.plan_key`); the first in enumeration order (ZeRO 0, ``even``) is kept
and lists the others in ``folded_layouts``, and :func:`simulator.report.search_table.summarize` counts
them (``folded_as_same_plan``). Everything else is a row:

1. invalid layouts (``resolve_layout`` raises: tp does not divide heads, tp·cp·pp does not
   divide N, the global batch is not divisible by dp × micro-batch, ...) get ``fits: false`` and
   ``infeasible_reason: "invalid layout: ..."``;
2. layouts whose peak memory (the cheap memory model, :func:`simulator.memory.peak_rank_memory`)
   exceeds HBM, or a ``max_memory_gib`` constraint, get ``fits: false`` and the reason;
3. the rest are timed in parallel (local processes, or Dask) and ranked by throughput (samples/s,
   which ranks as tokens/s where the model has a sequence: the length is fixed within a search), or by
   ``time_to_target_s`` (``rank_by``; the scenario's ``convergence:`` block gives steps to target,
   which depend on ``global_batch_size``, a searchable field).
   The rest get a lower bound on their step time
   (:func:`simulator.explore.bounds.step_lower_bound_s`: the pipeline chain of kernels and exposed
   collectives plus the step's tail, priced, not simulated), and are timed smallest bound per
   token first (branch and bound, :func:`simulator.explore.bounds.engine_branch_and_bound`; ranked by
   time to target, the bound times the layout's floor on steps to target, :func:`steps_to_target_floor`,
   smallest first),
   in parallel (local processes, or Dask):
4. the engine times them, best bound first, while the next bound could still reach the top k
   (``top_k``, default 20): at most the k-th best engine time so far
   (:func:`simulator.explore.bounds.engine_branch_and_bound`): the k smallest bounds in one wave (due
   whatever comes back: every worker busy, longest first), then a few per worker at a time. The 2k smallest bounds (the likeliest
   to be in the top k) are timed with the fast path (simulator/strategies/spmd/fast.py) walking the
   same plans beside the engine
   (:func:`simulator.strategies.spmd.fast.fast_beside_engine`: a walk, no second build); the fast path
   then times the top k rows that lack it, so that every reported top-k row carries both times. The
   rest are skipped: rows that fit, with ``evaluated_by: bound`` and the bound. Since the step-time
   bound ≤ the engine's step (tests/test_search_bounds.py), the top k are the same, in the same order,
   as with the engine everywhere (tests/test_search_fast.py, tests/test_search_bounds.py).
   :func:`simulator.report.search_table.summarize` counts every candidate: invalid, pruned by memory,
   pruned by the bound, priced by the fast path, timed by the engine. (The fast path used to time candidates first and the engine
   only those whose fast-path lower bound could still reach the top k; but a fast-path run costs as
   much as an engine run -- both build the same plans and fold the same steady state -- and its
   bound sits within ~0.02% of the engine, so near the top nearly every candidate cost both.)

   Ranked by time to target the same rule holds: steps to target depend on the global batch and
   the convergence block, not on the layout's speed, so steps x bound is never above the engine's
   time to target (tests/test_search_target_bound.py: the top k equal an unpruned search's).

Rows carry ``step_time_s`` (the engine's where it ran, else the fast path's), ``engine_step_time_s``
and ``fast_step_time_s`` (each path's, None where it did not run), ``fast_path_lower_bound_s``,
``step_time_lower_bound_s`` (the bound above) and ``evaluated_by`` (:func:`labelled`). Bounds
and times are compared per token (the global batch may be a searched field). Finished points are
cached on disk (simulator/explore/cache.py).

Constraints (:class:`SearchConstraints`) narrow the space before anything is built.
Each result row is ``{"parallelism": {...}, **simulate keys}`` (the keys of
``clustersim simulate --json``).

The counts, the table ``clustersim search`` prints and its ``--csv`` are in
:mod:`simulator.report.search_table`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator.errors import ConfigError, did_you_mean, from_pydantic, unit_hint
from simulator.explore.sweep import empty_result, parallel_map, process_pool, run_point

_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
_RECOMPUTE = ("none", "selective", "full")
_SPLITS = ("even", "balanced")


class SearchSpace(BaseModel):
    """Candidate values per layout field (``None``: derived, see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    tp: list[int] | None = None
    pp: list[int] | None = None
    cp: list[int] = [1]
    ep: list[int] | None = None
    virtual_stages: list[int] = [1, 2]
    micro_batch_size: list[int] | None = None  # None: derived per dp (the module docstring)
    zero_stage: list[int] = [0, 1]
    recompute: list[str] = list(_RECOMPUTE)
    sequence_parallel: list[bool] = [False, True]
    schedule: list[str] | None = None
    global_batch_size: list[int] | None = None  # None: the scenario's (vary it to rank by time to target)
    pp_split: list[str] | None = None  # None: both where they cut the model differently (module docstring)
    # the overlap switches of the layout (simulator/strategies/spmd/layout.py); None: the scenario's
    overlap_grad_reduce: list[bool] | None = None
    overlap_param_gather: list[bool] | None = None
    overlap_tp_grad_comm: list[bool] | None = None
    overlap_p2p_comm: list[bool] | None = None
    tp_comm_overlap: list[bool] | None = None


SWITCHES = ("overlap_grad_reduce", "overlap_param_gather", "overlap_tp_grad_comm", "overlap_p2p_comm",
            "tp_comm_overlap")
"""The overlap options of a layout a search may vary (``SearchSpace`` fields; None keeps the scenario's)."""

RANK_METRICS = {"tokens_per_s": -1.0, "time_to_target_s": 1.0}
"""What ``search`` can rank by, with the sign that puts the best first (most tokens/s, least time)."""


class SearchConstraints(BaseModel):
    """Limits on the layouts tried."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    tp_within_node: bool = Field(default=True, description="tp at most the GPUs of one node")
    max_tp: int | None = Field(default=None, gt=0)
    max_pp: int | None = Field(default=None, gt=0)
    max_ep: int | None = Field(default=None, gt=0, description="largest expert-parallel degree derived for MoE")
    min_dp: int | None = Field(default=None, gt=0)
    max_dp: int | None = Field(default=None, gt=0)
    max_memory_gib: float | None = Field(default=None, gt=0, description="a tighter memory limit than HBM")


def _check_space(space: SearchSpace) -> None:
    for name in ("tp", "pp", "cp", "ep", "virtual_stages", "micro_batch_size", "global_batch_size"):
        values = getattr(space, name)
        if values is not None:
            if not values:
                raise ConfigError(f"--space {name}", "needs at least one value")
            bad = [v for v in values if v < 1]
            if bad:
                raise ConfigError(f"--space {name}", f"values must be positive integers, got {bad[0]}")
    for v in space.zero_stage:
        if v not in (0, 1, 2, 3):
            raise ConfigError("--space zero_stage", f"must be 0, 1, 2 or 3, got {v}")
    for v in space.recompute:
        if v not in _RECOMPUTE:
            raise ConfigError("--space recompute", f"must be one of {', '.join(_RECOMPUTE)}, got {v!r}")
    for v in space.schedule or []:
        if v not in _SCHEDULES:
            raise ConfigError("--space schedule", f"must be one of {', '.join(_SCHEDULES)}, got {v!r}")
    for v in space.pp_split or []:
        if v not in _SPLITS:
            raise ConfigError("--space pp_split", f"must be one of {', '.join(_SPLITS)}, got {v!r}")
    if space.pp_split is not None and not space.pp_split:
        raise ConfigError("--space pp_split", "needs at least one value")
    for name in ("zero_stage", "recompute", "sequence_parallel", "cp"):
        if not getattr(space, name):
            raise ConfigError(f"--space {name}", "needs at least one value")
    for name in SWITCHES:
        values = getattr(space, name)
        if values is not None and not values:
            raise ConfigError(f"--space {name}", "needs at least one value")


def parse_assignments(items: list[str], schema: type[BaseModel], flag: str, lists: bool) -> BaseModel:
    """``key=v1,v2`` (``lists``) or ``key=value`` strings into a ``schema`` instance."""
    data: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(flag, f"expected key=value, got {item!r}")
        key, text = (part.strip() for part in item.split("=", 1))
        if key not in schema.model_fields:
            raise ConfigError(f"{flag} {key}", f"unknown key{did_you_mean(key, schema.model_fields)} "
                                               f"(known: {', '.join(schema.model_fields)})")
        try:
            if lists:
                values = [v.strip() for v in text.split(",")]
                if any(values) and not all(values):  # "tp=1,,2" dropped the empty item silently
                    raise ConfigError(f"{flag} {key}", f"empty item in {text!r}; expected "
                                                       f"{_allowed_values(schema, key, flag, lists)}")
                value: Any = [yaml.safe_load(v) for v in values if v]
            else:
                value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"{flag} {key}", f"cannot parse {text!r}") from None
        if bool not in _kinds(schema, key) and any(isinstance(v, bool) for v in (value if lists else [value])):
            # pydantic's lax mode reads true as 1 ("--space tp=true" searched tp 1), as the scenario's fields refuse
            raise ConfigError(f"{flag} {key}", f"expected {_allowed_values(schema, key, flag, lists)}, got {text!r}")
        data[key] = value
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        # pydantic's wording ("Input should be a valid integer, unable to parse string as an integer") named no
        # option value: say what the option takes and which value was not that, per bad key
        problems = []
        for err in exc.errors():
            key = str(err["loc"][0]) if err.get("loc") else ""
            got = err.get("input")
            hint = (unit_hint(got, key, err.get("type") == "int_parsing")
                    if err.get("type") in ("float_parsing", "int_parsing") and isinstance(got, str) else "")
            problems.append((f"{flag} {key}", f"expected {_allowed_values(schema, key, flag, lists)}, got {got!r}{hint}"))
        (field, reason), others = problems[0], [f"{f}: {r}" for f, r in problems[1:]]
        raise ConfigError(field, reason + (f" (and {len(others)} more: " + "; ".join(others) + ")" if others else ""))\
            from None


#: Named values a --space / --constraint key takes, and the example its error gives (else 1,2,4 / 8).
_NAMED = {"recompute": _RECOMPUTE, "schedule": _SCHEDULES, "pp_split": _SPLITS}
_EXAMPLES = {"zero_stage": "0,1", "global_batch_size": "512,1024", "micro_batch_size": "1,2",
             "max_memory_gib": "70"}


def _kinds(schema: type[BaseModel], key: str) -> set[type]:
    """The plain types (int, float, bool, str) a field's annotation holds, lists and None taken out."""
    import typing

    todo, kinds = [schema.model_fields[key].annotation], set()
    while todo:
        a = todo.pop()
        args = typing.get_args(a)
        if args:
            todo.extend(args)
        elif a in (int, float, bool, str):
            kinds.add(a)
    return kinds


def _allowed_values(schema: type[BaseModel], key: str, flag: str, lists: bool) -> str:
    """What ``flag key=...`` takes, in words with an example: ``--space tp`` takes positive integers separated by
    commas (``--space tp=1,2,4``), ``--space recompute`` one or more of none, selective, full."""
    kinds = _kinds(schema, key)
    several = " separated by commas" if lists else ""
    if str in kinds and key in _NAMED:
        return f"{'one or more' if lists else 'one'} of {', '.join(_NAMED[key])}{several}"
    if bool in kinds:
        return f"true or false{' (both: ' + flag + ' ' + key + '=false,true)' if lists else ''}"
    if key == "zero_stage":
        return f"ZeRO stages 0, 1, 2 or 3{several} (e.g. {flag} {key}={_EXAMPLES[key]})"
    example = _EXAMPLES.get(key, "1,2,4" if lists else "8")
    what = "numbers" if float in kinds and int not in kinds else "integers"
    what = ("positive " + what) if lists else ("a positive " + what[:-1])
    return f"{what}{several} (e.g. {flag} {key}={example})"


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_layouts(
    base: dict[str, Any],
    num_gpus: int,
    num_layers: int,
    gpus_per_node: int,
    space: SearchSpace,
    constraints: SearchConstraints,
    num_experts: int = 0,
    own_micro_batch: int | None = None,
    split_values: Callable[[int, int, str], list[str]] | None = None,
) -> list[dict[str, Any]]:
    """Candidate ``parallelism`` mappings (``dp: auto``), before any validity check.

    ``num_experts``: the routed experts of a mixture-of-experts model (0: dense), from which the
    ``ep`` candidates are derived when the space leaves them open. ``own_micro_batch``: the
    scenario's micro-batch, a candidate wherever it divides the replica's batch when the space
    leaves micro-batches open (:func:`_derived_micro_batches`, with ``base``'s global batch or the
    space's). ``split_values(pp, virtual_stages, recompute)``: the ``pp_split`` values worth trying
    when the space leaves them open (:func:`derived_splits`); neither: ``base``'s split."""
    _check_space(space)
    max_tp = min(gpus_per_node if constraints.tp_within_node else num_gpus, constraints.max_tp or num_gpus)
    tps = space.tp or [t for t in (2**k for k in range(0, 16)) if t <= max_tp and num_gpus % t == 0]
    tps = [t for t in tps if t <= max_tp]
    max_pp = min(num_layers, constraints.max_pp or num_layers)
    base_schedule = base.get("schedule", "1f1b")
    batches = space.global_batch_size or [base.get("global_batch_size") or 1]
    out = []
    for tp in tps:
        for cp in space.cp:
            # derived pp: the divisors of N/(tp*cp), so that the product divides N
            pps = space.pp or ([p for p in _divisors(num_gpus // (tp * cp))] if num_gpus % (tp * cp) == 0 else [1])
            for pp in pps:
                if pp > max_pp:
                    continue
                mp = tp * cp * pp
                dp = num_gpus // mp if num_gpus % mp == 0 else None
                if dp is not None and (
                    (constraints.min_dp and dp < constraints.min_dp) or (constraints.max_dp and dp > constraints.max_dp)
                ):
                    continue
                for v in space.virtual_stages:
                    if v > 1 and pp == 1:
                        continue
                    if pp == 1:
                        schedules = ["1f1b"]  # no pipeline: the schedule does not matter
                    elif space.schedule:
                        schedules = [s for s in space.schedule if (s == "interleaved") == (v > 1)]
                    elif v > 1:
                        schedules = ["interleaved"]
                    else:
                        schedules = [base_schedule if base_schedule != "interleaved" else "1f1b"]
                    for schedule in schedules:
                        for ep in space.ep or _derived_ep(num_experts, dp, constraints.max_ep):
                            for mbs in space.micro_batch_size or _derived_micro_batches(
                                    batches, dp, own_micro_batch, pp if schedule == "interleaved" else 1):
                                for zero in space.zero_stage:
                                    for rc in space.recompute:
                                        for sp in space.sequence_parallel:
                                            if sp and tp == 1:
                                                continue
                                            for split in _splits(space, split_values, pp, v, rc):
                                                out.append({**base, "tp": tp, "pp": pp, "cp": cp, "ep": ep,
                                                            "dp": "auto", "virtual_stages": v, "schedule": schedule,
                                                            "micro_batch_size": mbs, "zero_stage": zero,
                                                            "recompute": rc, "sequence_parallel": sp,
                                                            **_modules_for(base, rc),
                                                            **({"pp_split": split} if split else {})})
    if space.global_batch_size:
        out = [{**cand, "global_batch_size": gbs} for gbs in space.global_batch_size for cand in out
               if space.micro_batch_size or _divides(cand, gbs, num_gpus)]
    for switch in SWITCHES:
        values = getattr(space, switch)
        if values:
            out = [{**cand, switch: value} for cand in out for value in dict.fromkeys(values)]
    return out


def _modules_for(base: dict[str, Any], rc: str) -> dict[str, Any]:
    """The scenario's ``recompute_modules`` (Megatron-Core's module list) for a candidate of recompute ``rc``:
    module lists do not join the space (seven modules would multiply it by up to 127); "selective" in the
    space is the scenario's own list where it gives one, and the other modes drop the list (it is read with
    selective alone). Likewise Megatron-Core's partial full recompute (``recompute_method`` /
    ``recompute_num_layers``): "full" in the space is the scenario's own where it gives one, the other modes
    drop it."""
    out: dict[str, Any] = {}
    if rc != "selective" and base.get("recompute_modules") is not None:
        out["recompute_modules"] = None
    if rc != "full" and (base.get("recompute_method") is not None or base.get("recompute_num_layers") is not None):
        out["recompute_method"] = out["recompute_num_layers"] = None  # read with full alone
    return out


def _splits(space: SearchSpace, split_values, pp: int, v: int, rc: str) -> list[str | None]:
    """The ``pp_split`` values of one layout (None: the base's): without a pipeline the split cuts
    nothing, so one (``even`` where asked for)."""
    if space.pp_split:
        if pp * v == 1:
            return ["even" if "even" in space.pp_split else space.pp_split[0]]
        return list(dict.fromkeys(space.pp_split))
    if split_values is None:
        return [None]
    return split_values(pp, v, rc)


def derived_splits(scenario, base_par) -> Callable[[int, int, str], list[str]]:
    """``pp_split`` values worth trying per (pp, virtual stages, recompute) when the space leaves them
    open: ``even``, and ``balanced`` where it cuts the model into other chunks than ``even`` does.

    Decided on the scenario's layer graph as the search's probe builds it (tp 1, its micro-batch),
    priced as :func:`simulator.strategies.spmd.split.balanced_split` prices it. A network of uneven
    layers (a CNN: ResNet-50's bottlenecks differ by 4x in FLOPs from stage to stage) gets both at
    every pipeline depth; a uniform transformer stack gets ``balanced`` only where the prologue or
    epilogue (embedding, output layer and loss) weigh more than a layer does -- GPT-3 175B's output
    layer is a third of a layer, so its splits coincide at every depth and it is searched with
    ``even`` alone (tests/test_search_split.py). ``first_stage_layers`` / ``last_stage_layers`` in the
    scenario: ``even`` alone (balanced refuses them). The criterion is the slowest-stage cut's, not
    the schedule estimate that ``balanced`` itself cuts by (simulator/strategies/spmd/split.py): the
    estimate leaves GPT-3's even cut too where micro-batches are few per chunk or the chunks do not
    divide its layers (1-6% faster in the engine there, tests/test_search_split.py); those layouts
    are searched with ``even`` alone, as before, so that the space stays 1,860 layouts."""
    from simulator.strategies.spmd.layout import split_layers
    from simulator.strategies.spmd.split import balanced_split, layer_costs

    fixed_ends = base_par.first_stage_layers is not None or base_par.last_stage_layers is not None
    graph = scenario.layer_graph()
    n = len(graph.pipelined)
    costs: dict[str, tuple] = {}
    memo: dict[tuple[int, int, str], list[str]] = {}

    def values(pp: int, v: int, rc: str) -> list[str]:
        key = (pp, v, rc)
        if key not in memo:
            memo[key] = ["even"]
            if not fixed_ends and 1 < pp * v <= n and not (rc == "full" and base_par.recompute_method):
                # (a partial full recompute is priced on even cuts only: layout.py _check_partial_full)
                if rc not in costs:  # "selective" with the scenario's module list (_modules_for) is that list's mode
                    mode = base_par.recompute_mode if rc == "selective" and base_par.recompute_modules else rc
                    costs[rc] = layer_costs(scenario, graph, mode)
                layer_s, first_s, last_s = costs[rc]
                even = split_layers(n, pp * v)
                if balanced_split(layer_s, pp * v, first_s, last_s, prefer=even) != even:
                    memo[key] = ["even", "balanced"]
        return memo[key]

    return values


def _derived_micro_batches(global_batches: list[int], dp: int | None, own: int | None,
                           groups: int = 1) -> list[int]:
    """Micro-batch sizes worth trying at data-parallel degree ``dp``: the powers of two and the
    scenario's own (``own``) that split a replica's batch (global batch / dp) into a whole number of
    micro-batches, a multiple of ``groups`` (pp for the interleaved schedule), for one of the global
    batches searched. Others would be invalid layouts (simulator.strategies.spmd.layout.resolve_layout);
    where dp is not whole, or no size splits the batch, the layout is invalid anyway: one row."""
    own = own or 1
    if dp is None:
        return [own]
    found: set[int] = set()
    for gbs in global_batches:
        if gbs % dp:
            continue
        per_replica = gbs // dp
        for m in {own, *(2**k for k in range(per_replica.bit_length()))}:
            if per_replica % m == 0 and (per_replica // m) % groups == 0:
                found.add(m)
    return sorted(found) or [own]


def _divides(cand: dict[str, Any], global_batch: int, num_gpus: int) -> bool:
    """Whether a derived micro-batch of ``cand`` splits ``global_batch`` evenly over its dp (the
    derived sizes are the union over every searched global batch; each pairs with its own)."""
    mp = cand["tp"] * cand["cp"] * cand["pp"]
    if num_gpus % mp:
        return True  # invalid whatever the batch: kept as one invalid row
    replica_batch = num_gpus // mp * cand["micro_batch_size"]
    groups = cand["pp"] if cand["schedule"] == "interleaved" else 1
    return global_batch % replica_batch == 0 and (global_batch // replica_batch) % groups == 0


def _derived_ep(num_experts: int, dp: int | None, max_ep: int | None) -> list[int]:
    """Expert-parallel degrees worth trying: powers of two dividing the experts and dp."""
    if num_experts <= 1 or dp is None:
        return [1]
    limit = min(num_experts, dp, max_ep or num_experts)
    return [e for e in (2**k for k in range(0, 20)) if e <= limit and num_experts % e == 0 and dp % e == 0]


def _search_task(args: tuple[dict[str, Any], Callable | None]) -> dict[str, Any]:
    raw, simulate_fn = args
    return run_point(raw, simulate_fn)


def _rate(row: dict[str, Any]) -> float | None:
    """Throughput: samples/s (sequences, images; within one search the sequence length is fixed, so
    this ranks as tokens/s does), or tokens/s for rows that only carry that."""
    return row.get("samples_per_s") or row.get("tokens_per_s")


def _rank_key(item: tuple[int, dict[str, Any]], metric: str = "tokens_per_s") -> tuple:
    """Engine-timed rows first (by ``metric``), then fast-path rows, then layouts skipped by the
    lower bound (smallest bound first), out of memory, invalid."""
    idx, row = item
    value = _rate(row) if metric == "tokens_per_s" else row.get(metric)
    if row.get("fits") and _rate(row) and value is not None:
        return (0 if row.get("evaluated_by", "engine") == "engine" else 1, RANK_METRICS[metric] * value, idx)
    if row.get("evaluated_by") == "bound":
        return (2, row.get("step_time_lower_bound_s") or 0.0, idx)
    reason = str(row.get("infeasible_reason") or "")
    return (3 if not reason.startswith("invalid layout") else 4, 0.0, idx)


#: The layout constraints of :class:`SearchConstraints` and the layout field each limits.
_CONSTRAINED_FIELD = {"tp_within_node": "tp", "max_tp": "tp", "max_pp": "pp", "max_ep": "ep", "min_dp": "dp",
                      "max_dp": "dp"}


def _refuse_unread(kind, read: tuple[str, ...], own: dict[str, Any], space: SearchSpace,
                   constraints: SearchConstraints, dp_read: bool) -> None:
    """A ``--space`` listing another value for a field the kind does not read, or a ``--constraint`` on one
    (tp, pp, ep; dp unless ``dp_read``), is refused naming it: every value would run the scenario's plan."""
    given = space.model_fields_set
    for name in SearchSpace.model_fields:
        values = getattr(space, name)
        if name in read or name not in given or values is None or all(v == own[name] for v in values):
            continue
        raise ConfigError(f"--space {name}", f"strategy kind {kind.name} does not read parallelism.{name}: every "
                                             f"value runs the scenario's plan ({name} {own[name]!r}); it searches "
                                             f"{', '.join(read) or 'nothing'}")
    for name in sorted(constraints.model_fields_set & set(_CONSTRAINED_FIELD)):
        field = _CONSTRAINED_FIELD[name]
        if field in read or (field == "dp" and dp_read):
            continue
        raise ConfigError(f"--constraint {name}", f"strategy kind {kind.name} does not read parallelism."
                                                  f"{field}: it limits nothing")


def _kind_note(kind, read: tuple[str, ...], layouts: int) -> str:
    kept = [name for name in SearchSpace.model_fields if name not in read]
    return (f"strategy kind {kind.name} reads {', '.join(read) or 'none'} of the search's layout fields; "
            f"{', '.join(kept)} are kept at the scenario's values (they would run the same plan): "
            f"{layouts} layout{'s' if layouts != 1 else ''}"
            + (". Its per-layer splits are what `clustersim plan SCENARIO --planner pase|deeppool|adaptive` "
               "searches" if kind.name == "per_layer" else ""))


def kind_candidates(kind, config, base_par, space: SearchSpace, constraints: SearchConstraints,
                    notes: list[str] | None = None) -> list[dict[str, Any]] | None:
    """The candidate layouts of a strategy kind that reads only some of the search's fields
    (``StrategyKind.searched_layout_fields``) and lays out its own GPUs or stages
    (``derives_layout`` false); None for a kind that reads them all (spmd's enumeration) or whose read
    fields are derived as spmd's are (:func:`fold_unread`).

    Every field the kind does not read is kept at the scenario's value: varying it would report copies
    of one plan as distinct layouts (per_layer on VGG-16 listed 20 such rows, pp 4 and 8, micro-batches
    2 to 32, all 11,809.8 samples/s). A ``--space`` listing another value for such a field, or a
    ``--constraint`` on one (tp, pp, ep, dp), is refused naming it. A field the kind reads takes the
    space's values where it lists them, else the scenario's; the candidates are their product, each
    the scenario's whole ``parallelism`` with those fields set. ``notes`` gets one line saying so."""
    if kind.searched_layout_fields is None or kind.derives_layout:
        return None
    read = tuple(kind.searched_layout_fields(config))
    own = base_par.model_dump()
    _refuse_unread(kind, read, own, space, constraints, dp_read=False)
    out = [dict(own)]
    for name in read:
        values = getattr(space, name) if name in SearchSpace.model_fields else None
        if values:
            out = [{**cand, name: value} for cand in out for value in dict.fromkeys(values)]
    if notes is not None:
        notes.append(_kind_note(kind, read, len(out)))
    return out


def pinned_space(kind, config, base_par, space: SearchSpace, constraints: SearchConstraints) -> SearchSpace:
    """For a kind that ``derives_layout``: the space with every field the kind does not read pinned to the
    scenario's value (after refusing a ``--space`` or ``--constraint`` on one); the others as given or
    derived as for spmd."""
    read = tuple(kind.searched_layout_fields(config))
    own = base_par.model_dump()
    _refuse_unread(kind, read, own, space, constraints, dp_read=True)
    return space.model_copy(update={name: [own[name]] for name in SearchSpace.model_fields if name not in read})


def fold_unread(kind, config, base_par, candidates: list[dict[str, Any]],
                notes: list[str] | None = None) -> list[dict[str, Any]]:
    """spmd's candidates (:func:`enumerate_layouts` over :func:`pinned_space`) with every field the kind does
    not read set to the scenario's value, copies dropped (the enumeration sets some fields itself: the
    schedule 1f1b without a pipeline), in their order. ``notes`` gets one line saying so."""
    read = set(kind.searched_layout_fields(config))
    own = base_par.model_dump()
    unread = {name: own[name] for name in SearchSpace.model_fields if name not in read}
    seen: dict[str, dict[str, Any]] = {}
    for cand in candidates:
        folded = {**cand, **unread}
        seen.setdefault(json.dumps(folded, sort_keys=True, default=str), folded)
    out = list(seen.values())
    if notes is not None:
        notes.append(_kind_note(kind, tuple(kind.searched_layout_fields(config)), len(out)))
    return out


def _without_selective(space: SearchSpace, graph) -> SearchSpace:
    """``space`` with recompute "selective" read as "none" where the graph has nothing to re-run selectively
    (a CNN has no attention core)."""
    if "selective" in space.recompute and not any(op.recompute_class in ("attention_core", "selective")
                                                  for layer in graph.layers for op in layer.forward):
        return space.model_copy(update={"recompute": list(dict.fromkeys(
            "none" if r == "selective" else r for r in space.recompute))})
    return space


def prepare(source, overrides, num_gpus, space: SearchSpace, constraints: SearchConstraints,
            rank_by: str = "tokens_per_s", notes: list[str] | None = None
            ) -> tuple[dict[str, Any], Any, list[dict[str, Any]]]:
    """The scenario mapping (overrides applied, paths absolute, ``num_gpus`` set), its scenario
    with a trivial layout (checks that it is well-formed apart from the layout), and the candidate
    ``parallelism`` mappings (:func:`enumerate_layouts`; for a strategy kind that reads only some of
    the layout's fields, :func:`kind_candidates`, which adds a line to ``notes``)."""
    from simulator.explore.sweep import absolutize
    from simulator.scenario import apply_overrides, build_scenario, check_gpu_count, cluster_gpus, load_raw
    from simulator.strategies.spmd.layout import Parallelism

    raw, base_dir = load_raw(source)
    raw = absolutize(apply_overrides(raw, overrides or []), base_dir)
    if rank_by == "time_to_target_s" and not raw.get("convergence"):  # after --set: it may give the block
        raise ConfigError("--rank-by", "time_to_target_s needs the scenario's convergence: block")
    if raw.get("co_located_jobs"):
        from simulator.colocation.spec import refuse_co_located

        refuse_co_located("search")
    if num_gpus is not None:
        raw.setdefault("cluster", {})["num_gpus"] = check_gpu_count(num_gpus)
    # The scenario as given must be well-formed apart from its layout: check it with a trivial layout.
    try:
        base_par = Parallelism.model_validate(raw.get("parallelism") or {})
    except ValidationError as exc:
        raise from_pydantic(exc, "parallelism", schema=Parallelism) from None
    probe = copy.deepcopy(raw)
    n_probe = (probe.get("cluster") or {}).get("num_gpus") or cluster_gpus(probe)
    if isinstance(n_probe, int) and not isinstance(n_probe, bool) and num_gpus is None:
        check_gpu_count(n_probe, "cluster.num_gpus")  # the scenario's own count: its layouts are walked too
    probe["parallelism"] = {"global_batch_size": n_probe if isinstance(n_probe, int) and n_probe > 0 else 1}
    scenario = build_scenario(probe)
    # the cluster's fabric against its GPU count (wide-area regions that hold more nodes than the cluster) is no
    # matter of the layout: one error here, not every candidate refused by the same check deep in the pool
    from simulator.cost.topology import build_topology

    build_topology(scenario.node, scenario.fabric, scenario.num_gpus,
                   groups=[(g.node, g.num_gpus) for g in scenario.groups] if scenario.mixed else None)
    from simulator.strategies.registry import get_kind

    kind = get_kind(scenario.strategy_kind)
    own = kind_candidates(kind, scenario.strategy, base_par,
                          space if kind.searched_layout_fields is None or "recompute" not in
                          kind.searched_layout_fields(scenario.strategy) else
                          _without_selective(space, scenario.layer_graph()), constraints, notes)
    if own is not None:
        return raw, scenario, own
    if kind.searched_layout_fields is not None:  # derives_layout: spmd's enumeration of the fields it reads
        space = pinned_space(kind, scenario.strategy, base_par, space, constraints)
    graph = scenario.layer_graph()
    layers = len(graph.pipelined)  # what a pipeline splits (a transformer's blocks)
    space = _without_selective(space, graph)
    # the NVLink reach (the node, or an NVL72 rack; on a mixed cluster the smallest group's)
    per_node, n = min(g.node.domain_gpus for g in scenario.groups), scenario.num_gpus
    # Everything of the scenario's layout that the search does not vary is kept (batch, buckets, overlap knobs).
    searched = {"tp", "pp", "dp", "cp", "ep", "virtual_stages", "micro_batch_size", "zero_stage", "recompute",
                "sequence_parallel", "pp_split"}
    keep = {k: v for k, v in base_par.model_dump().items() if k not in searched}
    experts = scenario.model.moe.num_experts if getattr(scenario.model, "is_moe", False) else 0
    candidates = enumerate_layouts(keep, n, layers, per_node, space, constraints, experts,
                                   base_par.micro_batch_size, derived_splits(scenario, base_par))
    if kind.searched_layout_fields is not None:
        candidates = fold_unread(kind, scenario.strategy, base_par, candidates, notes)
    return raw, scenario, candidates


def search(
    source: str | dict[str, Any] | None = None,
    *,
    overrides: list[str] | None = None,
    num_gpus: int | None = None,
    space: SearchSpace | None = None,
    constraints: SearchConstraints | None = None,
    workers: int | None = None,
    dask: str | None = None,
    simulate_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    simulate: bool = True,
    rank_by: str = "tokens_per_s",
    top_k: int = 20,
    progress: bool = False,
    timed_by: str = "engine",
    notes: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows for every candidate layout, best first (see the module docstring): most ``tokens_per_s``,
    or least ``time_to_target_s`` (needs the scenario's ``convergence:`` block).

    ``simulate=False`` stops after pruning (feasible rows then have no time). ``simulate_fn`` is a
    picklable replacement for the core's ``simulate_point`` (tests): every feasible layout goes
    through it, no fast path. ``top_k``: the layouts ranked by the engine, each also timed by the fast
    path. ``progress``: tqdm bars on stderr. ``timed_by="fast"``: the same branch and bound with the
    fast path in the engine's place, so the ranking is the fast path's alone (benchmarks/
    bench_search_ranking.py compares it with the engine's; exact for the fast path's top k, since the
    step-time bound is never above the fast path's step either: both are the same chain of tasks,
    each transfer alone, which contention only lengthens). ``notes``: gets the lines the search says
    about its space (a strategy kind that reads only some layout fields, :func:`kind_candidates`)."""
    if top_k < 1:
        raise ConfigError("--top-k", f"must be at least 1, got {top_k}")
    if timed_by not in ("engine", "fast"):
        raise ConfigError("timed_by", f"must be engine or fast, got {timed_by!r}")
    from simulator.simulate import run_identity

    space = space or SearchSpace()
    constraints = constraints or SearchConstraints()
    if rank_by not in RANK_METRICS:
        raise ConfigError("--rank-by", f"must be one of {', '.join(RANK_METRICS)}, got {rank_by!r}")
    raw, scenario, candidates = prepare(source, overrides, num_gpus, space, constraints, rank_by, notes)
    n = scenario.num_gpus

    identity = {k: v for k, v in run_identity(scenario).items() if k != "seq_length_source"}
    rows: list[dict[str, Any] | None] = [None] * len(candidates)
    to_simulate: list[int] = []
    raws: list[dict[str, Any]] = []
    checked: list[dict[str, Any]] = []  # per layout to time: what _check_task found (bound, tokens, ...)
    stragglers = scenario.simulation.stragglers is not None  # draws the fast path's bounds know nothing of
    # a replacement simulator (tests), or straggler draws the bounds know nothing of: every feasible
    # layout through it (or the engine)
    everything = simulate_fn is not None or stragglers
    if stragglers and notes is not None:  # why nothing is pruned by the bound, and the search takes its time
        notes.append("simulation.stragglers: the step-time lower bound knows nothing of the draws, so the engine "
                     "times every layout that fits (none is pruned by the bound)")
    # the candidates share the scenario's other sections (read only: building a scenario copies its
    # mapping), and so does each chunk the pool pickles
    points = [{**raw, "parallelism": cand} for cand in candidates]
    from simulator.explore.checks import (  # once here, not in each worker after the fork
        PlanFolds,
        fold_timed_twins,
    )
    from simulator.strategies.registry import DEFAULT_KIND

    with _long_lived_frozen(), process_pool(workers, dask) as pool:
        # building each layout's scenario and pricing its memory and step-time bound is most of the
        # serial time of a search: the pool does it too (in this process on Dask, which would ship
        # every layout out and back)
        n_workers = workers or os.cpu_count() or 1
        # in chunks of layouts that share a layer graph and passes, so that each worker builds and
        # prices mostly its own (_check_order)
        local = _check_order(candidates)
        checks = parallel_map(_check_task, [(points[i], constraints.max_memory_gib, simulate, not everything)
                                            for i in local],
                              workers=1 if dask else workers, pool=pool,
                              chunk_size=max(1, len(points) // (n_workers * 8)))
        folds = PlanFolds()  # by plan key, the first candidate kept (simulator/explore/checks.py)
        for i, ok, result in sorted(((local[j], ok, result) for j, ok, result in checks), key=lambda item: item[0]):
            if not ok:
                raise RuntimeError(f"checking layout {candidates[i]}: {result}")
            if folds.fold(i, result.get("plan_key"), candidates[i]):
                continue  # the same plan as an earlier candidate: folded into it, never priced
            if "invalid" in result:
                row = empty_result()
                row.update(identity, num_gpus=scenario.num_gpus)
                row["parallelism"] = dict(candidates[i])
                row["infeasible_reason"] = f"invalid layout: {result['invalid']}"
                rows[i] = row
            elif "row" in result:
                rows[i] = result["row"]
            else:
                to_simulate.append(i)
                raws.append(points[i])
                checked.append(result)
        work = [c["work"] for c in checked]
        if everything:
            task, items = (_search_task, [(r, simulate_fn) for r in raws]) if simulate_fn else (_engine_task, raws)
            _evaluate(rows, to_simulate, raws, candidates, n, task, items, workers, dask, progress, "search",
                      pool=pool, work=work)
        else:
            _branch_and_bound(rows, to_simulate, raws, checked, candidates, n, top_k, workers, dask, progress,
                              pool, timed_by, rank_by)
    for i, same in folds.folded.items():
        rows[i]["folded_layouts"] = same
    if scenario.strategy_kind != DEFAULT_KIND:  # a kind's rows that ran one plan under two names
        fold_timed_twins(rows, candidates)
    ranked = sorted(enumerate(r for r in rows if r is not None), key=lambda item: _rank_key(item, rank_by))
    out = []
    for _, row in ranked:
        for key in ("engine_step_time_s", "fast_step_time_s", "fast_path_lower_bound_s"):
            row.setdefault(key, None)
        first = {"parallelism": row.pop("parallelism")}  # the layout first, then the row's keys in their order
        first.update(row)
        out.append(first)
    return out


@contextlib.contextmanager
def _long_lived_frozen():
    """Python's cyclic garbage collector told to leave what exists now alone (``gc.freeze``: the modules,
    spec schemas and scenario a search has built before its checks) until the search ends, here and in
    the workers forked from this process: its passes then visit only what the search makes (GPT-3 175B's
    default search: ~0.055 CPU-s of collection in this process and ~0.07 in each worker, ~0.02 and ~0.03
    frozen). Not where something else has frozen objects (it would thaw them)."""
    import gc

    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


_LOCALITY = ("tp", "cp", "ep", "micro_batch_size", "sequence_parallel", "recompute", "global_batch_size")


def _check_order(candidates: list[dict[str, Any]]) -> list[int]:
    """The candidates' positions in the order the checks run them: by what a layout's checks build
    and price once per worker and reuse (its layer graph: the shard's tp, cp, ep, micro-batch and
    sequence parallelism; its passes' costs: those and the recompute; simulator/explore/bounds.py).
    The candidates are enumerated pipeline depth by pipeline depth (:func:`enumerate_layouts`), so
    that every chunk of them touched nearly every graph of its tp and both workers built them all
    (GPT-3 175B's default search: 99 graphs and 3,654 pass prices in two workers, 54 and 2,610 in
    one); in this order a chunk's layouts share a few graphs, which only the chunks on either side
    of it may build again (67 and 2,712). Where the values do not compare (mixed types), the
    enumeration order."""
    try:
        return sorted(range(len(candidates)), key=lambda i: tuple(map(candidates[i].get, _LOCALITY)))
    except TypeError:
        return list(range(len(candidates)))


def _check_task(args: tuple[dict[str, Any], float | None, bool, bool]) -> dict[str, Any]:
    """Search steps 1-2 for one layout (:func:`simulator.explore.checks.check_layout`)."""
    from simulator.explore.checks import check_layout

    return check_layout(*args)


def _timed_row(raw: dict[str, Any], engine: str) -> dict[str, Any]:
    """``run_point`` of ``raw`` through the on-disk cache with ``engine`` (``simulate_point``), with
    Python's cyclic garbage collector paused until the row is a plain mapping: the layout's plan (tens
    of thousands of tasks) and engine are freed by then, and the collector, re-enabled, scans what is
    left instead of the live plan (running, its young-generation passes over the plan cost 5% of GPT-3
    175B's 24 engine runs: 0.146 of 2.84 CPU-s, 0.010 paused; the engine's few reference cycles are
    collected after each row)."""
    from simulator.engine.engine import cyclic_gc_paused
    from simulator.explore.cache import cached_point

    with cyclic_gc_paused():
        return run_point(raw, functools.partial(cached_point, engine=engine))


def _fast_task(raw: dict[str, Any]) -> dict[str, Any]:
    return _timed_row(raw, "fast")


def _engine_task(raw: dict[str, Any]) -> dict[str, Any]:
    return _timed_row(raw, "full")


def _engine_fast_task(raw: dict[str, Any]) -> dict[str, Any]:
    """The engine, and the fast path walking the same plans (``simulate_point(engine="full+fast")``)."""
    return _timed_row(raw, "full+fast")


def labelled(row: dict[str, Any]) -> dict[str, Any]:
    """A timed row with its times named by who timed them: ``engine_step_time_s`` (the discrete-event
    engine's, None where it did not run), ``fast_step_time_s`` and ``fast_path_lower_bound_s`` (the
    fast path's, None where it did not run), ``evaluated_by`` (``engine`` or ``fast``: which of them
    ``step_time_s`` and the row's other figures come from)."""
    by_fast = row.get("engine") == "fast"
    if by_fast:
        row["fast_step_time_s"] = row.get("step_time_s")
    row["evaluated_by"] = "fast" if by_fast else "engine"
    row["engine_step_time_s"] = None if by_fast or not row.get("fits") else row.get("step_time_s")
    for key in ("fast_step_time_s", "fast_path_lower_bound_s"):
        row.setdefault(key, None)  # an engine row the fast path did not time
    return row


class _NoBar:
    """What a search without ``progress`` updates instead of a tqdm bar (tqdm is not imported then: ~25 ms
    of this process's serial start-up, between the checks and the engine's first wave)."""

    def update(self, _n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, desc: str, progress: bool):
    """A tqdm bar on stderr counting layouts, or a :class:`_NoBar` without ``progress``."""
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="layout", desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False)


def steps_to_target_floor(sc) -> float | None:
    """A floor on the steps to target of the layout ``sc`` (None without a ``convergence:`` block):
    the block's steps at the layout's global batch (simulator/economics/convergence.py: S(B), a
    function of the batch and the block alone, not of how fast the layout runs) times the local-steps
    factor of the strategy's fixed ``local_steps``, with the staleness factor left out: it is at
    least 1 (c_tau >= 0, tau >= 0), and a run may measure its own staleness (a parameter server's
    ``staleness_steps_mean``), which the checks cannot know. So ``time_to_target_s`` = steps x step
    time >= this floor x the step-time lower bound."""
    if sc.convergence is None:
        return None
    from simulator.economics.convergence import steps_to_target
    from simulator.strategies.registry import get_kind

    kind = get_kind(sc.strategy_kind)
    inputs = kind.convergence_inputs(sc) if kind.convergence_inputs else {}
    return steps_to_target(sc.convergence, sc.parallelism.global_batch_size, sc.seq_length,
                           staleness_steps=0.0, local_steps=int(inputs.get("local_steps", 1)))


def _work_estimate(sc) -> int:
    """How long a layout takes to simulate, roughly: the events of its pipeline schedule, one per
    micro-batch per (virtual) stage. Used only to start the slow ones first, never for a result."""
    p = sc.parallelism
    micro_batches = max(1, p.global_batch_size // max(1, p.dp * p.micro_batch_size))
    return p.pp * p.virtual_stages * micro_batches


def _evaluate(rows, to_simulate, raws, candidates, n, task, items, workers, dask, progress, desc,
              which: list[int] | None = None, pool=None, work: list[int] | None = None) -> None:
    """Run ``task`` over ``items`` (positions ``which`` of ``to_simulate``) in parallel; store the rows.

    ``pool``: the search's process pool (:func:`simulator.explore.sweep.process_pool`). ``work``: an
    estimate of each position's cost; the costliest go first (longest processing time first, Graham
    1969), in small chunks, so that no worker is left with a run of slow layouts at the end of a
    wave while the other waits. Neither changes a result, only when it arrives."""
    which = list(range(len(items))) if which is None else which
    if not which:
        return
    if work is not None:
        which = sorted(which, key=lambda pos: -work[pos])  # stable: ties keep their order
    n_workers = workers or os.cpu_count() or 1
    chunk = max(1, len(which) // (n_workers * 16))
    bar = _progress_bar(len(which), desc, progress)
    try:
        for j, ok, result in parallel_map(task, [items[w] for w in which], workers=workers, dask=dask,
                                          chunk_size=chunk, pool=pool):
            pos = which[j]
            i = to_simulate[pos]
            if not ok:
                result = {**empty_result(), "status": "error", "error": str(result)}
            row = dict(result)
            if row.get("status") == "error":
                row["fits"] = False
                row["infeasible_reason"] = f"simulation failed: {row.get('error')}"
            for key in ("status", "error", "elapsed_s"):
                row.pop(key, None)
            row["parallelism"] = row.get("parallelism") or {**candidates[i], "dp": n // (
                candidates[i]["tp"] * candidates[i]["pp"] * candidates[i]["cp"])}
            rows[i] = labelled(row)
            bar.update(1)
    finally:
        bar.close()


BESIDE_FIRST = 2
"""The fast path walks beside the engine for the smallest ``BESIDE_FIRST`` x k bounds (the rows most
likely to be reported: a walk costs ~0.4 of an engine run), and runs alone for the top-k rows that
were not among them."""


def _branch_and_bound(rows, to_simulate, raws, checked, candidates, n, top_k, workers, dask, progress,
                      pool=None, timed_by: str = "engine", rank_by: str = "tokens_per_s") -> None:
    """The engine best bound first while the next bound could still reach the top k, the fast path
    beside it on the same plans for the :data:`BESIDE_FIRST` x k first ones, then the fast path
    for the top k rows that lack it (module docstring, step 4;
    :func:`simulator.explore.bounds.engine_branch_and_bound`). Exact for the engine's top k: the
    bound is never above the engine's step.

    Ranked by ``time_to_target_s`` (steps to target x step time), each bound is the step-time bound
    times the layout's floor on steps to target (:func:`steps_to_target_floor`: the convergence
    block's steps at its global batch, which no layout's speed changes), so it is never above the
    engine's time to target either, and the same stopping rule keeps the top k exact."""
    from simulator.explore.bounds import engine_branch_and_bound

    bound_step = [c["bound_s"] for c in checked]
    if rank_by == "time_to_target_s":
        weight = [c["steps_floor"] for c in checked]
        key = "time_to_target_s"
    else:  # per token: the global batch may be a searched field, and the ranking is by tokens/s
        weight = [1.0 / c["tokens"] for c in checked]
        key = "step_time_s"
    bounds = [b * w for b, w in zip(bound_step, weight, strict=True)]
    order = sorted(range(len(raws)), key=lambda pos: bounds[pos])
    work = [c["work"] for c in checked]

    def engine_time(pos: int) -> float:
        row = rows[to_simulate[pos]]
        if not (row and row.get("fits") and row.get("evaluated_by") == timed_by and row.get("step_time_s")):
            return math.inf
        value = row.get(key)
        return value * (1.0 if key == "time_to_target_s" else weight[pos]) if value else math.inf

    def price(task, desc: str):
        return lambda batch: _evaluate(rows, to_simulate, raws, candidates, n, task, raws, workers, dask, progress,
                                       desc, batch, pool, work)

    n_workers = workers or os.cpu_count() or 1
    if timed_by == "fast":
        done = engine_branch_and_bound(order, bounds, price(_fast_task, f"fast path (top {top_k})"), engine_time,
                                       top_k, 2 * n_workers)
    else:
        done = engine_branch_and_bound(order, bounds, price(_engine_task, f"engine (top {top_k})"), engine_time,
                                       top_k, 2 * n_workers,
                                       price(_engine_fast_task, f"engine + fast path (top {top_k})"),
                                       BESIDE_FIRST * top_k)
        best = sorted((pos for pos in done if math.isfinite(engine_time(pos))),
                      key=lambda pos: (engine_time(pos), pos))
        _fast_beside(rows, to_simulate, raws, [pos for pos in best[:top_k]
                                               if rows[to_simulate[pos]].get("fast_step_time_s") is None],
                     workers, dask, progress, pool)
    for pos in order:
        if pos in done:
            rows[to_simulate[pos]]["step_time_lower_bound_s"] = bound_step[pos]
            continue
        what = (f"time-to-target lower bound ({bounds[pos]:.3g} s: {weight[pos]:.4g} steps at least x "
                f"{bound_step[pos]:.3g} s per step)" if key == "time_to_target_s"
                else f"step-time lower bound ({bound_step[pos]:.3g} s per step)")
        rows[to_simulate[pos]] = {
            **checked[pos]["template"], "evaluated_by": "bound", "step_time_lower_bound_s": bound_step[pos],
            "infeasible_reason": f"skipped: its {what} cannot reach the top {top_k}"}


def _fast_beside(rows, to_simulate, raws, which: list[int], workers, dask, progress, pool) -> None:
    """The fast path's step and lower bound on the engine rows at positions ``which`` (the top k rows
    the engine timed without it): every reported top-k row carries both times."""
    if not which:
        return
    bar = _progress_bar(len(which), "fast path (top k)", progress)
    try:
        for j, ok, result in parallel_map(_fast_task, [raws[pos] for pos in which], workers=workers, dask=dask,
                                          pool=pool):
            row = rows[to_simulate[which[j]]]
            if ok and result.get("fits"):
                row["fast_step_time_s"] = result.get("step_time_s")
                row["fast_path_lower_bound_s"] = result.get("fast_path_lower_bound_s")
                if result.get("fast_path_approximation"):
                    row["fast_path_approximation"] = result["fast_path_approximation"]
            bar.update(1)
    finally:
        bar.close()


def rows_template(sc, memory: tuple | None = None) -> dict[str, Any]:
    """A row for a layout that fits but was not timed. ``memory``: its memory by the strategy kind's
    model (:func:`simulator.explore.checks.layout_memory`), if already computed (the search's check did)."""
    from simulator.explore.checks import layout_memory

    stage, peak, per_stage = memory or layout_memory(sc, reference=True)
    row = empty_result()
    row.update(parallelism=sc.parallelism.model_dump(), num_gpus=sc.num_gpus, fits=True,
               peak_memory_gib=peak.total_gib, peak_memory_stage=stage, memory_gib=peak.gib(),
               memory_per_stage_gib=[b.total_gib for b in per_stage], hbm_gib=sc.accelerator.hbm_gib)
    return row
