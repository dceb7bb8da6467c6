"""The SimPy engine: the reference the event-loop engine (simulator/engine/engine.py) is checked
against, task for task (tests/test_engine_cores.py: identical start and end times, counters and
peaks on random task lists). Same semantics, documented in simulator/engine/engine.py; here each
(actor, stream) pair is one SimPy process (a generator resumed once per task or wait).
"""

from __future__ import annotations

from collections import defaultdict

import simpy

from simulator.engine.engine import Task, cyclic_gc_paused
from simulator.engine.network import FlowNetwork


class _Rendezvous:
    def __init__(self, env: simpy.Environment, size: int):
        self.size = size
        self.arrived: list[Task] = []
        self.all_arrived = env.event()
        self.finished: simpy.Event | None = None


class SimPyEngine:
    """Runs task lists to completion on SimPy; returns the time the last task ends (the reference)."""

    def __init__(self, network_capacity):
        self.env = simpy.Environment()
        self.network = FlowNetwork(self.env, network_capacity)
        self._rendezvous: dict[str, _Rendezvous] = {}
        self._contending: dict[str, int] = defaultdict(int)      # actor -> contending tasks in flight
        self._contention_changed: dict[str, simpy.Event] = {}    # actor -> fires when that count hits/leaves 0
        self._computing: dict[str, int] = defaultdict(int)       # actor -> slows_comm tasks running
        self._slowed_flows: dict[str, int] = defaultdict(int)    # actor -> its slowable transfers in flight
        self._compute_changed: dict[str, simpy.Event] = {}       # actor -> fires when it starts/stops computing
        self._executors: dict[str, list[Task]] = defaultdict(list)  # shared executor -> tasks ready on it
        self._executor_changed: dict[str, simpy.Event] = {}          # -> fires when a task joins or leaves
        self.counters: dict[tuple[str, str], float] = {}              # (actor, counter) -> value now
        self.counter_peaks: dict[tuple[str, str], float] = {}         # (actor, counter) -> highest value
        self.counter_series: dict[tuple[str, str], list[tuple[float, float]]] = {}  # -> [(time, value)]

    def run(self, streams: dict[tuple[str, str], list[Task]],
            counters_start: dict[tuple[str, str], float] | None = None,
            until_done: list[Task] | None = None) -> float:
        """Run every task; ``counters_start`` gives (actor, counter) values held from time 0. With
        ``until_done``, stop as soon as those tasks are done (the others may stay unfinished, their
        ``end_s`` NaN) and return the last of their ends."""
        for key, value in (counters_start or {}).items():
            self._count(key, value)
        for tasks in streams.values():
            for task in tasks:
                task.done = self.env.event()
        for tasks in streams.values():
            self.env.process(self._stream(tasks))
        required = [t for tasks in streams.values() for t in tasks] if until_done is None else until_done
        with cyclic_gc_paused():
            if until_done is None:
                self.env.run()
            elif required:
                try:
                    self.env.run(until=simpy.AllOf(self.env, [t.done for t in required]))
                except RuntimeError:  # no events left before they were done: reported below as a deadlock
                    pass
        unfinished = [t for t in required if not t.done.triggered]
        if unfinished:
            first = unfinished[0]
            raise RuntimeError(f"deadlock: {len(unfinished)} tasks never ran, first {first.actor}/{first.name}")
        return max((t.end_s for t in required), default=0.0)

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
                self._started(task)
                transfer = self._transfer([task], task.demands, task.latency_s)
                if task.contends:
                    self._contend(task.actor, +1)
                    transfer.callbacks.append(lambda _ev, actor=task.actor: self._contend(actor, -1))
                yield transfer
            else:
                task.start_s = env.now
                self._started(task)
                if task.duration_s > 0:
                    if task.slows_comm:
                        self._compute_state(task.actor, +1)
                    if task.slowdown_while_contended > 0 or task.shares is not None:
                        yield from self._run_slowable(task)
                    else:
                        yield env.timeout(task.duration_s)
                    if task.slows_comm:
                        self._compute_state(task.actor, -1)
            task.end_s = env.now + task.propagation_s
            if task.free_bytes:
                self._count((task.actor, task.counter), -task.free_bytes)
            if task.propagation_s > 0:
                env.timeout(task.propagation_s).callbacks.append(lambda _ev, done=task.done: done.succeed())
            else:
                task.done.succeed()

    def _started(self, task: Task) -> None:
        if task.alloc_bytes:
            self._count((task.actor, task.counter), task.alloc_bytes)

    def _count(self, key: tuple[str, str], delta: float) -> None:
        """Move a counter by ``delta`` now; record the value (one point per instant) and the peak."""
        value = self.counters.get(key, 0.0) + delta
        self.counters[key] = value
        if value > self.counter_peaks.get(key, float("-inf")):
            self.counter_peaks[key] = value
        series = self.counter_series.setdefault(key, [])
        now = self.env.now
        if series and series[-1][0] == now:
            series[-1] = (now, value)
        else:
            series.append((now, value))

    def _contend(self, actor: str, delta: int) -> None:
        before = self._contending[actor]
        self._contending[actor] = before + delta
        if (before == 0) != (before + delta == 0):
            changed = self._contention_changed.pop(actor, None)
            if changed is not None:
                changed.succeed()

    def _transfer(self, members: list[Task], demands: dict[str, float], latency_s: float) -> simpy.Event:
        """Start the transfer of ``members`` (one task, or a rendezvous): its latency and its
        bytes both move at the slowed pace while a member's actor computes."""
        factor = self._comm_factor(members)
        if factor is None:
            return self.network.transfer(demands, latency_s)
        actors = sorted({m.actor for m in members if m.comm_slowdown_while_computing > 0})
        for actor in actors:
            self._slowed_flows[actor] += 1
        done = self.env.process(self._slowed_transfer(actors, demands, latency_s, factor))
        for actor in actors:
            done.callbacks.append(lambda _ev, actor=actor: self._slowed_flows.__setitem__(
                actor, self._slowed_flows[actor] - 1))
        return done

    def _slowed_transfer(self, actors: list[str], demands: dict[str, float], latency_s: float, factor):
        """Latency as work done at ``factor()`` pace (re-evaluated whenever one of ``actors``
        starts or stops computing), then the bytes as a network flow with that factor."""
        env = self.env
        remaining = latency_s
        while remaining > 1e-15 * max(latency_s, 1e-30):
            rate = factor()
            changed = [self._compute_changed_event(a) for a in actors]
            began = env.now
            finish = env.timeout(remaining / rate)
            yield simpy.AnyOf(env, [finish, *changed])
            if finish.processed:
                break
            remaining -= (env.now - began) * rate
        yield self.network.transfer(demands, 0.0, factor)

    def _compute_changed_event(self, actor: str) -> simpy.Event:
        event = self._compute_changed.get(actor)
        if event is None:
            event = self._compute_changed[actor] = self.env.event()
        return event

    def _comm_factor(self, members: list[Task]):
        """The rate factor of a transfer shared by ``members``: 1/(1+c) while any member's actor
        computes (a collective moves at its slowest member's pace); None when nothing slows it."""
        slowed = [(m.actor, m.comm_slowdown_while_computing) for m in members if m.comm_slowdown_while_computing > 0]
        if not slowed:
            return None
        computing = self._computing

        def factor() -> float:
            return min((1.0 / (1.0 + c) for actor, c in slowed if computing[actor]), default=1.0)
        return factor

    def _compute_state(self, actor: str, delta: int) -> None:
        """Count the actor's running ``slows_comm`` tasks; when it starts or stops computing,
        its slowed transfers re-evaluate their pace (latencies via an event, flows via refresh)."""
        before = self._computing[actor]
        self._computing[actor] = before + delta
        if (before == 0) != (before + delta == 0) and self._slowed_flows[actor]:
            changed = self._compute_changed.pop(actor, None)
            if changed is not None:
                changed.succeed()
            self.network.refresh()

    def _run_slowable(self, task: Task):
        """Run ``task.duration_s`` of work at rate 1, times 1/(1+s) while its actor is contended,
        times its shared executor's rate (0 while a higher-priority task is ready there)."""
        env, actor = self.env, task.actor
        key = task.shares
        if key is not None:
            self._executors[key].append(task)
            self._executor_change(key)
        remaining = task.duration_s
        slow_rate = 1.0 / (1.0 + task.slowdown_while_contended)
        while remaining > 1e-15 * task.duration_s:
            rate = slow_rate if task.slowdown_while_contended > 0 and self._contending[actor] else 1.0
            changes = []
            if task.slowdown_while_contended > 0:
                changed = self._contention_changed.get(actor)
                if changed is None:
                    changed = self._contention_changed[actor] = env.event()
                changes.append(changed)
            if key is not None:
                rate *= self._share_rate(task)
                changed = self._executor_changed.get(key)
                if changed is None:
                    changed = self._executor_changed[key] = env.event()
                changes.append(changed)
            began = env.now
            if rate <= 0.0:  # held back by a higher-priority task: wait for the executor to change
                yield changes[0] if len(changes) == 1 else simpy.AnyOf(env, changes)
                continue
            finish = env.timeout(remaining / rate)
            yield simpy.AnyOf(env, [finish, *changes])
            if key is not None and env.now > began:  # when it ran on the shared executor (for the timeline)
                if not task.run_spans:
                    task.run_spans = [(began, env.now)]
                elif task.run_spans[-1][1] == began:
                    task.run_spans[-1] = (task.run_spans[-1][0], env.now)
                else:
                    task.run_spans.append((began, env.now))
            if finish.processed:  # ran to the end before anything changed
                break
            remaining -= (env.now - began) * rate
        if key is not None:
            self._executors[key].remove(task)
            self._executor_change(key)

    def _share_rate(self, task: Task) -> float:
        """The task's rate on its shared executor: 0 while a lower priority number is ready there, else
        1/(1+x) with x the largest ``interferes`` among the ready tasks of a higher number."""
        worst = 0.0
        for other in self._executors[task.shares]:
            if other.priority < task.priority:
                return 0.0
            if other.priority > task.priority and other.interferes > worst:
                worst = other.interferes
        return 1.0 / (1.0 + worst)

    def _executor_change(self, key: str) -> None:
        changed = self._executor_changed.pop(key, None)
        if changed is not None:
            changed.succeed()

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
                self._started(member)
            latency = max(m.latency_s for m in meeting.arrived)
            meeting.finished = self._transfer(meeting.arrived, dict(demands), latency)
            for member in meeting.arrived:
                if member.contends:
                    self._contend(member.actor, +1)
                    meeting.finished.callbacks.append(lambda _ev, actor=member.actor: self._contend(actor, -1))
            del self._rendezvous[task.rendezvous]
            meeting.all_arrived.succeed()
        yield meeting.finished
