"""The transformer's layer graph (workloads/transformer_graph.py), the one source of a transformer's
parameters, FLOPs and activation bytes, equals the closed forms it replaced, kept as oracles:
parameters and forward FLOPs per op (validation/closed_forms.py) and activation bytes (Korthikanti
2022 Table 2 as validation/closed_form_activations.py writes it), over shapes (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from validation import closed_forms
from validation.closed_form_activations import (
    activation_bytes_per_layer,
    embedding_activation_bytes,
    mla_activation_bytes_per_layer,
    output_layer_activation_bytes,
)
from workloads import counting
from workloads.graph import ShardShape
from workloads.schema import MLASpec, MoESpec, TransformerSpec

RECOMPUTE = ("none", "selective", "full")


@st.composite
def dense_models(draw):
    heads = draw(st.sampled_from([2, 4, 8]))
    head_dim = draw(st.sampled_from([8, 16]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8) if heads % h == 0]))
    return TransformerSpec(
        name="t", num_layers=draw(st.integers(1, 6)), hidden_size=heads * head_dim, num_attention_heads=heads,
        num_kv_heads=kv, ffn_hidden_size=draw(st.sampled_from([None, 96, 128])), gated_mlp=draw(st.booleans()),
        vocab_size=draw(st.sampled_from([100, 256])), seq_length=draw(st.sampled_from([16, 32, 64])),
        tied_embeddings=draw(st.booleans()), position_embedding=draw(st.sampled_from(["learned", "rope"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])), linear_bias=draw(st.booleans()),
        qkv_bias=draw(st.sampled_from([None, True, False])),
        # a head width decoupled from hidden / heads (Gemma, Qwen3, Mistral NeMo) some of the time
        attention_head_dim=draw(st.sampled_from([None, None, 12, 24])))


def _moe(model: TransformerSpec) -> TransformerSpec:
    return model.model_copy(update={"moe": MoESpec(num_experts=4, top_k=2, num_shared_experts=1)})


@settings(max_examples=60, deadline=None)
@given(dense_models(), st.booleans(), st.booleans())
def test_params_and_flops_equal_the_closed_forms(model, moe, qk_norm):
    model = _moe(model) if moe else model
    model = model.model_copy(update={"qk_norm": qk_norm})  # Qwen3's per-head q/k norms
    graph = model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length, vocab_padding_tp=0)).check()
    assert len(graph.layers) == model.num_layers + 2 and graph.prologue == graph.epilogue == 1
    assert graph.total_params() == closed_forms.total_params(model) == counting.total_params(model)
    # as held at tp 1: the vocabulary padded to a multiple of 128 (100 and 256 -> 128 and 256), in the
    # word table and an untied head
    padded = model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length)).total_params()
    extra_rows = -(-model.vocab_size // 128) * 128 - model.vocab_size
    tables = 1 if model.tied_embeddings else 2
    assert padded == counting.padded_total_params(model, 1) == graph.total_params() + extra_rows * tables * model.hidden_size
    assert counting.active_params(model) == closed_forms.active_params(model)
    assert counting.embedding_params(model) == closed_forms.embedding_params(model)
    assert counting.output_head_params(model) == closed_forms.output_head_params(model)
    for kind in {model.is_moe_layer(i) for i in range(model.num_layers)}:
        assert counting.layer_params(model, kind) == closed_forms.layer_params(model, kind).total
    forward = closed_forms.forward_flops_per_sequence(model, model.seq_length)
    for flash in (False, True):
        flops = counting.step_flops(model, model.seq_length, 3, "none", flash_attention=flash)
        assert flops.model_flops == pytest.approx(3 * 3 * forward, rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(dense_models(), st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.booleans(), st.sampled_from([1, 2]),
       st.sampled_from(["bf16", "fp32"]), st.booleans())
def test_block_saved_bytes_equal_korthikanti(model, b, tp, sp, cp, precision, flash):
    if model.num_attention_heads % tp or (model.kv_heads % tp and tp % model.kv_heads) or model.ffn_size % tp:
        return
    sp = sp and tp > 1
    shard = ShardShape(micro_batch=b, seq_length=model.seq_length, tp=tp, cp=cp, sequence_parallel=sp,
                       precision=precision, flash_attention=flash)
    graph = model.layer_graph(shard)
    e = shard.act_bytes
    block = graph.layers[1]
    for mode in RECOMPUTE:
        # FlashAttention never stores the core: its "none" is Korthikanti's selective count.
        oracle_mode = "selective" if flash and mode == "none" else mode
        expected = activation_bytes_per_layer(
            model.seq_length, b, model.hidden_size, model.num_attention_heads, tp=tp, sequence_parallel=sp,
            recompute=oracle_mode, ffn=model.ffn_size, kv_heads=model.kv_heads, gated=model.gated_mlp, cp=cp,
            element_bytes=e, head_dim=model.head_dim)
        assert block.kept_bytes(mode, graph.input_bytes(block)) == pytest.approx(expected, rel=1e-12)
    embedding, head = graph.layers[0], graph.layers[-1]
    for mode in RECOMPUTE:
        assert embedding.kept_bytes(mode) == pytest.approx(
            embedding_activation_bytes(model.seq_length, b, model.hidden_size, tp, sp, cp), rel=1e-12)
        assert head.kept_bytes(mode) == pytest.approx(output_layer_activation_bytes(
            model.seq_length, b, model.hidden_size, model.padded_vocab_size(tp), tp, sp, cp, element_bytes=e), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([None, 24]), st.sampled_from([1, 2, 4]), st.booleans(), st.booleans())
def test_mla_block_saved_bytes_equal_the_mla_formula(q_lora, tp, sp, flash):
    mla = MLASpec(q_lora_rank=q_lora, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    model = TransformerSpec(name="m", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128,
                            seq_length=32, linear_bias=False, mla=mla, gated_mlp=True, ffn_hidden_size=96)
    sp = sp and tp > 1
    shard = ShardShape(micro_batch=2, seq_length=32, tp=tp, sequence_parallel=sp, flash_attention=flash)
    graph = model.layer_graph(shard)
    block = graph.layers[1]
    for mode in RECOMPUTE:
        expected = mla_activation_bytes_per_layer(32, 2, 64, 4, mla, tp=tp, sequence_parallel=sp, recompute=mode,
                                                  ffn=96, gated=True, flash_attention=flash)
        assert block.kept_bytes(mode, graph.input_bytes(block)) == pytest.approx(expected, rel=1e-12)


def test_blocks_of_one_kind_share_their_ops():
    """The graph reuses the cached ops of each layer kind: a 126-layer model prices two tuples."""
    model = _moe(TransformerSpec(name="x", num_layers=6, hidden_size=32, num_attention_heads=4, vocab_size=64,
                                 seq_length=16)).model_copy()
    model = model.model_copy(update={"moe": model.moe.model_copy(update={"moe_layer_frequency": 2})})
    graph = model.layer_graph(ShardShape(micro_batch=1, seq_length=16))
    forwards = {id(layer.forward) for layer in graph.pipelined}
    assert len(forwards) == 2
    assert [layer.expert_params > 0 for layer in graph.pipelined] == [False, True] * 3
