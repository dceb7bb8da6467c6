"""DeepPool's burst-parallel planner (Park et al., "Efficient Strong Scaling Through Burst Parallel
Training", MLSys 2022, Sec. 3-4): a GPU count per layer under a fixed global batch.

Strong scaling spreads a small global batch over many GPUs, and many layers then use their GPUs
badly. DeepPool gives each layer its own number of GPUs (data parallel over those GPUs, the
activations scattered and gathered where the count changes: *burst parallelism*), chosen by a
dynamic program over the layer graph that minimises the iteration time, with each layer limited
by an *amplification limit*: a layer may use g GPUs only if its GPU-time g·t(g) is at most
``amplification_limit`` times the least GPU-time any count gives it (DeepPool's
``--amplificationLimit``; its example job ``vgg16_8_32_2.0`` ran with 2.0). The GPUs a layer
leaves idle serve a background job in DeepPool; here they are reported as GPU-seconds saved.

Costs: a layer on g GPUs is :mod:`simulator.strategies.per_layer.cost` 's ``{batch: g}`` price on
the first g GPUs (kernels at G/g samples, the weight-gradient all-reduce over the g), an edge the
reshard between the two device sets; the exact dynamic program is :mod:`.pase_dp`. The plan is a
``per_layer`` strategy, simulated beside every layer on all GPUs. Every layer's whole weights sit on
each of its GPUs, so a model state larger than one GPU is refused before planning (:mod:`.model_state`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

from simulator.errors import ConfigError
from simulator.explore.planners import PlannerKind, PlanResult, check_options, register
from simulator.explore.planners.model_state import per_layer_least_bytes, refuse_unless_state_fits
from simulator.explore.planners.oracle import (
    Oracle,
    dropped_recompute_notes,
    per_layer_pricer,
    with_per_layer,
)
from simulator.explore.planners.pase import strategy_block
from simulator.explore.planners.pase_dp import min_cost_assignment
from simulator.strategies.per_layer.config import Split
from simulator.strategies.per_layer.sharding import check_split

OPTIONS = {"amplification_limit": "most GPU-time a layer may spend over its most GPU-efficient count (default 2.0)"}


def gpu_counts(num_gpus: int, batch: int) -> list[int]:
    """Candidate GPU counts of a layer: the divisors of the global batch up to the cluster's GPUs."""
    return [g for g in range(1, num_gpus + 1) if batch % g == 0 and num_gpus % g == 0]


def run_deeppool(raw: dict[str, Any], options: dict[str, Any]) -> PlanResult:
    check_options(DEEPPOOL, options)
    limit = options.get("amplification_limit", 2.0)
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not limit >= 1.0:
        raise ConfigError("--option amplification_limit", f"must be a number >= 1, got {limit!r}")
    started = time.perf_counter()
    scenario, prices = per_layer_pricer(raw)
    p = scenario.num_gpus
    graph, batch = prices.graph, prices.batch
    refuse_unless_state_fits(scenario, graph, per_layer_least_bytes(scenario, graph, lambda layer: 1), "DeepPool",
                             "each layer data parallel over its GPUs, its whole weights on each")
    layers = {layer.name: layer for layer in graph.layers}
    counts = gpu_counts(p, batch)
    priced = [0]
    layer_s: dict[tuple[str, int], float] = {}
    for name, layer in layers.items():
        for g in counts:
            try:
                split = check_split(layer, Split(batch=g), batch, p, "refuse", "config")
            except ConfigError:
                continue
            priced[0] += 1
            layer_s[name, g] = prices.layer_cost(layer, split).total_s
    configs: dict[str, list[Split]] = {}
    for name in layers:
        own = {g: s for (n, g), s in layer_s.items() if n == name}
        least = min(g * s for g, s in own.items())
        configs[name] = [Split(batch=g) for g, s in own.items() if g * s <= limit * least * (1 + 1e-12)]
    edges = [(u, layer.name) for layer in graph.layers for u in dict.fromkeys(layer.inputs) if u in layers]

    def edge_cost(u: str, v: str, a: Split, b: Split) -> float:
        priced[0] += 1
        return prices.reshard(layers[u], a, layers[v], b).total_s

    result = min_cost_assignment([layer.name for layer in graph.layers], edges, configs.get,
                                 lambda name, split: layer_s[name, split.batch], edge_cost)
    splits = [result.assignment[layer.name] for layer in graph.layers]
    gpu_seconds = sum(s.batch * layer_s[layer.name, s.batch] for layer, s in zip(graph.layers, splits, strict=True))
    not_on_all = [name for name in layers if (name, p) not in layer_s]
    all_gpus = None if not_on_all else sum(p * layer_s[name, p] for name in layers)
    oracle = Oracle()
    plan = oracle.evaluate(with_per_layer(raw, strategy_block(splits)))
    everywhere = oracle.evaluate(with_per_layer(raw, {"kind": "per_layer", "default": {"batch": p}}))
    ratio = plan.step_time_s / everywhere.step_time_s if plan.fits and everywhere.fits else math.nan
    # layers by their GPU count, most GPUs first ("23 layers on 8 GPUs, 8 on 4, 9 on 1"; it read "GPUs per layer
    # {4: 8, 8: 23, 1: 9}", counts of layers keyed by GPUs, which reads as layer 4 on 8 GPUs)
    by_gpus = sorted(Counter(s.batch for s in splits).items(), reverse=True)
    counts = ", ".join(f"{layers}{' layers' if i == 0 else ''} on {gpus} GPU{'s' if gpus > 1 else ''}"
                       for i, (gpus, layers) in enumerate(by_gpus))
    summary = (f"DeepPool bursts (amplification limit {limit}): {counts}; "
               f"layer GPU-seconds {gpu_seconds:.4g}")
    summary += (f" vs {all_gpus:.4g} on all {p} GPUs" if all_gpus is not None else
                f"; every layer on all {p} GPUs is not a plan ({len(not_on_all)} layers cannot split over {p}, "
                f"first {not_on_all[0]!r})")
    if not math.isnan(ratio):
        summary += f"; step {ratio:.3f}x of every layer on all GPUs ({everywhere.step_time_s:.6g} s)"
    return PlanResult("deeppool", plan.raw, plan.step_time_s, plan.samples_per_s, time.perf_counter() - started,
                      priced[0], oracle.simulated, summary,
                      {"gpus_per_layer": {layer.name: s.batch for layer, s in zip(graph.layers, splits, strict=True)},
                       "layer_gpu_seconds": gpu_seconds, "all_gpus_layer_gpu_seconds": all_gpus,
                       "all_gpus_step_s": everywhere.step_time_s, "step_ratio_to_all_gpus": ratio,
                       "dp_objective_s": result.cost},
                      estimated_what="layer and reshard costs priced", reason=plan.reason,
                      notes=dropped_recompute_notes(raw, plan.raw))


DEEPPOOL = register(PlannerKind(
    name="deeppool",
    summary="DeepPool (Park et al. 2022): a GPU count per layer under the fixed global batch (burst parallelism), "
            "the fastest plan whose layers stay within an amplification limit of their best GPU-time",
    options=OPTIONS,
    run=run_deeppool,
))
