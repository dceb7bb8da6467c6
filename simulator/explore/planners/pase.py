"""PaSE's planner (Elango 2021, "PaSE: Parallelization Strategies for Efficient DNN Training",
IPDPS 2021): a configuration per layer, found by an exact dynamic program over the layer graph.

Each layer's configurations (PaSE Sec. III-A) are the ways to cut its iteration space over all p
GPUs: for every dimension it can split (``Layer.splittable``, restricted to the ``dims`` option,
default batch, output channels and the reduction; ``rows``/``cols`` add the spatial grid,
``heads``/``sequence`` the transformer cuts), the cuts whose product is p and that divide their
dimension. A layer's cost t_l is :func:`simulator.strategies.per_layer.cost` 's price of one of its
devices per step (forward and backward kernels, halos, the weight-gradient all-reduce over its
replicas), an edge's cost t_x the reshard between the producer's and the consumer's layouts
(forward collective and its adjoint), both priced on the topology; the dynamic program
(:mod:`.pase_dp`) returns the assignment of least total cost (PaSE's objective, Sec. III-B, eq. 1).

PaSE's objective has no memory term (nor has the paper's): a plan that does not fit is returned
with the reason. The plan is written as a ``per_layer`` strategy (the most common split as ``default``, the other
layers as index ranges) and simulated by the engine, with pure data parallelism (every layer
``{batch: p}``) simulated beside it for the speed-up PaSE reports.
"""

from __future__ import annotations

import copy
import math
import time
from collections import Counter
from typing import Any

from simulator.errors import ConfigError
from simulator.explore.planners import PlannerKind, PlanResult, check_options, list_option, register
from simulator.explore.planners.oracle import Oracle, per_layer_pricer
from simulator.explore.planners.pase_dp import min_cost_assignment
from simulator.strategies.per_layer.config import SPLIT_FIELDS, SPLITTABLE_OF, Split
from simulator.strategies.per_layer.sharding import check_split, layer_sizes

OPTIONS = {"dims": "dimensions a layer may be cut along, comma separated (default batch,channels,reduction; "
                   "also rows, cols, heads, sequence)"}
DEFAULT_DIMS = ("batch", "channels", "reduction")


def factorizations(p: int, parts: int) -> list[tuple[int, ...]]:
    """Ordered ``parts``-tuples of positive integers whose product is ``p``."""
    if parts == 1:
        return [(p,)]
    return [(d, *rest) for d in range(1, p + 1) if p % d == 0 for rest in factorizations(p // d, parts - 1)]


def layer_configs(layer, batch: int, p: int, dims: tuple[str, ...]) -> list[Split]:
    """Every split of ``layer`` over exactly ``p`` devices along ``dims`` that it accepts."""
    sizes = layer_sizes(layer, batch) if layer.output_shape is not None else {"batch": batch}
    usable = [f for f in SPLIT_FIELDS if f in dims and SPLITTABLE_OF[f] in layer.splittable and f in sizes]
    out = []
    for cuts in factorizations(p, len(usable)) if usable else []:
        split = Split(**dict(zip(usable, cuts, strict=True)))
        try:
            out.append(check_split(layer, split, batch, p, "refuse", "config"))
        except ConfigError:
            continue
    return out


def _ranges(indices: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def strategy_block(splits: list[Split]) -> dict[str, Any]:
    """A ``per_layer`` strategy block for per-layer ``splits``: the most common as ``default``, the
    others as index ranges."""
    labels = [s.label() for s in splits]
    common = Counter(labels).most_common(1)[0][0]
    default = next(s for s in splits if s.label() == common)
    rules = []
    by_label: dict[str, list[int]] = {}
    for i, s in enumerate(splits):
        if s.label() != common:
            by_label.setdefault(s.label(), []).append(i)
    for indices in by_label.values():
        rules += [{"range": [a, b], "split": splits[indices[0]].cuts() or {"batch": 1}} for a, b in _ranges(indices)]
    rules.sort(key=lambda r: r["range"][0])
    return {"kind": "per_layer", "default": default.cuts() or {"batch": 1}, "layers": rules}


def _with_strategy(raw: dict[str, Any], strategy: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    out["strategy"] = strategy
    return out


def run_pase(raw: dict[str, Any], options: dict[str, Any]) -> PlanResult:
    check_options(PASE, options)
    dims = list_option(options, "dims", tuple(SPLIT_FIELDS), tuple(DEFAULT_DIMS), "dimension")
    started = time.perf_counter()
    scenario, prices = per_layer_pricer(raw)
    p = scenario.num_gpus
    graph, batch = prices.graph, prices.batch
    layers = {layer.name: layer for layer in graph.layers}
    configs = {name: layer_configs(layer, batch, p, dims) for name, layer in layers.items()}
    for name, options_of in configs.items():
        if not options_of:
            raise ConfigError("parallelism.global_batch_size",
                              f"layer {name} has no split over {p} GPUs along {', '.join(dims)} that divides it "
                              f"(global batch {batch})")
    edges = [(u, layer.name) for layer in graph.layers for u in dict.fromkeys(layer.inputs) if u in layers]
    priced = [0]

    def vertex_cost(name: str, split: Split) -> float:
        priced[0] += 1
        return prices.layer_cost(layers[name], split).total_s

    def edge_cost(u: str, v: str, a: Split, b: Split) -> float:
        priced[0] += 1
        return prices.reshard(layers[u], a, layers[v], b).total_s

    result = min_cost_assignment([layer.name for layer in graph.layers], edges, configs.get, vertex_cost, edge_cost)
    splits = [result.assignment[layer.name] for layer in graph.layers]
    oracle = Oracle()
    plan = oracle.evaluate(_with_strategy(raw, strategy_block(splits)))
    data_parallel = oracle.evaluate(_with_strategy(raw, {"kind": "per_layer", "default": {"batch": p}}))
    speedup = data_parallel.step_time_s / plan.step_time_s if data_parallel.fits and plan.fits else math.nan
    split_counts = Counter(s.label() for s in splits)
    summary = (f"PaSE: {len(splits)} layers, splits {dict(split_counts)}; DP objective {result.cost:.6g} s; "
               + (f"pure data parallel {data_parallel.step_time_s:.6g} s" if data_parallel.fits
                  else f"pure data parallel cannot run ({data_parallel.reason})")
               + (f": speed-up {speedup:.3f}x" if not math.isnan(speedup) else ""))
    return PlanResult("pase", plan.raw, plan.step_time_s, plan.samples_per_s, time.perf_counter() - started,
                      priced[0], oracle.simulated, summary,
                      {"splits": {layer.name: s.cuts() for layer, s in zip(graph.layers, splits, strict=True)},
                       "dp_objective_s": result.cost, "dp_table_entries": result.states,
                       "dp_transitions": result.transitions, "max_dependent_set": result.max_dependent_set,
                       "data_parallel_step_s": data_parallel.step_time_s, "speedup_over_data_parallel": speedup},
                      estimated_what="layer and reshard costs priced", reason=plan.reason)


PASE = register(PlannerKind(
    name="pase",
    summary="PaSE (Elango 2021): a split per layer (batch, channels, reduction, ...) over all GPUs, the exact "
            "dynamic program over layer and reshard costs; simulated beside pure data parallelism",
    options=OPTIONS,
    run=run_pase,
))
