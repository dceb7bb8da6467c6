"""Task lists for the strategy kinds that are not one synchronous step (async pipelines, local
learning, cyclic data parallelism): per-actor streams built from the SPMD planner's prices.

They reuse :class:`simulator.strategies.spmd.plan.Planner` for every cost (chunk passes,
pipeline sends, gradient collectives, optimizer steps) and only order the work differently, so a
kind and ``spmd`` price the same pass the same way. One actor per pipeline stage (symmetric
mode): every data-parallel replica of a stage does the same work at the same time.

Memory over time (as the SPMD planner counts it, simulator/strategies/spmd/plan.py): each actor
holds its weights, optimizer state and communication buffers from time 0
(:meth:`StageTasks.hold`, ``Plan.memory_base_bytes``); a kind's tasks add the rest with
``Task.alloc_bytes`` / ``Task.free_bytes``, using the analytic sizes of
:mod:`simulator.memory.analytic` (a micro-batch's saved activations, the recompute working set,
the stage's gradients), so the simulated peak and the kind's analytic peak count the same bytes.
"""

from __future__ import annotations

from collections import defaultdict

from simulator.engine.engine import Task
from simulator.errors import ConfigError
from simulator.scenario import gradient_bytes
from simulator.strategies.framework_terms import input_task
from simulator.strategies.plan import Plan
from simulator.strategies.spmd.plan import Planner


class StageTasks:
    """Streams of one actor per pipeline stage, priced by a symmetric-mode :class:`Planner`."""

    def __init__(self, scenario):
        self.scenario = scenario
        self.planner = Planner(scenario, mode="symmetric")
        self.par = scenario.parallelism
        self.streams: dict[tuple[str, str], list[Task]] = defaultdict(list)
        self.compute: dict[str, list[Task]] = defaultdict(list)
        self.actors = [f"stage{i}" for i in range(self.par.pp)]
        self.ranks = [self.planner.actor_ranks[a] for a in self.actors]
        self._pass_s: dict[tuple[int, str], float] = {}
        self.memory_base: dict[str, float] = {}

    # -- prices ------------------------------------------------------------------------------

    def pass_s(self, stage: int, phase: str) -> float:
        """Seconds of the stage's whole chunk pass: "F" forward, "B" backward (with recompute), with the
        framework's host floor (simulator/strategies/framework_terms.py)."""
        key = (stage, phase)
        if key not in self._pass_s:
            rank, planner = self.ranks[stage], self.planner
            runs = planner.chunk_runs(stage)
            # kernels and exposed collectives, and the host floor's stall after the pass as spmd adds it (the
            # eager or cross-node floor, simulator/cost/host_floor.py; the jitter is in the kernels' prices)
            seconds = planner.chunk_pass_s(rank, phase, stage) + planner.host_floor_stall_s(rank, phase, runs)
            if phase == "B":
                seconds += planner.chunk_pass_s(rank, "R", stage) + planner.host_floor_stall_s(rank, "R", runs)
            self._pass_s[key] = seconds
        return self._pass_s[key]

    # -- memory over time -------------------------------------------------------------------

    def hold(self, stage: int, nbytes: float) -> None:
        """Bytes the stage's actor holds from time 0 (``Plan.memory_base_bytes``)."""
        actor = self.actors[stage]
        self.memory_base[actor] = self.memory_base.get(actor, 0.0) + nbytes

    def held_bytes(self, stage: int) -> float:
        """Weights, optimizer state and communication buffers of the stage (analytic sizes)."""
        return self.planner.base_memory_bytes(stage)

    def activation_bytes(self, stage: int) -> float:
        """One micro-batch's activations kept by the stage's forward until its backward (with the
        embedding on stage 0 and the head and loss on the last)."""
        return self.planner.activation_bytes(stage)

    def gradient_bytes(self, stage: int) -> float:
        """The stage's gradient bytes (analytic count)."""
        return self.planner.stage_memory(stage).gradients_bytes

    def forward_memory(self, stage: int, forward: Task) -> None:
        """A forward saves its micro-batch's activations (allocated at its start)."""
        forward.alloc_bytes += self.activation_bytes(stage)

    def backward_memory(self, stage: int, backward: Task, gradients_bytes: float = 0.0) -> None:
        """A backward holds the recompute working set while it runs (and allocates
        ``gradients_bytes`` at its start, on the first backward after an update); at its end the
        working set and the micro-batch's saved activations are freed."""
        working = self.planner.working_bytes(stage)
        backward.alloc_bytes += working + gradients_bytes
        backward.free_bytes += working + self.activation_bytes(stage)

    # -- building ----------------------------------------------------------------------------

    def ops_s(self, stage: int, ops) -> float:
        """Seconds of a tuple of ops on the stage's rank (kernels plus exposed collectives); keep
        the tuple alive: the planner's caches key on it."""
        return sum(self.planner.pass_cost_s(self.ranks[stage], ops))

    def kernel(self, stage: int, name: str, seconds: float, category: str = "compute",
               deps: tuple[Task, ...] = ()) -> Task:
        """A compute task on the stage's stream (streams run their tasks in list order)."""
        actor = self.actors[stage]
        task = Task(name, actor, "compute", category, duration_s=seconds, deps=list(deps))
        self.streams[(actor, "compute")].append(task)
        self.compute[actor].append(task)
        return task

    def input_load(self, stage: int, name: str, samples: int | None = None) -> Task | None:
        """The next step's samples (or ``samples`` of them) loaded on a first stage's host beside this step
        (``input_us_per_sample``, simulator/strategies/framework_terms.py; None on a later stage or without
        the term): the kind puts it among the step's ends and makes the next step's first forward wait for
        it (or, loaded per micro-batch, the forward of that micro-batch). Loads queue on the actor's ``input``
        stream in the order the kind asks for them, each after the one before (a prefetching loader)."""
        if stage != 0:
            return None
        if samples is None:
            samples = self.par.micro_batch_size * self.par.num_micro_batches
        task = input_task(self.planner.sc.rank_accelerator(self.ranks[stage]).efficiency, self.actors[stage],
                          samples, name)
        if task is not None:
            self.streams[(self.actors[stage], "input")].append(task)
        return task

    def send(self, src: int, dst: int, name: str, after: Task) -> Task:
        """The activation (or its gradient) of one micro-batch from stage ``src`` to ``dst``."""
        task = self.planner.send_task(self.actors[src], self.ranks[dst], name, self.planner.pp_payload_bytes())
        task.deps.append(after)
        self.streams[(self.actors[src], "pp")].append(task)
        return task

    def gradient_all_reduce(self, stage: int, name: str, after: Task, extra_params: float = 0.0) -> Task | None:
        """The stage's whole gradient (and ``extra_params``' of a kind's own modules) all-reduced
        over its data-parallel group (None when dp = 1)."""
        planner = self.planner
        if self.par.dp_degree * self.par.cp == 1:
            return None
        nbytes = (planner.stage_params_local(stage) + extra_params) * gradient_bytes(self.scenario.training)
        task = planner.comm_task(self.actors[stage], "dp", "dp_comm", name, self.ranks[stage],
                                 [(planner.grad_group, "all_reduce", nbytes)], key=name)
        if task is None:
            return None
        task.deps.append(after)
        self.streams[(self.actors[stage], "dp")].append(task)
        return task

    def plan(self, window, extra=None, after_run=None) -> Plan:
        """The plan over a steady-state ``window`` (opening tasks, each step's closing tasks),
        with the SPMD planner's interference marks (a kernel slows while a transfer of its rank
        runs, and the other way round)."""
        self.planner._mark_interference(self.streams)
        stage_of = {a: i for i, a in enumerate(self.actors)}
        return Plan(dict(self.streams), dict(zip(self.actors, self.ranks, strict=True)), stage_of,
                    self.planner.layers_per_chunk, self.planner.topo, dict(self.compute), steps=len(window[1]),
                    step_ends=window[1], window=window, extra=extra or {}, after_run=after_run,
                    memory_base_bytes=dict(self.memory_base))


def require(condition: bool, field: str, reason: str) -> None:
    """A layout the kind cannot run: one ConfigError naming the field."""
    if not condition:
        raise ConfigError(field, reason)
