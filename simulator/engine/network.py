"""A flow-level network: transfers share ports by max-min fairness.

This module knows ports and bytes, nothing of GPUs. A *port* is a directional resource
with a capacity in bytes/s (a GPU's NVLink transmit side, a NIC's receive side, ...).
A *flow* moves given bytes over each of several ports; it progresses at one rate r
(fraction of its bytes per second), so on port p it uses r·d_p bytes/s.

Rates are max-min fair in bandwidth (progressive filling, Bertsekas & Gallager, *Data
Networks*, Sec. 6.5.2): all flows' bandwidth on their heaviest port rises together
until some port saturates; the flows on it freeze; repeat. Rates are recomputed only
when a flow starts or finishes (or :meth:`FlowNetwork.refresh` says a flow's ``factor``
changed), and one re-armed timeout marks the next completion, so events occur only where
the allocation changes (DESIGN.md, "Where the time goes").

A flow may carry a ``factor()``: its fair rate is multiplied by it (a flow whose endpoints
are busy elsewhere moves slower than the links allow). The capacity it leaves unused is not
handed to other flows, a simplification that is exact when the slowed flow has its ports
to itself.

The seam to the rest (ASTRA-sim style) is :meth:`FlowNetwork.transfer`; another network
model with the same method can replace this one. Time passes on a *clock*: the engine's own event
loop (simulator/engine/engine.py), or a SimPy environment (wrapped in :class:`SimPyClock`; the
reference engine, simulator/engine/simpy_engine.py). The clock gives ``now``, ``event()``,
``succeed(event)`` and ``call_later(delay_s, fn, arg)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heappush
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import simpy

_EPS = 1e-12
_NORMAL = 1  # the engine's priority of a normal event (simulator/engine/engine.py: SimPy's NORMAL)


class SimPyClock:
    """The clock interface over a SimPy environment: every call is the SimPy call it stands for, in
    the same order (a timeout whose one callback is ``fn``), so both engines see the same events."""

    def __init__(self, env: simpy.Environment):
        self.env = env

    @property
    def now(self) -> float:
        return self.env.now

    def event(self) -> simpy.Event:
        return self.env.event()

    @staticmethod
    def succeed(event: simpy.Event) -> None:
        event.succeed()

    def call_later(self, delay_s: float, fn: Callable, arg) -> None:
        self.env.timeout(delay_s).callbacks.append(lambda _ev: fn(arg))


@dataclass(eq=False, slots=True)
class _Flow:
    demands: dict[str, float]
    done: object  # the clock's event
    heaviest: float
    remaining: float = 1.0          # fraction of the bytes still to move
    rate: float = 0.0               # fraction per second
    weights: dict[str, float] = field(default_factory=dict)
    solo_rate: float = 0.0          # its rate with its ports to itself: min over ports of capacity / bytes
    factor: Callable[[], float] | None = None  # multiplies the fair rate (1 = the links' pace)
    then: Callable[[None], None] | None = None  # called in ``done``'s place (:meth:`FlowNetwork.transfer_then`)


class FlowNetwork:
    """Shared ports with fair sharing. ``capacity(port)`` gives bytes/s of a port: a fixed
    value per port (it is asked once per port and remembered)."""

    def __init__(self, clock, capacity: Callable[[str], float]):
        # the engine's loop is a clock; a SimPy environment (no ``call_later``) is wrapped. Nothing here
        # imports simpy: the engine runs without it (start-up: importing it costs ~45 ms).
        self.clock = clock if hasattr(clock, "call_later") else SimPyClock(clock)
        # The engine's own loop (simulator/engine/engine.py): its heap and sequence, so the hot paths push
        # the entry its ``call_later`` would push, (now + delay, normal, next sequence, fn, arg), without the
        # call (~8.5k flow starts and ~12k timers a Megatron-1T fold point). None on another clock.
        self._queue = getattr(self.clock, "_queue", None)
        self._now_queue = getattr(self.clock, "_now_queue", None)  # its events for the current instant
        self._sequence = getattr(self.clock, "_sequence", None)
        self._port_capacity = capacity
        self._capacities: dict[str, float] = {}
        self._flows_on_port: dict[str, int] = {}
        self._shared_ports: set[str] = set()   # ports that more than one flow uses now
        self._flows: list[_Flow] = []
        self._factored = 0                      # flows in flight with a ``factor``
        self._last_update = 0.0
        self._version = 0
        self.flows_started = 0
        self._prepared: dict[int, tuple] = {}  # id(demands) -> (demands, its flow constants), see _prepare

    def transfer(self, demands: dict[str, float], latency_s: float = 0.0,
                 factor: Callable[[], float] | None = None):
        """Start a transfer: wait ``latency_s``, then move ``demands[port]`` bytes over each
        port at the fair rate (times ``factor()`` where given). Returns an event that fires
        when the last byte arrives."""
        done = self.clock.event()
        prepared = self._prepared.get(id(demands))
        if prepared is None or prepared[0] is not demands:
            prepared = self._prepared[id(demands)] = (demands, self._prepare(demands))
        if latency_s > 0:
            self.clock.call_later(latency_s, self._start, (prepared[1], done, factor, None))
        else:
            self._start((prepared[1], done, factor, None))
        return done

    def transfer_then(self, demands: dict[str, float], latency_s: float, then: Callable[[None], None]) -> None:
        """:meth:`transfer` for a waiter that is the event's only callback: ``then(None)`` is scheduled
        where the event would be (``call_later(0, ...)`` at the last byte: the same place in the clock's
        order as the event's processing), without an event between them."""
        prepared = self._prepared.get(id(demands))
        if prepared is None or prepared[0] is not demands:
            prepared = self._prepared[id(demands)] = (demands, self._prepare(demands))
        if latency_s > 0:
            queue = self._queue
            if queue is not None:  # the engine's call_later, inlined
                heappush(queue, (self.clock.now + latency_s, _NORMAL, next(self._sequence), self._start,
                                 (prepared[1], None, None, then)))
            else:
                self.clock.call_later(latency_s, self._start, (prepared[1], None, None, then))
        else:
            self._start((prepared[1], None, None, then))

    def _prepare(self, demands: dict[str, float]):
        """A flow's constants from its demands: (ports with bytes, heaviest bytes, each port's share
        of the heaviest, its rate alone). Kept per demands mapping (the caller's, which it keeps
        alive and never changes: planners share one mapping among every send of a pipeline edge)."""
        kept = {p: b for p, b in demands.items() if b > 0}
        if not kept:
            return kept, 0.0, {}, 0.0
        heaviest = max(kept.values())
        return (kept, heaviest, {p: b / heaviest for p, b in kept.items()},
                min(self.capacity(p) / b for p, b in kept.items()))

    def refresh(self) -> None:
        """Re-evaluate the flows' rates now (a ``factor`` changed)."""
        if self._flows:
            self._advance()
            self._reallocate()

    # -- internals -------------------------------------------------------------------------

    def _start(self, args) -> None:
        """Start a flow: ``args`` = (its prepared constants, its done event, its factor, its ``then``)
        (one tuple: the clock calls it with one argument)."""
        prepared, done, factor, then = args
        demands, heaviest, weights, solo_rate = prepared
        if not demands:
            if then is None:
                self.clock.succeed(done)
            else:
                self.clock.call_later(0.0, then, None)
            return
        flows = self._flows
        now = self.clock.now  # _advance, inlined (once per flow start)
        elapsed = now - self._last_update
        if elapsed > 0:
            for other in flows:
                other.remaining -= other.rate * elapsed
        self._last_update = now
        flow = _Flow(demands, done, heaviest, 1.0, 0.0, weights, solo_rate, factor, then)
        flows.append(flow)
        if factor is not None:
            self._factored += 1
        flows_on_port = self._flows_on_port
        for port in demands:
            n = flows_on_port[port] = flows_on_port.get(port, 0) + 1
            if n == 2:
                self._shared_ports.add(port)
        self.flows_started += 1
        self._reallocate()

    def _advance(self) -> None:
        """Move every flow forward to now at its current rate."""
        now = self.clock.now
        elapsed = now - self._last_update
        if elapsed > 0:
            for flow in self._flows:
                flow.remaining -= flow.rate * elapsed
        self._last_update = now

    def capacity(self, port: str) -> float:
        value = self._capacities.get(port)
        if value is None:
            value = self._capacities[port] = self._port_capacity(port)
        return value

    def _reallocate(self) -> None:
        flows = self._flows
        if not self._shared_ports and not self._factored:
            # Every flow alone on its ports, none slowed: each moves at its own bottleneck; the
            # allocation and the next completion in one pass (the same values as the general path).
            self._version += 1
            if not flows:
                return
            next_s = math.inf
            for flow in flows:
                rate = flow.rate = flow.solo_rate
                left = flow.remaining
                until_s = (left if left > 0.0 else 0.0) / rate
                if until_s < next_s:
                    next_s = until_s
            queue = self._queue
            if queue is not None:  # the engine's call_later, inlined
                heappush(queue, (self.clock.now + next_s, _NORMAL, next(self._sequence), self._on_timer, self._version))
            else:
                self.clock.call_later(next_s, self._on_timer, self._version)
            return
        self._allocate(flows)
        if self._factored:
            for flow in flows:
                if flow.factor is not None:
                    flow.rate *= flow.factor()
        self._arm_next_completion()

    def _allocate(self, flows: list[_Flow]) -> None:
        """Max-min fair rates. Flows that share no port with another flow are their own
        component of the sharing graph, and max-min fairness is separable over components:
        such a flow moves at its own bottleneck, min over its ports of capacity / bytes (what
        the filling gives it too). Only the flows that share a port go through the filling.
        In a deep pipeline most concurrent transfers are point-to-point sends between
        different stage pairs: DeepSeek-V3 at pp 32, 480 micro-batches, 88k of 136k
        reallocations had no shared port at all."""
        shared = self._shared_ports
        if not shared:
            for flow in flows:
                flow.rate = flow.solo_rate
            return
        sharing = []
        for flow in flows:
            if shared.isdisjoint(flow.weights):
                flow.rate = flow.solo_rate
            else:
                sharing.append(flow)
        self._progressive_filling(sharing)

    def _progressive_filling(self, flows: list[_Flow]) -> None:
        used: dict[str, float] = {}
        active = set(range(len(flows)))
        level = 0.0
        bandwidth = [0.0] * len(flows)
        while active:
            weight_on: dict[str, float] = {}
            for i in active:
                for port, w in flows[i].weights.items():
                    weight_on[port] = weight_on.get(port, 0.0) + w
            increments = {
                port: (self.capacity(port) - used.get(port, 0.0)) / w for port, w in weight_on.items()
            }
            step = max(0.0, min(increments.values()))
            level += step
            for port, w in weight_on.items():
                used[port] = used.get(port, 0.0) + step * w
            saturated = {p for p, inc in increments.items() if inc - step <= _EPS * max(1.0, inc)}
            frozen = {i for i in active if saturated.intersection(flows[i].weights)}
            for i in frozen:
                bandwidth[i] = level
            active -= frozen
        for flow, bw in zip(flows, bandwidth, strict=True):
            flow.rate = bw / flow.heaviest

    def _arm_next_completion(self) -> None:
        self._version += 1
        if not self._flows:
            return
        next_s = min(max(f.remaining, 0.0) / f.rate for f in self._flows)
        self.clock.call_later(next_s, self._on_timer, self._version)

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return  # a newer allocation superseded this timer
        flows = self._flows
        now = self.clock.now  # _advance, inlined (once per timer)
        elapsed = now - self._last_update
        if elapsed > 0:
            for flow in flows:
                flow.remaining -= flow.rate * elapsed
        self._last_update = now
        queue = self._queue
        finished = [f for f in flows if f.remaining <= 1e-9]
        if not finished:  # float round-off: finish the closest one
            finished = [min(flows, key=_time_left)]
        flows_on_port = self._flows_on_port
        for flow in finished:
            flows.remove(flow)
            if flow.factor is not None:
                self._factored -= 1
            for port in flow.demands:
                n = flows_on_port[port] = flows_on_port[port] - 1
                if n == 1:
                    self._shared_ports.discard(port)
                elif n == 0:
                    del flows_on_port[port]
            if flow.then is None:
                self.clock.succeed(flow.done)
            elif queue is not None:  # the engine's call_later(0.0, ...), inlined: an event for now
                self._now_queue.append((next(self._sequence), flow.then, None))
            else:
                self.clock.call_later(0.0, flow.then, None)
        self._reallocate()


def _time_left(flow: _Flow) -> float:
    """How long ``flow`` takes to finish at its current rate (a module function, not a lambda: the compiled
    build, setup.py, takes no closure in a typed method)."""
    return flow.remaining / flow.rate
