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
with the reason; a model whose weights, gradients and optimizer state no split can shard onto one
GPU is refused before planning (:mod:`.model_state`). The plan is written as a ``per_layer`` strategy (the most common split as ``default``, the other
layers as index ranges) and simulated by the engine, with pure data parallelism (every layer
``{batch: p}``) simulated beside it for the speed-up PaSE reports.

Where the objective and the simulation part (an extension beyond the paper, labelled in the plan):
t_l (eq. 1, as priced here) adds a layer's weight-gradient all-reduce to its kernels, but the
simulation runs the all-reduces on their own stream beside the rest of the backward (as DDP
does), so most of them are hidden, while a reshard between two layers sits on the critical path. On ResNet-50 over 8 A100s the
objective counts pure data parallelism's all-reduces at 5.27 ms of its 17.7 ms, the simulated
step is 12.9 ms (kernels 12.4 ms): PaSE's own plan trades 1.85 ms of mostly hidden all-reduce
for 0.99 ms of exposed reshards and simulates 0.94x as fast as pure data parallelism. How much
of the all-reduce is hidden is a property of the whole schedule (the tail after the last
backward kernel), not of one layer, so no per-layer cost can carry it; instead the dynamic
program proposes and the simulator disposes: the DP is solved for the objective with the
gradient term weighted w in ``gradient_weights`` (default 1, 0.5, 0.25, 0; w = 1 is PaSE's
objective, w = 0 counts the all-reduces as fully hidden; each weighted sum is a supported point
of the trade-off between the critical path and the all-reduce stream, which the step is roughly
the larger of), each distinct plan and pure data parallelism (a plan of PaSE's space) are
simulated, and the fastest is returned, saying which weight proposed it and what PaSE's own
plan (w = 1) simulates to.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

from simulator.errors import ConfigError
from simulator.explore.planners import (
    PlannerKind,
    PlanResult,
    check_options,
    int_option,
    list_option,
    register,
)
from simulator.explore.planners.model_state import (
    per_layer_least_bytes,
    refuse_unless_state_fits,
    weight_shards,
)
from simulator.explore.planners.oracle import (
    Oracle,
    dropped_recompute_notes,
    per_layer_pricer,
    with_per_layer,
)
from simulator.explore.planners.pase_dp import min_cost_assignment, transitions_needed
from simulator.strategies.per_layer.config import SPLIT_FIELDS, SPLITTABLE_OF, Split
from simulator.strategies.per_layer.sharding import check_split, layer_sizes

OPTIONS = {"dims": "dimensions a layer may be cut along, comma separated (default batch,channels,reduction; "
                   "also rows, cols, heads, sequence)",
           "gradient_weights": "weights of the gradient all-reduce in the DP's objective, one plan each, comma "
                               "separated in [0, 1] (default 1,0.5,0.25,0; 1 alone: PaSE's objective's plan, or pure data "
                               "parallelism where that simulates faster)",
           "max_transitions": "most transitions one dynamic program may make; a graph that needs more is refused "
                              "before the DP starts (default 20000000, about 20 CPU-s)"}
DEFAULT_DIMS = ("batch", "channels", "reduction")
DEFAULT_GRADIENT_WEIGHTS = (1.0, 0.5, 0.25, 0.0)


def gradient_weights(options: dict[str, Any]) -> tuple[float, ...]:
    """The ``gradient_weights`` option: numbers in [0, 1], PaSE's own 1 first (ConfigError naming the option)."""
    value = options.get("gradient_weights", DEFAULT_GRADIENT_WEIGHTS)
    items = value if isinstance(value, (list, tuple)) else str(value).replace(" ", "").split(",")
    weights = []
    for item in items:
        try:
            weight = float(item)
        except (TypeError, ValueError):
            weight = math.nan
        if isinstance(item, bool) or not 0.0 <= weight <= 1.0:
            raise ConfigError("--option gradient_weights", f"each weight must be a number in [0, 1], got {item!r}")
        weights.append(weight)
    return tuple(sorted(set(weights), reverse=True))


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


def run_pase(raw: dict[str, Any], options: dict[str, Any]) -> PlanResult:
    check_options(PASE, options)
    dims = list_option(options, "dims", tuple(SPLIT_FIELDS), tuple(DEFAULT_DIMS), "dimension")
    weights = gradient_weights(options)
    max_transitions = int_option(options, "max_transitions", 20_000_000)
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
                              f"(global batch {batch}; spatial cuts: --option dims=batch,rows,cols)")
    most = {name: max(weight_shards(split) for split in splits) for name, splits in configs.items()}
    refuse_unless_state_fits(scenario, graph, per_layer_least_bytes(scenario, graph, lambda layer: most[layer.name]),
                             "PaSE", f"each layer split over {p} GPUs along {', '.join(dims)}: "
                                     + (f"weights sharded at most {max(most.values())} ways" if max(most.values()) > 1
                                        else "no layer can shard its weights"))
    edges = [(u, layer.name) for layer in graph.layers for u in dict.fromkeys(layer.inputs) if u in layers]
    needed = transitions_needed([layer.name for layer in graph.layers], edges, lambda name: len(configs[name]))
    if needed > max_transitions:
        raise ConfigError("--option max_transitions",
                          f"PaSE's exact DP over {graph.name} with {p} GPUs along {', '.join(dims)} needs {needed:,} "
                          f"transitions (its dependent sets hold several layers of up to "
                          f"{max(len(c) for c in configs.values())} configurations each), more than "
                          f"{max_transitions:,}: raise it or give fewer --option dims")
    layer_costs: dict = {}
    edge_costs: dict = {}

    def layer_cost(name: str, split: Split):
        key = (name, split)
        if key not in layer_costs:
            layer_costs[key] = prices.layer_cost(layers[name], split)
        return layer_costs[key]

    def edge_cost(u: str, v: str, a: Split, b: Split) -> float:
        key = (u, v, a, b)
        if key not in edge_costs:
            edge_costs[key] = prices.reshard(layers[u], a, layers[v], b).total_s
        return edge_costs[key]

    oracle = Oracle()
    data_parallel = oracle.evaluate(with_per_layer(raw, {"kind": "per_layer", "default": {"batch": p}}))
    proposals: list[dict[str, Any]] = []
    by_plan: dict[tuple, Any] = {}
    for weight in weights:  # PaSE's DP proposes, one plan per weight of the gradient term ...

        def vertex_cost(name: str, split: Split, weight: float = weight) -> float:
            cost = layer_cost(name, split)
            return cost.total_s - (1.0 - weight) * cost.gradient_reduce_s

        result = min_cost_assignment([layer.name for layer in graph.layers], edges, configs.get, vertex_cost,
                                     edge_cost)
        splits = tuple(result.assignment[layer.name] for layer in graph.layers)
        if splits not in by_plan:  # ... and the simulator disposes
            by_plan[splits] = oracle.evaluate(with_per_layer(raw, strategy_block(list(splits))))
        plan = by_plan[splits]
        proposals.append({"gradient_weight": weight, "objective_s": result.cost, "step_time_s": plan.step_time_s,
                          "fits": plan.fits, "dp_table_entries": result.states, "dp_transitions": result.transitions,
                          "max_dependent_set": result.max_dependent_set, "splits": splits, "evaluation": plan})
    own = proposals[0]  # the largest weight: PaSE's objective when 1 is among the weights
    candidates = [item for item in proposals if item["fits"]]
    if data_parallel.fits:
        candidates.append({"gradient_weight": None, "step_time_s": data_parallel.step_time_s,
                           "splits": tuple(Split(batch=p) for _ in graph.layers), "evaluation": data_parallel})
    chosen = min(candidates, key=lambda item: item["step_time_s"]) if candidates else own
    if chosen is not own and chosen["step_time_s"] >= own["step_time_s"] * (1 - 1e-12):
        chosen = own  # a tie: PaSE's own plan
    splits, plan = list(chosen["splits"]), chosen["evaluation"]
    speedup = data_parallel.step_time_s / plan.step_time_s if data_parallel.fits and plan.fits else math.nan
    own_speedup = (data_parallel.step_time_s / own["step_time_s"] if data_parallel.fits and own["fits"]
                   else math.nan)
    split_counts = Counter(s.label() for s in splits)
    if chosen is own:
        origin = f"PaSE's DP, gradient weight {own['gradient_weight']:g}"
    elif chosen["gradient_weight"] is None:
        origin = "pure data parallelism (in PaSE's plan space; no DP proposal simulated faster)"
    else:
        origin = f"PaSE's DP with the gradient all-reduce weighted {chosen['gradient_weight']:g} (an extension)"
    summary = (f"PaSE: {len(splits)} layers, splits {dict(split_counts)}, from {origin}; DP objective "
               f"(weight {own['gradient_weight']:g}) {own['objective_s']:.6g} s; "
               + (f"pure data parallel {data_parallel.step_time_s:.6g} s" if data_parallel.fits
                  else f"pure data parallel cannot run ({data_parallel.reason})")
               + (f": speed-up {speedup:.3f}x" if not math.isnan(speedup) else ""))
    notes = ["DP proposals (gradient weight: simulated step): "
             + ", ".join(f"{item['gradient_weight']:g}: " + (f"{item['step_time_s']:.6g} s" if item["fits"] else "does not fit")
                         for item in proposals)]
    if chosen is not own and own["gradient_weight"] == 1.0:
        notes.append("PaSE's own plan (weight 1, its paper's objective) simulates to "
                     + (f"{own['step_time_s']:.6g} s ({own_speedup:.3f}x pure data parallel)" if own["fits"]
                        else f"a plan that does not fit ({own['evaluation'].reason})"))
    if not plan.fits:
        notes.insert(0, "PaSE's cost model ignores memory (its DP has no memory term, nor has the paper's): "
                        "the plan it found does not fit on this cluster, nor does any other proposal or pure data parallelism")
    priced = len(layer_costs) + len(edge_costs)
    return PlanResult("pase", plan.raw, plan.step_time_s, plan.samples_per_s, time.perf_counter() - started,
                      priced, oracle.simulated, summary,
                      {"splits": {layer.name: s.cuts() for layer, s in zip(graph.layers, splits, strict=True)},
                       "dp_objective_s": own["objective_s"], "dp_table_entries": own["dp_table_entries"],
                       "dp_transitions": own["dp_transitions"], "max_dependent_set": own["max_dependent_set"],
                       "data_parallel_step_s": data_parallel.step_time_s, "speedup_over_data_parallel": speedup,
                       "chosen_gradient_weight": chosen["gradient_weight"],
                       "pase_objective_step_s": own["step_time_s"], "pase_objective_speedup": own_speedup,
                       "proposals": [{k: v for k, v in item.items() if k not in ("splits", "evaluation")}
                                     for item in proposals]},
                      estimated_what="layer and reshard costs priced", reason=plan.reason,
                      notes=[*dropped_recompute_notes(raw, plan.raw), *notes])


PASE = register(PlannerKind(
    name="pase",
    summary="PaSE (Elango 2021): a split per layer (batch, channels, reduction, ...) over all GPUs, the exact "
            "dynamic program over layer and reshard costs; simulated beside pure data parallelism",
    options=OPTIONS,
    run=run_pase,
))
