"""Seeded failure processes: when each of a set of actors goes down and when it comes back.

Generic (no GPU, node or strategy notion): an *actor* is any unit that can fail — a GPU, a
host, a rack, a peer of a swarm. Each actor runs an independent renewal process: up-times drawn
from an exponential distribution (a Poisson process: the assumption of Young 1974 and Daly 2006)
or a Weibull one with the same mean (shape k < 1: infant mortality, the decreasing hazard
Schroeder & Gibson 2006, "A large-scale study of failures in HPC systems", DSN, fit to
their LANL data; k > 1: wear-out), then a down-time (repair or return) drawn fixed, exponential or
lognormal. Two ways to renew:

- ``after_repair``: the actor itself is out until it returns, and its next up-time starts then
  (an alternating renewal process: a preempted peer, a worker of an elastic job);
- ``immediate``: a spare takes the actor's place at once, so the *slot* keeps failing at the same
  rate while the broken hardware is repaired (a synchronous job that always runs on N GPUs:
  the superposition of N such slots is exactly the Poisson process of rate N·λ the analytic
  goodput formula assumes, simulator/economics/goodput.py).

Everything is drawn from a :class:`numpy.random.Generator` in a fixed order (actors in the order
given, rounds of renewal in turn), so one seed gives bit-for-bit the same outages. The draws are
vectorised over actors: 16,384 GPUs over a year take milliseconds.

:func:`draw_outage_arrays` is the array form (actor indices); :func:`draw_outages` the named
form that other layers (swarm peers, elastic workers, the job timeline of
:mod:`simulator.economics.job_timeline`) reuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from simulator.errors import ConfigError

UpDistribution = Literal["exponential", "weibull"]
DownDistribution = Literal["fixed", "exponential", "lognormal"]
Renewal = Literal["after_repair", "immediate"]


@dataclass(frozen=True)
class Outage:
    """One failure of one actor: down at ``down_s``, back (repaired or returned) at ``up_s``."""

    actor: str
    down_s: float
    up_s: float
    cause: str = ""


@dataclass(frozen=True)
class OutageArrays:
    """Outages as parallel arrays sorted by ``down_s`` (ties by actor index)."""

    actor: np.ndarray   # int64 indices into the actors
    down_s: np.ndarray  # float64
    up_s: np.ndarray    # float64

    def __len__(self) -> int:
        return len(self.down_s)


def _up_times(rng: np.random.Generator, n: int, mean_s: float, distribution: UpDistribution,
              shape: float) -> np.ndarray:
    """``n`` up-times with mean ``mean_s``: exponential, or Weibull with shape ``shape`` scaled so
    that its mean is ``mean_s`` (scale = mean / Γ(1 + 1/k))."""
    if distribution == "exponential":
        return rng.exponential(mean_s, n)
    return rng.weibull(shape, n) * (mean_s / math.gamma(1.0 + 1.0 / shape))


def _down_times(rng: np.random.Generator, n: int, mean_s: float, distribution: DownDistribution,
                sigma: float) -> np.ndarray:
    """``n`` down-times with mean ``mean_s``: fixed, exponential, or lognormal with log-sd ``sigma``
    (mu = ln(mean) - sigma²/2, so that the mean is ``mean_s``)."""
    if mean_s <= 0 or distribution == "fixed":
        return np.full(n, float(mean_s))
    if distribution == "exponential":
        return rng.exponential(mean_s, n)
    return rng.lognormal(math.log(mean_s) - sigma * sigma / 2.0, sigma, n)


def check_process(rate_per_hour: float, horizon_s: float, shape: float, down_mean_s: float, sigma: float) -> None:
    """Programming errors only (user input is checked by the specs that call this)."""
    if not (rate_per_hour >= 0 and math.isfinite(rate_per_hour)):
        raise ValueError(f"rate_per_hour must be finite and >= 0, got {rate_per_hour}")
    if not (horizon_s >= 0 and math.isfinite(horizon_s)):
        raise ValueError(f"horizon_s must be finite and >= 0, got {horizon_s}")
    if not shape > 0 or not down_mean_s >= 0 or not sigma >= 0:
        raise ValueError("weibull_shape must be > 0, down_mean_s and down_sigma >= 0")


MAX_OUTAGES = 10_000_000
"""The most outages one draw may hold (three float64/int64 arrays: 240 MB). No study reaches it:
16,384 GPUs over a year at Llama 3's 419 interruptions in 54 days draw ~2,800; a draw that would pass
it comes from a horizon or a rate off by orders of magnitude (a model size typed with extra zeros
makes the step, and so the horizon, astronomically long) and would run for ever, so it is refused."""


class OutageLimitError(ConfigError):
    """A draw would hold more than ``limit`` outages (``expected`` on average). A ConfigError, so a caller
    that does not check first still ends in one line (exit 2), not a traceback; this layer knows no field
    names, so the line lists what makes a horizon or a rate that large."""

    def __init__(self, expected: float, limit: int, horizon_s: float):
        self.expected, self.limit = expected, limit
        super().__init__("", f"the failure processes would draw ~{expected:.3g} outages over {horizon_s:.3g} s of "
                             f"simulated time, over the limit of {limit:,}: a figure is off by orders of magnitude "
                             "(the days or steps simulated, a failure rate, or a model or link figure that makes "
                             "the step astronomically long)")


def expected_outages(num_actors: int, rate_per_hour: float, horizon_s: float, down_mean_s: float = 0.0,
                     renewal: Renewal = "after_repair") -> float:
    """About how many outages :func:`draw_outage_arrays` draws: each actor renews once per mean cycle
    (mean up-time 1/rate, plus the mean down-time when the actor itself waits for its return), so
    ``horizon / cycle`` outages over the horizon (the elementary renewal theorem, Ross, *Stochastic
    Processes*, 2nd ed., Thm 3.3.4: N(t)/t -> 1/E[cycle]). Exact in the mean for the Poisson case from
    t = 0 with ``immediate`` renewal; inf when the horizon is."""
    if num_actors <= 0 or rate_per_hour <= 0 or horizon_s <= 0:
        return 0.0
    cycle_s = 3600.0 / rate_per_hour + (down_mean_s if renewal == "after_repair" else 0.0)
    return num_actors * horizon_s / cycle_s


def draw_outage_arrays(rng: np.random.Generator, num_actors: int, rate_per_hour: float, horizon_s: float, *,
                       distribution: UpDistribution = "exponential", weibull_shape: float = 1.0,
                       down_mean_s: float = 0.0, down_distribution: DownDistribution = "fixed",
                       down_sigma: float = 1.0, renewal: Renewal = "after_repair",
                       max_outages: int = MAX_OUTAGES) -> OutageArrays:
    """Every outage that starts before ``horizon_s`` for ``num_actors`` actors failing at
    ``rate_per_hour`` each (mean up-time 1/rate); see the module docstring. Raises
    :class:`OutageLimitError` before drawing when :func:`expected_outages` passes ``max_outages``
    (the draw would not end in a useful time); callers that know which input made the horizon check
    first and name it."""
    check_process(rate_per_hour, horizon_s, weibull_shape, down_mean_s, down_sigma)
    empty = OutageArrays(np.empty(0, np.int64), np.empty(0), np.empty(0))
    if num_actors <= 0 or rate_per_hour == 0 or horizon_s == 0:
        return empty
    expected = expected_outages(num_actors, rate_per_hour, horizon_s, down_mean_s, renewal)
    if expected > max_outages:
        raise OutageLimitError(expected, max_outages, horizon_s)
    mean_up_s = 3600.0 / rate_per_hour
    active = np.arange(num_actors, dtype=np.int64)
    clock = np.zeros(num_actors)
    actors, downs, ups = [], [], []
    while len(active):
        fail = clock + _up_times(rng, len(active), mean_up_s, distribution, weibull_shape)
        keep = fail < horizon_s
        active, fail = active[keep], fail[keep]
        if not len(active):
            break
        back = fail + _down_times(rng, len(active), down_mean_s, down_distribution, down_sigma)
        actors.append(active)
        downs.append(fail)
        ups.append(back)
        clock = back if renewal == "after_repair" else fail
    if not actors:
        return empty
    actor, down, up = np.concatenate(actors), np.concatenate(downs), np.concatenate(ups)
    order = np.lexsort((actor, down))
    return OutageArrays(actor[order], down[order], up[order])


def draw_outages(actors: list[str], rate_per_hour: float, horizon_s: float, seed: int | np.random.Generator, *,
                 distribution: UpDistribution = "exponential", weibull_shape: float = 1.0,
                 down_mean_s: float = 0.0, down_distribution: DownDistribution = "fixed", down_sigma: float = 1.0,
                 renewal: Renewal = "after_repair", cause: str = "") -> list[Outage]:
    """Seeded outages of named actors before ``horizon_s``, sorted by time (the reusable form:
    e.g. the preemptions of a swarm's peers at a rate per hour, each back after ``down_mean_s``).
    ``seed``: an int (a fresh ``numpy.random.default_rng(seed)``) or a Generator to draw from."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    arrays = draw_outage_arrays(rng, len(actors), rate_per_hour, horizon_s, distribution=distribution,
                                weibull_shape=weibull_shape, down_mean_s=down_mean_s,
                                down_distribution=down_distribution, down_sigma=down_sigma, renewal=renewal)
    return [Outage(actors[int(a)], float(d), float(u), cause)
            for a, d, u in zip(arrays.actor, arrays.down_s, arrays.up_s, strict=True)]
