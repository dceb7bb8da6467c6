"""Counted FLOPs of PipeDream/DAPPLE graph.txt profiles (issue 19: "MFU from counted FLOPs for all"):
a node's description is the PyTorch module's repr, its activation_size the output's fp32 bytes for the
profiled minibatch, so its kernels follow (workloads/networks/profiles.py). They equal the catalog
builders' for the same networks; a profile of bare block names counts none (MFU n/a); a layer string
that disagrees with its sizes is refused naming the node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.report.messages import scenario_messages
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from workloads.catalog import resolve_model
from workloads.graph import ShardShape
from workloads.networks.profiles import pipedream_graph

DATA = Path(__file__).resolve().parents[1] / "validation" / "data" / "profiles"
VGG16 = DATA / "pipedream_vgg16_graph.txt"
#: the profiled minibatch of each shipped PipeDream file: the Input node's 3x224x224 fp32 images (VGG-16,
#: ResNet-50); GNMT's LSTMs' final hidden state h_n, (1, batch, 1024) fp32 = 524,288 bytes: 128 (DAPPLE's
#: files say theirs in the name, ``pbs-N``)
PIPEDREAM_BATCH = {"pipedream_vgg16_graph.txt": 128, "pipedream_resnet50_graph.txt": 128,
                   "pipedream_gnmt_large_graph.txt": 128}
#: DAPPLE files whose nodes are bare block names (no module repr, no shapes): they count no FLOPs
BARE_NAMES = {"dapple_amoeba-18-pbs-8.txt", "dapple_bert-24-pbs-6.txt", "dapple_vgg-19-pbs-32.txt",
              "dapple_xlnet-24-pbs-1.txt"}
GRAPH_TXT = sorted(p.name for p in DATA.glob("*.txt") if "deeppool" not in p.name)


def _batch(name: str) -> int:
    match = re.search(r"pbs-(\d+)", name)
    return int(match[1]) if match else PIPEDREAM_BATCH[name]


def _shard(batch: int = 1) -> ShardShape:
    return ShardShape(micro_batch=batch, seq_length=1, precision="fp32")


def _gemm_flops(graph, phase: str) -> float:
    return sum(op.flops for layer in graph.layers for op in getattr(layer, phase) if op.kind in ("gemm", "attention"))


def test_every_shipped_graph_txt_is_listed():
    assert len(GRAPH_TXT) == 8 and set(GRAPH_TXT) >= BARE_NAMES and set(GRAPH_TXT) >= set(PIPEDREAM_BATCH)


def test_vgg16_graph_txt_counts_the_catalog_vgg16():
    """Forward 15.47 GMAC per 224x224 image (the catalog's, tests/test_networks.py), backward twice the
    forward but for the first convolution's data gradient (PyTorch skips it), and the 138,357,544
    parameters, all from the layer strings and output sizes."""
    graph = pipedream_graph(VGG16.read_text(), "vgg16", 128, _shard())
    catalog = resolve_model("vgg16").layer_graph(_shard())
    forward_gmac = _gemm_flops(graph, "forward") / 2 / 1e9
    assert forward_gmac == pytest.approx(15.47, rel=0.01)
    assert _gemm_flops(graph, "forward") == _gemm_flops(catalog, "forward")
    assert _gemm_flops(graph, "backward") == _gemm_flops(catalog, "backward")
    assert graph.total_params() == catalog.total_params() == 138_357_544
    assert graph.flops_counted_layers() == len(graph.layers) == 41
    node12 = graph.layer("node12")   # Conv2d(128, 256, 3x3) on 56x56: 411,041,792 / (4 x 128 x 256) = 56^2
    (conv,) = [op for op in node12.forward if op.kind == "gemm"]
    assert (conv.m, conv.n, conv.k) == (56 * 56, 256, 128 * 9)
    for layer in graph.layers:
        forward = sum(op.flops for op in layer.forward if op.kind == "gemm")
        backward = sum(op.flops for op in layer.backward if op.kind == "gemm")
        assert backward == (forward if layer.name == "node2" else 2 * forward)   # node2: the first conv


@pytest.mark.parametrize(("profile", "catalog"), [
    ("pipedream_resnet50_graph.txt", "resnet50"),
    ("pipedream_gnmt_large_graph.txt", {"name": "g", "family": "gnmt", "source_length": 25, "target_length": 25}),
    ("dapple_gnmt-16-pbs-64.txt", {"name": "g", "family": "gnmt", "source_length": 35, "target_length": 36,
                                   "vocab_size": 36_560}),
])
def test_graph_txt_counts_the_catalog_builders_flops_and_parameters(profile, catalog):
    """ResNet-50 (4.09 GMAC), and GNMT-16 at the profiles' own sentence lengths and vocabularies: the
    PipeDream file 25 + 25 tokens (its embeddings' outputs at the minibatch of 128), DAPPLE's 35 + 36
    (36,560 words); LSTMs, the emulated bidirectional LSTM, the Bahdanau attention and the classifier."""
    graph = pipedream_graph((DATA / profile).read_text(), profile, _batch(profile), _shard(2))
    built = resolve_model(catalog).layer_graph(_shard(2))
    for phase in ("forward", "backward"):
        assert _gemm_flops(graph, phase) == pytest.approx(_gemm_flops(built, phase), rel=1e-12)
    assert graph.total_params() == built.total_params()
    assert graph.flops_counted_layers() == len(graph.layers)


@pytest.mark.parametrize("profile", GRAPH_TXT)
def test_every_graph_txt_prints_mfu_or_says_why_not(profile):
    """Each shipped graph.txt simulated on one A100 at its profiled minibatch: a number for MFU and
    FLOPs > 0 wherever the nodes are module reprs; the four DAPPLE files of bare block names count none,
    so MFU is None (printed n/a, with the reason), never 0, and one NOTE names their layers."""
    batch = _batch(profile)
    scenario = load_scenario({
        "name": "p", "model": {"name": "p", "family": "profile", "format": "pipedream", "path": str(DATA / profile),
                               "profile_batch": batch},
        "cluster": {"node": "dgx-a100-80g", "num_gpus": 1},
        "parallelism": {"global_batch_size": batch, "micro_batch_size": batch}, "training": {"precision": "fp32"}})
    result = simulate(scenario)
    assert result.step_time_s > 0
    notes = [note for note in scenario_messages(scenario)["notes"] if "FLOPs counted for" in note]
    if profile in BARE_NAMES:
        assert result.model_flops_per_step == 0 and result.mfu is None and result.model_tflops_per_gpu is None
        (note,) = notes
        assert note.startswith("FLOPs counted for no layer of the profile: ") and note.endswith("MFU are n/a")
    else:
        assert result.model_flops_per_step > 0 and result.hardware_flops_per_step > 0
        assert isinstance(result.mfu, float) and 0 < result.mfu
        assert result.flops_counted_layers is None and not notes


def _vgg16_with(old: str, new: str) -> str:
    text = VGG16.read_text()
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(("old", "new", "reason"), [
    # 255 output channels: 411,041,792 bytes are not 4 x 128 x 255 x a whole number of pixels
    ("node12 -- Conv2d(128, 256,", "node12 -- Conv2d(128, 255,", r"model\.layers\.node12: .*not 4 \(fp32\) x "
                                                                 r"profile_batch 128 x 255 output channels"),
    # in_channels 127: the shape divides, the parameters (127 x 256 x 9 + 256) do not match parameter_size
    ("node12 -- Conv2d(128, 256,", "node12 -- Conv2d(127, 256,", r"model\.layers\.node12: .*holds 292,864 "
                                                                 r"parameters but its parameter_size says 295,168"),
    ("node12 -- Conv2d(128, 256, kernel_size=(3, 3)", "node12 -- Conv2d(128, kernel_size=(3, 3)",
     r"model\.layers\.node12: .*it gives no out_channels"),
    ("node35 -- Linear(in_features=25088, out_features=4096, bias=True)", "node35 -- Linear(in_features=25088, "
     "out_features=4096, bias=True", r"model\.layers\.node35: .*is not a module call"),
])
def test_a_layer_string_that_disagrees_with_its_sizes_is_refused_naming_the_node(old, new, reason):
    """Exit 2 (a ConfigError) rather than 0 with a NOTE: the profiler writes these strings from the module
    itself, so a string that does not parse or does not fit the node's own output and parameter sizes is a
    broken or edited file (or a wrong profile_batch), and counting it 0 would understate MFU for a typo."""
    with pytest.raises(ConfigError, match=reason):
        pipedream_graph(_vgg16_with(old, new), "vgg16", 128, _shard(), source="x.txt")


def test_a_wrong_profile_batch_shows_in_the_sizes():
    """VGG-16's 4,096-wide classifier output is 2,097,152 bytes: 4 x 128 x 4,096 x 1 row; at a stated
    minibatch of 96 no whole number of rows fits."""
    with pytest.raises(ConfigError, match=r"model\.layers\.node\d+: .*is profile_batch right\?"):
        pipedream_graph(VGG16.read_text(), "vgg16", 96, _shard())


def test_a_block_named_without_shapes_counts_0_and_one_note_names_it(tmp_path):
    """One VGG-16 convolution renamed to a bare block name: it counts 0 FLOPs (its parameters stay the
    file's), the other 40 layers count, MFU is the counted FLOPs' (a lower bound) and one NOTE says so."""
    text = _vgg16_with("node14 -- Conv2d(256, 256, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))",
                       "node14 -- conv3_2")
    path = tmp_path / "vgg16_partial.txt"
    path.write_text(text)
    full = pipedream_graph(VGG16.read_text(), "vgg16", 128, _shard())
    partial = pipedream_graph(text, "vgg16", 128, _shard())
    assert partial.flops_counted_layers() == 40 and not partial.layer("node14").flops_counted
    assert partial.total_params() == full.total_params()
    missing = 2 * 56 * 56 * 256 * 256 * 9
    assert _gemm_flops(partial, "forward") == _gemm_flops(full, "forward") - missing
    scenario = load_scenario({
        "name": "p", "model": {"name": "p", "family": "profile", "format": "pipedream", "path": str(path),
                               "profile_batch": 128},
        "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
        "parallelism": {"dp": 8, "global_batch_size": 1024, "micro_batch_size": 128}, "training": {"precision": "fp32"}})
    result = simulate(scenario)
    assert result.flops_counted_layers == (40, 41) and 0 < result.mfu
    (note,) = [n for n in scenario_messages(scenario)["notes"] if "FLOPs counted" in n]
    assert note == ("FLOPs counted for 40 of 41 layers of the profile: 1 gives no shapes and counts 0 (conv3_2); "
                    "TFLOP/s and MFU count the others (a lower bound)")
