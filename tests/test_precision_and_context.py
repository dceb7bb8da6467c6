"""FP8 GEMM pricing and context-parallel ring attention: exact volumes and times on toy specs."""

from __future__ import annotations

import pytest

from hardware_specs.schema import Accelerator
from simulator.cost.compute import ComputeModel
from workloads.graph import ShardShape, layer_work
from workloads.schema import TransformerSpec

ACC = Accelerator.model_validate(dict(
    name="toy", vendor="toy", peak_tflops={"bf16": 100.0, "fp8": 200.0}, hbm_gib=80, hbm_bandwidth_gb_per_s=1000,
    tdp_watts=700, source="toy",
    efficiency=dict(gemm_curve=[{"gflop": 1, "efficiency": 0.5}], memory_bound_efficiency=1.0,
                    attention_efficiency_factor=1.0, kernel_launch_overhead_us=0, source="toy")))
MODEL = TransformerSpec(name="toy", num_layers=2, hidden_size=1024, num_attention_heads=8, vocab_size=1000,
                        seq_length=4096)


def test_fp8_gemm_runs_at_fp8_peak_plus_input_casts():
    shard = ShardShape(micro_batch=1, seq_length=4096, precision="fp8")
    gemm = next(op for op in layer_work(MODEL, shard).forward if op.name == "fc1")
    # fc1: m = 4096 tokens, n = 4096, k = 1024 -> 2·m·n·k FLOPs at 0.5 x 200 TFLOP/s; the casts read
    # 2 B and write 1 B per element of both inputs (m·k + k·n) at 1000 GB/s.
    m, n, k = 4096, 4096, 1024
    compute_s = 2 * m * n * k / (0.5 * 200e12)
    bytes_s = 2 * (m * k + k * n + m * n) / 1000e9
    cast_s = (m * k + k * n) * 3 / 1000e9
    fp8 = ComputeModel(ACC, "fp8").time_s(gemm)
    assert fp8 == pytest.approx(max(compute_s, bytes_s) + cast_s, rel=1e-12)
    bf16 = ComputeModel(ACC, "bf16").time_s(gemm)
    assert bf16 == pytest.approx(2 * m * n * k / (0.5 * 100e12), rel=1e-12)
    assert fp8 < bf16


def test_fp8_attention_stays_at_the_bf16_peak():
    shard = ShardShape(micro_batch=1, seq_length=4096, precision="fp8", flash_attention=True)
    attention = next(op for op in layer_work(MODEL, shard).forward if op.kind == "attention")
    # causal FlashAttention at s = 4096 runs 1/2 + 1/(2*32) of the counted FLOPs (32 tiles of 128)
    assert attention.executed_fraction == 0.5 + 0.5 / 32
    expected = attention.flops * attention.executed_fraction / (0.5 * 100e12)
    assert ComputeModel(ACC, "fp8").time_s(attention) == pytest.approx(max(expected, attention.bytes_moved / 1e12))


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_attention_passes_kv_cp_minus_one_hops(cp):
    shard = ShardShape(micro_batch=2, seq_length=4096, cp=cp)
    work = layer_work(MODEL, shard)
    ring = [op for op in work.forward if op.group == "cp"]
    # one K and one V chunk of b·(s/cp)·kv_heads·head_dim 16-bit elements, overlapping the next kernel
    assert len(ring) == 1 and ring[0].collective == "ring_pass" and ring[0].overlaps_next
    assert ring[0].comm_bytes == 2 * 2 * (4096 // cp) * 8 * 128 * 2
    back = [op for op in work.backward if op.group == "cp"]
    assert len(back) == 1 and back[0].comm_bytes == 2 * ring[0].comm_bytes
    nxt = work.backward[work.backward.index(back[0]) + 1]
    assert nxt.kind == "attention"  # the backward ring overlaps the attention gradient


MOE = TransformerSpec(name="toy-moe", num_layers=2, hidden_size=1024, num_attention_heads=8, vocab_size=1000,
                      seq_length=4096, gated_mlp=True, ffn_hidden_size=2048,
                      moe={"num_experts": 8, "top_k": 2})


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_moe_layer_has_two_all_to_alls_of_top_k_tokens(ep):
    shard = ShardShape(micro_batch=1, seq_length=4096, ep=ep, moe_load_imbalance=1.5)
    work = layer_work(MOE, shard)
    a2a = [op for op in work.forward if op.collective == "all_to_all"]
    # dispatch and combine: every token's hidden vector goes to its top-2 experts: s·k·h·2 bytes
    assert [op.name for op in a2a] == ["moe_dispatch.all_to_all", "moe_combine.all_to_all"]
    assert all(op.comm_bytes == 4096 * 2 * 1024 * 2 and op.group == "ep" for op in a2a)
    assert sum(op.collective == "all_to_all" for op in work.backward) == 2
    fc1 = next(op for op in work.forward if op.name == "expert_fc1")
    # 8/ep local experts, each gets s·k·ep/E tokens x 1.5 imbalance; SwiGLU: 2·ffn columns
    assert (fc1.batch, fc1.m, fc1.n, fc1.k) == (8 // ep, round(4096 * 2 * ep / 8 * 1.5), 2 * 2048, 1024)


def test_moe_model_flops_count_only_the_active_experts():
    from workloads.counting import step_flops

    flops = step_flops(MOE, 4096, 1, "none")
    dense = TransformerSpec(name="dense", num_layers=2, hidden_size=1024, num_attention_heads=8, vocab_size=1000,
                            seq_length=4096, gated_mlp=True, ffn_hidden_size=2 * 2048)
    router = 3 * 2 * 2 * 4096 * 8 * 1024  # 3 passes x 2 layers x router GEMM
    assert flops.model_flops == pytest.approx(step_flops(dense, 4096, 1, "none").model_flops + router, rel=1e-9)


def test_fp8_gemm_classes_choose_which_gemms_run_in_fp8():
    from workloads.graph import head_work

    shard = ShardShape(micro_batch=1, seq_length=4096, precision="fp8")
    head = next(op for op in head_work(MODEL, shard).forward if op.name == "lm_head")
    fc1 = next(op for op in layer_work(MODEL, shard).forward if op.name == "fc1")
    default = ComputeModel(ACC, "fp8")  # attention_proj, mlp, experts in FP8; LM head in bf16
    assert default.time_s(head) == pytest.approx(max(head.flops / (0.5 * 100e12), head.bytes_moved / 1e12))
    everything = ComputeModel(ACC, "fp8", ["attention_proj", "mlp", "experts", "lm_head"])
    assert everything.time_s(head) < default.time_s(head)
    assert ComputeModel(ACC, "fp8", ["attention_proj"]).time_s(fc1) == pytest.approx(
        ComputeModel(ACC, "bf16").time_s(fc1))
    # a backward GEMM belongs to its forward op's class
    fc1_dgrad = next(op for op in layer_work(MODEL, shard).backward if op.name == "fc1.dgrad")
    assert default.time_s(fc1_dgrad) < ComputeModel(ACC, "fp8", []).time_s(fc1_dgrad)
