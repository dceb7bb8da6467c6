"""The catalog's networks other than decoder transformers: parameters, FLOPs and saved
activation bytes of their layer graphs against torchvision's published figures and what PyTorch
itself saves, and invariants over micro-batch sizes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import ConfigError
from workloads.catalog import resolve_model
from workloads.graph import ShardShape

# torchvision 0.28 documents, per model, the parameter count (``weights.meta["num_params"]``) and
# forward GFLOPS (its ``_ops``, in GMAC at the weights' input size).
TORCHVISION_PARAMS = {
    "resnet50": 25_557_032, "resnet152": 60_192_808, "wide-resnet101-2": 126_886_696, "vgg16": 138_357_544,
}
TORCHVISION_GMAC = {"resnet50": 4.09, "resnet152": 11.51, "wide-resnet101-2": 22.75, "vgg16": 15.47}
TORCHVISION_NAMES = {"resnet50": "resnet50", "resnet152": "resnet152", "wide-resnet101-2": "wide_resnet101_2",
                     "vgg16": "vgg16"}


def shard(batch: int = 1, precision: str = "fp32", **kw) -> ShardShape:
    return ShardShape(micro_batch=batch, seq_length=1, precision=precision, **kw)


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_parameters_equal_torchvision(name):
    assert resolve_model(name).layer_graph(shard()).total_params() == TORCHVISION_PARAMS[name]


@pytest.mark.parametrize("name", sorted(TORCHVISION_GMAC))
def test_forward_macs_equal_torchvision(name):
    gmac = resolve_model(name).layer_graph(shard()).forward_flops() / 2 / 1e9
    assert gmac == pytest.approx(TORCHVISION_GMAC[name], abs=0.006)


def test_resnet50_is_4_1_gmac_at_224():
    """He et al. 2016 Table 1: 3.8·10^9 FLOPs (multiply-adds, v1); torchvision's v1.5 and the
    common count: 4.1 GMAC."""
    gmac = resolve_model("resnet50").layer_graph(shard()).forward_flops() / 2 / 1e9
    assert gmac == pytest.approx(4.1, rel=0.02)


@pytest.mark.parametrize("name", sorted(TORCHVISION_NAMES))
def test_parameters_equal_torchvision_modules(name):
    torchvision = pytest.importorskip("torchvision")
    module = getattr(torchvision.models, TORCHVISION_NAMES[name])()
    assert resolve_model(name).layer_graph(shard()).total_params() == sum(p.numel() for p in module.parameters())


def test_convolution_is_an_implicit_gemm_with_dgrad_and_wgrad():
    """ResNet-50's first convolution at batch 2: M = 2·112·112, N = 64, K = 3·7·7; no data
    gradient (the image needs none); layer1.0.conv2 has one."""
    graph = resolve_model("resnet50").layer_graph(shard(2))
    conv1 = graph.layer("conv1")
    (fwd,) = conv1.forward
    assert (fwd.m, fwd.n, fwd.k) == (2 * 112 * 112, 64, 147)
    assert fwd.flops == 2 * 2 * 112 * 112 * 64 * 147
    assert [op.name for op in conv1.backward] == ["conv1.conv.wgrad"]
    conv2 = graph.layer("layer1.0.conv2")
    assert [op.name for op in conv2.backward] == ["layer1.0.conv2.conv.dgrad", "layer1.0.conv2.conv.wgrad"]
    assert conv2.backward_flops == 2 * conv2.forward_flops
    assert conv2.saved_bytes == 0  # its input is relu1's output, saved by relu1
    assert graph.layer("layer1.0.relu1").saved_bytes == 2 * 64 * 56 * 56 * 4


sys.path.insert(0, str(Path(__file__).parent))  # tests/torch_nets.py


def _torch_saved(module, batch, size=224):
    torch = pytest.importorskip("torch")
    from torch_nets import saved_activation_bytes
    torch.manual_seed(0)
    module.train()
    return saved_activation_bytes(module, torch.randn(batch, 3, size, size))


def test_resnet50_saved_bytes_equal_what_pytorch_saves():
    pytest.importorskip("torch")
    from torch_nets import ResNet
    measured = _torch_saved(ResNet(), 2)
    assert resolve_model("resnet50").layer_graph(shard(2)).saved_bytes() == measured


def test_vgg16_saved_bytes_equal_what_pytorch_saves_without_dropout():
    """Dropout is left out: on the CPU PyTorch keeps a float noise tensor, on a GPU (what the
    graph models) a one-byte mask."""
    pytest.importorskip("torch")
    from torch_nets import vgg16
    measured = _torch_saved(vgg16(dropout=0.0), 1)
    spec = resolve_model("vgg16").model_copy(update={"dropout": 0.0})
    assert spec.layer_graph(shard(1)).saved_bytes() == measured


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(sorted(TORCHVISION_PARAMS)), batch=st.integers(1, 512),
       precision=st.sampled_from(["fp32", "bf16"]))
def test_work_and_memory_scale_with_the_micro_batch(name, batch, precision):
    spec = resolve_model(name)
    one, many = spec.layer_graph(shard(1, precision)), spec.layer_graph(shard(batch, precision))
    assert many.total_params() == one.total_params()
    assert many.forward_flops() == pytest.approx(batch * one.forward_flops())
    assert many.backward_flops() == pytest.approx(batch * one.backward_flops())
    assert many.backward_flops() < 2 * many.forward_flops()  # the first layer has no dgrad
    stats = sum(2 * layer.output_shape[0] * 4 for layer in one.layers if layer.kind == "batchnorm")
    assert many.saved_bytes() - stats == pytest.approx(batch * (one.saved_bytes() - stats))
    assert many.micro_batch == batch and many.sample == "image" and spec.seq_length is None
    assert many.layers[-1].output_shape == (1000,)


@pytest.mark.parametrize("split", [{"tp": 2}, {"cp": 2}, {"sequence_parallel": True}])
def test_convolutional_layers_refuse_tensor_context_and_sequence_splits(split):
    with pytest.raises(ConfigError, match="resnet50"):
        resolve_model("resnet50").layer_graph(shard(2, **split))


def test_inline_network_mapping_and_unknown_family():
    spec = resolve_model({"name": "resnet18-ish", "family": "resnet", "block": "basic", "blocks": [2, 2, 2, 2]})
    assert spec.layer_graph(shard()).total_params() == 11_689_512  # torchvision resnet18
    with pytest.raises(ConfigError, match="model"):
        resolve_model({"name": "x", "family": "capsnet"})


def test_scenario_with_a_network_is_refused_until_planned():
    from simulator.scenario import load_scenario
    with pytest.raises(ConfigError, match="resnet50"):
        load_scenario({"model": "resnet50", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8}})
