"""Tensor parallelism on general layer graphs (workloads/tensor_parallel.py): the Megatron split
of a toy chain derived by hand, BERT-large and ViT at tp 2/4/8 with parameters per rank
= (total - replicated) / tp + replicated, the collectives' payloads against the per-layer
strategy's Megatron split, and the refusals that remain (convolutions past the stem, LSTMs,
heads that tp does not divide)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from graph_models import ChainSpec
from test_graph_simulate import C, chain_scenario

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.per_layer.cost import reshard
from workloads.graph import ShardShape
from workloads.networks.catalog import get_network
from workloads.tensor_parallel import tensor_parallel_graph

HALF = 2 * 256 * 256 * 128  # FLOPs of a 256 x 256 x 256 GEMM with one dimension halved
ACT = 256 * 256 * 2         # bytes of one 256 x 256 bf16 activation


def _ops(layer):
    return [(op.name, op.kind, op.flops, (op.m, op.n, op.k), op.comm_bytes) for op in (*layer.forward, *layer.backward)]


def test_toy_chain_tp2_column_then_row_by_hand():
    # fc0 reads the network's input (replicated) and feeds a linear: column-parallel, N 256 -> 128;
    # no input-gradient all-reduce (nothing before it needs one). fc1 reads the split: row-parallel,
    # K 256 -> 128, its 256 x 256 output all-reduced in the forward (65,536 bf16 = 131,072 B).
    g = ChainSpec().layer_graph(ShardShape(micro_batch=1, seq_length=1, tp=2))
    fc0, fc1 = g.layers
    assert g.tensor_parallel == 2
    assert _ops(fc0) == [("fc0", "gemm", HALF, (256, 128, 256), 0.0),
                         ("fc0.dgrad", "gemm", HALF, (256, 256, 128), 0.0),
                         ("fc0.wgrad", "gemm", HALF, (256, 128, 256), 0.0)]
    assert _ops(fc1) == [("fc1", "gemm", HALF, (256, 256, 128), 0.0),
                         ("fc1.all_reduce", "collective", 0.0, (0, 0, 0), ACT),
                         ("fc1.dgrad", "gemm", HALF, (256, 128, 256), 0.0),
                         ("fc1.wgrad", "gemm", HALF, (128, 256, 256), 0.0)]
    assert (fc0.params, fc1.params) == (256 * 128, 256 * 128)
    # fc0 keeps its whole input, hands on half its output; fc1 keeps its half input, hands on all
    assert (fc0.saved_bytes, fc0.output_bytes) == (ACT, ACT / 2)
    assert (fc1.saved_bytes, fc1.output_bytes) == (ACT / 2, ACT)
    # GEMM bytes: input, output and weight with the split dimension halved
    assert fc0.forward[0].bytes_moved == 2 * (256 * 256 + 256 * 128 + 256 * 128)


def test_toy_chain_four_layers_has_the_input_gradient_all_reduce():
    g = ChainSpec(widths=(256,) * 4).layer_graph(ShardShape(micro_batch=1, seq_length=1, tp=2))
    comms = [(layer.name, op.name, op.comm_bytes, op.overlaps_next) for layer in g.layers
             for op in (*layer.forward, *layer.backward) if op.kind == "collective"]
    assert comms == [("fc1", "fc1.all_reduce", ACT, False),
                     ("fc2", "fc2.input_grad.all_reduce", ACT, True),
                     ("fc3", "fc3.all_reduce", ACT, False)]
    fc2 = g.layer("fc2")
    assert [op.name for op in fc2.backward] == ["fc2.dgrad", "fc2.input_grad.all_reduce", "fc2.wgrad"]


def test_toy_chain_tp2_step_time_exact():
    # Half of each GEMM per rank (3c of the 6c on one GPU) plus fc1's forward all-reduce on
    # 100 GB/s with 1 us latency: 2(n-1)·1 us + 2(n-1)/n · 131,072 B / 1e11 B/s.
    t_ar = 2e-6 + ACT / 100e9
    r = simulate(chain_scenario(2, nvl_gb_per_s=100, nvl_latency_us=1, tp=2))
    assert r.step_time_s == pytest.approx(3 * C + t_ar, rel=1e-9)
    assert r.time_breakdown_s["tp_comm"] == pytest.approx(t_ar, rel=1e-6)
    assert r.num_parameters == 2 * 256 * 256
    assert r.model_flops_per_step == pytest.approx(2 * 3 * 2 * 256**3)  # counted unsplit


def _params(name: str, tp: int) -> tuple[float, float]:
    model = get_network(name)
    shard = ShardShape(micro_batch=1, seq_length=model.seq_length or 1)
    whole = model.layer_graph(shard).total_params()
    return whole, model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length or 1, tp=tp)).total_params()


# Replicated parameters, by hand. BERT-large (h 1024, 24 layers): 50 layer norms (embeddings,
# 2 per layer, the MLM transform) of 2h; position (512 x h) and segment (2 x h) tables; the
# attention-output and MLP-output biases (row-parallel, 2 per layer); the MLM transform dense
# (h² + h, feeds a layer norm: not split); the next-sentence classifier's bias (2).
BERT_REPLICATED = 50 * 2 * 1024 + 512 * 1024 + 2 * 1024 + 48 * 1024 + (1024 * 1024 + 1024) + 2
# ViT-B/16 (h 768, 12 layers): the patch projection (3·16·16·h + h, the stem), class token (h),
# positions (197 x h), 25 layer norms of 2h, 2 row-parallel biases per layer, the classifier
# (h x 1000 + 1000, on the class token, no loss after it: not split).
VIT_B_REPLICATED = (3 * 256 * 768 + 768) + 768 + 197 * 768 + 25 * 2 * 768 + 24 * 768 + (768 * 1000 + 1000)
VIT_L_REPLICATED = (3 * 256 * 1024 + 1024) + 1024 + 197 * 1024 + 49 * 2 * 1024 + 48 * 1024 + (1024 * 1000 + 1000)


@pytest.mark.parametrize(("name", "replicated", "tp"), [
    ("bert-large", BERT_REPLICATED, 2), ("bert-large", BERT_REPLICATED, 4), ("bert-large", BERT_REPLICATED, 8),
    ("vit-b-16", VIT_B_REPLICATED, 2), ("vit-b-16", VIT_B_REPLICATED, 4), ("vit-l-16", VIT_L_REPLICATED, 8)])
def test_parameters_per_rank_are_total_over_tp_but_the_replicated(name, replicated, tp):
    whole, per_rank = _params(name, tp)
    assert per_rank == pytest.approx((whole - replicated) / tp + replicated, rel=1e-12)


def test_bert_layer_split_matches_megatron():
    model = get_network("bert-large")
    g1 = model.layer_graph(ShardShape(micro_batch=2, seq_length=512))
    g4 = model.layer_graph(ShardShape(micro_batch=2, seq_length=512, tp=4))
    act = 2 * 512 * 1024 * 2
    attention, attn1 = g4.layer("encoder.layer.3.attention"), g1.layer("encoder.layer.3.attention")
    # heads ÷4: every kernel's FLOPs a quarter; one forward and one backward all-reduce of b·s·h
    assert sum(op.flops for op in attention.forward) == pytest.approx(sum(op.flops for op in attn1.forward) / 4)
    assert sum(op.flops for op in attention.backward) == pytest.approx(sum(op.flops for op in attn1.backward) / 4)
    assert [(op.name, op.comm_bytes) for op in attention.forward + attention.backward if op.kind == "collective"] == [
        ("encoder.layer.3.attention.all_reduce", act), ("encoder.layer.3.attention.input_grad.all_reduce", act)]
    # the MLP: column (GELU follows the split), row with its all-reduce; norms and adds unchanged
    assert g4.layer("encoder.layer.3.intermediate.dense").forward[0].n == 1024
    assert g4.layer("encoder.layer.3.intermediate.gelu").output_bytes == 2 * 512 * 4096 * 2 / 4
    assert g4.layer("encoder.layer.3.output.dense").forward[0].k == 1024
    for name in ("encoder.layer.3.output.LayerNorm", "encoder.layer.3.output.residual", "embeddings.add_position"):
        assert g4.layer(name) == g1.layer(name)
    # vocab-parallel word embedding (an all-reduce of its output) and cross-entropy (3 fp32 per token)
    assert g4.layer("embeddings.word_embeddings").params == 30522 * 1024 / 4
    assert g4.layer("embeddings.position_embeddings") == g1.layer("embeddings.position_embeddings")
    loss = g4.layer("cls.predictions.loss")
    assert [op.comm_bytes for op in loss.forward if op.kind == "collective"] == [2 * 512 * 4] * 3
    assert g4.layer("cls.predictions.decoder").forward[0].n == 7631  # 30,522 / 4 rounded up (Megatron pads)


def test_all_reduce_payloads_equal_the_per_layer_megatron_split():
    # The per-layer strategy's Megatron split of BERT (examples/bert-large-per-layer-8xa100.yaml)
    # reduce-scatters the attention's and the MLP's partial sums and all-gathers the inputs of the
    # column-parallel layers; an all-reduce is that reduce-scatter + all-gather of the same payload
    # S. Its graph is at the global batch (32): compare with the spmd graph at micro-batch 32.
    sc = load_scenario("examples/bert-large-per-layer-8xa100.yaml")
    g = get_network("bert-large").layer_graph(ShardShape(micro_batch=32, seq_length=512, tp=4))
    row = reshard(sc, "encoder.layer.0.output.dense", {"reduction": 4}, {"batch": 4})
    heads = reshard(sc, "encoder.layer.0.attention", {"heads": 4}, {"batch": 4})
    column = reshard(sc, "encoder.layer.0.attention.LayerNorm", {"batch": 4}, {"channels": 4},
                     "encoder.layer.0.intermediate.dense")
    assert [c.kind for c in row.forward] == ["reduce_scatter"]
    assert g.layer("encoder.layer.0.output.dense").forward[1].comm_bytes == row.forward[0].payload_bytes
    assert g.layer("encoder.layer.0.attention").forward[-1].comm_bytes == heads.forward[0].payload_bytes
    assert [c.kind for c in column.backward] == ["reduce_scatter"]
    dense = g.layer("encoder.layer.0.intermediate.dense")
    assert [op.comm_bytes for op in dense.backward if op.kind == "collective"] == [column.backward[0].payload_bytes]


@pytest.mark.parametrize(("name", "tp", "message"), [
    ("resnet50", 2, r"conv2d layers \(resnet50 layer 'layer1.0.conv1'\)"),
    ("gnmt-16", 2, r"lstm layers \(gnmt-16 layer 'encoder.rnn0'\)"),
    ("vit-b-16", 8, r"8 does not divide the 12 heads of vit-b-16 layer 'encoder.layers.0.self_attention'"),
])
def test_layers_without_a_tp_split_are_refused_naming_the_layer(name, tp, message):
    model = get_network(name)
    with pytest.raises(ConfigError, match=r"parallelism.tp: .*" + message):
        model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length or 1, tp=tp))


def test_tp1_is_the_graph_itself():
    g = ChainSpec().layer_graph(ShardShape(micro_batch=1, seq_length=1))
    assert tensor_parallel_graph(g, 1) is g


def test_bert_tp4_simulates_with_tp_traffic():
    r = simulate(load_scenario("examples/bert-large-tp4-dgx-a100.yaml"))
    assert r.time_breakdown_s["tp_comm"] > 0
    assert r.num_parameters == get_network("bert-large").layer_graph(ShardShape(micro_batch=1, seq_length=512)).total_params()


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_bert_layer_activations_follow_korthikanti(tp):
    # Korthikanti et al. 2022 Sec. 4.1, tensor parallel without sequence parallelism: a layer
    # keeps s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes at 16 bits (BERT's eager attention stores the
    # s x s core); the builder adds the layer norms' fp32 mean and 1/std (2·2·4 B per token).
    s, b, h, a = 512, 2, 1024, 16
    g = get_network("bert-large").layer_graph(ShardShape(micro_batch=b, seq_length=s, tp=tp))
    kept = sum(layer.saved_bytes for layer in g.layers if layer.name.startswith("encoder.layer.5."))
    assert kept == pytest.approx(s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)) + 2 * 2 * 4 * s * b, rel=1e-12)


def test_cli_refuses_vit_b_16_at_tp_8_in_one_line():
    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(repo / "examples" / "bert-large-tp4-dgx-a100.yaml"),
                        "--set", "model=vit-b-16", "--set", "parallelism.tp=8", "--set", "parallelism.dp=1",
                        "--set", "parallelism.micro_batch_size=32"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(repo)))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: parallelism.tp: 8 does not divide the 12 heads")
