"""The local_learning kind on the toy GPT of tests/test_simulate.py (a layer's forward T, its
backward 2T; the LM head, V = 8, ~1e-15 s): no backward dependency between groups, the
auxiliary heads' time, FLOPs and memory, checks naming the field."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.memory.analytic import rank_memory
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.local_learning import head_activation_bytes
from simulator.strategies.registry import get_kind
from validation.closed_form_activations import activation_bytes_per_layer, output_layer_activation_bytes

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import HEADS, T_LAYER, H, S, V, toy_raw  # noqa: E402

LAYER_PARAMS = 789_760  # 12h² + 13h


def _local(num_gpus: int, aux_layers: int = 0, **par):
    raw = toy_raw(num_gpus, **par)
    raw["strategy"] = {"kind": "local_learning", "aux_layers": aux_layers}
    return load_scenario(raw)


def test_groups_never_wait_for_a_later_groups_backward():
    # 2 groups of 2 layers, m = 4: each stage takes 2·(T + 2T) = 6T per micro-batch and nothing
    # holds stage 0 back, so a step is 4·6T = 24T; backpropagation through both stages (1F1B,
    # flushed) takes (m + p - 1)·6T = 30T.
    r = simulate(_local(2, pp=2, global_batch_size=4))
    assert r.step_time_s == pytest.approx(24 * T_LAYER, rel=1e-9)
    assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    end_to_end = simulate(load_scenario(toy_raw(2, pp=2, global_batch_size=4)))
    assert end_to_end.step_time_s == pytest.approx(30 * T_LAYER, rel=1e-9)


def test_a_critic_layer_costs_a_layer_pass_per_micro_batch():
    # aux_layers 1: group 0's critic adds one layer's forward and backward (3T) per micro-batch:
    # stage 0 takes 9T, the step 4·9T = 36T. Its FLOPs: one layer (3·(24sh² + 4s²h)) plus the
    # output layer (3 GEMMs of 2·s·h·V) per micro-batch.
    r = simulate(_local(2, aux_layers=1, pp=2, global_batch_size=4))
    assert r.step_time_s == pytest.approx(36 * T_LAYER, rel=1e-9)
    layer_flops = 3 * (24 * S * H * H + 4 * S * S * H)
    assert r.extra["aux_head_flops_per_step"] == 4 * (layer_flops + 3 * 2 * S * H * V)
    assert r.extra["aux_heads"] == 1


def test_memory_one_micro_batch_in_flight_plus_the_head():
    # 1F1B keeps p - i = 2 micro-batches on stage 0 of 2; local learning frees each micro-batch by
    # its local backward: half the activations, plus the head's output-layer activations. The
    # head's V·h + 2h parameters add weights, gradients (bf16, 2 B) and Adam state (12 B).
    scenario = _local(2, aux_layers=0, pp=2, global_batch_size=4)
    _, _, (first, last) = get_kind("local_learning").memory(scenario)
    flushed = [rank_memory(load_scenario(toy_raw(2, pp=2, global_batch_size=4)), i) for i in (0, 1)]
    head = V * H + 2 * H
    assert first.weights_bytes == pytest.approx(flushed[0].weights_bytes + 2 * head)
    assert first.gradients_bytes == pytest.approx(flushed[0].gradients_bytes + 2 * head)
    assert first.optimizer_bytes == pytest.approx(flushed[0].optimizer_bytes + 12 * head)
    assert first.activations_bytes == pytest.approx(
        flushed[0].activations_bytes / 2 + output_layer_activation_bytes(S, 1, H, V))
    assert last == flushed[1]  # the last group trains on the model's own loss


@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_a_critic_layer_keeps_what_the_models_own_layer_keeps(attention):
    # The head's activations are read from the model's layer graph: its LM head and one block. Under
    # FlashAttention the block keeps no s x s attention core (Korthikanti's selective count), so
    # neither does the critic layer (a second formula had kept it: 5·a·s²·b more per micro-batch).
    raw = toy_raw(2, pp=2, global_batch_size=4)
    raw["strategy"] = {"kind": "local_learning", "aux_layers": 1}
    raw["training"] = raw["training"] | {"attention": attention}
    kept = "selective" if attention == "flash" else "none"
    block = activation_bytes_per_layer(S, 1, H, HEADS, recompute=kept)
    assert head_activation_bytes(load_scenario(raw)) == pytest.approx(output_layer_activation_bytes(S, 1, H, V) + block,
                                                                      rel=1e-12)


def test_one_group_is_refused():
    with pytest.raises(ConfigError, match=r"parallelism\.pp: local_learning needs at least two groups"):
        simulate(_local(1, global_batch_size=4))


def test_a_barrier_per_step_adds_the_forward_fill():
    # sync_steps: every group waits for all at the end of a step. Stage 0 sends micro-batch j's
    # activations at 6T·j + 2T (its forward of 2 layers); stage 1 then runs its 6T on each: the
    # step ends at 2T + 4·6T = 26T (without the barrier stage 0 runs ahead: 24T).
    raw = toy_raw(2, pp=2, global_batch_size=4)
    raw["strategy"] = {"kind": "local_learning", "sync_steps": True}
    raw["simulation"] = {"steps": 2}
    r = simulate(load_scenario(raw))
    assert r.step_time_s == pytest.approx(26 * T_LAYER, rel=1e-9)
    assert r.step_times_s == pytest.approx([26 * T_LAYER] * 2, rel=1e-9)
