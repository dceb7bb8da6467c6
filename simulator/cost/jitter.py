"""Synchronisation skew: the expected wait for the slowest of n ranks.

Ranks that do equal work between two synchronisations finish at different times; a blocking
collective waits for the last. If each rank's time for a segment T is T·(1 + σ·Z), Z standard
normal and independent across ranks, the group leaves the collective after T·(1 + σ·e_n) on
average, e_n = E[max of n standard normals] (e_1 = 0, e_2 = 1/√π ≈ 0.564, e_8 ≈ 1.424,
e_1024 ≈ 3.2): the noise-amplification model of Petrini et al. (SC'03) and Hoefler, Schneider
and Lumsdaine (SC'10). σ is ``efficiency.sync_jitter``, measured by the harness
(validation/harness/skew.py); 0 (no skew) where not measured.

The planner stretches every kernel of a multi-rank job by 1 + σ·e_N with N its number of
ranks: exact when each segment ends in a collective over all of them, an upper bound where
collectives synchronise smaller groups (a tensor-parallel group of 8 inside 1,024 ranks).
"""

from __future__ import annotations

import math
from functools import cache


@cache
def expected_max_of_normals(n: int) -> float:
    """E[max(Z_1..Z_n)] for iid standard normals: ∫ x·n·φ(x)·Φ(x)^(n-1) dx, on a fine grid."""
    if n <= 1:
        return 0.0
    import numpy as np  # here, not at the top: start-up of a run without jitter stays free of numpy

    x = np.linspace(-12.0, 12.0, 48001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    density = n * phi * cdf ** (n - 1)
    return float(np.sum(x * density) * (x[1] - x[0]))


def sync_stretch(sync_jitter: float, ranks: int) -> float:
    """The factor on a kernel's time: 1 + σ·e_n (1 for one rank or no jitter)."""
    if sync_jitter <= 0 or ranks <= 1:
        return 1.0
    return 1.0 + sync_jitter * expected_max_of_normals(ranks)
