"""The ``swarm`` strategy kind: SWARM parallelism (Ryabinin et al. 2023, "SWARM Parallelism: Training
Large Models Can Be Surprisingly Communication-Efficient", ICML 2023).

The model's layer graph is cut into ``parallelism.pp`` pipeline stages (layer ranges, as the spmd
kind cuts them; ``parallelism`` describes that one pipeline, so ``dp`` resolves to 1). Each stage is
served by a pool of peers (``peers_per_stage``, summing to ``cluster.num_gpus``; default: an even
split), each with its own speed (``peer_speeds``: a factor on every kernel of the
node's accelerator; 0.5 = half as fast) and, on a mixed cluster (``cluster.groups``), its own
node: peer p is rank p (stage 0's peers first) and its node group's accelerator prices its kernels
and its node's NIC its transfers (the analytic memory fit is the simulator's, against
the first node group's accelerator). A step trains on ``global_batch_size`` samples in
micro-batches of ``micro_batch_size``; every micro-batch is wired at random, stage by stage, to a
peer of the next stage (weighted by speed, seeded), its backward goes back through the same peers,
and when a stage has seen the whole global batch its peers average their gradients (all-reduce or
gossip) and step their optimizer. Peers are preempted and return (a seeded Poisson process, or given
outages); their work is rerouted; every ``rebalance_every_steps`` steps a peer moves from the stage
with the most throughput to the one with the least. The rules, and the choices the paper leaves
open, are in :mod:`simulator.strategies.swarm_parts.dispatch`, which plays them once at compile
time (seeded) and returns the ordered passes; this module prices them and turns them into engine
tasks (the engine re-times transfers with links shared fairly).

Prices (all from the spmd planner, :class:`simulator.strategies.spmd.plan.Planner`, so a swarm
stage and a spmd stage cost the same): a stage's forward, its backward (plus the recomputed forward
under ``parallelism.recompute``) at speed 1, divided by the peer's speed; the optimizer step over
the stage's parameters. Transfers: every peer is its own machine and every byte goes over its NIC
share (``{peer}:nic_tx`` / ``nic_rx`` ports of the node spec; latency: NIC + fat-tree switches),
whatever node the peer is on. On a ``wan`` fabric (regions with a delay and bandwidth per pair,
simulator/cost/wan.py) a transfer between regions also crosses the pair link's port and pays the
one-way delay as propagation (the sender's stream is free meanwhile), and a stage's averaging ring
(its peers in rank order) puts each member's bytes on every region pair it crosses and waits the
slowest crossing's delay at each of its steps.

8-bit compression (``activation_compression`` / ``gradient_compression: int8``; SWARM's experiments
compresses activations and gradients to 8 bits with blockwise quantisation, Dettmers et al. 2022,
"8-bit Optimizers via Block-wise Quantization"): an element of 2 bytes (fp16/bf16) or 4 (fp32)
goes as 1 byte plus one fp32 scale per block of :data:`QUANT_BLOCK` elements (bitsandbytes'
``quantize_blockwise`` default), so the bytes are x1/2 or x1/4 (+0.1%). Quantising and
dequantising are memory-bound kernels on the sending and receiving peer: read the source
elements, write the 1-byte ones (or the reverse), at the accelerator's memory-bound bandwidth
plus a launch; they are counted in the pass that produces or consumes the tensor (activations,
activation gradients) and in the optimizer step (the averaged parameter gradients).

Averaging (``averaging``): ``all_reduce`` is a ring all-reduce over the stage's k live peers,
2(k-1)/k of the gradient bytes sent and received by each, 2(k-1) latencies (Patarasuk & Yuan 2009);
``gossip`` has each peer exchange its gradient with one random other peer (the bytes once, one
latency), which averages only partially (not modelled in convergence). A stage of one peer sends
nothing.

The framework profile's step-level terms (simulator/strategies/framework_terms.py): the kernels wait
for the slowest of the job's ranks and a stage's passes take spmd's host floors (eager dispatch, NeMo's
fixed time per MoE layer, and the cross-node pipeline floor on every stage of a pipeline of more than
one stage: every peer is its own machine, so a stage's neighbours are always across the network); a
stage-0 peer loads the samples of the micro-batches routed to it with its own input pipeline (one
micro-batch after another, prefetching; :mod:`~simulator.strategies.swarm_parts.dispatch`); a pass is
slowed beside its peer's transfers as spmd marks them (``overlap_compute_slowdown``).

Memory: per peer, its stage's weights, gradients and optimizer state (no sharding) plus the
activations of the micro-batches it holds between their forward and backward; the analytic peak
counts, per stage, the share of the global batch its fastest peer expects (all micro-batches of a
step may be in flight, as GPipe: :func:`simulator.memory.analytic.rank_memory` with that many
micro-batches; one on the last stage, whose backward follows each forward). It is what a peer
holds when all its forwards run before its first gradient returns (a slow link); a peer holds fewer
when gradients come back sooner (backwards run first), and more when the random wiring sends it
more than its share: the engine's counter gives each peer's own peak (a peer that moves stage
takes on the new stage's state with its download); the engine's memory counter gives each peer's simulated peak from the routing that
happened. What the upstream peer keeps to resend after a failure (one boundary tensor per
micro-batch in flight) is not counted.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.cost.wan import WanTopology
from simulator.engine.engine import Task
from simulator.engine.failures import Outage, expected_outages
from simulator.errors import ConfigError, no_bool_numbers
from simulator.memory.analytic import (
    ACTIVATION_ELEMENT_BYTES_16BIT,
    chunk_activation_bytes,
    peak_stage,
    rank_memory,
)
from simulator.scenario import gradient_bytes
from simulator.strategies.framework_terms import input_load_s, mark_interference
from simulator.strategies.plan import MEMORY_COUNTER, Plan
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.spmd.plan import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_BYTES, Planner
from simulator.strategies.swarm_parts.dispatch import Dispatcher, Op, Prices
from simulator.strategies.swarm_parts.preemption import Preemptions

#: Elements per fp32 scale of blockwise 8-bit quantisation (bitsandbytes ``quantize_blockwise``).
QUANT_BLOCK = 4096
#: Bytes of one element sent at 8 bits, with its share of the block's fp32 scale.
INT8_BYTES_PER_ELEMENT = 1.0 + 4.0 / QUANT_BLOCK
#: Micro-batches of one step the simulator accepts (as the spmd kind's cap per replica).
MAX_MICRO_BATCHES = 16_384
#: Preemptions one run may draw (each is an event the dispatcher walks in Python). The example's 28
#: peers at 2 per peer-hour over its 2 steps draw a few dozen; a horizon that needs more than this comes
#: from a step astronomically long (a model size or a link figure typed with extra zeros) and would
#: run for hours, so it is refused up front with the count, the limit and the step time.
MAX_PREEMPTIONS = 100_000


class OutageSpec(BaseModel):
    """One given outage: ``peer`` (0-based, stage by stage: stage 0's peers first) is away over
    ``[down_at_s, up_at_s)`` of simulated time."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)

    peer: int = Field(ge=0)
    down_at_s: float = Field(ge=0)
    up_at_s: float = Field(ge=0)


class SwarmConfig(BaseModel):
    """``strategy: {kind: swarm, ...}``; the stages are ``parallelism.pp``, the batch ``parallelism``'s."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("seed", "peers_per_stage", "preemptions_per_hour", "mean_downtime_s",
                                       "rebalance_every_steps", mode="before")(no_bool_numbers)

    kind: Literal["swarm"] = "swarm"
    seed: int = Field(default=0, ge=0, description="seeds the wiring, the gossip pairs and the preemptions")
    peers_per_stage: list[int] | None = Field(
        default=None, description="peers serving each stage (sum = cluster.num_gpus); default: num_gpus / pp each")
    peer_speeds: list[list[float]] | None = Field(
        default=None, description="per stage, each peer's speed factor on the node's accelerator (default 1.0)")
    averaging: Literal["all_reduce", "gossip"] = Field(
        default="all_reduce", description="how a stage's peers average gradients at the end of a step")
    activation_compression: Literal["none", "int8"] = Field(
        default="int8", description="activations and their gradients between stages (SWARM: 8-bit)")
    gradient_compression: Literal["none", "int8"] = Field(
        default="none", description="the parameter gradients a stage averages")
    preemptions_per_hour: float = Field(default=0.0, ge=0, description="per peer: a Poisson preemption process")
    mean_downtime_s: float = Field(default=0.0, ge=0, description="mean of the exponential time a preempted peer is away")
    outages: list[OutageSpec] = Field(default_factory=list, description="given outages (beside the drawn ones)")
    rebalance_every_steps: int | None = Field(
        default=None, ge=1, description="move one peer to the slowest stage every this many steps (None: never)")


def _config(scenario) -> SwarmConfig:
    return scenario.strategy


def _require(condition: bool, field: str, reason: str) -> None:
    if not condition:
        raise ConfigError(field, reason)


def pools(scenario) -> tuple[list[int], list[list[float]]]:
    """(peers per stage, each peer's speed per stage), checked against the layout."""
    cfg, par = _config(scenario), scenario.parallelism
    stages, n = par.pp, scenario.num_gpus
    if cfg.peers_per_stage is None:
        _require(n % stages == 0, "strategy.peers_per_stage",
                 f"needed: cluster.num_gpus = {n} does not split evenly over pp = {stages} stages")
    peers = list(cfg.peers_per_stage) if cfg.peers_per_stage is not None else [n // stages] * stages
    _require(len(peers) == stages, "strategy.peers_per_stage", f"needs one entry per stage (pp = {stages}), got {len(peers)}")
    _require(all(p >= 1 for p in peers), "strategy.peers_per_stage", "every stage needs at least one peer")
    _require(sum(peers) == n, "strategy.peers_per_stage", f"sums to {sum(peers)}, not cluster.num_gpus = {n}")
    if cfg.peer_speeds is None:
        speeds = [[1.0] * p for p in peers]
    else:
        speeds = [list(row) for row in cfg.peer_speeds]
        _require(len(speeds) == stages, "strategy.peer_speeds", f"needs one list per stage (pp = {stages}), got {len(speeds)}")
        for s, (row, count) in enumerate(zip(speeds, peers, strict=True)):
            _require(len(row) == count, "strategy.peer_speeds", f"stage {s} has {count} peers, got {len(row)} speeds")
            _require(all(v > 0 for v in row), "strategy.peer_speeds", f"stage {s}: every speed must be > 0")
    return peers, speeds


def _check(scenario) -> SwarmConfig:
    cfg, par = _config(scenario), scenario.parallelism
    _require(par.tp == 1, "parallelism.tp", "swarm peers hold whole stages (tp 1)")
    _require(par.cp == 1, "parallelism.cp", "swarm is modelled without context parallelism (cp 1)")
    _require(par.ep == 1, "parallelism.ep", "swarm is modelled without expert parallelism (ep 1)")
    _require(par.virtual_stages == 1, "parallelism.virtual_stages", "a swarm peer serves one stage (1)")
    _require(par.zero_stage == 0, "parallelism.zero_stage", "swarm peers keep their stage's whole state (ZeRO 0)")
    _require(par.global_batch_size % par.micro_batch_size == 0, "parallelism.global_batch_size",
             f"{par.global_batch_size} is not a whole number of micro-batches of {par.micro_batch_size}")
    _require(micro_batches(scenario) <= MAX_MICRO_BATCHES, "parallelism.global_batch_size",
             f"more than {MAX_MICRO_BATCHES} micro-batches per step")
    peers, _ = pools(scenario)
    total = sum(peers)
    for i, outage in enumerate(cfg.outages):
        _require(outage.peer < total, f"strategy.outages.{i}.peer", f"{outage.peer} is not a peer (0..{total - 1})")
        _require(outage.up_at_s > outage.down_at_s, f"strategy.outages.{i}.up_at_s",
                 f"must be after down_at_s ({outage.down_at_s:g}), got {outage.up_at_s:g}")
    _require(cfg.preemptions_per_hour == 0 or cfg.mean_downtime_s > 0, "strategy.mean_downtime_s",
             "must be > 0 when preemptions_per_hour is set")
    return cfg


def _check_preemptions(cfg: SwarmConfig, peers: int, horizon_s: float, run_s: float, steps: int) -> None:
    """Refuse a draw of more than :data:`MAX_PREEMPTIONS` preemptions (or over an infinite horizon)
    before it starts: it would not end in a useful time."""
    expected = expected_outages(peers, cfg.preemptions_per_hour, horizon_s, cfg.mean_downtime_s, "after_repair")
    _require(math.isfinite(horizon_s) and expected <= MAX_PREEMPTIONS, "strategy.preemptions_per_hour",
             f"{cfg.preemptions_per_hour:g} per peer-hour over {peers} peers would draw ~{expected:.3g} "
             f"preemptions over {horizon_s:.3g} s of simulated time, over the limit of {MAX_PREEMPTIONS:,} (each "
             f"is an event the dispatcher walks): the {steps} step(s) take {run_s:.3g} s without preemptions; "
             "so many usually means this rate, or a figure that makes the step long (a model size: "
             "model.num_layers, hidden_size, vocab_size, seq_length; a link's bandwidth or latency), is off by "
             "orders of magnitude")


def micro_batches(scenario) -> int:
    par = scenario.parallelism
    return par.global_batch_size // par.micro_batch_size


def _pricing_scenario(scenario):
    """The spmd scenario whose per-stage prices a swarm stage has: one replica (dp 1)."""
    par = scenario.parallelism.model_copy(update={"dp": 1, "global_batch_size": scenario.parallelism.micro_batch_size,
                                                  "schedule": "gpipe"})
    return dataclasses.replace(scenario, parallelism=par)


class SwarmPrices:
    """Every time and byte count the dispatcher and the tasks use (see the module docstring). Peer
    ``p`` is rank ``p`` (stage 0's peers first): on a mixed cluster (``cluster.groups``) its node
    group's accelerator prices its passes and optimizer steps and its node's NIC its transfers."""

    def __init__(self, scenario, peers: int):
        cfg = _config(scenario)
        self.scenario = scenario
        pricing = _pricing_scenario(scenario)
        self.planner = planner = Planner(pricing, mode="symmetric")
        planner.remote_pipeline_neighbours = True  # every peer is its own machine: stages talk over the network
        topo = planner.topo
        topo.bind_actors({actor(p): p for p in range(peers)})  # each peer's ports at its own node's NIC
        stages = scenario.parallelism.pp
        precision = scenario.training.precision
        element = 4 if precision == "fp32" else ACTIVATION_ELEMENT_BYTES_16BIT
        grad_b = gradient_bytes(scenario.training)
        act, grad_c = cfg.activation_compression, cfg.gradient_compression

        def wire(nbytes: float, element_bytes: float, compression: str) -> float:
            return nbytes if compression == "none" else nbytes / element_bytes * INT8_BYTES_PER_ELEMENT

        def quantise_s(compute, nbytes: float, element_bytes: float, compression: str) -> float:
            """One (de)quantisation kernel over a tensor of ``nbytes``: read it, write 1 B per element."""
            if compression == "none" or nbytes <= 0:
                return 0.0
            return (nbytes + nbytes / element_bytes) / compute.mem_bw + compute.launch_s

        # planner._pp_payload(g): bytes crossing the cut after stage g (the spmd kind's pipeline sends)
        boundary = [planner._pp_payload(g) for g in range(stages - 1)]
        self.boundary_raw_bytes = boundary
        self.stage_params = [planner.stage_params_local(s) for s in range(stages)]
        self.grad_wire_bytes = [wire(n * grad_b, grad_b, grad_c) for n in self.stage_params]
        per_param = OPTIMIZER_BYTES_PER_PARAM[scenario.training.optimizer] * (32 / 28 if precision == "fp32" else 1)

        def group_prices(rank: int):
            """(passes per stage, optimizer per stage, quantisation per boundary) on ``rank``'s accelerator."""
            compute = planner.compute_of(rank)
            quant = [quantise_s(compute, b, element, act) for b in boundary]
            passes = []
            for s in range(stages):
                runs = planner.chunk_runs(s)  # with the framework's host floor as spmd adds it (framework_terms.py)
                forward = planner.chunk_pass_s(rank, "F", s) + planner.host_floor_stall_s(rank, "F", runs)
                backward = (planner.chunk_pass_s(rank, "B", s) + planner.host_floor_stall_s(rank, "B", runs)
                            + planner.chunk_pass_s(rank, "R", s) + planner.host_floor_stall_s(rank, "R", runs))
                q_in = quant[s - 1] if s > 0 else 0.0       # dequantise the input / quantise its gradient
                q_out = quant[s] if s < stages - 1 else 0.0  # quantise the output / dequantise its gradient
                passes.append({"F": forward + q_in + q_out, "B": backward + q_in + q_out})
            optimizer = [compute.optimizer_step_s(n, per_param) + 2 * quantise_s(compute, n * grad_b, grad_b, grad_c)
                         for n in self.stage_params]
            return passes, optimizer, quant

        by_group: dict[int, tuple] = {}
        for p in range(peers):
            by_group.setdefault(topo.group_index(p), group_prices(p))
        groups = [topo.group_index(p) for p in range(peers)]
        self.passes, self.optimizer_s, self.quantise_s = by_group[groups[0]]  # stage 0's first peer (reports)
        links = [topo.links_of(p) if topo.mixed else topo.links for p in range(peers)]
        self.link_bytes_per_s = [topo.port_capacity(f"{actor(p)}:nic_tx") for p in range(peers)]
        self.latency_s = [lk.inter_latency_s for lk in links]
        self.peer_passes = [by_group[g][0] for g in groups]
        self.prices = Prices(
            pass_s=self.peer_passes,
            optimizer_s=[by_group[g][1] for g in groups],
            boundary_bytes=[wire(b, element, act) for b in boundary],
            activation_bytes=[chunk_activation_bytes(pricing, s) for s in range(stages)],
            param_bytes=[n * WEIGHT_BYTES[precision] for n in self.stage_params],
            link_bytes_per_s=self.link_bytes_per_s,
            latency_s=self.latency_s,
            averaging_bytes=self.averaging_bytes,
            averaging_steps=self.averaging_steps,
            # each stage-0 peer's own input pipeline, one micro-batch at a time (framework_terms.py)
            input_s=[input_load_s(scenario.rank_accelerator(p).efficiency, scenario.parallelism.micro_batch_size)
                     for p in range(peers)],
        )
        self.averaging = cfg.averaging
        self.wan = topo if isinstance(topo, WanTopology) else None
        if self.wan is not None:
            self.prices.wide_area = self.wide_area
            self.prices.averaging_wide_area = self.averaging_wide_area

    def wide_area(self, src: int, dst: int) -> tuple[float, float] | None:
        """(pair bytes/s (one connection's bound if lower), one-way delay) from ``src``'s region to
        ``dst``'s, or None inside one region (simulator/cost/wan.py)."""
        wan = self.wan
        a, b = wan.region_of(src), wan.region_of(dst)
        if a == b:
            return None
        rate, connection = wan.pair_bytes_per_s(a, b), wan.connection_bytes_per_s(a, b)
        return (min(rate, connection) if connection else rate), wan.delay_s(a, b)

    def averaging_wide_area(self, members: list[int], nbytes: float) -> tuple[float, dict[str, float], float]:
        """What averaging over ``members`` adds between regions: the ring over them (in rank order, as
        the wan fabric's collectives) crosses region pairs; each crossing edge carries every member's
        ``nbytes`` on the pair port, and each of the ring's steps waits for the slowest crossing's delay.
        Returns (delay seconds, {pair port: bytes}, seconds the busiest pair port takes alone)."""
        wan = self.wan
        edges = wan.ring_crossings(tuple(sorted(members)))
        if not edges:
            return 0.0, {}, 0.0
        pairs = {wan.pair_port(a, b): nbytes * count for (a, b), count in edges.items()}
        delay = self.averaging_steps(len(members)) * max(wan.delay_s(a, b) for a, b in edges)
        return delay, pairs, max(b / wan.port_capacity(port) for port, b in pairs.items())

    def averaging_bytes(self, stage: int, members: int) -> float:
        """Bytes each of ``members`` peers sends (and receives) to average the stage's gradient."""
        grads = self.grad_wire_bytes[stage]
        return grads if self.averaging == "gossip" else 2 * (members - 1) / members * grads

    def averaging_steps(self, members: int) -> int:
        """Latencies one averaging pays: a ring all-reduce 2(k-1), a gossip exchange 1."""
        return 1 if self.averaging == "gossip" else 2 * (members - 1)

    def pool_throughput_samples_per_s(self, stage_of_peer: list[int], speeds: list[float]) -> list[float]:
        """Per stage: samples per second its pool can pass forward and backward (sum over its peers of
        speed / (forward + backward) on the peer's accelerator)."""
        mbs = self.scenario.parallelism.micro_batch_size
        out = [0.0] * len(self.passes)
        for p, (s, v) in enumerate(zip(stage_of_peer, speeds, strict=True)):
            out[s] += v * mbs / (self.peer_passes[p][s]["F"] + self.peer_passes[p][s]["B"])
        return out


def actor(peer: int) -> str:
    return f"peer{peer}"


def _tasks(ops: list[Op], wan=None) -> tuple[dict[tuple[str, str], list[Task]], dict[int, Task]]:
    """Engine tasks of the dispatcher's ops, each stream in the order the dispatcher ran it (``wan``:
    a wide-area topology whose sends between regions cross its pair ports)."""
    tasks: dict[int, Task] = {}
    streams: dict[tuple[str, str], list[Task]] = {}
    for op in sorted(ops, key=lambda o: (o.start_s, o.seq)):
        if op.category == "preempted":
            key = ("preemption", f"{actor(op.peer)}.{op.stream}")
        elif op.peer < 0:
            key = ("swarm", op.stream)
        else:
            key = (actor(op.peer), op.stream)
        if op.stream in ("send", "recv", "avg"):
            demands: dict[str, float] = {}
            latency, propagation = op.latency_s, 0.0
            src, dst = (op.peer, op.dst) if op.stream == "send" else (op.src, op.peer)
            route = wan.send(actor(src), src, actor(dst), dst, op.nbytes) if (
                wan is not None and op.stream != "avg" and src is not None) else None
            if route is not None:  # between regions: NICs, the pair link, the delay as propagation
                demands, propagation = route
                latency = 0.0
            elif op.stream == "avg":
                demands = {f"{actor(op.peer)}:nic_tx": op.nbytes, f"{actor(op.peer)}:nic_rx": op.nbytes,
                           **op.extra_demands}
            elif op.stream == "send":
                demands = {f"{actor(op.peer)}:nic_tx": op.nbytes, f"{actor(op.dst)}:nic_rx": op.nbytes}
            else:  # a download: from its source peer, or a checkpoint (only its own link)
                demands = {f"{actor(op.peer)}:nic_rx": op.nbytes}
                if op.src is not None:
                    demands[f"{actor(op.src)}:nic_tx"] = op.nbytes
            task = Task(op.name, key[0], key[1], op.category, demands=demands, latency_s=latency,
                        propagation_s=propagation, rendezvous=op.rendezvous, rendezvous_size=op.rendezvous_size)
        else:
            task = Task(op.name, key[0], key[1], op.category if op.category != "barrier" else "pipeline_bubble",
                        duration_s=op.duration_s)
        task.alloc_bytes, task.free_bytes, task.counter = op.alloc_bytes, op.free_bytes, MEMORY_COUNTER
        tasks[id(op)] = task
        streams.setdefault(key, []).append(task)
    for op in ops:
        tasks[id(op)].deps = [tasks[id(d)] for d in op.deps]
    return streams, tasks


def compile_swarm(scenario, mode: str | None = None, detail: bool = False) -> Plan:
    cfg = _check(scenario)
    peers, speeds = pools(scenario)
    prices = SwarmPrices(scenario, sum(peers))
    stage_of_peer = [s for s, count in enumerate(peers) for _ in range(count)]
    flat_speeds = [v for row in speeds for v in row]
    fixed: dict[int, list[Outage]] = {}
    for outage in cfg.outages:
        fixed.setdefault(outage.peer, []).append(Outage(str(outage.peer), outage.down_at_s, outage.up_at_s, "given"))

    state = []
    for s in range(scenario.parallelism.pp):
        m = _stage_memory(scenario, s, speeds)
        state.append(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes + m.other_bytes)
    prices.prices.state_bytes = state
    memory_base = {actor(p): state[s] for p, s in enumerate(stage_of_peer)}

    def dispatch(horizon_s: float):
        preemptions = Preemptions(len(flat_speeds), cfg.seed, cfg.preemptions_per_hour, cfg.mean_downtime_s, fixed,
                                  horizon_s)
        return Dispatcher(prices.prices, stage_of_peer, flat_speeds, micro_batches(scenario),
                          scenario.simulation.steps, preemptions, cfg.seed, cfg.rebalance_every_steps).run()

    schedule = dispatch(0.0)  # the given outages only
    if cfg.preemptions_per_hour > 0:
        # Draw preemptions up to a horizon past the end; if the run outlasts it, draw again over twice
        # as long (the draws depend on the horizon, and it is a function of the seed's run: reproducible).
        run_s = schedule.stats["end_s"]
        horizon = 2.0 * run_s + 10.0 * cfg.mean_downtime_s
        while True:
            _check_preemptions(cfg, len(flat_speeds), horizon, run_s, scenario.simulation.steps)
            schedule = dispatch(horizon)
            if schedule.stats["end_s"] <= horizon:
                break
            horizon *= 2.0
    streams, tasks = _tasks(schedule.ops, prices.wan)
    actors = {actor(p): p for p in range(len(flat_speeds))}
    mark_interference(scenario.accelerator.efficiency, streams,  # a pass beside its peer's transfers, on its accelerator
                      lambda a: scenario.rank_accelerator(actors[a]).efficiency if a in actors else scenario.accelerator.efficiency)
    compute = {a: streams.get((a, "compute"), []) for a in actors}
    throughput = prices.pool_throughput_samples_per_s(stage_of_peer, flat_speeds)
    stats = schedule.stats
    extra = {
        "swarm_peers_per_stage": peers,
        "swarm_final_peers_per_stage": stats["final_peers_per_stage"],
        "swarm_micro_batches_per_step": micro_batches(scenario),
        "swarm_pool_throughput_samples_per_s": throughput,
        "swarm_bottleneck_stage": min(range(len(throughput)), key=lambda s: throughput[s]),
        "swarm_forward_s_per_stage": [p["F"] for p in prices.passes],
        "swarm_backward_s_per_stage": [p["B"] for p in prices.passes],
        "swarm_optimizer_s_per_stage": prices.optimizer_s,
        "swarm_stage_params": prices.stage_params,
        "swarm_quantisation_s_per_boundary": prices.quantise_s,
        "swarm_boundary_bytes": prices.prices.boundary_bytes,
        "swarm_boundary_bytes_uncompressed": prices.boundary_raw_bytes,
        "swarm_link_bytes_per_s": prices.link_bytes_per_s[0],
        "swarm_link_latency_s": prices.latency_s[0],
        "swarm_preemptions": stats["preemptions"],
        "swarm_reroutes": stats["reroutes"],
        "swarm_redone_forwards": stats["redone_forwards"],
        "swarm_aborted_passes": stats["aborted_passes"],
        "swarm_aborted_pass_s": stats["aborted_s"],
        "swarm_lost_samples": stats["lost_samples"] * scenario.parallelism.micro_batch_size,
        "swarm_moves": stats["moves"],
        "swarm_dispatch_makespan_s": stats["end_s"],
    }
    pass_ops = [op for op in schedule.ops if op.category == "compute" and op.stream == "compute"]
    sends = [op for op in schedule.ops if op.stream == "send"]

    def measured() -> dict:
        """The share of time spent communicating, from the simulated times: seconds of activation
        and gradient transfers between stages over those plus the seconds of passes (compute kernels
        and (de)quantisation; aborted passes included), summed over peers; and the same with the
        parameter averaging counted as communication."""
        send_s = sum(tasks[id(op)].end_s - tasks[id(op)].start_s for op in sends)
        pass_s = sum(tasks[id(op)].end_s - tasks[id(op)].start_s for op in pass_ops)
        avg_s = sum(t.end_s - t.start_s for (a, st), ts in streams.items() if st == "avg" for t in ts)
        return {"swarm_comm_share": send_s / (send_s + pass_s) if send_s + pass_s else 0.0,
                "swarm_comm_share_with_averaging": (send_s + avg_s) / (send_s + avg_s + pass_s)
                if send_s + avg_s + pass_s else 0.0,
                "swarm_transfer_s_total": send_s, "swarm_pass_s_total": pass_s, "swarm_averaging_s_total": avg_s}

    step_ends = [[tasks[id(op)] for op in ends] for ends in schedule.step_ends]
    return Plan(streams, actors, {actor(p): s for p, s in enumerate(stage_of_peer)}, prices.planner.layers_per_chunk,
                prices.planner.topo, compute, steps=scenario.simulation.steps, step_ends=step_ends,
                memory_base_bytes=memory_base, mode="full", extra=extra, after_run=measured)


def in_flight_micro_batches(scenario, speeds: list[list[float]], stage: int) -> int:
    """Micro-batches the stage's fastest peer expects to hold at once: its speed's share of the
    step's micro-batches (all of a step may be in flight, as GPipe), rounded up; on the last stage
    one, since a backward runs before any forward (dispatch rules) and there the backward of a
    micro-batch is ready as soon as its forward ends."""
    if stage == scenario.parallelism.pp - 1:
        return 1
    row = speeds[stage]
    return max(1, math.ceil(micro_batches(scenario) * max(row) / sum(row)))


def _stage_memory(scenario, stage: int, speeds: list[list[float]]):
    par = scenario.parallelism
    n = in_flight_micro_batches(scenario, speeds, stage)
    held = dataclasses.replace(scenario, parallelism=par.model_copy(
        update={"dp": 1, "global_batch_size": n * par.micro_batch_size, "schedule": "gpipe"}))
    return rank_memory(held, stage)


def swarm_memory(scenario):
    _check(scenario)
    _, speeds = pools(scenario)
    return peak_stage([_stage_memory(scenario, s, speeds) for s in range(scenario.parallelism.pp)])


def swarm_layout_gpus(config: SwarmConfig, parallelism, num_gpus: int) -> int:
    """``parallelism:`` describes one pipeline (its stages, batch and recompute); the peers serving
    it are ``peers_per_stage``, any number per stage: dp resolves to 1."""
    return parallelism.tp * parallelism.cp * parallelism.pp


def step_lower_bound_swarm(scenario, prices) -> float:
    """A lower bound on the simulated step (seconds), compute alone, without preemptions and given outages (0
    with them: a preempted peer's micro-batches may be lost, so no count of passes holds). With M micro-batches
    a step, N steps and c(p, s) = (F + B of stage s on peer p's accelerator) / p's speed
    (:attr:`SwarmPrices.peer_passes`, what the dispatcher gives each pass): without rebalancing, the largest over
    the stages of N·M / Σ_(p in s's pool) 1 / c(p, s), over N; with it (peers change stages), N·M·Σ_s min_p
    c(p, s) / P over N (P peers). Beside it, the sends: each micro-batch's activation leaves a peer of stage s
    for stage s + 1 and its gradient a peer of stage s + 1 for stage s, ``boundary_bytes[s]`` each on the sender's
    NIC transmit port, which the engine's flows share max-min fairly and never run above its capacity
    (simulator/engine/network.py): a pool's ports carry N·M·(its stage's out and back bytes) at most at the sum of
    their capacities (all the peers' ports, where peers move); without rebalancing, every peer of a pool of k > 1
    also sends its share of each step's gradient averaging (``averaging_bytes``) on the same port.

    Why it bounds the step: the step is the run's end over N (no window, simulator/simulate.py). Without
    preemptions every micro-batch of every step passes forward and backward through every stage once, each pass
    on one peer of the stage's pool (:mod:`simulator.strategies.swarm_parts.dispatch`), a fixed-duration task
    of c's seconds on that peer's compute stream, which runs its tasks one at a time; the engine never runs one
    in less (interference only slows it; simulator/engine/engine.py). So in a run of length T a peer passes at
    most T / c(p, s) micro-batches of stage s: the pool's N·M need T >= N·M / Σ 1 / c(p, s); where peers move,
    the peers' busy time (at most P·T) holds every stage's passes at their cheapest peer. Optimizer steps, loads,
    moves, latencies (and, where peers move, the averaging) only add (not counted). ``prices`` (:class:`simulator.explore.bounds.KindPrices`)
    is not read. tests/test_kind_bounds.py checks it against the engine."""
    cfg = _check(scenario)
    if cfg.preemptions_per_hour > 0 or cfg.outages:
        return 0.0
    peers, speeds = pools(scenario)
    swarm_prices = SwarmPrices(scenario, sum(peers))
    stage_of_peer = [s for s, count in enumerate(peers) for _ in range(count)]
    flat_speeds = [v for row in speeds for v in row]
    m, stages = micro_batches(scenario), scenario.parallelism.pp
    cost = [[(swarm_prices.peer_passes[p][s]["F"] + swarm_prices.peer_passes[p][s]["B"]) / v for s in range(stages)]
            for p, v in enumerate(flat_speeds)]
    # bytes each stage's peers send per micro-batch: its output forward, its input's gradient back
    boundary = swarm_prices.prices.boundary_bytes
    sent = [(boundary[s] if s < stages - 1 else 0.0) + (boundary[s - 1] if s > 0 else 0.0) for s in range(stages)]
    port = swarm_prices.link_bytes_per_s
    if cfg.rebalance_every_steps is None:
        pool = [[p for p in range(len(cost)) if stage_of_peer[p] == s] for s in range(stages)]
        averaged = [len(pool[s]) * swarm_prices.averaging_bytes(s, len(pool[s])) if len(pool[s]) > 1 else 0.0
                    for s in range(stages)]
        return max(max(m / sum(1.0 / cost[p][s] for p in pool[s]),
                       (m * sent[s] + averaged[s]) / sum(port[p] for p in pool[s])) for s in range(stages))
    return max(m * sum(min(row[s] for row in cost) for s in range(stages)) / len(cost), m * sum(sent) / sum(port))


#: The fields of ``clustersim search``'s space that change what swarm simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): the stages (``pp``, with one pool per stage in the strategy block), their cut
#: (``pp_split``), the micro-batch, the batch and the recompute; tp, cp, ep, ``virtual_stages`` and ``zero_stage`` are
#: refused unless 1 and 0; ``schedule`` is set to GPipe for the prices and the memory (_pricing_scenario,
#: swarm_memory); the overlap switches are not read (the dispatcher builds its own sends and averaging).
SWARM_SEARCHED_FIELDS: tuple[str, ...] = ("pp", "micro_batch_size", "global_batch_size", "recompute", "pp_split")


SWARM = register(StrategyKind(
    name="swarm",
    config=SwarmConfig,
    summary="SWARM parallelism: stages served by pools of peers of any speed, micro-batches wired at random "
            "(weighted by speed), rerouted on preemption, peers rebalanced to the slowest stage, 8-bit "
            "activations, all-reduce or gossip averaging per stage",
    compile=compile_swarm,
    memory=swarm_memory,
    layout_gpus=swarm_layout_gpus,
    searched_layout_fields=lambda config: SWARM_SEARCHED_FIELDS,
    derives_layout=False,
    step_lower_bound=step_lower_bound_swarm,
))
