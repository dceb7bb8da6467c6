"""The subnetwork_dp kind (Singh et al. 2025): exact step times on a toy chain, invariants of the
masks, neuron masks that keep k² of a layer masked on both sides, the issue's 30–75% memory
reduction per reconstructed setting (strict xfails where it is not met), bad input through the CLI.

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
from simulator.memory.checkpoints import kept_per_layer
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.residual_blocks import residual_chain
from simulator.strategies.subnetwork_dp import (
    SubnetworkDpConfig,
    assignment,
    memory_reductions,
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
    # (Adam, bf16, one 2,048-token sequence per worker). Measured: 35.7% (neuron, backward, 1/2; a
    # frozen block: 37.7%) to 68.6% (block, forward+backward, 1/4); neuron masks, forward+backward:
    # 44.1% (1/2), 66.2% (1/4).
    assert 0.30 <= _memory_reduction(GPT, mask=mask, masking=masking, keep_fraction=keep, subnetworks=4) <= 0.75


def _example(model: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / f"{model}-subnetwork-dp-a100.yaml").read_text())


def _example_reduction(model: str, mask: str, keep: float) -> float:
    raw = _example(model)
    return _memory_reduction(raw, mask=mask, masking="forward_backward", keep_fraction=keep, subnetworks=4)


# The settings the issue's 30-75% applies to, as reconstructed (the paper's exact settings are not in
# the data): structured subnetworks run forward and backward (masking: forward_backward), block and
# neuron masks, 4 subnetworks keeping 1/2 or 1/4, at each example's batch. Measured (bf16, Adam):
IN_RANGE = [("resnet50", "block", 0.25),     # 39.4%
            ("resnet50", "neuron", 0.5),     # 49.5%
            ("resnet50", "neuron", 0.25),    # 70.1%
            ("vgg16", "neuron", 0.5),        # 64.6%
            ("inception-v3", "neuron", 0.5),  # 53.5%
            ("unet", "neuron", 0.5),         # 58.0%
            ("gpt-1.7b", "block", 0.5),      # 45.4%
            ("gpt-1.7b", "block", 0.25),     # 68.1%
            ("gpt-1.7b", "neuron", 0.5),     # 42.5% (the residual stream's activations stay whole)
            ("gpt-1.7b", "neuron", 0.25)]    # 63.7%
OUT_OF_RANGE = [
    (("resnet50", "block", 0.5), "25.1% below 30% (the peak worker; 27.4% averaged over the 4 subnetworks): the "
                                 "identity blocks, the only ones that can drop, hold 60.6% of the parameters and 55.0% "
                                 "of the activations, so k = 1/2 saves at most 30.3% at any batch (a bound of the "
                                 "construction, checked term by term, not an accounting error); with the downsampling "
                                 "blocks' residual branches droppable too (stochastic depth's convention, Huang et al. "
                                 "2016; not known to be the paper's) 81% / 74% could drop"),
    (("vgg16", "neuron", 0.25), "85.4% above 75%: layers masked on both sides keep k² = 1/16 of their weights "
                                "(model state 93.2% less, activations 74.5%): a neuron mask saves up to 1 - k² of the "
                                "model state, so more than 1 - k is the construction's (HeteroFL's r²); at k = 1/2 "
                                "(1/4 of the doubly masked weights) 64.6%"),
    (("inception-v3", "neuron", 0.25), "76.5% above 75%: k² = 1/16 of the doubly masked weights (state 92.3% "
                                       "less, activations 74.2%)"),
    (("unet", "neuron", 0.25), "79.6% above 75%: k² = 1/16 of the doubly masked weights (state 93.7% less, "
                               "activations 75.0%)"),
]


@pytest.mark.parametrize(("model", "mask", "keep"), IN_RANGE)
def test_memory_falls_by_the_issues_30_to_75_percent(model, mask, keep):
    assert 0.30 <= _example_reduction(model, mask, keep) <= 0.75


@pytest.mark.parametrize(("setting", "reason"), OUT_OF_RANGE, ids=["-".join(map(str, x)) for x, _ in OUT_OF_RANGE])
def test_memory_outside_the_issues_range_for_these_reconstructed_settings(setting, reason, request):
    request.applymarker(pytest.mark.xfail(strict=True, reason=f"unmet: {setting}: {reason}"))
    assert 0.30 <= _example_reduction(*setting) <= 0.75


@pytest.mark.parametrize("keep", [0.5, 0.25])
def test_block_masks_save_k_of_the_identity_blocks_share_on_average(keep):
    # Every slice is kept by r = k·S of the S subnetworks, so averaged over the subnetworks a worker
    # holds k of the identity blocks' parameters and activations and all of the rest (stem, the 4
    # downsampling blocks, head): the mean saving is (1 - k) × the identity blocks' share, exactly. On
    # ResNet-50 they hold 60.6% of the parameters and 55.0% of the activations (any batch), so at
    # k = 1/2 no batch brings a worker to 30% (model state 30.3%, activations 27.5% on average; the
    # peak worker, holding both of stage 1's identity blocks at 32 images, 25.1%).
    sc = load_scenario({**RESNET, "strategy": {"kind": "subnetwork_dp", "mask": "block",
                                               "masking": "forward_backward", "keep_fraction": keep,
                                               "subnetworks": 4}})
    graph = sc.layer_graph()
    _, blocks, _ = residual_chain(graph)
    identity = [b for b in blocks if b.identity]
    kept = dict(zip((layer.name for layer in graph.layers), kept_per_layer(graph, "none"), strict=True))
    param_share = sum(b.params for b in identity) / graph.total_params()
    activation_share = sum(kept[layer.name] for b in identity for layer in b.layers) / sum(kept.values())
    assert (round(param_share, 3), round(activation_share, 3)) == (0.606, 0.550)
    workers, dp = memory_subnetwork_dp(sc)[2], rank_memory(sc, 0)
    mean = {key: sum(memory_reductions(w, dp)[key] for w in workers) / len(workers)
            for key in ("sdp_model_state_reduction", "sdp_activation_reduction")}
    assert mean["sdp_model_state_reduction"] == pytest.approx((1 - keep) * param_share, rel=1e-12)
    assert mean["sdp_activation_reduction"] == pytest.approx((1 - keep) * activation_share, rel=1e-12)


@pytest.mark.parametrize("model", ["resnet50", "gpt-1.7b"])
@pytest.mark.parametrize("mask", ["block", "neuron"])
@pytest.mark.parametrize("masking", ["backward", "forward_backward"])
@pytest.mark.parametrize(("precision", "optimizer", "param_dtype", "recompute"),
                         [("bf16", "adam", None, "none"), ("bf16", "adam", "fp32", "full"), ("fp32", "sgd", None, "none"),
                          ("fp16", "sgd", "fp32", "none")])
def test_keeping_every_unit_holds_what_data_parallelism_holds(model, mask, masking, precision, optimizer, param_dtype,
                                                              recompute):
    # keep_fraction 1: every worker trains the whole model, so each term is data parallelism's
    # (param_dtype fp32: PyTorch AMP / FSDP's fp32 parameters, 4 / 4 / 8 B with Adam; the gradient in the parameter's dtype)
    raw = _example(model)
    raw["strategy"] = {"kind": "subnetwork_dp", "mask": mask, "masking": masking, "keep_fraction": 1.0,
                       "subnetworks": 2}
    raw["training"] = {**raw["training"], "precision": precision, "optimizer": optimizer,
                       **({"param_dtype": param_dtype} if param_dtype else {})}
    raw["parallelism"] = {**raw["parallelism"], "recompute": recompute}
    sc = load_scenario(raw)
    worker, dp = memory_subnetwork_dp(sc)[1], rank_memory(sc, 0)
    for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"):
        assert getattr(worker, field) == pytest.approx(getattr(dp, field), rel=1e-12, abs=1e-3), field


def test_backward_only_masking_keeps_resnet50s_activations():
    # our variant (the forward runs everything): only gradients and optimizer state of masked blocks go
    sc = load_scenario({**RESNET, "strategy": {"kind": "subnetwork_dp", "mask": "block", "masking": "backward",
                                               "keep_fraction": 0.5, "subnetworks": 4}})
    worker, dp = memory_subnetwork_dp(sc)[1], rank_memory(sc, 0)
    assert worker.activations_bytes == pytest.approx(dp.activations_bytes, rel=1e-12)
    assert worker.weights_bytes == dp.weights_bytes
    assert worker.gradients_bytes < dp.gradients_bytes


def _linear_toy(masking: str = "forward_backward", keep: float = 0.5, subnetworks: int = 2):
    # a plain chain of three 256x256 linear layers: neuron masks on all but the last (the classifier)
    sc = chain_scenario(4, ChainSpec(widths=(256,) * 3), nvl_gb_per_s=100, nvl_latency_us=1.0, global_batch_size=4)
    return replace(sc, strategy=SubnetworkDpConfig(mask="neuron", masking=masking, keep_fraction=keep,
                                                   subnetworks=subnetworks))


def test_neuron_masks_keep_k_squared_of_a_layer_masked_on_both_sides():
    # fc0 reads the unmasked input, writes masked neurons: k; fc1 masked on both sides: k²; fc2 (the
    # classifier, outputs whole) reads masked inputs: k. At k = 1/2: 1/2, 1/4, 1/2 of 65,536 weights.
    sc = _linear_toy()
    assign = assignment(sc)
    kept = {name: m.kept(0.5) for name, m in assign.neuron_layers.items()}
    assert kept == {"fc0": 0.5, "fc1": 0.25, "fc2": 0.5}
    work = worker_work(sc, 0, assign)
    assert work.held_params == work.trained_params == 65_536 * 1.25
    assert assign.shared_params == 0
    # one-sided slices: (fc0 + fc2) / S; two-sided pieces: fc1 / S²
    assert assign.slice_params == [65_536.0] * 2 and assign.piece_params == 65_536 / 4
    # activations each saves its input: fc0 the whole input, fc1 and fc2 half
    dp = unmasked_work(sc)
    assert work.kept_activation_bytes == pytest.approx(dp.kept_activation_bytes * 2 / 3, rel=1e-12)


def test_neuron_masks_on_both_sides_shrink_the_step_by_k_squared():
    # Forward C/2 + C/4 + C/2, backward twice that: 3.75C. Disjoint subnetworks (1 of 2 slices
    # each) keep only the diagonal two-sided piece, reduced with the slice over the 2 workers that
    # share it: (65,536 + 16,384) bf16 gradients, 2(n-1)·1 us + 2(n-1)/n·S/B on NVLink.
    r = simulate(_linear_toy())
    payload = (65_536 + 16_384) * 2
    assert r.step_time_s == pytest.approx(3.75 * C + 2e-6 + payload / 100e9, rel=1e-9)
    assert r.extra["sdp_model_state_reduction"] == pytest.approx(1 - 1.25 / 3, rel=1e-12)


def test_two_sided_pieces_are_reduced_over_the_workers_keeping_both_slices():
    # S = 4 keeping 2: subnetwork j keeps slices j, j + 1, so piece (j, j + 1) is kept by subnetwork
    # j alone (workers j and j + 4 of 8) and piece (j + 1, j) too
    sc = chain_scenario(8, ChainSpec(widths=(256,) * 3), nvl_gb_per_s=100, nvl_latency_us=1.0, global_batch_size=8)
    sc = replace(sc, strategy=SubnetworkDpConfig(mask="neuron", masking="forward_backward", keep_fraction=0.5,
                                                 subnetworks=4))
    assign = assignment(sc)
    assert assign.piece_sharers(1, 2) == assign.piece_sharers(2, 1) == (1, 5)
    assert assign.piece_sharers(1, 1) == assign.sharers(1) == (0, 1, 4, 5)
    work = worker_work(sc, 0, assign)
    assert work.trained_params == pytest.approx(2 * 65_536 * 0.5 + 65_536 * 0.25)


def test_neuron_masks_read_the_channels_of_the_real_networks():
    resnet = assignment(load_scenario({**RESNET, "strategy": {"kind": "subnetwork_dp", "mask": "neuron",
                                                              "masking": "forward_backward", "keep_fraction": 0.5,
                                                              "subnetworks": 4}})).neuron_layers
    # the first bottleneck reads the stem's whole output: conv1 and the shortcut keep k; inside, k²
    assert resnet["layer1.0.conv1"].kept(0.5) == resnet["layer1.0.downsample.0"].kept(0.5) == 0.5
    assert resnet["layer1.0.conv2"].kept(0.5) == resnet["layer2.1.conv1"].kept(0.5) == 0.25
    assert resnet["layer1.0.bn1"].kept(0.5) == 0.5  # channel-wise
    assert resnet["fc"].kept(0.5) == 0.5 and not resnet["fc"].masked_out  # the classifier: masked inputs
    vgg = load_scenario({**RESNET, "model": "vgg16", "strategy": {"kind": "subnetwork_dp", "mask": "neuron",
                                                                  "masking": "forward_backward"}})
    masks = assignment(vgg).neuron_layers
    assert masks["features.0.conv"].kept(0.5) == 0.5 and masks["features.1.conv"].kept(0.5) == 0.25
    assert masks["features.0.relu"].kept_activations(0.5) == 0.5  # outside the set, but its channels are masked


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("keep", [0.5, 0.25])
def test_neuron_masks_keep_a_transformer_blocks_residual_stream_activations(keep, recompute):
    # Korthikanti et al. 2022 Sec. 4.1: a block saves 34·sbh bytes with 16-bit activations and
    # FlashAttention (no s² core): LN1 input 2, QKV input 2, LN2 input 2, FC1 input 2, the two
    # dropout masks 1 + 1 are as wide as the residual stream (10, whole under a neuron mask); Q 2,
    # K 2, V 2, the output projection's input 2, FC1 output 8, FC2 input 8 are as wide as the
    # heads or MLP units (24, kept k). GPT-1.7B, 24 blocks: the worker keeps 24·24(1 - k)·sbh less.
    # Full recompute keeps each block's input (whole) and re-creates one block: 24(1 - k)·sbh less.
    sc = load_scenario({**GPT, "parallelism": {**GPT["parallelism"], "recompute": recompute},
                        "strategy": {"kind": "subnetwork_dp", "mask": "neuron", "masking": "forward_backward",
                                     "keep_fraction": keep, "subnetworks": 4}})
    model = sc.model
    sbh = sc.seq_length * 1 * model.hidden_size
    assert model.ffn_size == 4 * model.hidden_size and not model.gated_mlp and model.dropout
    blocks = model.num_layers if recompute == "none" else 1
    worker, dp = memory_subnetwork_dp(sc)[1], rank_memory(sc, 0)
    assert dp.activations_bytes - worker.activations_bytes == pytest.approx(blocks * 24 * (1 - keep) * sbh,
                                                                            rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_backward_masking_frees_what_only_a_frozen_blocks_weight_gradients_read(recompute):
    # A block masked in the backward only runs forward with frozen weights; PyTorch then saves no
    # input of its linear layers (measured, torch 2.13): the QKV input 2, FC1 input 2 and FC2
    # input 8 of Korthikanti's 34·sbh go (the attention output stays: FlashAttention reads it).
    # GPT-1.7B, 24 blocks in 4 slices, keep 1/2: each worker freezes 12 blocks, 12·12·sbh less;
    # under full recompute each block keeps its input (whole) and the working set is the largest
    # block's, one the worker trains: nothing less.
    sc = load_scenario({**GPT, "parallelism": {**GPT["parallelism"], "recompute": recompute},
                        "strategy": {"kind": "subnetwork_dp", "mask": "block", "masking": "backward",
                                     "keep_fraction": 0.5, "subnetworks": 4}})
    sbh = sc.seq_length * 1 * sc.model.hidden_size
    frozen = 12 if recompute == "none" else 0
    for worker in memory_subnetwork_dp(sc)[2]:
        dp = rank_memory(sc, 0)
        assert dp.activations_bytes - worker.activations_bytes == pytest.approx(frozen * 12 * sbh, rel=1e-12,
                                                                                abs=1e-3)
    resnet = load_scenario({**RESNET, "strategy": {"kind": "subnetwork_dp", "mask": "block", "masking": "backward",
                                                   "keep_fraction": 0.5, "subnetworks": 4}})
    # a frozen convolution still saves its input (measured): a CNN's backward-masked worker keeps all
    assert memory_subnetwork_dp(resnet)[1].activations_bytes == rank_memory(resnet, 0).activations_bytes


def _saved_elements(torch, module, x) -> float:
    """Elements autograd saves for the backward of ``module(x)``, its parameters left out."""
    params = {p.data_ptr() for p in module.parameters()}
    seen: dict = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[(t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())] = t.numel() * t.element_size() / 4
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def test_pytorch_saves_no_linear_input_of_a_frozen_block_but_a_frozen_convolutions():
    # the measurement behind WEIGHT_GRADIENT_ONLY_TENSORS: a pre-LN GPT block (fp32, dropout masks
    # 1 B = 1/4 element) saves 6 elements per token and hidden unit less with frozen weights (the
    # QKV input 1, FC1 input 1, FC2 input 4); a convolution saves its input either way
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional

    class Block(torch.nn.Module):
        def __init__(self, h: int, heads: int):
            super().__init__()
            self.heads, self.ln1, self.ln2 = heads, torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
            self.qkv, self.proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
            self.fc1, self.fc2 = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

        def forward(self, x):
            b, t, h = x.shape
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(h, dim=-1))
            o = functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h)
            x = x + functional.dropout(self.proj(o), 0.1, True)
            return x + functional.dropout(self.fc2(functional.gelu(self.fc1(self.ln2(x)))), 0.1, True)

    attention = pytest.importorskip("torch.nn.attention")  # FlashAttention's kernel: it keeps O, the projection's input
    torch.manual_seed(0)
    block, x = Block(64, 2), torch.randn(2, 32, 64, requires_grad=True)
    with attention.sdpa_kernel(attention.SDPBackend.FLASH_ATTENTION):
        trained = _saved_elements(torch, block, x)
        block.requires_grad_(False)
        assert trained - _saved_elements(torch, block, x) == 6 * 2 * 32 * 64
    conv, image = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.randn(2, 8, 16, 16, requires_grad=True)
    trained = _saved_elements(torch, conv, image)
    conv.requires_grad_(False)
    assert _saved_elements(torch, conv, image) == trained == image.numel()


def test_neuron_masks_run_a_transformer_blocks_residual_stream_ops_whole():
    # the norms and residual dropouts work on the whole residual stream; the GEMMs, attention and
    # GELU on the kept heads and units (k)
    sc = load_scenario({**GPT, "strategy": {"kind": "subnetwork_dp", "mask": "neuron", "masking": "forward_backward",
                                            "keep_fraction": 0.25, "subnetworks": 4}})
    block = sc.layer_graph().layers[1]
    work = worker_work(sc, 0)
    full = {op.name: op.bytes_moved for op in block.forward + block.backward}
    masked = {op.name: op.bytes_moved for op in work.forward + work.backward}  # every block alike
    for name in ("ln1", "ln2", "dropout_residual1", "dropout_residual2", "ln1.grad", "dropout_residual2.grad"):
        assert masked[name] == full[name]
    for name in ("gelu", "gelu.grad", "fc1", "flash_attention"):
        assert masked[name] == pytest.approx(full[name] / 4, rel=1e-12)


#: Transformers built layer by layer: (model, micro-batch, the head and unit layers by name: the
#: attention layers, the MLP's activation and its down-projection, whose saved input is 4h wide).
LAYERWISE_TRANSFORMERS = [("bert-large", 8, ".attention", ".intermediate.gelu", ".output.dense"),
                          ("vit-b-16", 32, ".self_attention", ".mlp.1", ".mlp.3")]


def _layerwise(model: str, micro_batch: int, keep: float, masking: str = "forward_backward") -> dict:
    return {"model": model, "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
            "parallelism": {"dp": 8, "micro_batch_size": micro_batch, "global_batch_size": 8 * micro_batch},
            "training": {"precision": "bf16", "attention": "flash"},
            "strategy": {"kind": "subnetwork_dp", "mask": "neuron", "masking": masking, "keep_fraction": keep,
                         "subnetworks": 4}}


@pytest.mark.parametrize(("model", "micro_batch", "attention", "activation", "down"), LAYERWISE_TRANSFORMERS)
def test_layerwise_transformers_keep_the_residual_stream_whole_as_gpt_does(model, micro_batch, attention,
                                                                            activation, down):
    # The rule, by hand: only heads and MLP units are masked. Weights: an attention layer (heads),
    # FC1 (its outputs) and FC2 (its inputs) keep k, one side each; embeddings, norms and the head
    # keep all. Activations: k of an attention layer's saved tensors but its input (the stream), of
    # the activation's input (FC1's output) and of FC2's input; the norms', dropouts' and FC1's
    # (stream-wide) inputs whole. Keep 1/2 of 4 subnetworks, forward and backward masked.
    keep = 0.5
    sc = load_scenario(_layerwise(model, micro_batch, keep))
    graph = sc.layer_graph()
    attn = [layer for layer in graph.layers if layer.name.endswith(attention)]
    fc1 = [graph.layer(layer.inputs[0]) for layer in graph.layers if layer.name.endswith(activation)]
    fc2 = [layer for layer in graph.layers if layer.name.endswith(down)]
    units = [layer for layer in graph.layers if layer.name.endswith(activation)]
    assert len(attn) == len(fc1) == len(fc2) == len(units) > 0
    masked_params = sum(layer.params for layer in attn + fc1 + fc2)
    unit_bytes = (sum(layer.saved_bytes - layer.saved_input_bytes for layer in attn)
                  + sum(layer.saved_bytes for layer in units + fc2))
    assert all(0 < layer.saved_input_bytes < layer.saved_bytes for layer in attn)
    worker, dp = memory_subnetwork_dp(sc)[1], rank_memory(sc, 0)
    assert memory_reductions(worker, dp)["sdp_model_state_reduction"] == pytest.approx(
        (1 - keep) * masked_params / graph.total_params(), rel=1e-9)
    assert dp.activations_bytes - worker.activations_bytes == pytest.approx((1 - keep) * unit_bytes, rel=1e-9)
    masks = assignment(sc).neuron_layers
    assert all(masks[layer.name].kept(keep) == keep for layer in attn + fc1 + fc2)  # one-sided, as GPT's GEMMs
    assert not any(layer.kind in ("layernorm", "add", "dropout", "embedding") for name in masks
                   for layer in [graph.layer(name)])


@pytest.mark.parametrize(("model", "micro_batch"), [(m[0], m[1]) for m in LAYERWISE_TRANSFORMERS])
@pytest.mark.parametrize("masking", ["backward", "forward_backward"])
def test_layerwise_transformers_keeping_every_unit_hold_what_data_parallelism_holds(model, micro_batch, masking):
    sc = load_scenario(_layerwise(model, micro_batch, 1.0, masking))
    worker, dp = memory_subnetwork_dp(sc)[1], rank_memory(sc, 0)
    for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"):
        assert getattr(worker, field) == pytest.approx(getattr(dp, field), rel=1e-12, abs=1e-3), field


@pytest.mark.parametrize(("attention", "core"), [("standard", ("scores", "softmax", "values")),
                                               ("flash", ("flash_attention",))])
def test_a_layerwise_attention_layers_stream_ops_run_whole(attention, core):
    # BERT's three projections of one input: the input-gradient sums are as wide as the stream; its attention
    # core as training.attention asks (Hugging Face's eager kernels, or the fused SDPA kernel)
    raw = _layerwise("bert-large", 8, 0.25)
    sc = load_scenario({**raw, "training": {**raw["training"], "attention": attention}})
    layer = sc.layer_graph().layer("encoder.layer.0.attention")
    work = worker_work(sc, 0)
    full = {op.name: op.bytes_moved for op in layer.forward + layer.backward}
    masked = {op.name: op.bytes_moved for op in work.forward + work.backward if op.name in full}
    assert masked["encoder.layer.0.attention.input.gradient_sum"] == full["encoder.layer.0.attention.input.gradient_sum"]
    for name in ("q_k_v", *core, "out_proj"):
        key = f"encoder.layer.0.attention.{name}"
        assert masked[key] == pytest.approx(full[key] / 4, rel=1e-12)


def test_depthwise_convolutions_are_masked_channel_by_channel():
    sc = load_scenario({**RESNET, "model": "efficientnet-b0", "strategy": {"kind": "subnetwork_dp", "mask": "neuron",
                                                                           "masking": "forward_backward"}})
    masks = assignment(sc).neuron_layers
    assert masks["features.2.1.depthwise.conv"].kept(0.5) == 0.5
    assert masks["features.2.1.expand.conv"].kept(0.5) == 0.5   # reads the block's whole input
    assert masks["features.2.1.project.conv"].kept(0.5) == 0.25


def test_the_table_prints_model_state_and_activations_apart(tmp_path):
    path = tmp_path / "sdp.yaml"
    path.write_text(yaml.safe_dump({**RESNET, "strategy": {"kind": "subnetwork_dp", "mask": "block",
                                                           "masking": "forward_backward"}}))
    proc = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(path)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "vs data par." in x)
    assert "model state" in line and "activations" in line


@pytest.mark.parametrize(("example", "planner"), [("resnet50", "deeppool"), ("gpt-1.7b", "pase")])
def test_the_per_layer_planners_run_on_the_examples_and_their_plans_simulate(tmp_path, example, planner):
    # the examples state parallelism.dp (8 workers), which a per_layer plan lays out per layer instead
    out = tmp_path / "plan.yaml"
    plan = subprocess.run([sys.executable, "-m", "simulator", "plan", f"examples/{example}-subnetwork-dp-a100.yaml",
                           "--planner", planner, "--out", str(out)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert plan.returncode == 0, plan.stderr
    assert "cannot run" not in out.read_text()
    run = subprocess.run([sys.executable, "-m", "simulator", "simulate", str(out)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr


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


@settings(max_examples=25, deadline=None)
@given(masking=st.sampled_from(["backward", "forward_backward"]), subnetworks=st.sampled_from([1, 2, 4]),
       kept=st.integers(1, 4), layers=st.integers(2, 6))
def test_neuron_masks_on_a_plain_chain_train_every_piece_r_squared_times(masking, subnetworks, kept, layers):
    # summed over the subnetworks: the shared weights S times, each one-sided slice r times, each
    # two-sided piece by the subnetworks keeping both its slices (r² pieces each: S·r² in all)
    kept = min(kept, subnetworks)
    k = kept / subnetworks
    sc = chain_scenario(4, ChainSpec(widths=(256,) * layers), global_batch_size=4)
    sc = replace(sc, strategy=SubnetworkDpConfig(mask="neuron", masking=masking, keep_fraction=k,
                                                 subnetworks=subnetworks))
    assign = assignment(sc)
    full = unmasked_work(sc)
    works = [worker_work(sc, j, assign) for j in range(subnetworks)]
    for work in works:
        assert work.flops <= full.flops * (1 + 1e-12)
        assert k * k * full.held_params * (1 - 1e-12) <= work.trained_params <= work.held_params <= full.held_params
    total = sum(w.trained_params for w in works)
    assert total == pytest.approx(subnetworks * assign.shared_params + kept * sum(assign.slice_params)
                                  + subnetworks * kept ** 2 * assign.piece_params)
    # (layers - 2) layers masked on both sides, the first and the classifier on one
    assert assign.piece_params * subnetworks ** 2 == pytest.approx((layers - 2) * 65_536)
