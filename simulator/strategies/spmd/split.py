"""How a pipeline splits a layer graph into chunks: even layer counts, or balanced by cost.

``parallelism.pp_split: even`` (the default) gives every chunk the same number of layers
(:func:`~simulator.strategies.spmd.layout.chunk_layer_counts`: Megatron-LM's split, with
``first_stage_layers`` / ``last_stage_layers``). ``balanced`` cuts the graph's pipelined layers
into contiguous chunks that minimise the slowest chunk's compute time (the linear-partition
problem; PipeDream's planner, Narayanan et al. 2019 Sec. 3.1, solves its more general form by
dynamic programming), each layer priced as the kernel seconds of its forward, backward and
recompute on the scenario's accelerator, the prologue (embedding) counted on the first chunk and
the epilogue (loss/head) on the last. Communication is not priced in the split: with layers
of a few hundred microseconds and sends between them the difference is second order.
"""

from __future__ import annotations

from simulator.cost.compute import ComputeModel
from simulator.errors import ConfigError
from simulator.strategies.spmd.layout import chunk_layer_counts
from workloads.layer_graph import Layer, LayerGraph

_BALANCED: dict[tuple, tuple[LayerGraph, object, list[int]]] = {}
_BALANCED_KEPT = 4096


def chunk_counts(scenario, graph: LayerGraph) -> list[int]:
    """Pipelined layers per global chunk (chunk c of pipeline rank i is c·pp + i). A balanced split
    is kept per graph, accelerator, precision, recompute and chunk count: the memory model, the
    search's bound and the planner of one layout, and the layouts of a search that differ in
    nothing the costs read (ZeRO, schedule, overlap), ask for the same one."""
    par = scenario.parallelism
    if getattr(par, "pp_split", "even") == "even" or par.pp * par.virtual_stages == 1:
        return chunk_layer_counts(par, len(graph.pipelined))
    t = scenario.training
    key = (id(graph), id(scenario.accelerator), repr((t.precision, t.fp8_gemms, t.fp8_recipe, t.tf32)),
           par.recompute, par.pp, par.virtual_stages)
    hit = _BALANCED.get(key)
    if hit is not None and hit[0] is graph and hit[1] is scenario.accelerator:
        return list(hit[2])
    costs, first, last = layer_costs(scenario, graph, par.recompute)
    counts = balanced_split(costs, par.pp * par.virtual_stages, first, last,
                            prefer=chunk_layer_counts(par, len(graph.pipelined)))
    if len(_BALANCED) >= _BALANCED_KEPT:
        _BALANCED.clear()
    _BALANCED[key] = (graph, scenario.accelerator, counts)
    return list(counts)


def layer_costs(scenario, graph: LayerGraph, recompute: str) -> tuple[list[float], float, float]:
    """What :func:`balanced_split` balances: each pipelined layer's kernel seconds (forward, backward
    and the ``recompute`` re-run) on the scenario's accelerator, and the prologue's and epilogue's."""
    compute = ComputeModel(scenario.accelerator, scenario.training.precision, scenario.training.fp8_gemms,
                           scenario.training.fp8_recipe, tf32=scenario.training.tf32)

    def cost(layers: tuple[Layer, ...]) -> float:
        return sum(compute.ops_time_s(layer.forward) + compute.ops_time_s(layer.backward)
                   + compute.ops_time_s(layer.recompute_ops(recompute)) for layer in layers)

    # a stack of identical layers (a transformer's blocks: equal ops, other names) is priced once per kind
    priced: dict[tuple, float] = {}
    costs = []
    for layer in graph.pipelined:
        key = (layer.forward, layer.backward)  # the recomputed ops are a part of the forward's
        hit = priced.get(key)
        if hit is None:
            hit = priced[key] = cost((layer,))
        costs.append(hit)
    first = cost(graph.layers[:graph.prologue])
    last = cost(graph.layers[len(graph.layers) - graph.epilogue:])
    return costs, first, last


def _pack(costs: list[float], chunks: int, limit: float, first_extra: float, last_extra: float) -> list[int] | None:
    """Greedy: fill each chunk up to ``limit`` leaving one layer for every chunk after it;
    None if some chunk must exceed it."""
    n, i, counts = len(costs), 0, []
    for c in range(chunks):
        load = first_extra if c == 0 else 0.0
        if c == chunks - 1:
            load += sum(costs[i:]) + last_extra
            return counts + [n - i] if load <= limit else None
        take = 0
        while i + take < n - (chunks - c - 1) and (take == 0 or load + costs[i + take] <= limit):
            load += costs[i + take]
            take += 1
        if load > limit:
            return None
        counts.append(take)
        i += take
    return counts


def max_chunk_cost(costs: list[float], counts: list[int], first_extra: float = 0.0, last_extra: float = 0.0) -> float:
    """The largest chunk's cost when ``costs`` are cut into chunks of ``counts`` layers."""
    loads, i = [], 0
    for count in counts:
        loads.append(sum(costs[i:i + count]))
        i += count
    loads[0] += first_extra
    loads[-1] += last_extra
    return max(loads)


def balanced_split(costs: list[float], chunks: int, first_extra: float = 0.0, last_extra: float = 0.0,
                   prefer: list[int] | None = None) -> list[int]:
    """Layers per chunk, contiguous and at least one each, minimising the largest chunk cost
    (chunk 0 also pays ``first_extra``, the last ``last_extra``): bisection on the bound with a
    greedy feasibility test, exact to 1e-12 relative. ``prefer`` (the even split): returned where
    its largest chunk costs no more (within 1e-9), so that where the even split is already optimal
    -- a stack of identical layers whose embedding and loss weigh less than a layer, as GPT-3's --
    ``balanced`` is the same layout, not another cut of equal cost (the greedy packs the front)."""
    n = len(costs)
    if chunks < 1 or chunks > n:
        raise ConfigError("parallelism.pp", f"cannot split {n} layers into {chunks} chunks")
    usable = prefer is not None and len(prefer) == chunks and sum(prefer) == n and min(prefer) >= 1
    if usable:
        # ``prefer`` is returned below wherever the cut found costs at least its largest chunk / (1 + 1e-9);
        # no cut at all within half that margin (the greedy is exact for feasibility) settles it without
        # the bisection (GPT-3 175B's search asks this of 36 pipeline depths, all even; 1,476 greedy packs)
        preferred = max_chunk_cost(costs, prefer, first_extra, last_extra)
        if _pack(costs, chunks, preferred / (1 + 0.5e-9), first_extra, last_extra) is None:
            return list(prefer)
    lo, hi = 0.0, sum(costs) + first_extra + last_extra
    for _ in range(200):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        if _pack(costs, chunks, mid, first_extra, last_extra) is None:
            lo = mid
        else:
            hi = mid
    counts = _pack(costs, chunks, hi, first_extra, last_extra)
    if counts is None:  # the greedy's running sums came out an ulp above the total (random costs: ~2 in 1,000)
        counts = _pack(costs, chunks, hi * (1 + 1e-12), first_extra, last_extra)
    assert counts is not None  # hi is always feasible (internal invariant, not user input)
    if prefer is not None and len(prefer) == chunks and sum(prefer) == n and min(prefer) >= 1 and (
            max_chunk_cost(costs, prefer, first_extra, last_extra)
            <= max_chunk_cost(costs, counts, first_extra, last_extra) * (1 + 1e-9)):
        return list(prefer)
    return counts
