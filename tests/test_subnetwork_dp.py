"""The subnetwork_dp kind (Singh et al. 2025): exact step times on a toy chain, invariants of the
masks, the paper's 30–75% memory reduction, bad input through the CLI.

Toy (tests/test_graph_simulate.py): a chain of 256-wide linear layers, here marked as residual
blocks (``kind: mlp_block``); each block's forward is one GEMM of C = 67.108864 us, its backward
two (input and weight gradient), C each; the optimizer and memory-bound kernels take ~1e-13 s.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from graph_models import ChainSpec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_graph_simulate import C, chain_scenario

from simulator.errors import ConfigError
from simulator.memory.analytic import rank_memory
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.subnetwork_dp import (
    SubnetworkDpConfig,
    assignment,
    memory_subnetwork_dp,
    unmasked_work,
    worker_work,
)

ROOT = Path(__file__).resolve().parents[1]
SLICE_BYTES = 2 * 256 * 256 * 2  # two blocks of 256x256 bf16 gradients (or weights)


def _toy(masking: str, blocks: int = 4, workers: int = 4, **cfg):
    sc = chain_scenario(workers, ChainSpec(widths=(256,) * blocks, kind="mlp_block"), nvl_gb_per_s=100,
                        nvl_latency_us=1.0, global_batch_size=workers)
    return replace(sc, strategy=SubnetworkDpConfig(masking=masking, **{"mask": "block", "keep_fraction": 0.5,
                                                                        "subnetworks": 2, **cfg}))


def test_forward_backward_block_masks_halve_the_passes_and_reduce_over_the_sharers():
    # 4 workers, 2 subnetworks, keep 1/2: subnetwork j keeps slice j (blocks j and j + 2), worker w
    # trains subnetwork w mod 2, so each slice is all-reduced over 2 workers ({0, 2} and {1, 3}).
    # Forward 2C, backward 4C (the masked blocks are skipped); then one all-reduce of the slice's
    # 2·65,536 bf16 gradients over 2 ranks on NVLink (1 us, 100 GB/s): 2(n-1)·1 us + 2(n-1)/n·S/B.
    r = simulate(_toy("forward_backward"))
    t_ar = 2e-6 + SLICE_BYTES / 100e9
    assert r.step_time_s == pytest.approx(6 * C + t_ar, rel=1e-9)
    assert r.extra["sdp_slice_group_size"] == 2
    assert r.extra["sdp_flops_per_worker_fraction"] == pytest.approx(0.5)
    # model FLOPs count what the workers run: 4 workers x 3 GEMMs x 2 blocks
    assert r.model_flops_per_step == pytest.approx(4 * 3 * 2 * 2 * 256**3)


def test_forward_backward_neuron_masks_halve_every_gemm():
    # Neuron masks at 1/2: every GEMM computes half its outputs (256 x 128 x 256: C/2 on the toy),
    # so the passes take 4·C/2 + 4·(C/2 + C/2) = 6C; each worker keeps 1 of 2 slices of the
    # 4·65,536 masked parameters and all-reduces it over the 2 workers that share it.
    r = simulate(_toy("forward_backward", mask="neuron"))
    assert r.step_time_s == pytest.approx(6 * C + 2e-6 + SLICE_BYTES / 100e9, rel=1e-9)
    assert r.extra["sdp_slice_group_size"] == 2


def test_backward_masks_run_the_whole_forward_and_refresh_the_masked_weights():
    # Forward 4C; backward: input gradients of all 4 blocks, weight gradients of the 2 kept: 6C.
    # After the update every worker takes part in each slice's weight broadcast over all 4
    # (from its 2 owners to the other 2): (n-1)·1 us + S/B each, one after the other.
    r = simulate(_toy("backward"))
    t_ar = 2e-6 + SLICE_BYTES / 100e9
    t_broadcast = 3e-6 + SLICE_BYTES / 100e9
    assert r.step_time_s == pytest.approx(10 * C + t_ar + 2 * t_broadcast, rel=1e-9)
    assert r.extra["sdp_flops_per_worker_fraction"] == pytest.approx(10 / 12)


def test_memory_per_worker_holds_only_the_trained_state():
    # Forward+backward: 2 of 4 blocks held and trained: weights 2 B, gradients 2 B (bf16), Adam 12 B
    # per parameter of 131,072; backward-only: all 262,144 weights, the trained half's gradients and
    # optimizer state; activations: half (forward+backward) or all (backward-only) of DP's.
    dp = rank_memory(_toy("backward"), 0)
    for masking, held, activations in (("forward_backward", 2, dp.activations_bytes / 2),
                                       ("backward", 4, dp.activations_bytes)):
        _, peak, per_worker = memory_subnetwork_dp(_toy(masking))
        assert len(per_worker) == 2
        assert peak.weights_bytes == held * 65_536 * 2
        assert peak.gradients_bytes == 131_072 * 2
        assert peak.optimizer_bytes == 131_072 * 12
        assert peak.activations_bytes == pytest.approx(activations, rel=1e-12)
        assert peak.other_bytes == dp.other_bytes


def test_the_number_of_subnetworks_alone_cuts_the_model_into_disjoint_parts():
    # subnetworks: 4 without keep_fraction: each worker keeps 1 of 4 slices, shared by dp/4 = 2 workers
    sc = load_scenario({**RESNET, "strategy": {"kind": "subnetwork_dp", "subnetworks": 4}})
    assign = assignment(sc)
    assert (assign.subnetworks, assign.kept_slices) == (4, 1)
    assert all(len(assign.sharers(i)) == 2 for i in range(4))
    default = assignment(load_scenario({**RESNET, "strategy": {"kind": "subnetwork_dp"}}))
    assert (default.subnetworks, default.kept_slices) == (8, 4)


def test_many_steps_repeat_the_step():
    sc = _toy("backward")
    one = simulate(sc)
    three = simulate(replace(sc, simulation=sc.simulation.model_copy(update={"steps": 3})))
    assert three.steps == 3 and len(three.step_times_s) == 3
    assert three.step_times_s == pytest.approx([one.step_time_s] * 3, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(mask=st.sampled_from(["block", "neuron"]), masking=st.sampled_from(["backward", "forward_backward"]),
       subnetworks=st.sampled_from([1, 2, 4]), kept=st.integers(1, 4), blocks=st.sampled_from([4, 6, 8]))
def test_masks_never_add_work_and_every_slice_is_trained_by_r_subnetworks(mask, masking, subnetworks, kept, blocks):
    kept = min(kept, subnetworks)
    sc = _toy(masking, blocks=blocks, mask=mask, keep_fraction=kept / subnetworks, subnetworks=subnetworks)
    assign = assignment(sc)
    full = unmasked_work(sc)
    total_trained = 0.0
    for j in range(subnetworks):
        work = worker_work(sc, j, assign)
        assert work.flops <= full.flops * (1 + 1e-12)
        assert work.trained_params <= work.held_params <= full.held_params
        assert work.kept_activation_bytes <= full.kept_activation_bytes
        total_trained += work.trained_params
    # summed over the subnetworks, each slice is trained r = k·S times, the shared layers S times
    assert total_trained == pytest.approx(subnetworks * assign.shared_params + kept * sum(assign.slice_params))
    for index in range(subnetworks):
        assert len(assign.sharers(index)) == 4 * kept // subnetworks


def _memory_reduction(raw: dict, **cfg) -> float:
    raw = {**raw, "strategy": {"kind": "subnetwork_dp", **cfg}}
    sc = load_scenario(raw)
    return 1 - memory_subnetwork_dp(sc)[1].total_bytes / rank_memory(sc, 0).total_bytes


GPT = {"model": "gpt-1.7b", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
       "parallelism": {"dp": 8, "micro_batch_size": 1, "global_batch_size": 8},
       "training": {"precision": "bf16", "attention": "flash"}}
RESNET = {"model": "resnet50", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
          "parallelism": {"dp": 8, "micro_batch_size": 32, "global_batch_size": 256}, "training": {"precision": "bf16"}}


@pytest.mark.parametrize("mask", ["block", "neuron"])
@pytest.mark.parametrize("masking", ["backward", "forward_backward"])
@pytest.mark.parametrize("keep", [0.5, 0.25])
def test_transformer_memory_falls_by_the_papers_30_to_75_percent(mask, masking, keep):
    # The paper's range (30-75% less memory per worker than data parallelism) over the settings we
    # reconstruct: both masks, both maskings, 2 and 4 subnetworks keeping 1/2 and 1/4, on GPT 1.7B
    # (Adam, bf16, one 2,048-token sequence per worker). Measured: 35.7% (backward, 1/2) to 68.6%
    # (forward+backward, 1/4).
    assert 0.30 <= _memory_reduction(GPT, mask=mask, masking=masking, keep_fraction=keep, subnetworks=4) <= 0.75


def test_resnet50_memory_reduction_needs_forward_masking():
    # ResNet-50 at 32 images per worker: activations are 1.3 of 1.8 GiB, so masking only the
    # backward saves 3-15% (outside the paper's range: its ResNet settings hold less activation
    # memory than this batch); neuron masks forward and backward save 43% (1/2) and 65% (1/4).
    assert _memory_reduction(RESNET, mask="block", masking="backward", keep_fraction=0.5, subnetworks=4) < 0.30
    for keep in (0.5, 0.25):
        assert 0.30 <= _memory_reduction(RESNET, mask="neuron", masking="forward_backward", keep_fraction=keep,
                                         subnetworks=4) <= 0.75


def _cli(tmp_path: Path, strategy: dict, model: str = "resnet50", steps: int | None = None):
    raw = {**RESNET, "model": model, "strategy": {"kind": "subnetwork_dp", **strategy}}
    path = tmp_path / "sdp.yaml"
    path.write_text(yaml.safe_dump(raw))
    args = [sys.executable, "-m", "simulator", "simulate", str(path), "--json"]
    if steps:
        args += ["--steps", str(steps)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize(("strategy", "model", "field"), [
    ({"keep_fraction": 0}, "resnet50", "strategy.keep_fraction"),
    ({"keep_fraction": 1.5}, "resnet50", "strategy.keep_fraction"),
    ({"keep_fraction": 0.3, "subnetworks": 4}, "resnet50", "strategy.keep_fraction"),
    ({"subnetworks": 3}, "resnet50", "strategy.subnetworks"),
    ({"mask": "block"}, "vgg16", "strategy.mask"),
    ({"masking": "forward"}, "resnet50", "strategy.masking"),
])
def test_bad_input_is_an_error_naming_the_field(strategy, model, field):
    with pytest.raises(ConfigError) as caught:
        simulate(load_scenario({**RESNET, "model": model, "strategy": {"kind": "subnetwork_dp", **strategy}}))
    assert caught.value.field == field


def test_mixed_clusters_are_refused():
    mixed = {**RESNET, "cluster": {"groups": [{"node": "dgx-a100-80g", "nodes": 1}, {"node": "g4dn-12xlarge", "nodes": 2}]},
             "parallelism": {"dp": 16, "micro_batch_size": 8, "global_batch_size": 128},
             "training": {"precision": "fp16"}, "strategy": {"kind": "subnetwork_dp"}}
    with pytest.raises(ConfigError) as caught:
        simulate(load_scenario(mixed))
    assert caught.value.field == "cluster.groups"


def test_bad_input_exits_2_with_one_line(tmp_path):
    proc = _cli(tmp_path, {"keep_fraction": 0})
    assert proc.returncode == 2, proc.stderr
    assert "strategy.keep_fraction" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_runs_many_steps(tmp_path):
    import json
    proc = _cli(tmp_path, {"mask": "neuron", "masking": "forward_backward", "keep_fraction": 0.5}, "vgg16", steps=2)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["steps"] == 2 and len(result["step_times_s"]) == 2
    assert result["sdp_memory_reduction"] > 0
