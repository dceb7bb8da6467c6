"""Multi-head latent attention (DeepSeek-V2/V3) on a toy shape computed by hand, and the
DeepSeek-V3 catalog entry and example against the report (arXiv:2412.19437)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.memory.analytic import stage_params
from simulator.scenario import load_scenario
from simulator.strategies.spmd.layout import Parallelism
from simulator.strategies.spmd.plan import Planner
from validation.closed_form_activations import mla_activation_bytes_per_layer
from validation.closed_forms import layer_params as closed_form_layer_params
from validation.closed_forms import mla_attention_params
from workloads.catalog import MODELS
from workloads.counting import active_params, layer_params, total_params
from workloads.graph import ShardShape, layer_work
from workloads.hf_config import spec_from_hf_config
from workloads.layer_kinds import layer_kind_counts
from workloads.schema import TransformerSpec

# Toy MLA: h = 64, 4 heads, query latent 16, kv latent 8, per head 8 (nope) + 4 (rope) for q/k, 8 for v.
MLA = dict(q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
TOY = dict(name="toy-mla", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=32, seq_length=32,
           norm="rmsnorm", linear_bias=False, position_embedding="rope", mla=MLA,
           make_vocab_size_divisible_by=1)   # the hand counts take V = 32 rows, unpadded
S = 32
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "deepseek-v3-h800.yaml"
# Split over tp (per head): W_UQ 16 x 4·12 = 768, W_UK/W_UV 8 x 4·(8+8) = 512, W_O 4·8 x 64 = 2048.
MLA_SPLIT = 768 + 512 + 2048
# Replicated: W_DQ 64 x 16 = 1024, q RMSNorm 16, W_DKV 64 x (8+4) = 768, kv RMSNorm 8.
MLA_REPLICATED = 1024 + 16 + 768 + 8


def toy_model(**kw) -> TransformerSpec:
    return TransformerSpec.model_validate(TOY | kw)


def test_mla_parameters_by_hand():
    model = toy_model()
    assert mla_attention_params(model) == (MLA_SPLIT, MLA_REPLICATED) == (3328, 1816)
    lp = closed_form_layer_params(model)
    assert (lp.attention, lp.attention_replicated) == (3328, 1816)
    assert lp.total == 3328 + 1816 + 2 * 64 * 256 + 2 * 64  # + FFN (4h, 2 matrices) + 2 RMSNorms
    assert layer_params(model) == lp.total  # the graph's block holds what the closed form counts
    # no query latent (DeepSeek-V2-Lite): a full-rank W_Q 64 x 48 replaces W_DQ, its norm and W_UQ
    lite = toy_model(mla=MLA | {"q_lora_rank": None})
    assert mla_attention_params(lite) == (64 * 48 + 512 + 2048, 768 + 8)


def test_mla_forward_flops_by_hand():
    work = layer_work(toy_model(), ShardShape(micro_batch=1, seq_length=S))
    ops = {op.name: op for op in work.forward}
    assert [op.name for op in work.forward[:7]] == ["ln1", "q_down", "q_norm", "kv_down", "kv_norm", "q_up", "kv_up"]
    # Projection GEMMs: 2·s·(weights of W_DQ, W_UQ, W_DKV, W_UK/W_UV, W_O) = 2·s·5120.
    projections = sum(ops[n].flops for n in ("q_down", "q_up", "kv_down", "kv_up", "attn_out"))
    assert projections == 2 * S * 5120
    # Scores with head size nope + rope = 12, values with v = 8: 2·s²·heads·(12 + 8).
    assert ops["attn_scores"].flops + ops["attn_values"].flops == 2 * S * S * 4 * (12 + 8)
    assert (ops["attn_scores"].k, ops["attn_values"].n) == (12, 8)
    flash = layer_work(toy_model(), ShardShape(micro_batch=1, seq_length=S, flash_attention=True))
    core = next(op for op in flash.forward if op.kind == "attention")
    assert core.flops == 2 * S * S * 4 * (12 + 8)
    assert core.backward_flops_factor == pytest.approx((3 * 12 + 2 * 8) / 20)


def test_mla_tensor_parallel_split():
    model = toy_model()
    work = layer_work(model, ShardShape(micro_batch=1, seq_length=S, tp=2))
    ops = {op.name: op for op in work.forward}
    assert (ops["q_down"].m, ops["q_down"].n) == (S, 16)          # replicated, all tokens
    assert ops["q_up"].n == 2 * 12 and ops["kv_up"].n == 2 * 16    # 2 heads per rank
    assert ops["attn_out"].k == 2 * 8
    assert ops["q_up"].input_grad_collective == "all_reduce" and ops["q_up"].input_grad_bytes == S * 16 * 2
    assert ops["kv_up"].input_grad_bytes == S * (8 + 4) * 2
    sp = layer_work(model, ShardShape(micro_batch=1, seq_length=S, tp=2, sequence_parallel=True))
    ops = {op.name: op for op in sp.forward}
    assert ops["q_down"].m == S // 2                                 # on the sequence-parallel share
    assert ops["mla_latents.all_gather"].comm_bytes == S * (16 + 8 + 4) * 2
    par = Parallelism(tp=2, dp=1)
    # stage params: attention ÷2 except the replicated down-projections, FFN ÷2, norms replicated,
    # embedding ÷2 (vocab-parallel), final norm + head ÷2.
    expected = MLA_SPLIT / 2 + MLA_REPLICATED + 2 * 64 * 256 / 2 + 2 * 64
    assert stage_params(model, par, 0) == round(2 * expected + 32 * 64 / 2 + 64 + 32 * 64 / 2)


def test_mla_selective_recompute_reruns_norms_and_up_projections():
    work = layer_work(toy_model(), ShardShape(micro_batch=1, seq_length=S))
    assert [op.name for op in work.recompute_ops("selective")] == [
        "ln1", "q_norm", "kv_norm", "q_up", "kv_up", "attn_scores", "softmax_dropout", "attn_values", "ln2"]


def test_mla_activation_bytes_by_hand():
    args = dict(seq=S, micro_batch=1, hidden=64, heads=4, mla=toy_model().mla, ffn=256)
    # none: LN/mask terms 10·sbh, latents 2·2·s·(16+8) + 2·s·4, Q/K/V 2·s·4·(12+12+8), attention-out
    # input 2·s·4·8, FFN (GeLU) 4·s·256, softmax/dropout core 5·heads·s².
    none = 10 * S * 64 + (4 * S * 24 + 2 * S * 4) + 2 * S * 4 * 32 + 2 * S * 32 + 4 * S * 256 + 5 * 4 * S * S
    assert mla_activation_bytes_per_layer(**args) == none == 87_296
    assert mla_activation_bytes_per_layer(**args, flash_attention=True) == none - 5 * 4 * S * S
    # selective: LN inputs + masks 6·sbh, latents before their norms + RoPE key 2·s·(16+8+4), out input, FFN.
    selective = 6 * S * 64 + 2 * S * 28 + 2 * S * 32 + 4 * S * 256
    assert mla_activation_bytes_per_layer(**args, recompute="selective") == selective == 48_896
    assert mla_activation_bytes_per_layer(**args, recompute="full") == 2 * S * 64


def test_mla_schema_checks():
    with pytest.raises(ValueError, match="linear_bias"):
        toy_model(linear_bias=True)
    with pytest.raises(ValueError, match="num_kv_heads"):
        toy_model(num_kv_heads=2)
    raw = dict(model=TOY, cluster=dict(node="dgx-h100", num_gpus=2), parallelism=dict(cp=2, global_batch_size=2))
    with pytest.raises(ConfigError, match="context parallel") as err:
        load_scenario(raw)
    assert err.value.field == "parallelism.cp"


# ----------------------------------------------------------------------------------- DeepSeek-V3


def test_deepseek_v3_parameter_counts():
    model = MODELS.get("deepseek-v3")
    assert layer_kind_counts(model) == {False: 3, True: 58}
    # Report: 671B total (without the 14B MTP module), 37B activated per token. Counted here:
    # 671,026,404,352 and 37.55B (with the 0.93B embedding and the 0.93B LM head); 2% tolerance
    # on the activated count, which the report rounds.
    assert total_params(model) == 671_026_404_352
    assert total_params(model) == pytest.approx(671e9, rel=1e-3)
    assert active_params(model) == pytest.approx(37e9, rel=0.02)
    dense, moe = closed_form_layer_params(model, False), closed_form_layer_params(model, True)
    assert (layer_params(model, False), layer_params(model, True)) == (dense.total, moe.total)
    assert dense.attention + dense.attention_replicated == 187_107_328
    assert moe.mlp_experts == 256 * 3 * 7168 * 2048 and moe.mlp_dense == 3 * 7168 * 2048


def test_deepseek_v3_from_its_hf_config():
    config = {
        "model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000, "attention_bias": False,
        "tie_word_embeddings": False, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "first_k_dense_replace": 3, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "num_nextn_predict_layers": 1,
    }
    spec = spec_from_hf_config(config, name="deepseek-v3")
    assert total_params(spec) == total_params(MODELS.get("deepseek-v3"))
    assert spec.mla == MODELS.get("deepseek-v3").mla and spec.moe == MODELS.get("deepseek-v3").moe
    with pytest.raises(ConfigError, match="moe_layer_freq"):
        spec_from_hf_config(config | {"moe_layer_freq": 2})


def test_deepseek_v3_example_runs_from_the_command_line(capsys):
    assert main(["simulate", str(EXAMPLE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["num_parameters"] == 671_026_404_352
    assert data["layers_per_stage"] == [3, 3] + [4] * 13 + [3]
    # The report's pre-training throughput: 14.8e12 tokens / (2.664e6 GPU-hours · 3600) = ~1540 tokens/s
    # per GPU. The simulation is slower mainly because DualPipe's overlap of the expert all-to-alls is
    # not modelled; a broad band guards against gross errors only.
    per_gpu = data["tokens_per_s"] / 2048
    assert 0.3 < per_gpu / 1540 < 1.3


def test_deepseek_v3_planner_builds_two_kinds():
    sc = load_scenario(EXAMPLE)
    planner = Planner(sc)
    assert planner.layer_works.keys() == {False, True}
    assert planner.chunk_runs(0) == ((False, 3),) and planner.chunk_runs(1) == ((True, 3),)
