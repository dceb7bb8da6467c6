"""The per-layer planners refuse, before planning, a model whose state no plan of theirs can hold
(simulator/explore/planners/model_state.py), and DAPPLE's refusal says which plan and stage it means.

Llama-3-70B on 64 GB200s (examples/llama3-70b-gb200-nvl72.yaml): PaSE and DeepPool once returned
pure data parallelism (1787 GiB of 171 GiB usable) with exit code 0. Its layer graph is one
``transformer_block`` per layer, which no per-layer split can shard, so one replica's 1182.7 GiB of
weights, gradients and optimizer state must sit on one GPU in every PaSE or DeepPool plan. Where a
planner's space can shard the weights (VGG-16's fully connected layers split by output features),
it is not refused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.explore.planners import get_planner
from simulator.explore.planners.model_state import (
    per_layer_least_bytes,
    pipeline_least_bytes,
    replica_state_bytes,
)
from simulator.explore.planners.oracle import per_layer_pricer
from simulator.explore.sweep import absolutize
from simulator.scenario import load_raw

ROOT = Path(__file__).resolve().parents[1]
GB200 = str(ROOT / "examples" / "llama3-70b-gb200-nvl72.yaml")
VGG = str(ROOT / "examples" / "vgg16-per-layer-8xa100.yaml")
STATE = "llama3-70b's model state (weights + gradients + optimizer state) is 1182.7 GiB a replica"
POINTER = "more than the 183.0 GiB usable on one gb200: use `clustersim search` (tensor/pipeline parallel, ZeRO) or `--planner dapple`"


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulator", "plan", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: model: "), done.stderr
    return lines[0]


@pytest.mark.parametrize(("planner", "space"), [
    ("deeppool", "in any DeepPool plan (each layer data parallel over its GPUs, its whole weights on each)"),
    ("pase", "in any PaSE plan (each layer split over 64 GPUs along batch, channels, reduction: no layer can shard "
             "its weights)"),
])
def test_per_layer_planners_refuse_llama3_70b_on_gb200_before_planning(planner, space):
    line = _one_line_error(_plan(GB200, "--planner", planner))
    assert f"{STATE} {space}, {POINTER}" in line


def test_adaptive_refuses_when_its_choices_cannot_shard_and_no_pipeline_is_offered():
    line = _one_line_error(_plan(GB200, "--planner", "adaptive", "--option", "choices=data,spatial"))
    assert f"{STATE} in any adaptive plan (choices data, spatial), {POINTER}" in line


def test_adaptive_pipelines_with_zero1_could_hold_the_state_so_it_is_not_refused():
    # 4 stages of 16 replicas with ZeRO-1: 70.6e9 x (6 B / 4 + 12 B / 64) = 110.9 GiB < 183.0 GiB, so
    # the bound lets the planner run (its plans then fail on activations: a result with its reason)
    raw, base = load_raw(GB200)
    scenario, pricer = per_layer_pricer(absolutize(raw, base))
    graph = pricer.graph
    whole = replica_state_bytes(scenario, graph)
    assert whole / 2**30 == pytest.approx(1182.7, abs=0.05)
    assert per_layer_least_bytes(scenario, graph, lambda layer: 1) == pytest.approx(whole, rel=1e-9)
    params = sum(layer.params for layer in graph.layers)
    assert pipeline_least_bytes(scenario, graph, 4, 64) == pytest.approx(params * (6 / 4 + 12 / 64))
    assert pipeline_least_bytes(scenario, graph, 4, 64) / 2**30 < 183.0


def test_adaptive_says_when_no_plan_it_simulated_fits():
    done = _plan(GB200, "--planner", "adaptive")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    # its 24 pipeline candidates are pruned by the memory model before simulation (13 simulated before)
    assert ("# no plan the adaptive planner simulated fits on this cluster (7 simulated; its per-component cost model "
            "ignores memory, 24 pipelines pruned by memory before simulating; the model state is 1182.7 GiB a "
            "replica): `clustersim search` (tensor/pipeline parallel, ZeRO) prunes layouts by memory\n") in done.stdout


def test_dapple_names_the_plan_and_counts_its_stages():
    # the last plan DAPPLE tried is the straight pipeline: its stage 63 is a stage (of 64), not a rank
    # (1582.7 GiB before replicated_pipeline counted bf16's default fp32 gradients, grad_dtype auto: +2 B a parameter)
    line = _one_line_error(_plan(GB200, "--planner", "dapple"))
    assert "no DAPPLE plan of llama3-70b fits on 64 GPUs (tried 55; the last, 64 stages of 1 GPU each, " \
           "1 micro-batch of 256 samples: needs 1584.6 GiB of 183.0 GiB usable" in line
    assert line.endswith("on stage 63 of 64 (stages count from 0))")


def test_a_weight_sharding_space_is_not_refused_where_data_parallelism_cannot_hold_the_state():
    # VGG-16 with 1.5 GiB usable: one replica's state is 2.32 GiB, but PaSE can split the fully
    # connected layers (120 M of 138 M parameters) by output features over 8 GPUs: 0.29 GiB a GPU
    squeeze = ["--set", "simulation.hbm_reserve_gib=78.5"]
    line = _one_line_error(_plan(VGG, "--planner", "deeppool", *squeeze))
    assert "vgg16's model state (weights + gradients + optimizer state) is 2.3 GiB a replica in any DeepPool plan" in line
    raw, base = load_raw(VGG)
    raw = absolutize(raw, base)
    raw.setdefault("simulation", {})["hbm_reserve_gib"] = 78.5
    result = get_planner("pase").run(raw, {})  # planned, not refused: its plan fails on activations
    assert result.step_time_s is None and "GiB of 1.5 GiB usable" in result.reason
    assert "# PaSE's cost model ignores memory" in result.header()


def test_the_refusal_is_a_config_error_on_model():
    raw, base = load_raw(GB200)
    with pytest.raises(ConfigError) as err:
        get_planner("deeppool").run(absolutize(raw, base), {})
    assert err.value.field == "model"
