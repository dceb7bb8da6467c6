"""The ``replicated_pipeline`` strategy kind: a synchronous pipeline whose stages have their own
data-parallel degrees (DAPPLE, Fan et al. 2021, "DAPPLE: A Pipelined Data Parallel Approach for
Training Large Models", PPoPP '21, Sec. 3-4).

Stage i holds a contiguous run of the layer graph's layers (``stages[i].layers`` of them, in the
graph's topological order) on ``stages[i].replicas`` GPUs, data parallel inside the stage. The
global batch is cut into ``micro_batches`` micro-batches of G/M samples; each micro-batch enters
every stage split evenly over that stage's replicas (G/(M·r_i) samples each), so a stage with
more replicas runs a smaller per-GPU batch. Stages are placed on consecutive ranks in order
(stage 0 on ranks 0..r_0-1, ...), the way DAPPLE's planner lays devices out node by node
(Sec. 4.2, "fresh first"): a stage of up to one node's GPUs placed inside a node keeps its
all-reduce on NVLink.

What is simulated, one actor per stage (every replica of a stage does the same work at the same
time, DESIGN.md "Symmetry is the speed"):

- the early-backward schedule (DAPPLE Sec. 3.2: 1F1B, stage i warms up with S-i-1 forwards, then
  alternates one forward and one backward, so at most K_i = S-i micro-batches are in flight);
  ``extra_warmup`` e adds e forwards to the warm-up of every stage but the last (K_i = S-i+e, at
  most M), so that sends between stages that take as long as a pass (across the nodes' network)
  overlap with computation instead of stalling the next stage (default 0: K_i = S-i);
- forward and backward passes of the stage's layers at its per-replica batch, priced by the
  compute model (measured times for a per-layer profile);
- activation sends to the next stage and gradient sends back, split or gathered between unequal
  replica counts (Sec. 3.3): a replica of stage i sends the boundary tensors of its G/(M·r_i)
  samples, a replica of stage i+1 receives those of its G/(M·r_{i+1}) samples, so one transfer
  moves max of the two over the slower port (NVLink if every overlapping pair of replicas shares a
  node, else the NICs);
- the per-stage gradient all-reduce over the stage's replicas (the collective cost on the topology
  of those ranks), bucketed and overlapped with the last micro-batch's backward when
  ``parallelism.overlap_grad_reduce`` (as DDP does), then the optimizer step.

``parallelism.zero_stage: 1`` shards the optimizer state over a stage's replicas (gradients
reduce-scattered, the optimizer step on 1/r of the parameters, the weights all-gathered before the
next step's first forward, as the spmd kind does); DAPPLE itself keeps ZeRO 0.

The framework profile's step-level terms as spmd applies them (simulator/strategies/framework_terms.py):
kernels wait for the slowest of the job's ranks (``sync_jitter``); each layer's passes take the host
floors per layer and micro-batch (the eager issue floor, NeMo's fixed time per MoE layer, and on a stage
whose neighbour stage is on another node the cross-node pipeline floor on its pipelined layers); the
first stage's replicas load the next step's samples beside the step (``input_us_per_sample``, G / r_0
samples each); kernels slow beside their stage's transfers (``overlap_compute_slowdown``).

Memory per stage (:func:`stage_memory`): model state as spmd counts it, and for each of the K_i micro-batches in
flight the stage's layers' saved activations plus the boundary activations it keeps for the micro-batch that no
layer counts (:meth:`StagePrices.inter_stage_bytes`); over time from the same bytes (simulator/memory/over_time.py:
a forward allocates its micro-batch's, the backward frees them), so the simulated peak is the analytic one.

Not modelled: recompute, ZeRO 2/3, tensor parallelism inside a stage (DAPPLE has none either).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.collectives import collective_cost
from simulator.cost.compute import ComputeModel
from simulator.cost.topology import Topology
from simulator.engine.engine import Task
from simulator.memory.analytic import MIB, MemoryBreakdown, model_state_bytes, peak_stage
from simulator.memory.over_time import MemoryLedger
from simulator.scenario import gradient_bytes, layer_graph_of
from simulator.strategies.framework_terms import (
    input_task,
    is_moe_layer,
    kernel_stretch,
    layer_floor_stretch,
    mark_interference,
)
from simulator.strategies.plan import Plan
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.spmd.plan import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_BYTES
from simulator.strategies.tasklists import require


class StageSpec(BaseModel):
    """One pipeline stage: how many consecutive layers, on how many GPUs (data parallel inside)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: int = Field(gt=0, description="consecutive layers of the layer graph (topological order)")
    replicas: int = Field(gt=0, description="GPUs running this stage, data parallel among themselves")


class ReplicatedPipelineConfig(BaseModel):
    """A pipeline of ``stages`` (each its own data-parallel degree) over ``micro_batches`` micro-batches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["replicated_pipeline"] = "replicated_pipeline"
    stages: tuple[StageSpec, ...] = Field(min_length=1)
    micro_batches: int = Field(gt=0, description="micro-batches per step; each has global_batch_size / this samples")
    schedule: Literal["1f1b"] = Field(default="1f1b", description="DAPPLE's early backward (1F1B)")
    extra_warmup: int = Field(default=0, ge=0, description="forwards every stage but the last runs ahead beyond "
                                                           "1F1B's warm-up (in flight: S - i + this, at most M)")


def early_backward(micro_batches: int, stages: int, stage: int, extra_warmup: int = 0) -> list[tuple[str, int, int]]:
    """Stage ``stage``'s order of passes: DAPPLE's early backward (Sec. 3.2), K_i = S - i + e
    micro-batches in flight (e = ``extra_warmup``, 0 on the last stage), then one forward and one
    backward alternately; with e = 0 the 1F1B order of :func:`one_f_one_b`."""
    extra = extra_warmup if stage < stages - 1 else 0
    warmup = min(stages - stage - 1 + extra, micro_batches)
    order = [("F", j, 0) for j in range(warmup)]
    for j in range(warmup, micro_batches):
        order += [("F", j, 0), ("B", j - warmup, 0)]
    return order + [("B", j, 0) for j in range(micro_batches - warmup, micro_batches)]


def in_flight(cfg: ReplicatedPipelineConfig, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once under :func:`early_backward`."""
    stages = len(cfg.stages)
    return min(stages - stage + (cfg.extra_warmup if stage < stages - 1 else 0), cfg.micro_batches)


def check(scenario) -> ReplicatedPipelineConfig:
    """The config against the model, the cluster and the batch: one ConfigError naming the field."""
    cfg, par = scenario.strategy, scenario.parallelism
    require(not getattr(scenario, "mixed", False), "cluster.groups",
            "replicated_pipeline prices every stage on one accelerator and one node type: give cluster.node")
    require(par.tp == 1 and par.pp == 1 and par.cp == 1, "parallelism",
            "replicated_pipeline sets its own stages: leave tp, pp and cp at 1")
    require(par.zero_stage in (0, 1), "parallelism.zero_stage",
            "replicated_pipeline shards at most the optimizer state over a stage's replicas (ZeRO 0 or 1)")
    require(par.recompute == "none", "parallelism.recompute", "replicated_pipeline does not recompute")
    layers = len(scenario.layer_graph().layers)
    total = sum(s.layers for s in cfg.stages)
    require(total == layers, "strategy.stages",
            f"the stages hold {total} layers; the model {scenario.model.name} has {layers}")
    gpus = sum(s.replicas for s in cfg.stages)
    require(gpus == scenario.num_gpus, "strategy.stages",
            f"the stages' replicas use {gpus} GPUs; cluster.num_gpus is {scenario.num_gpus}")
    g, m = par.global_batch_size, cfg.micro_batches
    require(g % m == 0, "strategy.micro_batches", f"{m} does not divide global_batch_size {g}")
    for i, stage in enumerate(cfg.stages):
        require((g // m) % stage.replicas == 0, f"strategy.stages.{i}.replicas",
                f"{stage.replicas} replicas do not divide the micro-batch of {g // m} samples")
    return cfg


class StagePrices:
    """What each stage costs, from the compute model and the topology (shared by the kind and by
    the planners that estimate before they simulate)."""

    def __init__(self, scenario, cfg: ReplicatedPipelineConfig):
        self.sc, self.cfg = scenario, cfg
        self.topo = Topology(scenario.node, scenario.fabric, scenario.num_gpus)
        self.links = self.topo.links
        self.compute = ComputeModel(scenario.accelerator, scenario.training.precision, scenario.training.fp8_gemms,
                                    scenario.training.fp8_recipe, tf32=scenario.training.tf32)  # as spmd prices them
        self.stretch = kernel_stretch(scenario.accelerator.efficiency, scenario.num_gpus)  # framework_terms.py
        self.micro_batch = scenario.parallelism.global_batch_size // cfg.micro_batches
        self.starts = [sum(s.layers for s in cfg.stages[:i]) for i in range(len(cfg.stages) + 1)]
        self.offsets = [sum(s.replicas for s in cfg.stages[:i]) for i in range(len(cfg.stages) + 1)]
        self._cache: dict = {}

    def replica_batch(self, stage: int) -> int:
        return self.micro_batch // self.cfg.stages[stage].replicas

    def graph(self, stage: int):
        return layer_graph_of(self.sc.model, dataclasses.replace(self.sc.shard, micro_batch=self.replica_batch(stage)))

    def layers(self, stage: int):
        return self.graph(stage).layers[self.starts[stage]:self.starts[stage + 1]]

    def ranks(self, stage: int) -> tuple[int, ...]:
        return tuple(range(self.offsets[stage], self.offsets[stage + 1]))

    def layer_s(self, stage: int, phase: str) -> list[float]:
        """Seconds of each of the stage's layers, "forward" or "backward", at its per-replica batch (with the
        framework's host floors, :meth:`host_factors`)."""
        return [self.compute.layer_time_s(layer, phase) * self.stretch * factor
                for layer, factor in zip(self.layers(stage), self.host_factors(stage), strict=True)]

    def remote_neighbour(self, stage: int) -> bool:
        """Whether the stage sends to or receives from a neighbour stage on another node."""
        return any(0 <= b < len(self.cfg.stages) - 1 and self.boundary_link(b) == "nic" for b in (stage - 1, stage))

    def host_factors(self, stage: int) -> list[float]:
        """Each of the stage's layers' factor under the framework's host floors, as spmd applies them per
        layer and micro-batch (:func:`layer_host_factor`): the eager issue floor, NeMo's fixed time per MoE
        layer, and the cross-node pipeline floor on a stage whose neighbour is on another node."""
        key = ("host", stage)
        eff = self.sc.accelerator.efficiency
        if not (eff.host_dispatch_us_per_kernel or eff.moe_layer_fixed_us or eff.cross_node_pipeline_floor):
            return [1.0] * (self.starts[stage + 1] - self.starts[stage])
        if key not in self._cache:
            floor = eff.cross_node_pipeline_floor
            remote_s = floor.per_layer_s(1) if floor is not None and self.remote_neighbour(stage) else 0.0
            pipelined = {layer.name for layer in self.graph(stage).pipelined}
            self._cache[key] = [layer_host_factor(self.compute, layer, self.stretch, self.sc.accelerator.efficiency,
                                                  remote_s if layer.name in pipelined else 0.0)
                                for layer in self.layers(stage)]
        return self._cache[key]

    def input_samples(self) -> int:
        """Samples a replica of the first stage loads per step (its share of the global batch)."""
        return self.sc.parallelism.global_batch_size // self.cfg.stages[0].replicas

    def params(self, stage: int) -> float:
        return float(sum(layer.params for layer in self.layers(stage)))

    def boundary_bytes(self, stage: int, at_stage: int) -> float:
        """Bytes crossing from stages <= ``stage`` to later ones, for one replica of ``at_stage``'s batch."""
        layers = self.graph(at_stage).layers
        cut = self.starts[stage + 1]
        later_inputs = {name for layer in layers[cut:] for name in layer.inputs}
        return float(sum(layer.output_bytes for layer in layers[:cut] if layer.name in later_inputs))

    def inter_stage_bytes(self, stage: int) -> float:
        """Bytes of one micro-batch's boundary activations that a replica of ``stage`` keeps from the
        micro-batch's forward to its backward and that none of its layers counts as saved. The pipeline
        runtime keeps what a stage received and what it sent for every micro-batch in flight (the backward
        starts from the sent outputs with the gradients that come back for them and ends with the received
        inputs' gradients, which it sends back; DAPPLE Sec. 3.2-3.3, PipeDream's runtime, Megatron-LM's
        ``input_tensors`` / ``output_tensors``). The layer graph already counts a tensor where a layer of
        the stage saves it: a layer built from its kernels saves its input (workloads/networks/builder.py),
        so a tensor read on the stage by such a layer is counted; a producer whose saved bytes are at least
        its output keeps its output (an in-place ReLU, whose input is its output; every layer of a measured
        profile, PipeDream's graph.txt, whose stated activation is its output: workloads/networks/
        profiles.py). Every other tensor received or sent is added once: a profiled stage's received
        inputs (saved by their producers on the stage before), outputs nothing on the stage saves, and
        tensors the stage only passes on (a U-Net skip crossing it). At the replica's batch (split or
        gathered between unequal stages, Sec. 3.3, as :meth:`boundary_bytes`); 0 for a single stage."""
        layers = self.graph(stage).layers
        start, end = self.starts[stage], self.starts[stage + 1]
        read_here = {name for layer in layers[start:end] for name in layer.inputs}
        saved_as_input = {name for layer in layers[start:end] if layer.measured_forward_s is None
                          for name in layer.inputs}
        read_later = {name for layer in layers[end:] for name in layer.inputs}
        total = 0.0
        for index, layer in enumerate(layers[:end]):
            received = index < start and (layer.name in read_here or layer.name in read_later)
            if not (received or layer.name in read_later):  # not on a boundary of the stage
                continue
            if index >= start and layer.saved_bytes >= layer.output_bytes:  # its producer here keeps it
                continue
            if layer.name in saved_as_input:  # a reader here keeps it
                continue
            total += layer.output_bytes
        return total

    def micro_batch_bytes(self, stage: int) -> float:
        """What one micro-batch's forward on a replica of ``stage`` keeps until its backward: its layers'
        saved activations plus :meth:`inter_stage_bytes`."""
        return sum(layer.saved_bytes for layer in self.layers(stage)) + self.inter_stage_bytes(stage)

    def boundary_link(self, stage: int) -> str:
        """"nvl" when every pair of replicas of ``stage`` and ``stage+1`` that share samples shares a
        node, else "nic" (and "up" is added by :meth:`send_demands` across pods)."""
        b_src, b_dst = self.replica_batch(stage), self.replica_batch(stage + 1)
        for a, src in enumerate(self.ranks(stage)):
            for c, dst in enumerate(self.ranks(stage + 1)):
                if a * b_src < (c + 1) * b_dst and c * b_dst < (a + 1) * b_src:  # sample ranges overlap
                    if self.topo.node_of(src) != self.topo.node_of(dst):
                        return "nic"
        return "nvl"

    def send_s(self, stage: int) -> float:
        """Seconds of one boundary transfer alone on its links (for estimates)."""
        link = self.boundary_link(stage)
        nbytes = max(self.boundary_bytes(stage, stage), self.boundary_bytes(stage, stage + 1))
        if nbytes <= 0:
            return 0.0
        if link == "nvl":
            return self.links.intra_latency_s + nbytes / self.links.intra_bytes_per_s
        return self.links.inter_latency_s + nbytes / self.links.inter_bytes_per_s

    def all_reduce(self, stage: int, nbytes: float, collective: str = "all_reduce"):
        node = self.sc.node
        return collective_cost(collective, nbytes, self.topo.placement(self.ranks(stage)), self.links,
                               node.intra_laws, node.inter_node_collectives, node.nvls_all_reduce,
                               mesh_peers=node.gpus_per_node - 1 if node.intra_node.kind == "xgmi" else None)

    def gradient_bytes(self, stage: int) -> float:
        return self.params(stage) * gradient_bytes(self.sc.training)

    def all_reduce_s(self, stage: int) -> float:
        return self.all_reduce(stage, self.gradient_bytes(stage)).isolated_time_s(self.links)

    def optimizer_s(self, stage: int) -> float:
        """The stage's optimizer step; under ZeRO-1 over its shard (1/r of the parameters)."""
        precision = self.sc.training.precision
        per_param = OPTIMIZER_BYTES_PER_PARAM[self.sc.training.optimizer] * (32 / 28 if precision == "fp32" else 1)
        shards = self.cfg.stages[stage].replicas if self.sc.parallelism.zero_stage == 1 else 1
        return self.compute.optimizer_step_s(self.params(stage) / shards, per_param)

    @cached_property
    def pass_s(self) -> list[tuple[float, float]]:
        """(forward, backward) seconds of each stage for one micro-batch."""
        return [(sum(self.layer_s(i, "forward")), sum(self.layer_s(i, "backward"))) for i in range(len(self.cfg.stages))]


def layer_host_factor(compute: ComputeModel, layer, jitter: float, efficiency, remote_floor_s: float = 0.0) -> float:
    """A layer's factor on its forward and backward under the framework's host floors (simulator/strategies/
    framework_terms.py ``layer_floor_stretch``, spmd's rule per layer and micro-batch): the eager issue floor of
    its passes (``host_dispatch_us_per_kernel``), their time plus ``moe_layer_fixed_us`` for an MoE layer, and
    ``remote_floor_s`` (a cross-node pipeline floor); 1 for a profiled layer (measured times, no kernels)."""
    host_us, moe_us = efficiency.host_dispatch_us_per_kernel, efficiency.moe_layer_fixed_us
    if not (host_us or moe_us or remote_floor_s) or layer.measured_forward_s is not None:
        return 1.0
    passes = [[compute.time_s(op) * jitter for op in ops if op.kind != "collective"]
              for ops in (layer.forward, layer.backward) if ops]
    return layer_floor_stretch(passes, host_us, moe_us if is_moe_layer(layer.forward) else None, remote_floor_s)


def _transfer(actor: str, peer: str, name: str, link: str, out_bytes: float, in_bytes: float, prices: StagePrices,
              stream: str = "pp") -> Task:
    links = prices.links
    latency = links.intra_latency_s if link == "nvl" else links.inter_latency_s
    demands = {f"{actor}:{link}_tx": out_bytes, f"{peer}:{link}_rx": in_bytes}
    return Task(name, actor, stream, "pp_comm", demands=demands, latency_s=latency)


def compile_replicated_pipeline(scenario, mode: str | None = None, detail: bool = False) -> Plan:
    cfg = check(scenario)
    prices = StagePrices(scenario, cfg)
    s_count, m, steps = len(cfg.stages), cfg.micro_batches, scenario.simulation.steps
    actors = [f"stage{i}" for i in range(s_count)]
    streams: dict[tuple[str, str], list[Task]] = defaultdict(list)
    compute: dict[str, list[Task]] = defaultdict(list)
    bucket_bytes = scenario.parallelism.gradient_bucket_mb * 1e6
    overlap = scenario.parallelism.overlap_grad_reduce
    grad_per_param = gradient_bytes(scenario.training)

    def kernel(i: int, name: str, seconds: float, category: str = "compute", deps=()) -> Task:
        task = Task(name, actors[i], "compute", category, duration_s=seconds, deps=list(deps))
        streams[(actors[i], "compute")].append(task)
        compute[actors[i]].append(task)
        return task

    zero = scenario.parallelism.zero_stage
    reduce_kind = "all_reduce" if zero == 0 else "reduce_scatter"
    weight_bytes = WEIGHT_BYTES[scenario.training.precision]

    def all_reduce(i: int, name: str, nbytes: float, after: Task | None, collective: str = reduce_kind) -> Task | None:
        if cfg.stages[i].replicas == 1 or nbytes <= 0:
            return None
        cost = prices.all_reduce(i, nbytes, collective)
        demands = {}
        for link, b in cost.bytes_by_link.items():
            demands[f"{actors[i]}:{link}_tx"] = b
            demands[f"{actors[i]}:{link}_rx"] = b
        task = Task(name, actors[i], "dp", "dp_comm", demands=demands, latency_s=cost.latency_s,
                    deps=[after] if after is not None else [])
        streams[(actors[i], "dp")].append(task)
        return task

    step_ends: list[list[Task]] = []
    loaded: Task | None = None  # this step's samples, loaded by the first stage during the last step
    # memory over time from the stages' analytic breakdowns (simulator/memory/over_time.py)
    ledgers = [MemoryLedger(stage_memory(prices, i), prices.micro_batch_bytes(i)) for i in range(s_count)]
    for step in range(steps):
        forward, backward = {}, {}
        ends = []
        for i in range(s_count):
            f_s, b_s = prices.pass_s[i]
            layer_b = prices.layer_s(i, "backward")
            layer_params = [layer.params for layer in prices.layers(i)]
            reductions: list[Task] = []
            # ZeRO-1: the updated weights all-gathered at the step's start, before the first forward
            # (as the spmd kind does with overlap_param_gather; after the previous step's update).
            gather = None
            if zero == 1:
                gather = all_reduce(i, f"param_all_gather.s{step}", prices.params(i) * weight_bytes,
                                    compute[actors[i]][-1] if compute[actors[i]] else None, "all_gather")
            for phase, j, _ in early_backward(m, s_count, i, cfg.extra_warmup):
                tag = f"s{step}.mb{j}"
                if phase == "F":  # the compute stream runs in order: after the previous step's update
                    first = [t for t in (gather, loaded if i == 0 else None) if t is not None] if j == 0 else []
                    forward[i, j] = kernel(i, f"F.{tag}", f_s, deps=first)
                    ledgers[i].forward(forward[i, j])
                    continue
                if j < m - 1 or not overlap or cfg.stages[i].replicas == 1:
                    backward[i, j] = kernel(i, f"B.{tag}", b_s)
                    ledgers[i].backward(backward[i, j])
                    if j == m - 1:
                        reduced = all_reduce(i, f"grad_all_reduce.s{step}", prices.gradient_bytes(i), backward[i, j])
                        reductions = [reduced] if reduced else []
                    continue
                # the last backward layer by layer (last layer first), gradients reduced in buckets
                pending, first_task, task = 0.0, None, None
                for k in reversed(range(len(layer_b))):
                    task = kernel(i, f"B.{tag}.layer{k}", layer_b[k])
                    first_task = first_task or task
                    pending += layer_params[k] * grad_per_param
                    if pending >= bucket_bytes or k == 0:
                        reduced = all_reduce(i, f"grad_all_reduce.s{step}.bucket{len(reductions)}", pending, task)
                        if reduced:
                            reductions.append(reduced)
                        pending = 0.0
                backward[i, j] = task
                backward[i, j, "entry"] = first_task
                ledgers[i].backward(first_task, task)
            update = kernel(i, f"optimizer.s{step}", prices.optimizer_s(i), "optimizer", deps=tuple(reductions))
            ledgers[i].update(update)
            ends.append(update)
        # the first stage's replicas load the next step's samples beside this step, as spmd's first stage does
        # (framework_terms.py): the load ends the step too, and the next step's first forward waits for it
        loaded = input_task(scenario.accelerator.efficiency, actors[0], prices.input_samples(), f"input.next_batch.s{step}")
        if loaded is not None:
            streams[(actors[0], "input")].append(loaded)
            ends.append(loaded)
        for i in range(s_count):  # sends in the order each stage ran its passes
            for phase, j, _ in early_backward(m, s_count, i, cfg.extra_warmup):
                tag = f"s{step}.mb{j}"
                if phase == "F" and i + 1 < s_count:
                    send = _transfer(actors[i], actors[i + 1], f"send_act.{tag}", prices.boundary_link(i),
                                     prices.boundary_bytes(i, i), prices.boundary_bytes(i, i + 1), prices)
                    send.deps.append(forward[i, j])
                    streams[(actors[i], "pp")].append(send)
                    forward[i + 1, j].deps.append(send)
                elif phase == "B" and i > 0:
                    send = _transfer(actors[i], actors[i - 1], f"send_grad.{tag}", prices.boundary_link(i - 1),
                                     prices.boundary_bytes(i - 1, i), prices.boundary_bytes(i - 1, i - 1), prices)
                    send.deps.append(backward[i, j])
                    streams[(actors[i], "pp")].append(send)
                    backward.get((i - 1, j, "entry"), backward[i - 1, j]).deps.append(send)
        step_ends.append(ends)
    mark_interference(scenario.accelerator.efficiency, streams)  # as spmd marks its streams (framework_terms.py)
    ranks = {a: prices.offsets[i] for i, a in enumerate(actors)}
    extra = {"stage_layers": [s.layers for s in cfg.stages], "stage_replicas": [s.replicas for s in cfg.stages],
             "micro_batches": m, "extra_warmup": cfg.extra_warmup, "stage_forward_s": [f for f, _ in prices.pass_s],
             "stage_backward_s": [b for _, b in prices.pass_s]}
    return Plan(dict(streams), ranks, {a: i for i, a in enumerate(actors)}, [s.layers for s in cfg.stages],
                prices.topo, dict(compute), steps=steps, step_ends=step_ends, extra=extra, mode="symmetric",
                memory_base_bytes={a: ledgers[i].base_bytes for i, a in enumerate(actors)})


def stage_memory(prices: StagePrices, stage: int) -> MemoryBreakdown:
    """Weights, gradients and optimizer state of the stage's layers (whole, ZeRO 0, or the optimizer
    state over the stage's replicas, ZeRO 1: :func:`model_state_bytes`, as spmd counts them), plus the
    activations of the micro-batches the early backward keeps in flight on stage i (min(S - i + e, M),
    DAPPLE Sec. 3.2: :func:`in_flight`), at the stage's per-replica batch: each its layers' saved bytes
    and the boundary activations the stage keeps for it (:meth:`StagePrices.inter_stage_bytes`)."""
    sc = prices.sc
    tr = sc.training
    params = prices.params(stage)
    held = in_flight(prices.cfg, stage)
    saved = prices.micro_batch_bytes(stage)
    # as spmd counts them: ``training.param_dtype`` (fp32 master weights) and ``grad_dtype`` (the
    # bytes its all-reduce moves), ZeRO-1 over the stage's replicas
    weights, grads, optim = model_state_bytes(params, sc.parallelism.zero_stage, prices.cfg.stages[stage].replicas,
                                              tr.precision, tr.optimizer, gradient_bytes(tr), tr.param_dtype == "fp32")
    # the gradient buckets of the stage's all-reduce, as spmd counts them (PyTorch DDP's bucket_cap_mb,
    # in MiB; two buckets: one filling, one reducing); a stage of one replica reduces nothing
    buckets = 2 * sc.parallelism.gradient_bucket_mb * MIB if prices.cfg.stages[stage].replicas > 1 else 0.0
    return MemoryBreakdown(weights, grads, optim, held * saved, buckets, stage)


def memory_replicated_pipeline(scenario):
    cfg = check(scenario)
    prices = StagePrices(scenario, cfg)
    return peak_stage([stage_memory(prices, i) for i in range(len(cfg.stages))])


def step_lower_bound_replicated_pipeline(scenario, prices) -> float:
    """A lower bound on the simulated step (seconds), from compute and the sends between stages, as spmd's pipeline
    chain (simulator/explore/bounds.py): with f_i, b_i stage i's forward and backward of one micro-batch
    (:attr:`StagePrices.pass_s`), s_i the send across the cut after stage i alone on its link
    (:meth:`StagePrices.send_s`), F_i = (f_0 + s_0) + ... + (f_(i-1) + s_(i-1)) and
    B_i = (b_0 + s_0) + ... + (b_(i-1) + s_(i-1)), o_i its optimizer step, M micro-batches and N steps: the largest
    over the stages of [F_i + N·(M·(f_i + b_i) + o_i)] / N and (i > 0) F_i + M·(f_i + b_i) + B_i + o_0.

    Why it bounds the step: the step is the run's end over N (no window, simulator/simulate.py). Stage i's first
    forward of a step waits for micro-batch 0's forwards of the step on the stages before it (each send after its
    forward), and stage 0's comes after its update of the step before on its compute stream; stage i's compute
    stream runs the step's M forwards and M backwards (the last one cut into its layers, the same seconds) and
    its update one at a time (:func:`compile_replicated_pipeline`); after its last backward, that micro-batch's
    backward runs on stage i - 1 (its first layer's task waits for the gradient sent back), then on i - 2, ...,
    stage 0, whose update comes after it on its stream. So stage i's own stream holds the first term, and each
    step ends stage 0's update at least F_i + M·(f_i + b_i) + B_i + o_0 after the one before (or after time 0). Every pass and update is a fixed-duration
    task that the engine never runs in less (interference only slows it; simulator/engine/engine.py); a send
    (:func:`_transfer`: its bytes on the sender's and the receiver's ports of the link, whose capacities are the
    ones ``send_s`` divides by, ``Topology.port_capacity``) waits its latency and then moves at a max-min fair rate
    never above a port's capacity (simulator/engine/network.py), so it lasts at least ``send_s``. All-reduces,
    gathers and loads only add (not counted). ``prices`` (:class:`simulator.explore.bounds.KindPrices`)
    is not read. tests/test_kind_bounds.py checks it against the engine."""
    cfg = check(scenario)
    stage_prices = StagePrices(scenario, cfg)
    m, steps = cfg.micro_batches, scenario.simulation.steps
    passes = stage_prices.pass_s
    updates = [stage_prices.optimizer_s(i) for i in range(len(passes))]
    best, fill, drain = 0.0, 0.0, 0.0
    for i, (f_s, b_s) in enumerate(passes):
        best = max(best, (fill + steps * (m * (f_s + b_s) + updates[i])) / steps,
                   fill + m * (f_s + b_s) + drain + updates[0] if i else 0.0)
        send_s = stage_prices.send_s(i) if i + 1 < len(passes) else 0.0
        fill += f_s + send_s
        drain += b_s + send_s
    return best


#: The fields of ``clustersim search``'s space that change what replicated_pipeline simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): the batch, ZeRO-1 over a stage's replicas and the overlap of the replicas'
#: all-reduce; its stages, replicas and micro-batches are the strategy block's (tp, pp, cp refused unless 1;
#: ``micro_batch_size`` and ``schedule`` not read; recompute refused).
REPLICATED_PIPELINE_SEARCHED_FIELDS: tuple[str, ...] = ("global_batch_size", "zero_stage", "overlap_grad_reduce")


REPLICATED_PIPELINE = register(StrategyKind(
    name="replicated_pipeline",
    config=ReplicatedPipelineConfig,
    summary="DAPPLE pipeline: stages of their own layer counts and data-parallel degrees, 1F1B, "
            "split/gathered sends between unequal stages, per-stage gradient all-reduce",
    compile=compile_replicated_pipeline,
    memory=memory_replicated_pipeline,
    # the stages' replicas are the kind's own data parallelism (it checks its own batch divisibility);
    # parallelism: lays out only tp x cp x pp, so dp: auto is 1 and a batch of 2 on 8 GPUs is not refused
    layout_gpus=lambda config, parallelism, num_gpus: parallelism.tp * parallelism.cp * parallelism.pp,
    searched_layout_fields=lambda config: REPLICATED_PIPELINE_SEARCHED_FIELDS,
    derives_layout=False,
    step_lower_bound=step_lower_bound_replicated_pipeline,
))
