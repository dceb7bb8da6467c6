"""torchtitan's per-operation selective activation checkpointing (``recompute: selective_op``) and
AsyncTP's pipelined TP overlap (``tp_overlap: async_tp``): what is re-run, what is kept, what it costs,
on toy shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.compute import ComputeModel
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.plan import Planner
from tests.test_simulate import L, toy_raw
from workloads.counting import step_flops
from workloads.graph import ShardShape, layer_work
from workloads.schema import MoESpec, TransformerSpec
from workloads.transformer_graph import DROPOUT_MASK_BYTES

LLAMA_LIKE = TransformerSpec(name="llama-toy", num_layers=2, hidden_size=256, num_attention_heads=8, num_kv_heads=2,
                             ffn_hidden_size=640, gated_mlp=True, vocab_size=512, seq_length=64, norm="rmsnorm",
                             position_embedding="rope")


def test_selective_op_reruns_norms_wk_w3_and_the_tp_all_gathers():
    # torchtitan's policy on wq wk wv wo w1 w3 w2 (mm 1..7): saves 1, 3, 5, 7; the backward needs wk's and
    # w3's outputs (2 and 6) but not wo's (4); the norms, the residual add and SwiGLU's product are re-run,
    # and under TP the two all-gathers (not in the save list)
    shard = ShardShape(micro_batch=2, seq_length=64, tp=2, sequence_parallel=True, flash_attention=True)
    work = layer_work(LLAMA_LIKE, shard)
    ops = work.recompute_ops("selective_op")
    assert [op.name for op in ops] == ["ln1", "attn_in.all_gather", "qkv.op_sac", "dropout_residual1", "ln2",
                                       "mlp_in.all_gather", "fc1.op_sac", "swiglu"]
    tokens, h, d = 2 * 64, 256, 256 // 8
    kv_rank, ffn_rank = 2 // 2, 640 // 2
    qkv, fc1 = ops[2], ops[6]
    assert (qkv.m, qkv.n, qkv.k) == (tokens, kv_rank * d, h) and qkv.flops == 2 * tokens * kv_rank * d * h
    assert (fc1.m, fc1.n, fc1.k) == (tokens, ffn_rank, h) and fc1.flops == 2 * tokens * ffn_rank * h
    assert qkv.bytes_moved == 2 * (tokens * h + h * kv_rank * d + tokens * kv_rank * d)
    # no TP: no all-gathers; the flash attention core is saved, not re-run
    plain = layer_work(LLAMA_LIKE, ShardShape(micro_batch=2, seq_length=64, flash_attention=True))
    assert [op.name for op in plain.recompute_ops("selective_op")] == ["ln1", "qkv.op_sac", "dropout_residual1", "ln2",
                                                                       "fc1.op_sac", "swiglu"]


def test_selective_op_hardware_flops_add_wk_and_w3_once_per_layer():
    seq, batch = 64, 3
    none = step_flops(LLAMA_LIKE, seq, batch, "none", flash_attention=True)
    op = step_flops(LLAMA_LIKE, seq, batch, "selective_op", flash_attention=True)
    h, d, kv, ffn = 256, 32, 2, 640
    assert op.model_flops == none.model_flops
    assert op.hardware_flops - none.hardware_flops == pytest.approx(
        LLAMA_LIKE.num_layers * batch * 2 * seq * h * (kv * d + ffn), rel=1e-12)


@st.composite
def dense_models(draw):
    heads = draw(st.sampled_from([4, 8]))
    head_dim = draw(st.sampled_from([8, 16]))
    kv = draw(st.sampled_from([g for g in (1, 2, 4, 8) if heads % g == 0]))
    return TransformerSpec(name="t", num_layers=2, hidden_size=heads * head_dim, num_attention_heads=heads,
                           num_kv_heads=kv, ffn_hidden_size=draw(st.sampled_from([96, 128])),
                           gated_mlp=draw(st.booleans()), vocab_size=128, seq_length=32, qk_norm=draw(st.booleans()))


@settings(max_examples=60, deadline=None)
@given(dense_models(), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]), st.booleans(), st.booleans())
def test_selective_op_keeps_the_block_input_q_v_attention_output_residual_and_w1(model, b, tp, sp, flash):
    # closed form (e = 2 B, m = 1-byte masks, w = heads x head_dim, g KV heads per rank, f the FFN width):
    # e·sb·(2h/sp + 2w/t + d·g + f/t) + 2m·sbh/sp (+ q's share of the q/k-norm input e·sb·w/t)
    if model.num_attention_heads % tp or (model.kv_heads % tp and tp % model.kv_heads) or model.ffn_size % tp:
        return
    sp = sp and tp > 1
    shard = ShardShape(micro_batch=b, seq_length=32, tp=tp, sequence_parallel=sp, flash_attention=flash)
    block = model.layer_graph(shard).layers[1]
    e, sb, h, t = 2.0, 32 * b, model.hidden_size, tp
    sp_div = t if sp else 1
    w, d = model.attention_width, model.head_dim
    g = model.kv_heads // t if model.kv_heads % t == 0 else 1
    expected = e * sb * (2 * h / sp_div + 2 * w / t + d * g + model.ffn_size / t) + 2 * DROPOUT_MASK_BYTES * sb * h / sp_div
    if model.qk_norm:
        expected += e * sb * w / t
    assert block.kept_bytes("selective_op") == pytest.approx(expected, rel=1e-12)
    assert block.kept_bytes("full") < block.kept_bytes("selective_op") < block.kept_bytes("selective")


def _toy_selective_op(**par):
    raw = toy_raw(1, **par)
    raw["parallelism"]["recompute"] = "selective_op"
    return raw


def test_selective_op_recompute_time_is_the_rerun_kernels_exactly():
    # one GPU, one micro-batch: the recompute category is L x the re-run kernels of one block (GPT toy:
    # MHA, plain MLP, materialised attention core: wk is a third of qkv, fc1 is saved, the core re-run)
    sc = load_scenario(_toy_selective_op())
    result = simulate(sc)
    compute = ComputeModel(sc.accelerator, "bf16")
    block = sc.layer_graph().layers[1]
    ops = block.recompute_ops("selective_op")
    assert [op.name for op in ops] == ["ln1", "qkv.op_sac", "attn_scores", "softmax_dropout", "attn_values",
                                       "dropout_residual1", "ln2", "gelu"]
    assert result.time_breakdown_s["recompute"] == pytest.approx(L * sum(compute.time_s(op) for op in ops), rel=1e-9)
    none = simulate(load_scenario(toy_raw(1)))
    assert result.step_time_s == pytest.approx(none.step_time_s + result.time_breakdown_s["recompute"], rel=1e-9)


def test_selective_op_is_refused_for_moe_and_mla_models():
    moe = LLAMA_LIKE.model_copy(update={"moe": MoESpec(num_experts=4, top_k=2)})
    raw = _toy_selective_op()
    raw["model"] = moe.model_dump(exclude_none=True)
    with pytest.raises(ConfigError, match="parallelism.recompute"):
        simulate(load_scenario(raw))


def _pipelined_raw(tp_comm_overlap: bool) -> dict:
    raw = toy_raw(2, nvl_gb_per_s=0.5, nvl_latency_us=5, tp=2, global_batch_size=2, sequence_parallel=True,
                  overlap_grad_reduce=False)
    raw["parallelism"]["tp_comm_overlap"] = tp_comm_overlap
    raw["parallelism"]["tp_overlap"] = "async_tp"
    return raw


def test_pipelined_tp_overlap_chunks_keep_the_flops_and_add_the_partial_sum():
    sc = load_scenario(_pipelined_raw(True))
    plain = load_scenario(_pipelined_raw(False)).layer_graph().layers[1].forward
    fwd = sc.layer_graph().layers[1].forward
    for name in ("qkv", "attn_out", "fc1", "fc2"):
        whole = next(op for op in plain if op.name == name)
        one = next(op for op in fwd if op.name == f"{name}.tp_chunk")
        rest = next(op for op in fwd if op.name == f"{name}.tp_chunks")
        assert one.m == rest.m == whole.m // 2 and (one.batch, rest.batch) == (1, 1)
        assert one.flops + rest.flops == pytest.approx(whole.flops, rel=1e-12)
    out_proj = next(op for op in plain if op.name == "attn_out")
    partial = next(op for op in fwd if op.name == "attn_out.tp_partial_sum")
    assert partial.bytes_moved == pytest.approx(2 * out_proj.m * out_proj.n * 1.5, rel=1e-12)


def test_pipelined_tp_overlap_hides_the_collective_behind_all_chunks_but_one():
    # each pair costs max(t_comm, (tp-1) chunks) + the chunk that cannot overlap (the all-gather's last,
    # the reduce-scatter's first), plus the partial sum after a reduce-scatter
    plain_planner, planner = Planner(load_scenario(_pipelined_raw(False))), Planner(load_scenario(_pipelined_raw(True)))
    plain_ops = plain_planner.layer_pass_ops(plain_planner.layer_kinds[0], "F")
    ops = planner.layer_pass_ops(planner.layer_kinds[0], "F")
    _, plain_comm = plain_planner.pass_cost_s(0, plain_ops)
    t_comm = plain_comm / 4  # four collectives of one payload, all exposed without the overlap
    compute = planner.compute_of(0)
    kernels, exposed = planner.pass_cost_s(0, ops)
    assert kernels == pytest.approx(sum(compute.time_s(op) for op in ops if op.kind != "collective"), rel=1e-12)
    hidden_behind = [compute.time_s(ops[i + 1]) for i, op in enumerate(ops) if op.kind == "collective"]
    assert len(hidden_behind) == 4 and t_comm > max(hidden_behind)
    assert exposed == pytest.approx(sum(t_comm - t for t in hidden_behind), rel=1e-9)


def test_torchtitan_rows_map_per_op_checkpointing_and_the_exposed_input_gradient_reduce_scatter():
    from validation.modern.registry import built

    cases = {c.row: c for c in built("torchtitan")[0]}
    par = cases[24].scenario["parallelism"]  # Llama 3 8B, FSDP 8 x TP 8, per-op selective AC, no AsyncTP
    assert par["recompute"] == "selective_op" and par["overlap_tp_grad_comm"] is False
    async_tp = cases[25].scenario["parallelism"]  # the same with AsyncTP
    assert async_tp["tp_comm_overlap"] and async_tp["tp_overlap"] == "async_tp"
    assert cases[1].scenario["parallelism"]["recompute"] == "selective_op"   # "selective": llama3_8b.toml's op
    assert cases[42].scenario["parallelism"]["recompute"] == "selective"     # "selective layer"
    assert cases[18].scenario["parallelism"]["recompute"] == "full"
    kernels = {row: cases[row].scenario["training"]["elementwise_kernels"] for row in (0, 1, 42)}
    assert kernels == {0: "eager", 1: "fused", 42: "eager"}  # no compile, compile, not stated (the default then)



@pytest.mark.parametrize("detail", [False, True])
def test_async_tp_costs_the_same_in_every_planner_mode_and_more_than_userbuffers(detail):
    async_tp = simulate(load_scenario(_pipelined_raw(True)), detail=detail)
    reference = simulate(load_scenario(_pipelined_raw(True)))
    userbuffers_raw = _pipelined_raw(True)
    userbuffers_raw["parallelism"]["tp_overlap"] = "userbuffers"
    userbuffers = simulate(load_scenario(userbuffers_raw))
    plain = simulate(load_scenario(_pipelined_raw(False)))
    assert async_tp.step_time_s == pytest.approx(reference.step_time_s, rel=1e-9)
    assert userbuffers.step_time_s < async_tp.step_time_s < plain.step_time_s


# --------------------------------------------------------------------------- eager elementwise kernels


def test_eager_bytes_per_element_count_each_composite_kernel():
    from workloads.graph import eager_bytes_per_element

    # bf16: RMSNorm upcast 2+4, square 4+4, mean 4, multiply 4+4, downcast 4+2, weight 2+2; SwiGLU SiLU 2+2,
    # multiply 4+2; RoPE upcast 2+4, complex multiply 4+4, downcast 4+2
    assert [eager_bytes_per_element(k, 2) for k in ("rmsnorm", "swiglu", "rope")] == [36, 10, 20]


def test_eager_elementwise_moves_the_composite_bytes_and_adds_rope():
    fused = layer_work(LLAMA_LIKE, ShardShape(micro_batch=2, seq_length=64, flash_attention=True))
    eager = layer_work(LLAMA_LIKE, ShardShape(micro_batch=2, seq_length=64, flash_attention=True,
                                              eager_elementwise=True))
    tokens, h, ffn, qk = 128, 256, 640, (8 + 2) * 32
    by_name = {op.name: op for op in eager.forward}
    assert {op.name: op.bytes_moved for op in fused.forward if op.name in ("ln1", "ln2", "swiglu")} == {
        "ln1": tokens * h * 4, "ln2": tokens * h * 4, "swiglu": tokens * ffn * 6}
    assert (by_name["ln1"].bytes_moved, by_name["swiglu"].bytes_moved, by_name["rope"].bytes_moved) == (
        tokens * h * 36, tokens * ffn * 10, tokens * qk * 20)
    names = [op.name for op in eager.forward]
    assert names[names.index("qkv") + 1] == "rope" and "rope" not in [op.name for op in fused.forward]
    assert "rope" in [op.name for op in eager.recompute_ops("selective_op")]
    # a LayerNorm / GeLU / learned-position model is the same either way
    gpt = LLAMA_LIKE.model_copy(update={"norm": "layernorm", "gated_mlp": False, "position_embedding": "learned"})
    assert layer_work(gpt, ShardShape(micro_batch=2, seq_length=64, eager_elementwise=True)) == layer_work(
        gpt, ShardShape(micro_batch=2, seq_length=64))


def test_eager_elementwise_prices_mla_norms_rope_and_the_experts_swiglu():
    # an MLA model (DeepSeek-V3's attention) has four RMSNorms a block and RoPE on its rope part; the routed
    # experts' SwiGLU is eager too (session 9 audit gap 9: the field did nothing on MLA models, silently)
    from workloads.schema import MLASpec

    mla = MLASpec(q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
    ds = TransformerSpec.model_validate({**LLAMA_LIKE.model_dump(), "num_kv_heads": None, "linear_bias": False,
                                         "mla": mla.model_dump(), "moe": MoESpec(
        num_experts=4, top_k=2, num_shared_experts=1, expert_ffn_hidden_size=128, first_dense_layers=1).model_dump()})
    shard = ShardShape(micro_batch=2, seq_length=64, flash_attention=True)
    eager_shard = ShardShape(micro_batch=2, seq_length=64, flash_attention=True, eager_elementwise=True)
    tokens, h = 128, 256
    for layer in (0, 1):  # dense, MoE
        fused = {op.name: op for op in layer_work(ds, shard, layer).forward}
        eager = layer_work(ds, eager_shard, layer).forward
        by_name = {op.name: op for op in eager}
        for norm, width in (("ln1", h), ("ln2", h), ("q_norm", 96), ("kv_norm", 64)):
            assert fused[norm].bytes_moved == tokens * width * 4
            assert by_name[norm].bytes_moved == tokens * width * 36
        names = [op.name for op in eager]
        assert names[names.index("kv_up") + 1] == "rope"
        assert by_name["rope"].bytes_moved == tokens * (8 + 1) * 16 * 20  # q's rope part per head + the shared k_R
        for act in ("swiglu",) if layer == 0 else ("expert_act", "shared_act"):
            assert by_name[act].bytes_moved == fused[act].bytes_moved / 6 * 10
    raw = toy_raw(1)
    raw["model"] = ds.model_dump(exclude_none=True)
    raw["training"]["attention"] = "flash"
    fused_s = simulate(load_scenario(raw)).step_time_s
    raw["training"]["elementwise_kernels"] = "eager"
    assert simulate(load_scenario(raw)).step_time_s > fused_s


def test_eager_step_is_longer_by_exactly_the_extra_bytes():
    raw = toy_raw(1)
    raw["model"] = LLAMA_LIKE.model_dump(exclude_none=True)
    raw["training"]["attention"] = "flash"
    fused_sc = load_scenario(raw)
    raw["training"]["elementwise_kernels"] = "eager"
    eager_sc = load_scenario(raw)
    compute = ComputeModel(fused_sc.accelerator, "bf16")

    def block_s(sc) -> float:
        block = sc.layer_graph().layers[1]
        return sum(compute.time_s(op) for op in block.forward + block.backward if op.kind != "collective")

    delta = simulate(eager_sc).step_time_s - simulate(fused_sc).step_time_s
    assert delta == pytest.approx(LLAMA_LIKE.num_layers * (block_s(eager_sc) - block_s(fused_sc)), rel=1e-9)
    assert delta > 0


# --------------------------------------------------------------------------- the search's bound and fast path


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.sampled_from([2, 8]), st.sampled_from([1, 2]), st.sampled_from(["selective_op", "full", "none"]),
       st.booleans(), st.sampled_from(["eager", "fused"]), st.sampled_from([1, 2]))
def test_new_modes_keep_the_bound_below_and_the_fast_path_on_the_engine(tp, mbs, recompute, async_tp, kernels, pp):
    from simulator.engine.engine import Engine
    from simulator.explore.bounds import step_lower_bound_s
    from simulator.strategies.spmd.fast import fast_step

    example = str(Path(__file__).resolve().parents[1] / "examples" / "llama3-8b-torchtitan-sac-h100.yaml")
    sc = load_scenario(example, [f"parallelism.tp={tp}", f"parallelism.pp={pp}", f"parallelism.micro_batch_size={mbs}",
                                 f"parallelism.global_batch_size={mbs * 128 // (tp * pp)}",
                                 f"parallelism.recompute={recompute}", f"training.elementwise_kernels={kernels}",
                                 f"parallelism.tp_comm_overlap={'true' if async_tp else 'false'}",
                                 f"parallelism.zero_stage={1 if pp > 1 else 3}"])
    plan = Planner(sc).build()
    engine = Engine(plan.topology.port_capacity).run(plan.streams)
    assert 0 < step_lower_bound_s(sc) <= engine * (1 + 1e-9)
    assert fast_step(sc).step_time_s == pytest.approx(engine, rel=0.03)
