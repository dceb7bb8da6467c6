"""The discrete-event engine: actors run ordered task lists on streams.

It knows tasks, streams, dependencies, rendezvous and a network; nothing of GPUs or
transformers. Each (actor, stream) pair runs its tasks in
order; a task starts once its dependencies have finished and its stream is free. A task
either takes a fixed ``duration_s`` or moves bytes over the network (``demands``); tasks
that share a ``rendezvous`` key start together once all have arrived (a collective over
several simulated actors) and finish together.

Interference: a fixed-duration task with ``slowdown_while_contended`` s > 0 progresses at
rate 1/(1+s) while any ``contends`` task of the same actor is moving bytes (on accelerators,
communication kernels occupy SMs beside the compute kernels; on CPUs, communication threads
take cores). The rate is re-evaluated whenever such a task starts or ends, so a kernel that is
overlapped for half its length takes (1 + s/2) times its duration. The other direction: a
transfer with ``comm_slowdown_while_computing`` c > 0 moves (its latency and its bytes) at 1/(1+c) of its pace while
any ``slows_comm`` task of its actor runs (a collective over a rendezvous: while any member's
does), because the compute kernels take the SMs / cores its kernels or threads need.
Shared executors (priorities): a fixed-duration task with ``shares`` = key runs on that executor beside
the tasks of other actors with the same key (several jobs' kernels on one GPU: DeepPool's
multiplexing, Park et al. 2022, MLSys, Sec. 5; the engine only sees keys and numbers). Among the tasks
*ready* on an executor (dependencies met and their stream's turn come, until they end), a task with a
strictly lower ``priority`` number holds back every task of a higher number: those progress at rate 0 (a
background kernel fills only the time the foreground leaves idle). A running task progresses at
1/(1+x), x the largest ``interferes`` among the ready tasks of a higher number on its executor (a
waiting background kernel still slows the foreground: thread blocks in flight, caches, memory
bandwidth). Tasks of equal priority do not arbitrate. Rates are re-evaluated whenever a task joins or
leaves the executor, and multiply with the contention rate above. ``run(until_done=...)`` stops
once the given tasks are done, leaving the rest unfinished (an endless background job).

Heterogeneous or failing actors, async pipelines or infrequent synchronisation are task lists
and dependencies of another shape.

Propagation: a transfer task's ``propagation_s`` is the time its last byte takes to arrive after it
has left (a long link's delay): its dependents wait for it, its stream does not, so the delays of
back-to-back transfers overlap as on a real pipe; the task ends (``end_s``) when the bytes arrive.

Chains: a fixed task with ``parts`` stands for back-to-back tasks of its stream of which each waits
only for the one before it and none but the next waits for it (a pass's recompute and its backward):
it runs the parts as one, ending at ``start + parts[0] + parts[1] + ...`` summed in that order -- to the
bit where the separate tasks would have ended -- with one event instead of two per part. Its
``duration_s`` is their sum, its deps, ``alloc_bytes`` and ``free_bytes`` those of the chain (the inner
parts allocate and free nothing); :func:`part_spans` gives each part's start and end for reports.
Slowable tasks (interference, shared executors) are never chains: a planner keeps those apart.

Counters: a task may add ``alloc_bytes`` to a named counter (``counter``) of its actor when it
starts and take ``free_bytes`` from it when it ends (the planners use one counter, device
memory). The engine keeps each counter's value over time and its peak (:attr:`Engine.counter_series`,
:attr:`Engine.counter_peaks`); it gives them no meaning. Frees at an instant are applied before the
allocations of the tasks they release (a stream's next task starts after its previous one ends).

The core: one event loop over a heap of (time, priority, sequence, callback, argument), beside it a
FIFO of the normal events scheduled for the current instant (merged by sequence: the same order, half the
events without a heap push and pop), no process per stream and no generator resumed per task: a stream is
a position in its task list and a few continuations. It processes events in exactly SimPy's order (time, then urgent before normal, then
the order they were scheduled; a waiting stream resumes in the callbacks of the event it waits on, in
the order it registered; a wait on several events resumes one scheduling step after the last one), so
it reproduces the SimPy engine (simulator/engine/simpy_engine.py, the reference it replaced) task for
task and bit for bit: tests/test_engine_cores.py checks start and end times, counters and peaks on
random task lists. It costs ~3 µs per task where SimPy's processes cost ~11 µs. The rarer waits
(interference, shared executors, slowed transfers) keep their generators, driven by :meth:`Engine._drive`.
"""

from __future__ import annotations

import gc
import math
from collections import defaultdict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from heapq import heappop, heappush
from itertools import count
from operator import attrgetter
from typing import NamedTuple

from simulator.engine.network import _NORMAL, FlowNetwork


class TaskPart(NamedTuple):
    """One part of a chain task (:attr:`Task.parts`): what a task of its own would have been, named
    the chain's name plus ``suffix`` (so one tuple of parts serves every chain of the same shape)."""

    suffix: str
    category: str
    duration_s: float
    segments: tuple[tuple[str, float], ...] | None = None


def part_spans(task: Task) -> list[tuple[str, TaskPart, float, float]]:
    """(name, part, start, end) of each part of a chain task that ran, as the engine timed them (each
    part ends at the previous one's end plus its duration: the same sums as separate tasks)."""
    out, start = [], task.start_s
    for part in task.parts:
        end = start + part.duration_s
        out.append((task.name + part.suffix, part, start, end))
        start = end
    return out


@dataclass(eq=False, slots=True)
class Task:
    """One unit of work on one stream of one actor.

    Slotted (no instance dict): a plan holds tens of thousands of tasks, and slots make them cheaper to
    build and to read than CPython 3.11's shared-key instance dicts (which a 30th field would also have
    left: ``SHARED_KEYS_MAX_SIZE``). On a Megatron-1T fold point (17,153 tasks, one process, medians of 7)
    the engine ran ~8% faster with slots alone (2026-12-06). No attribute outside the fields below can be set."""

    name: str
    actor: str
    stream: str
    category: str
    duration_s: float = 0.0
    demands: dict[str, float] | None = None
    latency_s: float = 0.0
    # Propagation (a transfer over a long link): the bytes arrive this long after they have left, so
    # the task is done for its dependents then, while its stream is free once the bytes are out.
    propagation_s: float = 0.0
    deps: list[Task] = field(default_factory=list)
    rendezvous: str | None = None
    rendezvous_size: int = 1
    # For reporting only: a fixed-duration task may stand for consecutive parts of different
    # kinds (a kernel run and an uncontended collective that it waits for), as (category, seconds).
    segments: tuple[tuple[str, float], ...] | None = None
    info: tuple[tuple[str, object], ...] = ()  # for reporting only: e.g. (("layer", "block3"), ("flops", 1e12))
    # A chain (see the module docstring): fixed parts run back to back, this task standing for all of them.
    parts: tuple[TaskPart, ...] | None = None
    # Interference (see the module docstring): this task slows while a contending one runs.
    slowdown_while_contended: float = 0.0
    contends: bool = False
    comm_slowdown_while_computing: float = 0.0  # a transfer: 1/(1+c) of its rate while its actor computes
    slows_comm: bool = False                     # a fixed-duration task that slows its actor's transfers
    # Shared executors (see the module docstring): a fixed-duration task on executor ``shares`` waits
    # while a lower-numbered ``priority`` is ready there, and slows higher-priority ones by ``interferes``.
    shares: str | None = None
    priority: int = 0
    interferes: float = 0.0
    # on a shared executor: when it progressed (a list once it has; () until then: no list per task)
    run_spans: list[tuple[float, float]] | tuple[()] = ()
    # Counters (see the module docstring): added to (actor, counter) at start, taken from it at end.
    alloc_bytes: float = 0.0
    free_bytes: float = 0.0
    counter: str = "memory"
    start_s: float = float("nan")
    end_s: float = float("nan")
    ready_s: float = float("nan")
    done: _Event | Task | None = None  # the engine's event: processed once the task's end is known to dependents
    # The engine's event fields on the task itself (Engine.run sets ``done`` to the task: no event object per
    # task, ~18k a Megatron-1T fold run; the simpy engine keeps its own events in ``done``).
    callbacks: list | None = field(default=None, init=False, repr=False)
    triggered: bool = field(default=False, init=False, repr=False)


@contextmanager
def cyclic_gc_paused():
    """Pause Python's cyclic garbage collector meanwhile. Building and running a plan allocates
    hundreds of thousands of long-lived objects (tasks, events) and frees them by reference
    counting; the collector's full passes over that heap cost about a third of a large
    simulation's time (Megatron-1T on 3,072 GPUs: 4.3 -> 2.9 CPU s) and find nothing. Nested
    uses are fine; the collector's state on entry is restored."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()




class _Event:
    """An event of the loop (SimPy's, without values or failures): ``callbacks`` is a list until the
    event is processed, then None; ``triggered`` once it has been scheduled."""

    __slots__ = ("callbacks", "triggered")

    def __init__(self):
        self.callbacks: list | None = []
        self.triggered = False


def _fire(event: _Event) -> None:
    """Process ``event``: mark it processed, then call its callbacks in the order they came."""
    callbacks = event.callbacks
    event.callbacks = None
    for callback in callbacks:
        callback(event)


class _Stop(Exception):
    """Raised by the loop's stop entry (``run(until_done=...)``)."""


_TRIGGERED, _END = attrgetter("triggered"), attrgetter("end_s")  # a run's tasks are their own events

_URGENT = 0  # SimPy's priorities: a process starts before the normal events (_NORMAL = 1) of its instant


class _Stream:
    """One (actor, stream) task list and where it is; its methods are the continuations the loop calls.
    ``on_deps``, ``on_compute`` and ``on_wait``: the continuations the loop calls most, made once per
    stream (not a bound method per event); ``on_deps`` is :meth:`Engine._go` with ``ready`` set."""

    __slots__ = ("engine", "tasks", "i", "meeting", "on_deps", "on_compute", "on_wait")

    def __init__(self, engine: Engine, tasks: list[Task]):
        self.engine = engine
        self.tasks = tasks
        self.i = 0
        self.meeting: _Rendezvous | None = None
        self.on_deps = partial(engine._go, self, True)
        self.on_compute = self.after_compute
        self.on_wait = self.after_wait

    def after_compute(self, _event) -> None:
        task = self.tasks[self.i]
        engine = self.engine
        if task.slows_comm:
            engine._compute_state(task.actor, -1)
        # Engine._end, inlined (once per task)
        propagation = task.propagation_s
        now = engine.now
        task.end_s = now + propagation
        if task.free_bytes:
            if engine._keep_series:
                engine._count((task.actor, task.counter), -task.free_bytes)
            else:  # Engine._count without the series, inlined (the same sum and peak)
                key = (task.actor, task.counter)
                counters = engine.counters
                value = counters[key] = counters.get(key, 0.0) + -task.free_bytes
                if value > engine.counter_peaks.get(key, -math.inf):
                    engine.counter_peaks[key] = value
        done = task.done
        if propagation > 0:
            heappush(engine._queue, (now + propagation, _NORMAL, next(engine._sequence), engine.succeed, done))
        else:
            done.triggered = True
            engine._now_queue.append((next(engine._sequence), _fire, done))
        i = self.i = self.i + 1
        tasks = self.tasks
        if i < len(tasks):
            # The next task waits for this one (just ended: its done event is pending) and at most one
            # other: what _go does then, without the call (most tasks of a pipeline).
            deps = tasks[i].deps
            if deps and deps[0] is task:
                if len(deps) == 1:
                    done.callbacks.append(self.on_deps)
                    return
                if len(deps) == 2:
                    other = deps[1].done
                    if other.callbacks is None:
                        done.callbacks.append(self.on_deps)
                    else:
                        _AllOf(engine, [done, other], self.on_deps)
                    return
        engine._go(self)

    def after_wait(self, _event) -> None:
        task = self.tasks[self.i]
        engine = self.engine
        # Engine._end, inlined (once per transfer: the hot path of a folded Megatron-1T run, trim24); keep the two
        # in step (duplicates flags the pair on purpose)
        propagation = task.propagation_s
        now = engine.now
        task.end_s = now + propagation
        if task.free_bytes:
            engine._count((task.actor, task.counter), -task.free_bytes)
        done = task.done
        if propagation > 0:
            heappush(engine._queue, (now + propagation, _NORMAL, next(engine._sequence), engine.succeed, done))
        else:
            done.triggered = True
            engine._now_queue.append((next(engine._sequence), _fire, done))
        self.i += 1
        engine._go(self)

    def arrived(self, _event) -> None:
        """Every member of its rendezvous has arrived: wait for the collective's transfer."""
        finished = self.meeting.finished
        self.meeting = None
        if finished.callbacks is None:
            self.after_wait(None)
        else:
            finished.callbacks.append(self.on_wait)


class _AllOf:
    """Calls ``then`` one scheduling step after the last of ``events`` is processed (SimPy's AllOf
    condition: it is scheduled when its last event is processed, and its waiter resumes when it is)."""

    __slots__ = ("engine", "left", "then")

    def __init__(self, engine: Engine, events: list[_Event], then):
        self.engine, self.left, self.then = engine, len(events), then
        for event in events:
            event.callbacks.append(self.check)

    def check(self, _event) -> None:
        self.left -= 1
        if self.left == 0:
            engine = self.engine
            engine._now_queue.append((next(engine._sequence), self.then, None))


class _Rendezvous:
    __slots__ = ("size", "arrived", "all_arrived", "finished")

    def __init__(self, size: int):
        self.size = size
        self.arrived: list[Task] = []
        self.all_arrived = _Event()
        self.finished: _Event | None = None


class Engine:
    """Runs task lists to completion; returns the time the last task ends."""

    def __init__(self, network_capacity, counter_series: bool = True):
        """``counter_series``: keep each counter's value over time (False: only values and peaks, for a
        caller that reads no series, e.g. the folded pipeline's runs)."""
        self._keep_series = counter_series
        self.now = 0.0
        self._queue: list[tuple] = []  # (time, priority, sequence, callback, argument)
        # Normal events scheduled for the current instant, (sequence, callback, argument) in order: each comes
        # after every event already in the heap for now and before every later one, so the loop takes them
        # from here without a heap push and pop, merging by sequence with the heap's entries for now (half
        # the events of a deep pipeline: every task's done event, each wake after several dependencies).
        self._now_queue: deque[tuple] = deque()
        self._sequence = count()
        self.network = FlowNetwork(self, network_capacity)
        self._rendezvous: dict[str, _Rendezvous] = {}
        self._contending: dict[str, int] = defaultdict(int)      # actor -> contending tasks in flight
        self._contention_changed: dict[str, _Event] = {}         # actor -> fires when that count hits/leaves 0
        self._computing: dict[str, int] = defaultdict(int)       # actor -> slows_comm tasks running
        self._slowed_flows: dict[str, int] = defaultdict(int)    # actor -> its slowable transfers in flight
        self._compute_changed: dict[str, _Event] = {}            # actor -> fires when it starts/stops computing
        self._executors: dict[str, list[Task]] = defaultdict(list)  # shared executor -> tasks ready on it
        self._executor_changed: dict[str, _Event] = {}               # -> fires when a task joins or leaves
        self.counters: dict[tuple[str, str], float] = {}              # (actor, counter) -> value now
        self.counter_peaks: dict[tuple[str, str], float] = {}         # (actor, counter) -> highest value
        self.counter_series: dict[tuple[str, str], list[tuple[float, float]]] = {}  # -> [(time, value)]

    # -- the clock (also the flow network's: simulator/engine/network.py) -----------------------

    @staticmethod
    def event() -> _Event:
        return _Event()

    def succeed(self, event: _Event) -> None:
        """Schedule ``event`` to be processed now, after what is already scheduled for now."""
        event.triggered = True
        self._now_queue.append((next(self._sequence), _fire, event))

    def call_later(self, delay_s: float, fn, arg) -> None:
        """Call ``fn(arg)`` in ``delay_s`` (a timeout with one callback)."""
        heappush(self._queue, (self.now + delay_s, _NORMAL, next(self._sequence), fn, arg))

    def _timeout(self, delay_s: float) -> _Event:
        event = _Event()
        event.triggered = True
        heappush(self._queue, (self.now + delay_s, _NORMAL, next(self._sequence), _fire, event))
        return event

    def _any_of(self, events: list[_Event]) -> _Event:
        """An event scheduled as soon as one of ``events`` is processed (SimPy's AnyOf)."""
        condition = _Event()

        def check(_event) -> None:
            if not condition.triggered:
                self.succeed(condition)
        for event in events:
            if event.callbacks is None:
                check(event)
            else:
                event.callbacks.append(check)
        return condition

    def _drive(self, generator, on_return) -> None:
        """Run ``generator`` (it yields events to wait on) until it waits on one that is not processed
        yet, and resume it when that one is; call ``on_return()`` when it returns (SimPy's process)."""
        while True:
            try:
                target = next(generator)
            except StopIteration:
                on_return()
                return
            if target.callbacks is not None:
                target.callbacks.append(lambda _event: self._drive(generator, on_return))
                return

    # -- running -------------------------------------------------------------------------------

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
                task.callbacks = []  # the task is its own done event (_Event's two fields)
                task.triggered = False
                task.done = task
        runs = [_Stream(self, tasks) for tasks in streams.values()]
        required = [t for tasks in streams.values() for t in tasks] if until_done is None else until_done
        try:
            if until_done is None or required:
                if until_done is not None:
                    _AllOf(self, [t.done for t in required], self._stop)
                with cyclic_gc_paused():
                    for run in runs:
                        self._go(run)
                    self._loop()
        finally:
            for run in runs:  # each refers to its stream: left, they would keep the plan for the collector
                run.on_deps = run.on_compute = run.on_wait = None
                for task in run.tasks:  # a task that is its own event is a cycle: left, the same
                    task.done = None
        if not all(map(_TRIGGERED, required)):
            unfinished = [t for t in required if not t.triggered]
            first = unfinished[0]
            raise RuntimeError(f"deadlock: {len(unfinished)} tasks never ran, first {first.actor}/{first.name}")
        return max(map(_END, required), default=0.0)

    @staticmethod
    def _stop(_arg) -> None:
        raise _Stop

    def _loop(self) -> None:
        """Process events in (time, priority, sequence) order: the heap's, merged with the current
        instant's queue (``_now_queue``: all at ``now``, normal priority, in sequence order)."""
        queue, now_queue = self._queue, self._now_queue
        try:
            while True:
                if now_queue:
                    if queue and queue[0][0] == self.now and (queue[0][1] < _NORMAL or queue[0][2] < now_queue[0][0]):
                        _, _, _, fn, arg = heappop(queue)  # scheduled for now before these (or urgent)
                    else:
                        _, fn, arg = now_queue.popleft()
                elif queue:
                    self.now, _, _, fn, arg = heappop(queue)
                else:
                    break
                if fn is _fire:  # _fire, inlined (a third of the events)
                    callbacks = arg.callbacks
                    arg.callbacks = None
                    for callback in callbacks:
                        callback(arg)
                else:
                    fn(arg)
        except _Stop:
            pass

    def _go(self, run: _Stream, ready: bool = False, _event=None) -> None:
        """Run the stream's tasks from its position until one has to wait (``ready``: the first one's
        dependencies are done). A fixed task is started here (the common case, inlined); the others
        by :meth:`_begin`."""
        tasks = run.tasks
        n = len(tasks)
        i = run.i
        queue, sequence = self._queue, self._sequence
        while i < n:
            task = tasks[i]
            run.i = i
            if ready:
                ready = False
            elif task.deps:
                deps = task.deps
                if len(deps) == 1:  # the common case (its stream's previous task): no list built
                    callbacks = deps[0].done.callbacks
                    if callbacks is not None:
                        callbacks.append(run.on_deps)
                        return
                else:
                    pending = [d.done for d in deps if d.done.callbacks is not None]
                    if pending:
                        if len(pending) == 1:
                            pending[0].callbacks.append(run.on_deps)
                        else:
                            _AllOf(self, pending, run.on_deps)
                        return
            if task.demands is not None or (task.rendezvous is not None and task.rendezvous_size > 1):
                if (task.rendezvous is None or task.rendezvous_size <= 1) and not (
                        task.comm_slowdown_while_computing > 0 or task.contends):
                    # _begin's common case, inlined (a transfer nothing slows and nothing else waits for)
                    now = self.now
                    task.ready_s = now
                    task.start_s = now
                    if task.alloc_bytes:
                        self._count((task.actor, task.counter), task.alloc_bytes)
                    self.network.transfer_then(task.demands, task.latency_s, run.on_wait)
                    return
                self._begin(run, task)
                return
            now = self.now
            task.ready_s = now
            task.start_s = now
            if task.alloc_bytes:
                if self._keep_series:
                    self._count((task.actor, task.counter), task.alloc_bytes)
                else:  # _count without the series, inlined (the same sum and peak)
                    key = (task.actor, task.counter)
                    counters = self.counters
                    value = counters[key] = counters.get(key, 0.0) + task.alloc_bytes
                    if value > self.counter_peaks.get(key, -math.inf):
                        self.counter_peaks[key] = value
            duration = task.duration_s
            if duration > 0:
                if task.slows_comm:
                    self._compute_state(task.actor, +1)
                if task.slowdown_while_contended > 0 or task.shares is not None:
                    self._drive(self._run_slowable(task), partial(run.after_compute, None))  # no closure: compiled too
                elif task.parts is not None:  # a chain: each part ends where the one before it did, plus its own
                    end = now
                    for part in task.parts:
                        end += part.duration_s
                    heappush(queue, (end, _NORMAL, next(sequence), run.on_compute, None))
                else:
                    heappush(queue, (now + duration, _NORMAL, next(sequence), run.on_compute, None))
                return
            self._end(task)
            i += 1
        run.i = n

    def _begin(self, run: _Stream, task: Task) -> None:
        """Start a transfer or a rendezvous (its dependencies are done and its stream is free)."""
        now = self.now
        task.ready_s = now
        if task.rendezvous is not None and task.rendezvous_size > 1:
            self._join(run, task)
            return
        task.start_s = now
        if task.alloc_bytes:
            self._count((task.actor, task.counter), task.alloc_bytes)
        if task.comm_slowdown_while_computing > 0:
            transfer = self._transfer([task], task.demands, task.latency_s)
        elif not task.contends:  # nothing slows it, nothing else waits for it: the stream goes on at its last byte
            self.network.transfer_then(task.demands, task.latency_s, run.on_wait)
            return
        else:  # nothing slows it: straight onto the network (what _transfer does then)
            transfer = self.network.transfer(task.demands, task.latency_s)
        if task.contends:
            self._contend(task.actor, +1)
            transfer.callbacks.append(lambda _ev, actor=task.actor: self._contend(actor, -1))
        transfer.callbacks.append(run.on_wait)

    def _end(self, task: Task) -> None:
        """The task's work is done now: its end (after propagation), its frees, and its done event."""
        propagation = task.propagation_s
        now = self.now
        task.end_s = now + propagation
        if task.free_bytes:
            self._count((task.actor, task.counter), -task.free_bytes)
        done = task.done
        if propagation > 0:
            heappush(self._queue, (now + propagation, _NORMAL, next(self._sequence), self.succeed, done))
        else:
            done.triggered = True
            self._now_queue.append((next(self._sequence), _fire, done))

    def _count(self, key: tuple[str, str], delta: float) -> None:
        """Move a counter by ``delta`` now; record the value (one point per instant) and the peak."""
        counters = self.counters
        value = counters.get(key, 0.0) + delta
        counters[key] = value
        peaks = self.counter_peaks
        if value > peaks.get(key, -math.inf):
            peaks[key] = value
        if not self._keep_series:
            return
        series = self.counter_series.get(key)
        now = self.now
        if series is None:
            self.counter_series[key] = [(now, value)]
        elif series[-1][0] == now:
            series[-1] = (now, value)
        else:
            series.append((now, value))

    def _contend(self, actor: str, delta: int) -> None:
        before = self._contending[actor]
        self._contending[actor] = before + delta
        if (before == 0) != (before + delta == 0):
            changed = self._contention_changed.pop(actor, None)
            if changed is not None:
                self.succeed(changed)

    def _transfer(self, members: list[Task], demands: dict[str, float], latency_s: float) -> _Event:
        """Start the transfer of ``members`` (one task, or a rendezvous): its latency and its
        bytes both move at the slowed pace while a member's actor computes."""
        factor = self._comm_factor(members)
        if factor is None:
            return self.network.transfer(demands, latency_s)
        actors = sorted({m.actor for m in members if m.comm_slowdown_while_computing > 0})
        for actor in actors:
            self._slowed_flows[actor] += 1
        done = _Event()
        generator = self._slowed_transfer(actors, demands, latency_s, factor)
        heappush(self._queue, (self.now, _URGENT, next(self._sequence),
                               lambda _arg: self._drive(generator, lambda: self.succeed(done)), None))
        for actor in actors:
            done.callbacks.append(lambda _ev, actor=actor: self._slowed_flows.__setitem__(
                actor, self._slowed_flows[actor] - 1))
        return done

    def _slowed_transfer(self, actors: list[str], demands: dict[str, float], latency_s: float, factor):
        """Latency as work done at ``factor()`` pace (re-evaluated whenever one of ``actors``
        starts or stops computing), then the bytes as a network flow with that factor."""
        remaining = latency_s
        while remaining > 1e-15 * max(latency_s, 1e-30):
            rate = factor()
            changed = [self._compute_changed_event(a) for a in actors]
            began = self.now
            finish = self._timeout(remaining / rate)
            yield self._any_of([finish, *changed])
            if finish.callbacks is None:
                break
            remaining -= (self.now - began) * rate
        yield self.network.transfer(demands, 0.0, factor)

    def _compute_changed_event(self, actor: str) -> _Event:
        event = self._compute_changed.get(actor)
        if event is None:
            event = self._compute_changed[actor] = _Event()
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
                self.succeed(changed)
            self.network.refresh()

    def _run_slowable(self, task: Task):
        """Run ``task.duration_s`` of work at rate 1, times 1/(1+s) while its actor is contended,
        times its shared executor's rate (0 while a higher-priority task is ready there)."""
        actor = task.actor
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
                    changed = self._contention_changed[actor] = _Event()
                changes.append(changed)
            if key is not None:
                rate *= self._share_rate(task)
                changed = self._executor_changed.get(key)
                if changed is None:
                    changed = self._executor_changed[key] = _Event()
                changes.append(changed)
            began = self.now
            if rate <= 0.0:  # held back by a higher-priority task: wait for the executor to change
                yield changes[0] if len(changes) == 1 else self._any_of(changes)
                continue
            finish = self._timeout(remaining / rate)
            yield self._any_of([finish, *changes])
            now = self.now
            if key is not None and now > began:  # when it ran on the shared executor (for the timeline)
                if not task.run_spans:
                    task.run_spans = [(began, now)]
                elif task.run_spans[-1][1] == began:
                    task.run_spans[-1] = (task.run_spans[-1][0], now)
                else:
                    task.run_spans.append((began, now))
            if finish.callbacks is None:  # ran to the end before anything changed
                break
            remaining -= (now - began) * rate
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
            self.succeed(changed)

    def _join(self, run: _Stream, task: Task) -> None:
        """Wait for every member of the task's rendezvous, then move all members' bytes as one flow."""
        meeting = self._rendezvous.get(task.rendezvous)
        if meeting is None:
            meeting = self._rendezvous[task.rendezvous] = _Rendezvous(task.rendezvous_size)
        meeting.arrived.append(task)
        if len(meeting.arrived) < meeting.size:
            run.meeting = meeting
            meeting.all_arrived.callbacks.append(run.arrived)
            return
        demands: dict[str, float] = defaultdict(float)
        now = self.now
        for member in meeting.arrived:
            for port, b in (member.demands or {}).items():
                demands[port] += b
            member.start_s = now
            if member.alloc_bytes:
                self._count((member.actor, member.counter), member.alloc_bytes)
        latency = max(m.latency_s for m in meeting.arrived)
        meeting.finished = self._transfer(meeting.arrived, dict(demands), latency)
        for member in meeting.arrived:
            if member.contends:
                self._contend(member.actor, +1)
                meeting.finished.callbacks.append(lambda _ev, actor=member.actor: self._contend(actor, -1))
        del self._rendezvous[task.rendezvous]
        self.succeed(meeting.all_arrived)
        meeting.finished.callbacks.append(run.on_wait)
