"""Autograd's gradient sums in the layer graph (issue 19): a tensor read by k layers gets k - 1 adds of
its size (3 x its bytes each) at the head of its producer's backward, for every graph (builder,
traced module, graph.txt, DeepPool); and the count and bytes of every sum equal what autograd runs
for the reference modules (walked from the autograd graph of a CPU forward)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import ComputeModel
from workloads.catalog import resolve_model
from workloads.graph import Op, ShardShape
from workloads.layer_graph import (
    Layer,
    LayerGraph,
    consumer_counts,
    is_gradient_sum,
    with_gradient_sums,
    without_gradient_sums,
)
from workloads.tensor_parallel import tensor_parallel_graph

TESTS = Path(__file__).parent
PROFILES = TESTS.parent / "validation" / "data" / "profiles"


def shard(batch: int = 2, precision: str = "fp32", tp: int = 1) -> ShardShape:
    return ShardShape(micro_batch=batch, seq_length=1, precision=precision, tp=tp)


def sums_of(graph: LayerGraph) -> list[Op]:
    return [op for layer in graph.layers for op in layer.backward if is_gradient_sum(op)]


def _fork() -> LayerGraph:
    """a feeds b, c and d (three readers: two sums of a's 100 bytes); d reads b and c too."""
    grad = Op("a.conv.dgrad", "gemm", 1.0)
    return LayerGraph("fork", (
        Layer("a", "conv2d", backward=(grad,), output_bytes=100.0),
        Layer("b", "relu", inputs=("a",), output_bytes=100.0),
        Layer("c", "relu", inputs=("a",), output_bytes=100.0),
        Layer("d", "concat", inputs=("a", "b", "c"), output_bytes=300.0)), micro_batch=2).check()


def test_a_fan_out_of_k_readers_gets_k_minus_one_adds_at_the_head_of_its_producers_backward():
    graph = with_gradient_sums(_fork())
    a = graph.layer("a")
    assert [op.name for op in a.backward] == ["a.gradient_sum", "a.gradient_sum", "a.conv.dgrad"]
    assert all(op.kind == "memory" and op.flops == 0 and op.bytes_moved == 300.0 for op in a.backward[:2])
    assert all(not sums_of(replace_layers(graph, name)) for name in "bcd")
    assert graph.forward_flops() == _fork().forward_flops() and graph.saved_bytes() == _fork().saved_bytes()


def replace_layers(graph: LayerGraph, name: str) -> LayerGraph:
    return LayerGraph("one", (graph.layer(name),), graph.micro_batch)


def test_gradient_sums_are_idempotent_and_follow_the_wiring():
    once = with_gradient_sums(_fork())
    assert with_gradient_sums(once) == once
    assert without_gradient_sums(once) == _fork()
    # pieces of one split read their input once together (SplitBackward gathers, it does not add)
    split = LayerGraph("split", (
        Layer("x", "conv2d", output_bytes=8.0),
        Layer("chunk.0", "flatten", inputs=("x",), output_bytes=4.0, piece_of="chunk"),
        Layer("chunk.1", "flatten", inputs=("x",), output_bytes=4.0, piece_of="chunk"),
        Layer("cat", "concat", inputs=("chunk.0", "chunk.1"), output_bytes=8.0)), micro_batch=1).check()
    assert consumer_counts(split)["x"] == 1 and not sums_of(with_gradient_sums(split))


def test_a_measured_layer_keeps_its_measured_time():
    """graph.txt's ResNet-50: every residual input gets its sum, priced 0 s (the measured backward holds
    whatever autograd ran), so the simulated times are the file's."""
    spec = resolve_model({"name": "r50", "family": "profile", "format": "pipedream", "profile_batch": 128,
                          "path": str(PROFILES / "pipedream_resnet50_graph.txt")})
    graph = spec.layer_graph(shard(128))
    sums = sums_of(graph)
    assert len(sums) == 16 and all(op.measured_s == 0.0 for op in sums)
    model = ComputeModel(ACCELERATORS.get("a100-sxm-80g"), "fp32")
    for layer in graph.layers:
        if any(is_gradient_sum(op) for op in layer.backward):
            assert model.ops_time_s(layer.backward) == pytest.approx(layer.measured_backward_s)


@pytest.mark.parametrize("model, sums", [("resnet50", 16), ("inception-v3", 36), ("se-resnext101-32x4d", 66),
                                         ("efficientnet-b0", 25), ("unet", 4), ("vit-b-16", 24 + 24)])
def test_catalog_networks_sum_at_every_fan_out(model, sums):
    """ResNet-50: one per bottleneck (its input feeds conv1 and the shortcut); Inception-v3: the branch
    points; SE-ResNeXt: also the excitation's input; ViT: each block's two residual inputs plus two adds
    of the packed q/k/v gradient inside each attention layer (nn.MultiheadAttention)."""
    graph = resolve_model(model).layer_graph(shard(2, "bf16"))
    assert len(sums_of(graph)) == sums
    counts = consumer_counts(graph)
    for layer in graph.layers:
        fan_out = [op for op in layer.backward if op.name == f"{layer.name}.gradient_sum"]
        assert len(fan_out) == max(0, counts[layer.name] - 1)
        assert all(op.bytes_moved == 3 * layer.output_bytes for op in fan_out)


def test_tensor_parallel_puts_the_sums_back_at_the_split_sizes():
    """ViT-B/16 at tp 2: the residual stream stays whole on every rank (its sums as at tp 1), the packed
    q/k/v gradient is split by heads (its sums halve)."""
    whole = resolve_model("vit-b-16").layer_graph(shard(2, "bf16"))
    split = resolve_model("vit-b-16").layer_graph(shard(2, "bf16", tp=2))
    assert tensor_parallel_graph(whole, 1) is whole
    for a, b in zip(whole.layers, split.layers, strict=True):
        ours = [op.bytes_moved for op in a.backward if is_gradient_sum(op)]
        theirs = [op.bytes_moved for op in b.backward if is_gradient_sum(op)]
        if a.kind == "attention":
            assert theirs == [x / 2 for x in ours]
        else:
            assert theirs == ours


# -- what autograd runs -----------------------------------------------------------------------------

def autograd_sums(module, sample) -> tuple[int, float]:
    """(adds, bytes) of the gradient sums autograd runs in ``module(sample).sum().backward()``: a node
    input that k edges of the backward graph feed receives k gradients and adds them k - 1 times
    (``torch/csrc/autograd/input_buffer.cpp``), each reading two and writing one of its size;
    parameters (AccumulateGrad) left out. One thread: these small CPU passes run 10x faster so on a
    shared host."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _autograd_sums(module, sample)
    finally:
        torch.set_num_threads(threads)


def _autograd_sums(module, sample) -> tuple[int, float]:
    out = module.train()(sample)
    incoming: dict[tuple, int] = {}
    seen, stack = {out.grad_fn}, [out.grad_fn]
    while stack:
        node = stack.pop()
        for fn, index in node.next_functions:
            if fn is None or type(fn).__name__ == "AccumulateGrad":
                continue
            incoming[(fn, index)] = incoming.get((fn, index), 0) + 1
            if fn not in seen:
                seen.add(fn)
                stack.append(fn)
    sizes: dict[tuple, int] = {}
    for fn, index in [key for key, k in incoming.items() if k > 1]:
        fn.register_prehook(lambda grads, fn=fn, index=index: sizes.__setitem__(
            (fn, index), grads[index].numel() * grads[index].element_size()))
    out.sum().backward()
    return sum(k - 1 for k in incoming.values() if k > 1), sum(
        3 * (k - 1) * sizes[key] for key, k in incoming.items() if k > 1)


# small widths and depths (the wiring is what is tested): each case well under a CPU-second or two
TORCH_NETS = [("ResNet", [3, 32, 32], {"blocks": [2, 1, 1, 1], "num_classes": 10}),
              ("VisionTransformer", [3, 64, 64], {"image": 64, "layers": 2, "heads": 4, "hidden": 64, "mlp": 128,
                                                  "num_classes": 10}),
              ("UNet", [1, 188, 188], {"base": 4}), ("MixedOps", [3, 16, 16], {}),
              ("efficientnet", [3, 32, 32], {"w": 0.25, "d": 0.5}),
              ("resnext", [3, 32, 32], {"blocks": [1, 1, 1, 1], "se": 16})]


@pytest.mark.parametrize("name, shape, kwargs", TORCH_NETS, ids=[n for n, _, _ in TORCH_NETS])
def test_the_graphs_sums_are_what_autograd_runs(name, shape, kwargs):
    """Residual inputs, U-Net skips, SE gates, a chunk (no sum: its pieces' gradients are gathered),
    nn.MultiheadAttention's packed q/k/v: the traced graph holds autograd's adds, and their bytes."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(TESTS))
    import torch_nets

    torch.manual_seed(0)
    adds, nbytes = autograd_sums(getattr(torch_nets, name)(**kwargs), torch.randn(2, *shape))
    graph = resolve_model({"torch": f"torch_nets:{name}", "input_shape": shape, "kwargs": kwargs}).layer_graph(shard())
    sums = sums_of(graph)
    assert len(sums) == adds
    assert sum(op.bytes_moved for op in sums) == nbytes


def test_swin_patch_merging_and_window_attention_sums_are_what_autograd_runs(torchvision):
    """torchvision's Swin: q, k, v selected from one permuted tensor (two adds of it) and the patch
    merging's four strided slices of one padded map (three adds)."""
    torch = pytest.importorskip("torch")
    small = {"patch_size": [4, 4], "embed_dim": 16, "depths": [2, 2], "num_heads": [2, 4], "window_size": [4, 4],
             "stochastic_depth_prob": 0.0, "num_classes": 10}
    torch.manual_seed(0)
    module = torchvision.models.swin_transformer.SwinTransformer(**small)
    adds, nbytes = autograd_sums(module, torch.randn(2, 3, 32, 32))
    graph = resolve_model({"torch": "torchvision.models.swin_transformer:SwinTransformer",
                           "input_shape": [3, 32, 32], "kwargs": small}).layer_graph(shard())
    sums = sums_of(graph)
    assert len(sums) == adds == 19
    assert sum(op.bytes_moved for op in sums) == nbytes
