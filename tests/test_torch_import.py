"""Importing a PyTorch module (traced on the meta device) as a layer graph: the same graph as the
catalog's builder for the same network, what PyTorch itself saves, and one ConfigError naming the
layer for models that cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import ConfigError
from workloads.catalog import resolve_model
from workloads.graph import ShardShape
from workloads.networks.torch_import import import_torchvision

torch = pytest.importorskip("torch")
TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # tests/torch_nets.py


def shard(batch: int = 2, precision: str = "fp32") -> ShardShape:
    return ShardShape(micro_batch=batch, seq_length=1, precision=precision)


def summary(graph):
    return graph.total_params(), graph.forward_flops(), graph.backward_flops(), graph.saved_bytes()


@pytest.mark.parametrize("callable_, shape, catalog", [
    ("torch_nets:ResNet", [3, 224, 224], "resnet50"),
    ("torch_nets:vgg16", [3, 224, 224], "vgg16"),
    ("torch_nets:VisionTransformer", [3, 224, 224], "vit-b-16"),
    ("torch_nets:UNet", [1, 572, 572], "unet"),
])
def test_a_traced_module_gives_the_catalog_builders_graph(callable_, shape, catalog):
    spec = resolve_model({"torch": callable_, "input_shape": shape})
    for precision in ("fp32", "bf16"):
        assert summary(spec.layer_graph(shard(2, precision))) == summary(resolve_model(catalog).layer_graph(
            shard(2, precision)))


def test_traced_parameters_equal_the_modules():
    from torch_nets import UNet, VisionTransformer
    for module, ref, shape in ((VisionTransformer(), "torch_nets:VisionTransformer", [3, 224, 224]),
                               (UNet(), "torch_nets:UNet", [1, 572, 572])):
        spec = resolve_model({"torch": ref, "input_shape": shape})
        assert spec.layer_graph(shard()).total_params() == sum(p.numel() for p in module.parameters())


def test_traced_saved_bytes_equal_what_pytorch_saves():
    from torch_nets import VisionTransformer, saved_activation_bytes
    torch.manual_seed(0)
    module = VisionTransformer(64, 16, 2, 4, 64, 128, 10).train()
    measured = saved_activation_bytes(module, torch.randn(3, 3, 64, 64))
    spec = resolve_model({"torch": "torch_nets:VisionTransformer", "input_shape": [3, 64, 64],
                          "kwargs": {"image": 64, "layers": 2, "heads": 4, "hidden": 64, "mlp": 128,
                                     "num_classes": 10}})
    assert spec.layer_graph(shard(3)).saved_bytes() == measured
    assert spec.name == "VisionTransformer" and spec.seq_length is None


def test_torchvision_models_import_with_their_input_size(torchvision):
    spec = resolve_model("torchvision:resnet50")
    assert spec.input_shape == (3, 224, 224)
    module = torchvision.models.resnet50()
    assert spec.layer_graph(shard()).total_params() == sum(p.numel() for p in module.parameters())
    assert resolve_model("torchvision:inception_v3").input_shape == (3, 299, 299)


@pytest.mark.parametrize("ref, field, reason", [
    ({"torch": "torch_nets:DataDependent", "input_shape": [8]}, "model.torch", "cannot be traced"),
    ({"torch": "torch_nets:WithRecurrence", "input_shape": [3, 8, 8]}, "model.layers.rnn", "unknown module kind LSTM"),
    ({"torch": "torch_nets:ResNet", "input_shape": [5, 32, 32]}, "model.input_shape", "does not run"),
    ({"torch": "no_such_package.models:net", "input_shape": [3]}, "model.torch", "cannot import"),
    ({"torch": "torch_nets:NoSuchModel", "input_shape": [3]}, "model.torch", "no callable"),
    ({"torch": "torch_nets", "input_shape": [3]}, "model.torch", "pkg.module:callable"),
    ({"torch": "torch_nets:ResNet", "input_shape": [3, 224, 224], "kwargs": {"depth": 3}}, "model.torch", "failed"),
])
def test_models_that_cannot_be_imported_are_one_config_error(ref, field, reason):
    with pytest.raises(ConfigError) as info:
        resolve_model(ref).layer_graph(shard())
    assert info.value.field == field and reason in info.value.reason


def test_without_torchvision_the_error_says_what_to_install():
    try:
        import_torchvision()
    except ImportError:
        with pytest.raises(ConfigError, match="clustersim\\[torch\\]"):
            resolve_model("torchvision:resnet50").layer_graph(shard())
    else:
        pytest.skip("torchvision is installed")


def test_cli_names_the_layer_of_a_model_that_cannot_be_imported(tmp_path):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("model: {torch: 'torch_nets:WithRecurrence', input_shape: [3, 8, 8]}\n"
                        "cluster: {node: dgx-a100-80g, num_gpus: 8}\n")
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{TESTS.parent}"}
    proc = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(scenario)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.layers.rnn" in lines[0] and "LSTM" in lines[0]


@settings(max_examples=6, deadline=None)
@given(blocks=st.tuples(*[st.integers(1, 3)] * 4), width=st.sampled_from([16, 64, 128]),
       image=st.sampled_from([64, 96, 224]), batch=st.integers(1, 64))
def test_traced_resnets_equal_the_builder_and_the_module(blocks, width, image, batch):
    """Any ResNet shape: the traced module's parameters are ``sum(p.numel())`` and its graph is the
    builder's (FLOPs, saved bytes) at any micro-batch."""
    from torch_nets import ResNet
    with torch.device("meta"):
        module = ResNet(blocks, width)
    spec = resolve_model({"torch": "torch_nets:ResNet", "input_shape": [3, image, image],
                          "kwargs": {"blocks": list(blocks), "width_per_group": width}})
    built = resolve_model({"name": "r", "family": "resnet", "blocks": list(blocks), "width_per_group": width,
                           "image_size": image})
    traced = spec.layer_graph(shard(batch, "bf16"))
    assert traced.total_params() == sum(p.numel() for p in module.parameters())
    assert summary(traced) == summary(built.layer_graph(shard(batch, "bf16")))
