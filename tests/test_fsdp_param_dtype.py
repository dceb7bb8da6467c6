"""FSDP's parameter dtype in the validation rows and what it changes (issue 23).

PyTorch FSDP1 (Composer / llm-foundry, IBM fms) and FSDP2 (torchtitan) keep the sharded parameters in fp32 and cast
only the gathered copy to bf16 (``MixedPrecision`` / ``MixedPrecisionPolicy(param_dtype=bf16)`` over a model built
in fp32): ``training.param_dtype: fp32``. Hand counts on the planner tests' small GPT (tests/test_plan.py): a layer
789,760 parameters, embedding 327,680, final norm and head 262,656, total 3,749,376, on 8 ranks of ZeRO-3.
"""

from __future__ import annotations

import pytest

from simulator.memory.analytic import MIB, rank_memory
from simulator.scenario import load_scenario
from simulator.strategies.spmd.plan import Planner

SMALL = dict(name="small-gpt", num_layers=4, hidden_size=256, num_attention_heads=8, vocab_size=1024,
             seq_length=256)
P_LAYER = 789_760
P_TOTAL = 3_749_376


def fsdp_row(param_dtype: str, copies="fsdp1", grad_dtype="fp32", precision="bf16"):
    """A toy FSDP row as validation/modern/llmfoundry.py maps a FULL_SHARD row: ZeRO-3 over 8 A100s, bf16."""
    return load_scenario(dict(
        model=SMALL, cluster=dict(node="dgx-a100-80g", fabric="fat-tree", num_gpus=8),
        parallelism=dict(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1, global_batch_size=8,
                         zero_buffer_copies=copies),
        training=dict(precision=precision, grad_dtype=grad_dtype, param_dtype=param_dtype, attention="standard")))


def test_toy_fsdp_row_memory_hand_counted():
    fp32 = rank_memory(fsdp_row("fp32"), 0)
    # the fp32 shard is the parameter: 4 B / 8 ranks, no bf16 copy beside it; Adam's two moments 8 B / 8;
    # fp32 reduced gradients 4 B / 8
    assert fp32.weights_bytes == 4 * P_TOTAL / 8 == 1_874_688
    assert fp32.gradients_bytes == 4 * P_TOTAL / 8
    assert fp32.optimizer_bytes == 8 * P_TOTAL / 8 == 3_749_376
    # buffers: two DDP buckets of 25 MiB, and the gathered bf16 copies of the current and next layer, whole
    # (none of them is the shard counted in weights)
    assert fp32.other_bytes == 2 * 25 * MIB + 2 * P_LAYER * 2
    # the default (Megatron-LM / DeepSpeed): a bf16 shard beside the fp32 master in the optimizer state,
    # 2 + 12 B per parameter, and the gathered layers less the rank's own shard
    auto = rank_memory(fsdp_row("auto"), 0)
    assert auto.weights_bytes == 2 * P_TOTAL / 8
    assert auto.optimizer_bytes == 12 * P_TOTAL / 8
    assert auto.other_bytes == pytest.approx(2 * 25 * MIB + 2 * P_LAYER * 2 * (1 - 1 / 8), rel=1e-12)
    states = lambda m: m.weights_bytes + m.gradients_bytes + m.optimizer_bytes  # noqa: E731
    assert states(auto) - states(fp32) == 2 * P_TOTAL / 8  # the bf16 shard that FSDP does not keep


def _copy_in(plan):
    return next(t for t in plan.streams[("stage0", "dp")] if t.name == "F.mb0.c0.L1.zero3_copy_in")


@pytest.mark.parametrize("copies", ["fsdp1", True])
def test_copy_in_reads_the_fp32_shard(copies):
    # FSDP1: _mp_shard.copy_(_local_shard), one cast: read 4 B, write 2 B per element of the layer's shard
    # (torch fsdp/_flat_param.py _use_low_precision_shard). FSDP2: the cast into a flat bf16 buffer
    # (_get_param_all_gather_inputs' _foreach_copy_), then all_gather_copy_in's copy: 4 + 2, then 2 + 2.
    planner = Planner(fsdp_row("fp32", copies))
    compute = planner.compute_of(0)
    launch, bw = compute.launch_s, compute.mem_bw
    elements = P_LAYER / 8
    expected = launch + elements * (4 + 2) / bw
    if copies is True:
        expected += launch + elements * (2 + 2) / bw
    assert _copy_in(planner.build()).duration_s == pytest.approx(expected, rel=1e-12)
    # a 16-bit shard: the copy-in alone, as before (read 2 B, write 2 B)
    auto = Planner(fsdp_row("auto", copies))
    assert _copy_in(auto.build()).duration_s == pytest.approx(launch + elements * 4 / bw, rel=1e-12)


def test_validation_rows_map_fsdp_parameter_dtype():
    from validation.modern import llmfoundry, other, torchtitan

    foundry, _ = llmfoundry.cases()
    for case in foundry:
        zero = case.scenario["parallelism"]["zero_stage"]
        # FULL_SHARD: the fp32 shard; SHARD_GRAD_OP keeps the default (the simulator's ZeRO-2 holds the weights whole)
        assert case.scenario["training"].get("param_dtype", "auto") == ("fp32" if zero == 3 else "auto"), case.label
    assert {c.scenario["parallelism"]["zero_stage"] for c in foundry} == {2, 3}
    titan, _ = torchtitan.cases()
    assert titan and all(c.scenario["training"]["param_dtype"] == "fp32" for c in titan)
    fms = [c for c in other.cases()[0] if c.profile_group.startswith("fms-fsdp")]
    assert fms and all(c.scenario["parallelism"]["zero_buffer_copies"] == "fsdp1"
                       and c.scenario["training"]["param_dtype"] == "fp32" for c in fms)


def test_mpt30b_8k_row_holds_no_bf16_shard():
    # llm-foundry row 79 (MPT-30B, 8 A100 80 GB, s8192, FULL_SHARD): 4 + 8 B per parameter over 8 ranks
    from simulator.memory.analytic import peak_rank_memory, stage_params
    from validation.modern import llmfoundry

    case = next(c for c in llmfoundry.cases()[0] if c.row == 79)
    sc = load_scenario(case.scenario)
    params = stage_params(sc.model, sc.parallelism, 0)
    _, peak, _ = peak_rank_memory(sc)
    assert peak.weights_bytes == pytest.approx(4 * params / 8, rel=1e-9)
    assert peak.optimizer_bytes == pytest.approx(8 * params / 8, rel=1e-9)
    assert 65 < peak.total_gib < 67  # 72.8 GiB with a bf16 shard beside the fp32 master


@pytest.mark.parametrize("precision, grad_dtype", [("bf16", "bf16"), ("bf16", "fp32"), ("bf16", "auto"),
                                                   ("fp16", "auto"), ("fp16", "fp16")])
def test_fsdp_keeps_the_sharded_gradient_in_the_parameters_dtype(precision, grad_dtype):
    # Composer's PURE / FSDP's reduce_dtype=bf16 reduces in bf16, then casts the shard back to the fp32 parameter's
    # dtype before accumulating it for the optimizer (torch 2.13 fsdp/_runtime_utils.py _accumulate_sharded_grad ->
    # _cast_grad_to_param_dtype; FSDP2 _fsdp_collectives.py foreach_reduce: _to_dtype_if_needed(reduce_output,
    # orig_dtype)). Toy row, hand counted: 3,749,376 parameters on 8 ranks of ZeRO-3 hold 4 B / 8 each of fp32
    # gradient = 1,874,688 B, whatever grad_dtype says (it only sets what the reduce-scatter moves)
    from simulator.memory.vectorised import stage_memories

    row = fsdp_row("fp32", grad_dtype=grad_dtype, precision=precision)
    analytic = rank_memory(row, 0)
    assert analytic.gradients_bytes == 4 * P_TOTAL / 8 == 1_874_688
    assert analytic.weights_bytes == 4 * P_TOTAL / 8 and analytic.optimizer_bytes == 8 * P_TOTAL / 8
    vectorised = stage_memories(row)[0]
    assert vectorised.gradients_bytes == analytic.gradients_bytes
    assert vectorised.total_bytes == pytest.approx(analytic.total_bytes, rel=1e-12)
    # the 16-bit default (Megatron-LM / DeepSpeed) holds the gradient in grad_dtype: bf16 or fp16 at 2 B / 8
    auto = fsdp_row("auto", grad_dtype=grad_dtype, precision=precision)
    held = 2 if grad_dtype in ("bf16", "fp16") or (grad_dtype == "auto" and precision == "fp16") else 4
    assert rank_memory(auto, 0).gradients_bytes == held * P_TOTAL / 8
    # the reduce-scatter still moves grad_dtype's bytes (the planner's copy-out / reduce pricing reads it)
    from simulator.scenario import gradient_bytes
    assert gradient_bytes(row.training) == held


def test_held_gradient_bytes_param_dtype_wins():
    from simulator.memory.analytic import bytes_per_param, held_gradient_bytes, model_state_bytes

    assert bytes_per_param("bf16", "adam", fp32_params=True) == {"weights": 4, "gradients": 4, "optimizer": 8}
    assert bytes_per_param("bf16", "adam") == {"weights": 2, "gradients": 2, "optimizer": 12}
    for grad in (None, 2, 4):
        assert held_gradient_bytes(grad, "bf16", "adam", fp32_params=True) == 4
    assert held_gradient_bytes(2, "bf16", "adam") == 2 and held_gradient_bytes(None, "bf16", "adam") == 2
    # 1,000 parameters, ZeRO-2 over 4: gradients 4 B / 4 with fp32 parameters even when bf16 is reduced
    assert model_state_bytes(1000, 2, 4, "bf16", "adam", 2, fp32_params=True) == (4000, 1000, 2000)
    assert model_state_bytes(1000, 2, 4, "bf16", "adam", 2) == (2000, 500, 3000)
