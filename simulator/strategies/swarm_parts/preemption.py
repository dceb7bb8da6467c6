"""Seeded preemption of peers: when each peer leaves and when it comes back.

A peer's uptimes and downtimes are independent exponential draws (a Poisson preemption process
of ``rate_per_hour`` per peer, as cloud spot/preemptible instances are usually modelled, e.g.
SWARM's own experiments on preemptible T4s, Ryabinin et al. 2023, Sec. 4.3), drawn lazily from
one numpy ``PCG64`` stream per peer spawned from the seed (``SeedSequence.spawn``), so the
outages of peer i do not depend on the order the dispatcher asks for them nor on other peers:
the same seed gives the same outages bit for bit.

This is the minimal generator the swarm kind needs; the reusable failure-time generator of the
``failures`` work (issue 21) had not landed when it was written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Outage:
    """A peer is away over ``[down_s, up_s)`` (it then downloads its stage's parameters)."""

    down_s: float
    up_s: float


class Preemptions:
    """Outages per peer: given ones (``fixed``) or drawn from a Poisson process per peer."""

    def __init__(self, peers: int, seed: int, rate_per_hour: float = 0.0, mean_downtime_s: float = 0.0,
                 fixed: dict[int, list[Outage]] | None = None):
        self.rate_per_s = rate_per_hour / 3600.0
        self.mean_downtime_s = mean_downtime_s
        self._drawn: list[list[Outage]] = [sorted(fixed.get(p, []), key=lambda o: o.down_s) if fixed else []
                                           for p in range(peers)]
        self._random = self.rate_per_s > 0
        streams = np.random.SeedSequence(seed).spawn(peers)
        self._rngs = [np.random.Generator(np.random.PCG64(s)) for s in streams]

    def _draw_next(self, peer: int) -> None:
        previous_up = self._drawn[peer][-1].up_s if self._drawn[peer] else 0.0
        rng = self._rngs[peer]
        down = previous_up + float(rng.exponential(1.0 / self.rate_per_s))
        up = down + float(rng.exponential(self.mean_downtime_s)) if self.mean_downtime_s > 0 else down
        self._drawn[peer].append(Outage(down, up))

    def next_after(self, peer: int, time_s: float) -> Outage | None:
        """The first outage of ``peer`` that starts at or after ``time_s`` (None: no more)."""
        outages = self._drawn[peer]
        if self._random:
            while not outages or outages[-1].down_s < time_s:
                self._draw_next(peer)
        for outage in outages:
            if outage.down_s >= time_s:
                return outage
        return None

    def outages(self, peer: int) -> list[Outage]:
        """The outages drawn (or given) so far for ``peer``."""
        return list(self._drawn[peer])
