"""Counted FLOPs of a DeepPool profile whose lines are whole ResNet bottlenecks (issue 19): a bottleneck
with its shapes counts torchvision's Bottleneck kernels, so MFU is a figure; one without shapes counts 0
and the run says so once in a NOTE naming how many layers were counted (MFU then counts the others, a
lower bound). PipeDream/DAPPLE graph.txt profiles: tests/test_graph_txt_flops.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from workloads.catalog import resolve_model
from workloads.graph import ShardShape
from workloads.networks.profiles import deeppool_graph

ROOT = Path(__file__).resolve().parents[1]
WRN = ROOT / "validation" / "data" / "profiles" / "deeppool_A100_wrn.prof"
EXCERPT = ROOT / "tests" / "data" / "profiles" / "deeppool_wrn_excerpt.prof"
PLAIN_BLOCK = '"inplanes":256,"planes":64}'


def _shard(batch: int) -> ShardShape:
    return ShardShape(micro_batch=batch, seq_length=1, precision="fp32")


def _gemm_flops(graph, phase: str) -> float:
    return sum(op.flops for layer in graph.layers for op in getattr(layer, phase) if op.kind in ("gemm", "attention"))


def test_wrn_profile_counts_wide_resnet101_2s_flops_from_its_bottleneck_shapes():
    """DeepPool's A100_wrn.prof lists wide_resnet101_2 as 33 bottleneck lines: their kernels give the
    catalog builder's FLOPs exactly, and its parameters less the stem BN (2 x 64) the profile omits."""
    profile = deeppool_graph(WRN.read_text(), "wrn", _shard(32), source=WRN.name)
    builder = resolve_model("wide-resnet101-2").layer_graph(_shard(32))
    assert sum(".ResnetBottleneck" in layer.name for layer in profile.layers) == 33
    assert profile.flops_counted_layers() == len(profile.layers) == 39
    for phase in ("forward", "backward"):
        assert _gemm_flops(profile, phase) == _gemm_flops(builder, phase)
    assert builder.total_params() - profile.total_params() == 2 * 64
    assert profile.saved_bytes() == pytest.approx(builder.saved_bytes(), rel=1e-6)


def test_a_bottleneck_whose_inplanes_disagree_with_its_input_is_refused():
    text = EXCERPT.read_text().replace(PLAIN_BLOCK, '"inplanes":128,"planes":64}')
    with pytest.raises(ConfigError, match=r"model.layers.4.ResnetBottleneck: .*inplanes 128 but its input"):
        deeppool_graph(text, "wrn", _shard(32), source="x.prof")


def _simulate(tmp_path: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    scenario = tmp_path / f"{profile.stem}.yaml"
    scenario.write_text(f"name: p\nmodel: {{name: wrn, family: profile, format: deeppool, path: {profile}}}\n"
                        "cluster: {node: dgx-a100-80g, num_gpus: 8}\n"
                        "parallelism: {dp: 8, global_batch_size: 256, micro_batch_size: 32}\n")
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(scenario), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_cli_prints_the_mfu_of_counted_bottlenecks(tmp_path):
    out = json.loads(_simulate(tmp_path, EXCERPT, "--json").stdout)
    graph = deeppool_graph(EXCERPT.read_text(), "wrn", _shard(32), source=EXCERPT.name)
    model_flops = (_gemm_flops(graph, "forward") + _gemm_flops(graph, "backward")) * 256 / 32
    assert out["flops_counted_layers"] is None
    assert out["model_tflops_per_gpu"] == pytest.approx(model_flops / (out["step_time_s"] * 8) / 1e12, rel=1e-9)
    assert out["mfu"] == pytest.approx(out["model_tflops_per_gpu"] / 312, rel=1e-9)


def test_a_block_without_shapes_counts_0_and_a_note_says_so_once(tmp_path):
    """The plain bottleneck without inplanes/planes: 7 of the 8 lines counted, the eighth 0; TFLOP/s and
    MFU are the counted FLOPs' (a lower bound), and one NOTE names the uncounted layer (issue 19: never
    silently)."""
    partial = tmp_path / "partial.prof"
    partial.write_text(EXCERPT.read_text().replace(',"inplanes":256,"planes":64}', "}"))
    out = json.loads(_simulate(tmp_path, partial, "--json").stdout)
    assert out["flops_counted_layers"] == [7, 8]
    graph = deeppool_graph(partial.read_text(), "wrn", _shard(32), source=partial.name)
    model_flops = (_gemm_flops(graph, "forward") + _gemm_flops(graph, "backward")) * 256 / 32
    assert out["model_tflops_per_gpu"] == pytest.approx(model_flops / (out["step_time_s"] * 8) / 1e12, rel=1e-9)
    assert out["mfu"] == pytest.approx(out["model_tflops_per_gpu"] / 312, rel=1e-9)
    (note,) = [n for n in out["notes"] if "FLOPs counted for" in n]
    assert note.startswith("FLOPs counted for 7 of 8 layers of the profile: 1 gives no shapes and counts 0 (") \
        and "ResnetBottleneck" in note
    table = _simulate(tmp_path, partial).stdout
    assert table.count("FLOPs counted for 7 of 8 layers") == 1 and "  NOTE: FLOPs counted for 7 of 8" in table
    assert re.search(r"MFU / HFU +\d+\.\d% / \d+\.\d%", table), table
