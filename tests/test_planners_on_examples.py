"""``clustersim plan EXAMPLE --planner pase|deeppool|adaptive|dapple`` on the shipped examples: each
run exits 0 with a plan (one that does not fit is a result with its reason) or 2 with one line
naming a real reason, never a traceback, never a reason about a layout the planner threw away
(the per-layer probe once kept ``parallelism.ep`` and answered "etp*ep = 1*8 does not divide the
1 ranks of a pipeline stage").

Running all 59 examples × 4 planners takes minutes of CPU (the adaptive planner simulates every
uniform layout), so the sweep takes one example of each family the planners meet: a CNN built
layer by layer (VGG-16), a transformer built layer by layer (BERT-large), a dense LLM with a
stated tp/dp layout and a local-SGD kind (Llama-3-8B DiLoCo), a subnetwork-DP scenario (stated
``dp``, ResNet-50) and a mixture of experts with a stated ``ep`` (Mixtral 8x7B).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.explore.planners import get_planner
from simulator.explore.sweep import absolutize
from simulator.scenario import load_raw

ROOT = Path(__file__).resolve().parents[1]
PLANNERS = ("pase", "deeppool", "adaptive", "dapple")
PER_LAYER_PLANNERS = ("pase", "deeppool", "adaptive")
EXAMPLES = ("vgg16-per-layer-8xa100", "bert-large-per-layer-8xa100", "llama3-8b-diloco-h100",
            "resnet50-subnetwork-dp-a100", "mixtral-8x7b-ep8-h100")
#: Reasons that name a layout the planner dropped, not the scenario's real problem.
FALSE_REASONS = ("does not divide the 1 ranks", "num_gpus = 1")


def _raw(example: str) -> dict:
    raw, base = load_raw(ROOT / "examples" / f"{example}.yaml")
    return absolutize(raw, base)


@pytest.mark.parametrize("planner", PER_LAYER_PLANNERS)
def test_per_layer_planners_refuse_a_mixture_of_experts_by_name(planner):
    # per_layer's splits have no expert axis (batch would replicate every expert, channels
    # tensor-split each one, with no dispatch all-to-all), so the planners refuse MoE models
    with pytest.raises(ConfigError) as err:
        get_planner(planner).run(_raw("mixtral-8x7b-ep8-h100"), {})
    assert err.value.field == "model"
    assert "mixtral-8x7b is a mixture of experts (8 experts)" in str(err.value)
    assert "do not split experts; use `clustersim search`" in str(err.value)


def test_pase_refuses_a_model_state_that_no_split_of_its_can_shard():
    # Llama-3-8B at 8K tokens on 64 H100s: its transformer blocks take no weight-sharding cut, so every
    # PaSE plan holds one replica's 134.6 GiB of model state (pure data parallelism once returned,
    # 174.6 GiB, exit 0); where a split can shard it, PaSE plans and says its cost ignores memory
    # (tests/test_planner_model_state.py)
    with pytest.raises(ConfigError) as err:
        get_planner("pase").run(_raw("llama3-8b-diloco-h100"), {})
    assert err.value.field == "model"
    assert "llama3-8b's model state (weights + gradients + optimizer state) is 134.6 GiB a replica in any PaSE plan" \
        in str(err.value)


DROPPED = "does not model recompute; the scenario's recompute: full was dropped for this plan"


@pytest.mark.parametrize("planner", PLANNERS)
def test_planners_drop_a_stated_recompute_and_say_so(planner):
    # GPT-3 XL on 32 V100s states recompute: full; per_layer (and replicated_pipeline, DAPPLE's plans)
    # refuse it, so every per-layer plan once "could not run: per_layer does not recompute"
    raw = _raw("gpt3-xl-parameter-server-v100")
    assert raw["parallelism"]["recompute"] == "full"
    result = get_planner(planner).run(raw, {})
    assert "recompute" not in (result.reason or "")
    assert "recompute" not in result.scenario["parallelism"]
    kind = result.scenario["strategy"]["kind"]
    words = {"per_layer": "the per-layer kind", "replicated_pipeline": "the replicated_pipeline kind (DAPPLE's plans)"}
    assert f"# {words[kind]} {DROPPED}\n" in result.header()
    assert result.step_time_s is not None or "needs" in result.reason  # it runs, or says what memory it needs
    raw["parallelism"]["recompute"] = "none"  # nothing dropped: no such line
    assert "recompute" not in get_planner(planner).run(raw, {}).header()


def test_dapple_names_its_own_kind_when_it_cannot_fuse_the_optimizer():
    # DAPPLE's plans are replicated_pipeline plans; its probe's per_layer kind was the one named
    with pytest.raises(ConfigError) as err:
        get_planner("dapple").run(_raw("vit-l16-step-in-backward-a100"), {})
    assert err.value.field == "training.optimizer_fusion"
    assert "'backward' is not modelled by strategy kind replicated_pipeline, the kind of DAPPLE's plans" in str(err.value)
    assert "per_layer" not in str(err.value)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plans")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cases = {(ex, p): [sys.executable, "-m", "simulator", "plan", str(ROOT / "examples" / f"{ex}.yaml"),
                       "--planner", p, "--out", str(tmp / f"{ex}.{p}.yaml")]
             for ex in EXAMPLES for p in PLANNERS}
    out = {}
    keys = list(cases)
    for start in range(0, len(keys), 4):  # four at a time
        procs = {key: subprocess.Popen(cases[key], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env=env, cwd=ROOT) for key in keys[start:start + 4]}
        for key, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=600)
            out[key] = subprocess.CompletedProcess(cases[key], proc.returncode, stdout, stderr)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("example", EXAMPLES)
def test_each_planner_plans_or_refuses_in_one_line_with_a_real_reason(runs, example, planner):
    done = runs[(example, planner)]
    assert done.returncode in (0, 2), done.stderr
    assert "Traceback" not in done.stderr
    if done.returncode == 2:
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("clustersim: error: "), done.stderr
        assert not any(false in lines[0] for false in FALSE_REASONS), lines[0]
    if example.startswith("mixtral") and planner in PER_LAYER_PLANNERS:
        assert done.returncode == 2 and "do not split experts" in done.stderr
    elif example.startswith("mixtral"):  # DAPPLE: 47B parameters on 64 H100s without expert parallelism
        assert done.returncode == 2 and "no DAPPLE plan of mixtral-8x7b fits" in done.stderr
    elif example.startswith("llama3-8b-diloco") and planner in ("pase", "deeppool"):  # 134.6 GiB a replica
        assert done.returncode == 2 and "llama3-8b's model state" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
