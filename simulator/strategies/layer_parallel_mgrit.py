"""The ``layer_parallel_mgrit`` strategy kind: layer-parallel training with multigrid in time
(Günther, Ruthotto, Schroder, Cyr & Gauger 2020, "Layer-Parallel Training of Deep Residual
Neural Networks", SIAM J. Math. Data Sci. 2(1), arXiv:1812.04352; MGRIT of Falgout, Friedhoff,
Kolev, MacLachlan & Schroder 2014, "Parallel time integration with multigrid", SIAM J. Sci.
Comput. 36(6)).

A residual network u_{j+1} = u_j + h·F(u_j, θ_j) is a forward-Euler time stepping over its N
residual blocks (simulator/strategies/residual_blocks.py, read from the graph's add layers: the
time steps; the opening layers run on the first rank before them, the closing layers on the last
rank after them; non-residual layers between two residual blocks, such as GNMT's decoder bottom,
run inside the step before them). GNMT-16's 12 residual LSTM layers (Wu et al. 2016) are steps of
one width too: layer-parallel over their depth is our extension (the paper trains ResNets).
Networks with no residual step (VGG-16, Inception-v3, U-Net: plain chains and concatenations)
are refused, and we judge that the honest answer: Günther et al. derive the method from the ODE
view u_{j+1} = u_j + h·F(u_j, θ_j), and the coarse propagator is that residual step with step
m·h, which has no justified meaning (and no convergence result) where consecutive layers are not
steps of one ODE of one shape. MGRIT as an algorithm needs only a chain of propagators, but the
follow-ups we know keep the residual form (Cyr, Günther & Schroder 2019; Kirby et al. 2020;
TorchBraid) or run MGRIT along a recurrent net's sequence instead of its depth (Moon & Cyr 2022,
a different parallel axis, not modelled). U-Net's encoder-decoder skips are concatenations
across scales, not residual steps. (Citations from memory.) The P ranks
(``parallelism.pp``) each own N/P consecutive blocks (weights and states), and instead of the
serial sweep the forward states are found by MGRIT iterations, the adjoint (backward) states by
MGRIT on the reversed chain, then every rank computes its blocks' weight gradients at once.

One MGRIT iteration is a V-cycle over ``levels`` grids (Falgout 2014, Alg. 2; FAS for the
nonlinear propagator as Günther 2020 Sec. 3): level l has N/c^l steps (c = ``coarsening_factor``),
step j of level l propagates over fine blocks [j·c^l, (j+1)·c^l) at the price of one evaluation of
block j·c^l (the coarse propagator Φ_Δ is the layer at the interval's start with step c^l·h,
Günther 2020 Sec. 3.2); every c-th point is a C-point. On every level but the coarsest:

1. relaxation, ``F`` or ``FCF`` (Falgout 2014 Sec. 3): F-relaxation steps from each C-point
   through the c - 1 F-points after it; C-relaxation steps each C-point from the F-point
   before it (a neighbour's state where the interval starts on the rank before);
2. the FAS coarse right-hand side at every C-point: one fine step from the F-point before it
   (the residual) and one coarse step from the C-point before it (Φ_Δ of the restricted state);
3. the V-cycle on the next level (C-points by injection);
4. the correction of the C-points and an F-relaxation (interpolation).

The coarsest level is solved serially: its N/c^(levels-1) steps one after another, handed from
rank to rank. ``forward_iterations`` and ``backward_iterations`` V-cycles make one forward and
one backward solve (the paper runs a few: the solve is inexact; its effect on training is not
modelled). Each block evaluation is a task priced from its ops (the forward ops; the adjoint step
the backward ops without the weight-gradient GEMMs, ``*.wgrad``), each state crossing a rank
boundary a point-to-point send of the block's output bytes (one state of the network's width),
priced on the topology like a pipeline send. The coarse right-hand side is combined with the
arriving state by a join (the element-wise add is not priced).

Per micro-batch: the opening forward (rank 0), the forward solve, the closing forward and
backward (last rank), the backward solve, the opening backward; then the weight gradients of
every rank's blocks; after the micro-batches, each rank's optimizer step over its parameters.
``mgrit_speedup`` compares the step with the serial forward and backward of the whole network on
one device (same micro-batches, one optimizer step): it grows with ranks until the serial coarse
level and the relaxation's constant work per point dominate (bounded by serial / (iterations ×
coarse sweep)). Memory per rank: its parameters' weights, gradients and optimizer state, the
activations its blocks keep for one micro-batch (every block's for the weight gradients), and two
states per coarse point it owns (the state and its FAS right-hand side).

The framework profile's step-level terms as spmd applies them (simulator/strategies/framework_terms.py):
kernels wait for the slowest of the job's ranks (``sync_jitter``); each layer's evaluations take the
host floors spmd puts on the layer's passes (the eager issue floor, NeMo's fixed time per MoE layer,
and on a rank whose neighbour rank is on another node the cross-node pipeline floor: :func:`host_factor`);
rank 0 loads the next step's samples beside the step (``input_us_per_sample``), and the next step's
first opening waits for them; kernels slow beside their rank's sends (``overlap_compute_slowdown``).

With ``parallelism.recompute: full`` each block keeps only its input (the block is a checkpoint
unit, simulator/memory/checkpoints.py) and re-runs its forward before every backward through it:
before each adjoint evaluation and once more before the weight gradients (``torch.utils.checkpoint``
re-runs a block on every backward through it); the rank's memory adds one block's re-created
activations. The serial reference re-runs each block once.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.cost.collectives import collective_cost
from simulator.cost.compute import ComputeModel
from simulator.cost.topology import Topology, send_demands
from simulator.engine.engine import Task
from simulator.errors import ConfigError
from simulator.memory.analytic import MemoryBreakdown, model_state_bytes, peak_stage
from simulator.memory.checkpoints import kept_per_layer, stage_bytes
from simulator.memory.over_time import MemoryLedger
from simulator.scenario import gradient_bytes
from simulator.strategies.framework_terms import (
    input_task,
    is_moe_layer,
    kernel_stretch,
    layer_floor_stretch,
    mark_interference,
)
from simulator.strategies.plan import Plan
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.residual_blocks import Block, no_residual_reason, residual_chain
from simulator.strategies.spmd.plan import OPTIMIZER_BYTES_PER_PARAM
from simulator.strategies.tasklists import require
from workloads.graph import Op
from workloads.layer_graph import Layer


class LayerParallelMgritConfig(BaseModel):
    """``strategy: {kind: layer_parallel_mgrit, coarsening_factor: c, ...}``; ranks: ``parallelism.pp``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["layer_parallel_mgrit"] = "layer_parallel_mgrit"
    coarsening_factor: int = Field(default=4, ge=2, description="c: every c-th layer is a C-point of the next level")
    levels: int = Field(default=2, ge=2, le=12, description="grid levels of a V-cycle; the coarsest is solved serially")
    relaxation: Literal["F", "FCF"] = Field(default="FCF", description="relaxation sweep on every level but the coarsest")
    forward_iterations: int = Field(default=2, ge=1, le=100, description="MGRIT V-cycles of the forward solve")
    backward_iterations: int = Field(default=1, ge=1, le=100, description="MGRIT V-cycles of the backward (adjoint) solve")
    residual_norm: bool = Field(
        default=True, description="end every V-cycle with an all-reduce of the residual norm (XBraid's convergence "
                                  "test, a barrier across ranks); false: the fixed iterations run as a dataflow")


@dataclasses.dataclass(frozen=True)
class Chain:
    """The network as time steps: per block its forward, adjoint and weight-gradient seconds."""

    opening: tuple[Layer, ...]
    closing: tuple[Layer, ...]
    forward_s: tuple[float, ...]
    adjoint_s: tuple[float, ...]
    wgrad_s: tuple[float, ...]
    state_bytes: tuple[float, ...]     # state j (the input of block j; j = N: the last block's output)
    params: tuple[float, ...]
    kept_bytes: tuple[float, ...]      # activations each block keeps for its weight gradients
    recompute_s: tuple[float, ...]     # what recompute re-runs of each block before a backward through it
    working_bytes: tuple[float, ...]   # what each block's recompute re-creates in its backward (0: none)
    ranks: int

    @property
    def blocks(self) -> int:
        return len(self.forward_s)

    def owner(self, block: int) -> int:
        return min(block, self.blocks - 1) // (self.blocks // self.ranks)


def _config(scenario) -> LayerParallelMgritConfig:
    return scenario.strategy


def _is_wgrad(op: Op) -> bool:
    return op.name.endswith("wgrad")


def time_steps(blocks: list[Block]) -> list[Block]:
    """The chain's time steps: each residual block, a non-residual block between two (GNMT's
    decoder bottom between its encoder's and decoder's residual LSTMs) run within the step
    before it (it is no x + h·F(x) step of its own: the coarse levels never start at it)."""
    steps: list[Block] = []
    for block in blocks:
        if block.residual or not steps:
            steps.append(block)
        else:
            last = steps.pop()
            steps.append(Block(last.name, last.layers + block.layers, True, False))
    return steps


def chain_of(scenario) -> Chain:
    """The scenario's blocks priced on its accelerator, after checking the layout (errors name the field)."""
    cfg, par = _config(scenario), scenario.parallelism
    require(not getattr(scenario, "mixed", False), "cluster.groups",
            "layer_parallel_mgrit prices every rank on one accelerator: give cluster.node")
    require(par.tp == 1 and par.cp == 1 and par.ep == 1 and par.dp_degree == 1, "parallelism",
            "layer_parallel_mgrit splits layers only: tp, cp, ep and dp must be 1 (ranks = pp)")
    require(par.virtual_stages == 1, "parallelism.virtual_stages", "layer_parallel_mgrit owns one block range per rank")
    graph = scenario.layer_graph()
    opening, blocks, closing = residual_chain(graph)
    require(bool(blocks), "model", f"{no_residual_reason(graph)}; layer-parallel MGRIT (Günther et al. 2020) "
                                   "coarsens the residual steps of one ODE, and this network has none")
    blocks = time_steps(blocks)
    n, p, c = len(blocks), par.pp, cfg.coarsening_factor
    if n % p:
        raise ConfigError("parallelism.pp", f"{p} ranks do not divide the {n} residual blocks of {graph.name}")
    coarse = c ** (cfg.levels - 1)
    if (n // p) % c or n % coarse:
        raise ConfigError("strategy.coarsening_factor",
                          f"c = {c} over {cfg.levels} levels needs c to divide the {n // p} blocks per rank and "
                          f"c^(levels-1) = {coarse} to divide the {n} blocks of {graph.name}")
    tr = scenario.training
    compute = ComputeModel(scenario.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)
    recompute = par.recompute
    jitter = kernel_stretch(scenario.accelerator.efficiency, scenario.num_gpus)  # framework_terms.py
    topo = Topology(scenario.node, scenario.fabric, scenario.num_gpus)
    remote_s = remote_floor_s(scenario, topo)
    per = n // p

    def seconds(layers, phase: str, keep=lambda op: True, rank: int = 0) -> float:
        total = 0.0
        for layer in layers:
            factor = host_factor(scenario, compute, layer, jitter, remote_s[rank])  # the host floors, per layer
            if phase == "recompute":
                if layer.measured_forward_s is not None:
                    total += layer.measured_forward_s if recompute == "full" else 0.0
                else:
                    total += compute.ops_time_s(layer.recompute_ops(recompute)) * factor
                continue
            measured = layer.measured_forward_s if phase == "forward" else layer.measured_backward_s
            if measured is not None:
                total += measured
            else:
                ops = layer.forward if phase == "forward" else layer.backward
                total += compute.ops_time_s(tuple(op for op in ops if keep(op))) * factor
        return total * jitter

    first_input = graph.input_bytes(blocks[0].layers[0]) or blocks[0].output_bytes
    kept = dict(zip((layer.name for layer in graph.layers), kept_per_layer(graph, recompute), strict=True))
    position = {layer.name: i for i, layer in enumerate(graph.layers)}
    return Chain(
        opening=opening, closing=closing,
        forward_s=tuple(seconds(b.layers, "forward", rank=i // per) for i, b in enumerate(blocks)),
        adjoint_s=tuple(seconds(b.layers, "backward", lambda op: not _is_wgrad(op), i // per)
                        for i, b in enumerate(blocks)),
        recompute_s=tuple(seconds(b.layers, "recompute", rank=i // per) for i, b in enumerate(blocks)),
        wgrad_s=tuple(seconds(b.layers, "backward", _is_wgrad, i // per) for i, b in enumerate(blocks)),
        state_bytes=(first_input, *(b.output_bytes for b in blocks)),
        params=tuple(b.params for b in blocks),
        kept_bytes=tuple(sum(kept[layer.name] for layer in b.layers) for b in blocks),
        working_bytes=tuple(stage_bytes(graph, recompute, [position[layer.name] for layer in b.layers])[1]
                            for b in blocks),
        ranks=p)


class _Solve:
    """Builds the tasks of MGRIT solves on the ranks' streams (see the module docstring).

    A chain direction is a view: ``forward`` steps block j from state j to j + 1; the adjoint
    (``forward=False``) steps reversed index j (block N-1-j) from adjoint state N-j to N-j-1.
    Tasks are appended in one global order in which every dependency comes first, so the per-rank
    stream orders never deadlock."""

    def __init__(self, scenario, chain: Chain, cfg: LayerParallelMgritConfig, streams, compute_tasks):
        self.sc, self.chain, self.cfg = scenario, chain, cfg
        self.streams, self.compute_tasks = streams, compute_tasks
        self.topo = Topology(scenario.node, scenario.fabric, scenario.num_gpus)
        self.links = self.topo.links
        self.actors = [f"rank{r}" for r in range(chain.ranks)]
        self.sends = 0
        self.evaluations = 0

    # -- tasks -----------------------------------------------------------------------------

    def kernel(self, rank: int, name: str, seconds: float, deps, category: str = "compute") -> Task:
        actor = self.actors[rank]
        task = Task(name, actor, "compute", category, duration_s=seconds, deps=[d for d in deps if d is not None])
        self.streams[(actor, "compute")].append(task)
        self.compute_tasks[actor].append(task)
        return task

    def send(self, src: int, dst: int, name: str, nbytes: float, after: Task | None) -> Task:
        """A state from rank ``src`` to ``dst`` (as a pipeline send: NVLink inside a node, NIC across)."""
        a, b = self.actors[src], self.actors[dst]
        links = self.topo.send_links(src, dst)
        latency = self.links.intra_latency_s if links == ("nvl",) else self.links.inter_latency_s
        demands = send_demands(a, b, links, nbytes)
        task = Task(name, a, "pp", "pp_comm", demands=demands, latency_s=latency, deps=[after] if after else [])
        self.streams[(a, "pp")].append(task)
        self.sends += 1
        return task

    def join(self, rank: int, name: str, deps) -> Task:
        """The arriving state and the coarse right-hand side combined (not priced: an element-wise add)."""
        actor = self.actors[rank]
        task = Task(name, actor, "join", "compute", duration_s=0.0, deps=[d for d in deps if d is not None])
        self.streams[(actor, "join")].append(task)
        return task

    # -- the chain seen from one direction --------------------------------------------------

    def block(self, forward: bool, level: int, j: int) -> int:
        """The block whose layer evaluates step j of ``level`` (the interval's first)."""
        fine = j * self.cfg.coarsening_factor ** level
        return fine if forward else self.chain.blocks - 1 - fine

    def state_owner(self, forward: bool, level: int, j: int) -> int:
        fine = j * self.cfg.coarsening_factor ** level
        return self.chain.owner(fine if forward else self.chain.blocks - fine)

    def state_bytes(self, forward: bool, level: int, j: int) -> float:
        fine = j * self.cfg.coarsening_factor ** level
        return self.chain.state_bytes[fine if forward else self.chain.blocks - fine]

    def evaluate(self, forward: bool, level: int, j: int, source: Task | None, label: str) -> Task:
        """Φ at step j of ``level`` from the state ``source`` produced; returns the task after
        which the result is at the owner of state j + 1."""
        b = self.block(forward, level, j)
        rank = self.chain.owner(b)
        here = self.state_owner(forward, level, j)
        if here != rank:
            source = self.send(here, rank, f"{label}.in", self.state_bytes(forward, level, j), source)
        seconds = (self.chain.forward_s if forward else self.chain.adjoint_s)[b]
        if not forward and self.chain.recompute_s[b] > 0:  # the block's forward again from its kept input
            source = self.kernel(rank, f"{label}.L{level}.s{j}.recompute", self.chain.recompute_s[b], [source],
                                 "recompute")
        task = self.kernel(rank, f"{label}.L{level}.s{j}", seconds, [source])
        self.evaluations += 1
        there = self.state_owner(forward, level, j + 1)
        if there != rank:
            return self.send(rank, there, f"{label}.L{level}.s{j}.out", self.state_bytes(forward, level, j + 1), task)
        return task

    # -- MGRIT --------------------------------------------------------------------------------

    def solve(self, forward: bool, first: Task | None, iterations: int, tag: str) -> list[Task | None]:
        """``iterations`` V-cycles from the exact first state ``first`` (zero initial guess
        elsewhere); returns the task that last wrote each fine state."""
        c, levels = self.cfg.coarsening_factor, self.cfg.levels
        points = [self.chain.blocks // c ** level for level in range(levels)]
        state: list[list[Task | None]] = [[None] * (n + 1) for n in points]
        state[0][0] = first
        for it in range(iterations):
            self._vcycle(forward, 0, state, [dict() for _ in range(levels)], points, f"{tag}.it{it}")
            if self.cfg.residual_norm:
                self.norm_all_reduce(f"{tag}.it{it}.norm")
        return state[0]

    def norm_all_reduce(self, name: str) -> None:
        """The residual norm (one fp32 scalar per rank) all-reduced over the ranks, on each rank's
        compute stream: the next V-cycle starts when every rank has it."""
        ranks = tuple(range(self.chain.ranks))
        if len(ranks) == 1:
            return
        node = self.sc.node
        cost = collective_cost("all_reduce", 4.0, self.topo.placement(ranks), self.links, node.intra_laws,
                               node.inter_node_collectives, node.nvls_all_reduce,
                               mesh_peers=node.gpus_per_node - 1 if node.intra_node.kind == "xgmi" else None)
        for actor in self.actors:
            demands = {}
            for link, b in cost.bytes_by_link.items():
                demands[f"{actor}:{link}_tx"] = b
                demands[f"{actor}:{link}_rx"] = b
            task = Task(name, actor, "compute", "pp_comm", demands=demands, latency_s=cost.latency_s,
                        rendezvous=name, rendezvous_size=len(ranks))
            self.streams[(actor, "compute")].append(task)

    def _advance(self, forward: bool, level: int, j: int, state, rhs, label: str) -> None:
        out = self.evaluate(forward, level, j, state[level][j], label)
        g = rhs[level].get(j + 1)
        state[level][j + 1] = self.join(self.state_owner(forward, level, j + 1), f"{label}.L{level}.join{j + 1}",
                                        [out, g]) if g is not None else out

    def _vcycle(self, forward: bool, level: int, state, rhs, points, label: str) -> None:
        c = self.cfg.coarsening_factor
        n = points[level]
        if level == len(points) - 1:  # the coarsest level: serial
            for j in range(n):
                self._advance(forward, level, j, state, rhs, f"{label}.coarse")
            return

        def f_relax(tag: str) -> None:
            for start in range(0, n, c):
                for j in range(start, start + c - 1):
                    self._advance(forward, level, j, state, rhs, f"{label}.{tag}")

        f_relax("F")
        if self.cfg.relaxation == "FCF":
            for point in range(c, n + 1, c):
                self._advance(forward, level, point - 1, state, rhs, f"{label}.C")
            f_relax("F2")
        # FAS right-hand side of the next level at every C-point (the first state is exact)
        nxt = level + 1
        for point in range(c, n + 1, c):
            residual = self.evaluate(forward, level, point - 1, state[level][point - 1], f"{label}.R")
            tau = self.evaluate(forward, nxt, point // c - 1, state[level][point - c], f"{label}.tau")
            rhs[nxt][point // c] = self.join(self.state_owner(forward, level, point), f"{label}.L{nxt}.rhs{point // c}",
                                             [residual, tau, state[level][point], rhs[level].get(point)])
        for i in range(points[nxt] + 1):
            state[nxt][i] = state[level][i * c]
        self._vcycle(forward, nxt, state, rhs, points, label)
        for i in range(1, points[nxt] + 1):  # correction at the C-points (element-wise, not priced)
            state[level][i * c] = state[nxt][i]
        f_relax("interp")


def _layers_s(scenario, compute: ComputeModel, layers, phase: str, jitter: float = 1.0) -> float:
    """The opening or closing layers' seconds (with the eager and MoE host floors; no pipeline floor: spmd
    applies that to the pipelined blocks only)."""
    return sum(compute.layer_time_s(layer, phase) * host_factor(scenario, compute, layer, jitter)
               for layer in layers) * jitter


def remote_floor_s(scenario, topo: Topology) -> list[float]:
    """Per rank, the cross-node pipeline floor per block layer and micro-batch (simulator/cost/host_floor.py):
    the ranks exchange states with their neighbour ranks as a pipeline's stages do, so a rank whose
    neighbour rank is on another node takes the floor spmd gives such a stage (tp 1); 0 elsewhere."""
    floor, ranks = scenario.accelerator.efficiency.cross_node_pipeline_floor, scenario.parallelism.pp
    if floor is None or ranks == 1:
        return [0.0] * ranks
    return [floor.per_layer_s(1) if any(0 <= q < ranks and topo.node_of(q) != topo.node_of(r) for q in (r - 1, r + 1))
            else 0.0 for r in range(ranks)]


def host_factor(scenario, compute: ComputeModel, layer, jitter: float, remote_s: float = 0.0) -> float:
    """A layer's factor on every evaluation of it under the framework's host floors (simulator/strategies/
    framework_terms.py ``layer_floor_stretch``, spmd's rule per layer and micro-batch: the floor over the
    layer's forward, backward and recompute passes, spread over them in proportion): the eager issue floor
    (``host_dispatch_us_per_kernel``), NeMo's fixed time per MoE layer (``moe_layer_fixed_us``) and
    ``remote_s`` (the cross-node pipeline floor). Each MGRIT evaluation of the layer (forward, adjoint,
    weight gradient, recompute) is a pass of it and takes its share, so a layer evaluated in every
    relaxation sweep pays the floor in every sweep. 1 for a profiled layer (measured times, no kernels)."""
    eff = scenario.accelerator.efficiency
    host_us, moe_us = eff.host_dispatch_us_per_kernel, eff.moe_layer_fixed_us
    if not (host_us or moe_us or remote_s) or layer.measured_forward_s is not None:
        return 1.0
    recompute = layer.recompute_ops(scenario.parallelism.recompute)
    passes = [[compute.time_s(op) * jitter for op in ops if op.kind != "collective"]
              for ops in (layer.forward, layer.backward, recompute) if ops]
    return layer_floor_stretch(passes, host_us, moe_us if is_moe_layer(layer.forward) else None, remote_s)


def rank_params(chain: Chain, rank: int) -> float:
    per = chain.blocks // chain.ranks
    own = sum(chain.params[rank * per:(rank + 1) * per])
    if rank == 0:
        own += sum(layer.params for layer in chain.opening)
    if rank == chain.ranks - 1:
        own += sum(layer.params for layer in chain.closing)
    return own


def compile_mgrit(scenario, mode: str | None = None, detail: bool = False) -> Plan:
    cfg = _config(scenario)
    chain = chain_of(scenario)
    tr, par = scenario.training, scenario.parallelism
    compute = ComputeModel(scenario.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)
    jitter = kernel_stretch(scenario.accelerator.efficiency, scenario.num_gpus)  # framework_terms.py
    streams: dict[tuple[str, str], list[Task]] = defaultdict(list)
    compute_tasks: dict[str, list[Task]] = defaultdict(list)
    solve = _Solve(scenario, chain, cfg, streams, compute_tasks)
    p, last = chain.ranks, chain.ranks - 1
    per = chain.blocks // p
    opening_f, opening_b = (_layers_s(scenario, compute, chain.opening, phase, jitter) for phase in ("forward", "backward"))
    closing_f, closing_b = (_layers_s(scenario, compute, chain.closing, phase, jitter) for phase in ("forward", "backward"))
    opt_per_param = OPTIMIZER_BYTES_PER_PARAM[tr.optimizer] * (32 / 28 if tr.precision == "fp32" else 1)
    step_ends: list[list[Task]] = []
    previous: list[Task | None] = [None] * p
    forward_end_s: list[Task] = []
    loaded: Task | None = None  # this step's samples, loaded by rank 0 during the last step
    # memory over time from each rank's analytic breakdown (simulator/memory/over_time.py): a micro-batch's
    # kept activations and coarse states from the rank's first task of its forward solve to the end of its
    # weight gradients, the working set from the rank's first task of the backward solve (the adjoint
    # evaluations re-create blocks) to the same end
    ledgers = []
    for r in range(p):
        breakdown = rank_memory_mgrit(scenario, chain, r)
        working = rank_working_bytes(scenario, chain, r)
        ledgers.append(MemoryLedger(breakdown, breakdown.activations_bytes - working, working))
    for k in range(scenario.simulation.steps):
        wgrads: list[list[Task]] = [[] for _ in range(p)]
        for mb in range(par.num_micro_batches):
            tag = f"step{k}.mb{mb}"
            before = [len(compute_tasks[a]) for a in solve.actors]
            opening = solve.kernel(0, f"opening.F.{tag}", opening_f, [previous[0], loaded if mb == 0 else None])
            states = solve.solve(True, opening, cfg.forward_iterations, f"F.{tag}")
            forward_end_s.append(states[-1])
            closing = solve.kernel(last, f"closing.FB.{tag}", closing_f + closing_b, [states[-1]])
            between = [len(compute_tasks[a]) for a in solve.actors]
            adjoints = solve.solve(False, closing, cfg.backward_iterations, f"B.{tag}")
            solve.kernel(0, f"opening.B.{tag}", opening_b, [adjoints[-1]])
            for r in range(p):  # weight gradients from the stored states and the adjoints
                blocks = range(r * per, (r + 1) * per)
                deps = [adjoints[chain.blocks - b - 1] for b in blocks] + [states[b] for b in blocks]
                seconds = sum(chain.wgrad_s[b] for b in blocks)
                again = sum(chain.recompute_s[b] for b in blocks)
                if again > 0:  # the activations were dropped again after each adjoint evaluation
                    deps = [solve.kernel(r, f"wgrad.{tag}.recompute", again, deps, "recompute")]
                wgrads[r].append(solve.kernel(r, f"wgrad.{tag}", seconds, deps))
                own = compute_tasks[solve.actors[r]]
                ledgers[r].forward(own[before[r]])
                ledgers[r].backward(own[between[r]], wgrads[r][-1])
        ends = []
        for r in range(p):
            update = solve.kernel(r, f"optimizer.step{k}", compute.optimizer_step_s(rank_params(chain, r), opt_per_param),
                                  wgrads[r], "optimizer")
            ledgers[r].update(update)
            previous[r] = update
            ends.append(update)
        # rank 0 (the opening layers) loads the next step's samples beside this step, as spmd's first stage
        # does (framework_terms.py): the load ends the step too, and the next step's first opening waits for it
        loaded = input_task(scenario.accelerator.efficiency, solve.actors[0], par.micro_batch_size * par.num_micro_batches,
                            f"input.next_batch.step{k}")
        if loaded is not None:
            streams[(solve.actors[0], "input")].append(loaded)
            ends.append(loaded)
        step_ends.append(ends)
    serial_s = (par.num_micro_batches * (opening_f + opening_b + closing_f + closing_b
                                         + sum(chain.forward_s) + sum(chain.recompute_s) + sum(chain.adjoint_s)
                                         + sum(chain.wgrad_s))
                + compute.optimizer_step_s(sum(rank_params(chain, r) for r in range(p)), opt_per_param))
    coarse_points = chain.blocks // cfg.coarsening_factor ** (cfg.levels - 1)
    actors = solve.actors

    def measured() -> dict:
        makespan = max(t.end_s for ends in step_ends for t in ends)
        step_s = makespan / len(step_ends)
        return {"mgrit_serial_step_s": serial_s, "mgrit_speedup": serial_s / step_s,
                "mgrit_forward_solve_s": forward_end_s[0].end_s - opening_f}

    extra = {"mgrit_ranks": p, "mgrit_blocks": chain.blocks, "mgrit_coarse_points": coarse_points,
             "mgrit_layer_evaluations_per_step": solve.evaluations // scenario.simulation.steps,
             "mgrit_sends_per_step": solve.sends // scenario.simulation.steps}
    mark_interference(scenario.accelerator.efficiency, streams)  # kernels beside the state sends (framework_terms.py)
    return Plan(dict(streams), {a: r for r, a in enumerate(actors)}, {a: r for r, a in enumerate(actors)},
                [per] * p, solve.topo, dict(compute_tasks), steps=scenario.simulation.steps, step_ends=step_ends,
                extra=extra, after_run=measured, mode="full",  # every rank is an actor
                memory_base_bytes={a: ledgers[r].base_bytes for r, a in enumerate(actors)})


def rank_memory_mgrit(scenario, chain: Chain, rank: int) -> MemoryBreakdown:
    """Model state of the rank's parameters, its blocks' kept activations (plus the opening's or
    closing's on the first and last rank) and two states per coarse point it owns."""
    cfg, tr = _config(scenario), scenario.training
    graph = scenario.layer_graph()
    recompute = scenario.parallelism.recompute
    w, g, o = model_state_bytes(rank_params(chain, rank), 0, 1, tr.precision, tr.optimizer, gradient_bytes(tr),
                                tr.param_dtype == "fp32")
    per = chain.blocks // chain.ranks
    activations = sum(chain.kept_bytes[rank * per:(rank + 1) * per])
    kept = kept_per_layer(graph, recompute)
    index = {layer.name: i for i, layer in enumerate(graph.layers)}
    if rank == 0:
        activations += sum(kept[index[layer.name]] for layer in chain.opening)
    if rank == chain.ranks - 1:
        activations += sum(kept[index[layer.name]] for layer in chain.closing)
    activations += rank_working_bytes(scenario, chain, rank)
    c = cfg.coarsening_factor
    for level in range(1, cfg.levels):
        stride = c ** level
        activations += 2 * sum(chain.state_bytes[j] for j in range(0, chain.blocks + 1, stride)
                               if chain.owner(j) == rank)
    return MemoryBreakdown(w, g, o, activations, 0.0, stage=rank)


def rank_working_bytes(scenario, chain: Chain, rank: int) -> float:
    """The rank's rematerialisation working set: the backward re-creates one block's activations (full:
    each block a checkpoint unit, simulator/memory/checkpoints.py) on top of the kept inputs; the
    largest over its blocks and its end layers (0 without recompute)."""
    graph, recompute = scenario.layer_graph(), scenario.parallelism.recompute
    index = {layer.name: i for i, layer in enumerate(graph.layers)}
    per = chain.blocks // chain.ranks
    working = list(chain.working_bytes[rank * per:(rank + 1) * per])
    for ends, holder in ((chain.opening, 0), (chain.closing, chain.ranks - 1)):
        if rank == holder and ends:
            working.append(stage_bytes(graph, recompute, [index[layer.name] for layer in ends])[1])
    return max(working, default=0.0)


def memory_mgrit(scenario):
    chain = chain_of(scenario)
    return peak_stage([rank_memory_mgrit(scenario, chain, r) for r in range(chain.ranks)])


def step_lower_bound_mgrit(scenario, prices) -> float:
    """A lower bound on the simulated step (seconds), compute alone: the largest over the ranks of the fixed-duration
    work its compute stream runs per step. Per micro-batch, in each forward V-cycle (``forward_iterations`` of them)
    step j of level l (block j·c^l, evaluated by its owner) is evaluated, on every level but the coarsest, in the
    F-relaxation and in the interpolation's F-relaxation where it is an F-point (j mod c != c - 1; once more under
    FCF), in the FAS residual where it ends at a C-point (j mod c = c - 1; and in the C-relaxation under FCF), once
    on the coarsest level's serial sweep, and, below the finest, once more as the coarse step of the level above's
    FAS right-hand side (:meth:`_Solve._vcycle`); the adjoint V-cycles (``backward_iterations``) alike over block
    N - 1 - j·c^l, each evaluation after its recompute; then the rank's weight gradients (and their recompute); the
    opening layers' forward and backward on rank 0, the closing layers' on the last; after the micro-batches the
    rank's optimizer step. The sends, the joins and the norm all-reduces only add (not counted), and so do the
    waits of the serial coarse sweep and of the relaxations' chains (a critical path is not taken).

    Why it bounds the step: the step is the run's end over ``simulation.steps`` (no window, simulator/simulate.py);
    every one of these is a fixed-duration task on the rank's compute stream (:class:`_Solve`, ``evaluate``: the
    block's owner runs it), a stream runs its tasks one at a time, and the engine never runs one in less than its
    ``duration_s`` (interference only slows it; simulator/engine/engine.py). ``prices``
    (:class:`simulator.explore.bounds.KindPrices`) is not read. tests/test_kind_bounds.py checks it against the
    engine."""
    cfg, par = _config(scenario), scenario.parallelism
    chain = chain_of(scenario)
    tr = scenario.training
    compute = ComputeModel(scenario.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)
    jitter = kernel_stretch(scenario.accelerator.efficiency, scenario.num_gpus)
    c, n, p = cfg.coarsening_factor, chain.blocks, chain.ranks
    fcf = 1 if cfg.relaxation == "FCF" else 0
    per_rank = [0.0] * p
    for level in range(cfg.levels):
        for j in range(n // c ** level):
            # evaluations of step j of the level per V-cycle: relaxations and the FAS residual, or the coarsest
            # level's serial sweep; plus, below the finest, the coarse step of the FAS right-hand side (tau)
            own = 1 if level == cfg.levels - 1 else (2 + fcf) if j % c != c - 1 else (1 + fcf)
            times = own + (1 if level else 0)
            fine = j * c ** level
            per_rank[chain.owner(fine)] += cfg.forward_iterations * times * chain.forward_s[fine]
            back = n - 1 - fine
            per_rank[chain.owner(back)] += (cfg.backward_iterations * times
                                            * (chain.adjoint_s[back] + chain.recompute_s[back]))
    for b in range(n):
        per_rank[chain.owner(b)] += chain.wgrad_s[b] + chain.recompute_s[b]
    per_rank[0] += sum(_layers_s(scenario, compute, chain.opening, phase, jitter) for phase in ("forward", "backward"))
    per_rank[p - 1] += sum(_layers_s(scenario, compute, chain.closing, phase, jitter)
                           for phase in ("forward", "backward"))
    opt_per_param = OPTIMIZER_BYTES_PER_PARAM[tr.optimizer] * (32 / 28 if tr.precision == "fp32" else 1)
    return max(par.num_micro_batches * work + compute.optimizer_step_s(rank_params(chain, r), opt_per_param)
               for r, work in enumerate(per_rank))


#: The fields of ``clustersim search``'s space that change what layer_parallel_mgrit simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): the ranks (``pp``), the micro-batches and the recompute (chain_of,
#: compile_mgrit, rank_memory_mgrit); tp, cp, ep, dp and ``virtual_stages`` are refused unless 1; ``zero_stage``,
#: ``schedule``, ``pp_split``, ``sequence_parallel`` and the overlap switches are never read (the V-cycles are the
#: schedule; state is whole per rank). ``search`` varies the ranks over ``--space pp=...`` (each needs its GPUs).
LAYER_PARALLEL_MGRIT_SEARCHED_FIELDS: tuple[str, ...] = ("pp", "micro_batch_size", "global_batch_size", "recompute")


LAYER_PARALLEL_MGRIT = register(StrategyKind(
    name="layer_parallel_mgrit",
    config=LayerParallelMgritConfig,
    summary="layer-parallel training (Günther et al. 2020): residual blocks across ranks, forward and adjoint "
            "solved by MGRIT V-cycles (F/FCF relaxation, neighbour state exchange, serial coarse level)",
    compile=compile_mgrit,
    memory=memory_mgrit,
    searched_layout_fields=lambda config: LAYER_PARALLEL_MGRIT_SEARCHED_FIELDS,
    derives_layout=False,
    step_lower_bound=step_lower_bound_mgrit,
))
