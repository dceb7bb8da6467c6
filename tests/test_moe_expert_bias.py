"""Megatron-Core's kernels for clamped GLU inputs and biased experts (workloads/graph.py
``_expert_bias_and_clamp``): bytes and launches counted by hand, priced with one launch overhead each, and
absent from every model without a clamp or expert biases."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import ComputeModel
from workloads.catalog import resolve_model
from workloads.graph import Op, ShardShape, layer_work
from workloads.hf_config import spec_from_hf_config
from workloads.schema import TransformerSpec

TINY = {"name": "tiny-oss", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 96,
        "gated_mlp": True, "vocab_size": 256, "seq_length": 128, "linear_bias": True,
        "moe": {"num_experts": 8, "top_k": 2, "activation_clamp": 7.0}}


def _ops(model: TransformerSpec, ep: int = 2) -> tuple[dict[str, Op], dict[str, Op]]:
    work = layer_work(model, ShardShape(micro_batch=1, seq_length=128, ep=ep, flash_attention=True), 0)
    return {op.name: op for op in work.forward}, {op.name: op for op in work.backward}


def test_clamp_and_bias_kernels_counted_by_hand():
    fwd, bwd = _ops(TransformerSpec.model_validate(TINY))
    # 128 tokens x top-2 = 256 copies; ep 2: the rank's 4 experts get 256 x 2 / 8 = 64 each, 256 rows in all
    rows, ffn, h, e, experts = 256, 96, 64, 2, 4
    clamp, bias = fwd["expert_act_clamp"], fwd["expert_fc2_bias"]
    assert (clamp.bytes_moved, clamp.kernels) == (8 * rows * ffn * e, 3)          # two clamps + the cat
    assert (bwd["expert_act_clamp.grad"].bytes_moved, bwd["expert_act_clamp.grad"].kernels) == (
        10 * rows * ffn * e, 3)                                                    # two clamp grads + chunk's cat
    assert (bias.bytes_moved, bias.kernels) == ((24 + 2 * e) * rows * h, 2 * experts + 2)
    assert (bwd["expert_fc2_bias.grad"].bytes_moved, bwd["expert_fc2_bias.grad"].kernels) == (
        (32 + 4 * e) * rows * h, 5 * experts + 2)
    names = list(fwd)
    assert names.index("expert_fc1") < names.index("expert_act_clamp") < names.index("expert_act")
    assert names.index("expert_fc2") < names.index("expert_fc2_bias") < names.index("moe_combine.all_to_all")
    assert clamp.flops == bias.flops == clamp.params == bias.params == 0


def test_no_such_kernels_without_a_clamp_or_expert_biases():
    unclamped = TransformerSpec.model_validate({**TINY, "moe": {"num_experts": 8, "top_k": 2}})
    fwd, _ = _ops(unclamped)
    assert "expert_act_clamp" not in fwd and "expert_fc2_bias" in fwd
    fwd, _ = _ops(TransformerSpec.model_validate({**TINY, "linear_bias": False, "moe": {"num_experts": 8,
                                                                                          "top_k": 2}}))
    assert not {"expert_act_clamp", "expert_fc2_bias"} & set(fwd)
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):  # no catalog MoE but GPT-OSS has either
        fwd, bwd = _ops(resolve_model(name), ep=8)
        assert all(op.kernels == 1 and op.backward_bytes is None for op in (*fwd.values(), *bwd.values()))


def test_a_loop_of_kernels_pays_a_launch_each():
    compute = ComputeModel(ACCELERATORS.get("h100-sxm-80g"), "bf16")
    one = Op("x", "memory", 0.0, 1e8)
    loop = Op("x", "memory", 0.0, 1e8, kernels=34)
    assert compute.time_s(loop) - compute.time_s(one) == pytest.approx(33 * compute.launch_s)
    assert compute.launch_s > 0


def test_gpt_oss_clamps_at_its_swiglu_limit():
    assert resolve_model("gpt-oss-120b").moe.activation_clamp == 7.0
    hf = {"model_type": "gpt_oss", "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 96,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_local_experts": 8,
          "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 512}
    assert spec_from_hf_config(hf).moe.activation_clamp == 7.0            # GptOssConfig's default
    assert spec_from_hf_config({**hf, "swiglu_limit": 5.5}).moe.activation_clamp == 5.5
    with pytest.raises(ValidationError):
        TransformerSpec.model_validate({**TINY, "moe": {"num_experts": 8, "top_k": 2, "activation_clamp": 0}})


def test_the_clamped_concatenation_is_kept_for_the_backward():
    from workloads.transformer_graph import block_saved_tensors

    shard = ShardShape(micro_batch=1, seq_length=128, ep=2, flash_attention=True)
    clamped = {x.name: x.nbytes for x in block_saved_tensors(TransformerSpec.model_validate(TINY), shard, True, False)}
    plain = {x.name: x.nbytes for x in block_saved_tensors(
        TransformerSpec.model_validate({**TINY, "moe": {"num_experts": 8, "top_k": 2}}), shard, True, False)}
    assert clamped.pop("expert_act_clamped_input") == 2 * 2 * 128 * (2 * 96)  # 2e x tokens x top-2 x ffn 96
    assert clamped == plain
