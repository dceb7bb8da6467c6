"""Each swarm peer's outages: when it leaves and when it comes back.

Drawn by the project's seeded failure processes (:func:`simulator.engine.failures.draw_outages`: per
peer, exponential up-times at ``rate_per_hour`` -- a Poisson preemption process, how spot /
preemptible instances are usually modelled -- then an exponential time away; the peer's next
up-time starts when it is back, ``renewal: after_repair``), plus outages given by the user. The
draws need a horizon; the kind picks it (simulator/strategies/swarm.py) and draws again with a
longer one when the run outlasts it, so one seed still gives one run bit for bit.
"""

from __future__ import annotations

from bisect import bisect_left

from simulator.engine.failures import Outage, draw_outages


class Preemptions:
    """Outages per peer (index), sorted by time: given ones and drawn ones up to ``horizon_s``."""

    def __init__(self, peers: int, seed: int, rate_per_hour: float = 0.0, mean_downtime_s: float = 0.0,
                 fixed: dict[int, list[Outage]] | None = None, horizon_s: float = 0.0):
        self.horizon_s = horizon_s
        self._outages: list[list[Outage]] = [list((fixed or {}).get(p, [])) for p in range(peers)]
        if rate_per_hour > 0 and horizon_s > 0:
            names = [str(p) for p in range(peers)]
            for outage in draw_outages(names, rate_per_hour, horizon_s, seed, down_mean_s=mean_downtime_s,
                                       down_distribution="exponential", renewal="after_repair",
                                       cause="preemption"):
                self._outages[int(outage.actor)].append(outage)
        for outages in self._outages:
            outages.sort(key=lambda o: o.down_s)
        self._starts = [[o.down_s for o in outages] for outages in self._outages]

    def next_after(self, peer: int, time_s: float) -> Outage | None:
        """The first outage of ``peer`` that starts at or after ``time_s`` (None: no more): a binary search
        (the first index whose start is >= time_s, as the linear scan found; a long run's thousands of
        outages per peer made that scan quadratic)."""
        i = bisect_left(self._starts[peer], time_s)
        outages = self._outages[peer]
        return outages[i] if i < len(outages) else None
