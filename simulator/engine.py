"""The discrete-event engine: actors run ordered task lists on streams (SimPy).

It knows tasks, streams, dependencies, rendezvous and a network; nothing of GPUs or
transformers. Each (actor, stream) pair is one SimPy process that runs its tasks in
order; a task starts once its dependencies have finished and its stream is free. A task
either takes a fixed ``duration_s`` or moves bytes over the network (``demands``); tasks
that share a ``rendezvous`` key start together once all have arrived (a collective over
several simulated actors) and finish together.

Interference: a fixed-duration task with ``slowdown_while_contended`` s > 0 progresses at
rate 1/(1+s) while any ``contends`` task of the same actor is moving bytes (on accelerators,
communication kernels occupy SMs beside the compute kernels; on CPUs, communication threads
take cores). The rate is re-evaluated whenever such a task starts or ends, so a kernel that is
overlapped for half its length takes (1 + s/2) times its duration. Heterogeneous or failing actors, async
pipelines or infrequent synchronisation are task lists and dependencies of another shape.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import simpy

from simulator.network import FlowNetwork


@dataclass(eq=False)
class Task:
    """One unit of work on one stream of one actor."""

    name: str
    actor: str
    stream: str
    category: str
    duration_s: float = 0.0
    demands: dict[str, float] | None = None
    latency_s: float = 0.0
    deps: list[Task] = field(default_factory=list)
    rendezvous: str | None = None
    rendezvous_size: int = 1
    # For reporting only: a fixed-duration task may stand for consecutive parts of different
    # kinds (a kernel run and an uncontended collective that it waits for), as (category, seconds).
    segments: tuple[tuple[str, float], ...] | None = None
    # Interference (see the module docstring): this task slows while a contending one runs.
    slowdown_while_contended: float = 0.0
    contends: bool = False
    start_s: float = float("nan")
    end_s: float = float("nan")
    ready_s: float = float("nan")
    done: simpy.Event | None = None


class _Rendezvous:
    def __init__(self, env: simpy.Environment, size: int):
        self.size = size
        self.arrived: list[Task] = []
        self.all_arrived = env.event()
        self.finished: simpy.Event | None = None


class Engine:
    """Runs task lists to completion; returns the time the last task ends."""

    def __init__(self, network_capacity):
        self.env = simpy.Environment()
        self.network = FlowNetwork(self.env, network_capacity)
        self._rendezvous: dict[str, _Rendezvous] = {}
        self._contending: dict[str, int] = defaultdict(int)      # actor -> contending tasks in flight
        self._contention_changed: dict[str, simpy.Event] = {}    # actor -> fires when that count hits/leaves 0

    def run(self, streams: dict[tuple[str, str], list[Task]]) -> float:
        for tasks in streams.values():
            for task in tasks:
                task.done = self.env.event()
        for tasks in streams.values():
            self.env.process(self._stream(tasks))
        self.env.run()
        unfinished = [t for tasks in streams.values() for t in tasks if not t.done.triggered]
        if unfinished:
            first = unfinished[0]
            raise RuntimeError(f"deadlock: {len(unfinished)} tasks never ran, first {first.actor}/{first.name}")
        return max((t.end_s for tasks in streams.values() for t in tasks), default=0.0)

    def _stream(self, tasks: list[Task]):
        env = self.env
        for task in tasks:
            pending = [d.done for d in task.deps if not d.done.processed]
            if pending:
                yield simpy.AllOf(env, pending) if len(pending) > 1 else pending[0]
            task.ready_s = env.now
            if task.rendezvous is not None and task.rendezvous_size > 1:
                yield from self._join(task)
            elif task.demands is not None:
                task.start_s = env.now
                transfer = self.network.transfer(task.demands, task.latency_s)
                if task.contends:
                    self._contend(task.actor, +1)
                    transfer.callbacks.append(lambda _ev, actor=task.actor: self._contend(actor, -1))
                yield transfer
            else:
                task.start_s = env.now
                if task.duration_s > 0:
                    if task.slowdown_while_contended > 0:
                        yield from self._run_slowable(task)
                    else:
                        yield env.timeout(task.duration_s)
            task.end_s = env.now
            task.done.succeed()

    def _contend(self, actor: str, delta: int) -> None:
        before = self._contending[actor]
        self._contending[actor] = before + delta
        if (before == 0) != (before + delta == 0):
            changed = self._contention_changed.pop(actor, None)
            if changed is not None:
                changed.succeed()

    def _run_slowable(self, task: Task):
        """Run ``task.duration_s`` of work at rate 1, or 1/(1+s) while its actor is contended."""
        env, actor = self.env, task.actor
        remaining = task.duration_s
        slow_rate = 1.0 / (1.0 + task.slowdown_while_contended)
        while remaining > 1e-15 * task.duration_s:
            rate = slow_rate if self._contending[actor] else 1.0
            changed = self._contention_changed.get(actor)
            if changed is None:
                changed = self._contention_changed[actor] = env.event()
            began = env.now
            finish = env.timeout(remaining / rate)
            yield finish | changed
            if finish.processed:  # ran to the end before the contention changed
                return
            remaining -= (env.now - began) * rate

    def _join(self, task: Task):
        """Wait for every member of the task's rendezvous, then move all members' bytes as one flow."""
        meeting = self._rendezvous.get(task.rendezvous)
        if meeting is None:
            meeting = self._rendezvous[task.rendezvous] = _Rendezvous(self.env, task.rendezvous_size)
        meeting.arrived.append(task)
        if len(meeting.arrived) < meeting.size:
            yield meeting.all_arrived
        else:
            demands: dict[str, float] = defaultdict(float)
            for member in meeting.arrived:
                for port, b in (member.demands or {}).items():
                    demands[port] += b
                member.start_s = self.env.now
            latency = max(m.latency_s for m in meeting.arrived)
            meeting.finished = self.network.transfer(dict(demands), latency)
            for member in meeting.arrived:
                if member.contends:
                    self._contend(member.actor, +1)
                    meeting.finished.callbacks.append(lambda _ev, actor=member.actor: self._contend(actor, -1))
            del self._rendezvous[task.rendezvous]
            meeting.all_arrived.succeed()
        yield meeting.finished
