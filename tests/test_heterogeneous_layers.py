"""Models whose layers differ: MoE every k-th layer (``moe_layer_frequency``) and dense first
layers (``first_dense_layers``, DeepSeek's first_k_dense_replace). Exact expectations on the
toy GPT of tests/test_simulate.py (h = s = 256, 4 heads, V = 8) with 4 experts, top-2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simulator.memory.analytic import rank_memory, stage_params
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.plan import Planner
from workloads.counting import active_params, layer_params, step_flops, total_params
from workloads.graph import ShardShape, layer_work
from workloads.layer_kinds import layer_kind_counts, layer_kind_runs, layer_kinds
from workloads.schema import TransformerSpec

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import MODES, E, H, S, toy_raw  # noqa: E402

MOE = dict(num_experts=4, top_k=2)
DENSE_LAYER = 12 * H * H + 13 * H        # QKV + out + FC1 + FC2 (+ biases) + 2 layernorms = 789,760
EXPERT = 8 * H * H + 5 * H               # one 4h expert: FC1 4h² + 4h, FC2 4h² + h = 525,568
MOE_LAYER = 4 * H * H + 4 * H + 4 * EXPERT + 4 * H + 4 * H  # attention, 4 experts, router h·4, norms 4h
EMBED_AND_HEAD = 8 * H + S * H + 2 * H + 8 * H  # 67,584 + 2,560, as in test_toy_parameter_count
# Forward FLOPs of one layer (2 per multiply-add): attention 8sh² + 4s²h (QKV 6sh², out 2sh²,
# QK^T and AV 2s²h each); dense FFN 16sh²; MoE FFN with top-2: every token through two 4h
# experts, 32sh² (the router's 2·s·h·4 runs at the toy's full speed, ~1e-15 s).
DENSE_FWD = 24 * S * H * H + 4 * S * S * H
MOE_FWD = 40 * S * H * H + 4 * S * S * H


def moe_raw(num_gpus: int = 1, layers: int = 4, **moe) -> dict:
    raw = toy_raw(num_gpus)
    raw["model"] = dict(raw["model"], num_layers=layers, moe=dict(MOE, **moe))
    return raw


def test_layer_kinds():
    every_other = TransformerSpec.model_validate(moe_raw(moe_layer_frequency=2)["model"])
    assert layer_kinds(every_other) == (False, True, False, True)
    first_dense = TransformerSpec.model_validate(moe_raw(layers=6, first_dense_layers=3)["model"])
    assert layer_kinds(first_dense) == (False, False, False, True, True, True)
    both = TransformerSpec.model_validate(moe_raw(layers=6, first_dense_layers=2, moe_layer_frequency=2)["model"])
    assert layer_kinds(both) == (False, False, False, True, False, True)
    assert layer_kind_counts(both) == {False: 4, True: 2}
    assert layer_kind_runs(layer_kinds(both), 1, 4) == ((False, 2), (True, 1), (False, 1))


def test_a_model_without_moe_layers_is_rejected():
    from simulator.errors import ConfigError

    with pytest.raises(ConfigError, match="first_dense_layers"):
        load_scenario(moe_raw(first_dense_layers=4))
    with pytest.raises(ConfigError, match="no layer is a MoE layer"):
        load_scenario(moe_raw(layers=4, moe_layer_frequency=5))


def test_parameters_sum_per_layer_kind():
    # 4 layers, every other one MoE: 2 dense + 2 MoE layers.
    model = load_scenario(moe_raw(moe_layer_frequency=2)).model
    assert total_params(model) == 2 * DENSE_LAYER + 2 * MOE_LAYER + EMBED_AND_HEAD == 6_384_640
    # Active: a MoE layer touches 2 of its 4 experts.
    assert active_params(model) == 2 * DENSE_LAYER + 2 * (MOE_LAYER - 2 * EXPERT) + EMBED_AND_HEAD


def test_model_flops_sum_per_layer_kind():
    model = load_scenario(moe_raw(moe_layer_frequency=2)).model
    head = 2 * S * H * 8  # LM head GEMM
    router = 2 * S * H * 4
    expected = 3 * (2 * DENSE_FWD + 2 * (MOE_FWD + router) + head)
    assert step_flops(model, S, 1, "none").model_flops == expected


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_single_gpu_step_is_the_sum_of_per_kind_pass_times(mode, detail):
    # 1 GPU, one micro-batch: step = forward + backward (2x) of 2 dense and 2 MoE layers at E FLOP/s.
    r = simulate(load_scenario(moe_raw(moe_layer_frequency=2)), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(3 * (2 * DENSE_FWD + 2 * MOE_FWD) / E, rel=1e-9)
    # first_dense_layers=1: 1 dense + 3 MoE layers.
    r = simulate(load_scenario(moe_raw(first_dense_layers=1)), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(3 * (DENSE_FWD + 3 * MOE_FWD) / E, rel=1e-9)


def test_chunk_ops_follow_the_layer_order():
    sc = load_scenario(moe_raw(num_gpus=2, moe_layer_frequency=2) | {"parallelism": dict(
        tp=1, pp=2, dp=1, micro_batch_size=1, global_batch_size=2)})
    planner = Planner(sc)
    dense = layer_work(sc.model, planner.shard, 0)
    moe = layer_work(sc.model, planner.shard, 1)
    assert planner.chunk_runs(0) == planner.chunk_runs(1) == ((False, 1), (True, 1))
    assert planner._chunk_ops("F", 1) == dense.forward + moe.forward + planner.head.forward
    assert planner._chunk_ops("B", 1) == planner.head.backward + moe.backward + dense.backward
    # parameters held: one dense and one MoE layer per stage (plus the ends)
    layers = DENSE_LAYER + MOE_LAYER
    assert planner.chunk_params_local(0) == layers + 8 * H + S * H
    assert planner.chunk_params_local(1) == layers + 2 * H + 8 * H
    assert stage_params(sc.model, sc.parallelism, 0) == layers + 8 * H + S * H


def test_moe_layers_store_more_activations_than_dense_ones():
    # pp = 2 with first_dense_layers=2: stage 0 holds the 2 dense layers, stage 1 the 2 MoE layers.
    base = moe_raw(num_gpus=2, first_dense_layers=2)
    base["parallelism"] = dict(tp=1, pp=2, dp=1, micro_batch_size=1, global_batch_size=2)
    sc = load_scenario(base)
    dense_stage, moe_stage = rank_memory(sc, 0), rank_memory(sc, 1)
    assert moe_stage.weights_bytes > 2.5 * dense_stage.weights_bytes
    graph = sc.model.layer_graph(ShardShape(micro_batch=1, seq_length=S))
    assert graph.layers[1].params == layer_params(sc.model, False) == DENSE_LAYER  # layers[0]: the embedding
    assert graph.layers[4].params == layer_params(sc.model, True) == MOE_LAYER


def test_zero3_gathers_each_layer_at_its_own_size():
    raw = moe_raw(num_gpus=2, moe_layer_frequency=2)
    raw["parallelism"] = dict(tp=1, pp=1, dp=2, zero_stage=3, micro_batch_size=1, global_batch_size=2)
    planner = Planner(load_scenario(raw), detail=True)
    plan = planner.build()
    gathers = {t.name: t for tasks in plan.streams.values() for t in tasks if t.name.endswith("zero3_gather")}
    dense = sum(gathers["F.mb0.c0.L0.zero3_gather"].demands.values())
    moe = sum(gathers["F.mb0.c0.L1.zero3_gather"].demands.values())
    assert moe / dense == pytest.approx(MOE_LAYER / DENSE_LAYER, rel=1e-12)


def test_dense_only_model_plans_one_kind():
    planner = Planner(load_scenario(toy_raw(1)))
    assert planner.layer_works.keys() == {False}
    assert planner.chunk_runs(0) == ((False, 4),)
