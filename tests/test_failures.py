"""Seeded failure processes (simulator/engine/failures.py): reproducible, at the stated rates,
and with the renewal semantics of their docstring."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.engine.failures import draw_outage_arrays, draw_outages


def test_same_seed_same_outages_bit_for_bit():
    actors = [f"peer{i}" for i in range(50)]
    kwargs = dict(down_mean_s=600.0, down_distribution="lognormal", down_sigma=0.8, distribution="weibull",
                  weibull_shape=0.7)
    a = draw_outages(actors, 0.5, 86400.0, 7, **kwargs)
    b = draw_outages(actors, 0.5, 86400.0, 7, **kwargs)
    assert a == b and len(a) > 100
    assert draw_outages(actors, 0.5, 86400.0, 8, **kwargs) != a


def test_poisson_count_matches_rate():
    # 10,000 actors at 0.01/h over 100 h, immediate renewal: Poisson with mean 10,000.
    arrays = draw_outage_arrays(np.random.default_rng(1), 10_000, 0.01, 100 * 3600.0, renewal="immediate")
    assert abs(len(arrays) - 10_000) < 4 * math.sqrt(10_000)
    assert np.all(np.diff(arrays.down_s) >= 0) and arrays.down_s.max() < 100 * 3600.0
    # The gaps of the superposed process are exponential with mean 1/(N·λ) = 36 s.
    assert np.mean(np.diff(arrays.down_s)) == pytest.approx(36.0, rel=0.05)


def test_weibull_keeps_the_mean_up_time():
    # One failure per actor at most in a short horizon is not enough; use a long one and count.
    arrays = draw_outage_arrays(np.random.default_rng(2), 2_000, 1.0, 500 * 3600.0, distribution="weibull",
                                weibull_shape=1.5, renewal="immediate")
    assert len(arrays) / 2_000 == pytest.approx(500, rel=0.02)  # renewal theorem: horizon / mean up-time


def test_after_repair_an_actor_is_never_down_twice_at_once():
    arrays = draw_outage_arrays(np.random.default_rng(3), 20, 2.0, 200 * 3600.0, down_mean_s=1800.0,
                                down_distribution="exponential")
    for actor in range(20):
        mine = arrays.actor == actor
        downs, ups = arrays.down_s[mine], arrays.up_s[mine]
        assert np.all(downs[1:] >= ups[:-1])
    # Alternating renewal: a cycle lasts 1/rate + repair = 0.5 h + 0.5 h, so ~200 outages per actor.
    assert len(arrays) / 20 == pytest.approx(200, rel=0.05)


def test_zero_rate_and_fixed_down_time():
    assert draw_outages(["a", "b"], 0.0, 1e6, 0) == []
    outages = draw_outages(["a"], 1.0, 36000.0, 0, down_mean_s=60.0, cause="preempted")
    assert outages and all(o.up_s - o.down_s == pytest.approx(60.0) and o.cause == "preempted" for o in outages)
