"""DeepPool's burst-parallel planner (``clustersim plan --planner deeppool``): a GPU count per layer
under a fixed global batch, each layer within the amplification limit of its best GPU-time; on
VGG-16 strong-scaled (32 images on 8 A100s, DeepPool's example job vgg16_8_32_2.0) the plan is
faster than every layer on all GPUs and uses less GPU time, and the limit trades one for the other."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.explore.planners import get_planner
from simulator.explore.planners.deeppool import gpu_counts

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "vgg16-deeppool-8xa100.yaml"


@pytest.fixture(scope="module")
def plans():
    raw = yaml.safe_load(EXAMPLE.read_text())
    return {limit: get_planner("deeppool").run(raw, {"amplification_limit": limit}) for limit in (1.0, 2.0, 100.0)}


def test_the_example_holds_the_plan_at_limit_two(plans):
    assert plans[2.0].scenario["strategy"] == yaml.safe_load(EXAMPLE.read_text())["strategy"]


def test_bursts_beat_every_layer_on_all_gpus_with_less_gpu_time(plans):
    found = plans[2.0].details
    assert found["step_ratio_to_all_gpus"] < 0.8
    assert found["layer_gpu_seconds"] < 0.5 * found["all_gpus_layer_gpu_seconds"]
    gpus = found["gpus_per_layer"]
    assert all(gpus[f"classifier.{i}"] == 1 for i in range(7))   # the FC weights stay on one GPU
    assert gpus["features.1.conv"] == 8                           # the big early convolutions burst to all


def test_the_limit_trades_gpu_time_for_speed(plans):
    """A looser limit admits more GPUs per layer: the objective never rises, GPU-time never falls;
    at limit 1 every layer takes its most GPU-efficient count (here one GPU)."""
    tight, default, loose = (plans[k].details for k in (1.0, 2.0, 100.0))
    assert tight["dp_objective_s"] >= default["dp_objective_s"] >= loose["dp_objective_s"]
    assert tight["layer_gpu_seconds"] <= default["layer_gpu_seconds"] <= loose["layer_gpu_seconds"]
    assert set(tight["gpus_per_layer"].values()) == {1}


def test_gpu_counts_divide_the_batch_and_the_cluster():
    assert gpu_counts(8, 32) == [1, 2, 4, 8]
    assert gpu_counts(8, 12) == [1, 2, 4]


@pytest.mark.parametrize("limit", [0.5, "two", True])
def test_a_bad_limit_names_the_option(limit):
    with pytest.raises(ConfigError) as err:
        get_planner("deeppool").run(yaml.safe_load(EXAMPLE.read_text()), {"amplification_limit": limit})
    assert err.value.field == "--option amplification_limit"


def test_a_batch_smaller_than_the_cluster_says_there_is_no_all_gpu_baseline():
    """4 images on 8 GPUs: no layer can split its batch over all 8, so there is no 'every layer on
    all GPUs' plan to compare with (the summary printed 'vs 0 on all 8 GPUs')."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["parallelism"]["global_batch_size"] = 4
    found = get_planner("deeppool").run(raw, {"amplification_limit": 2.0})
    assert found.details["all_gpus_layer_gpu_seconds"] is None
    assert "every layer on all 8 GPUs is not a plan" in found.summary and "vs 0" not in found.summary
    assert max(found.details["gpus_per_layer"].values()) <= 4
