"""The simulator's schedule choice after DAPPLE's partitioner: an extension of DAPPLE's planner
beyond its paper, and labelled as such in the plan it returns.

DAPPLE (Fan et al. 2021, Sec. 3-4) chooses the number of stages, each stage's replicas and the
micro-batches, and runs every plan with its early-backward 1F1B schedule, one contiguous stage
per device group. The simulator offers one more schedule for a pipeline whose stages are
replicated alike: interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2), where each of the pp
device groups holds v model chunks (chunk c·pp + i on group i), which cuts the warm-up and
drain bubble by v at the price of v times as many boundary sends. The chunks are cut either
evenly (Megatron-LM's split, as ``clustersim search`` does) or ``balanced`` (contiguous layers
cut by the schedule's step estimate over pp·v chunks, starting from the min-max cut DAPPLE's
partitioner makes; :mod:`simulator.strategies.spmd.split`). Such a plan is an ``spmd`` layout
(pp = the stage count, dp = the stage replicas, ``schedule: interleaved``); for v = 1 the spmd
kind and ``replicated_pipeline`` simulate a uniform DAPPLE plan to the same step
(tests/test_plan_cli.py).

The choice (:func:`choose_schedule`): for DAPPLE's best simulated plans with equal replicas and
at least two stages, every v in 2..``max_virtual`` (pp·v at most the layers; the micro-batches
per replica divisible by pp, as the interleaved schedule needs) with either cut, at DAPPLE's
micro-batches and ZeRO stage, is simulated; the fastest is then moved one step at a time
(micro-batches doubled or halved, ZeRO-1 toggled, v ± 1, the other cut) while the simulator
says it gets faster, within a budget of simulations. The caller keeps whichever is faster:
DAPPLE's own plan or the extension's.
"""

from __future__ import annotations

import copy
from typing import Any

from simulator.explore.planners.oracle import Evaluation, Oracle

SPLITS = ("even", "balanced")
_KEPT = ("overlap_grad_reduce", "gradient_bucket_mb")  # the scenario's knobs both plan kinds read


def interleaved_raw(raw: dict[str, Any], stages: int, replicas: int, micro_batches: int, zero: int,
                    virtual: int, split: str) -> dict[str, Any]:
    """The scenario mapping of an interleaved plan: ``stages`` device groups of ``replicas`` GPUs,
    ``virtual`` chunks each, the global batch in ``micro_batches`` micro-batches (of
    global / (micro_batches · replicas) samples per GPU)."""
    out = copy.deepcopy(raw)
    par = raw.get("parallelism") or {}
    batch = par.get("global_batch_size", 512)
    out["parallelism"] = {"global_batch_size": batch, "micro_batch_size": batch // (micro_batches * replicas),
                          "pp": stages, "dp": replicas, "virtual_stages": virtual, "schedule": "interleaved",
                          "pp_split": split, "zero_stage": zero, **{k: par[k] for k in _KEPT if k in par}}
    out["strategy"] = {"kind": "spmd"}
    return out


def _key(plan: tuple) -> tuple:
    return ("interleaved", *plan)


def _valid(plan: tuple, batch: int, layers: int) -> bool:
    stages, replicas, m, zero, v, split = plan
    return (v >= 2 and stages * v <= layers and m >= 1 and batch % (m * replicas) == 0 and m % stages == 0
            and (zero == 0 or replicas > 1))


def _neighbours(plan: tuple):
    stages, replicas, m, zero, v, split = plan
    yield stages, replicas, m * 2, zero, v, split
    yield stages, replicas, m // 2, zero, v, split
    yield stages, replicas, m, 1 - zero, v, split
    yield stages, replicas, m, zero, v + 1, split
    yield stages, replicas, m, zero, v - 1, split
    yield stages, replicas, m, zero, v, SPLITS[1 - SPLITS.index(split)]


def choose_schedule(raw: dict[str, Any], dapple_plans: list[Evaluation], layers: int, oracle: Oracle,
                    seen: set, max_virtual: int, budget: int) -> tuple[Evaluation | None, tuple | None]:
    """The fastest interleaved plan found from ``dapple_plans`` (``replicated_pipeline``
    evaluations; those with unequal replicas or one stage are skipped), with its
    (stages, replicas, micro-batches, ZeRO, v, cut); (None, None) when none fits or applies.
    ``budget``: the most oracle calls this may spend (its count includes the caller's)."""
    batch = (raw.get("parallelism") or {}).get("global_batch_size", 512)
    best: tuple[Evaluation, tuple] | None = None

    def evaluate(plan: tuple) -> Evaluation | None:
        if not _valid(plan, batch, layers) or plan[4] > max_virtual or _key(plan) in seen or oracle.simulated >= budget:
            return None
        seen.add(_key(plan))
        evaluation = oracle.evaluate(interleaved_raw(raw, *plan))
        return evaluation if evaluation.fits else None

    for start in dapple_plans:
        strategy = start.raw["strategy"]
        counts = {s["replicas"] for s in strategy["stages"]}
        if len(strategy["stages"]) < 2 or len(counts) != 1:
            continue
        stages, replicas = len(strategy["stages"]), counts.pop()
        zero = start.raw["parallelism"].get("zero_stage", 0)
        for v in range(2, max_virtual + 1):
            for split in SPLITS:
                plan = (stages, replicas, strategy["micro_batches"], zero, v, split)
                evaluation = evaluate(plan)
                if evaluation is not None and (best is None or evaluation.step_time_s < best[0].step_time_s):
                    best = evaluation, plan
    improved = best is not None
    while improved:  # hill-climb the fastest, one move at a time, judged by the simulator
        improved = False
        for plan in _neighbours(best[1]):
            evaluation = evaluate(plan)
            if evaluation is not None and evaluation.step_time_s < best[0].step_time_s:
                best, improved = (evaluation, plan), True
                break
    return best if best is not None else (None, None)


def describe(plan: tuple) -> str:
    stages, replicas, m, zero, v, split = plan
    return (f"interleaved 1F1B, {stages} stage(s) x {replicas} replicas, {v} chunks per stage cut {split}, "
            f"{m} micro-batches, ZeRO {zero}")
