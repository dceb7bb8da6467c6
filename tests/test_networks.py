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
from workloads.networks.torch_import import TORCHVISION_KWARGS

# torchvision 0.28 documents, per model, the parameter count (``weights.meta["num_params"]``) and
# forward GFLOPS (its ``_ops``, in GMAC at the weights' input size).
TORCHVISION_PARAMS = {
    "resnet50": 25_557_032, "resnet152": 60_192_808, "wide-resnet101-2": 126_886_696, "vgg16": 138_357_544,
    "inception-v3": 27_161_264, "vit-b-16": 86_567_656, "vit-l-16": 304_326_632,
    "efficientnet-b0": 5_288_548, "efficientnet-b4": 19_341_616,
}
TORCHVISION_GMAC = {"resnet50": 4.09, "resnet152": 11.51, "wide-resnet101-2": 22.75, "vgg16": 15.47,
                    "vit-b-16": 17.56, "vit-l-16": 61.55, "efficientnet-b0": 0.39, "efficientnet-b4": 4.39}
TORCHVISION_NAMES = {"resnet50": "resnet50", "resnet152": "resnet152", "wide-resnet101-2": "wide_resnet101_2",
                     "vgg16": "vgg16", "inception-v3": "inception_v3", "vit-b-16": "vit_b_16", "vit-l-16": "vit_l_16",
                     "efficientnet-b0": "efficientnet_b0", "efficientnet-b4": "efficientnet_b4"}
CATALOG = sorted([*TORCHVISION_PARAMS, "unet", "gnmt-16", "biglstm", "bert-large", "resnext101-32x4d",
                  "se-resnext101-32x4d"])


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
def test_parameters_equal_torchvision_modules(name, torchvision):
    module = getattr(torchvision.models, TORCHVISION_NAMES[name])(**TORCHVISION_KWARGS.get(TORCHVISION_NAMES[name], {}))
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
    channels = next(m for m in module.modules() if isinstance(m, torch.nn.Conv2d)).in_channels
    return saved_activation_bytes(module, torch.randn(batch, channels, size, size))


def test_resnet50_saved_bytes_equal_what_pytorch_saves():
    pytest.importorskip("torch")
    from torch_nets import ResNet
    measured = _torch_saved(ResNet(), 2)
    assert resolve_model("resnet50").layer_graph(shard(2)).saved_bytes() == measured


def test_vit_saved_bytes_equal_what_pytorch_saves():
    """A small ViT (torchvision's encoder block: ``nn.MultiheadAttention`` on the fused kernel, what
    ``training.attention: flash`` asks for)."""
    pytest.importorskip("torch")
    from torch_nets import VisionTransformer
    measured = _torch_saved(VisionTransformer(64, 16, 2, 4, 64, 128, 10), 3, size=64)
    spec = resolve_model({"name": "vit-tiny", "family": "vit", "image_size": 64, "num_layers": 2, "num_heads": 4,
                          "hidden_dim": 64, "mlp_dim": 128, "num_classes": 10})
    assert spec.layer_graph(shard(3, flash_attention=True)).saved_bytes() == measured


def test_unet_saved_bytes_equal_what_pytorch_saves():
    pytest.importorskip("torch")
    from torch_nets import UNet
    measured = _torch_saved(UNet(1, 2, 8, 2), 2, size=60)
    spec = resolve_model({"name": "unet-small", "family": "unet", "image_size": 60, "base_channels": 8, "depth": 2})
    assert spec.layer_graph(shard(2)).saved_bytes() == measured


def test_vgg16_saved_bytes_equal_what_pytorch_saves_without_dropout():
    """Dropout is left out: on the CPU PyTorch keeps a float noise tensor, on a GPU (what the
    graph models) a one-byte mask."""
    pytest.importorskip("torch")
    from torch_nets import vgg16
    measured = _torch_saved(vgg16(dropout=0.0), 1)
    spec = resolve_model("vgg16").model_copy(update={"dropout": 0.0})
    assert spec.layer_graph(shard(1)).saved_bytes() == measured


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(CATALOG), batch=st.integers(3, 512), precision=st.sampled_from(["fp32", "bf16"]))
def test_work_and_memory_scale_with_the_micro_batch(name, batch, precision):
    """Parameters do not depend on the micro-batch; FLOPs are proportional to it; saved bytes
    are affine in it (batch-norm statistics are per channel, not per sample)."""
    spec = resolve_model(name)
    one, two, many = (spec.layer_graph(shard(b, precision)) for b in (1, 2, batch))
    assert many.total_params() == one.total_params()
    assert many.forward_flops() == pytest.approx(batch * one.forward_flops())
    assert many.backward_flops() == pytest.approx(batch * one.backward_flops())
    assert many.saved_bytes() == pytest.approx(one.saved_bytes() + (batch - 1) * (two.saved_bytes() - one.saved_bytes()))
    assert many.micro_batch == batch and many.sample == spec.sample and many.seq_length == spec.seq_length
    assert sum(layer.output_bytes for layer in many.layers) == pytest.approx(
        batch * sum(layer.output_bytes for layer in one.layers))


@pytest.mark.parametrize("name", CATALOG)
def test_every_catalog_network_builds_a_checked_graph(name):
    spec = resolve_model(name)
    assert spec.source
    graph = spec.layer_graph(shard(2, "bf16"))
    assert graph.check() is graph and graph.name == name
    assert 0 < graph.forward_flops() < graph.backward_flops() <= 2.5 * graph.forward_flops()  # flash attention: 2.5x
    assert all(layer.saved_bytes >= 0 and layer.output_bytes > 0 for layer in graph.layers)


@pytest.mark.parametrize("name, published, tolerance", [
    ("biglstm", 1.8e9, 0.02),      # Jozefowicz et al. 2016 Table 1, 2-layer LSTM-8192-1024
    ("bert-large", 340e6, 0.02),   # Devlin et al. 2019 Sec. 3
    ("resnext101-32x4d", 44.18e6, 1e-4),      # NVIDIA DLE ConvNets README (torchvision has no 101-32x4d)
    ("se-resnext101-32x4d", 48.96e6, 1e-4),   # Hu et al. 2018; Cadene pretrainedmodels se_resnext101_32x4d
])
def test_parameters_match_the_papers(name, published, tolerance):
    assert resolve_model(name).layer_graph(shard()).total_params() == pytest.approx(published, rel=tolerance)


def test_parameters_equal_the_published_per_layer_profiles():
    """Parameter bytes / 4 summed over PipeDream's GNMT-16 profile (profiler/translation/profiles/
    gnmt_large/graph.txt) and DAPPLE's BERT-24 profile (profiling_results/bert-24-pbs-6.txt, the
    encoder with its pooler, no pre-training heads)."""
    assert resolve_model("gnmt-16").layer_graph(shard()).total_params() == 277_717_568
    bert = resolve_model("bert-large").model_copy(update={"pretraining_heads": False})
    assert bert.layer_graph(shard()).total_params() == 335_141_888


def test_unet_output_is_388_by_388_with_two_classes():
    """Ronneberger et al. 2015 Fig. 1: a 572×572 tile gives a 388×388 two-class map."""
    graph = resolve_model("unet").layer_graph(shard())
    assert graph.layers[-1].output_shape == (2, 388, 388)
    assert graph.total_params() == 31_030_658


def test_an_lstm_layer_holds_what_torch_nn_lstm_holds():
    torch = pytest.importorskip("torch")
    from workloads.networks.builder import NetBuilder
    net = NetBuilder("lstm", 4, 2, "sequence", 7)
    x = net.input(7, 48)
    y = net.lstm("bi", x, 32, bidirectional=True)
    net.lstm("projected", y, 64, projection=16)
    graph = net.output()
    assert graph.layer("bi").params == sum(p.numel() for p in torch.nn.LSTM(48, 32, bidirectional=True).parameters())
    assert graph.layer("projected").params == sum(p.numel() for p in torch.nn.LSTM(64, 64, proj_size=16).parameters())
    assert graph.layer("projected").output_shape == (7, 16)
    recurrent = next(op for op in graph.layer("projected").forward if op.name.endswith("recurrent_gemm"))
    assert (recurrent.m, recurrent.n, recurrent.k, recurrent.batch) == (4, 4 * 64, 16, 7)


@pytest.mark.parametrize("split", [{"tp": 2}, {"cp": 2}, {"sequence_parallel": True}])
def test_convolutional_layers_refuse_tensor_context_and_sequence_splits(split):
    with pytest.raises(ConfigError, match="resnet50"):
        resolve_model("resnet50").layer_graph(shard(2, **split))


def test_inline_network_mapping_and_unknown_family():
    spec = resolve_model({"name": "resnet18-ish", "family": "resnet", "block": "basic", "blocks": [2, 2, 2, 2]})
    assert spec.layer_graph(shard()).total_params() == 11_689_512  # torchvision resnet18
    with pytest.raises(ConfigError, match="model"):
        resolve_model({"name": "x", "family": "capsnet"})


def test_scenario_with_a_network_loads_and_refuses_a_sequence_length():
    # Networks are planned like any layer graph (tests/test_graph_simulate.py); a sequence length
    # only applies to a decoder transformer.
    from simulator.scenario import load_scenario
    sc = load_scenario({"model": "resnet50", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
                        "parallelism": {"global_batch_size": 8}})
    assert sc.seq_length is None and len(sc.layer_graph().pipelined) == len(sc.layer_graph().layers)
    with pytest.raises(ConfigError, match="training.seq_length"):
        load_scenario({"model": "resnet50", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
                       "parallelism": {"global_batch_size": 8}, "training": {"seq_length": 128}})


def test_specs_list_shows_the_networks(capsys):
    from simulator.cli import main
    assert main(["specs", "list", "--kind", "network"]) == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "25.6 M params, 4.09 GMAC/sample" in out and "gnmt-16" in out
    assert main(["specs", "show", "vit-b-16"]) == 0
    assert "family: vit" in capsys.readouterr().out


def test_resnext101_32x4d_is_about_8_gmac_with_32_groups_of_4_channels_in_its_first_stage():
    """Xie et al. 2017 Table 1: ResNeXt-101 (32x4d) 7.8·10^9 FLOPs (multiply-adds, stride on the 1×1 as
    in ResNet v1); DLE's (and this) v1.5 layout strides on the grouped 3×3, +0.2 GMAC as ResNet-50 v1.5's
    4.1 against v1's 3.8. The SE blocks add 0.005 GMAC."""
    graph = resolve_model("resnext101-32x4d").layer_graph(shard())
    assert graph.forward_flops() / 2e9 == pytest.approx(7.97, abs=0.01)
    conv2 = graph.layer("layer1.0.conv2").forward[0]
    assert (conv2.batch, conv2.n, conv2.k) == (32, 4, 4 * 9)   # 32 GEMMs of C_out 4, K = 4 channels x 3x3
    se = resolve_model("se-resnext101-32x4d").layer_graph(shard())
    assert 0 < se.forward_flops() / 2e9 - 7.97 < 0.01


def test_efficientnet_depthwise_convolutions_have_one_channel_per_group():
    graph = resolve_model("efficientnet-b0").layer_graph(shard(2))
    dw = graph.layer("features.2.0.depthwise.conv").forward[0]
    assert (dw.batch, dw.n, dw.k) == (96, 1, 9) and dw.m == 2 * 56 * 56   # 16 -> 96 channels, 3x3, stride 2
    assert graph.layer("features.2.0.se.scale").kind == "other"
    assert graph.layer("features.2.1.add").kind == "add"                  # stride 1, 24 -> 24 channels


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("torch_net, kwargs, spec", [
    ("efficientnet", {"w": 1.0, "d": 1.0, "dropout": 0.0},
     {"family": "efficientnet", "image_size": 64, "dropout": 0.0}),
    ("efficientnet", {"w": 1.0, "d": 1.0, "dropout": 0.0, "wide": True},
     {"family": "efficientnet", "image_size": 64, "dropout": 0.0, "se_on_expanded": True}),
    ("resnext", {}, {"family": "resnet", "blocks": [3, 4, 23, 3], "groups": 32, "width_per_group": 4,
                     "image_size": 64}),
    ("resnext", {"se": 16}, {"family": "resnet", "blocks": [3, 4, 23, 3], "groups": 32, "width_per_group": 4,
                             "image_size": 64, "se_reduction": 16}),
])
def test_grouped_depthwise_and_se_networks_hold_and_save_what_pytorch_does(torch_net, kwargs, spec):
    """EfficientNet-B0 (and DLE's widese squeeze), ResNeXt-101 32x4d and SE-ResNeXt-101 32x4d against
    hand-written PyTorch modules (tests/torch_nets.py, after torchvision 0.28 and Hu et al. 2018; in-place
    SiLU and ReLU as torchvision's): parameters and the bytes autograd saves at 64x64, batch 2."""
    pytest.importorskip("torch")
    import torch_nets
    module = getattr(torch_nets, torch_net)(**kwargs)
    graph = resolve_model({"name": "x", **spec}).layer_graph(shard(2))
    assert graph.total_params() == sum(p.numel() for p in module.parameters())
    assert graph.saved_bytes() == _torch_saved(module, 2, 64)


def test_the_torch_stand_ins_hold_the_published_parameter_counts():
    pytest.importorskip("torch")
    from torch_nets import efficientnet, resnext
    assert sum(p.numel() for p in efficientnet(1.0, 1.0).parameters()) == TORCHVISION_PARAMS["efficientnet-b0"]
    assert sum(p.numel() for p in efficientnet(1.4, 1.8).parameters()) == TORCHVISION_PARAMS["efficientnet-b4"]
    assert sum(p.numel() for p in resnext().parameters()) == 44_177_704
    assert sum(p.numel() for p in resnext(se=16).parameters()) == 48_955_416
