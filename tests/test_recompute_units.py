"""Full recompute on any graph checkpoints units, not single kernels (issue 19).

A CNN's layer graph has one layer per kernel, so "keep each layer's input" kept what the layers
saved anyway (ResNet-50: 10.43 -> 10.43 GiB for a second forward). simulator/memory/checkpoints.py
checkpoints the residual blocks read from the wiring and, on plain chains, Chen et al. 2016's
sqrt(n) segments. The byte counts here are written out by hand from the networks' shapes
(torchvision's ResNet-50 v1.5 and VGG-16 at 224x224), not read back from the graph.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.memory.analytic import chunk_activation_bytes, rank_memory, recompute_working_bytes
from simulator.memory.checkpoints import graph_kept_bytes, plan_of, sqrt_segments, units_of
from simulator.memory.vectorised import stage_memories
from simulator.scenario import load_scenario
from simulator.strategies.residual_blocks import residual_chain

ROOT = Path(__file__).resolve().parents[1]
RESNET = str(ROOT / "examples" / "resnet50-8xa100.yaml")
B = 8        # images per micro-batch
BF16 = 2     # bytes per stored activation element (AMP)


def _scenario(model: str = "resnet50", recompute: str = "full", *extra: str):
    return load_scenario(RESNET, [f"model={model}", f"parallelism.recompute={recompute}", "parallelism.dp=1",
                                  "cluster.num_gpus=1", f"parallelism.micro_batch_size={B}",
                                  f"parallelism.global_batch_size={B}", *extra])


def _working_by_hand(graph, units: list[list[int]]) -> float:
    """The largest unit's saved bytes less what it keeps (module docstring of checkpoints.py)."""
    plan = plan_of(graph)
    return max(max(0.0, sum(graph.layers[i].saved_bytes for i in u) - sum(plan.kept_bytes[i] for i in u))
               for u in units)


def test_resnet50_keeps_the_images_and_the_16_bottleneck_inputs():
    graph = _scenario().layer_graph()
    opening, blocks, closing = residual_chain(graph)
    assert [layer.name for layer in opening] == ["conv1", "bn1", "relu", "maxpool"]
    assert len(blocks) == 16 and all(b.residual for b in blocks)
    # inputs (C, H, W): the images; layer1.0 gets the maxpool's 64x56x56; layer1.1-2.0 256x56x56;
    # layer2.1-3.0 512x28x28; layer3.1-4.0 1024x14x14; layer4.1, 4.2 and the head 2048x7x7
    elements = (3 * 224 * 224 + 64 * 56 * 56 + 3 * 256 * 56 * 56 + 4 * 512 * 28 * 28 + 6 * 1024 * 14 * 14
                + 3 * 2048 * 7 * 7)
    assert graph_kept_bytes(graph, "full") == B * elements * BF16
    assert graph.kept_bytes("full") == B * elements * BF16
    units = [list(range(0, 4))]
    start = 4
    for block in blocks:
        units.append(list(range(start, start + len(block.layers))))
        start += len(block.layers)
    units.append(list(range(start, len(graph.layers))))
    assert units_of(graph) == tuple(n for n, u in enumerate(units) for _ in u)
    scenario = _scenario()
    working = _working_by_hand(graph, units)
    assert recompute_working_bytes(scenario, 0) == working
    assert rank_memory(scenario, 0).activations_bytes == pytest.approx(B * elements * BF16 + working, rel=1e-12)
    # a real saving: the unit saves a block, not a kernel
    assert rank_memory(scenario, 0).activations_bytes < 0.5 * rank_memory(_scenario(recompute="none"),
                                                                           0).activations_bytes


def test_vgg16_keeps_the_inputs_of_its_sqrt_n_segments():
    graph = _scenario("vgg16").layer_graph()
    assert len(graph.layers) == 40 and not residual_chain(graph)[1]
    assert sqrt_segments(40) == [6, 6, 6, 6, 6, 5, 5]  # ceil(sqrt(40)) = 7 segments
    firsts = [0, 6, 12, 18, 24, 30, 35]
    assert [graph.layers[i].name for i in firsts] == ["features.0.conv", "features.3.relu", "features.7.conv",
                                                       "features.10.relu", "features.14.conv", "features.17.pool",
                                                       "classifier.2"]
    # what each segment reads: the images, conv3's 128x112x112, relu6's 256x56x56, conv10's 512x28x28,
    # pool13's 512x14x14, relu16's 512x14x14, relu classifier.1's 4096 features
    elements = (3 * 224 * 224 + 128 * 112 * 112 + 256 * 56 * 56 + 512 * 28 * 28 + 512 * 14 * 14
                + 512 * 14 * 14 + 4096)
    assert graph_kept_bytes(graph, "full") == B * elements * BF16
    units = [list(range(a, b)) for a, b in zip(firsts, [*firsts[1:], 40], strict=True)]
    scenario = _scenario("vgg16")
    assert rank_memory(scenario, 0).activations_bytes == pytest.approx(
        B * elements * BF16 + _working_by_hand(graph, units), rel=1e-12)


def test_sqrt_segments():
    assert sqrt_segments(1) == [1]
    assert sqrt_segments(4) == [2, 2]
    assert sqrt_segments(5) == [2, 2, 1]
    assert sqrt_segments(49) == [7] * 7
    for n in range(1, 200):
        parts = sqrt_segments(n)
        assert sum(parts) == n and max(parts) - min(parts) <= 1 and len(parts) ** 2 >= n


def test_unet_skips_are_kept_once():
    """U-Net's encoder outputs are read again by the decoder's concatenations: each tensor that
    crosses a segment border is kept once, whoever reads it."""
    graph = _scenario("unet").layer_graph()
    plan = plan_of(graph)
    index = {layer.name: i for i, layer in enumerate(graph.layers)}
    crossing = {index[name] for i, layer in enumerate(graph.layers) for name in layer.inputs
                if plan.unit[index[name]] != plan.unit[i]}
    assert graph_kept_bytes(graph, "full") == pytest.approx(
        graph.layers[0].saved_bytes + sum(graph.layers[j].output_bytes for j in crossing), rel=1e-12)


@pytest.mark.parametrize("model", ["resnet50", "vgg16", "unet", "vit-b-16", "gnmt-16", "inception-v3"])
def test_full_recompute_saves_memory_on_every_catalog_graph(model):
    full, none = _scenario(model).layer_graph(), _scenario(model, "none").layer_graph()
    assert graph_kept_bytes(full, "full") < 0.8 * graph_kept_bytes(none, "none")


def test_transformer_blocks_stay_their_own_units():
    scenario = load_scenario(None, ["parallelism.recompute=full"])  # GPT-3 175B, tp 8 pp 8
    graph = scenario.layer_graph()
    plan = plan_of(graph)
    assert plan.per_layer and plan.unit == tuple(range(len(graph.layers)))
    assert plan.kept_bytes == tuple(layer.kept_bytes("full", graph.input_bytes(layer)) for layer in graph.layers)


@pytest.mark.parametrize("model", ["resnet50", "vgg16", "unet", "vit-b-16"])
@pytest.mark.parametrize("pp,schedule,v", [(2, "1f1b", 1), (3, "gpipe", 1), (4, "interleaved", 2)])
def test_pipeline_stages_agree_with_the_vectorised_model_and_memory_over_time(model, pp, schedule, v):
    try:
        scenario = _scenario(model, "full", f"parallelism.pp={pp}", f"parallelism.schedule={schedule}",
                             f"parallelism.virtual_stages={v}", f"cluster.num_gpus={pp}",
                             f"parallelism.global_batch_size={B * 8}", "parallelism.micro_batch_size=" + str(B))
    except ConfigError as exc:
        pytest.skip(str(exc))
    vectorised = stage_memories(scenario)
    for stage in range(pp):
        want = rank_memory(scenario, stage)
        assert vectorised[stage].activations_bytes == pytest.approx(want.activations_bytes, rel=1e-12)
        assert vectorised[stage].total_bytes == pytest.approx(want.total_bytes, rel=1e-12)
    # a chunk that starts inside a unit keeps what it receives: the chunks' kept bytes add up to
    # at least the whole graph's checkpoints
    chunks = sum(chunk_activation_bytes(scenario, g) for g in range(pp * v))
    assert chunks >= graph_kept_bytes(scenario.layer_graph(), "full") * (1 - 1e-12)


def test_selective_recompute_on_a_cnn_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="parallelism.recompute.*attention core.*resnet50"):
        _scenario("resnet50", "selective")


@pytest.mark.parametrize("model", ["resnet50", "vgg16"])
def test_full_recompute_costs_one_more_forward_and_the_simulated_peak_is_the_analytic_one(model):
    from simulator.cost.compute import ComputeModel
    from simulator.simulate import simulate

    none, full = simulate(_scenario(model, "none")), simulate(_scenario(model, "full"))
    scenario = _scenario(model, "full")
    tr = scenario.training
    compute = ComputeModel(scenario.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)
    forward_s = sum(compute.ops_time_s(layer.forward) for layer in scenario.layer_graph().layers)
    assert full.time_breakdown_s["recompute"] == pytest.approx(forward_s, rel=1e-12)
    assert full.step_time_s - none.step_time_s == pytest.approx(forward_s, rel=1e-9)
    assert full.simulated_peak_memory_gib["stage0"] == pytest.approx(full.peak_memory_gib, rel=1e-12)
    assert full.peak_memory_gib < none.peak_memory_gib


@pytest.mark.parametrize("model", ["resnet50", "vgg16"])
def test_pipeline_memory_over_time_peaks_at_the_analytic_peak(model):
    from simulator.simulate import simulate

    r = simulate(_scenario(model, "full", "parallelism.pp=2", "cluster.num_gpus=2", "parallelism.schedule=1f1b",
                           f"parallelism.global_batch_size={4 * B}"))
    simulated = [r.simulated_peak_memory_gib[f"stage{i}"] for i in range(2)]
    assert simulated == pytest.approx(r.memory_per_stage_gib, rel=1e-12)


def test_each_unit_is_recomputed_once_before_the_backward_of_its_last_layer():
    """The per-layer backward (DDP overlapping its buckets): a unit's forward is re-run as one task
    just before its last layer's backward, none before the others (ResNet-50: stem, 16 blocks, head)."""
    from simulator.strategies.spmd.plan import Planner

    scenario = _scenario("resnet50", "full", "parallelism.dp=2", "cluster.num_gpus=2",
                         f"parallelism.global_batch_size={2 * B}")
    graph = scenario.layer_graph()
    plan = Planner(scenario).build()
    names = [t.name for tasks in plan.streams.values() for t in tasks if t.category == "recompute"]
    last_of_unit = [i for i in range(len(graph.layers))
                    if i + 1 == len(graph.layers) or units_of(graph)[i + 1] != units_of(graph)[i]]
    assert names == [f"B.mb0.c0.L{i}.recompute" for i in reversed(last_of_unit)]
    assert len(names) == 18
    planner = Planner(scenario)
    recomputed_s = sum(t.duration_s for tasks in plan.streams.values() for t in tasks if t.category == "recompute")
    assert recomputed_s == pytest.approx(sum(planner._compute_time(layer.forward) for layer in graph.layers),
                                         rel=1e-9)


def test_subnetwork_dp_reruns_the_masked_forward_and_keeps_masked_checkpoints():
    """Subnetwork data parallelism under full recompute: each worker re-runs its masked forward
    before its backward (a task of its own) and keeps its masked share of the unit inputs."""
    from simulator.simulate import simulate
    from simulator.strategies.subnetwork_dp import worker_work

    example = str(ROOT / "examples" / "vgg16-subnetwork-dp-a100.yaml")
    full = load_scenario(example, ["parallelism.recompute=full"])
    none = load_scenario(example, ["parallelism.recompute=none"])
    work, plain = worker_work(full, 0), worker_work(none, 0)
    assert work.recompute and sum(op.flops for op in work.recompute) == pytest.approx(
        sum(op.flops for op in work.forward), rel=1e-12)
    assert not plain.recompute and plain.working_bytes == 0.0
    assert 0 < work.working_bytes and work.kept_activation_bytes + work.working_bytes < plain.kept_activation_bytes
    r_full, r_none = simulate(full), simulate(none)
    assert r_full.time_breakdown_s["recompute"] > 0
    assert r_full.step_time_s > r_none.step_time_s and r_full.peak_memory_gib < r_none.peak_memory_gib


def test_layer_parallel_mgrit_reruns_a_block_before_every_backward_through_it():
    from simulator.strategies.layer_parallel_mgrit import chain_of, compile_mgrit

    example = str(ROOT / "examples" / "gnmt16-layer-parallel-mgrit-a100.yaml")
    full = load_scenario(example, ["parallelism.recompute=full"])
    chain = chain_of(full)
    assert chain.recompute_s == pytest.approx(chain.forward_s, rel=1e-12)
    assert chain_of(load_scenario(example, ["parallelism.recompute=none"])).recompute_s == (0.0,) * chain.blocks
    plan = compile_mgrit(full)
    for stream in plan.streams.values():
        for before, task in zip(stream, stream[1:], strict=False):
            adjoint = task.name.startswith("B.") and task.category == "compute" and ".L" in task.name
            if adjoint and not task.name.endswith(".out") and task.duration_s > 0:
                assert before.category == "recompute" and before.name == task.name + ".recompute", task.name
    assert sum(1 for s in plan.streams.values() for t in s if t.name.startswith("wgrad.") and
               t.category == "recompute") == full.parallelism.pp * full.parallelism.num_micro_batches


def test_a_pipeline_cut_inside_a_block_keeps_every_tensor_that_crosses_it():
    """ResNet-50 on two stages (even split, 87 + 88 layers): stage 1 starts at layer3.0's
    downsample batch norm, inside the block, and receives the downsample convolution's output and
    the main branch's bn3 output (the add's other input): it keeps both for its part's recompute."""
    scenario = _scenario("resnet50", "full", "parallelism.pp=2", "cluster.num_gpus=2",
                         f"parallelism.global_batch_size={4 * B}")
    graph = scenario.layer_graph()
    names = [layer.name for layer in graph.layers]
    cut = names.index("layer3.0.downsample.1")
    assert cut == 87 and graph.layers[cut + 1].inputs == ("layer3.0.bn3", "layer3.0.downsample.1")
    crossing = graph.layer("layer3.0.downsample.0").output_bytes + graph.layer("layer3.0.bn3").output_bytes
    assert crossing == 2 * B * 1024 * 14 * 14 * BF16
    plan = plan_of(graph)
    assert chunk_activation_bytes(scenario, 1) == pytest.approx(sum(plan.kept_bytes[cut:]) + crossing, rel=1e-12)
    assert stage_memories(scenario)[1].activations_bytes == pytest.approx(
        rank_memory(scenario, 1).activations_bytes, rel=1e-12)


def test_per_layer_refuses_recompute_instead_of_ignoring_it():
    from simulator.simulate import simulate

    scenario = load_scenario(str(ROOT / "examples" / "vgg16-per-layer-8xa100.yaml"), ["parallelism.recompute=full"])
    with pytest.raises(ConfigError, match="parallelism.recompute.*per_layer does not recompute"):
        simulate(scenario)


@pytest.mark.parametrize("traced, catalog, blocks", [("resnet50", "resnet50", 16), ("resnet152", "resnet152", 50),
                                                     ("wide_resnet101_2", "wide-resnet101-2", 33),
                                                     ("vit_b_16", "vit-b-16", 12), ("inception_v3", "inception-v3", 0)])
def test_a_traced_network_has_its_catalog_twins_units(traced, catalog, blocks, torchvision):
    """torchvision's Bottleneck ends ``out += identity; out = self.relu(out)``, traced as ``add`` then
    ``layer1_0_relu_2`` (no block key in either name): the ReLU ends the block by its wiring and kind, not a
    unit of its own; torchvision's ViT layer's two adds (``add_1``, ``add_2``) are one block, its attention step
    and the MLP step after it. So full recompute keeps what the catalog twin keeps (it kept +92% on ResNet-50).
    Inception-v3 has no residual block: its sqrt(n) segments follow the layer order, which is torchvision's
    ``_forward`` order in both (the catalog built InceptionC/E's 1x1 branch last: +1.2%)."""
    from workloads.catalog import resolve_model
    from workloads.graph import ShardShape

    shard = ShardShape(micro_batch=2, seq_length=1, precision="bf16")
    graph, twin = (resolve_model(ref).layer_graph(shard) for ref in (f"torchvision:{traced}", catalog))
    sizes = [[len(b.layers) for b in chain] for chain in (residual_chain(graph)[1], residual_chain(twin)[1])]
    assert sizes[0] == sizes[1] and len(sizes[0]) == blocks
    if traced != "vit_b_16":  # the ViT's patch flattening is two traced layers (reshape, permute), one in the catalog
        assert units_of(graph) == units_of(twin)
        assert [layer.kind for layer in graph.layers] == [layer.kind for layer in twin.layers]
    assert max(units_of(graph)) == max(units_of(twin))
    assert graph_kept_bytes(graph, "full") == graph_kept_bytes(twin, "full")
    kept = [[(layer.kind, k) for layer, k in zip(g.layers, plan_of(g).kept_bytes, strict=True) if k]
            for g in (graph, twin)]
    assert kept[0] == kept[1]  # the same checkpoints: the images, each block's input, the head's
