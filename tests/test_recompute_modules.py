"""Megatron-Core's selective recompute by module list (``parallelism.recompute_modules``, with ``recompute:
selective``): what each module re-runs, what it drops from memory, what it costs, counted by hand on toy shapes;
bad lists refused naming the field; runs that do not set it unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.cost.compute import ComputeModel
from simulator.errors import ConfigError
from simulator.explore.search import _modules_for
from simulator.memory.analytic import peak_rank_memory
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.test_simulate import L, toy_raw
from workloads.graph import ShardShape, layer_work, modules_mode, modules_of_mode
from workloads.schema import TransformerSpec
from workloads.transformer_graph import transformer_layer_graph

REPO = Path(__file__).resolve().parents[1]

# a MoE block with everything the modules touch: clamped GLU experts with biases, a shared expert, 2 layers
H, FFN, EXPERT_FFN, TOP_K, E_ = 64, 96, 32, 2, 2   # E_: bytes per bf16 element
MOE = TransformerSpec.model_validate({
    "name": "toy-moe", "num_layers": 2, "hidden_size": H, "num_attention_heads": 4, "num_kv_heads": 2,
    "ffn_hidden_size": FFN, "gated_mlp": True, "vocab_size": 256, "seq_length": 128, "linear_bias": True,
    "norm": "rmsnorm", "position_embedding": "rope", "dropout": 0.0,
    "moe": {"num_experts": 8, "top_k": TOP_K, "expert_ffn_hidden_size": EXPERT_FFN, "num_shared_experts": 1,
            "activation_clamp": 7.0}})
DENSE = TransformerSpec.model_validate({
    "name": "toy-dense", "num_layers": 2, "hidden_size": H, "num_attention_heads": 4, "num_kv_heads": 2,
    "ffn_hidden_size": FFN, "gated_mlp": True, "vocab_size": 256, "seq_length": 128, "norm": "rmsnorm",
    "position_embedding": "rope", "dropout": 0.0})
MLA = TransformerSpec.model_validate({
    "name": "toy-mla", "num_layers": 2, "hidden_size": H, "num_attention_heads": 4, "ffn_hidden_size": FFN,
    "gated_mlp": True, "vocab_size": 256, "seq_length": 128, "norm": "rmsnorm", "position_embedding": "rope",
    "dropout": 0.0, "linear_bias": False, "mla": {"q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                            "v_head_dim": 16}})
SHARD = ShardShape(micro_batch=2, seq_length=128, flash_attention=True)
TOKENS = 2 * 128


def _block(model: TransformerSpec, shard: ShardShape = SHARD):
    return transformer_layer_graph(model, shard).layers[1]


def _names(model, modules, shard=SHARD) -> list[str]:
    return [op.name for op in layer_work(model, shard).recompute_ops(modules_mode(modules))]


def test_mode_string_is_canonical_and_read_back():
    assert modules_mode(["moe_act", "layernorm"]) == modules_mode(["layernorm", "moe_act"]) == \
        "selective:moe_act,layernorm"
    assert modules_of_mode("selective:moe_act,layernorm") == {"moe_act", "layernorm"}
    assert modules_of_mode("selective") == frozenset()


def test_each_module_reruns_its_megatron_ops_once():
    # MoE block (GQA: the input norm is fused into linear_qkv, the pre-MLP norm is a module of its own)
    assert _names(MOE, ["layernorm"]) == ["ln2"]
    assert _names(MOE, ["moe_act"]) == ["expert_act_clamp", "expert_act"]
    assert _names(MOE, ["shared_experts"]) == ["shared_fc1", "shared_act", "shared_fc2"]
    assert _names(MOE, ["moe"]) == ["router", "router_topk_permute", "expert_fc1", "expert_act_clamp",
                                    "expert_act", "expert_fc2", "expert_fc2_bias", "unpermute_weighted_sum",
                                    "shared_fc1", "shared_act", "shared_fc2"]
    assert _names(MOE, ["moe", "moe_act", "shared_experts"]) == _names(MOE, ["moe"])   # each op once
    assert _names(MOE, ["core_attn"]) == ["flash_attention"]
    assert _names(MOE, ["mlp"]) == []   # a MoE layer's MLP is the moe module (Megatron: recompute_mlp if not MoE)
    # dense GQA block: no norm of its own; the MLP (its norm fused into fc1) with its TP collectives under tp 2
    assert _names(DENSE, ["layernorm"]) == []
    tp2 = ShardShape(micro_batch=2, seq_length=128, tp=2, sequence_parallel=True, flash_attention=True)
    assert _names(DENSE, ["mlp"], tp2) == ["ln2", "mlp_in.all_gather", "fc1", "swiglu", "fc2",
                                           "mlp_out.reduce_scatter"]
    # MLA: the input norm is a module; the up-projections with their norms
    assert _names(MLA, ["layernorm"]) == ["ln1"]
    assert _names(MLA, ["mla_up_proj"]) == ["q_norm", "kv_norm", "q_up", "kv_up"]
    cp2 = ShardShape(micro_batch=2, seq_length=128, cp=2, flash_attention=True)
    assert _names(DENSE, ["core_attn"], cp2) == ["cp_ring_kv", "flash_attention"]


def test_each_module_drops_its_bytes_counted_by_hand():
    # b = 2, s = 128: 256 tokens; the rank holds all 8 experts (ep 1): routed width top_k x 32 = 64 per token,
    # shared width 32; e = 2 bytes
    block = _block(MOE)
    saved = block.saved_bytes
    routed, shared = TOP_K * EXPERT_FFN, EXPERT_FFN

    def dropped(*modules):
        return saved - block.kept_bytes(modules_mode(modules))

    ln2_out = E_ * TOKENS * H                                   # the router's saved input
    act_out_routed = E_ * TOKENS * routed                       # FC2's input, routed part
    clamped = 2 * E_ * TOKENS * routed                          # the fused GLU's input (the clamped halves)
    fc1_out_shared, act_out_shared = 2 * E_ * TOKENS * shared, E_ * TOKENS * shared
    assert dropped("layernorm") == ln2_out
    assert dropped("moe_act") == act_out_routed + clamped
    assert dropped("shared_experts") == pytest.approx(fc1_out_shared + act_out_shared)
    permuted = E_ * TOKENS * TOP_K * H                          # the routed experts' permuted input (fc1's saved)
    moe_all = 2 * E_ * TOKENS * (routed + shared) + E_ * TOKENS * (routed + shared) + clamped + permuted
    assert dropped("moe") == moe_all
    assert dropped("moe", "moe_act", "shared_experts") == moe_all          # nested modules: counted once
    assert dropped("layernorm", "moe_act") == ln2_out + act_out_routed + clamped
    assert dropped("core_attn") == 0                                        # fused attention keeps no core
    # dense block: mlp drops the norm output (fc1's input), FC1's output (2f wide, gated) and FC2's input
    dense = _block(DENSE)
    assert dense.saved_bytes - dense.kept_bytes(modules_mode(["mlp"])) == \
        E_ * TOKENS * H + 2 * E_ * TOKENS * FFN + E_ * TOKENS * FFN
    # MLA block: layernorm drops ln1's output (the down-projections' input); mla_up_proj the normalised latents
    # (48 + 32 wide) and Q, K, V (4 heads x (2 x 24 + 16))
    mla = _block(MLA)
    assert mla.saved_bytes - mla.kept_bytes(modules_mode(["layernorm"])) == E_ * TOKENS * H
    assert mla.saved_bytes - mla.kept_bytes(modules_mode(["mla_up_proj"])) == \
        E_ * TOKENS * (48 + 32) + E_ * TOKENS * 4 * (2 * 24 + 16)


def test_core_attn_alone_is_the_old_selective_on_a_gqa_block():
    shard = ShardShape(micro_batch=2, seq_length=128)   # materialised core: the bytes selective drops
    block = _block(DENSE, shard)
    mode = modules_mode(["core_attn"])
    assert block.kept_bytes(mode) == block.kept_bytes("selective") < block.saved_bytes
    assert block.recompute_ops(mode) == block.recompute_ops("selective")


def _toy_moe_raw(modules, **par) -> dict:
    raw = toy_raw(1, **par)
    model = MOE.model_dump(exclude_none=True)
    model.update(num_layers=L, make_vocab_size_divisible_by=1)
    raw["model"] = model
    if modules is not None:
        raw["parallelism"].update(recompute="selective", recompute_modules=list(modules))
    return raw


def _toy_dense_raw(modules) -> dict:
    raw = _toy_moe_raw(modules)
    raw["model"].pop("moe")
    return raw


@pytest.mark.parametrize(("make", "modules", "names"), [
    (_toy_moe_raw, ["layernorm", "moe_act"], ["ln2", "expert_act_clamp", "expert_act"]),
    (_toy_moe_raw, ["layernorm"], ["ln2"]),
    (_toy_moe_raw, ["moe_act"], ["expert_act_clamp", "expert_act"]),
    (_toy_moe_raw, ["shared_experts"], ["shared_fc1", "shared_act", "shared_fc2"]),
    (_toy_moe_raw, ["moe"], ["router", "router_topk_permute", "expert_fc1", "expert_act_clamp", "expert_act",
                             "expert_fc2", "expert_fc2_bias", "unpermute_weighted_sum", "shared_fc1", "shared_act",
                             "shared_fc2"]),
    (_toy_moe_raw, ["core_attn"], ["attn_scores", "softmax_dropout", "attn_values"]),
    (_toy_dense_raw, ["mlp"], ["ln2", "fc1", "swiglu", "fc2"]),
])
def test_recompute_time_is_the_rerun_kernels_exactly(make, modules, names):
    # one GPU, one micro-batch: the recompute category is L x the listed modules' kernels of one block, the step
    # is the step without recompute plus that, and the hardware FLOPs add the re-run GEMMs' FLOPs
    sc = load_scenario(make(modules))
    result = simulate(sc)
    compute = ComputeModel(sc.accelerator, "bf16")
    ops = sc.layer_graph().layers[1].recompute_ops(sc.parallelism.recompute_mode)
    assert [op.name for op in ops] == names
    assert result.time_breakdown_s["recompute"] == pytest.approx(L * sum(compute.time_s(op) for op in ops),
                                                                 rel=1e-9)
    none = simulate(load_scenario(make(None)))
    assert result.step_time_s == pytest.approx(none.step_time_s + result.time_breakdown_s["recompute"], rel=1e-9)
    rerun = sum(op.flops for op in ops if op.kind in ("gemm", "attention"))
    assert result.hardware_flops_per_step - none.hardware_flops_per_step == pytest.approx(L * rerun, rel=1e-9)


def test_peak_memory_drops_the_listed_modules_bytes():
    # one micro-batch in flight: the stored activations fall by L x the dropped bytes, and the working set of
    # the backward is one block's dropped bytes
    base = peak_rank_memory(load_scenario(_toy_moe_raw(None)))[1]
    sc = load_scenario(_toy_moe_raw(["moe"]))
    new = peak_rank_memory(sc)[1]
    block = sc.layer_graph().layers[1]
    per_block = block.saved_bytes - block.kept_bytes(sc.parallelism.recompute_mode)
    assert per_block > 0
    assert base.activations_bytes - new.activations_bytes == pytest.approx((L - 1) * per_block, rel=1e-12)


@pytest.mark.parametrize(("model", "modules", "needle"), [
    (None, ["moe_act"], "moe_act: toy-gpt has no mixture-of-experts layer"),
    (None, ["mla_up_proj"], "has no multi-latent attention"),
    (None, ["layernorm"], "fuses both norms"),
    ("moe", ["mlp"], "has no dense MLP layer"),
    ("moe", [], "empty list"),
    ("moe", ["layernorm", "layernorm"], "twice"),
])
def test_modules_the_model_lacks_are_refused(model, modules, needle):
    raw = _toy_moe_raw(modules) if model else toy_raw(1, recompute="selective", recompute_modules=modules)
    with pytest.raises(ConfigError, match="parallelism.recompute_modules") as err:
        load_scenario(raw)
    assert needle in str(err.value)


def test_modules_need_selective():
    raw = _toy_moe_raw(["moe_act"])
    raw["parallelism"]["recompute"] = "full"
    with pytest.raises(ConfigError, match="parallelism.recompute_modules.*selective"):
        load_scenario(raw)


def _cli(tmp_path, raw) -> subprocess.CompletedProcess:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return subprocess.run([sys.executable, "-m", "simulator", "simulate", str(path)], capture_output=True,
                          text=True, cwd=REPO, check=False)


@pytest.mark.parametrize("modules", [["moe_ac"], "layernorm"])
def test_cli_bad_list_exits_2_naming_the_field(tmp_path, modules):
    raw = _toy_moe_raw(None)
    raw["parallelism"].update(recompute="selective", recompute_modules=modules)
    out = _cli(tmp_path, raw)
    assert out.returncode == 2
    assert "parallelism.recompute_modules" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cli_module_the_model_lacks_exits_2(tmp_path):
    out = _cli(tmp_path, toy_raw(1, recompute="selective", recompute_modules=["moe_act"]))
    assert out.returncode == 2
    assert "parallelism.recompute_modules" in out.stderr and "Traceback" not in out.stderr


def test_the_list_is_left_out_of_dumps_when_unset_and_printed_when_set():
    assert "recompute_modules" not in load_scenario(toy_raw(1)).parallelism.model_dump()
    sc = load_scenario(_toy_moe_raw(["moe_act", "layernorm"]))
    assert sc.parallelism.model_dump()["recompute_modules"] == ("moe_act", "layernorm")
    assert sc.parallelism.recompute_mode == "selective:moe_act,layernorm"


def test_search_keeps_the_list_with_selective_and_drops_it_otherwise():
    base = {"recompute": "selective", "recompute_modules": ["layernorm"]}
    assert _modules_for(base, "selective") == {}
    assert _modules_for(base, "none") == _modules_for(base, "full") == {"recompute_modules": None}
    assert _modules_for({"recompute": "none"}, "full") == {}


def test_other_kinds_and_lora_refuse_the_list():
    raw = _toy_moe_raw(["moe_act"])
    raw["strategy"] = {"kind": "swarm"}
    with pytest.raises(ConfigError, match="parallelism.recompute_modules"):
        load_scenario(raw)


def test_nemo_gpt_oss_rows_carry_the_recipe_modules():
    from validation.modern import nemo

    cases = {c.row: c for c in nemo.cases()[0] if c.row in (41, 46, 51, 57, 63)}
    assert len(cases) == 5
    for row, case in cases.items():
        par = case.scenario["parallelism"]
        assert (par["recompute"], par["recompute_modules"]) == ("selective", ["layernorm", "moe_act"])
        assert bool(case.assumed) == (row == 63)   # row 63's batch is not the recipe's
    others = [c for c in nemo.cases()[0] if c.row not in cases]
    assert all("recompute_modules" not in c.scenario["parallelism"] for c in others)
