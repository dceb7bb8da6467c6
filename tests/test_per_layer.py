"""Per-layer parallelism (simulator/strategies/per_layer/): communication volumes against the
closed forms of Gholami et al. 2018 ("Integrated Model, Batch, and Domain Parallelism in Training
Neural Networks", SPAA 2018, Sec. 3), exact timelines on a toy two-layer network on 2 and 4 GPUs,
invariants (hypothesis), the planners' pricing functions, and bad input."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.collectives import bus_bytes
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.per_layer.config import Split
from simulator.strategies.per_layer.cost import (
    layer_cost,
    layer_cost_s,
    per_layer_graph,
    pricer,
    reshard,
    reshard_cost_s,
)
from simulator.strategies.per_layer.halo import halo_widths
from simulator.strategies.per_layer.sharding import (
    exact_volume,
    input_layout,
    output_layout,
    plan_reshard,
    shard_ops,
    subgroup,
)
from workloads.graph import ShardShape
from workloads.networks.builder import NetBuilder

ROOT = Path(__file__).resolve().parents[1]
PEAK = 1e12          # toy GPU: 1 TFLOP/s at every GEMM size
BW = 1e9             # toy NVSwitch: 1 GB/s per GPU
ALPHA = 1e-6         # toy hop latency: 1 us


@dataclass(frozen=True)
class ToyNet:
    """Two linear layers without bias: x (K0) -> fc0 (N0) -> fc1 (N1); or, with ``conv``, a
    k×k convolution (stride 1, padding k//2) on a C×H×W map followed by another."""

    widths: tuple[int, int, int] = (64, 128, 32)
    conv: tuple[int, int, int, int] | None = None   # (C, H, W, k)
    name: str = "toy-net"
    seq_length: None = None
    sample: str = "image"

    def layer_graph(self, shard: ShardShape):
        net = NetBuilder(self.name, shard.micro_batch, shard.act_bytes)
        if self.conv:
            c, h, w, k = self.conv
            x = net.conv2d("conv0", net.input(c, h, w), c, k, padding=k // 2)
            net.conv2d("conv1", x, c, k, padding=k // 2)
        else:
            k0, n0, n1 = self.widths
            x = net.linear("fc0", net.input(k0), n0, bias=False)
            net.linear("fc1", x, n1, bias=False)
        return net.output()


def toy_raw(num_gpus: int, batch: int, strategy: dict) -> dict:
    accelerator = dict(
        name="toy-gpu", vendor="toy", peak_tflops={"bf16": PEAK / 1e12}, hbm_gib=1e6, hbm_bandwidth_gb_per_s=1e12,
        tdp_watts=1,
        efficiency=dict(gemm_curve=[{"gflop": 1e-9, "efficiency": 1.0}, {"gflop": 1e9, "efficiency": 1.0}],
                        memory_bound_efficiency=1.0, attention_efficiency_factor=1.0, kernel_launch_overhead_us=0,
                        source="toy"),
        source="toy")
    node = dict(name="toy-node", accelerator=accelerator, gpus_per_node=8,
                intra_node=dict(kind="nvswitch", bandwidth_per_gpu_gb_per_s=BW / 1e9, latency_us=ALPHA * 1e6,
                                collective_efficiency=1.0, source="toy"),
                nics_per_node=8, nic_bandwidth_gbit_per_s=100, nic_efficiency=1.0, nic_latency_us=0,
                host_memory_gib=1, source="toy")
    return dict(model="vgg16", cluster=dict(node=node, fabric=dict(name="toy-fabric", levels=1, switch_latency_us=0,
                                                                    source="toy"), num_gpus=num_gpus),
                parallelism=dict(global_batch_size=batch, micro_batch_size=batch // num_gpus),
                training=dict(grad_dtype="bf16"), strategy=strategy)


def toy(num_gpus: int, batch: int, strategy: dict, net: ToyNet = ToyNet(), steps: int = 1):
    raw = toy_raw(num_gpus, batch, {"kind": "per_layer", **strategy})
    raw["simulation"] = {"steps": steps}
    return dataclasses.replace(load_scenario(raw), model=net)


# --------------------------------------------------------------------------- exact timelines


def test_two_gpu_timeline_batch_then_model_parallel():
    # fc0 batch-split over 2 (4 samples each), fc1 output features split over 2 (Gholami's model
    # parallel FC): f0 = 2·4·128·64 FLOP, forward all-gather of fc0's output (8 x 128 bf16 = 2048 B,
    # bus (n-1)/n·S = 1024 B) at alpha + 1024/BW; f1 = 2·8·16·128; backward: fc1 data + weight
    # gradients (2 f1), the adjoint reduce-scatter (same price), fc0 weight gradient only (its input
    # needs none: f0), then fc0's weight-gradient all-reduce over 2 (8192 bf16 = 16 KiB: 2 alpha +
    # 16384/BW); fc1's weights are split, nothing to reduce. Optimizer ~0 (HBM 1e21 B/s).
    sc = toy(2, 8, {"layers": [{"match": "fc0", "split": {"batch": 2}}, {"match": "fc1", "split": {"channels": 2}}]})
    f0, f1 = 2 * 4 * 128 * 64 / PEAK, 2 * 8 * 16 * 128 / PEAK
    gather = ALPHA + 1024 / BW
    reduce = 2 * ALPHA + 16384 / BW
    expected = f0 + gather + f1 + 2 * f1 + gather + f0 + reduce
    result = simulate(sc)
    assert result.step_time_s == pytest.approx(expected, rel=1e-6)
    assert result.time_breakdown_s["tp_comm"] == pytest.approx(2 * gather, rel=1e-6)
    assert result.time_breakdown_s["dp_comm"] == pytest.approx(reduce, rel=1e-6)


def test_four_gpu_timeline_burst_into_model_parallel():
    # DeepPool burst: fc0 batch-split over 4 GPUs, fc1 output-split over 2 (a smaller device set).
    # Forward: device 0 has 2 samples (512 B of fc0's output) and needs all 8 (2048 B):
    # a scatter/gather of 1536 B (alpha + 1536/BW). Backward: fc1's input gradient is partial over its 2
    # output shards: all-reduce of 2048 B over 2 (2 alpha + 2048/BW), then back to 4 devices: the 2 new
    # ones receive 512 B each, shared by the 2 holders (256 + 256 B sent each; busiest: 512 B received)
    # (alpha + 512/BW). fc0's weight-gradient all-reduce over 4: 2·3 alpha + 2·3/4·16384/BW.
    sc = toy(4, 8, {"layers": [{"match": "fc0", "devices": 4}, {"match": "fc1", "split": {"channels": 2}}]})
    f0, f1 = 2 * 2 * 128 * 64 / PEAK, 2 * 8 * 16 * 128 / PEAK
    forward = ALPHA + 1536 / BW
    backward = (2 * ALPHA + 2048 / BW) + (ALPHA + 512 / BW)
    reduce = 6 * ALPHA + 1.5 * 16384 / BW
    result = simulate(sc)
    assert result.step_time_s == pytest.approx(f0 + forward + 3 * f1 + backward + f0 + reduce, rel=1e-6)
    r = reshard(sc, "fc0", {"batch": 4}, {"channels": 2})
    assert [c.kind for c in r.forward] == ["send_recv"]
    assert [c.kind for c in r.backward] == ["all_reduce", "send_recv"]
    assert r.forward[0].volume_bytes == 1536 and r.backward[1].volume_bytes == 512


def test_steps_unroll_back_to_back():
    strategy = {"layers": [{"match": "fc0", "split": {"batch": 2}}, {"match": "fc1", "split": {"channels": 2}}]}
    one, three = simulate(toy(2, 8, strategy)), simulate(toy(2, 8, strategy, steps=3))
    assert three.step_time_s == pytest.approx(one.step_time_s, rel=1e-9)
    assert len(three.step_times_s) == 3


# --------------------------------------------------------------------------- Gholami et al. Sec. 3


@pytest.mark.parametrize("p", [2, 4, 8])
def test_batch_parallel_weight_all_reduce_is_gholami_sec_3_1(p):
    # Sec. 3.1 (batch parallelism): each layer's weight gradient |W_i| is all-reduced over the P
    # processes, bandwidth term 2·(P-1)/P·|W_i| words per process.
    sc = toy(8, 64, {"default": {"batch": p}})
    collective = pricer(sc).gradient_collective(per_layer_graph(sc).layer("fc0"), Split(batch=p))
    words = 64 * 128
    assert collective.kind == "all_reduce" and len(collective.ranks) == p
    assert collective.volume_bytes == 2 * (p - 1) / p * words * 2
    assert bus_bytes("all_reduce", collective.payload_bytes, p) == collective.volume_bytes


@pytest.mark.parametrize("p", [2, 4, 8])
def test_model_parallel_fc_all_gather_is_gholami_sec_3_2(p):
    # Sec. 3.2 (model parallelism of fully connected layers): W_i split by output neurons; the
    # forward all-gathers the B x d_i output, (P-1)/P·B·d_i words per process. The backward is the
    # adjoint: a reduce-scatter of B·d_i (Gholami all-reduces ΔX, 2·(P-1)/P·B·d_i, which leaves it
    # replicated where the next layer back, split by outputs, needs only its part: DistDL's adjoint).
    b, d = 64, 128
    sc = toy(8, b, {"default": {"channels": p}})
    r = reshard(sc, "fc0", {"channels": p}, {"channels": p})
    assert [c.kind for c in r.forward] == ["all_gather"] and [c.kind for c in r.backward] == ["reduce_scatter"]
    assert r.forward[0].volume_bytes == r.backward[0].volume_bytes == (p - 1) / p * b * d * 2
    assert r.forward[0].ranks == tuple(range(p))


@pytest.mark.parametrize(("pr", "pc", "k"), [(3, 3, 3), (4, 2, 5), (2, 2, 3)])
def test_domain_parallel_halo_is_gholami_sec_3_3(pr, pc, k):
    # Sec. 3.3 (domain parallelism): a k×k convolution on an H×W map split over a Pr×Pc grid
    # exchanges ⌊k/2⌋ rows with each row neighbour and ⌊k/2⌋ columns with each column neighbour:
    # B·C·2⌊k/2⌋·(W/Pc + H/Pr) words for an interior block; DistDL's two-phase exchange adds the
    # corners, (2⌊k/2⌋)² B·C. With Pr or Pc = 2 no block is interior: one neighbour per axis.
    b, c, h, w = 16, 8, 24, 24
    sc = toy(16, b, {"default": {"rows": pr, "cols": pc}}, ToyNet(conv=(c, h, w, k)))
    layer = per_layer_graph(sc).layer("conv1")
    assert halo_widths(layer.window) == (k // 2,) * 4
    phases = pricer(sc).halo_collectives(layer, Split(rows=pr, cols=pc))
    hw = k // 2
    rows = hw * (2 if pr >= 3 else 1)
    cols = hw * (2 if pc >= 3 else 1)
    assert [x.volume_bytes for x in phases] == [b * c * rows * (w // pc) * 2, b * c * cols * (h // pr + rows) * 2]
    if pr >= 3 and pc >= 3:
        gholami = b * c * 2 * hw * (w / pc + h / pr)
        assert sum(x.volume_bytes for x in phases) / 2 == gholami + b * c * (2 * hw) ** 2
    # the weights are replicated over the whole grid: 2(P-1)/P |W|
    grad = pricer(sc).gradient_collective(layer, Split(rows=pr, cols=pc))
    p = pr * pc
    assert grad.volume_bytes == pytest.approx(2 * (p - 1) / p * c * c * k * k * 2)


@pytest.mark.parametrize(("pr", "pc"), [(2, 4), (4, 2), (2, 2)])
def test_integrated_model_batch_grid_is_gholami_sec_3_4(pr, pc):
    # Sec. 3.4 (integrated model and batch parallelism on a Pr×Pc grid): the activations are
    # all-gathered over the Pr model-parallel processes, (Pr-1)/Pr·(B/Pc)·d_i words, and the weight
    # gradients all-reduced over the Pc batch-parallel processes, 2(Pc-1)/Pc·|W_i|/Pr words.
    b, d0 = 64, 128
    sc = toy(8, b, {"default": {"batch": pc, "channels": pr}})
    split = Split(batch=pc, channels=pr)
    r = reshard(sc, "fc0", split, split)
    assert [c.kind for c in r.forward] == ["all_gather"]
    assert r.forward[0].volume_bytes == (pr - 1) / pr * (b / pc) * d0 * 2
    assert r.forward[0].ranks == tuple(range(pr))  # the model-parallel row: neighbouring ranks
    grad = pricer(sc).gradient_collective(per_layer_graph(sc).layer("fc1"), split)
    assert grad.ranks == tuple(range(0, pr * pc, pr))  # the batch-parallel column: stride Pr
    assert grad.volume_bytes == 2 * (pc - 1) / pc * (d0 * 32 / pr) * 2


# --------------------------------------------------------------------------- invariants

DIVISORS = st.sampled_from([1, 2, 4])


@settings(max_examples=40, deadline=None)
@given(DIVISORS, DIVISORS, DIVISORS, DIVISORS, DIVISORS)
def test_flops_over_devices_equal_the_unsplit_layer(batch, rows, cols, channels, reduction):
    graph = ToyNet(conv=(8, 16, 16, 3)).layer_graph(ShardShape(micro_batch=8, seq_length=1))
    layer = graph.layer("conv1")
    split = Split(batch=batch, rows=rows, cols=cols, channels=channels, reduction=reduction)
    for phase, ops in (("forward", layer.forward), ("backward", layer.backward)):
        shard = shard_ops(layer, split, 8, phase)
        assert split.devices * sum(op.flops for op in shard) == pytest.approx(sum(op.flops for op in ops), rel=1e-12)
        for op, full in zip(shard, ops, strict=True):  # the GEMM shape's product is the FLOPs' share
            assert 2 * op.m * op.n * op.k * split.devices == 2 * full.m * full.n * full.k


def brute_force_volume(src, dst) -> tuple[float, float]:
    """Elements each device receives and sends, counted element by element: every device's block
    is the set of elements whose index along each dimension falls in its part (devices numbered
    mixed-radix over the split fields, reduction innermost; part i of a dimension of size d in p
    parts is [i·ceil(d/p), (i+1)·ceil(d/p)) clipped to d); a device receives what it needs and
    does not hold; each element it lacks is sent by its holders in equal shares."""
    from simulator.strategies.per_layer.config import SPLIT_FIELDS

    def owned(layout):
        grids = np.meshgrid(*[np.arange(d) for d in layout.dims], indexing="ij")
        out = np.zeros((layout.devices, *layout.dims), dtype=bool)
        for rank in range(layout.devices):
            coords, rest = {}, rank
            for field in reversed(SPLIT_FIELDS):
                n = getattr(layout.split, field)
                coords[field], rest = rest % n, rest // n
            inside = np.ones(layout.dims, dtype=bool)
            for k, fields in enumerate(layout.indexing()):
                part = 0
                for field in fields:
                    part = part * getattr(layout.split, field) + coords[field]
                chunk = -(-layout.dims[k] // layout.parts[k])
                inside &= (grids[k] >= part * chunk) & (grids[k] < (part + 1) * chunk)
            out[rank] = inside
        return out

    holds, needs = owned(src), owned(dst)
    holders = holds.sum(axis=0)
    mine = np.zeros_like(needs)
    both = min(src.devices, dst.devices)
    mine[:both] = holds[:both]
    lacks = needs & ~mine
    recv = lacks.reshape(dst.devices, -1).sum(axis=1)
    share = np.where(holders > 0, 1.0 / np.maximum(holders, 1), 0.0)
    send = [(holds[r] * share * lacks).sum() for r in range(src.devices)]
    return float(recv.max()), float(max(send))


PARTS = st.sampled_from([1, 2, 3, 4])


@settings(max_examples=80, deadline=None)
@given(st.tuples(PARTS, PARTS, PARTS, PARTS), st.tuples(PARTS, PARTS, PARTS, PARTS),
       st.sampled_from(["relu", "conv"]), st.booleans())
def test_reshard_bytes_equal_brute_force_ownership(a, b, consumer, uneven):
    # A conv's output (4 images, 6 or 4 channels, 6x6 or 4x4) resharded into a per-channel consumer
    # (ReLU: channels cut) or a mixing one (conv: channels replicated), between any two splits of
    # batch, channels, rows and cols on at most 256 devices, cuts that need not divide (the first
    # parts take the ceiling), device sets of different sizes (bursts): the busiest receiver and
    # sender match the element-by-element count, and the collectives carry exactly that.
    c = h = 6 if uneven else 4
    builder = NetBuilder("t", 4, 2)
    x = builder.conv2d("conv", builder.input(c, h, h), c, 3, padding=1)
    if consumer == "relu":
        builder.relu("next", x, inplace=False)
    else:
        builder.conv2d("next", x, c, 3, padding=1)
    graph = builder.output()
    conv, nxt = graph.layer("conv"), graph.layer("next")
    sa = Split(batch=a[0], channels=a[1], rows=a[2], cols=a[3])
    sb = Split(batch=b[0], channels=b[1], rows=b[2], cols=b[3])
    src, dst = output_layout(conv, sa, 4), input_layout(nxt, sb, 4, conv.output_shape)
    recv, send = exact_volume(src, dst, 2)
    brute_recv, brute_send = brute_force_volume(src, dst)
    assert recv == pytest.approx(2 * brute_recv, rel=1e-12, abs=1e-9)
    assert send == pytest.approx(2 * brute_send, rel=1e-12, abs=1e-9)
    # the nested-blocks closed form (the volume before the exact count) is a lower bound
    if sa.devices == sb.devices and not uneven and consumer == "relu":
        p, q = src.parts, dst.parts
        numel = 4 * c * h * h
        assert recv >= 2 * numel * (1 / math.prod(q) - 1 / math.prod(max(i, j) for i, j in zip(p, q, strict=True))) - 1e-9
    for coll in plan_reshard(src, dst, 2):
        assert coll.volume_bytes == pytest.approx(max(recv, send), rel=1e-12)
        if coll.kind != "send_recv":
            assert bus_bytes(coll.kind, coll.payload_bytes, len(coll.ranks)) == pytest.approx(coll.volume_bytes,
                                                                                               rel=1e-12)


def test_non_nested_cut_moves_more_than_the_nested_bound():
    # 2 x 2 (batch x channels) -> 4 channel parts on 4 GPUs: device 1 held images 0-1 of channels
    # 2-3 and needs all images of channel 1: it holds none of it and receives its whole new block
    # (the nested bound assumed it kept a quarter of it).
    builder = NetBuilder("t", 4, 2)
    builder.relu("next", builder.conv2d("conv", builder.input(4, 4, 4), 4, 3, padding=1), inplace=False)
    graph = builder.output()
    src = output_layout(graph.layer("conv"), Split(batch=2, channels=2), 4)
    dst = input_layout(graph.layer("next"), Split(channels=4), 4, (4, 4, 4))
    recv, send = exact_volume(src, dst, 2)
    assert recv == 4 * 1 * 16 * 2  # its whole block: 4 images x 1 channel x 16 pixels, bf16
    assert brute_force_volume(src, dst)[0] * 2 == recv


def test_subgroups_are_mixed_radix_reduction_innermost():
    split = Split(batch=2, rows=2, channels=2, reduction=2)
    assert subgroup(split, ("reduction",)) == (0, 1)
    assert subgroup(split, ("channels",)) == (0, 2)
    assert subgroup(split, ("rows",)) == (0, 4)
    assert subgroup(split, ("batch", "rows")) == (0, 4, 8, 12)


# --------------------------------------------------------------------------- the planners' functions


def test_pricing_functions_agree_with_the_simulation_parts():
    sc = toy(8, 64, {"default": {"batch": 8}})
    cost = layer_cost(sc, "fc0", {"batch": 8})
    assert layer_cost_s(sc, "fc0", Split(batch=8)) == cost.total_s > 0
    assert cost.flops_per_device * 8 == pytest.approx(3 * 2 * 64 * 128 * 64 - 2 * 64 * 128 * 64)  # no dgrad
    assert reshard_cost_s(sc, "fc0", {"batch": 8}, {"batch": 8}) == 0.0
    assert reshard_cost_s(sc, "fc0", {"batch": 8}, {"channels": 8}) > 0
    assert reshard_cost_s(sc, 0, {"channels": 2, "reduction": 2}, {"reduction": 4}) > 0


def test_pricing_functions_name_the_bad_field():
    sc = toy(8, 64, {"default": {"batch": 8}})
    with pytest.raises(ConfigError, match=r"config\.split\.rows"):
        layer_cost(sc, "fc0", {"rows": 2})
    with pytest.raises(ConfigError, match="config_b.bogus"):
        reshard(sc, "fc0", {"batch": 2}, {"bogus": 2})
    with pytest.raises(ConfigError, match="layer"):
        layer_cost(sc, "nope", {"batch": 2})


# --------------------------------------------------------------------------- bad input, CLI


BAD = [
    ("{default: {batch: 8}, layers: [{match: 'classifier.0', split: {channels: 3}}]}",
     "strategy.layers.0.split.channels"),
    ("{default: {batch: 16}}", "strategy.default.split"),
    ("{default: {batch: 8, depth: 2}}", "strategy.default.depth"),
    ("{default: {batch: 8}, layers: [{match: 'classifier.0', split: {rows: 2}}]}", "strategy.layers.0.split.rows"),
    ("{default: {batch: 8}, layers: [{range: [3, 1], devices: 2}]}", "strategy.layers.0"),
]


@pytest.mark.parametrize(("strategy", "field"), BAD, ids=[f for _, f in BAD])
def test_bad_config_exits_2_naming_the_field(tmp_path, strategy, field):
    path = tmp_path / "bad.yaml"
    path.write_text("model: vgg16\ncluster: {node: dgx-a100-80g, num_gpus: 8}\n"
                    "parallelism: {global_batch_size: 64, micro_batch_size: 8}\n"
                    f"strategy: {{kind: per_layer, {strategy[1:-1]}}}\n")
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- memory, defaults, CLI


def test_memory_follows_the_splits():
    # fc0 (64 x 128) and fc1 (128 x 32) weights; bf16 Adam: 2 + 2 (bf16 grads) + 12 bytes per parameter.
    from simulator.strategies.per_layer.kind import per_layer_memory

    whole = per_layer_memory(toy(8, 64, {"default": {"batch": 8}}))[1]
    split = per_layer_memory(toy(8, 64, {"default": {"channels": 8}}))[1]
    params = 64 * 128 + 128 * 32
    assert whole.weights_bytes == 2 * params and split.weights_bytes == 2 * params / 8
    assert whole.optimizer_bytes == 12 * params and split.gradients_bytes == 2 * params / 8
    graph = per_layer_graph(toy(8, 64, {}))
    assert whole.activations_bytes == pytest.approx(graph.saved_bytes() / 8)


def test_default_folds_cuts_a_layer_cannot_make_into_batch():
    # VGG-16 under a spatial default: the fully connected layers have no rows or columns, so
    # they run batch-split on the same 8 GPUs; a rule asking them for rows is an error.
    from simulator.strategies.per_layer.kind import layer_splits

    sc = load_scenario(ROOT / "examples" / "vgg16-per-layer-8xa100.yaml",
                       ["strategy.default={rows: 2, cols: 4}", "strategy.layers=[]", "strategy.uneven=round_up"])
    splits = dict(zip((layer.name for layer in per_layer_graph(sc).layers), layer_splits(sc), strict=True))
    assert splits["features.0.conv"] == Split(rows=2, cols=4)
    assert splits["classifier.0"] == Split(batch=8)


def test_spatial_batch_norm_all_reduces_its_statistics():
    sc = load_scenario(ROOT / "examples" / "resnet50-domain-parallel-8xa100.yaml")
    bn = per_layer_graph(sc).layer("bn1")
    sync = pricer(sc).halo_collectives(bn, Split(batch=2, rows=2, cols=2))
    assert [(c.kind, c.payload_bytes, c.ranks) for c in sync] == [("all_reduce", 2 * 64 * 4, (0, 1, 2, 3))]
    assert pricer(sc).halo_collectives(bn, Split(batch=8)) == ()


def test_a_transformer_without_shapes_splits_by_batch_only():
    raw = {"model": "gpt-1.7b", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
           "parallelism": {"global_batch_size": 16, "micro_batch_size": 1},
           "strategy": {"kind": "per_layer", "default": {"batch": 8}}}
    from simulator.strategies.per_layer.kind import layer_splits

    sc = load_scenario(raw)
    assert set(layer_splits(sc)) == {Split(batch=8)}
    # batch splitting alone: no reshard (tp_comm 0), each GPU computes what one GPU does with 2 of the 16
    # sequences, plus the gradient all-reduce
    r = simulate(sc)
    one = simulate(load_scenario({**raw, "cluster": {"node": "dgx-a100-80g", "num_gpus": 1},
                                  "parallelism": {"global_batch_size": 2, "micro_batch_size": 1},
                                  "strategy": {"kind": "per_layer", "default": {"batch": 1}}}))
    assert r.time_breakdown_s["tp_comm"] == 0.0 and one.time_breakdown_s["dp_comm"] == 0.0
    assert r.time_breakdown_s["compute"] == pytest.approx(one.time_breakdown_s["compute"], rel=1e-12)
    assert r.step_time_s == pytest.approx(one.step_time_s + r.time_breakdown_s["dp_comm"], rel=1e-12)
    assert r.time_breakdown_s["dp_comm"] > 0.0
    raw["strategy"]["layers"] = [{"range": [1, 2], "split": {"heads": 8}}]
    with pytest.raises(ConfigError, match=r"strategy\.layers\.0\.split\.heads"):
        simulate(load_scenario(raw))


def test_cli_simulates_many_steps():
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate",
                           str(ROOT / "examples" / "vgg16-per-layer-8xa100.yaml"), "--steps", "3", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    import json

    result = json.loads(proc.stdout)
    assert len(result["step_times_s"]) == 3
    assert result["step_times_s"][1] == pytest.approx(result["step_times_s"][2], rel=1e-9)


def test_sequence_split_attention_gathers_keys_and_values():
    # BERT-large attention (512 tokens, 1024 wide, 32 sequences) split by sequence over 4 and
    # batch over 2: every query needs all 512 keys and values of its 16 sequences: an all-gather
    # of 2·16·512·1024 bf16 over the 4 sequence ranks, (4-1)/4 of it received.
    sc = load_scenario(ROOT / "examples" / "bert-large-per-layer-8xa100.yaml")
    attention = per_layer_graph(sc).layer("encoder.layer.0.attention")
    (kv,) = pricer(sc).halo_collectives(attention, Split(batch=2, sequence=4))
    assert (kv.kind, kv.payload_bytes, kv.ranks) == ("all_gather", 2 * 16 * 512 * 1024 * 2, (0, 1, 2, 3))
    assert kv.volume_bytes == bus_bytes("all_gather", kv.payload_bytes, 4)


def test_strategy_block_round_trips_per_layer_splits():
    # What a planner writes out: the block that resolves back to the very splits it chose.
    from simulator.strategies.per_layer.config import strategy_block
    from simulator.strategies.per_layer.kind import layer_splits

    sc = load_scenario(ROOT / "examples" / "bert-large-per-layer-8xa100.yaml")
    chosen = layer_splits(sc)
    block = strategy_block(chosen)
    # per encoder layer three runs: the attention, the first dense with its GELU, the second dense
    assert block["default"] == {"batch": 8} and len(block["layers"]) == 3 * 24
    again = load_scenario(ROOT / "examples" / "bert-large-per-layer-8xa100.yaml", [f"strategy={block}"])
    assert layer_splits(again) == chosen


def test_a_profiled_layer_takes_its_time_at_the_device_batch():
    # DeepPool's A100 VGG profile (validation/data/profiles): a layer split over 8 of a 32 batch
    # runs in the time measured at batch 4 (0.153 ms for the first conv), not 1/8 of batch 32's
    # (1.087 / 8 = 0.136 ms): small batches do not scale linearly, which is why DeepPool bursts.
    raw = {"model": {"family": "profile", "name": "deeppool-vgg", "format": "deeppool",
                     "path": str(ROOT / "validation" / "data" / "profiles" / "deeppool_A100_vgg.prof")},
           "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
           "parallelism": {"global_batch_size": 32, "micro_batch_size": 4},
           "strategy": {"kind": "per_layer", "default": {"batch": 8}}}
    sc = load_scenario(raw)
    at_4 = pricer(sc).graph_at(4).layers[0]
    assert layer_cost(sc, 0, {"batch": 8}).forward_s == pytest.approx(at_4.measured_forward_s, rel=1e-12)
    assert layer_cost(sc, 0, {"batch": 8}).forward_s > per_layer_graph(sc).layers[0].measured_forward_s / 8
    assert simulate(sc).step_time_s > 0
