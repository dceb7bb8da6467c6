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

import dataclasses
from collections import Counter, defaultdict

from simulator.cost.collectives import collective_cost
from simulator.cost.compute import ComputeModel
from simulator.cost.host_floor import floor_per_layer_s, stretch
from simulator.cost.interference import exposed_comm_share
from simulator.cost.moe_dispatch import node_dedup_all_to_all
from simulator.cost.topology import Coordinates, RankLayout, build_topology
from simulator.cost.wan import WanTopology
from simulator.engine.engine import Task, TaskPart
from simulator.memory.analytic import (
    MemoryBreakdown,
    chunk_activation_bytes,
    rank_memory,
    recompute_working_bytes,
)
from simulator.memory.checkpoints import plan_of
from simulator.scenario import Scenario, gradient_bytes
from simulator.strategies.framework_terms import eager_floor_s, input_task, kernel_stretch, mark_interference
from simulator.strategies.plan import Plan
from simulator.strategies.spmd.schedule import stage_order, zero_bubble
from simulator.strategies.spmd.split import chunk_counts
from workloads.graph import LayerWork, Op, full_units, gemm_class, partial_full_of
from workloads.layer_graph import LayerGraph
from workloads.layer_kinds import layer_kind_keys as transformer_kind_keys
from workloads.layer_kinds import layer_kind_runs
from workloads.schema import TransformerSpec

WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
# Adam step, mixed precision: read fp32 master+m+v and the 16-bit grad, write master+m+v and the
# 16-bit weight: 12 + 2 + 12 + 2 = 28 bytes per parameter (fp32 training: 4+8 read/write + 4 + 4 = 32).
# ``training.param_dtype: fp32`` (PyTorch FSDP1/FSDP2 MixedPrecision) is 28 too: the parameter is the fp32
# master and its sharded gradient is cast back to the parameter's dtype after the reduce-scatter (torch 2.13
# fsdp/_runtime_utils.py _cast_grad_to_param_dtype; _fully_shard/_fsdp_collectives.py foreach_reduce
# ``_to_dtype_if_needed(reduce_output, orig_dtype)``), so read param+m+v+grad 16, write param+m+v 12.
OPTIMIZER_BYTES_PER_PARAM = {"adam": 28.0, "adamw": 28.0, "sgd": 12.0}


def comm_category(group: str) -> str:
    """The breakdown category (and stream) of a layer's collective over ``group``: its own, except the
    expert tensor-parallel gather / scatter, which count with the expert all-to-alls they sit between."""
    return "ep_comm" if group == "etp" else f"{group}_comm"


class Planner:
    """Builds the :class:`Plan` of ``simulation.steps`` training steps."""

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

    def compute_of(self, rank: int) -> ComputeModel:
        """The kernel pricing of ``rank``'s accelerator (its node group's)."""
        return self.computes[self.topo.group_index(rank)]

    # -- pricing ---------------------------------------------------------------------------

    def _compute_time(self, ops, rank: int = 0) -> float:
        """Kernel seconds of ``ops`` on ``rank``'s accelerator, stretched by the expected wait for the
        slowest rank (simulator/cost/jitter.py; 1 where ``sync_jitter`` is 0 or the job has one rank)."""
        g = self.topo.group_index(rank)
        key = (id(ops), g)
        hit = self._time_cache.get(key)
        if hit is None or hit[0] is not ops:
            hit = self._time_cache[key] = (ops, self.computes[g].ops_time_s(ops) * self.sync_stretches[g])
        return hit[1]

    def _collective(self, rank: int, group: str, collective: str, payload: float):
        # The group and what its pricing reads of it, once per (rank, group): a data-parallel group of a
        # 16,384-GPU layout has 128 members, and every collective over it (each gradient bucket) would
        # walk them again (the symmetric mode's cost would grow with the data-parallel degree).
        hit = self._group_cache.get((rank, group))
        if hit is None:
            ranks = self.layout.group(rank, group)
            hit = self._group_cache[(rank, group)] = (
                ranks, self.topo.placement(ranks),
                self.topo.intra_slowdown(ranks),  # a group on a partial mesh (hybrid cube mesh, bridges)
                self.topo.groups_of(ranks),  # node groups of a mixed cluster the collective touches
                sum(r in self.rank_actor for r in ranks))
        ranks, placement, slowdown, spanned, simulated = hit
        key = (collective, payload, placement.size, placement.members_per_node, placement.num_nodes,
               placement.num_pods, slowdown, spanned)
        if self.wan is not None:
            key = (*key, ranks, group)
        cost = self._cost_cache.get(key)
        if cost is None:
            node = self.topo.groups[spanned[0]][0]
            # measured laws hold for their own kind of node: a collective across groups uses the α-β model
            # on the slowest member's ports (links_for)
            inter_laws = node.inter_node_collectives if len(spanned) == 1 else None
            if (collective == "all_to_all" and group == "ep" and self.par.moe_dispatch == "deepep"
                    and placement.num_nodes > 1):  # token dispatch once per node (simulator/cost/moe_dispatch.py)
                cost = node_dedup_all_to_all(payload, self.sc.model.moe.top_k, placement, self.topo.links_for(ranks))
            else:
                cost = collective_cost(collective, payload, placement, self.topo.links_for(ranks),
                                       node.intra_laws, inter_laws, node.nvls_all_reduce,
                                       mesh_peers=node.gpus_per_node - 1 if node.intra_node.kind == "xgmi" else None)
            if slowdown != 1.0 and cost.bytes_by_link.get("nvl"):
                cost = dataclasses.replace(cost, bytes_by_link={**cost.bytes_by_link,
                                                                "nvl": cost.bytes_by_link["nvl"] * slowdown})
            if self.wan is not None:  # crossing regions: pair ports, per-step delays (simulator/cost/wan.py)
                cost = self.wan.over_wan(cost, collective, payload, ranks, self._wan_edges(ranks, group),
                                         1.0 / max(1, simulated))
            self._cost_cache[key] = cost
        return cost, ranks, simulated

    def _wan_edges(self, ranks: tuple[int, ...], group: str):
        """Region-crossing ring edges of the groups that ``ranks``' group stands for: itself in full
        mode; in symmetric mode every group of the kind over the same pipeline stages (its copies at the
        other tp / cp / dp coordinates), summed per region pair."""
        if self.mode == "full":
            return self.wan.ring_crossings(ranks)
        stages = frozenset(self.layout.coords(r).pp for r in ranks)
        key = ("wan_edges", group, stages)
        hit = self._group_cache.get(key)
        if hit is None:
            groups = {self.layout.group(r, group) for r in range(self.layout.world)
                      if self.layout.coords(r).pp in stages}
            hit = Counter()
            for members in groups:
                if frozenset(self.layout.coords(r).pp for r in members) == stages:
                    hit.update(self.wan.ring_crossings(members))
            self._group_cache[key] = hit
        return hit

    def _wan_send_copies(self, src_rank: int, dst_rank: int) -> float:
        """Sends of the source's stage to the destination's stage that cross the same region pair as this
        one (the symmetric copies that share its pair port; 1 in full mode)."""
        if self.mode == "full":
            return 1.0
        src_stage, dst_stage = self.layout.coords(src_rank).pp, self.layout.coords(dst_rank).pp
        key = ("wan_send", src_stage, dst_stage)
        hit = self._group_cache.get(key)
        if hit is None:
            hit = Counter()
            for r in range(self.layout.world):
                c = self.layout.coords(r)
                if c.pp == src_stage:
                    peer = self.layout.rank(type(c)(c.tp, c.cp, c.dp, dst_stage))
                    hit[(self.wan.region_of(r), self.wan.region_of(peer))] += 1
            self._group_cache[key] = hit
        return float(hit[(self.wan.region_of(src_rank), self.wan.region_of(dst_rank))])

    def comm_task(self, actor: str, stream: str, category: str, name: str, rank: int,
                  parts: list[tuple], key: str) -> Task | None:
        """One task moving one or more collectives ``(group, collective, payload[, share])`` in
        sequence; ``share`` scales an overlapped collective down to its exposed part."""
        cache_key = (actor, tuple(parts))
        cached = self._comm_cache.get(cache_key)
        if cached is None:
            demands: dict[str, float] = defaultdict(float)
            latency, size, group_root = 0.0, 1, None
            for part in parts:
                group, collective, payload = part[:3]
                share = part[3] if len(part) > 3 else 1.0  # exposed share of an overlapped collective
                cost, ranks, simulated = self._collective(rank, group, collective, payload)
                latency += cost.latency_s * share
                for link, b in cost.bytes_by_link.items():
                    if link.startswith("wan:"):  # a wide-area pair port, shared by every flow crossing it
                        demands[link] += b * share
                        continue
                    demands[f"{actor}:{link}_tx"] += b * share
                    demands[f"{actor}:{link}_rx"] += b * share
                size, group_root = simulated, min(ranks)
            cached = self._comm_cache[cache_key] = (dict(demands), latency, size, group_root)
        demands, latency, size, group_root = cached
        if not demands and latency == 0.0:
            return None
        return Task(name, actor, stream, category, demands=demands, latency_s=latency,
                    rendezvous=f"{key}@{group_root}" if size > 1 else None, rendezvous_size=size)

    def send_task(self, actor: str, dst_rank: int, name: str, payload: float) -> Task:
        src_rank = self.actor_ranks[actor]
        dst = self.rank_actor[dst_rank]
        if self.wan is not None:
            # Crossing regions: the pair port (with the symmetric copies of this send), the NICs, and
            # the delay as propagation (simulator/cost/wan.py); None inside one region.
            route = self.wan.send(actor, src_rank, dst, dst_rank, payload, self._wan_send_copies(src_rank, dst_rank))
            if route is not None:
                demands, propagation = route
                return Task(name, actor, "pp", "pp_comm", demands=demands, propagation_s=propagation)
        key = (actor, dst_rank, payload)
        hit = self._send_cache.get(key)  # every micro-batch sends the same bytes to the same peer
        if hit is not None:
            return Task(name, actor, "pp", "pp_comm", demands=hit[0], latency_s=hit[1])
        pair = self.topo.links_for((src_rank, dst_rank))
        if self.topo.node_of(src_rank) == self.topo.node_of(dst_rank):
            links, latency = ["nvl"], pair.intra_latency_s
            payload *= self.topo.intra_slowdown((src_rank, dst_rank))  # a pair without a direct link
        else:
            links, latency = ["nic"], pair.inter_latency_s
            if self.topo.pod_of(src_rank) != self.topo.pod_of(dst_rank):
                links.append("up")
        demands = {}
        for link in links:
            demands[f"{actor}:{link}_tx"] = payload
            demands[f"{dst}:{link}_rx"] = payload
        self._send_cache[key] = (demands, latency)  # shared by the tasks: nothing writes a task's demands
        return Task(name, actor, "pp", "pp_comm", demands=demands, latency_s=latency)

    def pass_cost_s(self, rank: int, ops: tuple[Op, ...]) -> tuple[float, float]:
        """(kernel seconds, exposed collective seconds) of an op run in isolation, cached per op tuple."""
        compute_s, comm = self.pass_cost_by_category(rank, ops)
        return compute_s, sum(comm.values())

    def pass_cost_by_category(self, rank: int, ops: tuple[Op, ...]) -> tuple[float, dict[str, float]]:
        """Kernel seconds and exposed collective seconds per category ("tp_comm", "cp_comm")."""
        key = ("fused", id(ops), self._comm_class(rank))
        hit = self._time_cache.get(key)
        if hit is None or hit[0] is not ops:
            compute_s = self._compute_time(tuple(op for op in ops if op.kind != "collective"), rank)
            comm: dict[str, float] = {}
            for i, op in enumerate(ops):
                if op.kind == "collective":
                    seconds = self._isolated_comm_s(rank, [(op.group, op.collective, op.comm_bytes)])
                    category = comm_category(op.group)
                    comm[category] = comm.get(category, 0.0) + seconds * self._exposure(rank, ops, i)
            hit = self._time_cache[key] = (ops, (compute_s, comm))
        return hit[1]

    def chunk_pass_s(self, rank: int, phase: str, global_chunk: int) -> float:
        """Seconds of one chunk pass in isolation, kernels plus exposed collectives (the price
        other strategy kinds reuse): "F", "B", "R" (recompute) as in :meth:`_chunk_ops`."""
        return sum(self.pass_cost_s(rank, self._chunk_ops(phase, global_chunk)))

    def optimizer_step_s(self, stage: int, extra_params: float = 0.0) -> float:
        """Seconds of one optimizer step over the stage's local parameters (ZeRO-sharded), plus
        ``extra_params`` a kind adds to the stage (local-learning heads)."""
        params = self.stage_params_local(stage) + extra_params
        if self.par.zero_stage >= 1:
            params /= self.shard_size
        per_param = OPTIMIZER_BYTES_PER_PARAM[self.sc.training.optimizer] * (32 / 28 if self.precision == "fp32" else 1)
        return self.compute_of(self.stage_representative(stage)).optimizer_step_s(params, per_param)

    def pp_payload_bytes(self) -> float:
        """Bytes one rank sends to the next stage per micro-batch (activation or its gradient)."""
        return self._pp_payload()

    def layer_pass_ops(self, kind: bool, phase: str) -> tuple[Op, ...]:
        """One layer's ops of a pass: "F" forward, "B" backward (its input-gradient part under
        zero bubble), "W" weight gradients (zero bubble), "R" the recomputed forward work (cached:
        the pricing caches key on the tuple)."""
        key = ("layer", kind, phase)
        ops = self._pass_ops.get(key)
        if ops is None:
            work = self.layer_works[kind]
            if phase == "F":
                ops = work.forward
            elif phase == "B":
                ops = work.input_grad_ops() if self.par.schedule == "zb-h1" else work.backward
            elif phase == "W":
                ops = work.weight_grad_ops()
            else:
                ops = work.recompute_ops(self.par.recompute_mode)
            self._pass_ops[key] = ops
        return ops

    def layer_stretch(self, rank: int, kind: bool) -> float:
        """The host floor's factor on the passes of a layer of ``kind`` on ``rank``
        (simulator/cost/host_floor.py): 1 unless the layer's isolated forward + backward (+ recompute)
        is shorter than the floor: the cross-node pipeline floor (the rank's pipeline neighbour on
        another node) or the eager-dispatch floor (its passes issued kernel by kernel by the host)."""
        key = (rank, kind)
        hit = self._stretch_cache.get(key)
        if hit is None:
            work = self.layer_works[kind]
            passes = [ops for ops in (work.forward, work.backward, self.layer_pass_ops(kind, "R")) if ops]
            floor_s = max(floor_per_layer_s(self.host_floor, self.layout, self.topo, rank,
                                            self.remote_pipeline_neighbours),
                          self.eager_floor_s(rank, passes), self.moe_fixed_floor_s(rank, kind, passes))
            hit = 1.0
            if floor_s > 0:
                device_s = sum(sum(self.pass_cost_s(rank, ops)) for ops in passes)
                hit = stretch(device_s, floor_s)
            self._stretch_cache[key] = hit
        return hit

    def eager_floor_s(self, rank: int, passes: list[tuple[Op, ...]]) -> float:
        """The eager-dispatch floor of a layer's passes (forward, backward, recompute) on ``rank``:
        each pass issued kernel by kernel from an empty launch queue (simulator/cost/host_floor.py
        ``issue_bound_s``; a collective counts as one issue and takes its exposed time)."""
        if not self.host_dispatch_us:
            return 0.0
        compute, jitter = self.compute_of(rank), self.sync_stretches[self.topo.group_index(rank)]
        return eager_floor_s(([
            self._isolated_comm_s(rank, [(op.group, op.collective, op.comm_bytes)]) * self._exposure(rank, ops, i)
            if op.kind == "collective" else compute.time_s(op) * jitter for i, op in enumerate(ops)] for ops in passes),
            self.host_dispatch_us)

    def moe_fixed_floor_s(self, rank: int, kind, passes: list[tuple[Op, ...]]) -> float:
        """The floor of an MoE layer's passes (forward, backward, recompute) on ``rank``: their isolated time
        plus ``moe_layer_fixed_us`` (a fixed time per MoE layer and micro-batch; simulator/cost/host_floor.py).
        0 for a dense layer or without the constant."""
        if not self.moe_fixed_us or not any(gemm_class(op) == "experts" for op in self.layer_works[kind].forward):
            return 0.0
        return sum(sum(self.pass_cost_s(rank, ops)) for ops in passes) + self.moe_fixed_us * 1e-6

    def host_floor_stall_s(self, rank: int, phase: str, runs) -> float:
        """Seconds a pass over ``runs`` ((layer kind, count), ...) waits for the host floor."""
        if (self.host_floor is None or self.par.pp == 1) and not self.host_dispatch_us and not self.moe_fixed_us:
            return 0.0
        if phase == "R" and partial_full_of(self.par.recompute_mode) is not None:
            runs = self._rerun_runs(runs)  # the layers a partial full recompute re-runs
        stall = 0.0
        for kind, count in runs:
            factor = self.layer_stretch(rank, kind)
            if factor > 1.0:
                stall += count * (factor - 1.0) * sum(self.pass_cost_s(rank, self.layer_pass_ops(kind, phase)))
        return stall

    def _comm_class(self, rank: int) -> int | None:
        """What a rank's pricing caches are keyed by beyond the ops: None on a homogeneous cluster;
        on a mixed one the rank itself (its accelerator and the groups its collectives span differ)."""
        return rank if self.topo.mixed else None

    def _isolated_comm_s(self, rank: int, parts: list[tuple[str, str, float]]) -> float:
        key = ("isolated", tuple(parts), self._comm_class(rank))
        hit = self._comm_cache.get(key)
        if hit is None:
            hit = 0.0
            for group, collective, payload in parts:
                cost, ranks, _ = self._collective(rank, group, collective, payload)
                hit += cost.isolated_time_s(self.topo.links_for(ranks))
            self._comm_cache[key] = hit
        return hit

    def _tp_links_exclusive(self) -> bool:
        """Whether TP collectives never share a link with other streams: the TP group is inside a
        node, and neither DP/CP groups nor pipeline neighbours use that node's intra-node links."""
        par, topo = self.par, self.topo
        if par.cp > 1:
            return False  # ring passes share links with DP/PP traffic: simulate them as flows
        if par.tp == 1:
            return True
        rep = self.layout.representative(0)
        if topo.placement(self.layout.group(rep, "tp")).num_nodes > 1:
            return False
        for kind, size in (("dp", par.dp_degree), ("cp", par.cp), ("ep", par.ep), ("etp", par.etp_degree)):
            if size > 1 and topo.placement(self.layout.group(rep, kind)).members_per_node > 1:
                return False
        if par.pp > 1:
            stages = [self.layout.representative(i) for i in range(par.pp)]
            if len({topo.node_of(r) for r in stages}) < par.pp:
                return False
        return True

    # -- params ----------------------------------------------------------------------------

    def layer_params_split(self, kind=None) -> tuple[float, float]:
        """(dense, routed-expert) parameters one rank holds of a layer of ``kind`` (default: the
        first layer's), as the layer graph states them."""
        return self._params_split[self.layer_kinds[0] if kind is None else kind]

    def layer_params_local(self, kind=None) -> float:
        """The trained parameters one rank holds of a layer of ``kind`` (see :meth:`layer_params_split`)."""
        return sum(self.layer_params_split(kind))

    def layer_params_held(self, kind=None) -> float:
        """Every parameter one rank holds of a layer of ``kind``, frozen ones too (what ZeRO-3 gathers)."""
        return self._held[self.layer_kinds[0] if kind is None else kind]

    def chunk_runs(self, global_chunk: int) -> tuple[tuple[bool, int], ...]:
        """The chunk's layers as runs of equal kind, in order: ((moe_layer, count), ...) (cached:
        the planner asks for every pass of every micro-batch)."""
        runs = self._chunk_runs.get(global_chunk)
        if runs is None:
            runs = self._chunk_runs[global_chunk] = layer_kind_runs(
                self.layer_kinds, self.chunk_starts[global_chunk], self.layers_per_chunk[global_chunk])
        return runs

    def unit_recompute(self, global_chunk: int, layer: int, recompute: str) -> tuple[tuple[Op, ...], tuple]:
        """(ops, runs of layer kinds) re-run before the backward of the chunk's ``layer``-th layer.
        Full recompute re-runs a checkpoint unit's forward once, before the backward of its last
        layer on the chunk (simulator/memory/checkpoints.py: a transformer block, a CNN's residual
        block or sqrt(n) segment, cut at the chunk's borders); nothing before its other layers.
        Other modes: the layer's own selected ops. Approximation under ZeRO-3: the unit's
        recompute waits for its last layer's gather only. Cached per (chunk, layer)."""
        kind = self.chunk_layer_kind(global_chunk, layer)
        if partial_full_of(recompute) is not None:  # Megatron-Core's units, per chunk (workloads/graph.py full_units)
            key = ("partial_R", global_chunk, layer)
            hit = self._pass_ops.get(key)
            if hit is None:
                hit = ((), ())
                for first, end in full_units(recompute, self.layers_per_chunk[global_chunk]):
                    if layer == end - 1:  # re-run before the backward of the unit's last layer
                        kinds = [self.chunk_layer_kind(global_chunk, i) for i in range(first, end)]
                        hit = (tuple(op for k in kinds for op in self.layer_works[k].forward),
                               tuple((k, 1) for k in kinds))
                self._pass_ops[key] = hit
            return hit
        plan = plan_of(self.graph) if recompute == "full" else None
        if plan is None or plan.per_layer:
            return self.layer_works[kind].recompute_ops(recompute), ((kind, 1),)
        key = ("unit_R", global_chunk, layer)
        hit = self._pass_ops.get(key)
        if hit is None:
            start = self.chunk_starts[global_chunk]
            unit = plan.unit[self.graph.prologue + start:self.graph.prologue + start + self.layers_per_chunk[global_chunk]]
            if layer + 1 < len(unit) and unit[layer + 1] == unit[layer]:
                hit = ((), ())
            else:
                first = layer
                while first > 0 and unit[first - 1] == unit[layer]:
                    first -= 1
                kinds = [self.chunk_layer_kind(global_chunk, i) for i in range(first, layer + 1)]
                ops = tuple(op for k in kinds for op in self.layer_works[k].recompute_ops(recompute))
                hit = (ops, tuple((k, 1) for k in kinds))
            self._pass_ops[key] = hit
        return hit

    def layer_name(self, global_chunk: int, layer: int) -> str:
        """The layer graph's name of the chunk's ``layer``-th pipelined layer (for the trace)."""
        return self.pipelined[self.chunk_starts[global_chunk] + layer].name

    def chunk_layers(self, global_chunk: int) -> str:
        """The chunk's pipelined layers as ``first..last`` (for the trace); "" for a chunk without any
        (a last stage holding only the head: ``last_stage_layers: 0``). Cached: asked for every pass."""
        hit = self._chunk_names.get(global_chunk)
        if hit is None:
            hit = self._chunk_names[global_chunk] = self._chunk_layers(global_chunk)
        return hit

    def _chunk_layers(self, global_chunk: int) -> str:
        count = self.layers_per_chunk[global_chunk]
        if count == 0:
            return ""
        first = self.chunk_starts[global_chunk]
        last = first + count - 1
        return self.pipelined[first].name if last <= first else f"{self.pipelined[first].name}..{self.pipelined[last].name}"

    @property
    def prologue_name(self) -> str:
        return "+".join(layer.name for layer in self.graph.layers[:self.graph.prologue]) or "prologue"

    @property
    def epilogue_name(self) -> str:
        return "+".join(layer.name for layer in self.graph.layers[len(self.graph.layers) - self.graph.epilogue:]) or "epilogue"

    def chunk_layer_kind(self, global_chunk: int, layer: int) -> bool:
        """Kind (MoE or not) of the chunk's ``layer``-th layer."""
        return self.layer_kinds[self.chunk_starts[global_chunk] + layer]

    def _layers_params(self, runs, expert_only: bool = False) -> float:
        """Local parameters (or routed-expert ones only) of layers given as runs of equal kind."""
        total = 0.0
        for kind, count in runs:
            total += count * (self.layer_params_split(kind)[1] if expert_only else self.layer_params_local(kind))
        return total

    def chunk_params_local(self, global_chunk: int) -> float:
        params = self._layers_params(self.chunk_runs(global_chunk))
        if global_chunk == 0:
            params += self.prologue_params
        if global_chunk == self.chunks - 1:
            params += self.epilogue_params
            if self.tied_trained_params and self.chunks > 1 and self.par.pp > 1:
                params += self.tied_trained_params
        return params

    def stage_params_local(self, stage: int) -> float:
        return sum(self.chunk_params_local(c * self.par.pp + stage) for c in range(self.par.virtual_stages))

    # -- memory over time ------------------------------------------------------------------

    def stage_memory(self, stage: int) -> MemoryBreakdown:
        hit = self._memory_cache.get(("stage", stage))
        if hit is None:
            hit = self._memory_cache[("stage", stage)] = rank_memory(self.sc, stage)
        return hit

    def base_memory_bytes(self, stage: int) -> float:
        """Held from the start (the steady state of training): weights, optimizer state and the
        communication buffers of :func:`simulator.memory.analytic.rank_memory`."""
        m = self.stage_memory(stage)
        return m.weights_bytes + m.optimizer_bytes + m.other_bytes

    def activation_bytes(self, global_chunk: int) -> float:
        """Saved by one micro-batch's forward of the chunk until its backward (analytic accounting)."""
        hit = self._memory_cache.get(("act", global_chunk))
        if hit is None:
            hit = self._memory_cache[("act", global_chunk)] = chunk_activation_bytes(self.sc, global_chunk)
        return hit

    def working_bytes(self, stage: int) -> float:
        """Recompute working set alive during a backward pass of the stage (0 without recompute)."""
        hit = self._memory_cache.get(("working", stage))
        if hit is None:
            hit = self._memory_cache[("working", stage)] = recompute_working_bytes(self.sc, stage)
        return hit

    def largest_module_gradient_bytes(self, stage: int) -> float:
        """Gradient bytes of the stage's largest module (a layer, the embedding or the head), as the
        analytic count gives them under optimizer fusion "backward" with one micro-batch."""
        return self.stage_memory(stage).gradients_bytes

    def gradient_bytes_of_chunk(self, stage: int, global_chunk: int) -> float:
        """The chunk's share (by local parameters) of the stage's gradient bytes (ZeRO-sharded as the
        analytic count)."""
        share = self.chunk_params_local(global_chunk) / max(self.stage_params_local(stage), 1.0)
        return self.stage_memory(stage).gradients_bytes * share

    # -- building --------------------------------------------------------------------------

    def build(self) -> Plan:
        """The plan of ``simulation.steps`` steps back to back: each actor's step k+1 starts (its
        first kernel, its start-of-step parameter gathers) after its optimizer step of step k and
        any parameter all-gather that follows it. With more than one step, task names and
        rendezvous keys carry ``s<k>.``."""
        streams: dict[tuple[str, str], list[Task]] = defaultdict(list)
        self._streams_ref = streams
        compute_tasks: dict[str, list[Task]] = defaultdict(list)
        steps = self.steps
        step_ends: list[list[Task]] = []
        boundary: dict[str, tuple[Task, ...]] = {}
        for step in range(steps):
            before = {key: len(tasks) for key, tasks in streams.items()}
            lookup: dict[tuple, Task] = {}
            self.final_step = step == steps - 1
            for actor, rank in self.actor_ranks.items():
                tasks, boundary[actor] = self._build_actor(actor, rank, streams, lookup, boundary.get(actor, ()))
                compute_tasks[actor].extend(tasks)
                load = self.input_task(actor, rank)
                if load is not None:  # the next step's samples, loaded beside this step: both end the step
                    streams[(actor, "input")].append(load)
                    boundary[actor] = (*boundary[actor], load)
            self._link_pipeline(lookup)
            extra_ends = self.after_step(step, streams, boundary)
            if steps > 1:
                for key, tasks in streams.items():
                    for task in tasks[before.get(key, 0):]:
                        task.name = f"s{step}.{task.name}"
                        if task.rendezvous is not None:
                            task.rendezvous = f"s{step}.{task.rendezvous}"
            step_ends.append([t for ends in boundary.values() for t in ends] + extra_ends)
        if not self.par.overlap_p2p_comm:
            self._block_on_sends(streams)
        self._mark_interference(streams)
        stage_of = {a: self.layout.coords(r).pp for a, r in self.actor_ranks.items()}
        memory_base = {a: self.base_memory_bytes(stage_of[a]) for a in self.actor_ranks}
        return Plan(dict(streams), dict(self.actor_ranks), stage_of, self.layers_per_chunk, self.topo,
                    dict(compute_tasks), steps=steps, step_ends=step_ends, memory_base_bytes=memory_base,
                    mode=self.mode)

    def input_task(self, actor: str, rank: int) -> Task | None:
        """The framework's input pipeline on a first-stage rank (``efficiency.input_us_per_sample``, set by a
        framework profile; Lambda's ResNet-50 fp16 rows were fitted so in sessions 6-7, validation/modern/cnn.py
        says why they no longer are): the next step's samples (the
        rank's micro-batches) loaded on the host beside this step's kernels, as a prefetching loader (PyTorch
        DataLoader workers, DALI) runs in steady state. The step ends no earlier than the load, and the next
        step's first kernel waits for it: a step takes max(GPU step, samples x time per sample)."""
        if self.layout.coords(rank).pp != 0:
            return None
        return input_task(self.sc.rank_accelerator(rank).efficiency, actor,
                          self.par.micro_batch_size * self.par.num_micro_batches)

    def after_step(self, step: int, streams, boundary: dict[str, tuple[Task, ...]]) -> list[Task]:
        """Hook for kinds built on this planner: add tasks after step ``step`` (e.g. an outer
        synchronisation every H steps), possibly replacing an actor's ``boundary`` (what its next step
        waits for). Returns extra tasks that mark the end of the step. The spmd kind adds nothing."""
        return []

    def _block_on_sends(self, streams) -> None:
        """Blocking point-to-point (``overlap_p2p_comm: false``): the sender's first compute task
        after a send's source pass waits for the send to finish."""
        for (actor, stream), tasks in list(streams.items()):
            if stream != "pp":
                continue
            compute = streams.get((actor, "compute"), [])
            position = {id(t): i for i, t in enumerate(compute)}
            for send in tasks:
                source = next((d for d in send.deps if id(d) in position), None)
                if source is not None and position[id(source)] + 1 < len(compute):
                    compute[position[id(source)] + 1].deps.append(send)

    def _mark_interference(self, streams) -> None:
        """Kernels slow by ``accelerator.efficiency.overlap_compute_slowdown`` while a collective
        or send/recv of the same rank runs beside them (communication kernels take SMs), and
        communication slows by ``overlap_comm_slowdown`` while a kernel of its rank runs; the
        engine applies both (see simulator/engine/engine.py). Only communication on its own stream can
        run beside a kernel; a blocking one leaves the compute stream idle."""
        effs = [g.accelerator.efficiency for g in self.sc.groups]
        if all(e.overlap_compute_slowdown <= 0 and e.overlap_comm_slowdown <= 0 for e in effs):
            return
        mark_interference(effs[0], streams, efficiency_of=lambda actor: (
            self.sc.rank_accelerator(self.actor_ranks[actor]).efficiency if actor in self.actor_ranks else effs[0]))

    def _exposure(self, rank: int, ops: tuple[Op, ...], i: int) -> float:
        """Fraction of collective ``ops[i]``'s isolated time left exposed: 1, or for a TP
        input-gradient collective overlapped with the next (weight-gradient) kernel, the
        pair's time beyond the kernel's over t_comm (simulator/cost/interference.py: the kernel
        slowed by ``overlap_compute_slowdown`` s and the collective by ``overlap_comm_slowdown``
        c while both run; with c = 0, max(t_comm - t_kernel, t_comm·s/(1+s)) / t_comm) -- what
        the engine gives when both run as tasks (detail mode); here it is counted with the
        collective's exposed time."""
        op = ops[i]
        if op.collective == "all_to_all" and self.par.overlap_moe_comm:
            return self._paired_moe_exposure(rank, ops)
        if not (op.overlaps_next and self._overlap_on(op)) or i + 1 >= len(ops):
            return 1.0
        t_comm = self._isolated_comm_s(rank, [(op.group, op.collective, op.comm_bytes)])
        nxt = ops[i + 1]
        t_next = self.compute_of(rank).time_s(nxt) if nxt.kind != "collective" else 0.0
        if t_comm <= 0:
            return 1.0
        eff = self.sc.rank_accelerator(rank).efficiency
        return exposed_comm_share(t_next, t_comm, eff.overlap_compute_slowdown, eff.overlap_comm_slowdown)

    def _paired_moe_exposure(self, rank: int, ops: tuple[Op, ...]) -> float:
        """``overlap_moe_comm``: the expert all-to-alls of a pass run beside the computation of
        another micro-batch's pass (DeepSeek-V3's DualPipe pairs a forward and a backward chunk,
        arXiv:2412.19437 Sec. 3.2.1; Megatron-core's EP all-to-all overlap). Approximated with
        the pass's own kernel time T as the budget that hides the pass's all-to-alls A: the
        exposed share (simulator/cost/interference.py; with no communication slowdown
        max(A - T, A·s/(1+s)) / A, s: the kernels' slowdown beside communication) is the same
        for each of them. Warm-up passes with no partner are treated alike."""
        key = ("moe_pair", id(ops), self._comm_class(rank))
        hit = self._time_cache.get(key)
        if hit is None or hit[0] is not ops:
            a2a = self._isolated_comm_s(rank, [(op.group, op.collective, op.comm_bytes) for op in ops
                                               if op.collective == "all_to_all"])
            kernels = self._compute_time(tuple(op for op in ops if op.kind != "collective"), rank)
            eff = self.sc.rank_accelerator(rank).efficiency
            share = exposed_comm_share(kernels, a2a, eff.overlap_compute_slowdown, eff.overlap_comm_slowdown)
            hit = self._time_cache[key] = (ops, share)
        return hit[1]

    def _overlap_on(self, op: Op) -> bool:
        if op.overlap_knob == "tp_comm":
            return self.par.tp_comm_overlap
        return self.par.overlap_cp_comm if op.group == "cp" else self.par.overlap_tp_grad_comm

    def _segments(self, rank: int, ops: tuple[Op, ...]):
        """Split ops into runs ``(kind, payload, name, overlapped)``: ("compute", ops) and
        ("comm", [(group, collective, payload)]). Coarse mode merges all kernels into one run and
        all collectives into one, with overlapped collectives reduced to their exposed share."""
        key = ("segments", id(ops), self.detail, self._comm_class(rank))
        hit = self._time_cache.get(key)
        if hit is not None and hit[0] is ops:
            return hit[1]
        out = []
        if not self.detail:
            compute = tuple(op for op in ops if op.kind != "collective")
            comms: dict[str, list] = {}
            for i, op in enumerate(ops):
                if op.kind == "collective":
                    share = self._exposure(rank, ops, i)
                    if share > 0:
                        comms.setdefault(op.group, []).append((op.group, op.collective, op.comm_bytes, share))
            if compute:
                out.append(("compute", compute, "compute", False))
            for group, parts in comms.items():
                out.append(("comm", parts, comm_category(group), False))
        else:
            for op in ops:
                if op.kind == "collective" and op.collective == "all_to_all" and self.par.overlap_moe_comm:
                    # hidden behind another micro-batch's pass: only the exposed share runs here
                    share = self._paired_moe_exposure(rank, ops)
                    if share > 0:
                        out.append(("comm", [(op.group, op.collective, op.comm_bytes, share)], op.name, False))
                elif op.kind == "collective":
                    overlapped = op.overlaps_next and self._overlap_on(op)
                    out.append(("comm", [(op.group, op.collective, op.comm_bytes)], op.name, overlapped))
                else:
                    out.append(("compute", (op,), op.name, False))
        self._time_cache[key] = (ops, out)
        return out

    def _build_actor(self, actor: str, rank: int, streams, lookup,
                     after: tuple[Task, ...] = ()) -> tuple[list[Task], tuple[Task, ...]]:
        """One step of ``actor``: its tasks on every stream, starting after ``after`` (the end of
        its previous step). Returns its compute tasks and the tasks that end its step."""
        par, sc = self.par, self.sc
        stage = self.layout.coords(rank).pp
        compute = self.compute_of(rank)  # this rank's accelerator (its node group's on a mixed cluster)
        m_total = par.num_micro_batches
        order = self._stage_order(rank, stage)
        compute_list: list[Task] = []
        prev: list[Task | None] = [None]   # last task on the compute/tp chain
        dp_tasks: list[Task] = []
        zero = par.zero_stage
        # weights are replicated over dp and cp (Megatron); a kind that does not reduce gradients every
        # step (local SGD) plans each replica on its own
        dp_size = par.dp_degree * par.cp if self.sync_gradients else 1
        shard = self.shard_size           # ZeRO shards: all of dp x cp, or a hybrid-sharding group
        weight_bytes = WEIGHT_BYTES[self.precision]
        grad_bytes = gradient_bytes(sc.training)

        layer_ends: list[Task] = []  # last task of each layer pass, for ZeRO-3 prefetch distance
        carry: list[Task] = list(after)  # side tasks (overlapped collectives) the next chained task waits for

        def add(task: Task | None, extra_deps: tuple[Task, ...] = ()) -> Task | None:
            if task is None:
                return None
            if prev[0] is not None:
                task.deps.append(prev[0])
            task.deps.extend(extra_deps)
            if carry:
                task.deps.extend(carry)
                carry.clear()
            streams[(actor, task.stream)].append(task)
            if task.stream == "compute":
                compute_list.append(task)
            prev[0] = task
            return task

        def run_ops(ops: tuple[Op, ...], label: str, category: str, first_deps: tuple[Task, ...] = (),
                    layer: str | None = None) -> Task | None:
            first = True
            last = None
            if not self.detail and self.tp_exclusive:
                # TP traffic has its links to itself: fold it into the kernel task (exact, fewer events).
                duration, segments = self._fused_pass(rank, ops, category)
                task = Task(label, actor, "compute", category, duration_s=duration, segments=segments)
                return add(task, first_deps)
            pending: Task | None = None  # an overlapped collective running beside the next kernel
            for kind, payload, name, overlapped in self._segments(rank, ops):
                deps = first_deps if first else ()
                first = False
                if kind == "compute":
                    task = Task(f"{label}.{name}", actor, "compute", category,
                                duration_s=self._compute_time(payload, rank))
                    if self.detail:  # for the trace: the layer and the FLOPs the kernels run
                        task.info = kernel_info(payload, layer)
                    last = add(task, deps) or last
                    if pending is not None:
                        carry.append(pending)  # the kernel after the overlapped one waits for it
                        pending = None
                    continue
                comm_cat = comm_category(payload[0][0])  # not `category`: the kernels after it keep theirs
                task = self.comm_task(actor, comm_cat.removesuffix("_comm"), comm_cat, f"{label}.{name}", rank, payload,
                                      key=f"{label}.{name}")
                if task is not None and self.detail and layer:
                    task.info = (("layer", layer),)
                if task is not None and overlapped:
                    task.deps.extend([t for t in (prev[0],) if t is not None] + list(deps))
                    streams[(actor, task.stream)].append(task)
                    pending = task
                else:
                    last = add(task, deps) or last
            if pending is not None:
                carry.append(pending)
            return last

        def host_floor(label: str, phase: str, runs) -> Task | None:
            """The stage's host-side floor (simulator/cost/host_floor.py): a stall after the pass."""
            stall = self.host_floor_stall_s(rank, phase, runs)
            if stall <= 0:
                return None
            return add(Task(f"{label}.host_floor", actor, "compute", "host_stall", duration_s=stall))

        def gather_params(label: str, params: float) -> tuple[Task, ...]:
            """ZeRO-3: all-gather a layer's weights on the dp stream, prefetched one task ahead
            (``overlap_param_gather``), or, with it off, issued only when the layer before has
            finished, so the compute waits for every gather (a host-blocking backend)."""
            if zero < 3 or dp_size == 1:
                return ()
            task = self.comm_task(actor, "dp", "dp_comm", f"{label}.zero3_gather", rank,
                                  [(self.shard_group, "all_gather", params * weight_bytes)], key=f"{label}.zero3_gather")
            if task is None:
                return ()
            task.deps.extend(after)  # the weights the previous step's optimizer updated
            if par.zero_buffer_copies:  # FSDP2's copy-in; FSDP1's low-precision cast of the shard, alike
                # Copy-in of this rank's shard of the layer's parameters into the all-gather input
                # (FSDP2 ``foreach_all_gather`` -> ``all_gather_copy_in``: ``torch._foreach_copy_`` of
                # the local shards, all_gather_input_numel = params / shard; torch 2.13
                # distributed/fsdp/_fully_shard/_fsdp_collectives.py). With overlapped gathers it runs
                # on FSDP2's all-gather copy-in stream (FSDPCommContext.get_all_gather_streams: forward
                # and pre-backward), which the gather waits for; with host-blocking gathers (gloo) on
                # the host before the gather. FSDP1 (``fsdp1``) casts its fp32 shard to the
                # low-precision ``_mp_shard`` it all-gathers from, on the unshard stream
                # (FlatParamHandle.pre_unshard -> _use_low_precision_shard; torch fsdp/_flat_param.py):
                # the same P/n elements at the same place.
                copy_in_s = self.zero3_copy_in_s(compute, params, shard, weight_bytes)
                if par.overlap_param_gather:
                    copy_in = Task(f"{label}.zero3_copy_in", actor, "dp", "compute", duration_s=copy_in_s)
                    streams[(actor, "dp")].append(copy_in)
                    task.deps.append(copy_in)
                    copy_in.deps.extend(after)
                    first = copy_in
                else:
                    first = add(Task(f"{label}.zero3_copy_in", actor, "compute", "compute", duration_s=copy_in_s))
                    task.deps.append(first)
            else:
                first = task
            post = par.zero3_backward_prefetch == "post" and label.startswith("B.")
            issue = None
            if par.overlap_param_gather and not post and len(layer_ends) >= 2:
                issue = layer_ends[-2]  # prefetch: starts once the layer before the previous ends
            elif (post or not par.overlap_param_gather) and layer_ends:
                issue = layer_ends[-1]  # blocking: starts when the layer before ends, compute waits
            if issue is not None:
                task.deps.append(issue)
                if first is not task and issue not in first.deps:
                    first.deps.append(issue)  # the copy-in is issued with the gather
            streams[(actor, "dp")].append(task)
            dp_tasks.append(task)
            if par.zero_buffer_copies is not True:  # the layer's parameters are views of the gathered buffer
                return (task,)  # (FSDP1's FlatParameter, Megatron-FSDP's buffers)
            # Copy-out of the gathered flat buffer into the layer's parameters, on the compute stream
            # after the gather (FSDP2 ``foreach_all_gather_copy_out`` -> ``split_with_sizes_copy`` of
            # the whole all-gather output, every rank's shard including this rank's own: shard x
            # params / shard elements; torch 2.13 _fsdp_collectives.py): read + write, memory-bound.
            # DeepSpeed ZeRO-3 is priced the same (not checked against its source).
            add(Task(f"{label}.zero3_copy_out", actor, "compute", "compute",
                     duration_s=compute.copy_s(params * weight_bytes)), (task,))
            return ()

        def accumulate_grads(g: int, mb: int, tag: str) -> None:
            """``unfused_eager_kernels``: after every micro-batch's backward but the first, the new
            gradients are added into the held ones (PyTorch AccumulateGrad), over the chunk's
            local gradients (its shard of them where ZeRO-2/3 reduce-scatter every micro-batch)."""
            if not sc.training.unfused_eager_kernels or mb == 0:
                return
            nbytes = self.chunk_params_local(g) * grad_bytes / (shard if zero >= 2 else 1)
            add(Task(f"B.{tag}.grad_accumulate", actor, "compute", "compute",
                     duration_s=compute.add_into_s(nbytes)))

        grads_held: dict[int, float] = {}  # chunk -> its gradient bytes, all allocated at the rank's first backward
        fusion = sc.training.optimizer_fusion
        optimizer_bytes = OPTIMIZER_BYTES_PER_PARAM[sc.training.optimizer] * (32 / 28 if self.precision == "fp32" else 1)
        fused: list[Task] = []  # per-chunk updates (optimizer fusion)
        deferred: list[tuple[int, tuple[Task, ...]]] = []  # (chunk, the reductions its fused update waits for)

        def chunk_update(g: int, name: str) -> Task:
            """The optimizer step of one model chunk's parameters, freeing its gradients."""
            task = Task(name, actor, "compute", "optimizer",
                        duration_s=compute.optimizer_step_s(self.chunk_params_local(g), optimizer_bytes))
            task.free_bytes += grads_held.get(g, 0.0)
            return task

        def fused_backward_update(g: int, mb: int) -> None:
            """Optimizer fusion "backward": with no data parallelism the chunk's update runs inline right
            after its last backward (PyTorch's step in backward). With data parallelism it waits for the
            chunk's gradient reduction: queued after the backward, each chunk's update waits only for the
            buckets reduced so far (overlapped reduction) so it runs while later chunks' gradients are
            still reduced (memory-bound kernels overlapping communication); without overlapped
            reduction, after the final reduction."""
            if fusion != "backward" or mb != m_total - 1:
                return
            if dp_size > 1:
                overlapped = par.overlap_grad_reduce or zero >= 2
                deferred.append((g, tuple(dp_tasks) if overlapped else ()))
                return
            fused.append(add(chunk_update(g, f"optimizer_step.c{g}"), tuple(dp_tasks)))

        pending_forward = self._forward_updates.pop(actor, {}) if fusion == "forward" else {}

        def backward_memory(g: int, entry: Task, exit_task: Task) -> None:
            """Memory over time of a backward pass: its recompute working set (and, on the rank's first
            backward of the step, every chunk's gradients) from its start; the working set and the
            chunk's saved activations freed at its end. Zero bubble's deferred W pass keeps only part of
            them (the linear layers' inputs); counted as freed with B, as the analytic count does (ZB-H1
            keeps 1F1B's peak, Qi et al. 2024 Sec. 3.1) -- an approximation."""
            working = self.working_bytes(stage)
            entry.alloc_bytes += working
            if fusion == "backward" and m_total == 1:
                # step in backward without accumulation: one module's gradients alive at a time
                transient = self.largest_module_gradient_bytes(stage)
                entry.alloc_bytes += transient
                exit_task.free_bytes += transient
                grads_held[g] = 0.0
            elif not grads_held:  # every chunk's gradient buffer (Megatron-Core: one per chunk, all alive)
                for c in range(par.virtual_stages):
                    chunk = c * par.pp + stage
                    grads_held[chunk] = self.gradient_bytes_of_chunk(stage, chunk)
                    entry.alloc_bytes += grads_held[chunk]
            exit_task.free_bytes += working + self.activation_bytes(g)

        # Gradient buckets (ZeRO 0/1: once, on the last micro-batch; ZeRO 2/3: every micro-batch).
        bucket_limit = par.gradient_bucket_mb * 1e6
        bucket = {"bytes": 0.0, "expert": 0.0, "n": 0}
        reduce_kind = "all_reduce" if zero == 0 else "reduce_scatter"

        def flush_bucket(after: Task, label: str) -> None:
            dense, expert = bucket["bytes"] - bucket["expert"], bucket["expert"]
            bucket["bytes"] = bucket["expert"] = 0.0
            if dense + expert <= 0 or dp_size == 1:
                return
            after = self._copy_in(actor, after, label, dense + expert, zero, add)
            # Dense gradients are reduced over dp (x cp); expert gradients over the expert-data-
            # parallel group (dp / ep ranks holding the same experts).
            steps = [(self.shard_group if zero >= 1 else self.grad_group, reduce_kind, dense), ("edp", reduce_kind, expert)]
            if self.hybrid_replicas > 1 and zero >= 1:
                # HSDP: the reduce-scattered shard is then all-reduced across the replicas.
                steps.insert(1, ("zrep", "all_reduce", dense / self.shard_size))
            for group, kind, nbytes in steps:
                if nbytes <= 0:
                    continue
                task = self.comm_task(actor, "dp", "dp_comm", f"{label}.{group}_grad_{kind}", rank,
                                      [(group, kind, nbytes)], key=f"{label}.{group}grad{bucket['n']}")
                if task is None:
                    continue
                task.deps.append(after)
                streams[(actor, "dp")].append(task)
                dp_tasks.append(task)
            bucket["n"] += 1

        # ZeRO-1/2 with overlapped parameter all-gather: gather each chunk's updated weights
        # at the start of the step, before its first forward (Megatron's overlap_param_gather).
        start_gathers: dict[int, Task] = {}
        if zero in (1, 2) and dp_size > 1 and par.overlap_param_gather:
            for c in range(par.virtual_stages):
                g = c * par.pp + stage
                task = self.comm_task(actor, "dp", "dp_comm", f"c{g}.param_all_gather", rank,
                                      [(self.shard_group, "all_gather", self.chunk_params_local(g) * weight_bytes)],
                                      key=f"c{g}.param_gather")
                if task is not None:
                    task.deps.extend(after)
                    streams[(actor, "dp")].append(task)
                    dp_tasks.append(task)
                    start_gathers[g] = task

        last_chunk = self.chunks - 1
        recompute = par.recompute_mode
        # the same for every pass (read once: the loop runs once per pass, 8,448 on a Megatron-1T fold point)
        per_layer_gathers = zero >= 3 and dp_size > 1
        zero_bubble = par.schedule == "zb-h1"
        reduces_every_pass = dp_size > 1 and (par.overlap_grad_reduce or zero >= 2)
        accumulates = sc.training.unfused_eager_kernels  # accumulate_grads adds a task only then
        pp, layers_per_chunk = par.pp, self.layers_per_chunk
        # The passes most plans are made of, built inline (8,448 on a Megatron-1T fold point): a forward as one
        # fused task (no trace detail, TP on links of its own, no per-layer gathers, no host-floor stall) and
        # a backward as one chain task (its recompute and its backward; no reduction inside the pass, no
        # gradient accumulation kernel). Each builds the tasks, deps and bytes the general path below does:
        # per chunk (duration, segments, saved activation bytes) or (duration, parts, activation bytes).
        fast_forward: dict[int, tuple | None] = {} if not (self.detail or per_layer_gathers) and self.tp_exclusive else None
        fast_backward: dict[int, tuple | None] = ({} if self.chains and not (zero_bubble or self.detail or per_layer_gathers
                                                                               or accumulates) else None)
        working = None  # the stage's recompute working set, asked for at its first backward
        for phase, mb, chunk in order:
            g = chunk * pp + stage
            if phase == "F" and fast_forward is not None and not pending_forward:
                hit = fast_forward.get(g, False)
                if hit is False:
                    hit = fast_forward[g] = (None if self.host_floor_stall_s(rank, "F", self.chunk_runs(g)) > 0 else
                                             (*self._fused_pass(rank, self._chunk_ops("F", g), "compute"),
                                              self.activation_bytes(g)))
                if hit is not None:  # run_ops' fused task, add(), the saved activations (+=, as below)
                    entry = add(Task(f"F.mb{mb}.c{g}", actor, "compute", "compute", duration_s=hit[0],
                                     segments=hit[1], alloc_bytes=0.0 + hit[2]))
                    if mb == 0 and g in start_gathers:
                        entry.deps.append(start_gathers[g])
                    lookup[("F_entry", actor, mb, g)] = entry
                    lookup[("F_exit", actor, mb, g)] = entry
                    continue
            elif (phase == "B" and fast_backward is not None and grads_held and not (fusion == "backward" and m_total == 1)
                  and not (reduces_every_pass and (zero >= 2 or mb == m_total - 1))):  # not overlapped_reduce
                hit = fast_backward.get(g, False)
                if hit is False:
                    chain = self._backward_chain_of(rank, g)
                    hit = fast_backward[g] = None if chain is None else (*chain, self.activation_bytes(g))
                if hit is not None:  # _backward_chain's task, add(), backward_memory's bytes (+=, as below)
                    if working is None:
                        working = self.working_bytes(stage)
                    task = add(Task(f"B.mb{mb}.c{g}", actor, "compute", "compute", duration_s=hit[0], parts=hit[1],
                                    alloc_bytes=0.0 + working, free_bytes=0.0 + (working + hit[2])))
                    lookup[("B_entry", actor, mb, g)] = task
                    lookup[("B_exit", actor, mb, g)] = task
                    if mb == m_total - 1:
                        fused_backward_update(g, mb)
                    continue
            n_layers = layers_per_chunk[g]
            tag = f"mb{mb}.c{g}"
            reduce_now = (mb == m_total - 1) if zero < 2 else True
            pass_start = len(compute_list)
            overlapped_reduce = reduce_now and reduces_every_pass
            if phase == "F":
                if mb == 0 and g in pending_forward:  # optimizer fusion "forward": last step's update first
                    update, waits_for = pending_forward.pop(g)
                    add(update, waits_for)
                    pass_start = len(compute_list)
                if self.detail or per_layer_gathers:
                    # ZeRO-3: the parameters outside the layers (embedding, final norm, untied head) are
                    # gathered too, once per forward pass, and kept until the backward has run: FSDP2's
                    # root fully_shard holds them and is not resharded after forward
                    # (torch 2.13 fully_shard: reshard_after_forward is set False for the root). On one
                    # stage that is one gather before the embedding; on a pipeline, the first and the
                    # last stage gather their own part.
                    if g == 0:
                        root = self.prologue_params + (self.epilogue_params if g == last_chunk else 0)
                        run_ops(self.embedding.forward, f"F.{tag}.embedding", "compute",
                                gather_params(f"F.{tag}.embedding", root) if root else (), layer=self.prologue_name)
                    for layer in range(n_layers):
                        label = f"F.{tag}.L{layer}"
                        kind = self.chunk_layer_kind(g, layer)
                        done = run_ops(self.layer_works[kind].forward, label, "compute",
                                       gather_params(label, self.layer_params_held(kind)),
                                       layer=self.layer_name(g, layer))
                        layer_ends.append(host_floor(label, "F", ((kind, 1),)) or done)
                    if g == last_chunk:
                        root = self.epilogue_params if g != 0 else 0
                        run_ops(self.head.forward, f"F.{tag}.head", "compute",
                                gather_params(f"F.{tag}.head", root) if root else (), layer=self.epilogue_name)
                else:  # one compute and one TP task for the whole chunk pass
                    label = f"F.{tag}"
                    run_ops(self._chunk_ops("F", g), label, "compute", layer=self.chunk_layers(g))
                    if host_floor(label, "F", self.chunk_runs(g)) is not None and self.chains:
                        prev[0] = self._chain_pass(compute_list, pass_start, streams[(actor, "compute")])
                entry = compute_list[pass_start]
                entry.alloc_bytes += self.activation_bytes(g)  # saved for this chunk's backward
                if mb == 0 and g in start_gathers:
                    entry.deps.append(start_gathers[g])
                lookup[("F_entry", actor, mb, g)] = entry
                lookup[("F_exit", actor, mb, g)] = prev[0]
                continue
            if phase == "W":  # zero-bubble weight-gradient pass; the chunk's gradients are final after it
                run_ops(self._chunk_ops("W", g), f"W.{tag}", "compute", layer=self.chunk_layers(g))
                host_floor(f"W.{tag}", "W", self.chunk_runs(g))
                if reduce_now and dp_size > 1:
                    bucket["bytes"] += self.chunk_params_local(g) * grad_bytes
                    bucket["expert"] += self._layers_params(self.chunk_runs(g), expert_only=True) * grad_bytes
                    flush_bucket(prev[0], f"W.{tag}")
                continue
            if zero_bubble or not (self.detail or per_layer_gathers or overlapped_reduce):
                chain = self._backward_chain(actor, rank, g, tag) if self.chains and not zero_bubble else None
                if chain is not None:
                    add(chain)
                else:
                    recompute_ops = self._chunk_ops("R", g)
                    if recompute_ops:
                        run_ops(recompute_ops, f"B.{tag}.recompute", "recompute", layer=self.chunk_layers(g))
                        host_floor(f"B.{tag}.recompute", "R", self.chunk_runs(g))
                    run_ops(self._chunk_ops("B", g), f"B.{tag}", "compute", layer=self.chunk_layers(g))
                    host_floor(f"B.{tag}", "B", self.chunk_runs(g))
                    if self.chains:
                        prev[0] = self._chain_pass(compute_list, pass_start, streams[(actor, "compute")])
                if accumulates:
                    accumulate_grads(g, mb, tag)
                backward_memory(g, compute_list[pass_start], prev[0])
                lookup[("B_entry", actor, mb, g)] = compute_list[pass_start]
                lookup[("B_exit", actor, mb, g)] = prev[0]
                if mb == m_total - 1:  # fused_backward_update acts on the last micro-batch only
                    fused_backward_update(g, mb)
                continue
            if g == last_chunk:
                run_ops(self.head.backward, f"B.{tag}.head", "compute", layer=self.epilogue_name)
                if reduce_now:
                    bucket["bytes"] += self.epilogue_params * grad_bytes
            # ZeRO-3 backward prefetch: the next layer's all-gather is queued before the reduce-scatter of
            # the layer just done (FSDP BACKWARD_PRE, FSDP2 and Megatron-FSDP issue it when the current
            # layer's backward starts), so the gather runs beside the current layer's kernels and the
            # reduce-scatter beside the next one's; queued after it, every gather waited for the
            # previous layer's reduce-scatter and the backward ran serially with its collectives.
            # Host-blocking collectives (overlap_param_gather off: FSDP2 over gloo) keep that order.
            waiting_reduce: list[tuple[Task, str]] = []
            for layer in reversed(range(n_layers)):
                label = f"B.{tag}.L{layer}"
                kind = self.chunk_layer_kind(g, layer)
                work, lp = self.layer_works[kind], self.layer_params_local(kind)
                gathered = gather_params(label, self.layer_params_held(kind))
                if waiting_reduce:
                    flush_bucket(*waiting_reduce.pop())
                rc_ops, rc_runs = self.unit_recompute(g, layer, recompute)
                if rc_ops:
                    run_ops(rc_ops, f"{label}.recompute", "recompute", gathered, layer=self.layer_name(g, layer))
                    host_floor(f"{label}.recompute", "R", rc_runs)
                    gathered = ()
                done = run_ops(work.backward, label, "compute", gathered, layer=self.layer_name(g, layer))
                done = host_floor(label, "B", ((kind, 1),)) or done
                layer_ends.append(done)
                if overlapped_reduce:
                    bucket["bytes"] += lp * grad_bytes
                    bucket["expert"] += self.layer_params_split(kind)[1] * grad_bytes
                    if bucket["bytes"] >= bucket_limit:
                        if per_layer_gathers and par.overlap_param_gather:
                            waiting_reduce.append((done, label))
                        else:
                            flush_bucket(done, label)
            if waiting_reduce:
                flush_bucket(*waiting_reduce.pop())
            if g == 0:
                run_ops(self.embedding.backward, f"B.{tag}.embedding", "compute", layer=self.prologue_name)
            if overlapped_reduce:
                if g == 0:
                    bucket["bytes"] += self.prologue_params * grad_bytes
                flush_bucket(prev[0], f"B.{tag}")
            accumulate_grads(g, mb, tag)
            backward_memory(g, compute_list[pass_start], prev[0])
            lookup[("B_entry", actor, mb, g)] = compute_list[pass_start]
            lookup[("B_exit", actor, mb, g)] = prev[0]
            fused_backward_update(g, mb)

        end_of_backward = prev[0]
        if not (par.overlap_grad_reduce or zero >= 2 or par.schedule == "zb-h1") and dp_size > 1:
            bucket["bytes"] = self.stage_params_local(stage) * grad_bytes
            stage_kinds: dict[bool, int] = {}
            for c in range(par.virtual_stages):
                for kind, count in self.chunk_runs(c * par.pp + stage):
                    stage_kinds[kind] = stage_kinds.get(kind, 0) + count
            bucket["expert"] = self._layers_params(stage_kinds.items(), expert_only=True) * grad_bytes
            flush_bucket(end_of_backward, "grads")
        # Tied embeddings across pipeline stages: sum the two copies' gradients (Megatron).
        if self.tied_trained_params and par.pp > 1 and stage in (0, par.pp - 1):
            task = self.comm_task(actor, "dp", "dp_comm", "embedding_grad_all_reduce", rank,
                                  [("embedding", "all_reduce", self.tied_trained_params * grad_bytes)],
                                  key="embedding_grad")
            if task is not None:
                task.deps.append(end_of_backward)
                streams[(actor, "dp")].append(task)
                dp_tasks.append(task)

        local_params = self.stage_params_local(stage)
        if fusion == "backward":
            for g, waits_for in deferred:
                fused.append(add(chunk_update(g, f"optimizer_step.c{g}"), waits_for or tuple(dp_tasks)))
            return compute_list, tuple(fused)
        if fusion == "forward":
            chunks = [c * par.pp + stage for c in range(par.virtual_stages)]
            if not self.final_step:  # applied before each chunk's first forward of the next step
                self._forward_updates[actor] = {g: (chunk_update(g, f"optimizer_step.c{g}"), tuple(dp_tasks))
                                                for g in chunks}
                return compute_list, (prev[0], *dp_tasks)
            for g in chunks:  # the run's last step: nothing follows, update now
                fused.append(add(chunk_update(g, f"optimizer_step.c{g}"), tuple(dp_tasks)))
            return compute_list, tuple(fused)
        sharded = local_params / shard if zero >= 1 else local_params
        opt = Task("optimizer_step", actor, "compute", "optimizer",
                   duration_s=compute.optimizer_step_s(sharded, optimizer_bytes) if self.local_update else 0.0)
        add(opt, tuple(dp_tasks))
        opt.free_bytes += sum(grads_held.values())  # zero_grad(set_to_none=True)
        ends: tuple[Task, ...] = (opt,)
        if zero in (1, 2) and dp_size > 1 and not par.overlap_param_gather:
            task = self.comm_task(actor, "dp", "dp_comm", "param_all_gather", rank,
                                  [(self.shard_group, "all_gather", local_params * weight_bytes)], key="param_gather")
            if task is not None:
                task.deps.append(opt)
                streams[(actor, "dp")].append(task)
                ends = (opt, task)
        return compute_list, ends

    def _pp_payload(self, global_chunk: int = 0) -> float:
        """Bytes sent across the boundary after ``global_chunk`` per micro-batch (or their
        gradients back): every tensor made before the cut and read after it (a chain: the last
        layer's output; a residual network cut inside a block: the skip tensor too), ÷tp:
        Megatron's scatter/gather optimisation (or the sequence-parallel shards)."""
        cut = self.graph.prologue + self.chunk_starts[global_chunk] + self.layers_per_chunk[global_chunk]
        hit = self._payload_cache.get(cut)
        if hit is None:
            layers = self.graph.layers
            after = {name for layer in layers[cut:] for name in layer.inputs}
            hit = self._payload_cache[cut] = sum(layer.output_bytes for layer in layers[:cut] if layer.name in after)
        return hit / self.par.tp

    def _link_pipeline(self, lookup: dict[tuple, Task]) -> None:
        """Add the sends between stages and the cross-stage dependencies (in the order of ``lookup``:
        the engine runs a stream's tasks in list order and wakes waiters in the order they came)."""
        par = self.par
        last = self.chunks - 1
        coords = {actor: self.layout.coords(rank) for actor, rank in self.actor_ranks.items()}
        edges: dict[tuple[str, str, int], tuple] = {}  # (kind, actor, chunk) -> how its pass hands on

        def edge(kind: str, actor: str, g: int) -> tuple:
            """(receiver actor, within the stage, send prototype or None, name prefix): the same for every
            micro-batch of the chunk, so worked out once."""
            forward = kind == "F_exit"
            dst_stage = (g + 1) % par.pp if forward else (g - 1) % par.pp
            c = coords[actor]
            dst = self._pipeline_peer(self.layout.rank(type(c)(c.tp, c.cp, c.dp, dst_stage)), dst_stage)
            dst_actor = self.rank_actor[dst]
            if dst_stage == c.pp:
                return dst_actor, True, None, None, None
            prefix = "send_act" if forward else "send_grad"
            payload = self._pp_payload(g if forward else g - 1)
            proto = self.send_task(actor, dst, prefix, payload)
            # a cached pipeline edge: every micro-batch's send is this one renamed (a wide-area route
            # is asked for per send, as before)
            reusable = self.wan is None and proto.propagation_s == 0.0
            return dst_actor, False, (proto if reusable else (dst, payload)), prefix, streams[(actor, "pp")]

        streams = self._streams_ref
        for (kind, actor, mb, g), task in lookup.items():  # read only: the tasks' deps change, not the keys
            if kind == "F_exit":
                if g == last:
                    lookup[("B_entry", actor, mb, g)].deps.append(task)
                    continue
            elif kind != "B_exit" or g == 0:
                continue
            key = (kind, actor, g)
            hit = edges.get(key)
            if hit is None:
                hit = edges[key] = edge(kind, actor, g)
            dst_actor, local, proto, prefix, pp_stream = hit
            receiver = ("F_entry", dst_actor, mb, g + 1) if kind == "F_exit" else ("B_entry", dst_actor, mb, g - 1)
            if local:
                lookup[receiver].deps.append(task)
                continue
            name = f"{prefix}.mb{mb}.c{g}"
            if isinstance(proto, Task):
                send = Task(name, actor, "pp", "pp_comm", demands=proto.demands, latency_s=proto.latency_s,
                            deps=[task])
            else:
                send = self.send_task(actor, proto[0], name, proto[1])
                send.deps.append(task)
            pp_stream.append(send)
            lookup[receiver].deps.append(send)

    def _pipeline_peer(self, rank: int, stage: int) -> int:
        """The simulated rank that receives a send meant for ``rank`` of ``stage``: itself, or in
        symmetric mode on a mixed cluster (each stage represented by a rank of its slowest group, not
        all of one replica) the stage's representative."""
        return rank if rank in self.rank_actor else self.stage_representative(stage)

    def _stage_order(self, rank: int, stage: int):
        par = self.par
        if par.schedule != "zb-h1":
            return stage_order(par.schedule, par.num_micro_batches, par.pp, stage, par.virtual_stages)
        if self._zero_bubble_orders is None:
            # Pass times of a middle stage (no embedding or loss), isolated, for the list schedule.
            g = min(1, self.chunks - 1) if self.chunks > 2 else 0
            t_f, t_b, t_w = (sum(self.pass_cost_s(rank, self._chunk_ops(ph, g))) for ph in ("F", "B", "W"))
            t_b += sum(self.pass_cost_s(rank, self._chunk_ops("R", g)))
            t_comm = 0.0
            if par.pp > 1:
                probe = self.send_task(self.rank_actor[self.stage_representative(0)],
                                       self.stage_representative(1), "probe", self._pp_payload())
                t_comm = probe.latency_s + max(b / self.topo.port_capacity(p) for p, b in probe.demands.items())
            self._zero_bubble_orders = zero_bubble(par.num_micro_batches, par.pp, t_f, t_b, t_w, t_comm)
        return self._zero_bubble_orders[stage]

    def _chunk_ops(self, phase: str, global_chunk: int) -> tuple[Op, ...]:
        """All ops of one chunk pass, concatenated (cached): "F" forward, "B" backward,
        "R" the recomputed forward work of the chunk's layers."""
        ops = self._chunk_pass_ops.get((phase, global_chunk))  # asked for every pass of every micro-batch
        if ops is not None:
            return ops
        ops = self.pass_ops(phase, global_chunk == 0, global_chunk == self.chunks - 1,
                            self.chunk_runs(global_chunk))  # keyed by the kinds' counts, in layer order
        self._chunk_pass_ops[(phase, global_chunk)] = ops
        return ops

    def pass_ops(self, phase: str, first: bool, last: bool, runs: tuple[tuple[bool, int], ...]) -> tuple[Op, ...]:
        """The ops of a pass over a chunk of ``runs`` ((layer kind, count), ...), with the prologue
        if ``first`` and the epilogue if ``last`` (cached; :meth:`_chunk_ops`)."""
        key = (phase, first, last, runs)
        ops = self._pass_ops.get(key)
        if ops is None:
            works = self.layer_works

            def layers(part, order=runs) -> tuple[Op, ...]:
                return sum((part(works[kind]) * count for kind, count in order), ())

            backward = tuple(reversed(runs))  # the backward runs the chunk's layers last to first
            if phase == "F":
                ops = ((self.embedding.forward if first else ()) + layers(lambda w: w.forward)
                       + (self.head.forward if last else ()))
            elif phase == "B" and self.par.schedule == "zb-h1":
                ops = ((self.head.input_grad_ops() if last else ()) + layers(LayerWork.input_grad_ops, backward)
                       + (self.embedding.backward if first else ()))
            elif phase == "W":
                ops = (self.head.weight_grad_ops() if last else ()) + layers(LayerWork.weight_grad_ops, backward)
            elif phase == "B":
                ops = ((self.head.backward if last else ()) + layers(lambda w: w.backward, backward)
                       + (self.embedding.backward if first else ()))
            elif partial_full_of(self.par.recompute_mode) is not None:
                ops = self._partial_recompute_ops(runs)
            else:
                ops = layers(lambda w: w.recompute_ops(self.par.recompute_mode), backward)
            self._pass_ops[key] = ops
        return ops

    def _rerun_runs(self, runs: tuple[tuple[bool, int], ...]) -> tuple[tuple[bool, int], ...]:
        """The runs of layer kinds a chunk of ``runs`` re-runs under a partial full recompute (its checkpoint
        units' layers, workloads/graph.py ``full_units``), in layer order."""
        kinds = [kind for kind, count in runs for _ in range(count)]
        out: list[list] = []
        for first, end in full_units(self.par.recompute_mode, len(kinds)):
            for position in range(first, end):
                if out and out[-1][0] == kinds[position]:
                    out[-1][1] += 1
                else:
                    out.append([kinds[position], 1])
        return tuple((kind, count) for kind, count in out)

    def _partial_recompute_ops(self, runs: tuple[tuple[bool, int], ...]) -> tuple[Op, ...]:
        """The forwards a chunk of ``runs`` re-runs under Megatron-Core's partial full recompute: its checkpoint
        units' layers (workloads/graph.py ``full_units``: block N the first N, uniform N all), last to first."""
        kinds = [kind for kind, count in runs for _ in range(count)]
        rerun = [position for first, end in full_units(self.par.recompute_mode, len(kinds))
                 for position in range(first, end)]
        return sum((self.layer_works[kinds[p]].forward for p in reversed(rerun)), ())

    def zero3_copy_in_s(self, compute, params: float, shard: int, gathered_bytes: float) -> float:
        """Seconds of the kernels that fill a ZeRO-3 all-gather's input from this rank's shard (``params /
        shard`` elements) of a layer's parameters, gathered at ``gathered_bytes`` each. The shard is held at
        ``training.param_dtype``: 4 bytes (fp32) under ``param_dtype: fp32`` with mixed precision, else the
        gathered width.

        - FSDP1 (``zero_buffer_copies: fsdp1``): one cast of the shard to the low-precision ``_mp_shard`` it
          gathers from (torch 2.13 fsdp/_flat_param.py FlatParamHandle._use_low_precision_shard:
          ``_mp_shard.copy_(_local_shard)``, which casts): read the shard, write the gathered width.
        - FSDP2 (``true``): where the shard's dtype differs from the gathered one (MixedPrecisionPolicy
          param_dtype), _fsdp_collectives.py ``_get_param_all_gather_inputs`` first casts every shard into one
          flat low-precision buffer (``torch._foreach_copy_``), then ``all_gather_copy_in`` copies that into the
          all-gather input (``torch._foreach_copy_``): the cast, then a plain copy. Shard in the gathered dtype:
          the copy-in alone (FSDPParam.all_gather_inputs returns the shard itself)."""
        held = 4.0 if self.sc.training.param_dtype == "fp32" and self.precision in ("bf16", "fp16", "fp8") \
            else gathered_bytes
        if held == gathered_bytes:
            return compute.copy_s(params * gathered_bytes / shard)
        elements = params / shard
        cast_s = compute.copy_s(elements * (held + gathered_bytes) / 2)  # read held, write gathered
        if self.par.zero_buffer_copies == "fsdp1":
            return cast_s
        return cast_s + compute.copy_s(elements * gathered_bytes)

    def _copy_in(self, actor: str, after: Task, label: str, grad_bytes: float, zero: int, add) -> Task:
        """ZeRO-2/3 copy the bucket's gradients into the flat reduce-scatter input first
        (FSDP2 ``foreach_reduce`` -> ``foreach_reduce_scatter_copy_in`` -> ``chunk_cat`` of the
        unsharded gradients, every element once; torch 2.13 _fsdp_collectives.py; DeepSpeed's ipg
        bucket): a memory-bound kernel on the compute stream."""
        if zero < 2 or not self.par.zero_buffer_copies:
            return after
        compute = self.compute_of(self.actor_ranks[actor])
        if self.par.zero_buffer_copies is True:
            return add(Task(f"{label}.grad_copy_in", actor, "compute", "compute",
                            duration_s=compute.copy_s(grad_bytes)))
        # FSDP1 (torch fsdp/_flat_param.py, _runtime_utils.py): the layers' parameters are views split
        # from the flat parameter (FlatParamHandle._use_unsharded_views, as tensors in forward), so
        # autograd's split backward concatenates their gradients into the flat gradient, in the
        # parameters' dtype, on the compute stream; the post-backward hook then, on its own stream ahead
        # of the reduce-scatter, casts it to the reduce dtype where that differs
        # (``flat_param.grad.to(handle._reduce_dtype)``) and divides it in place by the predivide factor
        # (_reduce_grad -> _div_if_needed; _get_gradient_predivide_factor is > 1 for every world size >= 2).
        weight_bytes, reduce_bytes = WEIGHT_BYTES[self.precision], gradient_bytes(self.sc.training)
        elements = grad_bytes / reduce_bytes
        gathered = add(Task(f"{label}.grad_cat", actor, "compute", "compute",
                            duration_s=compute.copy_s(elements * weight_bytes)))
        cast = compute.copy_s(elements * (weight_bytes + reduce_bytes) / 2) if reduce_bytes != weight_bytes else 0.0
        divide = Task(f"{label}.grad_predivide", actor, "dp", "compute", duration_s=cast + compute.copy_s(grad_bytes))
        divide.deps.append(gathered)
        self._streams_ref[(actor, "dp")].append(divide)
        return divide

    def _pp_stream(self, actor: str) -> list[Task]:
        return self._streams_ref[(actor, "pp")]

    def _fused_pass(self, rank: int, ops: tuple[Op, ...], category: str):
        """(seconds, segments) of one task for ``ops`` with its exposed TP time folded in (where TP
        traffic has its links to itself); segments None when nothing is exposed. Cached per op tuple."""
        key = ("fused_task", id(ops), self._comm_class(rank), category)
        hit = self._time_cache.get(key)
        if hit is None or hit[0] is not ops:
            compute_s, comm = self.pass_cost_by_category(rank, ops)
            comm = {k: v for k, v in comm.items() if v > 0}
            hit = self._time_cache[key] = (ops, compute_s + sum(comm.values()),
                                           ((category, compute_s), *comm.items()) if comm else None)
        return hit[1], hit[2]

    def _backward_chain(self, actor: str, rank: int, g: int, tag: str) -> Task | None:
        """The chain task of a backward pass with recompute (its recompute, then its backward: one engine
        task, simulator/engine/engine.py) built directly, or None where the pass has no recompute or a
        host-floor stall (then its tasks are built one by one and chained by :meth:`_chain_pass`)."""
        chain = self._backward_chain_of(rank, g)
        if chain is None:
            return None
        return Task(f"B.{tag}", actor, "compute", "compute", duration_s=chain[0], parts=chain[1])

    def _backward_chain_of(self, rank: int, g: int) -> tuple[float, tuple[TaskPart, ...]] | None:
        """:meth:`_backward_chain_parts`, cached per (chunk, rank) (asked once per backward pass)."""
        chain = self._time_cache.get(("backward_chain_of", g, rank), False)
        if chain is False:
            chain = self._time_cache[("backward_chain_of", g, rank)] = self._backward_chain_parts(rank, g)
        return chain

    def _backward_chain_parts(self, rank: int, g: int) -> tuple[float, tuple[TaskPart, ...]] | None:
        """(duration, parts) of the chain task of chunk ``g``'s backward on ``rank``, or None (:meth:`_backward_chain`)."""
        recompute_ops = self._chunk_ops("R", g)
        if not recompute_ops:
            return None
        runs = self.chunk_runs(g)
        if self.host_floor_stall_s(rank, "R", runs) > 0 or self.host_floor_stall_s(rank, "B", runs) > 0:
            return None
        key = ("backward_chain", g, self._comm_class(rank))
        hit = self._time_cache.get(key)
        if hit is None:
            r_s, r_segments = self._fused_pass(rank, recompute_ops, "recompute")
            b_s, b_segments = self._fused_pass(rank, self._chunk_ops("B", g), "compute")
            hit = self._time_cache[key] = (r_s + b_s, (TaskPart(".recompute", "recompute", r_s, r_segments),
                                                       TaskPart("", "compute", b_s, b_segments)))
        return hit

    def _chain_pass(self, compute_list: list[Task], pass_start: int, stream: list[Task]) -> Task:
        """Make the pass's compute tasks (``compute_list[pass_start:]``, the tail of the compute ``stream``)
        one chain task where there are several and each waits only for the one before it (its recompute,
        its backward, a host-floor stall): the first task stands for all (its deps), the others leave the
        lists. Called before the pass's memory is counted and before anything else refers to its tasks.
        Returns the pass's last task (the chain, or the last one left as it was)."""
        tasks = compute_list[pass_start:]
        if len(tasks) < 2 or stream[-len(tasks):] != tasks:
            return compute_list[-1]
        for before, task in zip(tasks, tasks[1:], strict=False):
            if len(task.deps) != 1 or task.deps[0] is not before:
                return compute_list[-1]
        for task in tasks:
            if (task.demands is not None or task.rendezvous is not None or task.parts is not None
                    or task.alloc_bytes or task.free_bytes or task.propagation_s or task.info):
                return compute_list[-1]
        name = min((t.name for t in tasks), key=len)  # the pass's name; its parts' names add a suffix
        if not all(t.name.startswith(name) for t in tasks):
            return compute_list[-1]
        head, last = tasks[0], tasks[-1]
        head.parts = tuple(TaskPart(t.name[len(name):], t.category, t.duration_s, t.segments) for t in tasks)
        head.duration_s = sum(t.duration_s for t in tasks)
        head.name, head.category, head.segments = name, last.category, None
        del compute_list[pass_start + 1:]
        del stream[len(stream) - len(tasks) + 1:]
        return head


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


def kernel_info(ops: tuple[Op, ...], layer: str | None) -> tuple[tuple[str, object], ...]:
    """Trace arguments of a kernel task: its layer and the FLOPs its kernels run (each op's FLOPs
    times the share it executes, e.g. causal attention's skipped tiles; workloads/graph.py ``Op``)."""
    flops = sum(op.flops * op.executed_fraction for op in ops if op.kind != "collective")
    out: tuple[tuple[str, object], ...] = (("layer", layer),) if layer else ()
    return (*out, ("flops", flops))
