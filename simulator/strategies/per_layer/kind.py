"""The ``per_layer`` strategy kind: each layer split its own way, with the reshards, halo
exchanges and burst redistributions between layers (Gholami et al. 2018; DistDL, Hewett & Grady
2020; DeepPool, Park et al. MLSys 2022; the layouts PaSE searches, Elango 2021).

Each layer gets a :class:`~.config.Split` (``strategy.default`` and ``strategy.layers`` rules,
:func:`.sharding.resolve_split`) and runs on the first ``split.devices`` GPUs. Device 0 is in
every layer's device set and holds the largest block of each (``round_up``), so it stands for
the busiest device (DESIGN.md, "Symmetry is the speed"): one actor, ``device0``, whose
collectives are priced for their whole group on the topology.

One step, per layer in topological order:

- forward: the reshard of each input from its producer's layout (collectives on the ``reshard``
  stream, after the producer's forward), the halo exchange of a spatially split window layer,
  then the layer's kernels on ``compute``;
- backward, in reverse: the layer's backward kernels after its consumers' backward reshards,
  then the halo accumulate and the adjoint reshard of each input (on ``reshard``), and the
  weight-gradient all-reduce over the layer's replicas on ``dp`` (beside the rest of the backward;
  with ``overlap_gradient_reduction`` false, or unset and ``parallelism.overlap_grad_reduce`` false as
  some framework profiles fit it, one all-reduce per replica group of all its layers' gradients after
  the backward, as spmd's flat buffer);
- the framework profile's step-level terms as spmd applies them (simulator/strategies/framework_terms.py):
  kernels stretched by the wait for the slowest rank (``sync_jitter``) and by an eager host's issue
  floor per layer pass (``host_dispatch_us_per_kernel``, :mod:`.cost`), the next step's samples loaded
  beside the step (``input_us_per_sample``, the first layer's batch cut on device 0); a kernel slowed
  while a reshard or all-reduce of its device runs beside it and the other way round
  (``overlap_compute_slowdown`` / ``overlap_comm_slowdown``); NeMo's ``moe_layer_fixed_us`` never arises
  (MoE models are refused: the splits have no expert axis); the cross-node pipeline floor is named in the
  result as not applied (no pipeline stages);
- the optimizer step over the device's parameter shards after every gradient all-reduce.

``simulation.steps`` steps are unrolled back to back. Time breakdown: reshards and halos count
as ``tp_comm`` (activation traffic of model and domain parallelism), the gradient all-reduces as
``dp_comm``.

Memory on device 0 (``memory``): weights, gradients and optimizer state of its parameter shard
of every layer (``params / (channels·heads·reduction)``, bytes per parameter as
:func:`simulator.memory.analytic.model_state_bytes`, as spmd: ``training.param_dtype`` and ``grad_dtype``); the
activations each layer keeps for its backward times its work ratio (its share of the batch and
the feature map); other: the largest input a reshard or halo gathers. In the simulation each
layer's forward allocates its saved activations and its backward frees them.

Not modelled: recompute (``parallelism.recompute`` other than none is refused: a layer's
checkpoint would be resharded and re-run on its own split, which none of the sources does) and
ZeRO (``parallelism.zero_stage`` other than 0 is refused: the model state of a layer's replicas is
not sharded, and its gradients are all-reduced, not reduce-scattered).
"""

from __future__ import annotations

from simulator.engine.engine import Task
from simulator.memory.analytic import MemoryBreakdown, model_state_bytes
from simulator.strategies.framework_terms import (
    NO_PIPELINE,
    dropped_terms_extra,
    input_task,
    mark_interference,
)
from simulator.strategies.per_layer.config import MODEL_FIELDS, PerLayerConfig, Split
from simulator.strategies.per_layer.cost import Pricer, pricer
from simulator.strategies.per_layer.sharding import (
    Collective,
    check_rules_name_layers,
    default_folds,
    refuse_default_cut_no_layer_takes,
    resolve_split,
    work_ratio,
)
from simulator.strategies.plan import Plan
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.spmd.plan import OPTIMIZER_BYTES_PER_PARAM
from simulator.strategies.tasklists import require

ACTOR = "device0"


def layer_splits(scenario) -> list[Split]:
    """Every layer's split, in graph order (checked: ConfigError naming the rule's field, or the default's
    cut that no layer taking the default can make)."""
    p = pricer(scenario)
    check_rules_name_layers(p.graph, scenario.strategy)
    refuse_default_cut_no_layer_takes(p.graph, scenario.strategy)
    return [resolve_split(p.graph, scenario.strategy, i, scenario.num_gpus) for i in range(len(p.graph.layers))]


def split_report(graph, cfg: PerLayerConfig, splits: list[Split]) -> dict:
    """What each layer really splits, for the result (``per_layer_splits`` in ``--json``, the ``splits``
    lines of the table): ``runs`` = split label -> layers, in graph order of first use; ``folded`` = one
    entry per default cut that some layers taking the default cannot make and run as batch instead
    (:func:`.sharding.default_folds`): the default's label, the split run, the layers by kind."""
    runs: dict[str, int] = {}
    for split in splits:
        runs[split.label()] = runs.get(split.label(), 0) + 1
    _, folded = default_folds(graph, cfg)
    return {"runs": runs, "folded": [{"default": d, "runs": r, "layers": kinds} for (d, r), kinds in folded.items()]}


def _local_params(layer, split: Split) -> float:
    shards = 1
    for field in MODEL_FIELDS:
        shards *= getattr(split, field)
    return float(-(-layer.params // shards))


def _refuse_unmodelled(scenario) -> None:
    """One ConfigError for each layout field per_layer does not model (it never drops one silently)."""
    require(scenario.parallelism.recompute == "none", "parallelism.recompute",
            "per_layer does not recompute (each layer runs on its own split; use none)")
    require(scenario.parallelism.zero_stage == 0, "parallelism.zero_stage",
            f"per_layer does not shard model state over a layer's replicas (ZeRO), got {scenario.parallelism.zero_stage}: "
            "each layer's weights, gradients and optimizer state are cut by its own split's channel, head and "
            "reduction parts only; use 0, or the spmd kind for ZeRO")


def per_layer_memory(scenario) -> tuple[int, MemoryBreakdown, list[MemoryBreakdown]]:
    """Device 0's peak memory (see the module docstring)."""
    _refuse_unmodelled(scenario)
    p = pricer(scenario)
    splits = layer_splits(scenario)
    tr = scenario.training
    params = sum(_local_params(layer, s) for layer, s in zip(p.graph.layers, splits, strict=True))
    activations = sum(layer.saved_bytes * work_ratio(layer, s, p.batch)
                      for layer, s in zip(p.graph.layers, splits, strict=True))
    buffers = 0.0
    for i, layer in enumerate(p.graph.layers):
        for reshard in _input_reshards(p, splits, i):
            for c in reshard.forward + reshard.backward:
                buffers = max(buffers, c.payload_bytes)
        for c in p.halo_collectives(layer, splits[i]):
            buffers = max(buffers, c.payload_bytes)
    # weights/gradients/optimizer as spmd counts them (``training.param_dtype`` and ``grad_dtype``)
    weights, grads, optim = model_state_bytes(params, 0, 1, tr.precision, tr.optimizer, p.grad_elem_bytes,
                                              tr.param_dtype == "fp32")
    breakdown = MemoryBreakdown(weights, grads, optim, activations, buffers, stage=0)
    return 0, breakdown, [breakdown]


def _input_reshards(p: Pricer, splits: list[Split], i: int):
    layer = p.graph.layers[i]
    for name in layer.inputs:
        j = p.graph._index[name]
        yield p.reshard(p.graph.layers[j], splits[j], layer, splits[i])


def _flat_gradient_reduces(grads: list[Collective | None]) -> list[Collective]:
    """The weight-gradient all-reduces without overlap: one per replica group, of the summed payload of
    the layers it replicates (the flat gradient buffer that Megatron-LM and DDP reduce after the backward
    when they do not overlap; spmd reduces a stage's gradients the same way)."""
    payload: dict[tuple[int, ...], float] = {}
    for c in grads:
        if c is not None:
            payload[c.ranks] = payload.get(c.ranks, 0.0) + c.payload_bytes
    return [Collective("all_reduce", b, ranks, 2 * b * (len(ranks) - 1) / len(ranks)) for ranks, b in payload.items()]


class PerLayerPlanner:
    """Builds the one-actor plan of ``simulation.steps`` steps (see the module docstring)."""

    def __init__(self, scenario):
        self.sc = scenario
        self.cfg: PerLayerConfig = scenario.strategy
        self.p = pricer(scenario)
        self.splits = layer_splits(scenario)
        self.streams: dict[tuple[str, str], list[Task]] = {(ACTOR, s): [] for s in ("compute", "reshard", "dp")}
        self._demands: dict = {}
        overlap = self.cfg.overlap_gradient_reduction
        self.overlap_reduction = scenario.parallelism.overlap_grad_reduce if overlap is None else overlap

    def _comm(self, c: Collective, name: str, category: str, stream: str, deps) -> Task:
        key = (c.kind, c.payload_bytes, c.ranks)
        hit = self._demands.get(key)
        if hit is None:
            cost = self.p.collective(c.kind, c.payload_bytes, c.ranks)
            demands = {}
            for link, b in cost.bytes_by_link.items():
                if b > 0:
                    demands[f"{ACTOR}:{link}_tx"] = b
                    demands[f"{ACTOR}:{link}_rx"] = b
            hit = self._demands[key] = (demands, cost.latency_s)
        task = Task(name, ACTOR, stream, category, demands=dict(hit[0]), latency_s=hit[1], deps=list(deps))
        self.streams[(ACTOR, stream)].append(task)
        return task

    def _kernel(self, name: str, seconds: float, category: str, deps, alloc: float = 0.0, free: float = 0.0) -> Task:
        task = Task(name, ACTOR, "compute", category, duration_s=seconds, deps=list(deps),
                    alloc_bytes=alloc, free_bytes=free)
        self.streams[(ACTOR, "compute")].append(task)
        return task

    def compute_seconds(self) -> tuple[list, float]:
        """(each layer's cost on its split, in graph order; the optimizer step's seconds): the durations of the
        device's compute tasks of one step."""
        p, graph, splits = self.p, self.p.graph, self.splits
        costs = [p.layer_cost(layer, s) for layer, s in zip(graph.layers, splits, strict=True)]
        params = sum(_local_params(layer, s) for layer, s in zip(graph.layers, splits, strict=True))
        return costs, p.compute.optimizer_step_s(params, OPTIMIZER_BYTES_PER_PARAM[self.sc.training.optimizer])

    def build(self) -> Plan:
        p, graph, splits = self.p, self.p.graph, self.splits
        costs, optimizer_s = self.compute_seconds()
        saved = [layer.saved_bytes * work_ratio(layer, s, p.batch) for layer, s in zip(graph.layers, splits, strict=True)]
        reshards = {i: list(_input_reshards(p, splits, i)) for i in range(len(graph.layers))}
        halos = [p.halo_collectives(layer, s) for layer, s in zip(graph.layers, splits, strict=True)]
        grads = [p.gradient_collective(layer, s) for layer, s in zip(graph.layers, splits, strict=True)]
        consumers: dict[int, list[int]] = {i: [] for i in range(len(graph.layers))}
        for i, layer in enumerate(graph.layers):
            for name in layer.inputs:
                consumers[graph._index[name]].append(i)
        flat_reduces = _flat_gradient_reduces(grads)
        steps = self.sc.simulation.steps
        step_ends: list[list[Task]] = []
        previous: Task | None = None
        loaded: Task | None = None
        # the framework's input pipeline: device 0 loads the samples of its first layer's batch cut
        samples = -(-p.batch // splits[0].batch) if splits else 0
        for step in range(steps):
            tag = f"s{step}."
            forward: dict[int, Task] = {}
            for i, layer in enumerate(graph.layers):
                deps = [t for t in (previous, loaded) if t is not None] if i == 0 else (
                    [previous] if previous is not None else [])
                for name, reshard in zip(layer.inputs, reshards[i], strict=True):
                    after = [forward[graph._index[name]]]
                    for k, c in enumerate(reshard.forward):
                        after = [self._comm(c, f"{tag}reshard.{name}->{layer.name}.{c.kind}{k}", "tp_comm",
                                            "reshard", after)]
                    deps += after
                for k, c in enumerate(halos[i]):
                    deps = [self._comm(c, f"{tag}halo.{layer.name}.{k}", "tp_comm", "reshard", deps)]
                forward[i] = self._kernel(f"{tag}F.{layer.name}", costs[i].forward_s, "compute", deps, alloc=saved[i])
            backward_out: dict[int, list[Task]] = {}  # layer -> tasks its producers' backward waits for
            reduces: list[Task] = []
            last: Task = forward[len(graph.layers) - 1]
            for i in reversed(range(len(graph.layers))):
                layer = graph.layers[i]
                deps = [last] + [t for j in consumers[i] for t in backward_out.get((j, i), [])]
                last = done = self._kernel(f"{tag}B.{layer.name}", costs[i].backward_s, "compute", deps, free=saved[i])
                after = [done]
                for k, c in enumerate(halos[i]):
                    after = [self._comm(c, f"{tag}halo_accumulate.{layer.name}.{k}", "tp_comm", "reshard", after)]
                for name, reshard in zip(layer.inputs, reshards[i], strict=True):
                    chain = after
                    for k, c in enumerate(reshard.backward):
                        chain = [self._comm(c, f"{tag}reshard_grad.{layer.name}->{name}.{c.kind}{k}", "tp_comm",
                                            "reshard", chain)]
                    backward_out[(i, graph._index[name])] = chain
                if grads[i] is not None and self.overlap_reduction:
                    reduces.append(self._comm(grads[i], f"{tag}grad_all_reduce.{layer.name}", "dp_comm", "dp", [done]))
            if not self.overlap_reduction:  # one flat buffer per replica group, after the backward
                for n, c in enumerate(flat_reduces):
                    reduces.append(self._comm(c, f"{tag}grad_all_reduce.flat{n}", "dp_comm", "dp", [last]))
            previous = self._kernel(f"{tag}optimizer", optimizer_s, "optimizer", [last, *reduces])
            # the next step's samples, loaded beside this step (simulator/strategies/framework_terms.py): both end it
            loaded = input_task(self.sc.accelerator.efficiency, ACTOR, samples, f"{tag}input.next_batch")
            if loaded is not None:
                self.streams.setdefault((ACTOR, "input"), []).append(loaded)
            step_ends.append([previous] + ([loaded] if loaded is not None else []))
        mark_interference(self.sc.accelerator.efficiency, self.streams)
        compute = self.streams[(ACTOR, "compute")]
        memory = per_layer_memory(self.sc)[1]
        base = memory.weights_bytes + memory.gradients_bytes + memory.optimizer_bytes + memory.other_bytes
        return Plan(dict(self.streams), {ACTOR: 0}, {ACTOR: 0}, [len(graph.layers)], p.topo, {ACTOR: compute},
                    steps=steps, step_ends=step_ends, memory_base_bytes={ACTOR: base}, mode="symmetric",
                    extra={"per_layer_devices_max": max(s.devices for s in splits),
                           "per_layer_distinct_splits": len({s for s in splits}),
                           "per_layer_splits": split_report(graph, self.cfg, splits),
                           **dropped_terms_extra(self.sc.accelerator.efficiency, "per_layer",
                                                 {"cross_node_pipeline_floor": NO_PIPELINE})})


def compile_per_layer(scenario, mode: str | None = None, detail: bool = False) -> Plan:
    _refuse_unmodelled(scenario)
    return PerLayerPlanner(scenario).build()


def step_lower_bound_per_layer(scenario, prices) -> float:
    """A lower bound on the simulated step (seconds), compute alone: every layer's forward and backward on its
    split, plus the optimizer step (:meth:`PerLayerPlanner.compute_seconds`).

    Why it bounds the step: the step is the run's end over ``simulation.steps`` (no window, simulator/simulate.py),
    and the one actor's compute stream runs, every step, each layer's forward and backward task and the optimizer
    step one after another (:meth:`PerLayerPlanner.build`), fixed-duration tasks of exactly these seconds that the
    engine never runs in less (interference only slows them; simulator/engine/engine.py). The reshards, halos and
    gradient all-reduces only add (not counted: their flow time was not argued here). ``prices``
    (:class:`simulator.explore.bounds.KindPrices`) is not read. tests/test_kind_bounds.py checks it against the
    engine."""
    _refuse_unmodelled(scenario)
    costs, optimizer_s = PerLayerPlanner(scenario).compute_seconds()
    return sum(c.forward_s + c.backward_s for c in costs) + optimizer_s


def per_layer_layout_gpus(config: PerLayerConfig, parallelism, num_gpus: int) -> int:
    """``parallelism:`` gives only the global batch (``global_batch_size``, fixed across layers); the GPUs
    of each layer are its split's product, so the spmd layout check sees one replica (dp resolves to 1)
    and a batch smaller than the GPU count (U-Net's 2 images on 8 GPUs) needs no stand-in layout."""
    return parallelism.tp * parallelism.cp * parallelism.pp


def per_layer_searched_fields(config: PerLayerConfig) -> tuple[str, ...]:
    """The fields of ``clustersim search``'s space that change a per_layer run: the global batch (each layer
    splits it), and ``overlap_grad_reduce`` where the strategy block leaves ``overlap_gradient_reduction``
    unset. tp, pp, cp, ep, virtual stages, schedule, micro-batch, sequence parallelism and the pipeline split
    are not read (each layer runs on its own split; there are no stages and no micro-batches); recompute and
    ZeRO have one accepted value (:func:`_refuse_unmodelled`). The splits themselves are what
    ``clustersim plan --planner pase|deeppool|adaptive`` searches."""
    return ("global_batch_size",) + (("overlap_grad_reduce",) if config.overlap_gradient_reduction is None else ())


PER_LAYER = register(StrategyKind(
    name="per_layer",
    config=PerLayerConfig,
    summary="each layer split its own way (batch, channels, heads, reduction, rows x cols, sequence) on its own "
            "GPU count, with exact reshards, halo exchanges and burst redistributions between layers "
            "(Gholami 2018, DistDL, DeepPool, PaSE)",
    compile=compile_per_layer,
    memory=per_layer_memory,
    layout_gpus=per_layer_layout_gpus,
    searched_layout_fields=per_layer_searched_fields,
    step_lower_bound=step_lower_bound_per_layer,
))
