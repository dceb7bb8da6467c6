"""The adaptive per-component planner (``clustersim plan SCENARIO --planner adaptive``): a
parallelism chosen for each component of the network separately, with the simulator as the
cost oracle, re-chosen where the cost model says the best choice moves with the batch or the
cluster.

**What this follows.** Issue 22 names "the adaptive per-component choice of Baligodugula &
Amsaad 2025". That paper was not reachable from here (no network): this planner is built from
the issue's description, *not from the paper's text*, and may differ from it in any detail. What
it does, exactly:

1. The layer graph is cut into components (:func:`.components.find_components`: the embedding,
   each attention block, each MLP block, each convolution stage of one resolution, recurrent
   layers, the classifier/head).
2. Each component may take any :class:`.components.Choice`: data parallel over all GPUs or a
   burst on fewer, tensor parallel (column splits) or Megatron column/row pairs at every
   data × model factorisation of the GPU count, a spatial grid for convolution stages, or
   ``per_layer``: PaSE's exact dynamic program over the component's own layers. (As a uniform
   choice, ``per_layer`` for every component is solved jointly: PaSE over the whole graph.)
3. Costs are the per_layer kind's prices on the topology (:mod:`simulator.strategies.per_layer.cost`,
   the functions the simulation itself uses): a component under a choice costs its layers'
   kernels, halos and weight-gradient all-reduces plus the reshards between its own layers; two
   components cost the reshards of every activation that crosses from one to the other (forward
   collective and its backward adjoint). The choice of every component is found together, by
   an exact dynamic program over the component graph (:mod:`.pase_dp`, PaSE's algorithm one level
   up: the vertices are components), so a component's choice accounts for its neighbours'.
   The dynamic program runs twice, with the weight-gradient all-reduces priced serially and as
   hidden behind the backward (the simulation overlaps them: the truth lies between); both
   plans are simulated and the faster kept.
4. ``pipeline``, a choice for the network as a whole (:mod:`.component_pipeline`): a pipeline
   overlaps components on disjoint GPUs across micro-batches, which the per_layer kind (one
   timeline for every layer) cannot express beside per-component splits, so the components are
   assigned to S contiguous stages of p/S data-parallel GPUs each (cut at component boundaries,
   DAPPLE's latency model to rank, the ``replicated_pipeline`` kind to simulate; S = 1 is data
   parallelism with ZeRO-1 on offer).
5. The per-component plan, every *uniform* plan (one choice for all components; where a
   component cannot take it: data parallel) and the best pipelines are simulated by the engine;
   the fastest that fits is returned, so the plan is never slower in simulation than the best
   uniform choice (the summary says when a uniform plan or a pipeline won).
6. Adaptivity: with ``batches`` and/or ``gpus`` options the choice of every component is
   re-solved at each of those global batches and GPU counts (priced, not simulated), and the
   planner reports which components change their choice, and to what.

Memory: the pipeline candidates are checked by the memory model before they are simulated, best
estimate first (:func:`.component_pipeline.pick_to_simulate`: the ``replicated_pipeline`` kind's memory
against HBM, the check the engine run would make first), and those that cannot run are pruned and
counted in the plan's header, so each stage count's simulations go to plans that can run.

Not done: a pipeline whose stages split their components other than by data parallelism (no
strategy kind holds both), pipelines re-chosen at other batches and GPU counts (the ``batches``
and ``gpus`` report covers the per-component choices), memory as a constraint of the per-component
dynamic program (a plan that does not fit is reported with the reason, as PaSE's planner does; a model
state that no choice can hold on one GPU is refused before planning, :mod:`.model_state`).
"""

from __future__ import annotations

import copy
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
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
from simulator.explore.planners.component_pipeline import (
    pick_to_simulate,
    pipeline_candidates,
    stage_of_components,
)
from simulator.explore.planners.components import (
    CHOICE_NAMES,
    Choice,
    Component,
    choices_for,
    component_splits,
    find_components,
)
from simulator.explore.planners.dapple import _stage_of
from simulator.explore.planners.model_state import (
    per_layer_least_bytes,
    pipeline_least_bytes,
    refuse_unless_state_fits,
    replica_state_bytes,
    weight_shards,
)
from simulator.explore.planners.oracle import (
    Oracle,
    dropped_recompute_notes,
    per_layer_pricer,
    with_per_layer,
)
from simulator.explore.planners.pase import layer_configs
from simulator.explore.planners.pase_dp import min_cost_assignment
from simulator.strategies.per_layer.config import Split, strategy_block
from simulator.strategies.per_layer.sharding import CHANNEL_MIXING, edge_shape

OPTIONS = {
    "choices": "choices a component may take, comma separated (default data,tensor,megatron,spatial,per_layer,"
               "pipeline)",
    "max_stages": "most pipeline stages of the pipeline choice (default 4)",
    "batches": "global batches at which to re-choose and report what changes, comma separated (default none)",
    "gpus": "GPU counts at which to re-choose and report what changes, comma separated (default none)",
}
#: Dimensions the ``per_layer`` choice's dynamic program may cut a layer along (PaSE's default
#: and the heads; spatial grids are the ``spatial`` choice's).
PER_LAYER_DIMS = ("batch", "channels", "heads", "reduction")


@dataclass
class ComponentPlan:
    """The choice of every component at one batch and GPU count: ``labels`` and ``splits`` per
    component, the layers' ``splits`` in graph order, the priced ``objective_s`` (the dynamic
    program's sum), and each uniform choice's priced objective (``uniform``: label -> (seconds,
    layer splits))."""

    components: list[Component]
    labels: list[str]
    splits: list[Split]
    objective_s: float
    component_s: list[float]
    uniform: dict[str, tuple[float, list[Split]]]
    priced: int
    num_gpus: int
    batch: int
    options_per_component: list[int] = field(default_factory=list)


def layer_content(layer) -> Any:
    """What the per_layer kind's prices and splits of ``layer`` depend on: the layer without its
    name and inputs (its ops, shapes, parameters, kinds), so that the 126 blocks of Llama-3-405B are
    one layer to price. Exact: the pricer reads a layer's name only to find a profiled layer's
    measured time at another batch (kept here for such a layer), and op names stay (their
    suffixes pick kernels: ``.dgrad``, ``out_proj``, GEMM classes). Layers of the catalog's and
    traced networks name their ops after themselves, so each stays its own."""
    if layer.measured_forward_s is not None or layer.measured_backward_s is not None:
        return layer
    return replace(layer, name="", inputs=())


def _content_ids(layers) -> list[int]:
    """Each layer's content (:func:`layer_content`) as a small integer: equal for equal contents
    (hashed once here, not at every lookup)."""
    ids: dict = {}
    return [ids.setdefault(layer_content(layer), len(ids)) for layer in layers]


class _Prices:
    """Memoized layer and reshard prices of one scenario, with a count of what was priced; views
    for the two cost models (:meth:`bound`) share the memo. A layer is priced once per content
    (:func:`layer_content`) and split, not once per position: the cost grows with the distinct
    layers and choices, not with the depth of a uniform stack."""

    def __init__(self, prices, hidden_gradients: bool = False, shared: _Prices | None = None):
        self.p = prices
        self.layers = prices.graph.layers
        self.hidden_gradients = hidden_gradients
        self.content: list[int] = shared.content if shared else _content_ids(self.layers)
        self._layer: dict = shared._layer if shared else {}
        self._edge: dict = shared._edge if shared else {}
        self._count: list[int] = shared._count if shared else [0]
        self.components: dict = shared.components if shared else {}  # see choose_on: options per component content

    def bound(self, hidden_gradients: bool) -> _Prices:
        return _Prices(self.p, hidden_gradients, self)

    @property
    def priced(self) -> int:
        return self._count[0]

    def layer_s(self, index: int, split: Split) -> float:
        key = (self.content[index], split)
        cost = self._layer.get(key)
        if cost is None:
            self._count[0] += 1
            cost = self._layer[key] = self.p.layer_cost(self.layers[index], split)
        return cost.total_s - (cost.gradient_reduce_s if self.hidden_gradients else 0.0)

    def reshard_s(self, u: int, v: int, a: Split, b: Split) -> float:
        producer, consumer = self.layers[u], self.layers[v]
        # what the reshard depends on (sharding.output_layout / input_layout): the producer is an
        # attention layer or not, the tensor's shape, the consumer mixes channels or not
        key = (producer.kind == "attention", edge_shape(producer, self.p.batch, self.p.elem_bytes),
               consumer.kind in CHANNEL_MIXING, a, b)
        hit = self._edge.get(key)
        if hit is None:
            self._count[0] += 1
            hit = self._edge[key] = self.p.reshard(producer, a, consumer, b).total_s
        return hit


def _edges(graph) -> list[tuple[int, int]]:
    index = {layer.name: i for i, layer in enumerate(graph.layers)}
    return [(index[u], v) for v, layer in enumerate(graph.layers) for u in dict.fromkeys(layer.inputs) if u in index]


def _per_layer_splits(graph, prices: _Prices, comp: Component, edges, batch: int, p: int) -> tuple[Split, ...] | None:
    """PaSE's dynamic program over the component's own layers (configurations over all p GPUs)."""
    configs = {i: layer_configs(graph.layers[i], batch, p, PER_LAYER_DIMS) for i in comp.indices}
    if any(not c for c in configs.values()):
        return None
    inner = [(u, v) for u, v in edges if comp.first <= u and v <= comp.last]
    result = min_cost_assignment(list(comp.indices), inner, configs.get, prices.layer_s, prices.reshard_s)
    return tuple(result.assignment[i] for i in comp.indices)


def choose(raw: dict[str, Any], names: tuple[str, ...], hidden_gradients: bool = False) -> ComponentPlan:
    """Every component's choice at the scenario's batch and GPU count (see the module docstring),
    and the priced cost of every uniform choice. ``hidden_gradients``: price the weight-gradient
    all-reduces as hidden behind the backward (the simulation overlaps them; the truth lies
    between this bound and the serial sum)."""
    scenario, pricer = per_layer_pricer(raw)
    return choose_on(scenario, pricer, names, hidden_gradients)


def choose_on(scenario, pricer, names: tuple[str, ...], hidden_gradients: bool = False,
              prices: _Prices | None = None) -> ComponentPlan:
    """:func:`choose` on a built scenario and its per_layer pricer (``prices``: a memo to share)."""
    prices = (prices or _Prices(pricer)).bound(hidden_gradients)
    graph, batch, p = pricer.graph, pricer.batch, scenario.num_gpus
    comps = find_components(graph)
    edges = _edges(graph)
    comp_of = {i: k for k, c in enumerate(comps) for i in c.indices}
    candidates = [c for c in choices_for(p, names) if c.name != "per_layer"]
    options: list[list[tuple[Choice, tuple[Split, ...]]]] = []
    for comp in comps:
        # a component's options depend on its layers' contents and its inner edges, not on where it
        # sits: found once for the components alike (a uniform stack's blocks), in the same order
        content = (tuple(prices.content[i] for i in comp.indices),
                   tuple((u - comp.first, v - comp.first) for u, v in edges if comp.first <= u and v <= comp.last),
                   names, batch, p, prices.hidden_gradients)  # the per_layer choice's DP prices by the bound
        found = prices.components.get(content)
        if found is None:
            seen: dict[tuple[Split, ...], Choice] = {}
            for choice in candidates:
                splits = component_splits(graph, comp, choice, batch, p)
                if splits is not None and splits not in seen:
                    seen[splits] = choice
            if "per_layer" in names:
                splits = _per_layer_splits(graph, prices, comp, edges, batch, p)
                if splits is not None and splits not in seen:
                    seen[splits] = Choice("per_layer")
            found = prices.components[content] = [(choice, splits) for splits, choice in seen.items()]
        if not found:
            raise ConfigError("parallelism.global_batch_size",
                              f"component {comp.name} (layers {comp.first}-{comp.last}) has no choice among "
                              f"{', '.join(names)} on {p} GPUs at global batch {batch}")
        options.append(found)
    inner = {k: [(u, v) for u, v in edges if comp_of[u] == comp_of[v] == k] for k in range(len(comps))}
    crossing: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for u, v in edges:
        if comp_of[u] != comp_of[v]:
            crossing.setdefault((comp_of[u], comp_of[v]), []).append((u, v))

    def vertex_cost(k: int, option: int) -> float:
        splits = options[k][option][1]
        first = comps[k].first
        return (sum(prices.layer_s(i, s) for i, s in zip(comps[k].indices, splits, strict=True))
                + sum(prices.reshard_s(u, v, splits[u - first], splits[v - first]) for u, v in inner[k]))

    def edge_cost(ka: int, kb: int, a: int, b: int) -> float:
        sa, sb = options[ka][a][1], options[kb][b][1]
        fa, fb = comps[ka].first, comps[kb].first
        return sum(prices.reshard_s(u, v, sa[u - fa], sb[v - fb]) for u, v in crossing[ka, kb])

    order = list(range(len(comps)))
    result = min_cost_assignment(order, list(crossing), lambda k: range(len(options[k])), vertex_cost, edge_cost)
    picks = [result.assignment[k] for k in order]
    splits = [s for k in order for s in options[k][picks[k]][1]]
    uniform: dict[str, tuple[float, list[Split]]] = {}
    for choice in choices_for(p, names):
        assigned = []
        for k in order:
            match = [i for i, (c, _) in enumerate(options[k]) if c == choice]
            fallback = [i for i, (c, _) in enumerate(options[k]) if c == Choice("data", data=p)]
            if not match and not fallback:
                break
            assigned.append((match or fallback)[0])
        else:
            total = (sum(vertex_cost(k, assigned[k]) for k in order)
                     + sum(edge_cost(ka, kb, assigned[ka], assigned[kb]) for ka, kb in crossing))
            uniform[choice.label()] = (total, [s for k in order for s in options[k][assigned[k]][1]])
    if "per_layer" in names:  # every component split per layer, solved jointly: PaSE over the whole graph
        configs = {i: layer_configs(layer, batch, p, PER_LAYER_DIMS) for i, layer in enumerate(graph.layers)}
        if all(configs.values()):
            whole = min_cost_assignment(list(range(len(graph.layers))), edges, configs.get, prices.layer_s,
                                        prices.reshard_s)
            uniform["per_layer"] = (whole.cost, [whole.assignment[i] for i in range(len(graph.layers))])
    return ComponentPlan(comps, [options[k][picks[k]][0].label() for k in order], splits, result.cost,
                         [vertex_cost(k, picks[k]) for k in order], uniform, prices.priced, p, batch,
                         [len(o) for o in options])


def _int_list(options: dict[str, Any], key: str) -> list[int]:
    value = options.get(key)
    if value is None:
        return []
    items = value if isinstance(value, list) else str(value).replace(" ", "").split(",")
    out = []
    for item in items:
        try:
            number = int(item)
        except (TypeError, ValueError):
            number = 0
        if isinstance(item, bool) or number < 1 or str(number) != str(item).strip():
            raise ConfigError(f"--option {key}", f"expected positive integers separated by commas, got {value!r}")
        out.append(number)
    return out


def _with(raw: dict[str, Any], strategy: dict[str, Any] | None = None, batch: int | None = None,
          gpus: int | None = None) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    if strategy is not None:
        out["strategy"] = strategy
    if batch is not None or gpus is not None:
        par = dict(out.get("parallelism") or {})
        par.pop("micro_batch_size", None)  # the layout check's; per_layer splits the global batch itself
        if batch is not None:
            par["global_batch_size"] = batch
        out["parallelism"] = par
    if gpus is not None:
        out.setdefault("cluster", {})["num_gpus"] = gpus
    return out


def family_summary(plan: ComponentPlan) -> str:
    """``family ×n: choice (count), ...`` for every family of components, in graph order."""
    by_family: dict[str, Counter] = {}
    for comp, label in zip(plan.components, plan.labels, strict=True):
        by_family.setdefault(comp.family, Counter())[label] += 1
    parts = []
    for family, labels in by_family.items():
        total = sum(labels.values())
        text = ", ".join(f"{label}" + (f" ({n})" if len(labels) > 1 else "") for label, n in labels.most_common())
        parts.append(f"{family}{f' x{total}' if total > 1 else ''}: {text}")
    return "; ".join(parts)


def changes(base: ComponentPlan, other: ComponentPlan) -> dict[str, tuple[str, str]]:
    """Components whose choice differs between two settings: name -> (base label, other label)."""
    return {c.name: (a, b) for c, a, b in zip(base.components, base.labels, other.labels, strict=True) if a != b}


#: The two cost models the dynamic program runs with: gradient all-reduces serial, or hidden.
BOUNDS = {"serial": False, "hidden": True}
#: Every choice the planner knows: the per-component ones and the whole-network pipeline.
ALL_CHOICES = (*CHOICE_NAMES, "pipeline")
#: Pipeline plans simulated per stage count (best DAPPLE estimates first).
PIPELINES_PER_STAGE_COUNT = 2


def _refuse_unless_state_fits(scenario, pricer, names: tuple[str, ...], pipeline: bool, max_stages: int) -> None:
    """Refuse before planning when no plan of the planner's choices holds the model state on one GPU
    (:mod:`.model_state`): per-layer choices shard a layer's weights at most as its PaSE configurations
    over all GPUs do (``tensor``, ``megatron`` and ``per_layer`` cut channels, heads or the reduction;
    ``data`` and ``spatial`` replicate them), a pipeline spreads them over its stages with ZeRO-1."""
    graph, batch, p = pricer.graph, pricer.batch, scenario.num_gpus
    if {"tensor", "megatron", "per_layer"} & set(names):
        def most(layer) -> int:
            return max((weight_shards(s) for s in layer_configs(layer, batch, p, PER_LAYER_DIMS)), default=1)
    else:
        def most(layer) -> int:
            return 1
    least = per_layer_least_bytes(scenario, graph, most)
    space = f"choices {', '.join(names)}"
    if pipeline:
        stages = min(max_stages, len(find_components(graph)), p)
        least = min(least, pipeline_least_bytes(scenario, graph, stages, p))
        space += f", pipelines of at most {stages} stages with ZeRO-1"
    refuse_unless_state_fits(scenario, graph, least, "adaptive", space)


def run_adaptive(raw: dict[str, Any], options: dict[str, Any]) -> PlanResult:
    check_options(ADAPTIVE, options)
    wanted = list_option(options, "choices", ALL_CHOICES, ALL_CHOICES, "choice")
    names = tuple(n for n in wanted if n != "pipeline")
    if not names:
        raise ConfigError("--option choices", f"give at least one per-component choice ({', '.join(CHOICE_NAMES)})")
    batches, gpus = _int_list(options, "batches"), _int_list(options, "gpus")
    max_stages = int_option(options, "max_stages", 4)
    started = time.perf_counter()
    scenario, pricer = per_layer_pricer(raw)
    _refuse_unless_state_fits(scenario, pricer, names, "pipeline" in wanted, max_stages)
    shared = _Prices(pricer)
    plans = {bound: choose_on(scenario, pricer, names, hidden, shared) for bound, hidden in BOUNDS.items()}
    oracle = Oracle()
    by_splits: dict[tuple[Split, ...], Any] = {}  # identical plans are simulated once

    def simulated(splits: list[Split]):
        if tuple(splits) not in by_splits:
            by_splits[tuple(splits)] = oracle.evaluate(with_per_layer(raw, strategy_block(splits)))
        return by_splits[tuple(splits)]

    chosen = {bound: simulated(plan.splits) for bound, plan in plans.items()}
    serial = plans["serial"]
    uniform = {label: simulated(splits) for label, (_, splits) in sorted(serial.uniform.items(),
                                                                          key=lambda item: item[1][0])}
    pipelines, pipelines_estimated, pruned = {}, 0, []
    if "pipeline" in wanted:
        candidates, pipelines_estimated = pipeline_candidates(raw, serial.components, max_stages)
        picked, pruned = pick_to_simulate(candidates, PIPELINES_PER_STAGE_COUNT, raw)
        for candidate in picked:
            pipelines[candidate.label()] = (candidate, oracle.evaluate(candidate.raw(raw)))
            uniform[candidate.label()] = pipelines[candidate.label()][1]
    fits = lambda e: e.step_time_s if e.fits else math.inf  # noqa: E731
    bound = min(chosen, key=lambda b: fits(chosen[b]))
    plan = plans[bound]
    best_uniform = min(uniform, key=lambda k: fits(uniform[k])) if uniform else None
    if best_uniform is not None and fits(uniform[best_uniform]) < fits(chosen[bound]):
        returned, best = best_uniform, uniform[best_uniform]
    else:
        returned, best = "adaptive", chosen[bound]
    summary = f"adaptive per-component: {len(plan.components)} components; {family_summary(plan)}"
    if returned in pipelines:
        stages = stage_of_components(pipelines[returned][0], plan.components)
        summary = (f"adaptive per-component: {len(plan.components)} components, the pipeline choice: {returned}, "
                   f"stages of {[s['layers'] for s in best.raw['strategy']['stages']]} layers "
                   f"(components {_stage_ranges(stages)})")
    notes = [f"cost model: gradient all-reduces {'hidden behind the backward' if plan is plans['hidden'] else 'serial'}"
             f" (the bound that simulated faster); priced objective {plan.objective_s:.6g} s, simulated "
             + (f"{chosen[bound].step_time_s:.6g} s" if chosen[bound].fits else f"cannot run ({chosen[bound].reason})")]
    if best_uniform is not None:
        notes.append(f"best uniform choice simulated: {best_uniform} "
                     + (f"{uniform[best_uniform].step_time_s:.6g} s" if uniform[best_uniform].fits
                        else f"cannot run ({uniform[best_uniform].reason})"))
    if returned != "adaptive":
        notes.append(f"the per-component choice ({family_summary(plan)}) simulated slower: the uniform {returned} "
                     "is returned")
    by_memory = sum(1 for _, (why, _) in pruned if why == "memory")
    if pruned:
        last, (_, last_reason) = pruned[-1]
        notes.append(f"pipelines: {by_memory} pruned by the memory model"
                     + (f" and {len(pruned) - by_memory} refused by the scenario check" if len(pruned) > by_memory else "")
                     + f" before simulating (best estimate first, of the {pipelines_estimated} estimated; "
                     f"{len(pipelines)} simulated); the last pruned, {last.label()}: "
                     f"{_stage_of(last_reason, len(last.replicas))}")
    re_chosen = []
    for what, values in (("batch", batches), ("gpus", gpus)):
        for value in values:
            setting = _with(raw, batch=value if what == "batch" else None, gpus=value if what == "gpus" else None)
            try:
                other = choose(setting, names, BOUNDS[bound])
            except ConfigError as exc:
                re_chosen.append({"setting": {what: value}, "reason": str(exc)})
                notes.append(f"at {what} {value}: no plan ({exc})")
                continue
            moved = changes(plan, other)
            re_chosen.append({"setting": {what: value}, "objective_s": other.objective_s,
                              "choices": dict(zip([c.name for c in other.components], other.labels, strict=True)),
                              "changed": {k: list(v) for k, v in moved.items()}})
            notes.append(f"at {what} {value}: " + (_describe_changes(moved) if moved else "no component changes"))
    details = {
        "components": [{"name": c.name, "layers": [c.first, c.last], "choice": label, "priced_s": cost,
                        "choices_offered": n}
                       for c, label, cost, n in zip(plan.components, plan.labels, plan.component_s,
                                                    plan.options_per_component, strict=True)],
        "cost_model": bound,
        "objective_s": {b: p.objective_s for b, p in plans.items()},
        "adaptive_step_s": {b: e.step_time_s for b, e in chosen.items()},
        "uniform": {k: {"priced_s": serial.uniform[k][0] if k in serial.uniform else None,
                        "simulated_step_s": e.step_time_s, "reason": e.reason} for k, e in uniform.items()},
        "pipeline": {k: {"estimated_s": c.estimate_s, "simulated_step_s": e.step_time_s, "reason": e.reason,
                         "stage_of_component": stage_of_components(c, serial.components)}
                     for k, (c, e) in pipelines.items()},
        "pipelines_estimated": pipelines_estimated,
        "pipelines_pruned_by_memory": by_memory,
        "pipelines_pruned_invalid": len(pruned) - by_memory,
        "returned": returned, "best_uniform": best_uniform, "re_chosen": re_chosen,
    }
    if not best.fits:  # as PaSE's planner says it: the search has no memory term
        state = replica_state_bytes(scenario, pricer.graph) / 2**30
        notes.insert(0, f"no plan the adaptive planner simulated fits on this cluster ({oracle.simulated} simulated; "
                        "its per-component cost model ignores memory"
                        + (f", {by_memory} pipelines pruned by memory before simulating" if by_memory else "")
                        + f"; the model state is {state:.1f} GiB a replica): "
                        "`clustersim search` (tensor/pipeline parallel, ZeRO) prunes layouts by memory")
    return PlanResult("adaptive", best.raw, best.step_time_s, best.samples_per_s, time.perf_counter() - started,
                      shared.priced + pipelines_estimated, oracle.simulated, summary,
                      details, estimated_what="layer and reshard costs and pipelines priced", reason=best.reason,
                      notes=[*dropped_recompute_notes(raw, best.raw), *notes])


def _stage_ranges(stages: dict[str, int]) -> str:
    """``0: embedding.0-mlp.11, 1: attention.12-head.0``: the first and last component of each stage."""
    by_stage: dict[int, list[str]] = {}
    for name, stage in stages.items():
        by_stage.setdefault(stage, []).append(name)
    return ", ".join(f"{k}: {v[0]}" + (f"-{v[-1]}" if len(v) > 1 else "") for k, v in sorted(by_stage.items()))


def _describe_changes(moved: dict[str, tuple[str, str]]) -> str:
    """``attention x23, mlp x24: data 4 -> data 8; ...``: the changes grouped by what changed."""
    grouped: dict[tuple[str, str], Counter] = {}
    for name, pair in moved.items():
        grouped.setdefault(pair, Counter())[name.rsplit(".", 1)[0]] += 1
    return "; ".join(", ".join(f"{family}{f' x{n}' if n > 1 else ''}" for family, n in families.items())
                     + f": {a} -> {b}" for (a, b), families in grouped.items())


ADAPTIVE = register(PlannerKind(
    name="adaptive",
    summary="adaptive per-component choice (after issue 22's description of Baligodugula & Amsaad 2025, not the "
            "paper's text): data, tensor, Megatron, spatial or per-layer splits per component, one dynamic program "
            "over components priced on the topology; the best uniform choices simulated beside it",
    options=OPTIONS,
    run=run_adaptive,
))
