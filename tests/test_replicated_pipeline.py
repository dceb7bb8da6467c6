"""The ``replicated_pipeline`` kind (DAPPLE's stages with their own data-parallel degrees):
uniform plans time exactly as the spmd kind times the same layout, a two-stage plan's step is
its hand-computed timeline, unequal stages split and gather their boundary tensors, and bad
stages are one ConfigError naming the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from simulator.cost.compute import ComputeModel
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.registry import get_kind
from simulator.strategies.replicated_pipeline import StagePrices, early_backward
from simulator.strategies.spmd.schedule import one_f_one_b

PROFILES = Path(__file__).resolve().parents[1] / "validation" / "data" / "profiles"
NODE = {  # 4 V100s per node on NVLink, 25 Gb/s Ethernet between nodes (a small DAPPLE "Config A")
    "name": "v100x4-25gbe", "accelerator": "v100-sxm-32g", "gpus_per_node": 4,
    "intra_node": {"kind": "nvswitch", "bandwidth_per_gpu_gb_per_s": 150, "latency_us": 3,
                   "collective_efficiency": 0.8, "supports_nvls": False, "source": "test"},
    "nics_per_node": 1, "nic_bandwidth_gbit_per_s": 25, "nic_efficiency": 0.9, "nic_latency_us": 10,
    "host_memory_gib": 244, "source": "test",
}
GNMT = {"name": "gnmt-16-dapple", "family": "profile", "format": "pipedream",
        "path": str(PROFILES / "dapple_gnmt-16-pbs-64.txt"), "profile_batch": 64, "sample_kind": "sentence"}
GNMT_LAYERS = 94


def scenario(strategy=None, parallelism=None, gpus=8, model=GNMT, node=NODE):
    raw = {"name": "rp", "model": model, "cluster": {"node": node, "num_gpus": gpus},
           "parallelism": parallelism or {"global_batch_size": 128, "micro_batch_size": 1},
           "training": {"precision": "fp32"}}
    if strategy is not None:
        raw["strategy"] = {"kind": "replicated_pipeline", **strategy}
    return raw


def step_s(raw) -> float:
    return simulate(load_scenario(raw)).step_time_s


@pytest.mark.parametrize("zero", [0, 1])
def test_uniform_plans_time_exactly_as_spmd(zero):
    """pp = 2 with dp = 4 per stage, layers cut evenly, 4 micro-batches of 32 (8 per replica):
    the kind's tasks are the spmd planner's, so the step is the same to the last bit."""
    spmd = scenario(parallelism={"pp": 2, "micro_batch_size": 8, "global_batch_size": 128, "zero_stage": zero})
    mine = scenario({"micro_batches": 4, "stages": [{"layers": 47, "replicas": 4}, {"layers": 47, "replicas": 4}]},
                    {"global_batch_size": 128, "micro_batch_size": 1, "zero_stage": zero})
    assert step_s(mine) == pytest.approx(step_s(spmd), rel=1e-12)


def test_one_stage_is_data_parallelism():
    spmd = scenario(parallelism={"micro_batch_size": 16, "global_batch_size": 128})
    mine = scenario({"micro_batches": 1, "stages": [{"layers": GNMT_LAYERS, "replicas": 8}]})
    assert step_s(mine) == pytest.approx(step_s(spmd), rel=1e-12)


def _toy_profile(tmp_path) -> dict:
    """Two layers: 3 ms / 6 ms and 5 ms / 10 ms forward / backward at batch 4, 4 MB between them,
    no parameters (so no all-reduce and an empty optimizer step). Bare names: blocks measured as a whole
    (a ``Linear(...)`` must give its sizes, workloads/networks/profiles.py)."""
    text = ("node1 -- Input0 -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=0.0, parameter_size=0.0\n"
            "node2 -- layer_a -- forward_compute_time=3.0, backward_compute_time=6.0, activation_size=4000000.0, parameter_size=0.0\n"
            "node3 -- layer_b -- forward_compute_time=5.0, backward_compute_time=10.0, activation_size=4000000.0, parameter_size=0.0\n"
            "\tnode1 -- node2\n\tnode2 -- node3\n")
    path = tmp_path / "toy.txt"
    path.write_text(text)
    return {"name": "toy", "family": "profile", "format": "pipedream", "path": str(path), "profile_batch": 4}


def test_two_stages_one_micro_batch_is_the_hand_timeline(tmp_path):
    """Stage 0 (input + layer a) on GPU 0, stage 1 (layer b) on GPU 1 of the same node, one
    micro-batch of 4: F_a, send 4 MB over NVLink, F_b, B_b, send the gradient back, B_a, update."""
    raw = scenario({"micro_batches": 1, "stages": [{"layers": 2, "replicas": 1}, {"layers": 1, "replicas": 1}]},
                   {"global_batch_size": 4, "micro_batch_size": 1}, gpus=2, model=_toy_profile(tmp_path))
    sc = load_scenario(raw)
    links = StagePrices(sc, sc.strategy).links
    send = links.intra_latency_s + 4e6 / links.intra_bytes_per_s
    update = ComputeModel(sc.accelerator, "fp32").optimizer_step_s(0.0, 32.0)
    expected = 3e-3 + send + 5e-3 + 10e-3 + send + 6e-3 + update
    assert simulate(sc).step_time_s == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("extra", [0, 1])
def test_a_deeper_warm_up_hides_slow_sends_the_hand_timeline(tmp_path, extra):
    """The toy's two stages on two single-GPU nodes over 5 Gb/s, 3 micro-batches of 4: a 4 MB send
    takes s = 7.1 ms, longer than stage 0's passes (3 / 6 ms). With 1F1B's warm-up (K_0 = 2) stage 0
    runs F0 F1 B0 F2 B1 B2, so micro-batch 2 is sent only after B0 and stage 1 waits for it:
    48 ms + 4s. One forward more (K_0 = 3: F0 F1 F2 B0 B1 B2) sends it during stage 1's work:
    54 ms + 2s (stage 0's three backwards wait only for the gradients, each s after stage 1's B)."""
    raw = scenario({"micro_batches": 3, "extra_warmup": extra,
                    "stages": [{"layers": 2, "replicas": 1}, {"layers": 1, "replicas": 1}]},
                   {"global_batch_size": 12, "micro_batch_size": 1}, gpus=2, model=_toy_profile(tmp_path),
                   node={**NODE, "name": "v100x1-5gbe", "gpus_per_node": 1, "nic_bandwidth_gbit_per_s": 5})
    sc = load_scenario(raw)
    links = StagePrices(sc, sc.strategy).links
    send = links.inter_latency_s + 4e6 / links.inter_bytes_per_s
    assert 3e-3 < send < 15e-3  # the window where the two orders' critical paths are the ones above
    update = ComputeModel(sc.accelerator, "fp32").optimizer_step_s(0.0, 32.0)
    expected = (54e-3 + 2 * send) if extra else (48e-3 + 4 * send)
    assert simulate(sc).step_time_s == pytest.approx(expected + update, rel=1e-12)


@pytest.mark.parametrize("micro_batches", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_early_backward_orders(micro_batches, stages):
    """Without extra warm-up the order is 1F1B's; with e more, stage i (not the last) runs
    min(S - i + e, M) forwards before its first backward, every micro-batch once forward then once
    backward, backwards in order, and never more than that many in flight."""
    for stage in range(stages):
        assert early_backward(micro_batches, stages, stage) == one_f_one_b(micro_batches, stages, stage)
        for extra in (1, 2):
            order = early_backward(micro_batches, stages, stage, extra)
            k = min(stages - stage + (extra if stage < stages - 1 else 0), micro_batches)
            assert [p for p, _, _ in order[:k]] == ["F"] * k and (k == micro_batches or order[k][0] == "B")
            assert [j for p, j, _ in order if p == "F"] == [j for p, j, _ in order if p == "B"] == list(range(micro_batches))
            live = peak = 0
            for phase, _, _ in order:
                live += 1 if phase == "F" else -1
                peak = max(peak, live)
            assert peak == k


def test_a_deeper_warm_up_holds_more_activations():
    base = {"micro_batches": 8, "stages": [{"layers": 47, "replicas": 4}, {"layers": 47, "replicas": 4}]}
    kind = get_kind("replicated_pipeline")
    stages = {e: kind.memory(load_scenario(scenario({**base, "extra_warmup": e})))[2] for e in (0, 1, 2)}
    first = {e: s[0].activations_bytes for e, s in stages.items()}  # K_0 = 2, 3, 4 micro-batches
    assert first[1] == pytest.approx(first[0] * 3 / 2) and first[2] == pytest.approx(first[0] * 2)
    assert stages[0][1] == stages[2][1]  # the last stage keeps K = 1


def test_unequal_stages_split_and_gather_the_boundary(tmp_path):
    """A micro-batch of 12 samples: stage 0 on 1 GPU sends all 12 samples' 12 MB; each of stage 1's
    3 replicas (same node) gets its 4 samples' 4 MB: the transfer moves 12 MB out of the sender and
    4 MB into the receiver, and stage 1 runs layer b on 4 samples (its profiled 5 ms)."""
    raw = scenario({"micro_batches": 1, "stages": [{"layers": 2, "replicas": 1}, {"layers": 1, "replicas": 3}]},
                   {"global_batch_size": 12, "micro_batch_size": 1}, gpus=4, model=_toy_profile(tmp_path))
    sc = load_scenario(raw)
    plan = get_kind("replicated_pipeline").compile(sc)
    (act,) = [t for t in plan.streams[("stage0", "pp")] if t.name.startswith("send_act")]
    assert act.demands == {"stage0:nvl_tx": 12e6, "stage1:nvl_rx": 4e6}
    (grad,) = [t for t in plan.streams[("stage1", "pp")] if t.name.startswith("send_grad")]
    assert grad.demands == {"stage1:nvl_tx": 4e6, "stage0:nvl_rx": 12e6}
    forward = {a: [t for t in plan.compute_tasks[a] if t.name.startswith("F.")][0].duration_s for a in plan.actors}
    assert forward == {"stage0": pytest.approx(9e-3, rel=1e-12), "stage1": pytest.approx(5e-3, rel=1e-12)}


def test_a_stage_across_nodes_sends_over_the_nics():
    sc = load_scenario(scenario({"micro_batches": 4, "stages": [{"layers": 47, "replicas": 4},
                                                                {"layers": 47, "replicas": 4}]}))
    prices = StagePrices(sc, sc.strategy)
    assert prices.boundary_link(0) == "nic"
    inside = load_scenario(scenario({"micro_batches": 4, "stages": [{"layers": 47, "replicas": 2},
                                                                    {"layers": 47, "replicas": 2}]}, gpus=4))
    assert StagePrices(inside, inside.strategy).boundary_link(0) == "nvl"


def test_zero_one_shards_the_optimizer_state_over_a_stage():
    base = {"micro_batches": 4, "stages": [{"layers": 47, "replicas": 4}, {"layers": 47, "replicas": 4}]}
    kind = get_kind("replicated_pipeline")
    _, zero0, _ = kind.memory(load_scenario(scenario(base)))
    _, zero1, _ = kind.memory(load_scenario(scenario(base, {"global_batch_size": 128, "micro_batch_size": 1,
                                                            "zero_stage": 1})))
    assert zero1.optimizer_bytes == pytest.approx(zero0.optimizer_bytes / 4)
    assert zero1.weights_bytes == zero0.weights_bytes


@pytest.mark.parametrize(("strategy", "parallelism", "field", "reason"), [
    ({"micro_batches": 4, "stages": [{"layers": 40, "replicas": 4}, {"layers": 40, "replicas": 4}]}, None,
     "strategy.stages", "80 layers"),
    ({"micro_batches": 4, "stages": [{"layers": 47, "replicas": 4}, {"layers": 47, "replicas": 2}]}, None,
     "strategy.stages", "6 GPUs"),
    ({"micro_batches": 5, "stages": [{"layers": 47, "replicas": 4}, {"layers": 47, "replicas": 4}]}, None,
     "strategy.micro_batches", "does not divide"),
    ({"micro_batches": 32, "stages": [{"layers": 47, "replicas": 3}, {"layers": 47, "replicas": 5}]}, None,
     "strategy.stages.0.replicas", "do not divide"),
    ({"micro_batches": 4, "stages": [{"layers": 47, "replicas": 4}, {"layers": 47, "replicas": 4}]},
     {"global_batch_size": 128, "pp": 2}, "parallelism", "leave tp, pp and cp at 1"),
    ({"micro_batches": 4, "stages": [{"layers": 47, "replicas": 4}, {"layers": 47, "replicas": 4}]},
     {"global_batch_size": 128, "zero_stage": 2}, "parallelism.zero_stage", "ZeRO 0 or 1"),
])
def test_bad_plans_are_one_config_error_naming_the_field(strategy, parallelism, field, reason):
    with pytest.raises(ConfigError, match=reason) as err:
        simulate(load_scenario(scenario(strategy, parallelism)))
    assert err.value.field == field


def test_bad_stage_fields_name_the_stage():
    raw = scenario({"micro_batches": 4, "stages": [{"layers": 47, "replicas": 4}, {"layers": 0, "replicas": 4}]})
    with pytest.raises(ConfigError) as err:
        load_scenario(copy.deepcopy(raw))
    assert err.value.field.startswith("strategy.stages.1.layers")


def test_a_batch_smaller_than_the_gpu_count_is_laid_out_by_the_stages():
    """U-Net, 2 images on 8 GPUs as 4 stages x 2 replicas (DAPPLE's plan for it): parallelism: lays
    out only tp x cp x pp = 1 GPU (the replicas are the kind's own data parallelism), so the layout
    check no longer asks 8 | 2; the kind's own check still refuses a batch its replicas cannot split."""
    stages = [{"layers": 4, "replicas": 2}, {"layers": 19, "replicas": 2},
              {"layers": 13, "replicas": 2}, {"layers": 13, "replicas": 2}]
    raw = {"name": "unet-rp", "model": "unet", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
           "parallelism": {"global_batch_size": 2, "micro_batch_size": 1},
           "training": {"precision": "bf16"},
           "strategy": {"kind": "replicated_pipeline", "micro_batches": 1, "stages": stages}}
    result = simulate(load_scenario(copy.deepcopy(raw)))
    assert result.step_time_s > 0
    raw["parallelism"]["global_batch_size"] = 3
    with pytest.raises(ConfigError, match="do not divide") as err:
        simulate(load_scenario(raw))
    assert err.value.field.startswith("strategy")


def test_inter_stage_buffers_of_a_profile_by_hand(tmp_path):
    """A micro-batch of 6 samples (2 micro-batches of a batch of 12): stage 0 (input + layer a) on one GPU,
    stage 1 (layer b) on 3 replicas of 2 samples each. The toy profile states 1 MB per sample for each
    layer's output (4 MB at its batch of 4, fp32), which a profiled layer keeps as its saved activation.
    Stage 0 keeps K_0 = 2 micro-batches of layer a's 6 MB and sends a, which it already keeps: 12 MB.
    Stage 1 keeps K_1 = 1 micro-batch of layer b's 2 MB and the 2 MB of a's output it received (its
    backward's input, kept on stage 0 only as stage 0's own): 4 MB, 2 MB of them the inter-stage buffer."""
    from simulator.strategies.replicated_pipeline import stage_memory
    raw = scenario({"micro_batches": 2, "stages": [{"layers": 2, "replicas": 1}, {"layers": 1, "replicas": 3}]},
                   {"global_batch_size": 12, "micro_batch_size": 1}, gpus=4, model=_toy_profile(tmp_path))
    sc = load_scenario(raw)
    prices = StagePrices(sc, sc.strategy)
    assert [prices.inter_stage_bytes(i) for i in (0, 1)] == [0.0, 2e6]
    assert [stage_memory(prices, i).activations_bytes for i in (0, 1)] == [pytest.approx(12e6), pytest.approx(4e6)]
    r = simulate(sc)
    assert [r.simulated_peak_memory_gib[f"stage{i}"] for i in (0, 1)] == pytest.approx(r.memory_per_stage_gib, rel=1e-12)


@pytest.mark.parametrize("cut,sent", [(15, 2 * 256 * 56 * 56 * 2), (16, 0)])
def test_inter_stage_buffers_of_a_built_network_by_hand(cut, sent):
    """ResNet-50 (fp16) in two stages of one GPU, 2 micro-batches of 2 images. Cut after layer1.0.add
    (15 layers): the add saves nothing and the next stage's ReLU reads its output, so stage 0 keeps the
    sent (256, 56, 56) tensor of each of its K_0 = 2 micro-batches itself: 2 images x 256·56·56 x 2 B.
    Cut one layer later, after layer1.0.relu3: the in-place ReLU saves its input, which is its output,
    so the sent tensor is already among stage 0's saved bytes: nothing to add. The last stage sends
    nothing, and what it receives its first layer (a convolution or the ReLU) saves."""
    from simulator.strategies.replicated_pipeline import stage_memory
    raw = scenario({"micro_batches": 2, "stages": [{"layers": cut, "replicas": 1}, {"layers": 175 - cut, "replicas": 1}]},
                   {"global_batch_size": 4, "micro_batch_size": 1}, gpus=2, model="resnet50")
    raw["training"] = {"precision": "fp16"}
    sc = load_scenario(raw)
    prices = StagePrices(sc, sc.strategy)
    saved = sum(layer.saved_bytes for layer in prices.layers(0))
    assert prices.inter_stage_bytes(0) == sent and prices.inter_stage_bytes(1) == 0.0
    assert stage_memory(prices, 0).activations_bytes == 2 * (saved + sent)
