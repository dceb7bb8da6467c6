"""The ``parameter_server`` kind (simulator/strategies/parameter_server.py).

Toy cluster of tests/test_simulate.py: every rank in one node on NVLink (B = 100 GB/s per GPU, 1 us
latency); a step's compute T = 3·3·L·t; server kernels ~1e-13 s (HBM 1e12 GB/s). P parameters,
2-byte gradients and weights, so a push or pull of the whole model moves 2P bytes.

- central, dp workers: the server's receive port takes (dp - 1) pushes of 2P, then its transmit
  port (dp - 1) pulls: a step is T + 2·(1 us + (dp - 1)·2P / B);
- sharded: each rank pushes (dp - 1) shards of 2P/dp and receives as many: T + 2·(1 us + (dp - 1)/dp · 2P / B)
  (at dp = 2 exactly the ring all-reduce's 2 us + 2P/B).
"""

from __future__ import annotations

import pytest
from test_simulate import T_LAYER, TOY_PARAMS, L, toy_raw

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.parameter_server import ParameterServerPlanner

T = 3 * 3 * L * T_LAYER
P2 = 2 * TOY_PARAMS


def scenario(dp: int, steps: int = 2, convergence: dict | None = None, **strategy):
    raw = toy_raw(dp, nvl_gb_per_s=100, nvl_latency_us=1, dp=dp, global_batch_size=3 * dp)
    raw["strategy"] = {"kind": "parameter_server", **strategy}
    raw["simulation"] = {"steps": steps}
    if convergence:
        raw["convergence"] = convergence
    return load_scenario(raw)


@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_central_server_incast(dp, mode):
    r = simulate(scenario(dp, mode=mode))
    assert r.step_times_s == pytest.approx([T + 2 * (1e-6 + (dp - 1) * P2 / 100e9)] * 2, rel=1e-9)


@pytest.mark.parametrize("dp", [2, 4])
def test_sharded_servers_move_a_reduce_scatter_and_an_all_gather(dp):
    r = simulate(scenario(dp, servers="sharded"))
    assert r.step_times_s == pytest.approx([T + 2 * (1e-6 + (dp - 1) / dp * P2 / 100e9)] * 2, rel=1e-9)


def test_async_staleness_counted_per_update():
    # dp = 2, central server on rank 0. Rank 0's updates apply at T and 2T (its own gradient, no push);
    # rank 1's at T + t and 2T + 3t (t = push or pull). Updates of the other worker applied in between:
    # r0 step 0: none in (0, T]; r0 step 1: r1's (T + t) in (T, 2T]; r1 step 0: r0's (T) in (0, T + t];
    # r1 step 1: r0's (2T) in (T + t, 2T + 3t]. Mean 3/4 update, 3/8 step (2 workers per step).
    r = simulate(scenario(2, mode="async")).to_dict()
    assert r["staleness_updates_mean"] == pytest.approx(0.75)
    assert r["staleness_steps_mean"] == pytest.approx(0.375)
    assert simulate(scenario(2)).to_dict()["staleness_updates_mean"] == 0.0


def test_async_staleness_feeds_time_to_target():
    block = {"source": "test", "steps_to_target": 1000, "staleness": {"per_step_of_delay": 0.2}}
    r = simulate(scenario(2, mode="async", convergence=block)).to_dict()
    assert r["steps_to_target"] == pytest.approx(1000 * (1 + 0.2 * 0.375))


def test_memory_of_servers_and_workers():
    # central: the server keeps the whole Adam state (12P), the other worker none; sharded: 12P / dp each.
    central, sharded = simulate(scenario(2, steps=1)), simulate(scenario(2, steps=1, servers="sharded"))
    gib = 2**30
    assert (central.simulated_peak_memory_gib["rank0"] - central.simulated_peak_memory_gib["rank1"]) * gib == \
        pytest.approx(12 * TOY_PARAMS)
    assert (central.peak_memory_gib - sharded.peak_memory_gib) * gib == pytest.approx(6 * TOY_PARAMS)
    assert sharded.simulated_peak_memory_gib["rank1"] == pytest.approx(sharded.peak_memory_gib, rel=1e-12)


def test_every_rank_is_simulated():
    plan = ParameterServerPlanner(scenario(4)).build()
    assert set(plan.actors) == {"rank0", "rank1", "rank2", "rank3"}


def test_needs_zero_0():
    raw = toy_raw(2, dp=2, global_batch_size=6, zero_stage=1)
    raw["strategy"] = {"kind": "parameter_server"}
    with pytest.raises(ConfigError) as err:
        simulate(load_scenario(raw))
    assert err.value.field == "parallelism.zero_stage"


def test_collective_transport_is_a_ring_reduce_and_broadcast():
    # central over NCCL-style collectives: a pipelined ring reduce of 2P to the server, then a broadcast
    # of 2P: each (n - 1) steps of 1 us plus 2P / B, whatever the number of workers (no incast).
    for dp in (2, 4):
        r = simulate(scenario(dp, transport="collective"))
        assert r.step_times_s == pytest.approx([T + 2 * ((dp - 1) * 1e-6 + P2 / 100e9)] * 2, rel=1e-9)
    # sharded: reduce-scatter + all-gather, the ring all-reduce's bytes and steps
    r = simulate(scenario(4, transport="collective", servers="sharded"))
    assert r.step_times_s == pytest.approx([T + 2 * (3e-6 + 3 / 4 * P2 / 100e9)] * 2, rel=1e-9)
    with pytest.raises(ConfigError, match="strategy.transport"):
        simulate(scenario(2, transport="collective", mode="async"))
