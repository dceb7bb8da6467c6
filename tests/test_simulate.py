"""simulate() end to end: exact step times on a toy cluster, agreement of symmetric/full mode and
of detail/coarse granularity, the time breakdown, and the reported metrics' definitions."""

from __future__ import annotations

import copy
import math

import pytest

from simulator.report.result import BREAKDOWN_KEYS
from simulator.scenario import load_scenario
from simulator.simulate import simulate, simulate_point
from simulator.strategies.spmd.layout import split_layers
from simulator.strategies.spmd.plan import Planner
from validation.closed_forms import korthikanti_model_flops, narayanan_flops_with_recompute
from workloads.counting import total_params

# ------------------------------------------------------------------ toy cluster with round numbers
#
# Model: GPT, L = 4 layers, h = 256, 4 heads (head dim 64), s = 256, V = 8, micro-batch 1.
# One layer forward = 24·s·h² + 4·s²·h = 469,762,048 FLOP (QKV 6sh², QK^T and AV 2s²h each,
# out 2sh², FC1 and FC2 8sh² each), backward twice that (dgrad + wgrad).
# Accelerator: every layer GEMM (>= 0.008 GFLOP) runs at E = peak·EFF = 5e8 TFLOP/s · 1e-9 = 5e11 FLOP/s;
# the tiny LM head (<= 0.002 GFLOP) at the full 5e20 FLOP/s (~1e-15 s); HBM 1e12 GB/s (memory-bound
# kernels ~1e-18 s); no launch overhead. So a layer's forward takes 469,762,048 / 5e11 = 939.524096 us.
# Node: 8 GPUs; NVLink bandwidth and latency set per test.

H, S, HEADS, V, L = 256, 256, 4, 8, 4
E = 5e11
LAYER_FWD_FLOPS = 24 * S * H * H + 4 * S * S * H
T_LAYER = LAYER_FWD_FLOPS / E
TOY_PARAMS = 3_229_184  # 4·(12h² + 13h) + (V·h + s·h) + (2h + V·h), see test_toy_parameter_count


def toy_raw(num_gpus: int, nvl_gb_per_s: float = 1e12, nvl_latency_us: float = 0.0, **parallelism) -> dict:
    accelerator = dict(
        name="toy-gpu", vendor="toy", peak_tflops={"bf16": 5e8}, hbm_gib=1e6, hbm_bandwidth_gb_per_s=1e12,
        tdp_watts=1,
        efficiency=dict(gemm_curve=[{"gflop": 0.002, "efficiency": 1.0}, {"gflop": 0.008, "efficiency": 1e-9}],
                        memory_bound_efficiency=1.0, attention_efficiency_factor=1.0,
                        kernel_launch_overhead_us=0, source="toy"),
        source="toy")
    node = dict(name="toy-node", accelerator=accelerator, gpus_per_node=8,
                intra_node=dict(kind="nvswitch", bandwidth_per_gpu_gb_per_s=nvl_gb_per_s, latency_us=nvl_latency_us,
                                collective_efficiency=1.0, source="toy"),
                nics_per_node=8, nic_bandwidth_gbit_per_s=1e12, nic_efficiency=1.0, nic_latency_us=0,
                host_memory_gib=1, source="toy")
    # make_vocab_size_divisible_by 1: the tiny head's 8 rows unpadded (Megatron's 128 would make it a layer-size GEMM)
    model = dict(name="toy-gpt", num_layers=L, hidden_size=H, num_attention_heads=HEADS, vocab_size=V, seq_length=S,
                 make_vocab_size_divisible_by=1)
    par = dict(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1)
    par.update(parallelism)
    return dict(model=model, cluster=dict(node=node, fabric=dict(name="toy-fabric", levels=1, switch_latency_us=0,
                                                                   source="toy"), num_gpus=num_gpus),
                parallelism=par, training=dict(grad_dtype="bf16", attention="standard"))  # hand derivations:
    # 2-byte gradients, the QK^T and AV products as GEMMs (the materialised softmax)


def toy(num_gpus: int, **kw):
    return load_scenario(toy_raw(num_gpus, **kw))


MODES = [("symmetric", False), ("symmetric", True), ("full", False), ("full", True)]


def test_toy_parameter_count():
    # per layer: QKV 3h² + 3h, out h² + h, FC1 4h² + 4h, FC2 4h² + h, two layernorms 4h -> 12h² + 13h = 789,760;
    # embedding V·h + s·h (learned positions) = 2,048 + 65,536; final norm 2h + untied head V·h = 512 + 2,048.
    assert total_params(toy(1).model) == 4 * 789_760 + 67_584 + 2_560 == TOY_PARAMS


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_single_gpu_step_is_m_times_forward_plus_backward(mode, detail):
    # tp = pp = dp = 1, m = 3: step = 3·(f + 2f), f = L·t_layer; the optimizer streams 3.2M params
    # at 1e21 B/s (~1e-13 s).
    r = simulate(toy(1, global_batch_size=3), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(3 * 3 * L * T_LAYER, rel=1e-9)
    assert r.time_breakdown_s["compute"] == pytest.approx(r.step_time_s, rel=1e-9)


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_data_parallel_all_reduce_after_the_backward(mode, detail):
    # dp = 2 in one node, no overlap of the gradient reduction: after m = 3 micro-batches the
    # whole gradient (P bf16 = 2P bytes) is all-reduced over n = 2 ranks on NVLink B = 100 GB/s,
    # latency 1 us: t = 2(n-1)·1 us + 2(n-1)/n · 2P / B = 2 us + 2·3,229,184 / 1e11 s = 66.58368 us.
    t_dp = 2e-6 + 2 * TOY_PARAMS / 100e9
    r = simulate(toy(2, nvl_gb_per_s=100, nvl_latency_us=1, dp=2, global_batch_size=6, overlap_grad_reduce=False),
                 mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(3 * 3 * L * T_LAYER + t_dp, rel=1e-9)
    assert r.time_breakdown_s["dp_comm"] == pytest.approx(t_dp, rel=1e-6)


# TP = 2 (half of every GEMM per rank, so a layer's forward takes t_layer/2) on NVLink with
# latency α = 100 us and 1e12 GB/s: one all-reduce of the b·s·h·2 = 128 KiB activation over
# 2 ranks costs t_ar = 2(t-1)·α + bus/B = 200 us (+1e-16 s).
# Per micro-batch: forward 2 all-reduces per layer (after attn_out and FC2) + 1 for the
# vocab-parallel embedding + 3 for the vocab-parallel cross-entropy (max, target logit, sum of
# exponentials: b·s fp32 each, same 200 us); backward 2 per layer (input gradients of QKV and
# FC1) + 1 (LM head).
T_AR = 200e-6 + (S * H * 2) / 1e21


def _tp_raw(overlap: bool, dp: int = 1) -> dict:
    return toy_raw(2 * dp, nvl_gb_per_s=1e12, nvl_latency_us=100, tp=2, dp=dp, global_batch_size=3 * dp,
                   overlap_tp_grad_comm=overlap, overlap_grad_reduce=False)


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_tensor_parallel_collectives_without_overlap(mode, detail):
    # Every collective exposed: per micro-batch 3·L·t_layer/2 of kernels + (4L + 5)·t_ar.
    r = simulate(load_scenario(_tp_raw(overlap=False)), mode=mode, detail=detail)
    assert r.time_breakdown_s["tp_comm"] == pytest.approx(3 * (4 * L + 5) * T_AR, rel=1e-9)
    assert r.step_time_s == pytest.approx(3 * (1.5 * L * T_LAYER + (4 * L + 5) * T_AR), rel=1e-9)


# With overlap (Megatron's async TP grad comm) each input-gradient all-reduce runs beside the
# weight-gradient GEMM that follows it and only max(0, t_ar - t_wgrad) stays exposed:
#   QKV wgrad: 2·s·(3h/2)·h / E = 50,331,648 / 5e11 = 100.663296 us -> 99.336704 us exposed;
#   FC1 wgrad: 2·s·(4h/2)·h / E = 67,108,864 / 5e11 = 134.217728 us -> 65.782272 us exposed;
#   LM head wgrad: 2·s·(V/2)·h / 5e20 = ~1e-15 s -> t_ar exposed.
T_QKV_W = 2 * S * (3 * H // 2) * H / E
T_FC1_W = 2 * S * (4 * H // 2) * H / E
T_HEAD_W = 2 * S * (V // 2) * H / 5e20
TP_EXPOSED_OVERLAP = 3 * (2 * L * T_AR + 4 * T_AR + L * ((T_AR - T_QKV_W) + (T_AR - T_FC1_W)) + (T_AR - T_HEAD_W))


@pytest.mark.parametrize(("mode", "detail"), [
    ("symmetric", False),
    ("symmetric", True),
    ("full", False),
    ("full", True),
])
def test_tensor_parallel_overlap_exposes_only_what_the_wgrad_gemm_cannot_hide(mode, detail):
    r = simulate(load_scenario(_tp_raw(overlap=True)), mode=mode, detail=detail)
    assert r.time_breakdown_s["tp_comm"] == pytest.approx(TP_EXPOSED_OVERLAP, rel=1e-9)
    assert r.step_time_s == pytest.approx(3 * 1.5 * L * T_LAYER + TP_EXPOSED_OVERLAP, rel=1e-9)


def test_tensor_parallel_overlap_with_dp_in_the_same_node():
    # tp = 2, dp = 2 on 4 GPUs of one node; DP reduces after the backward (no overlap):
    # step = the TP-only step + one gradient all-reduce over 2 ranks: 2·100 us + 2P/2 bytes / 1e21 B/s.
    t_dp = 200e-6 + TOY_PARAMS / 1e21
    r = simulate(load_scenario(_tp_raw(overlap=True, dp=2)), mode="symmetric", detail=False)
    assert r.step_time_s == pytest.approx(3 * 1.5 * L * T_LAYER + TP_EXPOSED_OVERLAP + t_dp, rel=1e-9)


# ------------------------------------------------------------------ symmetric vs full, detail vs coarse
# A small GPT on DGX A100 nodes (8 GPUs, NVSwitch, 8x HDR NICs): 4 layers, h = 256, 8 heads, s = 256.

SMALL = dict(name="small-gpt", num_layers=4, hidden_size=256, num_attention_heads=8, vocab_size=1024,
             seq_length=256)


def a100(num_gpus: int, model: dict | None = None, **parallelism):
    par = dict(micro_batch_size=1, global_batch_size=16)
    par.update(parallelism)
    return load_scenario(dict(model=model or SMALL, cluster=dict(node="dgx-a100-80g", fabric="fat-tree",
                                                                  num_gpus=num_gpus), parallelism=par,
                              # the checks below count the QK^T / AV GEMMs of the materialised softmax
                              training=dict(attention="standard")))


SYMMETRIC_LAYOUTS = [
    (16, dict(tp=2, pp=2, dp=4)),
    (8, dict(tp=1, pp=1, dp=8)),
    (16, dict(tp=2, pp=2, dp=4, zero_stage=1)),
    (16, dict(tp=2, pp=2, dp=4, zero_stage=3)),
    (8, dict(tp=1, pp=1, dp=8, zero_stage=1)),
    (8, dict(tp=1, pp=1, dp=8, zero_stage=3)),
    (16, dict(tp=1, pp=2, dp=8, zero_stage=2)),
    (16, dict(tp=4, pp=2, dp=2, sequence_parallel=True)),
    (16, dict(tp=2, pp=2, dp=4, schedule="interleaved", virtual_stages=2)),
    (16, dict(tp=2, pp=4, dp=2, schedule="gpipe", recompute="full")),
    (16, dict(tp=1, pp=4, dp=4)),
]


@pytest.mark.parametrize(("num_gpus", "par"), SYMMETRIC_LAYOUTS)
def test_symmetric_and_full_mode_agree(num_gpus, par):
    sc = a100(num_gpus, **par)
    sym = simulate(sc, mode="symmetric")
    full = simulate(sc, mode="full")
    assert full.step_time_s == pytest.approx(sym.step_time_s, rel=1e-9)
    assert sym.mode == "symmetric" and full.mode == "full"


def test_symmetric_and_full_mode_agree_tp8_pp2():
    sc = a100(16, tp=8, pp=2, dp=1)
    assert simulate(sc, mode="full").step_time_s == pytest.approx(simulate(sc, mode="symmetric").step_time_s,
                                                                  rel=1e-9)


NO_CONTENTION = [
    (8, dict(tp=1, pp=1, dp=8)),
    (16, dict(tp=1, pp=4, dp=4)),
    (16, dict(tp=1, pp=2, dp=8, zero_stage=1)),
    (16, dict(tp=8, pp=2, dp=1)),  # TP has its node's NVLink to itself
    (8, dict(tp=8, pp=1, dp=1, sequence_parallel=True)),
]


@pytest.mark.parametrize(("num_gpus", "par"), NO_CONTENTION)
def test_detail_and_coarse_agree_without_contention(num_gpus, par):
    sc = a100(num_gpus, **par)
    coarse = simulate(sc, detail=False)
    fine = simulate(sc, detail=True)
    assert fine.step_time_s == pytest.approx(coarse.step_time_s, rel=1e-9)


def test_detail_and_coarse_agree_tp2_dp_in_node():
    sc = a100(16, tp=2, pp=2, dp=4)
    assert simulate(sc, detail=True).step_time_s == pytest.approx(simulate(sc, detail=False).step_time_s, rel=1e-9)


def test_detail_and_coarse_agree_zero3():
    sc = a100(8, tp=1, pp=1, dp=8, zero_stage=3)
    assert simulate(sc, detail=True).step_time_s == pytest.approx(simulate(sc, detail=False).step_time_s, rel=1e-9)


# ------------------------------------------------------------------ breakdown and metrics

BREAKDOWN_LAYOUTS = [
    (16, dict(tp=2, pp=2, dp=4)),
    (16, dict(tp=2, pp=2, dp=4, zero_stage=3)),
    (16, dict(tp=4, pp=2, dp=2, sequence_parallel=True, recompute="selective")),
    (16, dict(tp=1, pp=4, dp=4, schedule="interleaved", virtual_stages=1)),
    (16, dict(tp=2, pp=4, dp=2, schedule="gpipe", recompute="full")),
    (8, dict(tp=1, pp=1, dp=8, overlap_grad_reduce=False)),
]


@pytest.mark.parametrize(("num_gpus", "par"), BREAKDOWN_LAYOUTS)
@pytest.mark.parametrize("detail", [False, True])
def test_breakdown_sums_to_step_time(num_gpus, par, detail):
    r = simulate(a100(num_gpus, **par), detail=detail)
    assert set(r.time_breakdown_s) == set(BREAKDOWN_KEYS)
    assert all(v >= 0 for v in r.time_breakdown_s.values())
    assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert math.isfinite(r.step_time_s) and r.step_time_s > 0


def test_recompute_is_charged_to_recompute():
    # full recompute re-runs the whole forward: on one GPU, recompute time = the forward time f
    # per micro-batch; compute = f + 2f; step = 3·4f... (m = 3, toy cluster)
    r = simulate(toy(1, global_batch_size=3, recompute="full"))
    f = L * T_LAYER
    assert r.time_breakdown_s["recompute"] == pytest.approx(3 * f, rel=1e-9)
    assert r.time_breakdown_s["compute"] == pytest.approx(3 * 3 * f, rel=1e-9)
    assert r.step_time_s == pytest.approx(3 * 4 * f, rel=1e-9)


def test_throughput_and_utilisation_definitions():
    sc = a100(16, tp=2, pp=2, dp=4)
    r = simulate(sc)
    step = r.step_time_s
    gbs, seq = 16, 256
    assert r.tokens_per_step == gbs * seq
    assert r.tokens_per_s == pytest.approx(gbs * seq / step, rel=1e-12)
    # MFU = model FLOPs / (step · GPUs · peak); A100 bf16 dense peak 312 TFLOP/s.
    assert r.peak_tflops_per_gpu == 312
    assert r.mfu == pytest.approx(r.model_flops_per_step / (step * 16 * 312e12), rel=1e-12)
    assert r.model_tflops_per_gpu == pytest.approx(r.model_flops_per_step / (step * 16) / 1e12, rel=1e-12)
    # no recompute: hardware FLOPs = model FLOPs, HFU = MFU
    assert r.hardware_flops_per_step == r.model_flops_per_step
    assert r.hfu == pytest.approx(r.mfu, rel=1e-12)
    d = r.to_dict()
    assert d["mfu"] == r.mfu and d["tokens_per_s"] == r.tokens_per_s and d["step_time_s"] == step


def test_model_flops_equal_korthikanti_for_a_gpt():
    # 72·B·L·s·h²·(1 + s/(6h) + V/(12hL)) with B = 16, L = 4, s = 256, h = 256, V = 1024.
    r = simulate(a100(8, tp=1, pp=1, dp=8))
    expected = korthikanti_model_flops(16, 4, 256, 256, 1024)
    assert r.model_flops_per_step == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(72 * 16 * 4 * 256 * 256**2 * (1 + 256 / (6 * 256) + 1024 / (12 * 256 * 4)))


def test_hardware_flops_with_full_recompute_equal_narayanan():
    # Full recompute adds one forward of every layer: 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)).
    r = simulate(a100(8, tp=1, pp=1, dp=8, recompute="full"))
    assert r.hardware_flops_per_step == pytest.approx(narayanan_flops_with_recompute(16, 4, 256, 256, 1024),
                                                      rel=1e-12)
    assert r.hfu / r.mfu == pytest.approx(r.hardware_flops_per_step / r.model_flops_per_step, rel=1e-12)


def test_time_to_train():
    raw = dict(model=SMALL, cluster=dict(node="dgx-a100-80g", num_gpus=8),
               parallelism=dict(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=16),
               training=dict(tokens=1e9))
    r = simulate(load_scenario(raw))
    assert r.time_to_train_days == pytest.approx(1e9 / (16 * 256 / r.step_time_s) / 86400, rel=1e-12)
    assert simulate(a100(8, tp=1, pp=1, dp=8)).time_to_train_days is None  # no token count given


def test_layer_split_split_layers():
    assert split_layers(126, 16) == [7] + [8] * 14 + [7]
    assert split_layers(10, 4) == [2, 3, 3, 2]
    assert split_layers(8, 4) == [2, 2, 2, 2]
    assert split_layers(9, 4) == [2, 2, 3, 2]


def test_layer_split_reported_for_llama3_405b_on_16_stages():
    # 126 layers on 16 stages: 126 = 16·8 - 2, the two end stages (embedding, loss) take 7.
    sc = load_scenario(dict(model="llama3-405b", cluster=dict(node="dgx-h100", num_gpus=2048),
                            parallelism=dict(tp=8, pp=16, micro_batch_size=1, global_batch_size=2048)))
    assert Planner(sc).layers_per_chunk == [7] + [8] * 14 + [7]


def test_layer_split_reported_by_simulate_for_uneven_layers():
    model = dict(SMALL, num_layers=10)
    r = simulate(a100(4, model=model, tp=1, pp=4, dp=1, global_batch_size=8))
    assert r.layer_split == [2, 3, 3, 2]
    assert r.to_dict()["layer_split"] == [2, 3, 3, 2]


def test_out_of_memory_is_a_result_not_an_error():
    # GPT-3 175B (174.6B params) unsharded on one A100: 16 bytes/param of model state alone is ~2.6 TiB.
    raw = dict(model="gpt3-175b", cluster=dict(node="dgx-a100-80g", num_gpus=8),
               parallelism=dict(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8))
    row = simulate_point(raw)
    assert row["fits"] is False
    assert "GiB" in row["infeasible_reason"]
    assert row["step_time_s"] is None  # sweeps do not time OOM layouts by default
    r = simulate(load_scenario(raw), run_if_oom=False)
    assert r.fits is False and r.step_time_s is None and r.tokens_per_s is None and r.mfu is None
    assert r.peak_memory_gib > 80


def test_simulate_point_turns_bad_input_into_a_row():
    raw = dict(model=SMALL, cluster=dict(node="dgx-a100-80g", num_gpus=8),
               parallelism=dict(tp=3, micro_batch_size=1, global_batch_size=16))
    row = simulate_point(raw)
    assert row["fits"] is False and row["step_time_s"] is None
    assert "parallelism" in row["infeasible_reason"]


def test_simulate_point_of_a_good_layout():
    raw = dict(model=SMALL, cluster=dict(node="dgx-a100-80g", num_gpus=8),
               parallelism=dict(tp=2, micro_batch_size=1, global_batch_size=16))
    row = simulate_point(raw)
    assert row["fits"] is True and row["infeasible_reason"] is None
    assert row["step_time_s"] > 0
    assert row["parallelism"]["dp"] == 4


def test_moe_model_with_expert_parallelism_runs_its_all_to_alls():
    sc = load_scenario(dict(model="mixtral-8x7b", cluster=dict(node="dgx-h100", num_gpus=64),
                            parallelism=dict(tp=1, pp=1, ep=8, micro_batch_size=1, global_batch_size=64),
                            training=dict(seq_length=1024)))
    r = simulate(sc)
    assert r.time_breakdown_s["ep_comm"] > 0 and r.step_time_s > 0
    assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)


def test_moe_every_other_layer_is_simulated():
    # Layers 1 and 3 are MoE (two all-to-alls each way), layers 0 and 2 dense
    # (exact per-kind expectations: tests/test_heterogeneous_layers.py).
    raw = dict(model=dict(name="m", num_layers=4, hidden_size=256, num_attention_heads=4, vocab_size=100,
                          make_vocab_size_divisible_by=1,
                          seq_length=128, moe=dict(num_experts=4, top_k=1, moe_layer_frequency=2)),
               cluster=dict(node="dgx-h100", num_gpus=8), parallelism=dict(ep=4, global_batch_size=8))
    r = simulate(load_scenario(raw))
    assert r.step_time_s > 0 and r.time_breakdown_s["ep_comm"] > 0
    assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)


def test_memory_breakdown_is_reported():
    r = simulate(a100(16, tp=2, pp=2, dp=4))
    assert set(r.memory_gib) >= {"weights", "gradients", "optimizer", "activations", "other"}
    assert all(v >= 0 for v in r.memory_gib.values())
    assert len(r.memory_per_stage_gib) == 2
    assert r.peak_memory_gib == pytest.approx(max(r.memory_per_stage_gib), rel=1e-12)
    assert r.fits is True


def test_timeline_events_are_within_the_step():
    r = simulate(a100(16, tp=2, pp=2, dp=4), detail=True)
    events = r.timeline
    assert events
    assert {e.rank_class for e in events} == {"stage0", "stage1"}
    assert all(0 <= e.start_s < e.end_s <= r.step_time_s * (1 + 1e-12) for e in events)


def test_scenario_is_not_mutated_by_simulate():
    raw = toy_raw(1, global_batch_size=3)
    before = copy.deepcopy(raw)
    sc = load_scenario(raw)
    simulate(sc)
    simulate(sc, mode="full", detail=True)
    assert raw == before
    assert simulate(sc).step_time_s == pytest.approx(3 * 3 * L * T_LAYER, rel=1e-9)


# ------------------------------------------------------------------ context parallelism


def test_context_parallel_moves_keys_and_values():
    # cp = 2 on 2 GPUs of one node: each rank holds s/2 tokens and needs the other half's K and V
    # for every layer's attention: one ring pass of K and V (2 x s/2 x h x 2 bytes = 131,072 B) in the
    # forward, one of twice the bytes in the backward (K, V again and dK, dV back; workloads/graph.py).
    # Not overlapped, each costs latency + bytes / bandwidth: L x (2 x 1 us + 3 x 131,072 B / 100 GB/s).
    kv_bytes = 2 * (S // 2) * H * 2
    exposed = simulate(toy(2, nvl_gb_per_s=100, nvl_latency_us=1, cp=2, dp=1, global_batch_size=1,
                           overlap_cp_comm=False))
    assert exposed.time_breakdown_s["cp_comm"] == pytest.approx(L * (2 * 1e-6 + 3 * kv_bytes / 100e9), rel=1e-9)
    r = simulate(toy(2, nvl_gb_per_s=100, nvl_latency_us=1, cp=2, dp=1, global_batch_size=1))
    assert 0 < r.time_breakdown_s["cp_comm"] <= exposed.time_breakdown_s["cp_comm"] * (1 + 1e-9)


def test_context_parallel_gradients_are_reduced_over_the_cp_group():
    # cp = 2, dp = 1, gradients reduced after the backward: one all-reduce of 2P bytes over the
    # 2 context-parallel ranks on NVLink 100 GB/s, 1 us: 2 us + 2·(1/2)·2P / 100 GB/s.
    t_grad = 2e-6 + 2 * TOY_PARAMS / 100e9
    r = simulate(toy(2, nvl_gb_per_s=100, nvl_latency_us=1, cp=2, dp=1, global_batch_size=1,
                     overlap_grad_reduce=False))
    assert r.time_breakdown_s["dp_comm"] == pytest.approx(t_grad, rel=1e-6)


def test_table_prints_a_short_step_time_to_four_significant_digits():
    """A step under a second is printed with four significant digits (a 3.85 ms VGG-16 step printed
    "0.004 s" until the tenth session); from a second up, three decimals as before. The per-step list of
    a multi-step run follows the mean's format."""
    from pathlib import Path

    from simulator.report.result import render_table

    examples = Path(__file__).resolve().parents[1] / "examples"
    short = simulate(load_scenario(str(examples / "vgg16-adaptive-8xa100.yaml")))
    line = next(x for x in render_table(short).splitlines() if x.strip().startswith("step time"))
    assert line.split()[2] == f"{short.step_time_s:.4g}" and 0.001 < short.step_time_s < 0.01
    assert len(line.split()[2].lstrip("0.")) == 4
    long = simulate(load_scenario(None))
    line = next(x for x in render_table(long).splitlines() if x.strip().startswith("step time"))
    assert line.split()[2] == f"{long.step_time_s:.3f}" and long.step_time_s > 1
    steps = simulate(load_scenario(str(examples / "resnet50-8xa100.yaml"), overrides=["simulation.steps=2"]))
    line = next(x for x in render_table(steps).splitlines() if x.strip().startswith("step time"))
    assert line.split()[2] == f"{steps.step_time_s:.4g}"
    assert f"mean of 2 steps: {steps.step_times_s[0]:.4g}, {steps.step_times_s[1]:.4g} s" in line
