"""Planning: turn a scenario into per-actor task lists for the engine.

An *actor* is a simulated rank. In symmetric mode (the default) there is one actor per
pipeline stage — the rank with tp = cp = dp index 0 — because every other rank of the
stage does the same work at the same time (DESIGN.md, "Symmetry is the speed"); its
collectives are priced on the topology for the whole group, and the other, symmetric
groups' traffic is accounted for by giving each rank its own share of the node's NICs.
In full mode every rank is an actor and collectives rendezvous across their members.

Streams per actor: ``compute`` (kernels, optimizer), ``tp`` / ``cp`` / ``ep`` (tensor-,
context- and expert-parallel collectives, which the next kernel waits for unless marked as
overlapping it), ``dp`` (gradient reduction, ZeRO gathers), ``pp`` (activation/gradient
sends to the neighbouring stage).

Memory over time: each chunk's forward allocates the activations one micro-batch saves
(:func:`simulator.memory.analytic.chunk_activation_bytes`) and the end of its backward frees them;
the rank's first backward of a step allocates the gradients of all its chunks (freed after the
optimizer step, ``zero_grad(set_to_none=True)``): under the interleaved schedule, Megatron-Core wraps
every model chunk in its own DistributedDataParallel whose gradient buffer (``ParamAndGradBuffer``) is
allocated at construction, so at the rank's activation peak -- its first backward, on its last chunk --
every chunk's gradients are held, not only the last chunk's; a backward's recompute working set lives
while it runs; weights,
optimizer state and buffers are the plan's base (``Plan.memory_base_bytes``).

Granularity: by default one compute task (and one task per kind of collective) for a whole
chunk pass — the forward or backward of a model chunk for one micro-batch — and per layer
only where per-layer events matter (the last micro-batch's backward when gradient reduction
overlaps it, ZeRO-3 gathers). When TP traffic has its links to itself, its exposed time is
folded into the kernel task (exact, fewer events). ``detail=True`` makes one task per kernel
and per collective (for ``--trace``); both give the same step time where nothing contends (tested).
"""

from __future__ import annotations

from simulator.cost.compute import ComputeModel
from simulator.cost.topology import Coordinates, RankLayout, build_topology
from simulator.cost.wan import WanTopology
from simulator.engine.engine import Task
from simulator.scenario import Scenario
from simulator.strategies.framework_terms import kernel_stretch
from simulator.strategies.spmd.plan_costs import (
    OPTIMIZER_BYTES_PER_PARAM,
    WEIGHT_BYTES,
    PlanCosts,
    comm_category,
)
from simulator.strategies.spmd.plan_model import PlanModel
from simulator.strategies.spmd.plan_tasks import PlanTasks, kernel_info
from simulator.strategies.spmd.split import chunk_counts
from workloads.graph import LayerWork
from workloads.layer_graph import LayerGraph
from workloads.layer_kinds import layer_kind_keys as transformer_kind_keys
from workloads.schema import TransformerSpec

# This module's names: the byte counts and comm_category live in plan_costs.py, kernel_info in actor_tasks.py.
__all__ = ["OPTIMIZER_BYTES_PER_PARAM", "WEIGHT_BYTES", "Planner", "comm_category", "kernel_info", "layer_kind_keys"]


class Planner(PlanCosts, PlanModel, PlanTasks):
    """Builds the :class:`Plan` of ``simulation.steps`` training steps.

    The state is set up here; the methods live by concept in three mixins: pricing in
    :class:`~simulator.strategies.spmd.plan_costs.PlanCosts`, the model-side queries in
    :class:`~simulator.strategies.spmd.plan_model.PlanModel`, the task building in
    :class:`~simulator.strategies.spmd.plan_tasks.PlanTasks`."""

    def __init__(self, scenario: Scenario, mode: str | None = None, detail: bool = False, chains: bool = False):
        self.sc = scenario
        self.par = scenario.parallelism
        self.mode = mode or scenario.simulation.mode
        self.detail = detail
        self.precision = scenario.training.precision
        self.layout = RankLayout(self.par)
        groups = [(g.node, g.num_gpus) for g in scenario.groups] if scenario.mixed else None
        self.topo = build_topology(scenario.node, scenario.fabric, scenario.num_gpus, groups=groups)
        self.wan = self.topo if isinstance(self.topo, WanTopology) else None
        self.links = self.topo.links
        # Each node group's accelerator prices its own ranks' kernels (a mixed cluster: per-actor speed).
        self.computes = [ComputeModel(g.accelerator, self.precision, scenario.training.fp8_gemms,
                                      scenario.training.fp8_recipe, tf32=scenario.training.tf32)
                         for g in scenario.groups]
        self.compute = self.computes[0]
        self.sync_stretches = [kernel_stretch(g.accelerator.efficiency, scenario.num_gpus) for g in scenario.groups]
        self.sync_stretch = self.sync_stretches[0]
        self.host_floor = scenario.accelerator.efficiency.cross_node_pipeline_floor
        self.host_dispatch_us = scenario.accelerator.efficiency.host_dispatch_us_per_kernel
        self.moe_fixed_us = scenario.accelerator.efficiency.moe_layer_fixed_us
        self.remote_pipeline_neighbours = False  # a kind whose stages always talk over the network (swarm) sets it
        self._stretch_cache: dict[tuple[int, bool], float] = {}
        self.shard = scenario.shard
        self.graph = scenario.layer_graph()
        self.chunks = self.par.pp * self.par.virtual_stages
        # The pipeline splits the graph's pipelined layers (a transformer's blocks; every layer of
        # a CNN); the prologue (embedding) runs on the first chunk, the epilogue (head) on the last.
        self.pipelined = self.graph.pipelined
        self.layers_per_chunk = chunk_counts(scenario, self.graph)
        # Layers may differ: each kind is priced once, from its first layer, and a chunk is the runs
        # of equal kind it holds, in order (a dense transformer: one run per chunk).
        self.layer_kinds = layer_kind_keys(scenario.model, self.graph)
        self.layer_works = {}
        # a layer's trained parameters (dense, routed-expert): what has gradients, reduced over dp, and optimizer
        # state; all of them but LoRA's frozen base (workloads/lora.py: frozen parameters are dense). ZeRO-3
        # gathers every held parameter (``_held``).
        self._params_split: dict = {}
        self._held: dict = {}
        for kind, layer in zip(self.layer_kinds, self.pipelined, strict=True):
            if kind not in self.layer_works:
                self.layer_works[kind] = LayerWork(layer.forward, layer.backward, params=layer.params)
                self._params_split[kind] = (layer.params - layer.expert_params - layer.frozen_params,
                                            layer.expert_params)
                self._held[kind] = layer.params
        self.layer = self.layer_works[self.layer_kinds[0]]  # the first layer's work (calibration reads it)
        self.chunk_starts = [sum(self.layers_per_chunk[:g]) for g in range(self.chunks)]
        prologue = self.graph.layers[:self.graph.prologue]
        epilogue = self.graph.layers[len(self.graph.layers) - self.graph.epilogue:]
        self.embedding = _joined(prologue)
        self.head = _joined(epilogue)
        self.prologue_params = sum(layer.trained_params for layer in prologue)  # trained, as _params_split
        self.epilogue_params = sum(layer.trained_params for layer in epilogue)
        # the tied embedding's copy on the last stage: trained (its gradient summed with the first stage's) unless
        # the embedding is frozen (LoRA)
        self.tied_trained_params = 0.0 if self.graph.layers[0].frozen_params else self.graph.tied_copy_params
        self._cost_cache: dict = {}
        self._payload_cache: dict[int, float] = {}
        self._time_cache: dict = {}
        self._comm_cache: dict = {}
        self._send_cache: dict = {}  # (actor, destination rank, bytes) -> (demands, latency) of a send
        self._group_cache: dict = {}
        self._pass_ops: dict = {}
        self._chunk_pass_ops: dict[tuple[str, int], tuple] = {}  # (phase, global chunk) -> _chunk_ops
        self._chunk_runs: dict[int, tuple[tuple[bool, int], ...]] = {}
        self._chunk_names: dict[int, str] = {}
        self._zero_bubble_orders = None
        self._memory_cache: dict = {}
        self.steps = scenario.simulation.steps
        self.sync_gradients = True  # reduce gradients over dp every step (spmd); see after_step
        self.local_update = True    # each rank runs its optimizer step (a parameter server's kind: the servers do)
        self._forward_updates: dict[str, dict[int, tuple[Task, tuple[Task, ...]]]] = {}  # forward fusion
        self.final_step = True
        self.grad_group = "dp_cp" if self.par.cp > 1 else "dp"
        hybrid = self.par.zero_shard_size is not None and self.par.zero_shard_size < self.par.dp_degree
        self.shard_group = "zshard" if hybrid else self.grad_group  # ZeRO shards live on this group
        self.shard_size = self.par.zero_shard_size or self.par.dp_degree * self.par.cp
        self.hybrid_replicas = self.par.dp_degree // self.shard_size if hybrid else 1
        self.tp_exclusive = self.mode != "full" and self._tp_links_exclusive()
        # Chains (simulator/engine/engine.py): a pass's back-to-back tasks as one engine task. Only where
        # each pass is one fused task per run of ops (TP folded in: nothing beside it waits for a part),
        # in symmetric mode, and no kernel/communication interference is configured (a part's end would
        # change a transfer's pace). The caller asks for them: the engine runs them, the fast path does not.
        effs = [g.accelerator.efficiency for g in scenario.groups]
        self.chains = (chains and not detail and self.tp_exclusive and self.mode != "full"
                       and all(e.overlap_compute_slowdown <= 0 and e.overlap_comm_slowdown <= 0 for e in effs))
        self.rank_actor: dict[int, str] = {}
        self._stage_reps: dict[int, int] = {}
        if self.mode == "full":
            self.actor_ranks = {f"rank{r}": r for r in range(self.layout.world)}
        else:
            self.actor_ranks = {f"stage{i}": self.stage_representative(i) for i in range(self.par.pp)}
        self.rank_actor = {r: a for a, r in self.actor_ranks.items()}
        self.topo.bind_actors(self.actor_ranks)

    def stage_representative(self, stage: int) -> int:
        """The rank that stands for pipeline stage ``stage`` in symmetric mode: tp = cp = dp index 0;
        on a mixed cluster, a rank (tp = cp = 0) of the stage's slowest node group -- its
        collectives wait for their slowest member anyway, and every rank of a stage does the same
        work, so the stage runs at that group's pace (exact when each replica's slowest stages are
        alike, e.g. every stage on one kind of GPU; an upper bound otherwise: full mode is exact)."""
        rep = self.layout.representative(stage)
        if not self.topo.mixed:
            return rep
        hit = self._stage_reps.get(stage)
        if hit is None:
            hit = self._stage_reps[stage] = self._slowest_in_stage(stage, rep)
        return hit

    def _slowest_in_stage(self, stage: int, rep: int) -> int:
        candidates: dict[int, int] = {}
        for d in range(self.par.dp_degree):
            rank = self.layout.rank(Coordinates(0, 0, d, stage))
            candidates.setdefault(self.topo.group_index(rank), rank)
        if len(candidates) == 1:
            return rep

        def pass_s(rank: int) -> float:
            return sum(sum(self.pass_cost_s(rank, self._chunk_ops(phase, stage))) for phase in ("F", "B"))
        return max(sorted(candidates.values()), key=pass_s)


def layer_kind_keys(model, graph: LayerGraph) -> tuple:
    """A key per pipelined layer, equal for layers that do the same work (priced once): a
    transformer's dense / MoE flag (with its windowed flag under a sliding window:
    workloads.layer_kinds.layer_kind_key), else the index of the first layer with the same ops and params."""
    if isinstance(model, TransformerSpec):
        return transformer_kind_keys(model)
    first: dict[tuple, int] = {}
    keys = []
    for i, layer in enumerate(graph.pipelined):
        keys.append(first.setdefault((layer.forward, layer.backward, layer.params, layer.expert_params), i))
    return tuple(keys)


def _joined(layers) -> LayerWork:
    """The prologue's (or epilogue's) layers as one unit of work, forward in order, backward reversed."""
    if len(layers) == 1:
        return LayerWork(layers[0].forward, layers[0].backward)
    return LayerWork(sum((layer.forward for layer in layers), ()),
                     sum((layer.backward for layer in reversed(layers)), ()))

