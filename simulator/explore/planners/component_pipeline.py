"""The ``pipeline`` choice of the adaptive per-component planner (:mod:`.adaptive`): the components
assigned to S pipeline stages, each stage data parallel on p/S GPUs, under DAPPLE's early-backward
(1F1B) schedule -- the ``replicated_pipeline`` kind with equal replica counts.

A pipeline overlaps components on disjoint GPUs across micro-batches, which the ``per_layer``
kind (one timeline for every layer) cannot, so this choice is made for the network as a whole:
every component goes to one stage, and the stages meet only at component boundaries. For each
stage count S dividing the GPUs (up to ``max_stages``) whose stages DAPPLE's placement accepts
(inside a node or on whole nodes, :func:`.dapple.placement_accepts`), each micro-batch count M and
ZeRO 0/1, the components are cut into S contiguous runs minimising the slowest stage
(:func:`.dapple.bottleneck_cut` on the components' compute at the stage's per-GPU batch) and the
plan is estimated by DAPPLE's latency model (:class:`.dapple.Estimator`); the ``per_stage`` best
estimates of each S that the memory model lets run (:func:`memory_reason`: checked best estimate first, the
others counted as pruned) are simulated by the engine. S = 1 is data parallelism over all GPUs in that
kind (with ZeRO-1 on offer, which the ``per_layer`` kind does not model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.explore.planners.components import Component
from simulator.explore.planners.dapple import (
    Estimator,
    LayerTables,
    base_scenario,
    bottleneck_cut,
    placement_accepts,
    plan_raw,
)


@dataclass(frozen=True)
class PipelinePlan:
    """One pipeline candidate: ``counts`` layers per stage, ``components`` per stage, ``replicas``
    per stage, ``micro_batches``, ``zero`` stage, DAPPLE's ``estimate_s``."""

    counts: tuple[int, ...]
    components: tuple[int, ...]
    replicas: tuple[int, ...]
    micro_batches: int
    zero: int
    estimate_s: float

    def label(self) -> str:
        how = f"{self.micro_batches} micro-batches{', ZeRO-1' if self.zero else ''}"
        if len(self.replicas) == 1:
            return f"data {self.replicas[0]} in one replicated stage ({how})"
        return f"pipeline {len(self.replicas)}x{self.replicas[0]} ({how})"

    def raw(self, raw: dict[str, Any]) -> dict[str, Any]:
        return plan_raw(raw, list(self.counts), self.replicas, self.micro_batches, self.zero)


def pipeline_candidates(raw: dict[str, Any], components: list[Component], max_stages: int = 4,
                        max_micro_batches: int = 64) -> tuple[list[PipelinePlan], int]:
    """Every pipeline candidate at component boundaries, best estimate first, and how many were
    estimated (see the module docstring)."""
    scenario = base_scenario(raw)
    tables = LayerTables(scenario)
    if tables.layers != components[-1].last + 1:
        return [], 0  # the pipeline kind's graph is not the per-layer graph: nothing to cut
    estimator = Estimator(scenario, tables)
    p, per_node = scenario.num_gpus, scenario.node.gpus_per_node
    g = scenario.parallelism.global_batch_size
    bounds = np.array([c.first for c in components] + [tables.layers])
    out: list[PipelinePlan] = []
    for stages in range(1, min(max_stages, len(components), p) + 1):
        if p % stages:
            continue
        replicas = (p // stages,) * stages
        if not placement_accepts(replicas, per_node):
            continue
        for m in range(1, min(max_micro_batches, g) + 1):
            if g % m or (g // m) % replicas[0]:
                continue
            prefix = tables.prefix(g // m // replicas[0])[bounds]
            cut = bottleneck_cut([prefix] * stages, len(components))
            if cut is None:
                continue
            edges = np.concatenate([[0], np.cumsum(cut)])
            counts = tuple(int(bounds[b] - bounds[a]) for a, b in zip(edges[:-1], edges[1:], strict=True))
            for zero in (0, 1) if replicas[0] > 1 else (0,):
                estimate = estimator.latency_s(list(counts), replicas, m, zero)
                out.append(PipelinePlan(counts, tuple(int(c) for c in cut), replicas, m, zero, estimate))
    out.sort(key=lambda plan: (plan.estimate_s, len(plan.replicas), plan.micro_batches, plan.zero))
    return out, len(out)


def memory_reason(raw: dict[str, Any]) -> tuple[str, str] | None:
    """Why the plan ``raw`` (a scenario mapping) cannot run before any simulation, as ``("memory", reason)``
    or ``("invalid", the ConfigError)``, or None where it can: the check the
    oracle makes before it simulates (:meth:`.oracle.Oracle.evaluate` through
    :func:`simulator.simulate.simulate`): the strategy kind's memory model (``replicated_pipeline``: every
    stage's weights, gradients, optimizer state and in-flight activations) against HBM less the reserve
    (:func:`simulator.memory.analytic.fits`), or the scenario's ConfigError. Built, not simulated."""
    from simulator.errors import ConfigError
    from simulator.memory.analytic import fits
    from simulator.scenario import build_scenario
    from simulator.strategies.registry import get_kind

    try:
        scenario = build_scenario(raw)
        _, peak, per_stage = get_kind(scenario.strategy_kind).memory(scenario)
    except ConfigError as exc:
        return "invalid", str(exc)
    ok, reason = fits(scenario, peak, per_stage)
    return None if ok else ("memory", str(reason))


def pick_to_simulate(candidates: list[PipelinePlan], per_stage: int,
                     raw: dict[str, Any] | None = None
                     ) -> tuple[list[PipelinePlan], list[tuple[PipelinePlan, tuple[str, str]]]]:
    """The ``per_stage`` best estimates of every stage count that can run, and the candidates pruned on the
    way (with the reason): with ``raw`` (the user's scenario), each candidate is checked by
    :func:`memory_reason` best estimate first before it is picked, so that a stage count's slots go to
    plans the engine can time; each pruned one comes with :func:`memory_reason`'s verdict. Without
    ``raw``, nothing is pruned."""
    kept: dict[int, list[PipelinePlan]] = {}
    pruned: list[tuple[PipelinePlan, tuple[str, str]]] = []
    for plan in candidates:
        chosen = kept.setdefault(len(plan.replicas), [])
        if len(chosen) < per_stage:
            reason = memory_reason(plan.raw(raw)) if raw is not None else None
            if reason is None:
                chosen.append(plan)
            else:
                pruned.append((plan, reason))
    return [plan for plans in kept.values() for plan in plans], pruned


def stage_of_components(plan: PipelinePlan, components: list[Component]) -> dict[str, int]:
    """Each component's stage."""
    out, start = {}, 0
    for stage, n in enumerate(plan.components):
        for comp in components[start:start + n]:
            out[comp.name] = stage
        start += n
    return out

