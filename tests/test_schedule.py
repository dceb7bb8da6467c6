"""Pipeline schedules: the order of passes (simulator/strategies/spmd/schedule.py) and, through simulate(),
the step time and bubble of GPipe, 1F1B and interleaved 1F1B on a toy cluster without
communication costs.

Toy setup (all numbers chosen so that the classic formulas are exact):
- model: GPT, L layers, h = 256, 4 heads, s = 256, micro-batch 1, vocab V = 8 (see below);
- accelerator: one flat GEMM efficiency EFF for every layer GEMM, HBM so fast (1e12 GB/s) that
  memory-bound kernels cost ~1e-18 s, no launch overhead; attention GEMMs at the same efficiency;
- node: 8 GPUs, NVLink 1e12 GB/s with zero latency; tp = 1, dp = 1: no TP/DP traffic and the
  pipeline sends (s·h·2 = 128 KiB) take ~1e-16 s.

One layer's forward FLOPs (b = 1): QKV 2·s·3h·h + QK^T 2·s²·h + AV 2·s²·h + out 2·s·h² + FC1 2·s·4h·h
+ FC2 2·s·4h·h = 24·s·h² + 4·s²·h = 469,762,048, so t_layer = that / (peak · EFF), and the backward
is exactly twice (dgrad + wgrad per GEMM, 2x attention-core GEMMs): b = 2f.
The LM head (2·s·V·h = 1.05 MFLOP, run at efficiency 1.0 because it is below the curve's first
point) adds ~1e-12 of a layer: negligible at the 1e-9 tolerance used here, so every stage with
the same number of layers has the same f.
"""

from __future__ import annotations

import pytest

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.schedule import (
    gpipe,
    ideal_bubble_fraction,
    interleaved,
    one_f_one_b,
    stage_order,
)

H, S, HEADS, V = 256, 256, 4, 8
PEAK_TFLOPS = 1000.0
EFF = 1e-9
LAYER_FWD_FLOPS = 24 * S * H * H + 4 * S * S * H
T_LAYER = LAYER_FWD_FLOPS / (PEAK_TFLOPS * 1e12 * EFF)   # 0.469762048 s of forward per layer

TOY_ACCELERATOR = dict(
    name="toy-gpu", vendor="toy", peak_tflops={"bf16": PEAK_TFLOPS}, hbm_gib=1e6,
    hbm_bandwidth_gb_per_s=1e12, tdp_watts=1,
    efficiency=dict(
        # GEMMs of <= 0.002 GFLOP (the LM head, 0.001) at 1.0; >= 0.008 GFLOP (every layer GEMM:
        # attention 2·s·s·64 = 0.0084, attn_out 0.034, QKV 0.10, FC 0.13) at EFF (clamped).
        gemm_curve=[{"gflop": 0.002, "efficiency": 1.0}, {"gflop": 0.008, "efficiency": EFF}],
        memory_bound_efficiency=1.0, attention_efficiency_factor=1.0, kernel_launch_overhead_us=0,
        source="toy"),
    source="toy")
TOY_NODE = dict(
    name="toy-node", accelerator=TOY_ACCELERATOR, gpus_per_node=8,
    intra_node=dict(kind="nvswitch", bandwidth_per_gpu_gb_per_s=1e12, latency_us=0, collective_efficiency=1.0,
                    source="toy"),
    nics_per_node=1, nic_bandwidth_gbit_per_s=1e12, nic_efficiency=1.0, nic_latency_us=0, host_memory_gib=1,
    source="toy")
TOY_FABRIC = dict(name="toy-fabric", levels=1, switch_latency_us=0, source="toy")


def toy_pipeline(layers: int, pp: int, m: int, schedule: str, v: int = 1):
    model = dict(name="toy-gpt", num_layers=layers, hidden_size=H, num_attention_heads=HEADS, vocab_size=V,
                 seq_length=S, make_vocab_size_divisible_by=1)  # V = 8 as is: the hand counts assume no padding
    raw = dict(model=model, cluster=dict(node=TOY_NODE, fabric=TOY_FABRIC, num_gpus=pp),
               parallelism=dict(tp=1, pp=pp, dp=1, schedule=schedule, virtual_stages=v, micro_batch_size=1,
                                global_batch_size=m),
               training=dict(precision="bf16", attention="standard"))  # hand-derived: the toy's GEMM attention
    return load_scenario(raw)


PIPELINES = [(4, 8, 8), (2, 4, 4), (4, 4, 8), (3, 6, 6)]  # (p, m, L): L/p layers per stage


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m", "layers"), PIPELINES)
def test_gpipe_and_1f1b_step_and_bubble(schedule, p, m, layers):
    # f = (L/p)·t_layer, b = 2f. No communication: step = (m + p - 1)·(f + b); the first stage
    # (critical: it runs the last backward) is idle (p-1)·(f+b) of it: bubble (p-1)/(m+p-1).
    f = layers // p * T_LAYER
    b = 2 * f
    result = simulate(toy_pipeline(layers, p, m, schedule))
    assert result.step_time_s == pytest.approx((m + p - 1) * (f + b), rel=1e-9)
    bubble = result.time_breakdown_s["pipeline_bubble"]
    assert bubble == pytest.approx((p - 1) * (f + b), rel=1e-9)
    assert bubble / result.step_time_s == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)
    assert bubble / result.step_time_s == pytest.approx(ideal_bubble_fraction(schedule, m, p), rel=1e-9)
    # busy time on the critical stage: m forwards and m backwards.
    assert result.time_breakdown_s["compute"] == pytest.approx(m * (f + b), rel=1e-9)


@pytest.mark.parametrize(("p", "m", "layers"), PIPELINES)
def test_1f1b_same_step_time_as_gpipe(p, m, layers):
    one = simulate(toy_pipeline(layers, p, m, "1f1b")).step_time_s
    gp = simulate(toy_pipeline(layers, p, m, "gpipe")).step_time_s
    assert one == pytest.approx(gp, rel=1e-9)


@pytest.mark.parametrize(("p", "m", "v", "layers"), [(4, 8, 2, 8), (2, 4, 2, 4), (4, 4, 2, 8), (2, 4, 4, 8)])
def test_interleaved_bubble_shrinks_by_the_number_of_chunks(p, m, v, layers):
    # Narayanan et al. 2021 Sec. 2.2.2: with v chunks per rank (each f/v forward, b/v backward) the
    # bubble is (p-1)/v · (f+b); step = m·(f+b) + (p-1)/v·(f+b); fraction (p-1)/(v·m + p-1).
    f = layers // p * T_LAYER       # whole stage (all its chunks) per micro-batch
    b = 2 * f
    result = simulate(toy_pipeline(layers, p, m, "interleaved", v))
    assert result.layer_split == [layers // (p * v)] * (p * v)
    assert result.step_time_s == pytest.approx(m * (f + b) + (p - 1) / v * (f + b), rel=1e-9)
    bubble = result.time_breakdown_s["pipeline_bubble"]
    assert bubble == pytest.approx((p - 1) / v * (f + b), rel=1e-9)
    assert bubble / result.step_time_s == pytest.approx(ideal_bubble_fraction("interleaved", m, p, v), rel=1e-9)
    # and it is v times smaller than the non-interleaved bubble of the same pipeline
    flat = simulate(toy_pipeline(layers, p, m, "1f1b")).time_breakdown_s["pipeline_bubble"]
    assert flat / bubble == pytest.approx(v, rel=1e-9)


def test_no_pipeline_no_bubble():
    # p = 1: step = m·(f+b) exactly, no bubble.
    f = 4 * T_LAYER
    result = simulate(toy_pipeline(4, 1, 3, "1f1b"))
    assert result.step_time_s == pytest.approx(3 * 3 * f, rel=1e-9)
    assert result.time_breakdown_s["pipeline_bubble"] == pytest.approx(0.0, abs=1e-9 * result.step_time_s)


# ------------------------------------------------------------------ order properties


def _check_complete(order, m, v=1):
    """Each (F, mb, chunk) and (B, mb, chunk) exactly once; B after its F."""
    expected = {(ph, mb, c) for ph in "FB" for mb in range(m) for c in range(v)}
    assert len(order) == len(expected) == 2 * m * v
    assert set(order) == expected
    pos = {item: i for i, item in enumerate(order)}
    for mb in range(m):
        for c in range(v):
            assert pos[("B", mb, c)] > pos[("F", mb, c)]


@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_gpipe_order(m):
    order = gpipe(m)
    _check_complete(order, m)
    assert order[:m] == [("F", i, 0) for i in range(m)]
    assert order[m:] == [("B", i, 0) for i in reversed(range(m))]
    # GPipe's order does not depend on the stage
    assert stage_order("gpipe", m, 4, 0) == stage_order("gpipe", m, 4, 3) == order


@pytest.mark.parametrize(("m", "p"), [(8, 4), (4, 4), (2, 4), (1, 3), (16, 8), (3, 2)])
def test_1f1b_order(m, p):
    for i in range(p):
        order = stage_order("1f1b", m, p, i)
        _check_complete(order, m)
        # warm-up: p - i - 1 forwards, then one more forward before the first backward
        first_b = next(k for k, it in enumerate(order) if it[0] == "B")
        assert first_b == min(p - i, m)
        assert order[:min(p - i - 1, m)] == [("F", k, 0) for k in range(min(p - i - 1, m))]
        # forwards and backwards each in micro-batch order
        assert [mb for ph, mb, _ in order if ph == "F"] == list(range(m))
        assert [mb for ph, mb, _ in order if ph == "B"] == list(range(m))
        # at most p - i micro-batches in flight (forward done, backward not yet)
        in_flight = peak = 0
        for ph, _, _ in order:
            in_flight += 1 if ph == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(p - i, m)
    assert one_f_one_b(m, p, p - 1)[:2] == [("F", 0, 0), ("B", 0, 0)]  # last stage: no warm-up


@pytest.mark.parametrize(("m", "p", "v"), [(8, 4, 2), (4, 4, 2), (4, 2, 3), (8, 2, 4), (12, 3, 2)])
def test_interleaved_order(m, p, v):
    for i in range(p):
        order = stage_order("interleaved", m, p, i, v)
        _check_complete(order, m, v)
        warmup = min((p - i - 1) * 2 + (v - 1) * p, m * v)
        assert all(ph == "F" for ph, _, _ in order[:warmup])
        if warmup < m * v:
            assert order[warmup][0] == "F" and order[warmup + 1][0] == "B"
        pos = {item: k for k, item in enumerate(order)}
        for mb in range(m):
            # a micro-batch goes through the rank's chunks 0..v-1 forward and v-1..0 backward
            assert [pos[("F", mb, c)] for c in range(v)] == sorted(pos[("F", mb, c)] for c in range(v))
            assert [pos[("B", mb, c)] for c in reversed(range(v))] == sorted(pos[("B", mb, c)] for c in range(v))
        # Megatron's order: forwards in groups of p micro-batches per chunk
        fwd = [(mb, c) for ph, mb, c in order if ph == "F"]
        assert fwd[:p] == [(k, 0) for k in range(p)]
        if v > 1:
            assert fwd[p:2 * p] == [(k, 1) for k in range(p)]
    assert interleaved(m, p, 0, v) == stage_order("interleaved", m, p, 0, v)


def test_interleaved_needs_micro_batches_divisible_by_pp():
    with pytest.raises(ConfigError) as exc:
        interleaved(6, 4, 0, 2)
    assert exc.value.field == "parallelism.global_batch_size"


def test_unknown_schedule_raises_config_error():
    with pytest.raises(ConfigError) as exc:
        stage_order("zigzag", 4, 2, 0)
    assert exc.value.field == "parallelism.schedule"


def test_pp1_orders_are_forward_backward_per_micro_batch():
    assert stage_order("1f1b", 3, 1, 0) == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("F", 2, 0),
                                            ("B", 2, 0)]
    assert stage_order("gpipe", 2, 1, 0) == [("F", 0, 0), ("F", 1, 0), ("B", 1, 0), ("B", 0, 0)]


def test_ideal_bubble_fraction_formula():
    assert ideal_bubble_fraction("gpipe", 8, 4) == pytest.approx(3 / 11)
    assert ideal_bubble_fraction("1f1b", 8, 4) == pytest.approx(3 / 11)
    assert ideal_bubble_fraction("interleaved", 8, 4, 2) == pytest.approx(3 / 19)
    assert ideal_bubble_fraction("1f1b", 8, 4, 2) == pytest.approx(3 / 11)  # v only counts when interleaved
    assert ideal_bubble_fraction("1f1b", 8, 1) == 0.0
