"""The ``parameter_server`` strategy kind: workers push gradients to servers and pull parameters
(Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter Server", OSDI; DS3Lab's
DT-FM runs with a central and a sharded server, Yuan et al. 2022, "Decentralized Training of
Foundation Models in Heterogeneous Environments", NeurIPS).

Each data-parallel replica (``parallelism.dp``; tp/pp inside a replica as the spmd kind) is a
worker. Per pipeline stage, the dp group's servers hold the stage's parameters and optimizer state:

- ``servers: central``: one server, on the group's first rank (DT-FM's "centralized PS on rank 0"),
  holds everything; every other worker pushes its whole gradient to it and pulls every parameter
  from it (its links carry (dp - 1) x the model: the incast a central server suffers);
- ``servers: sharded``: every rank of the group serves 1/dp of the parameters; each worker pushes
  each shard of its gradient to that shard's server and pulls each shard back (the traffic of a
  reduce-scatter plus an all-gather, as point-to-point transfers over the topology's ports).

Pushes and pulls are point-to-point flows on the flow network (NVLink inside a node, the NIC
between nodes, the uplink across pods), concurrent per destination, sharing ports fairly. Workers
run no optimizer; servers do:

- ``mode: sync``: a server waits for every worker's push of its shard, adds the gradients
  (memory-bound, (pushes) x shard bytes) and runs the optimizer over its shard; every worker's next
  step waits for all its pulls. Staleness 0.
- ``mode: async``: a server applies each worker's push as soon as it arrives (one optimizer step
  over its shard per push, Hogwild-style; concurrent updates share the server's optimizer
  bandwidth fairly, a processor-sharing model of the server), and sends that worker its parameters
  back; a worker's next step waits only for its own pulls. Staleness is counted per update from
  the simulated times: the other workers' updates a server applied between the one that produced a
  worker's pulled parameters and the one applying its new gradient (``staleness_updates_mean``;
  in steps, ÷ the workers: ``staleness_steps_mean``, which feeds the ``convergence:`` block).

Every rank is simulated (full mode): servers make the ranks of a group unlike each other. Memory:
a central server keeps the whole optimizer state (the spmd count without ZeRO); sharded servers
1/dp of it (as ZeRO-1); workers that serve nothing keep none (their base memory is less).

``training.optimizer_fusion`` is refused (simulator/scenario.py): workers run no optimizer, and the
servers already apply each stage's gradient as its pushes arrive; pushing and applying each layer's
gradient as soon as the backward makes it is not modelled.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.engine.engine import Task
from simulator.errors import ConfigError
from simulator.memory.analytic import peak_rank_memory, rank_memory
from simulator.scenario import gradient_bytes
from simulator.strategies.plan import Plan
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.spmd.plan import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_BYTES, Planner

SERVER_PORT = "server_update"


class ParameterServerConfig(BaseModel):
    """``strategy: {kind: parameter_server, mode: sync|async, servers: central|sharded}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["parameter_server"] = "parameter_server"
    mode: Literal["sync", "async"] = "sync"
    servers: Literal["central", "sharded"] = "central"
    transport: Literal["p2p", "collective"] = Field(
        default="p2p", description="p2p: pushes and pulls as point-to-point transfers (a central server's links take "
                                   "(dp - 1) x the model); collective: a ring reduce to the server and a broadcast "
                                   "from it (sharded: reduce-scatter and all-gather), NCCL's way (sync only)")


def _check(scenario) -> None:
    par = scenario.parallelism
    if getattr(scenario, "mixed", False):
        raise ConfigError("cluster.groups", "parameter_server is modelled on one kind of node (its servers' "
                                            "optimizer runs at one accelerator's bandwidth): give cluster.node")
    if par.zero_stage != 0:
        raise ConfigError("parallelism.zero_stage", "parameter_server shards state by its servers: needs 0")
    if par.cp != 1:
        raise ConfigError("parallelism.cp", "parameter_server is modelled without context parallelism (cp 1)")
    if scenario.strategy.transport == "collective" and scenario.strategy.mode == "async":
        raise ConfigError("strategy.transport", "collectives are synchronous: transport collective needs mode sync")


def _memory_scenario(scenario):
    """The spmd scenario whose memory count is the servers': ZeRO-1 for sharded servers (each holds
    1/dp of the optimizer state), ZeRO-0 for a central one."""
    sharded = scenario.strategy.servers == "sharded"
    par = scenario.parallelism.model_copy(update={"zero_stage": 1 if sharded else 0})
    return dataclasses.replace(scenario, parallelism=par)


def parameter_server_memory(scenario):
    _check(scenario)
    return peak_rank_memory(_memory_scenario(scenario))


class _ServerPorts:
    """The topology's ports plus each server's optimizer bandwidth as a port (async updates share it)."""

    def __init__(self, topology, server_bytes_per_s: float):
        self.topology = topology
        self.server_bytes_per_s = server_bytes_per_s

    def port_capacity(self, port: str) -> float:
        if port.endswith(f":{SERVER_PORT}"):
            return self.server_bytes_per_s
        return self.topology.port_capacity(port)

    def __getattr__(self, name):
        return getattr(self.topology, name)


class ParameterServerPlanner(Planner):
    """The spmd planner (every rank an actor, no dp reduction, no local optimizer) plus push,
    server update and pull tasks after every step."""

    def __init__(self, scenario, mode: str | None = None, detail: bool = False):
        _check(scenario)
        super().__init__(scenario, mode="full", detail=detail)
        self.cfg = scenario.strategy
        self.sync_gradients = False
        self.local_update = False
        self.updates: dict[tuple[int, int], list[Task]] = {}  # (server rank, worker rank) -> its updates

    def stage_memory(self, stage: int):
        hit = self._memory_cache.get(("stage", stage))
        if hit is None:
            hit = self._memory_cache[("stage", stage)] = rank_memory(_memory_scenario(self.sc), stage)
        return hit

    def _servers(self, group: tuple[int, ...]) -> tuple[int, ...]:
        return group[:1] if self.cfg.servers == "central" else group

    def _p2p(self, src: int, dst: int, name: str, nbytes: float, stream: str) -> Task:
        task = self.send_task(self.rank_actor[src], dst, name, nbytes)
        task.stream, task.category = stream, "dp_comm"
        return task

    def _collective_step(self, step: int, streams, boundary) -> list[Task]:
        """transport collective: every rank joins a reduce (to the group's first rank; sharded: a
        reduce-scatter), the servers update their part, every rank joins a broadcast (all-gather)."""
        central = self.cfg.servers == "central"
        grad_b, weight_b = gradient_bytes(self.sc.training), WEIGHT_BYTES[self.precision]
        opt_bytes = OPTIMIZER_BYTES_PER_PARAM[self.sc.training.optimizer]
        ends: list[Task] = []
        for actor, rank in self.actor_ranks.items():
            group = self.layout.group(rank, "dp")
            params = self.stage_params_local(self.layout.coords(rank).pp)
            after = list(boundary[actor])
            reduce = self.comm_task(actor, "dp", "dp_comm", "ps_reduce", rank,
                                    [("dp", "reduce" if central else "reduce_scatter", params * grad_b)],
                                    key=f"ps_reduce{step}")
            after = _chained(reduce, after, streams, (actor, "dp"))
            if rank in self._servers(group):
                shard = params / len(self._servers(group))
                update = Task(f"server_update.r{rank}", actor, "compute", "optimizer",
                              duration_s=self.compute.optimizer_step_s(shard, opt_bytes), deps=after)
                streams[(actor, "compute")].append(update)
                after = [update]
            spread = self.comm_task(actor, "dp", "dp_comm", "ps_broadcast", rank,
                                    [("dp", "broadcast" if central else "all_gather", params * weight_b)],
                                    key=f"ps_broadcast{step}")
            after = _chained(spread, after, streams, (actor, "dp"))
            boundary[actor] = tuple(after)
            ends.extend(after)
        return ends

    def after_step(self, step: int, streams, boundary) -> list[Task]:
        if self.cfg.transport == "collective":
            return self._collective_step(step, streams, boundary)
        ends: list[Task] = []
        grad_b, weight_b = gradient_bytes(self.sc.training), WEIGHT_BYTES[self.precision]
        opt_bytes = OPTIMIZER_BYTES_PER_PARAM[self.sc.training.optimizer]
        new_boundary: dict[str, list[Task]] = {a: [] for a in self.actor_ranks}
        done_groups: set[tuple[int, ...]] = set()
        for rank in self.actor_ranks.values():
            group = self.layout.group(rank, "dp")
            if group in done_groups:
                continue
            done_groups.add(group)
            stage = self.layout.coords(rank).pp
            servers = self._servers(group)
            shard_params = self.stage_params_local(stage) / len(servers)
            for server in servers:
                s_actor = self.rank_actor[server]
                pushes = {}
                for worker in group:
                    w_actor = self.rank_actor[worker]
                    if worker == server:
                        pushes[worker] = None
                        continue
                    push = self._p2p(worker, server, f"push.r{worker}>r{server}", shard_params * grad_b,
                                     f"push{server}")
                    push.deps.extend(boundary[w_actor])
                    streams[(w_actor, push.stream)].append(push)
                    pushes[worker] = push
                if self.cfg.mode == "sync":
                    update = Task(f"server_update.r{server}", s_actor, "compute", "optimizer",
                                  duration_s=self.compute.add_into_s((len(group) - 1) * shard_params * grad_b)
                                  + self.compute.optimizer_step_s(shard_params, opt_bytes),
                                  deps=[p for p in pushes.values() if p is not None] + list(boundary[s_actor]))
                    streams[(s_actor, "compute")].append(update)
                    new_boundary[s_actor].append(update)
                    ends.append(update)
                    per_worker = dict.fromkeys(group, update)
                else:
                    per_worker = {}
                    for worker, push in pushes.items():
                        update = Task(f"server_update.r{server}<r{worker}", s_actor, f"update{worker}", "optimizer",
                                      demands={f"{s_actor}:{SERVER_PORT}": shard_params * opt_bytes},
                                      latency_s=self.compute.launch_s,
                                      deps=[push] if push is not None else list(boundary[s_actor]))
                        streams[(s_actor, update.stream)].append(update)
                        self.updates.setdefault((server, worker), []).append(update)
                        per_worker[worker] = update
                        ends.append(update)
                        if worker == server:
                            new_boundary[s_actor].append(update)
                for worker in group:
                    if worker == server:
                        continue
                    pull = self._p2p(server, worker, f"pull.r{server}>r{worker}", shard_params * weight_b,
                                     f"pull{worker}")
                    pull.deps.append(per_worker[worker])
                    streams[(s_actor, pull.stream)].append(pull)
                    new_boundary[self.rank_actor[worker]].append(pull)
                    ends.append(pull)
        for actor, tasks in new_boundary.items():
            boundary[actor] = tuple(tasks) + tuple(boundary[actor])
        return ends

    def build(self) -> Plan:
        plan = super().build()
        for actor, rank in self.actor_ranks.items():
            if rank not in self._servers(self.layout.group(rank, "dp")):  # serves nothing: no optimizer state
                plan.memory_base_bytes[actor] -= self.stage_memory(self.layout.coords(rank).pp).optimizer_bytes
        plan.topology = _ServerPorts(plan.topology, self.compute.optimizer_bw)
        plan.report = self.staleness_report
        return plan

    def staleness_report(self) -> dict[str, float]:
        """After the run: the staleness of every async update (see the module docstring)."""
        if self.cfg.mode == "sync" or not self.updates:
            return {"staleness_updates_mean": 0.0, "staleness_steps_mean": 0.0}
        counts: list[int] = []
        for (server, worker), mine in self.updates.items():
            others = [u.end_s for (s, w), us in self.updates.items() if s == server and w != worker for u in us]
            previous_end = 0.0
            for update in mine:
                counts.append(sum(1 for end in others if previous_end < end <= update.start_s))
                previous_end = update.end_s
        workers = self.par.dp_degree
        mean = sum(counts) / len(counts)
        return {"staleness_updates_mean": mean, "staleness_updates_max": float(max(counts)),
                "staleness_steps_mean": mean / workers}


def compile_parameter_server(scenario, mode: str | None = None, detail: bool = False) -> Plan:
    return ParameterServerPlanner(scenario, mode=mode, detail=detail).build()


def parameter_server_convergence_inputs(scenario) -> dict[str, float]:
    """Staleness before simulating (identical workers): 0 when sync; async, each update follows the
    other dp - 1 workers' ones, (dp - 1) / dp steps. ``simulate`` uses the simulated mean instead."""
    dp = scenario.parallelism.dp_degree
    return {"staleness_steps": 0.0 if scenario.strategy.mode == "sync" else (dp - 1) / dp}


#: The fields of ``clustersim search``'s space that change what parameter_server simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): each worker runs spmd's layout (its planner), so every field of it but:
#: ``zero_stage`` and ``cp`` (refused unless 0 and 1), ``overlap_grad_reduce`` (the push to the servers replaces the
#: gradient all-reduce: ``sync_gradients`` is off) and ``overlap_param_gather`` (spmd gathers weights only under ZeRO).
PARAMETER_SERVER_SEARCHED_FIELDS: tuple[str, ...] = ("tp", "pp", "ep", "virtual_stages", "micro_batch_size",
    "recompute", "sequence_parallel", "schedule", "global_batch_size", "pp_split", "overlap_tp_grad_comm",
    "overlap_p2p_comm", "tp_comm_overlap")


PARAMETER_SERVER = register(StrategyKind(
    name="parameter_server",
    config=ParameterServerConfig,
    summary="workers push gradients to central or sharded servers and pull parameters over the topology; "
            "sync or async (staleness counted per update)",
    compile=compile_parameter_server,
    memory=parameter_server_memory,
    convergence_inputs=parameter_server_convergence_inputs,
    searched_layout_fields=lambda config: PARAMETER_SERVER_SEARCHED_FIELDS,
    derives_layout=True,
    spmd_chain_bound=True,
))


def _chained(task: Task | None, after: list[Task], streams, key) -> list[Task]:
    """Append ``task`` (a collective, None when its group has one member) to ``streams[key]`` after
    ``after``; what the next task waits for."""
    if task is None:
        return after
    task.deps.extend(after)
    streams[key].append(task)
    return [task]
