"""Goodput measured by simulating a job's timeline of steps, checkpoints, failures and restarts.

**Why a layer above the engine** (not interrupts inside it): failures arrive hours apart (Llama 3:
one every 3.1 h on 16,384 GPUs) while the engine's events are kernels and collectives milliseconds
apart; measuring goodput to a percentage point needs hundreds of failures, i.e. months of job time
and millions of steps, which no task-level simulation runs in seconds. Nor does a failure's cost
depend on *which* kernel it hit: a synchronous job loses everything since its last checkpoint
whichever task was running. So the engine simulates the steps (``simulation.steps``: their times
with pipeline bubbles, contention and jitter) and this layer replays that step time as the unit of
work of a job that runs until ``reliability.steps`` steps are committed (or ``reliability.days``
of wall time), event by event: a failure, the end of a restart, a spare node's return. The
engine keeps no notion of GPUs or failures beyond :mod:`simulator.engine.failures`, which draws
the outages (seeded, so a seed gives the same result bit for bit); the loop is plain Python over
those arrays (deterministic, and a year of 16,384 GPUs takes well under a second).

Two kinds of job:

- **Synchronous** (spmd and every kind that all-reduces each step): any failure stops the whole
  job. Work since the last checkpoint (a checkpoint write in progress included) is redone;
  the job restarts in ``restart_minutes`` plus the checkpoint read (state bytes / read bandwidth);
  a failure during the restart starts it again (Daly 2006's model). The failed hardware (its
  node, or its rack's nodes for a rack-level process) is out for its repair time; with
  ``spare_nodes`` set, a restart first waits until no more nodes are down than there are spares
  (``waiting_for_spares``). The job's slots keep failing at the same rate whoever fills them
  (renewal ``immediate``): with exponential up-times this is the Poisson process of rate
  N·λ that the analytic formula (:func:`simulator.economics.goodput.goodput_fraction`) assumes.
  Checkpoints every k steps cost state bytes / write bandwidth; k = Young's interval
  sqrt(2·δ·M) in whole steps unless given.
- **Elastic** (``local_sgd``/DiLoCo, ``parameter_server``): a failure takes its data-parallel
  replica (the replicas whose GPUs the failed unit holds) out of the group; the survivors'
  collective times out (``collective_timeout_s``, not for an asynchronous parameter server, whose
  workers never wait for each other) and the group shrinks; the failed replica's work since the last
  synchronisation (H inner steps for local SGD, one step for a parameter server) is lost; when its
  hardware returns it downloads the replica's state (state bytes over its GPUs' network bandwidth)
  and rejoins at the next synchronisation. Goodput there is the useful replica-steps over what all
  replicas would have done in the same wall time.

Goodput = useful work / wall time (the analytic formula's ``T/W``); the wall time is split into
useful, redo, restart, waiting for spares and checkpoint time, which add up to it exactly.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from simulator.economics.reliability import Process
from simulator.engine.failures import draw_outage_arrays


@dataclass(frozen=True)
class Cluster:
    """What the timeline needs of the hardware: counts only."""

    num_gpus: int
    gpus_per_node: int
    rack_nodes: int

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.gpus_per_node)

    def units(self, unit: str) -> int:
        return {"gpu": self.num_gpus, "node": self.num_nodes, "rack": -(-self.num_nodes // self.rack_nodes),
                "job": 1}[unit]

    def gpu_range(self, unit: str, index: int) -> tuple[int, int]:
        """The GPUs [first, last) a failed unit takes down (a GPU takes its whole node)."""
        if unit == "job":
            return 0, self.num_gpus
        per = {"gpu": 1, "node": self.gpus_per_node, "rack": self.gpus_per_node * self.rack_nodes}[unit]
        first = index * per
        if unit == "gpu":
            first = (index // self.gpus_per_node) * self.gpus_per_node
            per = self.gpus_per_node
        return first, min(self.num_gpus, first + per)

    def nodes_down(self, unit: str, index: int) -> int:
        """Nodes a failure of this unit sends to repair (a job-level failure breaks no hardware)."""
        if unit == "job":
            return 0
        first, last = self.gpu_range(unit, index)
        return -(-(last - first) // self.gpus_per_node)


@dataclass(frozen=True)
class Outages:
    """Every process's outages merged, sorted by time."""

    down_s: np.ndarray
    up_s: np.ndarray
    nodes: np.ndarray        # nodes sent to repair
    first_gpu: np.ndarray    # GPUs [first_gpu, last_gpu) taken down
    last_gpu: np.ndarray


def job_interruption_rate_per_hour(processes: list[Process], cluster: Cluster) -> float:
    """Σ over processes of rate × units: the job's interruptions per hour (the formula's 1/M)."""
    return sum(p.rate_per_hour * cluster.units(p.unit) for p in processes)


def draw_job_outages(processes: list[Process], cluster: Cluster, horizon_s: float, seed: int,
                     renewal: str) -> Outages:
    """Draw every process's outages (one Generator, processes in order) and merge them by time."""
    rng = np.random.default_rng(seed)
    parts = []
    for p in processes:
        arrays = draw_outage_arrays(rng, cluster.units(p.unit), p.rate_per_hour, horizon_s,
                                    distribution=p.distribution, weibull_shape=p.weibull_shape,
                                    down_mean_s=p.repair_s, down_distribution=p.repair_distribution,
                                    down_sigma=p.repair_sigma, renewal=renewal)
        ranges = [cluster.gpu_range(p.unit, int(a)) for a in arrays.actor]
        nodes = [cluster.nodes_down(p.unit, int(a)) for a in arrays.actor]
        parts.append((arrays.down_s, arrays.up_s, np.array(nodes, np.int64).reshape(-1),
                      np.array([r[0] for r in ranges], np.int64), np.array([r[1] for r in ranges], np.int64)))
    if not parts:
        empty = np.empty(0)
        return Outages(empty, empty, empty.astype(np.int64), empty.astype(np.int64), empty.astype(np.int64))
    down, up, nodes, first, last = (np.concatenate([part[i] for part in parts]) for i in range(5))
    order = np.argsort(down, kind="stable")
    return Outages(down[order], up[order], nodes[order], first[order], last[order])


@dataclass
class SyncTimeline:
    """What a synchronous job's simulated timeline measured (seconds)."""

    wall_s: float = 0.0
    useful_s: float = 0.0
    redo_s: float = 0.0
    restart_s: float = 0.0
    waiting_for_spares_s: float = 0.0
    checkpoint_s: float = 0.0
    steps_done: int = 0
    failures: int = 0
    failures_during_recovery: int = 0
    finished: bool = False

    @property
    def goodput(self) -> float:
        return self.useful_s / self.wall_s if self.wall_s > 0 else 0.0


class _SyncJob:
    """The state of one synchronous job's timeline (see :func:`simulate_sync_job`)."""

    def __init__(self, outages: Outages, spare_nodes: int | None, horizon_s: float):
        self.down, self.up, self.nodes = outages.down_s, outages.up_s, outages.nodes
        self.next = 0                      # index of the next outage
        self.pool: list[tuple[float, int]] = []  # (back at, nodes) of hardware under repair
        self.pool_nodes = 0
        self.spares = math.inf if spare_nodes is None else spare_nodes
        self.horizon_s = horizon_s
        self.t = 0.0
        self.out = SyncTimeline()

    def next_failure_s(self) -> float:
        return float(self.down[self.next]) if self.next < len(self.down) else math.inf

    def fail(self) -> None:
        """Take the next outage: its hardware goes to repair; the clock is at its time."""
        k = self.next
        if self.nodes[k]:
            heapq.heappush(self.pool, (float(self.up[k]), int(self.nodes[k])))
            self.pool_nodes += int(self.nodes[k])
        self.out.failures += 1
        self.next += 1

    def _advance(self, until_s: float, field: str) -> bool:
        """Move the clock to ``until_s`` charging ``field``; False when the horizon came first."""
        end = min(until_s, self.horizon_s)
        setattr(self.out, field, getattr(self.out, field) + end - self.t)
        self.t = end
        return until_s <= self.horizon_s

    def recover(self, restart_s: float) -> bool:
        """After a failure: wait until enough spares are healthy, then restart; a failure during
        either starts the recovery over. False when the horizon ends it."""
        while True:
            while self.pool and self.pool[0][0] <= self.t:
                self.pool_nodes -= heapq.heappop(self.pool)[1]
            if self.pool_nodes > self.spares:
                back_s, f = self.pool[0][0], self.next_failure_s()
                if f < back_s:
                    if not self._advance(f, "waiting_for_spares_s"):
                        return False
                    self.fail()
                    self.out.failures_during_recovery += 1
                    continue
                if not self._advance(back_s, "waiting_for_spares_s"):
                    return False
                continue
            f = self.next_failure_s()
            if f < self.t + restart_s:
                if not self._advance(f, "restart_s"):
                    return False
                self.fail()
                self.out.failures_during_recovery += 1
                continue
            return self._advance(self.t + restart_s, "restart_s")


def simulate_sync_job(outages: Outages, *, step_s: float, checkpoint_steps: int, checkpoint_s: float,
                      restart_s: float, total_steps: int | None, horizon_s: float,
                      spare_nodes: int | None) -> SyncTimeline:
    """Run the synchronous job (module docstring) until ``total_steps`` are committed or the wall
    clock reaches ``horizon_s``; every failure in ``outages`` interrupts it."""
    job = _SyncJob(outages, spare_nodes, horizon_s)
    out = job.out
    remaining = math.inf if total_steps is None else total_steps
    segment_s = checkpoint_steps * step_s + checkpoint_s
    while job.t < horizon_s and remaining > 0:
        f = job.next_failure_s()
        limit = min(f, horizon_s)
        # Whole checkpointed segments that end before the next failure (the common case: jump).
        whole = int(min((limit - job.t) // segment_s, remaining // checkpoint_steps))
        last_steps = int(min(checkpoint_steps, remaining))
        if whole == 0 and last_steps < checkpoint_steps and job.t + last_steps * step_s <= limit:
            whole, segment_steps, segment_ckpt = 1, last_steps, 0.0  # the final, shorter segment: no checkpoint
        else:
            segment_steps, segment_ckpt = checkpoint_steps, checkpoint_s
        if whole > 0:
            job.t += whole * (segment_steps * step_s + segment_ckpt)
            out.useful_s += whole * segment_steps * step_s
            out.checkpoint_s += whole * segment_ckpt
            out.steps_done += whole * segment_steps
            remaining -= whole * segment_steps
            continue
        if f >= horizon_s:  # the clock stops mid-segment: the steps done so far count
            done = min(last_steps, int((horizon_s - job.t) // step_s))
            out.useful_s += done * step_s
            out.steps_done += done
            out.redo_s += horizon_s - job.t - done * step_s  # the partial step or checkpoint at the horizon
            job.t = horizon_s
            break
        out.redo_s += f - job.t  # everything since the last checkpoint is lost
        job.t = f
        job.fail()
        if not job.recover(restart_s):
            break
    out.wall_s = job.t
    out.finished = remaining <= 0
    return out


@dataclass
class ElasticTimeline:
    """What an elastic job's simulated timeline measured (seconds; ``*_replica_s`` summed over replicas)."""

    wall_s: float = 0.0
    replicas: int = 1
    useful_replica_s: float = 0.0
    lost_replica_s: float = 0.0       # work of a period a replica failed in (redone by nobody)
    out_replica_s: float = 0.0        # replicas out of the group: under repair, downloading, waiting to rejoin
    timeout_s: float = 0.0            # survivors waiting on a failed peer's collective
    steps_done: int = 0
    failures: int = 0
    finished: bool = False

    @property
    def goodput(self) -> float:
        return self.useful_replica_s / (self.replicas * self.wall_s) if self.wall_s > 0 else 0.0


def simulate_elastic_job(outages: Outages, *, step_s: float, period_steps: int, replicas: int,
                         gpus_per_replica: int, download_s: float, timeout_s: float,
                         total_steps: int | None, horizon_s: float) -> ElasticTimeline:
    """Run the elastic job (module docstring) period by period (a period: ``period_steps`` steps
    between synchronisations), jumping over periods in which nothing changes."""
    out = ElasticTimeline(replicas=replicas)
    period_s = period_steps * step_s
    back = np.zeros(replicas)            # when each replica may rejoin (0: in the group)
    down, up = outages.down_s, outages.up_s
    first, last = outages.first_gpu // gpus_per_replica, -(-outages.last_gpu // gpus_per_replica)
    periods_left = math.inf if total_steps is None else -(-total_steps // period_steps)
    k, n, t = 0, len(down), 0.0
    while periods_left > 0 and t < horizon_s:
        alive = back <= t
        n_alive = int(alive.sum())
        dead_backs = back[~alive]
        next_change = min(float(down[k]) if k < n else math.inf, float(dead_backs.min()) if len(dead_backs) else math.inf)
        # Periods that start and end before anything changes: jump over them.
        quiet = min(periods_left, (min(next_change, horizon_s) - t) // period_s)
        if quiet >= 1:
            quiet = int(quiet)
            t += quiet * period_s
            out.useful_replica_s += quiet * n_alive * period_s
            out.out_replica_s += quiet * (replicas - n_alive) * period_s
            out.steps_done += quiet * period_steps
            periods_left -= quiet
            continue
        end = t + period_s
        failed = np.zeros(replicas, bool)
        while k < n and down[k] < end:
            hit = slice(int(first[k]), int(last[k]))
            failed[hit] |= back[hit] <= t        # in the group at the period's start: its period's work is lost
            back[hit] = np.maximum(back[hit], up[k] + download_s)
            out.failures += 1
            k += 1
        lost = int(np.count_nonzero(failed & alive))
        stall = timeout_s if lost else 0.0
        out.useful_replica_s += (n_alive - lost) * period_s
        out.lost_replica_s += lost * period_s
        out.out_replica_s += (replicas - n_alive) * period_s
        out.timeout_s += stall
        out.steps_done += period_steps
        periods_left -= 1
        t = end + stall
    out.wall_s = t
    out.finished = periods_left <= 0
    return out
