"""Hybrid sharding (HSDP): ZeRO shards within groups of dp ranks, replicated across groups."""

from __future__ import annotations

import pytest

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.plan import Planner

MODEL = dict(name="toy", num_layers=4, hidden_size=512, num_attention_heads=8, vocab_size=1024, seq_length=512)


def scenario(**par):
    base = dict(zero_stage=3, micro_batch_size=1, global_batch_size=16)
    base.update(par)
    return load_scenario(dict(model=MODEL, cluster=dict(node="dgx-a100-80g", num_gpus=16), parallelism=base))


def test_shards_within_the_group_and_all_reduces_across_replicas():
    plan = Planner(scenario(zero_shard_size=8)).build()
    dp_tasks = plan.streams[("stage0", "dp")]
    names = [t.name for t in dp_tasks]
    assert any("zshard_grad_reduce_scatter" in n for n in names)
    assert any("zrep_grad_all_reduce" in n for n in names)
    gathers = [t for t in dp_tasks if t.name.endswith("zero3_gather")]
    # the 8-rank shard group sits inside one DGX node: gathers ride NVLink only
    assert gathers and all(set(p.split(":")[1] for p in t.demands) == {"nvl_tx", "nvl_rx"} for t in gathers)


def test_memory_shards_over_the_group_only():
    full, hybrid = simulate(scenario()), simulate(scenario(zero_shard_size=8))
    assert hybrid.memory_gib["optimizer"] == pytest.approx(2 * full.memory_gib["optimizer"], rel=1e-9)
    assert hybrid.memory_gib["weights"] == pytest.approx(2 * full.memory_gib["weights"], rel=1e-9)


def test_symmetric_and_full_agree():
    sc = scenario(zero_shard_size=8)
    assert simulate(sc).step_time_s == pytest.approx(simulate(sc, mode="full").step_time_s, rel=1e-9)


@pytest.mark.parametrize(("par", "reason"), [
    (dict(zero_shard_size=3), "does not divide"),
    (dict(zero_stage=0, zero_shard_size=8), "zero_stage"),
])
def test_bad_hybrid_layouts_name_the_field(par, reason):
    with pytest.raises(ConfigError, match=reason) as err:
        scenario(**par)
    assert err.value.field == "parallelism.zero_shard_size"
