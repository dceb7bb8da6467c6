"""The discrete-event engine: actors run ordered task lists on streams (SimPy).

It knows tasks, streams, dependencies, rendezvous and a network; nothing of GPUs or
transformers. Each (actor, stream) pair is one SimPy process that runs its tasks in
order; a task starts once its dependencies have finished and its stream is free. A task
either takes a fixed ``duration_s`` or moves bytes over the network (``demands``); tasks
that share a ``rendezvous`` key start together once all have arrived (a collective over
several simulated actors) and finish together. Heterogeneous or failing actors, async
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
                yield self.network.transfer(task.demands, task.latency_s)
            else:
                task.start_s = env.now
                if task.duration_s > 0:
                    yield env.timeout(task.duration_s)
            task.end_s = env.now
            task.done.succeed()

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
            del self._rendezvous[task.rendezvous]
            meeting.all_arrived.succeed()
        yield meeting.finished
