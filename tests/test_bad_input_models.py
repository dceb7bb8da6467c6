"""Bad models, bad profiles, bad per-layer rules and bad output paths through the CLI, as a user
types them, plus the honest-output checks that ride on the same runs (n/a MFU for a measured
profile, a ViT's tokens/s). Each case is its own process forked from one interpreter
(tests/test_bad_input.py's driver); a bad one must exit 2 with one ``clustersim: error:`` line
naming the field or layer, no traceback, and no file left behind.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.test_bad_input import run_cases

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "validation" / "data" / "profiles"
RESNET = ROOT / "examples" / "resnet50-8xa100.yaml"

CLUSTER = "cluster: {node: dgx-a100-80g, num_gpus: 8}\nparallelism: {dp: 8, global_batch_size: 256, " \
          "micro_batch_size: 32}\n"


def _torch(shape: str) -> str:
    return f"name: t\nmodel: {{torch: \"torchvision.models:resnet18\", input_shape: {shape}}}\n" + CLUSTER


def _profile(fmt: str, path: str, batch: str = "") -> str:
    return f"name: p\nmodel: {{name: prof, family: profile, format: {fmt}, path: {path}{batch}}}\n" + CLUSTER


def _files(d: Path) -> None:
    (d / "neg_shape.yaml").write_text(_torch("[3, -1, 224]"))
    (d / "zero_shape.yaml").write_text(_torch("[3, 0, 224]"))
    (d / "flat_shape.yaml").write_text(_torch("[224]"))
    graph = (PROFILES / "pipedream_vgg16_graph.txt").read_text()
    first_relu = graph.index("ReLU(inplace)")
    (d / "frob_graph.txt").write_text(graph[:first_relu] + "FrobnicateLayer(7)" + graph[first_relu + 13:])
    (d / "frob_graph.yaml").write_text(_profile("pipedream", "frob_graph.txt", ", profile_batch: 64"))
    # node12 says 255 output channels: its 411,041,792 output bytes are not 4 x 128 x 255 x whole pixels
    (d / "conv255_graph.txt").write_text(graph.replace("node12 -- Conv2d(128, 256,", "node12 -- Conv2d(128, 255,"))
    (d / "conv255_graph.yaml").write_text(_profile("pipedream", "conv255_graph.txt", ", profile_batch: 128"))
    (d / "bare_graph.yaml").write_text(_profile("pipedream", str(PROFILES / "dapple_amoeba-18-pbs-8.txt"),
                                                ", profile_batch: 8"))
    deeppool = (PROFILES / "deeppool_vggLayerGpuProfileA100.txt").read_text()
    (d / "frob_pool.txt").write_text(deeppool.replace("maxPool2d", "frobPool2d", 1))
    (d / "frob_pool.yaml").write_text(_profile("deeppool", "frob_pool.txt"))
    second_conv = '{"in_channels":64,"kernel_size":3,"out_channels":64,"padding":1,"stride":1}'
    (d / "conv65.txt").write_text(deeppool.replace(second_conv, second_conv.replace('"in_channels":64',
                                                                                    '"in_channels":65')))
    (d / "conv65.yaml").write_text(_profile("deeppool", "conv65.txt"))
    # the line after the first conv (64 channels out) lists a 65-channel input, its own in_channels agreeing
    chained = deeppool.replace(second_conv + "[128][64,224,224]",
                               second_conv.replace('"in_channels":64', '"in_channels":65') + "[128][65,224,224]")
    (d / "chain65.txt").write_text(chained)
    (d / "chain65.yaml").write_text(_profile("deeppool", "chain65.txt"))
    (d / "good_graph.yaml").write_text(_profile("pipedream", str(PROFILES / "pipedream_resnet50_graph.txt"),
                                                ", profile_batch: 128"))
    shutil.copy(RESNET, d / "resnet50.yaml")
    shutil.copy(ROOT / "examples" / "vgg16-per-layer-8xa100.yaml", d / "vgg16.yaml")
    shutil.copy(ROOT / "tests" / "data" / "harness" / "profile.yaml", d / "profile.yaml")
    (d / "afile").write_text("x")
    (d / "adir").mkdir()


CASES: dict[str, list[str]] = {
    "torch input_shape negative": ["simulate", "neg_shape.yaml"],
    "torch input_shape zero": ["simulate", "zero_shape.yaml"],
    "torch input_shape one dim": ["simulate", "flat_shape.yaml"],
    "graph.txt unknown layer kind": ["simulate", "frob_graph.yaml"],
    "pipedream layer string against its output": ["simulate", "conv255_graph.yaml"],
    "deeppool unknown layer kind": ["simulate", "frob_pool.yaml"],
    "deeppool in_channels against its input": ["simulate", "conv65.yaml"],
    "deeppool shapes that do not chain": ["simulate", "chain65.yaml"],
    "per_layer match names no layer": ["simulate", "vgg16.yaml", "--set",
                                       'strategy.layers=[{match: "nosuchlayer*", devices: 8}]'],
    "per_layer range past the last layer": ["simulate", "vgg16.yaml", "--set",
                                            "strategy.layers=[{range: [500, 600], devices: 8}]"],
    "fp8_gemms under bf16": ["simulate", "resnet50.yaml", "--set", "training.fp8_gemms=[mlp]"],
    "plan --out missing folder": ["plan", "vgg16.yaml", "--planner", "dapple", "--out", "nope/x.yaml"],
    "plan --out is a folder": ["plan", "vgg16.yaml", "--planner", "dapple", "--out", "adir"],
    "calibrate --dir is a file": ["calibrate", "--dir", "afile"],
    "validate-runs --dir is a file": ["validate-runs", "--profile", "profile.yaml", "--dir", "afile"],
}
# the line each bad case's error must contain (the field or layer it names, and the reason)
NAMES = {
    "torch input_shape negative": "model.input_shape.1",
    "torch input_shape zero": "model.input_shape.1",
    "torch input_shape one dim": "at layer conv1: RuntimeError: Expected 3D",
    "graph.txt unknown layer kind": "unknown layer kind 'FrobnicateLayer'",
    "pipedream layer string against its output": "model.layers.node12: conv255_graph.txt: 'Conv2d(128, 255,",
    "deeppool unknown layer kind": "model.layers.2.frobPool2d: frob_pool.txt: unknown DeepPool layer kind 'frobPool2d'",
    "deeppool in_channels against its input": "model.layers.1.conv2d: conv65.txt: shapes do not chain: in_channels 65",
    "deeppool shapes that do not chain": "model.layers.1.conv2d: chain65.txt: shapes do not chain",
    "per_layer match names no layer": "strategy.layers.0.match: 'nosuchlayer*' matches no layer of vgg16",
    "per_layer range past the last layer": "strategy.layers.0.range: [500, 600] names no layer of vgg16",
    "fp8_gemms under bf16": "training.fp8_gemms: ['mlp'] applies to precision fp8 only, got bf16",
    "plan --out missing folder": "--out: folder does not exist: nope",
    "plan --out is a folder": "--out: adir is a folder",
    "calibrate --dir is a file": "--dir: afile is a file",
    "validate-runs --dir is a file": "--dir: afile is a file",
}
# every option that names a file or folder the command writes
OUTPUT_OPTIONS = {"--out", "--plot", "--trace", "--dir", "--memory-series"}
GOOD: dict[str, list[str]] = {
    "profile --json": ["simulate", "good_graph.yaml", "--json"],
    "profile table": ["simulate", "good_graph.yaml"],
    "bare profile --json": ["simulate", "bare_graph.yaml", "--json"],
    "bare profile table": ["simulate", "bare_graph.yaml"],
    "pipedream --json memory series": ["simulate", str(ROOT / "examples" / "gpt-1.7b-pipedream-a100.yaml"), "--json"],
    "vit --json": ["simulate", "resnet50.yaml", "--set", "model=vit-b-16", "--set", "parallelism.micro_batch_size=8",
                   "--set", "parallelism.global_batch_size=64", "--json"],
    "search rank by time to target from --set": [
        "search", "resnet50.yaml", "--rank-by", "time_to_target_s", "--set",
        "convergence={preset: resnet50-imagenet-assumed}", "--space", "pp=1", "--space", "tp=1", "--space",
        "micro_batch_size=128", "--space", "global_batch_size=1024", "--space", "recompute=none", "--space",
        "zero_stage=0", "--workers", "1"],
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return run_cases(tmp_path_factory.mktemp("bad_models"), _files, {**CASES, **GOOD})


@pytest.mark.parametrize("case", list(CASES))
def test_bad_model_is_one_line_naming_it_and_exit_2(outcomes, case):
    proc, left = outcomes[case]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: "), proc.stderr[-3000:]
    assert NAMES[case] in lines[0], lines[0]
    assert not left, f"left behind: {sorted(left)}"


def test_a_measured_profile_prints_the_mfu_of_its_layer_strings(outcomes):
    """PipeDream's ResNet-50 graph.txt names every module with its sizes: TFLOP/s and MFU are figures
    (issue 19: MFU from counted FLOPs for all), every layer counted, no NOTE about uncounted layers."""
    proc, _ = outcomes["profile --json"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["step_time_s"] > 0 and out["samples_per_s"] > 0
    assert all(out[k] > 0 for k in ("model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"))
    assert out["flops_counted_layers"] is None and not any("FLOPs counted" in n for n in out.get("notes", ()))
    table, _ = outcomes["profile table"]
    assert re.search(r"MFU / HFU +\d+\.\d% / \d+\.\d%", table.stdout), table.stdout


def test_a_profile_of_bare_block_names_prints_na_not_a_zero_mfu(outcomes):
    """DAPPLE's AmoebaNet graph.txt names its cells without shapes: no FLOPs counted, so TFLOP/s and MFU
    are n/a (null in --json), never 0.0, the table says why and one NOTE names the layers."""
    proc, _ = outcomes["bare profile --json"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["step_time_s"] > 0 and out["samples_per_s"] > 0
    assert [out[k] for k in ("model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu")] == [None] * 4
    table, _ = outcomes["bare profile table"]
    assert "TFLOP/s/GPU    n/a (the model counts no FLOPs: no layer of the measured per-layer profile gives its " \
           "shapes" in table.stdout
    (mfu,) = [line for line in table.stdout.splitlines() if line.startswith("  MFU / HFU")]
    assert mfu.strip() == "MFU / HFU      n/a"
    (note,) = [line for line in table.stdout.splitlines() if "FLOPs counted for" in line]
    assert note.startswith("  NOTE: FLOPs counted for no layer of the profile: 25 of its 26 layers give no shapes "
                           "(stem, cell_stem_0, cell_stem_1, cell_0, cell_1, cell_2 and 19 more)")


def test_a_vit_gives_tokens_per_s_of_its_197_token_sequence(outcomes):
    proc, _ = outcomes["vit --json"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["tokens_per_s"] == pytest.approx(197 * out["samples_per_s"], rel=1e-12)


def test_search_ranks_by_time_to_target_with_the_block_from_set(outcomes):
    proc, _ = outcomes["search rank by time to target from --set"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ranked by time to target: best" in proc.stdout and "31,500 steps at global batch 1024" in proc.stdout


def test_every_output_option_of_every_command_has_a_bad_path_case():
    """A new output option on any command must come with a case here or in tests/test_bad_input.py."""
    import argparse

    from simulator.cli import build_parser
    from tests.test_bad_input import CASES as BASE_CASES

    options = set()
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                options |= {(command, o) for a in sub._actions for o in a.option_strings if o in OUTPUT_OPTIONS}
    assert ("plan", "--out") in options and ("simulate", "--trace") in options
    tried = {(argv[0], o) for argv in [*BASE_CASES.values(), *CASES.values()] for o in argv if o in OUTPUT_OPTIONS}
    assert options - {("compare", "--trace")} <= tried, sorted(options - tried)   # compare --trace is an input


def test_json_carries_the_memory_series_whose_peaks_are_the_simulated_peaks(outcomes):
    proc, _ = outcomes["pipedream --json memory series"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    series, peaks = out["memory_series_bytes"], out["simulated_peak_memory_per_rank_gib"]
    assert set(series) == set(peaks) and len(series) == 8
    for rank, points in series.items():
        times, held = [t for t, _ in points], [b for _, b in points]
        assert times[0] == 0.0 and times == sorted(set(times))          # one point per instant, in order
        assert all(a != b for a, b in zip(held, held[1:], strict=False))  # change points only
        assert max(held) / 2**30 == pytest.approx(peaks[rank], rel=1e-9)
        assert times[-1] <= out["makespan_s"] + 1e-9
