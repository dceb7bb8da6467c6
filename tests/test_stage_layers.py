"""First/last pipeline stage with their own layer counts (Megatron-LM's
--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers): the split, its
checks (ConfigError naming the field) and its effect on layers per stage, memory and time,
on the toy GPT of tests/test_simulate.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.memory.analytic import rank_memory, stage_layer_indices, stage_params
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.layout import Parallelism, chunk_layer_counts

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import MODES, T_LAYER, toy, toy_raw  # noqa: E402

LAYER_PARAMS = 789_760  # 12h² + 13h of the toy layer


def counts(num_layers: int, **par) -> list[int]:
    return chunk_layer_counts(Parallelism(dp=1, **par), num_layers)


def test_split_with_first_and_last_stage_layers():
    assert counts(10, pp=4) == [2, 3, 3, 2]  # unchanged default (split_layers)
    assert counts(10, pp=4, first_stage_layers=1) == [1, 3, 3, 3]
    assert counts(10, pp=4, first_stage_layers=3, last_stage_layers=1) == [3, 3, 3, 1]
    assert counts(10, pp=4, last_stage_layers=4) == [2, 2, 2, 4]
    assert counts(4, pp=2, first_stage_layers=0) == [0, 4]
    assert counts(5, pp=2, first_stage_layers=2, last_stage_layers=3) == [2, 3]
    # Virtual stages: the first rank's layers are split over its chunks (global chunk c·pp + stage).
    assert counts(12, pp=2, virtual_stages=2, schedule="interleaved", first_stage_layers=4) == [2, 4, 2, 4]
    assert counts(16, pp=4, virtual_stages=2, schedule="interleaved", first_stage_layers=2,
                  last_stage_layers=2) == [1, 3, 3, 1] * 2


@pytest.mark.parametrize(("par", "field", "reason"), [
    (dict(pp=4, first_stage_layers=2), "first_stage_layers", "do not split evenly"),
    (dict(pp=4, last_stage_layers=2), "last_stage_layers", "do not split evenly"),
    (dict(pp=4, first_stage_layers=9, last_stage_layers=3), "first_stage_layers", "exceed"),
    (dict(pp=2, first_stage_layers=3, last_stage_layers=3), "first_stage_layers", "must equal"),
    (dict(pp=1, last_stage_layers=3), "last_stage_layers", "needs pp > 1"),
    (dict(pp=2, virtual_stages=2, schedule="interleaved", first_stage_layers=3), "first_stage_layers",
     "virtual stages"),
    (dict(pp=2, virtual_stages=2, schedule="interleaved", first_stage_layers=0), "first_stage_layers",
     "virtual stages"),
    (dict(pp=3, first_stage_layers=5, last_stage_layers=5), "first_stage_layers", "at least one"),
])
def test_bad_stage_layers_are_config_errors_naming_the_field(par, field, reason):
    with pytest.raises(ConfigError, match=reason) as err:
        counts(10, **par)
    assert err.value.field == f"parallelism.{field}"


def test_negative_stage_layers_and_bad_scenarios_are_config_errors():
    with pytest.raises(ConfigError) as err:
        load_scenario(toy_raw(2, pp=2, first_stage_layers=-1))
    assert err.value.field == "parallelism.first_stage_layers"
    with pytest.raises(ConfigError) as err:  # checked when the scenario is loaded
        load_scenario(toy_raw(4, pp=4, last_stage_layers=2))
    assert err.value.field == "parallelism.last_stage_layers"


def test_first_stage_layers_shift_layers_and_memory():
    even = simulate(toy(2, pp=2, global_batch_size=2))
    shifted = simulate(toy(2, pp=2, global_batch_size=2, first_stage_layers=1))
    assert even.layers_per_stage == [2, 2] and shifted.layers_per_stage == [1, 3]
    assert shifted.layer_split == [1, 3]
    sc = toy(2, pp=2, global_batch_size=2, first_stage_layers=1)
    assert stage_params(sc.model, sc.parallelism, 0) == 1 * LAYER_PARAMS + 8 * 256 + 256 * 256
    assert stage_params(sc.model, sc.parallelism, 1) == 3 * LAYER_PARAMS + 2 * 256 + 8 * 256
    assert stage_layer_indices(4, 2, 1, 1, chunk_layer_counts(sc.parallelism, 4)) == [1, 2, 3]
    base = toy(2, pp=2, global_batch_size=2)
    # one layer moved from stage 0 to stage 1: stage 0 loses one layer's weights, stage 1 gains one
    moved = 2 * LAYER_PARAMS  # bf16 weights, 2 bytes per parameter
    assert rank_memory(base, 0).weights_bytes - rank_memory(sc, 0).weights_bytes == moved
    assert rank_memory(sc, 1).weights_bytes - rank_memory(base, 1).weights_bytes == moved
    # activations: per layer x micro-batches in flight (1F1B: 2 on stage 0, 1 on stage 1)
    per_layer_0 = rank_memory(base, 0).activations_bytes - rank_memory(sc, 0).activations_bytes
    per_layer_1 = rank_memory(sc, 1).activations_bytes - rank_memory(base, 1).activations_bytes
    assert per_layer_0 == pytest.approx(2 * per_layer_1, rel=1e-12)


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_unbalanced_stages_set_the_step_time(mode, detail):
    # pp = 2, 1F1B, m micro-batches, stage 0 one layer (f = T), stage 1 three (3T fwd + 6T bwd):
    # stage 1 works without a break from T to T + 9mT, then stage 0 runs the last backward (2T).
    m = 3
    r = simulate(toy(2, pp=2, global_batch_size=m, first_stage_layers=1), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx((9 * m + 3) * T_LAYER, rel=1e-9)


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_an_end_stage_may_hold_no_layer(mode, detail):
    r = simulate(toy(2, pp=2, global_batch_size=2, first_stage_layers=0), mode=mode, detail=detail)
    assert r.layers_per_stage == [0, 4]
    # stage 0 only looks up embeddings (~0 s): the step is stage 1's 1F1B alone, m·(4T + 8T)
    assert r.step_time_s == pytest.approx(2 * 12 * T_LAYER, rel=1e-9)


def test_virtual_stages_apply_the_split_per_chunk():
    raw = toy_raw(2, pp=2, virtual_stages=2, schedule="interleaved", global_batch_size=2, first_stage_layers=2)
    raw["model"]["num_layers"] = 8
    sc = load_scenario(raw)
    r = simulate(sc)
    assert r.layer_split == [1, 3, 1, 3] and r.layers_per_stage == [2, 6]
    assert stage_layer_indices(8, 2, 2, 0, r.layer_split) == [0, 4]
    assert stage_layer_indices(8, 2, 2, 1, r.layer_split) == [1, 2, 3, 5, 6, 7]
    assert stage_params(sc.model, sc.parallelism, 1) == 6 * LAYER_PARAMS + 2 * 256 + 8 * 256


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_a_stage_without_layers_simulates(mode, detail):
    """A last stage holding only the head (``last_stage_layers: 0``, as nanotron runs of the
    Ultra-Scale Playbook) simulates in both modes; its kernels are named without a layer range."""
    result = simulate(load_scenario(toy_raw(2, pp=2, global_batch_size=4, last_stage_layers=0)), mode=mode,
                      detail=detail)
    assert result.layers_per_stage == [4, 0]
    # stage 1 only runs the head (~0 s): the step is stage 0's 1F1B alone, m·(4T + 8T) with m = 4
    assert result.step_time_s == pytest.approx(4 * 12 * T_LAYER, rel=1e-9)
    layers = {dict(e.args).get("layer") for e in result.timeline
              if e.rank_class in ("stage1", "rank1") and e.category == "compute"}
    assert layers == ({"head"} if detail else {None})  # per kernel: the head's; per pass: none
