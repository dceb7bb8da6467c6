"""How a pipeline splits a layer graph into chunks: even layer counts, or balanced by cost.

``parallelism.pp_split: even`` (the default) gives every chunk the same number of layers
(:func:`~simulator.strategies.spmd.layout.chunk_layer_counts`: Megatron-LM's split, with
``first_stage_layers`` / ``last_stage_layers``). ``balanced`` cuts the graph's pipelined layers
into contiguous chunks that minimise the schedule's own step estimate
(:func:`~simulator.strategies.spmd.pipeline_estimate.step_estimate_s`: the critical path of the
GPipe / 1F1B / interleaved order over each chunk's forward and backward seconds and each cut's
send), each layer priced as the kernel seconds of its forward, backward and recompute on the
scenario's accelerator, the prologue (embedding) counted on the first chunk and the epilogue
(loss/head) on the last, a cut's send as the bytes of every tensor crossing it (activations
forward, their gradients back) over the link between the two stages.

Minimising the slowest chunk (the linear-partition problem, :func:`balanced_split`; PipeDream's
planner, Narayanan et al. 2019 Sec. 3.1, solves its general form by dynamic programming) is right
when micro-batches far outnumber stages (m >> p: the step tends to m times the slowest stage). At
few micro-batches the fill and drain weigh as much, and a cut that loads the first stage more can
be faster: ResNet-50, dp 4 pp 2, 2 micro-batches of 256, slowest-stage cut [61, 114] 10,680.5
images/s against the even [87, 88] 11,542.5 and the estimate's [82, 93] 11,665.0. So the cut is
chosen on the estimate: the even cut and the slowest-stage cut are candidates, then boundaries
move one at a time while the estimate falls (every cut tried where there are two chunks). The
even cut is kept unless another is faster by the estimate (1e-9 relative), so a uniform
transformer stack stays on the even cut; :func:`split_choice` says which it took and the three
estimates, and ``clustersim simulate`` prints them on the layers/stage line.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from simulator.cost.compute import ComputeModel
from simulator.errors import ConfigError
from simulator.strategies.spmd.layout import chunk_layer_counts
from simulator.strategies.spmd.pipeline_estimate import step_estimate_s
from workloads.layer_graph import Layer, LayerGraph

_BALANCED: dict[tuple, tuple[LayerGraph, object, SplitChoice]] = {}
_BALANCED_KEPT = 4096
# each layer's pass seconds per graph, accelerator, precision and recompute: the layouts of a search
# that differ in their layout alone (tp aside, which makes another graph) price them once
_PASS_COSTS: dict[tuple, tuple[LayerGraph, object, tuple]] = {}
# A cut replaces the even one only if the estimate puts it this much ahead: the estimate ranks cuts
# to ~0.4% of the engine (ResNet-50 pp 2 on 8 A100s, 17 cuts 6 layers apart: engine / estimate
# 1.210-1.215, the sync-jitter stretch and the data-parallel tail it leaves out), so a smaller lead
# is not told apart from the even cut (GPT-3 175B, tp 1 pp 2, 3 micro-batches: [49, 47] leads by
# 0.16% in the estimate and 0.02% in the engine).
_MARGIN = 0.005
# The local search's budget, in passes placed by the estimates (2·chunks·micro-batches each): ~20 ms
# of CPU, so that a search's bound, which asks for every balanced layout's cut, stays cheap; a long
# pipeline (many chunks x micro-batches) gets a few moves (at least 4 cuts tried), not a full descent.
_PLACEMENTS = 40_000


@dataclass(frozen=True)
class SplitChoice:
    """What ``pp_split: balanced`` chose: ``counts`` (pipelined layers per global chunk) and
    the schedule estimate (seconds of the pipeline's passes and sends, no data-parallel tail) of
    it, of the even cut and of the cut minimising the slowest chunk."""

    counts: tuple[int, ...]
    estimate_s: float
    even: tuple[int, ...]
    even_estimate_s: float
    slowest_stage_cut: tuple[int, ...]
    slowest_stage_estimate_s: float

    @property
    def is_even(self) -> bool:
        return self.counts == self.even

    def describe(self) -> str:
        return describe_split(self.to_dict())

    def to_dict(self) -> dict:
        return {"counts": list(self.counts), "estimate_s": self.estimate_s, "even": list(self.even),
                "even_estimate_s": self.even_estimate_s, "slowest_stage_cut": list(self.slowest_stage_cut),
                "slowest_stage_estimate_s": self.slowest_stage_estimate_s}


def describe_split(choice: dict) -> str:
    """One phrase for the layers/stage line from :meth:`SplitChoice.to_dict`: the cut taken and how
    much faster the schedule estimate (kernel seconds of the passes and sends) puts it than the even
    cut -- or, where the even cut won, than the slowest-stage cut."""
    even, cut, slowest = choice["even"], choice["counts"], choice["slowest_stage_cut"]
    if cut == even:
        if slowest == even:
            return "balanced: the even cut, fastest by the schedule estimate"
        lead = 1 - choice["even_estimate_s"] / choice["slowest_stage_estimate_s"]
        return (f"balanced: the even cut, {100 * lead:.1f}% faster by the schedule estimate than the "
                f"slowest-stage cut {slowest}")
    lead = 1 - choice["estimate_s"] / choice["even_estimate_s"]
    return f"balanced: {100 * lead:.1f}% faster by the schedule estimate than the even cut {even}"


def chunk_counts(scenario, graph: LayerGraph) -> list[int]:
    """Pipelined layers per global chunk (chunk c of pipeline rank i is c·pp + i); ``scenario.pipeline_cut``
    where the caller fixed it (:func:`simulator.strategies.spmd.fast._with_micro_batches`)."""
    if getattr(scenario, "pipeline_cut", None) is not None:
        return list(scenario.pipeline_cut)
    par = scenario.parallelism
    if getattr(par, "pp_split", "even") == "even" or par.pp * par.virtual_stages == 1:
        return chunk_layer_counts(par, len(graph.pipelined))
    return list(split_choice(scenario, graph).counts)


def split_choice(scenario, graph: LayerGraph) -> SplitChoice:
    """The balanced split of ``scenario``'s pipeline (module docstring). Kept per graph (one per
    micro-batch size), accelerator, precision, recompute, layout and schedule: the memory model,
    the search's bound and the planner of one layout, and the layouts of a search that differ in
    nothing the estimate reads (ZeRO, overlap), ask for the same one."""
    par = scenario.parallelism
    t = scenario.training
    key = (id(graph), id(scenario.accelerator), repr((t.precision, t.fp8_gemms, t.fp8_recipe, t.tf32)),
           par.recompute_mode, par.tp, par.cp, par.dp, par.pp, par.virtual_stages, par.schedule, par.num_micro_batches,
           id(scenario.node), scenario.num_gpus)
    hit = _BALANCED.get(key)
    if hit is not None and hit[0] is graph and hit[1] is scenario.accelerator:
        return hit[2]
    costs_key = (id(graph), id(scenario.accelerator), key[2], par.recompute_mode)
    costs_hit = _PASS_COSTS.get(costs_key)
    if costs_hit is None or costs_hit[0] is not graph or costs_hit[1] is not scenario.accelerator:
        if len(_PASS_COSTS) >= _BALANCED_KEPT:
            _PASS_COSTS.clear()
        costs_hit = _PASS_COSTS[costs_key] = (graph, scenario.accelerator,
                                              layer_pass_costs(scenario, graph, par.recompute_mode))
    forward, backward, (first_f, first_b), (last_f, last_b) = costs_hit[2]
    chunks = par.pp * par.virtual_stages
    n = len(forward)
    if chunks > n:
        raise ConfigError("parallelism.pp", f"cannot split {n} layers into {chunks} chunks")
    even = tuple(chunk_layer_counts(par, n))
    cost = [f + b for f, b in zip(forward, backward, strict=True)]
    slowest = tuple(balanced_split(cost, chunks, first_f + first_b, last_f + last_b))
    fwd_prefix = [0.0, *accumulate(forward)]
    bwd_prefix = [0.0, *accumulate(backward)]
    crossing = crossing_bytes(graph)
    send_s = _send_pricer(scenario)
    memo: dict[tuple[int, ...], float] = {}

    def estimate(counts: tuple[int, ...]) -> float:
        got = memo.get(counts)
        if got is None:
            starts = [0, *accumulate(counts)]
            f = [fwd_prefix[starts[c + 1]] - fwd_prefix[starts[c]] for c in range(chunks)]
            b = [bwd_prefix[starts[c + 1]] - bwd_prefix[starts[c]] for c in range(chunks)]
            f[0] += first_f
            b[0] += first_b
            f[-1] += last_f
            b[-1] += last_b
            sends = [send_s(c, crossing[graph.prologue + starts[c + 1]] / par.tp) for c in range(chunks - 1)]
            got = memo[counts] = step_estimate_s(par.schedule, par.num_micro_batches, par.pp, par.virtual_stages,
                                                 f, b, sends)
        return got

    best = min((even, slowest), key=lambda c: (estimate(c), c != even))
    best = _descend(best, estimate, max(4, _PLACEMENTS // (2 * chunks * par.num_micro_batches)))
    if estimate(best) > estimate(even) * (1 - _MARGIN):
        best = even
    choice = SplitChoice(best, estimate(best), even, estimate(even), slowest, estimate(slowest))
    if len(_BALANCED) >= _BALANCED_KEPT:
        _BALANCED.clear()
    _BALANCED[key] = (graph, scenario.accelerator, choice)
    return choice


def _descend(counts: tuple[int, ...], estimate, budget: int) -> tuple[int, ...]:
    """Move one boundary at a time (by 8, 4, 2, then 1 layers) while the estimate falls, trying at
    most ``budget`` cuts."""
    best = counts
    for step in (8, 4, 2, 1):
        improved = True
        while improved and budget > 0:
            improved = False
            for c in range(len(best) - 1):
                for delta in (step, -step):
                    moved = list(best)
                    moved[c] += delta
                    moved[c + 1] -= delta
                    if min(moved[c], moved[c + 1]) < 1 or budget <= 0:
                        continue
                    budget -= 1
                    if estimate(tuple(moved)) < estimate(best) * (1 - 1e-9):
                        best, improved = tuple(moved), True
    return best


def crossing_bytes(graph: LayerGraph) -> list[float]:
    """``out[k]``: bytes per micro-batch of every tensor made by a layer before index ``k`` of
    ``graph.layers`` and read at or after it (a chain: one layer's output; a residual network cut
    inside a block: the skip tensor too), as the simulation sends them
    (:meth:`simulator.strategies.spmd.plan.Planner._pp_payload`)."""
    layers = graph.layers
    index = {layer.name: i for i, layer in enumerate(layers)}
    last_use = list(range(len(layers)))
    for i, layer in enumerate(layers):
        for name in layer.inputs:
            if name in index:
                last_use[index[name]] = max(last_use[index[name]], i)
    delta = [0.0] * (len(layers) + 2)
    for i, layer in enumerate(layers):
        if last_use[i] > i:
            delta[i + 1] += layer.output_bytes
            delta[last_use[i] + 1] -= layer.output_bytes
    return list(accumulate(delta))[:len(layers) + 1]


def _send_pricer(scenario):
    """Seconds of one send across the cut after global chunk ``c`` (from pipeline rank c mod pp to the
    next), alone on its link, as :meth:`simulator.strategies.spmd.plan.Planner.send_task` prices it
    (the first data-parallel replica's ranks; a wide-area route at its NICs, without the delay)."""
    from simulator.cost.topology import Coordinates, RankLayout, build_topology

    par = scenario.parallelism
    layout = RankLayout(par)
    groups = [(g.node, g.num_gpus) for g in scenario.groups] if scenario.mixed else None
    topo = build_topology(scenario.node, scenario.fabric, scenario.num_gpus, groups=groups)
    priced: dict[tuple[int, float], float] = {}

    def send_s(c: int, nbytes: float) -> float:
        key = (c % par.pp, nbytes)
        if key not in priced:
            src = layout.rank(Coordinates(0, 0, 0, c % par.pp))
            dst = layout.rank(Coordinates(0, 0, 0, (c + 1) % par.pp))
            links = topo.links_for((src, dst))
            if nbytes <= 0:
                priced[key] = 0.0
            elif topo.node_of(src) == topo.node_of(dst):
                priced[key] = links.intra_latency_s + nbytes * topo.intra_slowdown((src, dst)) / links.intra_bytes_per_s
            else:
                priced[key] = links.inter_latency_s + nbytes / links.inter_bytes_per_s
        return priced[key]

    return send_s


def layer_pass_costs(scenario, graph: LayerGraph, recompute: str):
    """Each pipelined layer's forward and backward kernel seconds (the backward with the
    ``recompute`` re-run) on the scenario's accelerator, and the prologue's and epilogue's
    (forward, backward): ``(forward, backward, first, last)``."""
    compute = ComputeModel(scenario.accelerator, scenario.training.precision, scenario.training.fp8_gemms,
                           scenario.training.fp8_recipe, tf32=scenario.training.tf32)

    def passes(layers: tuple[Layer, ...]) -> tuple[float, float]:
        return (sum(compute.ops_time_s(layer.forward) for layer in layers),
                sum(compute.ops_time_s(layer.backward) + compute.ops_time_s(layer.recompute_ops(recompute))
                    for layer in layers))

    each = [passes((layer,)) for layer in graph.pipelined]
    return ([f for f, _ in each], [b for _, b in each], passes(graph.layers[:graph.prologue]),
            passes(graph.layers[len(graph.layers) - graph.epilogue:]))


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
