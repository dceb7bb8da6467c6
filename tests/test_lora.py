"""LoRA fine-tuning (``training.finetune``, workloads/lora.py): a frozen base with low-rank adapters.

Every figure of a tiny model is counted here by hand: parameters (held, frozen, trained), model FLOPs (3 x the
forward less the frozen GEMMs' weight gradients), the backward's kernels (dgrad only for a frozen GEMM), the
saved activations (a frozen GEMM's input dropped unless an adapter reads it; x·A kept per adapter), the model
state per GPU (frozen weights in 16 bits only; the adapters' gradients and optimizer state) and the gradient
bytes data parallelism reduces (the adapters' alone). Bad input exits 2 naming the field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simulator.errors import ConfigError
from simulator.memory.analytic import rank_memory
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.plan import Planner
from workloads.graph import ShardShape
from workloads.lora import LoraShape
from workloads.transformer_graph import block_saved_tensors

# 2 blocks, h 64, 4 heads of 16 (MHA), FFN 256 (plain GeLU MLP), V 128 (a multiple of 128: no padding), s 32
TINY = {"name": "tiny-lora", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
        "vocab_size": 128, "seq_length": 32, "position_embedding": "rope", "norm": "rmsnorm", "linear_bias": False,
        "dropout": False}
H, F, V, S, L, R = 64, 256, 128, 32, 2, 4
ALL = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]

# by hand: a block's GEMM weights (QKV h x 3h, out h x h, FC1 h x f, FC2 f x h) and norms (RMSNorm: gamma only)
BLOCK_GEMM = H * 3 * H + H * H + H * F + F * H          # 49,152
BLOCK = BLOCK_GEMM + 2 * H                              # 49,280
EMBEDDING, HEAD = V * H, H + H * V                      # 8,192; 8,256 (final norm + LM head, untied)
BASE = L * BLOCK + EMBEDDING + HEAD                     # 115,008
# an adapter on W (k x n) holds A (k x r) and B (r x n): r (k + n)
ADAPTERS = L * R * ((H + 3 * H) + (H + H) + (H + F) + (F + H))   # 2 x 4,096 = 8,192


def _scenario(finetune: dict | None = None, gpus: int = 1, **training) -> dict:
    raw = {"name": "tiny", "model": TINY, "cluster": {"node": "dgx-h100", "num_gpus": gpus},
           "parallelism": {"tp": 1, "pp": 1, "dp": gpus, "micro_batch_size": 1, "global_batch_size": gpus,
                           "zero_stage": 0},
           "training": {"precision": "bf16", "optimizer": "adam", "attention": "flash", **training}}
    if finetune is not None:
        raw["training"]["finetune"] = finetune
    return raw


def _graph(targets=frozenset({"qkv", "attn_out", "fc1", "fc2"}), lora=True):
    model = load_scenario(_scenario()).model
    shard = ShardShape(micro_batch=1, seq_length=S, flash_attention=True,
                       lora=LoraShape(R, frozenset(targets)) if lora else None)
    return model, shard, model.layer_graph(shard)


def test_parameters_held_frozen_and_trained_by_hand():
    _, _, full = _graph(lora=False)
    assert full.total_params() == BASE and full.trained_params() == BASE
    _, _, graph = _graph()
    assert graph.total_params() == BASE + ADAPTERS
    assert graph.trained_params() == ADAPTERS
    assert sum(layer.frozen_params for layer in graph.layers) == BASE
    assert graph.layers[0].trained_params == 0 and graph.layers[-1].trained_params == 0  # embedding, head frozen


def test_model_flops_drop_the_frozen_weight_gradients_by_hand():
    t = S  # tokens of one sequence
    block_gemm = 2 * t * BLOCK_GEMM                    # forward FLOPs of a block's four GEMMs
    attention = 2 * (2 * S * S * (H // 4) * 4)         # fused core, counted at full s x s: QK^T and PV
    adapters = 2 * t * (ADAPTERS // L)                 # forward FLOPs of a block's eight adapter GEMMs
    head = 2 * t * H * V
    _, _, full = _graph(lora=False)
    assert full.step_flops(1, "none").model_flops == 3 * (L * (block_gemm + attention) + head)          # 22,020,096
    _, _, graph = _graph()
    forward = L * (block_gemm + attention + adapters) + head
    assert graph.step_flops(1, "none").model_flops == 3 * forward - (L * block_gemm + head)           # 16,777,216
    assert 3 * forward - (L * block_gemm + head) == 16_777_216


def test_a_frozen_gemm_runs_its_input_gradient_alone_and_each_adapter_both():
    _, _, graph = _graph()
    names = [op.name for op in graph.layers[1].backward]
    for base in ("qkv", "attn_out", "fc1", "fc2"):
        assert f"{base}.dgrad" in names and f"{base}.wgrad" not in names
        for part in ("lora_a", "lora_b"):
            assert f"{part}.{base}.dgrad" in names and f"{part}.{base}.wgrad" in names
    assert sum(name.endswith(".wgrad") for name in names) == 8
    assert graph.layers[0].backward == ()                    # a frozen embedding: nothing reaches its table
    assert "lm_head.wgrad" not in [op.name for op in graph.layers[-1].backward]


def test_saved_activations_drop_what_only_a_frozen_weight_gradient_reads():
    model, shard, _ = _graph(lora=False)
    e = 2  # bf16
    full = sum(x.nbytes for x in block_saved_tensors(model, shard, False, False))
    every = shard.__class__(**{**shard.__dict__, "lora": LoraShape(R, frozenset({"qkv", "attn_out", "fc1", "fc2"}))})
    qkv_only = shard.__class__(**{**shard.__dict__, "lora": LoraShape(R, frozenset({"qkv"}))})
    # every linear adapted: every input is still read (by an adapter's weight gradient); x·A kept per adapter
    assert sum(x.nbytes for x in block_saved_tensors(model, every, False, False)) == full + 4 * e * S * R
    # QKV alone: FC1's input (e·s·h) and FC2's input (e·s·f) are read by no weight gradient
    assert sum(x.nbytes for x in block_saved_tensors(model, qkv_only, False, False)) == \
        full - e * S * H - e * S * F + e * S * R
    # the head: the frozen LM head's input is not kept, the final norm's is
    _, _, plain = _graph(lora=False)
    _, _, graph = _graph()
    assert plain.layers[-1].saved_bytes - graph.layers[-1].saved_bytes == e * S * H


@pytest.mark.parametrize("param_dtype, trained_weight, adam", [("auto", 2, 12), ("fp32", 4, 8)])
def test_model_state_frozen_in_16_bits_adapters_trained_by_hand(param_dtype, trained_weight, adam):
    scenario = load_scenario(_scenario({"method": "lora", "rank": R}, param_dtype=param_dtype))
    result = simulate(scenario)
    m = rank_memory(scenario, 0)
    assert m.weights_bytes == BASE * 2 + ADAPTERS * trained_weight   # frozen: 16 bits, no fp32 master copy
    assert m.gradients_bytes == ADAPTERS * 4                         # fp32 gradients (grad_dtype auto), adapters only
    assert m.optimizer_bytes == ADAPTERS * adam
    assert result.num_parameters == BASE and result.num_trained_parameters == ADAPTERS
    plain = load_scenario(_scenario(param_dtype=param_dtype))
    full = simulate(plain)
    assert full.num_trained_parameters is None and rank_memory(plain, 0).gradients_bytes == BASE * 4


def test_a_large_models_step_loses_its_weight_gradients():
    # Llama 3 8B, one sequence of 4,096 on one H100: the frozen base's wgrad GEMMs (a third of its GEMM time)
    # go, the adapters' small GEMMs come; on the tiny model above the adapters' launches cost more than that
    raw = _scenario()
    raw["model"], raw["training"]["seq_length"] = "llama3-8b", 4096
    full = simulate(load_scenario(raw))
    raw["training"]["finetune"] = {"method": "lora", "rank": 16}
    lora = simulate(load_scenario(raw))
    assert 0.6 < lora.step_time_s / full.step_time_s < 0.9


def test_data_parallelism_reduces_the_adapters_gradients_alone_and_zero3_gathers_everything():
    lora = Planner(load_scenario(_scenario({"method": "lora", "rank": R}, gpus=2)))
    assert lora.stage_params_local(0) == ADAPTERS                    # gradient bytes = this x gradient bytes
    assert lora.layer_params_local() == ADAPTERS // L
    assert lora.layer_params_held() == BLOCK + ADAPTERS // L         # what a ZeRO-3 gather moves
    full = Planner(load_scenario(_scenario(gpus=2)))
    assert full.stage_params_local(0) == BASE and full.layer_params_held() == full.layer_params_local() == BLOCK


def test_target_modules_choose_the_adapted_gemms():
    result = simulate(load_scenario(_scenario({"method": "lora", "rank": R, "target_modules": ["linear_qkv"]})))
    assert result.num_trained_parameters == L * R * (H + 3 * H)


def _cli(*sets: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "simulator", "simulate", "examples/llama3-70b-lora-nemo-8xh100.yaml"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True)


@pytest.mark.parametrize("setting, field", [
    ("training.finetune.rank=0", "training.finetune.rank"),
    ("training.finetune.rank=-4", "training.finetune.rank"),
    ("training.finetune.target_modules=[linear_qkv, linear_foo]", "training.finetune.target_modules"),
    ("training.finetune.target_modules=[]", "training.finetune.target_modules"),
    ("training.finetune.method=qlora", "training.finetune.method"),
])
def test_bad_finetune_input_exits_2_naming_the_field(setting, field):
    run = _cli(setting)
    assert run.returncode == 2, run.stderr
    assert field in run.stderr and "Traceback" not in run.stderr


def test_lora_is_refused_where_it_is_not_priced():
    lora = {"method": "lora", "rank": 8}
    for model, why in (("mixtral-8x7b", "routed experts"), ("deepseek-v3", "latent attention")):
        raw = _scenario(lora)
        raw["model"] = model
        raw["cluster"]["num_gpus"] = 8
        raw["parallelism"].update(dp=8, global_batch_size=8)
        with pytest.raises(ConfigError, match=why) as err:
            load_scenario(raw)
        assert err.value.field == "training.finetune"
    raw = _scenario(lora, gpus=2)
    raw["strategy"] = {"kind": "local_sgd", "local_steps": 4}
    with pytest.raises(ConfigError, match="spmd kind only") as err:
        load_scenario(raw)
    assert err.value.field == "training.finetune"


@pytest.mark.parametrize("layout", [
    dict(tp=2, pp=2, dp=2, zero_stage=1, virtual_stages=1, sequence_parallel=True),
    dict(tp=1, pp=1, dp=8, zero_stage=3),
    dict(tp=2, pp=4, dp=1, zero_stage=1, virtual_stages=2, schedule="interleaved", tp_comm_overlap=True,
         sequence_parallel=True),
])
def test_fast_path_and_vectorised_memory_agree_with_the_engine_and_analytic_under_lora(layout):
    # the search's two shortcuts (simulator/strategies/spmd/fast.py, simulator/memory/vectorised.py) read the
    # same graph: exact where nothing contends (issue 24's 3% elsewhere); memory equal stage by stage
    from simulator.engine.engine import Engine
    from simulator.memory.vectorised import stage_memories
    from simulator.strategies.spmd.fast import fast_step

    raw = {"name": "lora-1b", "model": "llama-1b", "cluster": {"node": "dgx-h100", "num_gpus": 8},
           "parallelism": {"micro_batch_size": 1, "global_batch_size": 16, **layout},
           "training": {"seq_length": 2048, "precision": "bf16", "finetune": {"method": "lora", "rank": 16}}}
    scenario = load_scenario(raw)
    estimate = fast_step(scenario)
    plan = Planner(scenario).build()
    reference = Engine(plan.topology.port_capacity).run(plan.streams)
    assert abs(estimate.step_time_s / reference - 1) <= (1e-9 if estimate.exact else 0.03)
    fast = stage_memories(scenario)
    for stage in range(scenario.parallelism.pp):
        exact = rank_memory(scenario, stage)
        for part in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"):
            assert getattr(fast[stage], part) == pytest.approx(getattr(exact, part), rel=1e-12), part
