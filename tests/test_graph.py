"""The workload graph (workloads/graph.py) and the counts read from it (workloads/counting.py): ops,
FLOPs, bytes and TP collectives of one layer, derived by hand for small shapes."""

from __future__ import annotations

import pytest

from validation.closed_forms import korthikanti_model_flops, narayanan_flops_with_recompute, narayanan_params
from workloads.catalog import MODELS
from workloads.counting import embedding_params, layer_params, output_head_params, step_flops, total_params
from workloads.graph import Op, ShardShape, embedding_work, head_work, layer_work
from workloads.schema import TransformerSpec

H, S, HEADS, V, LAYERS = 256, 128, 8, 1000, 4
V_PADDED = 1024   # V as Megatron holds it at tp 1 and 2: rounded up to a multiple of 128 x tp
GPT = TransformerSpec(name="g", num_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS, vocab_size=V,
                      seq_length=S)
# Llama-style: GQA (8 heads, 2 kv heads, head dim 32), SwiGLU with ffn 704, no biases, RMSNorm.
LLAMA = TransformerSpec(name="l", num_layers=LAYERS, hidden_size=H, num_attention_heads=HEADS, num_kv_heads=2,
                        ffn_hidden_size=704, gated_mlp=True, vocab_size=V, seq_length=S, norm="rmsnorm",
                        linear_bias=False, position_embedding="rope")


def _flops(ops) -> float:
    return sum(op.flops for op in ops)


def _by_name(ops) -> dict[str, Op]:
    return {op.name: op for op in ops}


@pytest.mark.parametrize("b", [1, 2])
def test_gpt_layer_forward_flops(b):
    # QKV 2·T·3h·h, QK^T 2·b·s²·h, AV 2·b·s²·h, out 2·T·h², FC1 and FC2 2·T·4h·h (T = b·s):
    # 24·T·h² + 4·b·s²·h.
    work = layer_work(GPT, ShardShape(micro_batch=b, seq_length=S))
    assert _flops(work.forward) == 24 * b * S * H * H + 4 * b * S * S * H
    assert work.forward_flops == _flops(work.forward)


def test_backward_is_twice_the_forward():
    work = layer_work(GPT, ShardShape(micro_batch=1, seq_length=S))
    assert work.backward_flops == 2 * work.forward_flops
    head = head_work(GPT, ShardShape(micro_batch=1, seq_length=S))
    assert _flops(head.backward) == 2 * _flops(head.forward)


def test_gemm_shapes_and_bytes():
    ops = _by_name(layer_work(GPT, ShardShape(micro_batch=1, seq_length=S)).forward)
    qkv = ops["qkv"]
    assert (qkv.m, qkv.n, qkv.k) == (S, 3 * H, H)
    assert qkv.bytes_moved == 2 * (S * H + H * 3 * H + S * 3 * H)  # A, B and C in bf16
    assert qkv.gflop_per_gemm == pytest.approx(2 * S * 3 * H * H / 1e9)
    scores = ops["attn_scores"]
    assert (scores.m, scores.n, scores.k, scores.batch) == (S, S, H // HEADS, HEADS)
    assert scores.kind == "attention" and scores.recompute_class == "attention_core"
    # memory-bound: layernorm reads and writes b·s·h elements of 2 bytes
    assert ops["ln1"].bytes_moved == S * H * 2 * 2 and ops["ln1"].flops == 0
    # softmax+dropout: reads 1, writes 2 of b·heads·s·s
    assert ops["softmax_dropout"].bytes_moved == HEADS * S * S * 2 * 3
    assert ops["gelu"].bytes_moved == S * 4 * H * 2 * 2


def test_tensor_parallel_shards_every_gemm():
    full = layer_work(GPT, ShardShape(micro_batch=1, seq_length=S))
    for tp in (2, 4, 8):
        shard = layer_work(GPT, ShardShape(micro_batch=1, seq_length=S, tp=tp))
        assert _flops(shard.forward) == _flops(full.forward) / tp
        ops = _by_name(shard.forward)
        assert ops["qkv"].n == 3 * H // tp and ops["fc1"].n == 4 * H // tp and ops["fc2"].k == 4 * H // tp
        assert ops["attn_scores"].batch == HEADS // tp


def test_tp_collectives_without_sequence_parallelism():
    # Forward: all-reduce after attn_out and after FC2 (Megatron "g"), payload b·s·h·2 bytes.
    # Backward: the conjugate "f" all-reduces of the QKV and FC1 input gradients, each issued after
    # its dgrad GEMM and overlappable with the following wgrad GEMM.
    work = layer_work(GPT, ShardShape(micro_batch=1, seq_length=S, tp=2))
    fwd = [op for op in work.forward if op.kind == "collective"]
    assert [(op.name, op.collective, op.group) for op in fwd] == [
        ("attn_out.all_reduce", "all_reduce", "tp"), ("mlp_out.all_reduce", "all_reduce", "tp")]
    assert all(op.comm_bytes == S * H * 2 for op in fwd)
    bwd = list(work.backward)
    comms = [i for i, op in enumerate(bwd) if op.kind == "collective"]
    assert [bwd[i].name for i in comms] == ["fc1.input_grad.all_reduce", "qkv.input_grad.all_reduce"]
    for i in comms:
        assert bwd[i].overlaps_next and bwd[i].collective == "all_reduce" and bwd[i].comm_bytes == S * H * 2
        assert bwd[i - 1].name.endswith(".dgrad") and bwd[i + 1].name.endswith(".wgrad")


def test_tp_collectives_with_sequence_parallelism():
    # SP: all-gather before each column-parallel GEMM, reduce-scatter after each row-parallel one;
    # backward: the reduce-scatters become all-gathers and the input gradients are reduce-scattered.
    # Norms and dropouts run on s/t tokens.
    tp = 4
    work = layer_work(GPT, ShardShape(micro_batch=1, seq_length=S, tp=tp, sequence_parallel=True))
    fwd = [op.collective for op in work.forward if op.kind == "collective"]
    assert fwd == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
    bwd = [op.collective for op in work.backward if op.kind == "collective"]
    assert sorted(bwd) == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    ops = _by_name(work.forward)
    assert ops["ln1"].bytes_moved == S // tp * H * 2 * 2
    assert ops["dropout_residual2"].bytes_moved == S // tp * H * 2 * 3


def test_no_collectives_without_tp():
    work = layer_work(GPT, ShardShape(micro_batch=1, seq_length=S))
    assert not [op for op in work.forward + work.backward if op.kind == "collective"]
    assert not [op for op in embedding_work(GPT, ShardShape(1, S)).forward if op.kind == "collective"]


def test_gqa_and_swiglu_shapes():
    # head dim 32: QKV width (8 + 2·2)·32 = 384; SwiGLU FC1 produces 2·704 (gate and up).
    work = layer_work(LLAMA, ShardShape(micro_batch=1, seq_length=S))
    ops = _by_name(work.forward)
    assert ops["qkv"].n == 384
    assert ops["fc1"].n == 2 * 704 and ops["fc2"].k == 704
    assert "swiglu" in ops and "gelu" not in ops
    # 2·s·384·h + 2·s²·h·2 + 2·s·h² + 2·s·1408·h + 2·s·704·h
    expected = 2 * S * 384 * H + 4 * S * S * H + 2 * S * H * H + 2 * S * 1408 * H + 2 * S * 704 * H
    assert _flops(work.forward) == expected


def test_recompute_ops():
    work = layer_work(GPT, ShardShape(micro_batch=1, seq_length=S))
    assert work.recompute_ops("full") == work.forward
    assert [op.name for op in work.recompute_ops("selective")] == ["attn_scores", "softmax_dropout", "attn_values"]
    assert work.recompute_ops("none") == ()


def test_head_and_embedding_ops():
    tp = 2
    head = _by_name(head_work(GPT, ShardShape(micro_batch=1, seq_length=S, tp=tp)).forward)
    assert head["lm_head"].n == V_PADDED // tp
    assert head["lm_head"].input_grad_collective == "all_reduce"
    assert head["cross_entropy"].bytes_moved == S * (V_PADDED // tp) * 4 * 3  # fp32 logits read 2, write 1
    emb = embedding_work(GPT, ShardShape(micro_batch=1, seq_length=S, tp=tp))
    assert [op.collective for op in emb.forward if op.kind == "collective"] == ["all_reduce"]


def test_step_flops_equal_korthikanti_and_narayanan():
    B = 8
    f = step_flops(GPT, S, B, "none")
    assert f.model_flops == pytest.approx(korthikanti_model_flops(B, LAYERS, S, H, V_PADDED), rel=1e-12)
    assert f.hardware_flops == f.model_flops
    full = step_flops(GPT, S, B, "full")
    assert full.model_flops == f.model_flops
    assert full.hardware_flops == pytest.approx(narayanan_flops_with_recompute(B, LAYERS, S, H, V_PADDED), rel=1e-12)
    # selective recompute re-runs QK^T and AV: + 4·b·s²·h per layer and sequence
    sel = step_flops(GPT, S, B, "selective")
    assert sel.hardware_flops - sel.model_flops == pytest.approx(B * LAYERS * 4 * S * S * H, rel=1e-12)


def test_parameter_counts():
    # GPT layer: 12h² + 13h; embedding V·h + s·h; final layernorm 2h + untied head V·h.
    assert layer_params(GPT) == 12 * H * H + 13 * H
    assert embedding_params(GPT) == V * H + S * H
    assert output_head_params(GPT) == 2 * H + V * H
    assert total_params(GPT) == LAYERS * (12 * H * H + 13 * H) + V * H + S * H + 2 * H + V * H
    # Llama: attention h·(h + 2·kv·hd) + h², SwiGLU 3·h·ffn, two RMSNorms h each; no position table.
    assert layer_params(LLAMA) == H * (H + 2 * 64) + H * H + 3 * H * 704 + 2 * H
    assert embedding_params(LLAMA) == V * H


def test_llama2_7b_parameter_count():
    # Meta's Llama-2-7b: 6,738,415,616 parameters (Hugging Face safetensors total).
    assert total_params(MODELS.get("llama2-7b")) == 6_738_415_616


def test_gpt3_175b_matches_narayanan_plus_final_norm():
    # Narayanan et al. 2021: P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)); they omit the final
    # layernorm (2h); GPT-3's head is tied to the embedding.
    m = MODELS.get("gpt3-175b")
    p = narayanan_params(m.num_layers, m.hidden_size, m.vocab_size, m.seq_length)
    assert total_params(m) == pytest.approx(p + 2 * m.hidden_size, rel=1e-15)
    assert total_params(m) / 1e9 == pytest.approx(174.6, abs=0.05)


def test_context_parallel_shards_the_sequence():
    # cp = 2: each rank computes s/2 query tokens against the full s keys.
    work = layer_work(GPT, ShardShape(micro_batch=1, seq_length=S, cp=2))
    ops = _by_name(work.forward)
    assert (ops["attn_scores"].m, ops["attn_scores"].n) == (S // 2, S)
    assert ops["qkv"].m == S // 2
