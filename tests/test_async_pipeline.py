"""The async_pipeline kind on the toy GPT of tests/test_simulate.py (a layer's forward takes
T = T_LAYER, its backward 2T; the LM head, embedding, sends and optimizer take ~1e-13 s unless
the vocabulary is made large): steady-state steps over whole periods, the slowest stage's
throughput, stashed weight versions, checks naming the field."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.memory.analytic import rank_memory
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.registry import get_kind

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import T_LAYER, E, H, S, toy_raw  # noqa: E402


def _async(num_gpus: int, variant: str, model: dict | None = None, **par):
    raw = toy_raw(num_gpus, **par)
    raw["model"].update(model or {})
    raw["strategy"] = {"kind": "async_pipeline", "variant": variant}
    return load_scenario(raw)


@pytest.mark.parametrize("variant", ["pipedream", "2bw"])
def test_no_flush_step_is_m_times_the_slowest_stage(variant):
    # pp 2 with 1 layer on stage 0 and 3 on stage 1, m = 4: stage 1 takes 3·(T + 2T) = 9T per
    # micro-batch and stage 0 3T, so without fill or drain a step is 4·9T = 36T. The flushed 1F1B
    # of the spmd kind adds the fill (stage 0's first forward, T) and the drain (its last
    # backward, 2T): 39T.
    scenario = _async(2, variant, pp=2, global_batch_size=4, last_stage_layers=3)
    r = simulate(scenario)
    assert r.step_time_s == pytest.approx(36 * T_LAYER, rel=1e-9)
    assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    flushed = simulate(load_scenario(toy_raw(2, pp=2, global_batch_size=4, last_stage_layers=3)))
    assert flushed.step_time_s == pytest.approx(39 * T_LAYER, rel=1e-9)


def test_equal_stages_lose_the_bubble():
    # pp 2 of 2 layers (6T per micro-batch each), m = 4: 4·6T = 24T without flushes against
    # (m + p - 1)·6T = 30T for the flushed 1F1B.
    r = simulate(_async(2, "pipedream", pp=2, global_batch_size=4))
    assert r.step_time_s == pytest.approx(24 * T_LAYER, rel=1e-9)
    assert simulate(load_scenario(toy_raw(2, pp=2, global_batch_size=4))).step_time_s == pytest.approx(
        30 * T_LAYER, rel=1e-9)


def test_fine_grained_throughput_is_one_sample_per_slowest_stage():
    # One stage per layer (pp = L = 4), batch 1. With V = 4096 the LM head's GEMMs
    # (2·s·h·V = 536,870,912 FLOP each: forward, input and weight gradients) run at E, so the last
    # stage takes 3·(T + T_head) per sample, T_head = 2·s·h·V / E, against 3T for the others:
    # m = 4 samples per step take 4·3·(T + T_head) (Kosson et al. 2020: no fill or drain).
    t_head = 2 * S * H * 4096 / E
    r = simulate(_async(4, "fine_grained", model={"vocab_size": 4096}, pp=4, global_batch_size=4))
    assert r.step_time_s == pytest.approx(4 * 3 * (T_LAYER + t_head), rel=1e-9)
    assert r.extra["weight_versions_per_stage"] == [1, 1, 1, 1]
    assert r.extra["staleness_updates_per_stage"] == [3, 2, 1, 0]
    assert r.extra["updates_per_step"] == 4


def test_fine_grained_needs_one_layer_per_stage_and_batch_one():
    with pytest.raises(ConfigError, match=r"parallelism\.pp: .*one layer per stage: pp must be 4"):
        simulate(_async(2, "fine_grained", pp=2, global_batch_size=4))
    with pytest.raises(ConfigError, match=r"parallelism\.micro_batch_size"):
        simulate(_async(4, "fine_grained", pp=4, micro_batch_size=2, global_batch_size=8))


def test_interleaving_and_zero_are_refused():
    with pytest.raises(ConfigError, match=r"parallelism\.zero_stage"):
        simulate(_async(4, "pipedream", pp=2, dp=2, zero_stage=1, global_batch_size=4))


def test_stashed_weight_versions_and_activations_in_flight():
    # m = 1: a flushed 1F1B keeps one micro-batch; without flushes stage i keeps p - i of them
    # whatever m, as the flushed schedule does with m >= p. PipeDream stashes p - i weight
    # versions, 2BW two, fine-grained one.
    steady = load_scenario(toy_raw(4, pp=4, global_batch_size=4))
    for variant, versions in (("pipedream", [4, 3, 2, 1]), ("2bw", [2, 2, 2, 2]), ("fine_grained", [1, 1, 1, 1])):
        scenario = _async(4, variant, pp=4, global_batch_size=1)
        _, _, stages = get_kind("async_pipeline").memory(scenario)
        for i, stage in enumerate(stages):
            flushed = rank_memory(steady, i)
            assert stage.weights_bytes == pytest.approx(versions[i] * flushed.weights_bytes)
            assert stage.activations_bytes == pytest.approx(flushed.activations_bytes)
            assert stage.optimizer_bytes == flushed.optimizer_bytes


def test_2bw_updates_once_per_step_and_pipedream_per_micro_batch():
    # With dp = 2 and a slow link each update waits for the stage's gradient all-reduce:
    # PipeDream pays it per micro-batch, 2BW once per step, so 2BW is faster by (m - 1) of them.
    base = dict(nvl_gb_per_s=1, nvl_latency_us=0, pp=2, dp=2, global_batch_size=8)
    pipedream, two_bw = simulate(_async(4, "pipedream", **base)), simulate(_async(4, "2bw", **base))
    assert two_bw.extra["updates_per_step"] == 1 and pipedream.extra["updates_per_step"] == 4
    assert pipedream.step_time_s > two_bw.step_time_s


def test_every_step_of_the_window_is_a_steady_period():
    # simulation.steps 3: three steps of m = 4 micro-batches, each 4·9T (the slowest stage), none
    # carrying the fill or drain; the makespan does.
    raw = toy_raw(2, pp=2, global_batch_size=4, last_stage_layers=3)
    raw["strategy"] = {"kind": "async_pipeline"}
    raw["simulation"] = {"steps": 3}
    r = simulate(load_scenario(raw))
    assert r.step_times_s == pytest.approx([36 * T_LAYER] * 3, rel=1e-9)
    assert r.makespan_s > 3 * 36 * T_LAYER
