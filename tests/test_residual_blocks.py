"""Residual blocks read from the graph's wiring (simulator/strategies/residual_blocks.py): the
catalog's blocks as the name grouping gave them, GNMT-16's residual LSTM layers found, the
networks without residual steps refused with the reason, and an exact MGRIT timeline on a toy
whose residual steps are add layers (as GNMT's) instead of ``mlp_block`` layers.

Toy (tests/test_graph_simulate.py): 256-wide linear layers of one GEMM, C = 67.108864 us each
(forward, input gradient, weight gradient); an add and the input layer carry no ops.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import pytest
from test_graph_simulate import C, chain_scenario

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.layer_parallel_mgrit import LayerParallelMgritConfig, chain_of
from simulator.strategies.residual_blocks import block_key, residual_chain, residual_steps
from simulator.strategies.subnetwork_dp import assignment
from workloads.graph import ShardShape, _backward_of, _linear
from workloads.layer_graph import Layer, LayerGraph

X = 10e-6  # the toy's NVLink latency


@cache
def _graph(model: str) -> LayerGraph:
    return load_scenario({"model": model, "cluster": {"node": "dgx-a100-80g", "num_gpus": 1},
                          "parallelism": {"micro_batch_size": 1, "global_batch_size": 1},
                          "training": {"precision": "bf16"}}).layer_graph()


def _by_name(graph: LayerGraph):
    """The grouping the module used before the wiring was read (reference): consecutive layers
    of one name key; residual when an add of two inputs is among them or a block-kind layer."""
    groups: list[tuple[str, list[Layer]]] = []
    for layer in graph.layers:
        key = block_key(layer.name)
        if groups and groups[-1][0] == key:
            groups[-1][1].append(layer)
        else:
            groups.append((key, [layer]))
    out = []
    for key, layers in groups:
        residual = (layers[0].kind in ("transformer_block", "mlp_block") if len(layers) == 1
                    else any(x.kind == "add" and len(x.inputs) >= 2 for x in layers))
        out.append((key, tuple(x.name for x in layers), residual))
    first = next(i for i, g in enumerate(out) if g[2])
    last = max(i for i, g in enumerate(out) if g[2])
    return out[first:last + 1]


@pytest.mark.parametrize(("model", "blocks", "identity"), [
    ("resnet50", 16, 12), ("resnet152", 50, 46), ("resnext101-32x4d", 33, 29), ("se-resnext101-32x4d", 33, 29),
    ("wide-resnet101-2", 33, 29), ("vit-b-16", 12, 12), ("vit-l-16", 24, 24), ("bert-large", 24, 24),
    ("gpt-1.7b", 24, 24), ("llama3-8b", 32, 32), ("mixtral-8x7b", 32, 32), ("deepseek-v3", 61, 61)])
def test_catalog_blocks_are_those_of_the_name_grouping(model, blocks, identity):
    graph = _graph(model)
    _, chain, _ = residual_chain(graph)
    assert [(b.name, tuple(x.name for x in b.layers), b.residual) for b in chain] == _by_name(graph)
    assert (len(chain), sum(b.identity for b in chain)) == (blocks, identity)


def test_resnet50_bottleneck_is_the_fork_to_the_relu_after_the_add():
    opening, chain, closing = residual_chain(_graph("resnet50"))
    assert [x.name for x in opening] == ["conv1", "bn1", "relu", "maxpool"]
    assert [x.name for x in closing] == ["avgpool", "flatten", "fc"]
    first = chain[0]  # a downsampling shortcut: the fork is the stem's max pool, not an input of the add
    assert (first.layers[0].name, first.layers[-1].name, first.identity) == ("layer1.0.conv1", "layer1.0.relu3", False)


def test_gnmt16_has_12_residual_lstm_layers_and_its_decoder_bottom_between():
    # Wu et al. 2016 Sec. 3.1: residual connections from the third layer up in the 8-layer encoder and decoder.
    opening, chain, closing = residual_chain(_graph("gnmt-16"))
    assert [x.name for x in opening] == ["encoder.embedder", "encoder.dropout0", "encoder.rnn0",
                                         "encoder.dropout1", "encoder.rnn1"]
    assert [x.name for x in closing] == ["decoder.classifier", "loss"]
    residual = [b for b in chain if b.residual]
    assert [b.name for b in residual] == [f"encoder.residual{i}" for i in range(2, 8)] + \
        [f"decoder.residual{i}" for i in range(2, 8)]
    assert all(b.identity for b in residual)
    assert [x.name for x in chain[0].layers] == ["encoder.dropout2", "encoder.rnn2", "encoder.residual2"]
    bridge = chain[6]
    assert not bridge.residual and [x.name for x in bridge.layers] == [
        "decoder.embedder", "decoder.dropout0", "decoder.att_rnn", "decoder.attn", "decoder.dropout1",
        "decoder.cat1", "decoder.rnn1"]


def test_efficientnet_b0_has_its_9_residual_mbconv_blocks():
    # torchvision's B0: stages 2-6 of 2, 2, 3, 3, 4 MBConv blocks; all but each stage's first add
    # their input (the name grouping gave one block per stage, first MBConv included)
    _, chain, _ = residual_chain(_graph("efficientnet-b0"))
    residual = [b.name for b in chain if b.residual]
    assert residual == ["features.2.1", "features.3.1", "features.4.1", "features.4.2", "features.5.1", "features.5.2",
                        "features.6.1", "features.6.2", "features.6.3"]
    assert all(b.identity for b in chain if b.residual)
    assert [b.name for b in chain if not b.residual] == ["features.3", "features.4", "features.5", "features.6"]


@pytest.mark.parametrize("model", ["vgg16", "inception-v3", "unet", "biglstm"])
def test_networks_without_an_add_of_a_skip_have_no_residual_step(model):
    graph = _graph(model)
    assert residual_steps(graph) == []
    assert residual_chain(graph) == ((), [], graph.layers)


def test_an_add_of_two_sources_is_no_residual_step():
    # BERT's embeddings add the word, position and token-type embeddings: no common ancestor
    graph = _graph("bert-large")
    adds = {graph.layers[add].name for _, add in residual_steps(graph)}
    assert "embeddings.add_position" not in adds and "encoder.layer.0.attention.residual" in adds


MGRIT = {"model": "resnet50", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
         "parallelism": {"pp": 8, "micro_batch_size": 32, "global_batch_size": 32}, "training": {"precision": "bf16"},
         "strategy": {"kind": "layer_parallel_mgrit", "coarsening_factor": 2}}


@pytest.mark.parametrize("model", ["vgg16", "inception-v3", "unet"])
def test_mgrit_refuses_networks_without_residual_steps_and_says_why(model):
    with pytest.raises(ConfigError) as caught:
        simulate(load_scenario({**MGRIT, "model": model}))
    assert caught.value.field == "model"
    assert "no residual blocks" in str(caught.value) and "Günther" in str(caught.value)


def test_mgrit_on_gnmt16_steps_through_its_12_residual_layers():
    sc = load_scenario({**MGRIT, "model": "gnmt-16", "parallelism": {"pp": 6, "micro_batch_size": 8,
                                                                     "global_batch_size": 8},
                        "cluster": {"node": "dgx-a100-80g", "num_gpus": 6}})
    chain = chain_of(sc)
    assert chain.blocks == 12  # the decoder bottom runs inside the 6th step (after encoder.residual7)
    r = simulate(sc)
    assert r.extra["mgrit_blocks"] == 12 and r.step_time_s > 0


def test_subnetwork_block_masks_on_gnmt16_mask_its_residual_layers():
    sc = load_scenario({**MGRIT, "model": "gnmt-16", "parallelism": {"dp": 8, "micro_batch_size": 8,
                                                                     "global_batch_size": 64},
                        "strategy": {"kind": "subnetwork_dp", "mask": "block", "subnetworks": 4, "keep_fraction": 0.5}})
    assign = assignment(sc)
    masked = {name.rsplit(".", 1)[0] for name in assign.layer_slice}
    assert len(set(assign.layer_slice.values())) == 4
    assert {block_key(n) for n in assign.layer_slice if n.endswith(("residual2", "residual7"))} == {
        "encoder.residual2", "encoder.residual7", "decoder.residual2", "decoder.residual7"}
    assert masked == {"encoder", "decoder"}
    assert simulate(sc).extra["sdp_memory_reduction"] > 0


@dataclass(frozen=True)
class ResidualChainSpec:
    """A GNMT-like toy: an input layer, then ``steps`` residual steps y = x + fc_i(x) (a 256-wide
    GEMM and an add layer); ``bridge_after``: a plain linear layer after that step (no skip)."""

    name: str = "residual-chain"
    steps: int = 8
    bridge_after: int | None = None
    seq_length: int | None = None
    sample: str = "image"

    def layer_graph(self, shard: ShardShape) -> LayerGraph:
        m, elem, width = 256 * shard.micro_batch, shard.act_bytes, 256
        out = float(m * width * elem)

        def linear(name, source):
            gemm = _linear(name, m, width, width, elem, bias=False)
            return Layer(name, "linear", (gemm,), tuple(_backward_of(gemm)), saved_bytes=out,
                         output_bytes=out, inputs=(source,), input_shape=(width,), output_shape=(width,))

        layers = [Layer("input", "other", output_bytes=out, input_shape=(width,), output_shape=(width,))]
        x = "input"
        for i in range(self.steps):
            layers.append(linear(f"fc{i}", x))
            layers.append(Layer(f"add{i}", "add", output_bytes=out, inputs=(f"fc{i}", x), input_shape=(width,),
                                output_shape=(width,)))
            x = f"add{i}"
            if self.bridge_after == i:
                layers.append(linear("bridge", x))
                x = "bridge"
        return LayerGraph(self.name, tuple(layers), shard.micro_batch, sample=self.sample)


TOY = {"coarsening_factor": 2, "levels": 2, "forward_iterations": 1, "backward_iterations": 1,
       "residual_norm": False}


def test_mgrit_timeline_on_add_wired_steps_is_the_block_toys():
    # tests/test_layer_parallel_mgrit.py's hand-checked V-cycle on 8 blocks over 2 ranks
    # (coarsening 2, 1 + 1 iterations, no residual norm): 36C + 2x; the adds and the input layer
    # cost nothing, so the same chain read from add layers gives the same step.
    sc = replace(chain_scenario(2, ResidualChainSpec(), nvl_latency_us=10.0, pp=2, global_batch_size=1),
                 strategy=LayerParallelMgritConfig(**TOY))
    assert simulate(sc).step_time_s == pytest.approx(36 * C + 2 * X, rel=1e-9)


def test_a_bridge_between_residual_steps_runs_inside_the_step_before_it():
    # 4 steps and a plain linear layer after step 1 (GNMT's decoder bottom): still 4 time steps,
    # step 1 costs 2C forward and 4C backward (its GEMM and the bridge's); serially the 5 GEMMs
    # take 5C forward and 10C backward, so the serial reference is 15C (+ the ~0 s optimizer).
    spec = ResidualChainSpec(steps=4, bridge_after=1)
    sc = replace(chain_scenario(2, spec, nvl_latency_us=10.0, pp=2, global_batch_size=1),
                 strategy=LayerParallelMgritConfig(**TOY))
    chain = chain_of(sc)
    assert chain.blocks == 4
    assert [s / C for s in chain.forward_s] == pytest.approx([1, 2, 1, 1])
    assert [(a + w) / C for a, w in zip(chain.adjoint_s, chain.wgrad_s, strict=True)] == pytest.approx([2, 4, 2, 2])
    assert simulate(sc).extra["mgrit_serial_step_s"] == pytest.approx(15 * C, rel=1e-6)
