"""``pp_split: balanced`` cuts by the schedule's own step estimate (the critical path of the 1F1B /
GPipe order), not by the slowest stage alone, and says on the layers/stage line how it compares with
the even cut: ResNet-50 on 8 A100s, dp 4 x pp 2, is never slower balanced than even (the audit's case,
2 micro-batches of 256) and still wins at micro-batch 32."""

import os
import subprocess
import sys

import pytest

import clustersim
from simulator.strategies.spmd.pipeline_estimate import step_estimate_s
from simulator.strategies.spmd.split import crossing_bytes, split_choice

ROOT = os.path.join(os.path.dirname(__file__), "..")
RESNET = os.path.join(ROOT, "examples", "resnet50-8xa100.yaml")
PP2 = {"parallelism__dp": 4, "parallelism__pp": 2}


def test_one_f_one_b_estimate_on_a_toy_pipeline():
    """2 stages, 2 micro-batches, backward twice the forward. Even (F 48, B 96 each): stage 1 runs
    F1 [48, 96], B1 [96, 192]; stage 0 B1 [192, 288]; stage 1 F2 [192, 240], B2 [240, 336]; stage 0
    B2 [336, 432]. A heavier first stage (F 54 / 42) never waits for the second: 414 (by hand)."""
    assert step_estimate_s("1f1b", 2, 2, 1, [48, 48], [96, 96], [0.0]) == pytest.approx(432)
    assert step_estimate_s("1f1b", 2, 2, 1, [54, 42], [108, 84], [0.0]) == pytest.approx(414)
    # a send of 5 on each crossing: stage 1 F1 [53, 101], B1 [101, 197]; stage 0 B1 [202, 298];
    # stage 1 F2 [197, 245], B2 [245, 341]; stage 0 B2 [346, 442]
    assert step_estimate_s("1f1b", 2, 2, 1, [48, 48], [96, 96], [5.0]) == pytest.approx(442)


def test_gpipe_and_interleaved_estimates_match_their_bubbles():
    """Equal stages, no sends: GPipe and 1F1B take (m + p - 1)(F + B) (Huang et al. 2019); the
    interleaved order with v chunks of a third each takes m(F + B) + (p - 1)(F + B)/v (Narayanan
    et al. 2021 Sec. 2.2.2) where m is a multiple of p."""
    for schedule in ("gpipe", "1f1b"):
        assert step_estimate_s(schedule, 8, 4, 1, [1.0] * 4, [2.0] * 4, [0.0] * 3) == pytest.approx((8 + 3) * 3)
    assert step_estimate_s("interleaved", 8, 4, 2, [0.5] * 8, [1.0] * 8, [0.0] * 7) == pytest.approx(8 * 3 + 3 * 1.5)


def test_crossing_bytes_count_the_skip_tensor_inside_a_residual_block():
    sc = clustersim.load_scenario(RESNET, **PP2)
    graph = sc.layer_graph()
    crossing = crossing_bytes(graph)
    names = [layer.name for layer in graph.layers]
    out = {layer.name: layer.output_bytes for layer in graph.layers}
    after_block = names.index("layer2.1.relu3") + 1  # between blocks: the block's output alone
    assert crossing[after_block] == out["layer2.1.relu3"]
    inside = names.index("layer2.2.relu1") + 1  # inside a block: the branch and the skip tensor
    assert crossing[inside] == out["layer2.2.relu1"] + out["layer2.1.relu3"]


def _rate(**overrides) -> tuple[list[int], float]:
    result = clustersim.simulate(RESNET, **PP2, **overrides)
    return result.layers_per_stage, result.samples_per_s


def test_balanced_is_not_slower_than_even_at_two_micro_batches():
    """The audit's case (2 micro-batches of 256 per pipeline): the slowest-stage cut [61, 114] took
    10,680.5 images/s against the even 11,542.5; the estimate's cut puts more of the network on the
    first stage, which hides the second's passes behind its own."""
    even_split, even = _rate(parallelism__pp_split="even")
    split, balanced = _rate(parallelism__pp_split="balanced")
    assert even_split == [87, 88] and even == pytest.approx(11542.5, abs=0.1)
    assert split == [82, 93] and balanced == pytest.approx(11665.0, abs=0.1)
    assert balanced >= even
    choice = split_choice(*(lambda sc: (sc, sc.layer_graph()))(clustersim.load_scenario(
        RESNET, **PP2, parallelism__pp_split="balanced")))
    assert choice.slowest_stage_cut == (61, 114)
    assert choice.estimate_s < choice.even_estimate_s < choice.slowest_stage_estimate_s


def test_balanced_still_wins_at_micro_batch_32():
    even_split, even = _rate(parallelism__pp_split="even", parallelism__micro_batch_size=32)
    split, balanced = _rate(parallelism__pp_split="balanced", parallelism__micro_batch_size=32)
    assert even == pytest.approx(10838.1, abs=0.1)
    assert split == [67, 108] and balanced == pytest.approx(12849.8, abs=0.1)
    assert balanced > 1.15 * even


def test_the_cli_says_how_the_balanced_cut_compares_with_the_even_one():
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", RESNET, "--set", "parallelism.dp=4",
                          "--set", "parallelism.pp=2", "--set", "parallelism.pp_split=balanced"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "layers/stage" in ln)
    assert line.strip() == ("layers/stage   [82, 93] (balanced: 1.0% faster by the schedule estimate than the "
                            "even cut [87, 88])")
