"""The SWARM runtime played once at compile time: which peer runs which pass, in what order.

SWARM (Ryabinin et al. 2023, "SWARM Parallelism: Training Large Models Can Be Surprisingly
Communication-Efficient", ICML) has no fixed schedule: each micro-batch is wired at random to a
peer of the next stage (Sec. 3.2, stochastic wiring), a peer that leaves has its work rerouted
(Sec. 3.2, fault tolerance) and peers move from under-used to over-used stages (Sec. 3.2, adaptive
swarm rebalancing). The engine runs ordered task lists and knows nothing of this, so the kind
decides it here, seeded, by playing the runtime with the tasks' prices: every pass takes its
fixed time, every transfer ``latency + bytes / NIC rate`` alone on its links (between regions of a
wan fabric: the bytes at the slower of NIC and pair link, then the delay). The result is a
list of :class:`Op` per peer and stream in the order they ran, which the kind turns into engine
tasks; the engine then re-times them with links shared fairly. Every decision taken at a time is
a dependency on what ended then (a reroute on the preemption, a step's start on stage 0's optimizer
steps, a redone forward on the gradient that found its holder gone), so the engine is never earlier
than these times (a test over random swarms). Where no two transfers share a
link the engine reproduces these times exactly (a test); where they do, the order and the
routing stay the ones chosen here and only the times move.

Rules played (what the paper describes, and the choices it leaves open, marked *ours*):

- A step feeds ``micro_batches`` micro-batches to stage 0 when stage 0's previous optimizer step
  ends (the global batch of the previous step is reached). Each micro-batch is routed, stage by
  stage, to a live peer of the next stage drawn with probability proportional to its speed
  (stochastic wiring weighted by throughput). The backward pass runs back through the peers that
  hold the micro-batch's activations.
- A peer runs one pass at a time: a backward before a forward (it frees memory), otherwise first
  come first served (*ours*). It takes no pass of step k+1 before its own optimizer step of step k.
- When every micro-batch of the step has passed backward through a stage, that stage's live
  peers average their gradients (all-reduce or gossip, priced by the kind) and step their optimizer.
- A peer that is preempted loses the pass it was running (its partial time is spent), the passes
  queued for it and the activations it held; each is rerouted to another live peer of the stage
  and, for a lost backward, the forward is redone there first (its input resent by the upstream
  peer, which keeps what it sent until the backward has passed, *ours*). Its accumulated gradient
  is lost: those samples are missing from its stage's average (``lost_samples``). Preemptions
  that fall in a transfer, an averaging or an optimizer step take effect at its end (*ours*).
  A returning peer first downloads its stage's parameters from a live peer of its stage (again, if
  the stage stepped its optimizer meanwhile).
- A stage-0 peer loads the samples of the micro-batches routed to it with its own input pipeline
  (``input_us_per_sample``, the framework's time per sample): one micro-batch after another, ahead of its
  GPU from the start (prefetching, *ours*); a forward waits for its micro-batch's load. As in spmd, the
  first step's samples are there before the run and the last step loads the next step's beside it (as
  many micro-batches per peer as it was fed in the last step; those loads end the step); a micro-batch
  rerouted from a peer that left is loaded again where it goes.
- Every ``rebalance_every_steps`` steps, when stage 0 ends the step, one peer moves from the stage
  with the highest pool throughput (sum of speeds / pass time) to the lowest, if that raises the
  lowest; it downloads its new stage's parameters first (Sec. 3.2 moves peers to the bottleneck).
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.engine.failures import Outage
from simulator.strategies.swarm_parts.preemption import Preemptions


@dataclass(eq=False)
class Op:
    """One unit of work on one stream of one peer, as the dispatcher timed it."""

    peer: int                  # the peer that runs it (-1: the swarm's own bookkeeping)
    stream: str                # compute | send | avg | recv | clock streams
    name: str
    category: str              # compute | pp_comm | dp_comm | optimizer | preempted | barrier
    start_s: float
    end_s: float
    seq: int
    step: int = -1
    duration_s: float = 0.0    # fixed-duration work
    nbytes: float = 0.0        # a transfer: bytes on the sender's tx and the receiver's rx
    dst: int | None = None     # a transfer's receiver (a download: the peer itself receives; src below)
    src: int | None = None     # a download's source peer (None: a checkpoint, only the receiver's rx)
    latency_s: float = 0.0
    rendezvous: str | None = None
    rendezvous_size: int = 1
    deps: list[Op] = field(default_factory=list)
    alloc_bytes: float = 0.0
    free_bytes: float = 0.0
    aborted: bool = False
    phase: str = ""            # F | B for passes
    extra_demands: dict[str, float] = field(default_factory=dict)  # an averaging's wide-area pair ports


@dataclass(eq=False)
class Item:
    """A pass waiting for a peer: F (forward), B (backward at the activations' holder) or FB
    (forward redone, then backward, on a peer that replaces a lost holder)."""

    step: int
    mb: int
    stage: int
    phase: str
    ready_s: float
    seq: int
    deps: list[Op] = field(default_factory=list)
    src: int | None = None        # the peer holding this stage's input (None: data, stage 0)
    grad_src: int | None = None   # the peer that sent the output gradient (None: the loss, last stage)
    grad_ready_s: float = 0.0     # FB: when the output gradient is there
    grad_deps: list[Op] = field(default_factory=list)
    input_op: Op | None = None    # the pass that produced the input (a send waits for it)
    grad_op: Op | None = None     # the pass that produced the output gradient
    wait_for: list[Op] = field(default_factory=list)  # rerouted: the preemption that sent it elsewhere
    loaded: bool = False          # stage 0: its samples are on the peer it goes to (the first step's: before the run)
    rerouted: bool = False        # sent elsewhere after a peer left


@dataclass(eq=False)
class Peer:
    index: int
    stage: int
    speed: float
    alive: bool = True
    available: bool = True      # not downloading parameters
    step: int = 0               # the step whose passes it may run
    compute_free: float = 0.0
    send_free: float = 0.0
    avg_free: float = 0.0
    recv_free: float = 0.0
    protected_until: float = 0.0  # in an averaging / optimizer step: preemption waits for its end
    running: Op | None = None
    running_item: Item | None = None
    queue: list[Item] = field(default_factory=list)
    held: dict[tuple[int, int], float] = field(default_factory=dict)  # (step, mb) -> activation bytes
    gate: Op | None = None       # its last download: every later op waits for it
    down_mark: Op | None = None  # the outage it is in (clock op ending at its return)
    left_mark: Op | None = None  # the clock op ending when it last left
    last_opt: Op | None = None
    outage: Outage | None = None
    accumulated: int = 0         # backward passes in its current gradient
    input_free: float = 0.0      # when its input loader is free (a stage-0 peer loads its own micro-batches)
    input_after: Op | None = None  # the outage its loader restarted after (its prefetched batches were lost)


@dataclass
class Prices:
    """What the dispatcher needs to know of time and bytes (the kind fills it in). Per stage:
    ``boundary_bytes`` (wire bytes crossing the cut after stage s, an activation or its gradient),
    ``activation_bytes`` (saved by one micro-batch's forward until its backward), ``param_bytes``
    (what a joining peer downloads). Per peer (its accelerator and NIC, at speed 1): ``pass_s[peer][stage]``
    {"F", "B"} seconds, ``optimizer_s[peer][stage]``, ``link_bytes_per_s[peer]`` (its NIC rate, each
    direction) and ``latency_s[peer]``; ``averaging_bytes(stage, members)``: bytes each member sends
    (and receives); ``averaging_steps(members)``: latencies one averaging pays."""

    pass_s: list[list[dict[str, float]]]
    optimizer_s: list[list[float]]
    boundary_bytes: list[float]
    activation_bytes: list[float]
    param_bytes: list[float]
    link_bytes_per_s: list[float]
    latency_s: list[float]
    averaging_bytes: Any
    averaging_steps: Any
    wide_area: Any = None   # (src, dst) -> (pair bytes/s, one-way delay s) between regions, or None
    averaging_wide_area: Any = None  # (members, bytes each) -> (delay s, {pair port: bytes}, seconds on pairs)
    state_bytes: list[float] | None = None  # per stage: what a peer of it holds besides activations
    input_s: list[float] | None = None  # per peer: its host's time to load one micro-batch (None: not modelled)

    def latency(self, a: int, b: int) -> float:
        return max(self.latency_s[a], self.latency_s[b])

    def transfer(self, nbytes: float, src: int | None, dst: int) -> tuple[float, float]:
        """Alone on its links: (seconds the sender's stream is busy, seconds until the last byte
        arrives). Inside a region: the slower end's latency plus the bytes at the slower NIC, both
        alike. Between regions (a wan fabric): the bytes at the slowest of the NICs and the pair
        link, then the one-way delay as propagation (the sender's stream is free meanwhile)."""
        ends = [dst] if src is None else [src, dst]
        rate = min(self.link_bytes_per_s[p] for p in ends)
        route = self.wide_area(src, dst) if self.wide_area is not None and src is not None else None
        if route is not None:
            pair_rate, delay = route
            busy = nbytes / min(rate, pair_rate)
            return busy, busy + delay
        seconds = max(self.latency_s[p] for p in ends) + nbytes / rate
        return seconds, seconds


@dataclass
class Schedule:
    ops: list[Op]
    step_ends: list[list[Op]]
    stats: dict[str, Any]


class Dispatcher:
    """Plays the SWARM runtime (see the module docstring) and returns every op it timed."""

    def __init__(self, prices: Prices, stages: list[int], speeds: list[float], micro_batches: int, steps: int,
                 preemptions: Preemptions, seed: int, rebalance_every_steps: int | None = None):
        self.prices = prices
        self.num_stages = len(prices.boundary_bytes) + 1
        self.peers = [Peer(i, s, v) for i, (s, v) in enumerate(zip(stages, speeds, strict=True))]
        self.m, self.steps = micro_batches, steps
        self.preemptions = preemptions
        self.rebalance_every = rebalance_every_steps
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x5A4D])))
        self._seq = itertools.count()
        self._events: list = []
        self.ops: list[Op] = []
        self.pending: dict[int, list[Item]] = {s: [] for s in range(self.num_stages)}
        self.holder: dict[tuple[int, int, int], int] = {}       # (step, mb, stage) -> peer
        self.forward_op: dict[tuple[int, int, int], Op] = {}    # (step, mb, stage) -> its completed forward
        self.done_count: dict[tuple[int, int], int] = {}        # (step, stage) -> backward passes done
        self.backward_ops: dict[tuple[int, int], list[Op]] = {}
        self.stage_step = [0] * self.num_stages                  # steps each stage has averaged
        self.step_ends: list[list[Op]] = [[] for _ in range(steps)]
        self.stats = {"reroutes": 0, "aborted_passes": 0, "aborted_s": 0.0, "lost_samples": 0,
                      "preemptions": 0, "moves": [], "redone_forwards": 0}
        self.outage_ops: dict[int, int] = {}
        self.fed: dict[tuple[int, int], int] = {}  # (step, stage-0 peer) -> micro-batches first routed to it
        self.stage0_ends: dict[int, list[Op]] = {}

    # -- bookkeeping ---------------------------------------------------------------------------

    def _op(self, **kw) -> Op:
        op = Op(seq=next(self._seq), **kw)
        self.ops.append(op)
        return op

    def _at(self, time_s: float, kind: str, *payload) -> None:
        heapq.heappush(self._events, (time_s, next(self._seq), kind, payload))

    def _gated(self, peer: Peer, deps: list[Op]) -> list[Op]:
        return deps + ([peer.gate] if peer.gate is not None else [])

    # -- routing -------------------------------------------------------------------------------

    def _choose(self, stage: int) -> Peer | None:
        """A live peer of ``stage`` drawn with probability proportional to its speed."""
        ready = [p for p in self.peers if p.stage == stage and p.alive and p.available]
        if not ready:
            return None
        cumulative = list(itertools.accumulate(p.speed for p in ready))
        draw = float(self.rng.random()) * cumulative[-1]
        return ready[min(bisect_right(cumulative, draw), len(ready) - 1)]

    def _send(self, src: int, dst: int, nbytes: float, now: float, name: str, step: int, after: list[Op]) -> Op:
        """A transfer on ``src``'s send stream of what ``after`` produced (after its earlier sends;
        after its return if it is away; once the receiver is there)."""
        sender = self.peers[src]
        start = max(now, sender.send_free)
        receiver = self.peers[dst]
        deps = self._gated(sender, after + ([receiver.gate] if receiver.gate is not None else []))
        if not sender.alive and sender.down_mark is not None:
            start = max(start, sender.down_mark.end_s)
            deps.append(sender.down_mark)
        busy, arrive = self.prices.transfer(nbytes, src, dst)
        end = start + arrive
        sender.send_free = start + busy
        return self._op(peer=src, stream="send", name=name, category="pp_comm", start_s=start, end_s=end,
                        step=step, nbytes=nbytes, dst=dst, latency_s=self.prices.latency(src, dst), deps=deps)

    def _route(self, item: Item, now: float) -> None:
        """Send ``item`` to a peer of its stage (its holder for a backward, else a random draw)."""
        s = item.stage
        if item.phase == "B":
            holder = self.holder.get((item.step, item.mb, s))
            peer = self.peers[holder] if holder is not None else None
            if peer is None or not (peer.alive and peer.available) or (item.step, item.mb) not in peer.held:
                item.phase = "FB"  # the activations are gone: redo the forward on another peer
                item.src = self.holder.get((item.step, item.mb, s - 1)) if s > 0 else None
                item.input_op = self.forward_op.get((item.step, item.mb, s - 1)) if s > 0 else None
                if item.grad_op is not None:  # decided when the gradient was ready: the input resend waits for it
                    item.wait_for = [*item.wait_for, item.grad_op]
                self.stats["redone_forwards"] += 1
            else:
                self._deliver(item, peer, now)
                return
        target = self._choose(s)
        if target is None:
            self.pending[s].append(item)
            return
        self._deliver(item, target, now)

    def _deliver(self, item: Item, target: Peer, now: float) -> None:
        """Move the item's inputs to ``target`` (sends) and queue it there when they arrive."""
        s, prices = item.stage, self.prices
        tag = f"s{item.step}.mb{item.mb}"
        arrivals, deps = [now], list(item.wait_for)
        inputs = [op for op in (item.input_op,) if op is not None] + item.wait_for
        grads = [op for op in (item.grad_op,) if op is not None] + item.wait_for
        if item.phase in ("F", "FB") and item.src is not None and item.src != target.index:
            send = self._send(item.src, target.index, prices.boundary_bytes[s - 1], now,
                              f"{tag}.send_act.st{s - 1}>{s}", item.step, inputs)
            arrivals.append(send.end_s)
            deps.append(send)
        if item.phase in ("B", "FB") and item.grad_src is not None and item.grad_src != target.index:
            send = self._send(item.grad_src, target.index, prices.boundary_bytes[s], now,
                              f"{tag}.send_grad.st{s + 1}>{s}", item.step, grads)
            if item.phase == "FB":
                item.grad_ready_s, item.grad_deps = send.end_s, [send]
            else:
                arrivals.append(send.end_s)
                deps.append(send)
        if s == 0 and item.phase in ("F", "FB") and not item.loaded:
            load = self._load(target, tag)
            if load is not None:
                arrivals.append(load.end_s)
                deps.append(load)
        if s == 0 and item.phase == "F" and not item.rerouted:  # first deliveries of the step's micro-batches
            self.fed[item.step, target.index] = self.fed.get((item.step, target.index), 0) + 1
        item.loaded = s == 0  # on the target now (lost again if it leaves before the pass)
        item.deps = deps
        self._at(max(arrivals), "arrive", item, target.index)

    def _load(self, peer: Peer, tag: str, micro_batches: int = 1) -> Op | None:
        """``micro_batches`` micro-batches' samples loaded by a stage-0 peer's own input pipeline (the
        framework's ``input_us_per_sample``; None without it): its loader runs ahead of its GPU, one
        micro-batch after another from the start (a prefetching loader, as spmd's loads the next step beside
        the step), so this load starts when the loader finished the one before (earlier than now if it ran
        ahead), and a peer back from an outage restarts its loader (what it had prefetched is gone with it)."""
        seconds = micro_batches * self.prices.input_s[peer.index] if self.prices.input_s is not None else 0.0
        if seconds <= 0:
            return None
        start = peer.input_free
        op = self._op(peer=peer.index, stream="input", name=f"{tag}.input", category="input_wait", start_s=start,
                      end_s=start + seconds, duration_s=seconds,
                      deps=[peer.input_after] if peer.input_after is not None else [])
        peer.input_free = op.end_s
        return op

    # -- running passes ------------------------------------------------------------------------

    def _try_start(self, peer: Peer, now: float) -> None:
        if not (peer.alive and peer.available) or peer.running is not None or now < peer.compute_free:
            return
        eligible = [it for it in peer.queue if it.step == peer.step and it.ready_s <= now]
        if not eligible:
            return
        item = min(eligible, key=lambda it: (it.phase == "F", it.ready_s, it.seq))
        peer.queue.remove(item)
        phase = "F" if item.phase in ("F", "FB") else "B"
        s = item.stage
        seconds = self.prices.pass_s[peer.index][s][phase] / peer.speed
        redo = ".redo" if item.phase == "FB" else ""
        op = self._op(peer=peer.index, stream="compute", name=f"s{item.step}.{phase}{redo}.mb{item.mb}.st{s}",
                      category="compute", start_s=now, end_s=now + seconds, step=item.step, duration_s=seconds,
                      deps=self._gated(peer, list(item.deps)), phase=phase)
        if phase == "F":
            op.alloc_bytes = self.prices.activation_bytes[s]
        else:
            op.free_bytes = peer.held.pop((item.step, item.mb), self.prices.activation_bytes[s])
        peer.running, peer.running_item = op, item
        peer.compute_free = op.end_s
        self._at(op.end_s, "done", op, item)

    def _on_done(self, op: Op, item: Item, now: float) -> None:
        peer = self.peers[op.peer]
        if op.aborted or peer.running is not op:
            return
        peer.running, peer.running_item = None, None
        s = item.stage
        if op.phase == "F":
            peer.held[(item.step, item.mb)] = op.alloc_bytes
            self.holder[(item.step, item.mb, s)] = peer.index
            self.forward_op[(item.step, item.mb, s)] = op
            if item.phase == "FB" or s == self.num_stages - 1:  # its backward runs here next
                backward = Item(item.step, item.mb, s, "B", max(now, item.grad_ready_s), next(self._seq),
                                deps=list(item.grad_deps), grad_src=item.grad_src, grad_op=item.grad_op)
                peer.queue.append(backward)
                self._at(backward.ready_s, "wake", peer.index)
            else:
                self._route(Item(item.step, item.mb, s + 1, "F", now, next(self._seq), src=peer.index, input_op=op),
                            now)
        else:
            peer.accumulated += 1
            key = (item.step, s)
            self.done_count[key] = self.done_count.get(key, 0) + 1
            self.backward_ops.setdefault(key, []).append(op)
            if s > 0:
                self._route(Item(item.step, item.mb, s - 1, "B", now, next(self._seq), grad_src=peer.index,
                                 grad_op=op), now)
            if self.done_count[key] == self.m:
                self._average(item.step, s, now)
        self._try_start(peer, now)

    # -- averaging, optimizer, rebalancing -------------------------------------------------------

    def _average(self, step: int, s: int, now: float) -> None:
        """Every micro-batch of ``step`` has passed backward through stage ``s``: its live peers
        average their gradients and step their optimizer."""
        barrier = self._op(peer=-1, stream=f"stage{s}.barrier", name=f"s{step}.gradients_ready.st{s}",
                           category="barrier", start_s=now, end_s=now, step=step,
                           deps=list(self.backward_ops.get((step, s), [])))
        members = [p for p in self.peers if p.stage == s and p.alive and p.available]
        self.stage_step[s] = step + 1
        ends = [barrier]
        if members:
            k = len(members)
            start = max([now] + [max(p.avg_free, p.compute_free) for p in members])
            nbytes = self.prices.averaging_bytes(s, k) if k > 1 else 0.0
            latency = self.prices.averaging_steps(k) * max(self.prices.latency_s[p.index] for p in members)
            rate = min(self.prices.link_bytes_per_s[p.index] for p in members)  # a ring at its slowest link
            seconds, pairs = nbytes / rate, {}
            if k > 1 and self.prices.averaging_wide_area is not None:
                delay, pairs, pair_s = self.prices.averaging_wide_area([p.index for p in members], nbytes)
                latency, seconds = latency + delay, max(seconds, pair_s)
            avg_end = start + latency + seconds if k > 1 else start
            for p in members:
                deps = self._gated(p, [barrier])
                if k > 1:
                    avg = self._op(peer=p.index, stream="avg", name=f"s{step}.average.st{s}", category="dp_comm",
                                   start_s=start, end_s=avg_end, step=step, nbytes=nbytes, latency_s=latency,
                                   rendezvous=f"s{step}.average.st{s}", rendezvous_size=k, deps=deps,
                                   extra_demands=pairs if p is members[0] else {})
                    p.avg_free = avg_end
                    deps = [avg]
                seconds = self.prices.optimizer_s[p.index][s] / p.speed
                opt = self._op(peer=p.index, stream="compute", name=f"s{step}.optimizer.st{s}", category="optimizer",
                               start_s=avg_end, end_s=avg_end + seconds, step=step, duration_s=seconds, deps=deps)
                p.compute_free = p.protected_until = opt.end_s
                p.last_opt = opt
                p.accumulated = 0
                ends.append(opt)
                self._at(opt.end_s, "stepped", p.index, step)
        self.step_ends[step].extend(ends)
        if s == 0:
            self.stage0_ends[step] = ends  # the next step starts when all of them are done
            if step + 1 < self.steps:
                self._at(max(op.end_s for op in ends), "step", step + 1)

    def _on_stepped(self, peer: Peer, step: int, now: float) -> None:
        if peer.step == step:
            peer.step = step + 1
        self._try_start(peer, now)

    def _pool_throughput(self, s: int, without: Peer | None = None, with_peer: Peer | None = None) -> float:
        """Micro-batches per second stage ``s``'s live peers pass forward and backward together."""
        pool = [p for p in self.peers if p.stage == s and p.alive and p is not without]
        if with_peer is not None:
            pool.append(with_peer)
        return sum(p.speed / (self.prices.pass_s[p.index][s]["F"] + self.prices.pass_s[p.index][s]["B"])
                   for p in pool)

    def _rebalance(self, step: int, now: float) -> None:
        """Move one peer from the stage with the highest pool throughput to the lowest, if that
        raises the lowest (Sec. 3.2); it downloads its new stage's parameters first."""
        stages = range(self.num_stages)
        throughput = [self._pool_throughput(s) for s in stages]
        low, high = min(stages, key=lambda s: throughput[s]), max(stages, key=lambda s: throughput[s])
        if low == high:
            return
        best, best_min = None, throughput[low]
        for peer in (p for p in self.peers if p.stage == high and p.alive and p.available):
            new_min = min(self._pool_throughput(high, without=peer), self._pool_throughput(low, with_peer=peer))
            if new_min > best_min + 1e-12:
                best, best_min = peer, new_min
        if best is None:
            return
        source = next((p for p in self.peers if p.stage == low and p.alive and p.available), None)
        best.stage = low
        best.step = self.stage_step[low]
        self._download(best, source, now, f"s{step}.move_download.st{high}>{low}",
                       deps=list(self.stage0_ends.get(step - 1, [])))
        if low == 0:  # its loader starts once it holds stage 0 (it loaded nothing for stage 0 before)
            best.input_free, best.input_after = max(best.input_free, best.gate.end_s), best.gate
        if self.prices.state_bytes is not None:  # its memory now holds the new stage's state
            change = self.prices.state_bytes[low] - self.prices.state_bytes[high]
            best.gate.alloc_bytes, best.gate.free_bytes = max(change, 0.0), best.gate.free_bytes + max(-change, 0.0)
        self.stats["moves"].append({"step": step, "peer": best.index, "from_stage": high, "to_stage": low})

    def _download(self, peer: Peer, source: Peer | None, now: float, name: str, deps: list[Op],
                  free_bytes: float = 0.0) -> None:
        """``peer`` fetches its stage's parameters from ``source`` (after its optimizer step), or
        from a checkpoint when no peer of the stage is there (only its own link counts)."""
        start = max(now, peer.compute_free, peer.recv_free)
        deps = list(deps) + ([peer.last_opt] if peer.last_opt is not None else [])
        if source is not None:
            start = max(start, source.protected_until)
            if source.last_opt is not None:
                deps.append(source.last_opt)
        nbytes = self.prices.param_bytes[peer.stage]
        busy, arrive = self.prices.transfer(nbytes, source.index if source else None, peer.index)
        end = start + arrive
        op = self._op(peer=peer.index, stream="recv", name=name, category="dp_comm", start_s=start, end_s=end,
                      nbytes=nbytes, dst=peer.index, src=source.index if source else None,
                      latency_s=self.prices.latency(source.index if source else peer.index, peer.index), deps=deps,
                      free_bytes=free_bytes)
        peer.recv_free = start + busy
        peer.gate = op
        peer.available = False
        self._at(end, "available", peer.index)

    # -- preemption ----------------------------------------------------------------------------

    def _arm_outage(self, peer: Peer, after_s: float) -> None:
        outage = self.preemptions.next_after(peer.index, after_s)
        peer.outage = outage
        if outage is not None:
            self._at(outage.down_s, "fail", peer.index, outage)

    def _on_fail(self, peer: Peer, outage: Outage, now: float) -> None:
        if peer.outage is not outage or not peer.alive or self.stage_step[peer.stage] >= self.steps:
            return  # a stale draw, or its stage has finished training: nothing left to lose
        if peer.protected_until > now:  # averaging / optimizer step: leaves at its end
            self._at(peer.protected_until, "fail", peer.index, outage)
            return
        self.stats["preemptions"] += 1
        peer.alive, peer.available = False, False
        up = max(outage.up_s, now)
        k = self.outage_ops.get(peer.index, 0)
        self.outage_ops[peer.index] = k + 1
        peer.left_mark = self._op(peer=peer.index, stream=f"outage{k}", name=f"peer{peer.index}.up",
                                  category="preempted", start_s=0.0, end_s=now, duration_s=now)
        mark = self._op(peer=peer.index, stream=f"outage{k}", name=f"peer{peer.index}.preempted",
                        category="preempted", start_s=now, end_s=up, duration_s=up - now)
        peer.down_mark = mark
        lost: list[Item] = []
        if peer.running is not None and peer.running.end_s > now:
            op, item = peer.running, peer.running_item
            op.aborted = True
            self.stats["aborted_passes"] += 1
            self.stats["aborted_s"] += now - op.start_s
            op.end_s, op.duration_s, op.name = now, now - op.start_s, op.name + ".aborted"
            if op.phase == "F":
                op.free_bytes = op.alloc_bytes
            if op.phase == "B" or item.phase == "FB":
                item.phase = "B"  # routed again as a backward whose holder is gone
            peer.running, peer.running_item = None, None
            peer.compute_free = now
            lost.append(item)
        lost.extend(peer.queue)
        peer.queue = []
        held = sum(peer.held.values())
        for key in peer.held:
            self.holder.pop((key[0], key[1], peer.stage), None)
        peer.held = {}
        self.stats["lost_samples"] += peer.accumulated
        peer.accumulated = 0
        for item in lost:
            item.loaded, item.rerouted = False, True  # its samples went with the peer
            self.stats["reroutes"] += 1
            item.seq = next(self._seq)
            item.wait_for = [peer.left_mark]
            self._route(item, now)
        peer.input_free, peer.input_after = max(peer.input_free, up), mark  # its loader restarts on return
        self._at(up, "rejoin", peer.index, held)

    def _on_rejoin(self, peer: Peer, held_bytes: float, now: float) -> None:
        peer.alive = True
        if self.stage_step[peer.stage] >= self.steps:
            return  # training is over for its stage
        peer.step = self.stage_step[peer.stage]
        source = next((p for p in self.peers if p.stage == peer.stage and p.alive and p.available), None)
        self._download(peer, source, now, f"peer{peer.index}.rejoin_download.st{peer.stage}",
                       deps=[peer.down_mark], free_bytes=held_bytes)
        self._arm_outage(peer, now)

    def _on_available(self, peer: Peer, now: float) -> None:
        if not peer.alive:
            return
        if self.stage_step[peer.stage] >= self.steps:
            return  # training is over for its stage: nothing to fetch or train (as _on_rejoin)
        if peer.step < self.stage_step[peer.stage]:  # its stage stepped while it downloaded: fetch again
            peer.step = self.stage_step[peer.stage]
            source = next((p for p in self.peers if p.stage == peer.stage and p.alive and p.available), None)
            self._download(peer, source, now, f"peer{peer.index}.refresh_download.st{peer.stage}", deps=[peer.gate])
            return
        peer.available = True
        waiting, self.pending[peer.stage] = self.pending[peer.stage], []
        for item in waiting:
            self._route(item, now)
        self._try_start(peer, now)

    def _start_step(self, step: int, now: float) -> None:
        if self.rebalance_every and step > 0 and step % self.rebalance_every == 0:
            self._rebalance(step, now)
        after = list(self.stage0_ends.get(step - 1, []))  # the previous step ended for all of stage 0
        for mb in range(self.m):  # the first step's samples are loaded before the run (as spmd's)
            self._route(Item(step, mb, 0, "F", now, next(self._seq), wait_for=after, loaded=step == 0), now)
        if step == self.steps - 1:
            # the last step loads the next step's samples beside it too, as spmd's last step does: each stage-0
            # peer as many micro-batches as it was fed in this one; the loads end the step
            for (k, index), count in sorted(self.fed.items()):
                if k == step:
                    load = self._load(self.peers[index], f"s{step + 1}.next", count)
                    if load is not None:
                        self.step_ends[step].append(load)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> Schedule:
        for peer in self.peers:
            self._arm_outage(peer, 0.0)
        self._start_step(0, 0.0)
        while self._events:
            now, _, kind, payload = heapq.heappop(self._events)
            if kind == "arrive":
                item, index = payload
                peer = self.peers[index]
                if not (peer.alive and peer.available and peer.stage == item.stage) or (
                        item.phase == "B" and (item.step, item.mb) not in peer.held):
                    self.stats["reroutes"] += 1
                    item.wait_for = list(item.deps)  # the delivery that found no one (it ended now)
                    item.loaded, item.rerouted = False, True  # its samples were loaded on a peer that is gone
                    if peer.left_mark is not None and not peer.alive:
                        item.wait_for.append(peer.left_mark)
                    self._route(item, now)
                    continue
                item.ready_s = now
                peer.queue.append(item)
                self._try_start(peer, now)
            elif kind == "done":
                self._on_done(*payload, now)
            elif kind == "wake":
                self._try_start(self.peers[payload[0]], now)
            elif kind == "stepped":
                self._on_stepped(self.peers[payload[0]], payload[1], now)
            elif kind == "step":
                self._start_step(payload[0], now)
            elif kind == "fail":
                self._on_fail(self.peers[payload[0]], payload[1], now)
            elif kind == "rejoin":
                self._on_rejoin(self.peers[payload[0]], payload[1], now)
            elif kind == "available":
                self._on_available(self.peers[payload[0]], now)
        if min(self.stage_step) < self.steps:
            raise RuntimeError(f"swarm dispatcher stopped with stages at steps {self.stage_step} of {self.steps}")
        final_s = max(op.end_s for op in self.ops if op.category != "preempted")
        for op in self.ops:  # an outage that outlasts training: shown up to its end (nothing waits for it)
            if op.category == "preempted" and op.end_s > final_s:
                op.end_s = max(op.start_s, final_s)
                op.duration_s = op.end_s - op.start_s
        self.stats["end_s"] = final_s
        self.stats["final_peers_per_stage"] = [sum(1 for p in self.peers if p.stage == s)
                                               for s in range(self.num_stages)]
        return Schedule(self.ops, self.step_ends, self.stats)
