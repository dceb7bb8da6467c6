"""Measured per-layer profiles (PipeDream/DAPPLE graph.txt, DeepPool) as layer graphs with measured
times: what the files say, scaled to the micro-batch; the same parameters and FLOPs as the builders
of the same networks; one ConfigError for a bad file."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware_specs.catalog import ACCELERATORS
from simulator.cost.compute import ComputeModel
from simulator.errors import ConfigError
from workloads.catalog import resolve_model
from workloads.graph import ShardShape
from workloads.networks.profiles import deeppool_graph, pipedream_graph

DATA = Path(__file__).parent.parent / "validation" / "data" / "profiles"


def shard(batch: int, precision: str = "fp32") -> ShardShape:
    return ShardShape(micro_batch=batch, seq_length=1, precision=precision)


def profiled(path: str, fmt: str, batch: int, **kw):
    spec = resolve_model({"name": path, "family": "profile", "format": fmt, "path": str(DATA / path), **kw})
    return spec.layer_graph(shard(batch))


def test_pipedream_resnet50_times_scale_with_the_micro_batch():
    """graph.txt line 1: node77, BatchNorm2d(512), forward 1.236 ms, backward 1.442 ms, output
    205,520,896 bytes at the profiled minibatch of 128; node76 (Conv2d 128->512) feeds it."""
    full = profiled("pipedream_resnet50_graph.txt", "pipedream", 128, profile_batch=128)
    half = profiled("pipedream_resnet50_graph.txt", "pipedream", 64, profile_batch=128)
    bn = full.layer("node77")
    assert bn.kind == "batchnorm" and "node76" in bn.inputs
    assert bn.measured_forward_s == pytest.approx(1.236e-3) and bn.measured_backward_s == pytest.approx(1.442e-3)
    assert bn.output_bytes == pytest.approx(205_520_896) and bn.params == 1024
    assert half.layer("node77").measured_forward_s == pytest.approx(0.618e-3)
    assert half.layer("node77").output_bytes == pytest.approx(205_520_896 / 2)
    assert full.layers[0].name == "input" and full.layers[0].measured_forward_s is None  # data loading dropped
    assert len(full.layers) == 177 and full.total_params() == resolve_model("resnet50").layer_graph(shard(1)).total_params()


def test_bf16_halves_the_profiled_bytes_not_the_times():
    fp32 = profiled("pipedream_vgg16_graph.txt", "pipedream", 128, profile_batch=128)
    spec = resolve_model({"name": "v", "family": "profile", "format": "pipedream",
                          "path": str(DATA / "pipedream_vgg16_graph.txt"), "profile_batch": 128})
    bf16 = spec.layer_graph(shard(128, "bf16"))
    assert sum(x.output_bytes for x in bf16.layers) == pytest.approx(sum(x.output_bytes for x in fp32.layers) / 2)
    assert [x.measured_forward_s for x in bf16.layers] == [x.measured_forward_s for x in fp32.layers]
    assert bf16.total_params() == 138_357_544


def test_translation_and_bert_profiles_hold_the_builders_parameters():
    gnmt = profiled("pipedream_gnmt_large_graph.txt", "pipedream", 64, profile_batch=64, sample_kind="sentence")
    assert gnmt.total_params() == resolve_model("gnmt-16").layer_graph(shard(1)).total_params()
    assert gnmt.sample == "sentence"
    bert = profiled("dapple_bert-24-pbs-6.txt", "pipedream", 6, profile_batch=6, sample_kind="sequence",
                    sequence_length=512)
    heads_off = resolve_model("bert-large").model_copy(update={"pretraining_heads": False})
    assert bert.total_params() == heads_off.layer_graph(shard(1)).total_params()
    assert bert.seq_length == 512


def test_deeppool_block_sums_equal_the_files_footers():
    """vggLayerGpuProfileA100.txt: 'SUM(avg) 54.964' closes the batch-32 block, 'SUM(avg) 29.940'
    the batch-16 one; the layers' forward + backward add up to them (3-decimal rounding)."""
    for batch, footer_ms in ((32, 54.964), (16, 29.940)):
        graph = profiled("deeppool_vggLayerGpuProfileA100.txt", "deeppool", batch)
        total = sum(x.measured_forward_s + x.measured_backward_s for x in graph.layers)
        assert total * 1e3 == pytest.approx(footer_ms, abs=0.01)


def test_deeppool_vgg_convolutions_are_vgg16s():
    """The DeepPool VGG profile lists VGG-16's 13 convolutions: the same FLOPs as the builder's."""
    graph = profiled("deeppool_vggLayerGpuProfileA100.txt", "deeppool", 32)
    builder = resolve_model("vgg16").layer_graph(shard(32))
    convs = [x for x in graph.layers if x.kind == "conv2d"]
    assert len(convs) == 13
    assert sum(x.forward_flops for x in convs) == sum(x.forward_flops for x in builder.layers if x.kind == "conv2d")
    assert graph.is_chain()


def test_deeppool_interpolates_between_profiled_batches():
    g16, g24, g32 = (profiled("deeppool_vggLayerGpuProfileA100.txt", "deeppool", b) for b in (16, 24, 32))
    for a, mid, b in zip(g16.layers, g24.layers, g32.layers, strict=True):
        assert mid.measured_backward_s == pytest.approx((a.measured_backward_s + b.measured_backward_s) / 2)


def test_deeppool_prof_files_give_forward_and_backward_apart():
    """A100_vgg.prof, batch 32, first line: 1.088 ms = 1087 us forward + 3 us backward."""
    graph = profiled("deeppool_A100_vgg.prof", "deeppool", 32)
    first = graph.layers[0]
    assert (first.measured_forward_s, first.measured_backward_s) == (pytest.approx(1087e-6), pytest.approx(3e-6))
    assert [op.name for op in first.backward] == ["0.conv2d.conv.wgrad"]  # the image needs no gradient
    assert first.forward[0].flops == 2 * 32 * 224 * 224 * 64 * 27  # the kernel's FLOPs stay (for MFU)


def test_the_compute_model_uses_measured_times_where_a_layer_has_them():
    model = ComputeModel(ACCELERATORS.get("a100-sxm-80g"), "bf16")
    measured = profiled("deeppool_A100_vgg.prof", "deeppool", 32).layers[1]   # a ReLU: one memory op
    assert model.layer_time_s(measured, "forward") == measured.measured_forward_s
    assert model.ops_time_s(measured.backward) == pytest.approx(measured.measured_backward_s)  # via Op.measured_s
    pipedream = profiled("pipedream_vgg16_graph.txt", "pipedream", 128, profile_batch=128)
    assert sum(model.ops_time_s(x.forward) for x in pipedream.layers) == pytest.approx(
        sum(x.measured_forward_s or 0 for x in pipedream.layers))
    built = resolve_model("vgg16").layer_graph(shard(32, "bf16")).layers[0]
    assert model.layer_time_s(built, "backward") == pytest.approx(model.ops_time_s(built.backward))
    assert model.layer_time_s(built, "forward") > 0


def test_bad_profiles_are_one_config_error(tmp_path):
    node = ("node1 -- Input -- forward_compute_time=0.1, backward_compute_time=0.0, activation_size=4.0, "
            "parameter_size=0.0\n")
    conv = ("node2 -- Conv2d(3, 8) -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size=8.0, "
            "parameter_size=4.0\n")
    cases = {
        "garbage.txt": (node + "this is not a node\n", "pipedream", "garbage.txt line 2"),
        "dangling.txt": (node + "\tnode1 -- node9\n", "pipedream", "node9"),
        "cycle.txt": (node + conv + "\tnode1 -- node2\n\tnode2 -- node1\n", "pipedream", "cycle"),
        "deeppool.txt": ("conv2d{\"in_channels\":3}[4][3,8,8] fast\n", "deeppool", "line 1"),
    }
    for file, (text, fmt, reason) in cases.items():
        (tmp_path / file).write_text(text)
        spec = resolve_model({"name": "x", "family": "profile", "format": fmt, "path": str(tmp_path / file),
                              "profile_batch": 4})
        with pytest.raises(ConfigError, match=reason):
            spec.layer_graph(shard(4))
    spec = resolve_model({"name": "x", "family": "profile", "format": "pipedream",
                          "path": str(DATA / "pipedream_vgg16_graph.txt")})
    with pytest.raises(ConfigError, match="profile_batch"):
        spec.layer_graph(shard(4))
    with pytest.raises(ConfigError, match="not found"):
        resolve_model({"name": "x", "family": "profile", "format": "deeppool", "path": "nope.txt"}).layer_graph(shard(4))


def test_parsers_take_the_text_directly():
    text = (DATA / "pipedream_vgg16_graph.txt").read_text()
    assert pipedream_graph(text, "vgg", 128, shard(1)).micro_batch == 1
    text = (DATA / "deeppool_A100_wrn.prof").read_text()
    assert deeppool_graph(text, "wrn", shard(8)).layers[-1].measured_forward_s > 0


def test_a_profiled_model_simulates_at_its_measured_times():
    """PipeDream's ResNet-50 profile at its minibatch of 128 on one A100 replica: the step's compute
    is the profile's forward (182.488 ms without data loading) plus backward (260.931 ms)."""
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate
    scenario = load_scenario({
        "model": {"name": "r50", "family": "profile", "format": "pipedream", "profile_batch": 128,
                  "path": str(DATA / "pipedream_resnet50_graph.txt")},
        "cluster": {"node": "dgx-a100-80g", "num_gpus": 1},
        "parallelism": {"global_batch_size": 128, "micro_batch_size": 128},
        "training": {"precision": "fp32"}})
    result = simulate(scenario)
    assert result.time_breakdown_s["compute"] == pytest.approx(0.182488 + 0.260931, rel=1e-6)
    assert result.samples_per_s == pytest.approx(128 / result.step_time_s)
