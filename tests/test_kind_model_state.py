"""Every strategy kind counts weights, gradients and optimizer state as spmd does under the
training fields that set their bytes: ``training.param_dtype`` (fp32 master weights: 4 + 8 B with
Adam, no 16-bit copy) and ``training.grad_dtype`` (bf16 runs keep fp32 gradients by default,
Megatron-LM's ``main_grad``), through one helper, :func:`simulator.memory.analytic.model_state_bytes`.

Once per_layer, replicated_pipeline (DAPPLE) and layer_parallel_mgrit dropped ``param_dtype``
(GPT-1.7B as plain DP on 8 A100s, bf16 + fp32 params: spmd 25.79 GiB, per_layer and DAPPLE 28.81)
and DAPPLE dropped ``grad_dtype`` (28.81 vs spmd 31.94 GiB at bf16's default fp32 gradients).
Each kind's configuration that is plain data parallelism is compared with spmd's DP plan
(the configurations of tests/test_framework_terms.py). per_layer, which does not shard model state,
refuses a ZeRO stage in one line, and the planners that return per_layer plans say they dropped it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.explore.planners import get_planner
from simulator.memory.analytic import MIB, model_state_bytes, rank_memory
from simulator.scenario import gradient_bytes, load_scenario
from simulator.strategies.layer_parallel_mgrit import chain_of, rank_memory_mgrit, rank_params
from simulator.strategies.registry import get_kind

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [{"param_dtype": p, "grad_dtype": g} for p in ("auto", "fp32") for g in ("auto", "fp32", "bf16")]


def _with_training(kind: str, training: dict, zero_stage: int = 0):
    """GPT-1.7B on 8 A100s, one sample per GPU, as ``kind``'s plain data-parallel plan."""
    raw = {"name": f"gpt-1.7b-{kind}", "model": "gpt-1.7b", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
           "parallelism": {"dp": 8, "micro_batch_size": 1, "global_batch_size": 8, "zero_stage": zero_stage},
           "training": {"precision": "bf16", **training}}
    if kind == "per_layer":
        raw["strategy"] = {"kind": "per_layer", "default": {"batch": 8}}
        raw["parallelism"] = {"global_batch_size": 8}
    elif kind == "subnetwork_dp":
        raw["strategy"] = {"kind": "subnetwork_dp", "mask": "block", "masking": "forward_backward",
                           "keep_fraction": 1.0, "subnetworks": 1}
    elif kind == "replicated_pipeline":  # one stage holding every layer, replicated on every GPU
        layers = len(load_scenario(raw).layer_graph().layers)
        raw["strategy"] = {"kind": "replicated_pipeline", "stages": [{"layers": layers, "replicas": 8}],
                           "micro_batches": 1}
        raw["parallelism"] = {"global_batch_size": 8, "zero_stage": zero_stage}
    return load_scenario(raw)


def _memory(sc):
    if sc.strategy is None or sc.strategy.kind == "spmd":
        return rank_memory(sc, 0)
    return get_kind(sc.strategy.kind).memory(sc)[1]


def _states(b) -> tuple[float, float, float]:
    return b.weights_bytes, b.gradients_bytes, b.optimizer_bytes


@pytest.mark.parametrize("training", SETTINGS, ids=lambda t: f"param-{t['param_dtype']}-grad-{t['grad_dtype']}")
@pytest.mark.parametrize("kind", ["replicated_pipeline", "subnetwork_dp", "per_layer"])
def test_the_data_parallel_plan_of_each_kind_holds_spmds_memory(kind, training):
    spmd = _memory(_with_training("spmd", training))
    other = _memory(_with_training(kind, training))
    assert _states(other) == pytest.approx(_states(spmd), rel=1e-12)
    if kind == "per_layer":
        # per_layer all-reduces each replica group's gradients flat after the backward (no DDP buckets,
        # per_layer/kind.py _flat_gradient_reduces): spmd's two buckets are its only difference
        buckets = 2 * _with_training("spmd", training).parallelism.gradient_bucket_mb * MIB
        assert other.total_bytes == pytest.approx(spmd.total_bytes - buckets, rel=1e-12)
    else:
        assert other.total_bytes == pytest.approx(spmd.total_bytes, rel=1e-3)


def test_the_fields_move_the_model_state_as_stated():
    # GPT-1.7B: fp32 parameters double the weights and take the 16-bit copy out of the optimizer
    # state (2 / 12 -> 4 / 8 B); bf16 gradients halve auto's fp32 ones (4 -> 2 B)
    for kind in ("per_layer", "replicated_pipeline"):
        auto = _states(_memory(_with_training(kind, {})))
        fp32 = _states(_memory(_with_training(kind, {"param_dtype": "fp32"})))
        bf16 = _states(_memory(_with_training(kind, {"grad_dtype": "bf16"})))
        assert fp32[0] == pytest.approx(2 * auto[0]) and fp32[2] == pytest.approx(auto[2] * 8 / 12)
        assert bf16[1] == pytest.approx(auto[1] / 2)


def test_dapple_zero_1_shards_the_optimizer_state_as_spmd():
    for training in ({}, {"param_dtype": "fp32"}):
        spmd = _memory(_with_training("spmd", training, zero_stage=1))
        dapple = _memory(_with_training("replicated_pipeline", training, zero_stage=1))
        assert _states(dapple) == pytest.approx(_states(spmd), rel=1e-12)


@pytest.mark.parametrize("training", SETTINGS, ids=lambda t: f"param-{t['param_dtype']}-grad-{t['grad_dtype']}")
def test_mgrit_ranks_count_their_parameters_with_the_shared_helper(training):
    raw = yaml.safe_load((ROOT / "examples" / "gpt-1.7b-layer-parallel-mgrit-a100.yaml").read_text())
    raw["training"] = {**raw.get("training", {}), "precision": "bf16", **training}
    sc = load_scenario(raw)
    chain = chain_of(sc)
    for rank in range(chain.ranks):
        expected = model_state_bytes(rank_params(chain, rank), 0, 1, "bf16", sc.training.optimizer,
                                     gradient_bytes(sc.training), training["param_dtype"] == "fp32")
        assert _states(rank_memory_mgrit(sc, chain, rank)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_per_layer_refuses_zero_in_one_line_naming_the_field(zero_stage):
    # per_layer once took any ZeRO stage, printed it on its layout line ("zero=3") and held the same
    # unsharded state: VGG-16's example 1.793 GiB at ZeRO 0, 1 and 3
    done = subprocess.run([sys.executable, "-m", "simulator", "simulate", "examples/vgg16-per-layer-8xa100.yaml",
                           "--set", f"parallelism.zero_stage={zero_stage}"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"clustersim: error: parallelism.zero_stage: per_layer does not shard model state over a layer's replicas "
        f"(ZeRO), got {zero_stage}: each layer's weights, gradients and optimizer state are cut by its own split's "
        "channel, head and reduction parts only; use 0, or the spmd kind for ZeRO")


def test_a_per_layer_plan_drops_a_stated_zero_stage_and_says_so():
    raw = yaml.safe_load((ROOT / "examples" / "vgg16-per-layer-8xa100.yaml").read_text())
    raw["parallelism"]["zero_stage"] = 1
    result = get_planner("pase").run(raw, {})
    assert "zero_stage" not in result.scenario["parallelism"]
    assert result.step_time_s is not None
    assert ("# the per-layer kind does not shard model state (ZeRO); the scenario's zero_stage: 1 was dropped "
            "for this plan\n") in result.header()
    raw["parallelism"]["zero_stage"] = 0  # nothing dropped: no such line
    assert "ZeRO" not in get_planner("pase").run(raw, {}).header()
