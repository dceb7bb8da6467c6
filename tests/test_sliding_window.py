"""Sliding-window attention and attention sinks (``TransformerSpec.sliding_window_tokens``, ``window_every``,
``attention_sinks``) and the GPT-OSS-120B catalog entry: the window's (query, key) pairs and FlashAttention's
tiles counted by hand, one windowed layer's ops, the alternation, GPT-OSS's parameters by hand (the model
card's 116.83B), and bad input refused naming the field (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from workloads.catalog import resolve_model
from workloads.counting import active_params, total_params
from workloads.graph import FLASH_TILE, ShardShape, layer_work, window_pairs, window_tiles
from workloads.layer_kinds import layer_kind_keys
from workloads.schema import TransformerSpec

ROOT = Path(__file__).resolve().parents[1]


def _tiny(**kw) -> TransformerSpec:
    base = dict(name="t", num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                gated_mlp=True, vocab_size=128, seq_length=512, position_embedding="rope", norm="rmsnorm",
                linear_bias=False, dropout=False, sliding_window_tokens=128, window_every=2)
    return TransformerSpec.model_validate({**base, **kw})


def test_window_pairs_by_hand():
    # s 8, w 3: queries 0, 1, 2 attend 1, 2, 3 keys, the other five 3 each: 1 + 2 + 3 + 5 x 3 = 21
    assert window_pairs(8, 3) == 21
    # s 4096, w 128: 1 + 2 + ... + 128 = 8,256 for the first 128 queries, 128 for each of the 3,968 others
    assert window_pairs(4096, 128) == 8_256 + 3_968 * 128 == 516_160
    # a window as long as the sequence (or longer) is the causal triangle s(s + 1)/2
    assert window_pairs(8, 8) == window_pairs(8, 100) == 36
    assert window_pairs(8, 1) == 8  # each query attends itself only


def test_flash_window_tiles_by_hand():
    # w = T = 128, s = 32 T: query tile 0 visits key tile 0; tile q >= 1 visits q - 1 and q: 1 + 31 x 2 = 63
    assert window_tiles(4096, 128) == (63, 2)
    # s 512, w 256 (T 128): query tile 0 -> {0}, 1 -> {0, 1}, 2 -> rows 256.. need keys from 1 -> {0, 1, 2},
    # 3 -> rows 384.. need keys from 129 -> {1, 2, 3}: 1 + 2 + 3 + 3 = 9, at most 3 key tiles
    assert window_tiles(512, 256) == (9, 3)
    # a window covering the sequence runs the causal kernel's n(n + 1)/2 tiles
    assert window_tiles(512, 4096) == (10, 4)


def test_alternating_layers_and_kind_keys():
    spec = _tiny()
    assert [spec.is_window_layer(i) for i in range(4)] == [True, False, True, False]
    assert layer_kind_keys(spec) == ((False, True), (False, False), (False, True), (False, False))
    assert [_tiny(window_every=1).is_window_layer(i) for i in range(4)] == [True] * 4
    # no window: the plain MoE flag, as before
    assert layer_kind_keys(_tiny(sliding_window_tokens=None, window_every=1)) == (False,) * 4


@pytest.mark.parametrize("b", [1, 2])
def test_windowed_flash_layer_flops_bytes_and_executed_share(b):
    spec = _tiny()
    s, hd, heads, kv, e = 512, 16, 4, 2, 2
    shard = ShardShape(micro_batch=b, seq_length=s, flash_attention=True)
    windowed = next(op for op in layer_work(spec, shard, 0).forward if op.kind == "attention")
    full = next(op for op in layer_work(spec, shard, 1).forward if op.kind == "attention")
    pairs = 512 * 128 - 128 * 127 // 2  # 57,408
    assert windowed.flops == 4 * b * heads * hd * pairs          # Q K^T and P V over the band only
    assert full.flops == 4 * b * heads * hd * s * s              # a full layer: s x s counted, as before
    tiles = 7  # query tile 0: 1 key tile, tiles 1-3: 2 each
    assert window_tiles(s, 128) == (tiles, 2)
    assert windowed.executed_fraction == pytest.approx(tiles * FLASH_TILE ** 2 / pairs)
    assert full.executed_fraction == pytest.approx(0.5 + 0.5 / 4)  # causal tiles of the full layer
    assert (windowed.m, windowed.n, windowed.k, windowed.batch) == (s, 2 * FLASH_TILE, hd, b * heads)
    # q and o (heads x d), k and v (kv heads x d) once each, as the full kernel
    assert windowed.bytes_moved == full.bytes_moved == e * b * (2 * s * heads * hd + 2 * s * kv * hd)
    grad = next(op for op in layer_work(spec, shard, 0).backward if op.kind == "attention")
    assert grad.flops == 2.5 * windowed.flops and grad.executed_fraction == windowed.executed_fraction


def test_windowed_layer_without_a_fused_kernel_computes_the_whole_matrix():
    spec = _tiny()
    s = 512
    ops = {op.name: op for op in layer_work(spec, ShardShape(micro_batch=1, seq_length=s), 0).forward}
    pairs = window_pairs(s, 128)
    for name in ("attn_scores", "attn_values"):
        assert ops[name].flops == 2 * 4 * 16 * pairs                      # counted: the band
        assert ops[name].flops * ops[name].executed_fraction == pytest.approx(2 * 4 * 16 * s * s)  # run: s x s
    assert ops["softmax_dropout"].bytes_moved == 4 * s * s * 3 * 2        # the masked s x s scores


def test_model_flops_count_the_band_on_windowed_layers():
    spec, full = _tiny(), _tiny(sliding_window_tokens=None, window_every=1)
    shard = ShardShape(micro_batch=1, seq_length=512, flash_attention=True)
    saved = 2 * 4 * 16 * 4 * (512 * 512 - window_pairs(512, 128))  # two windowed layers x 4·a·d x pairs saved
    delta = full.layer_graph(shard).step_flops(1, "none").model_flops - spec.layer_graph(shard).step_flops(1, "none").model_flops
    assert delta == pytest.approx(3 * saved)  # model FLOPs: 3 x forward


def test_sinks_are_one_parameter_per_head_and_no_flops():
    with_sinks, without = _tiny(attention_sinks=True), _tiny()
    assert total_params(with_sinks) - total_params(without) == 4 * 4  # 4 layers x 4 heads
    shard = ShardShape(micro_batch=1, seq_length=512, flash_attention=True)
    assert with_sinks.layer_graph(shard).step_flops(1, "none") == without.layer_graph(shard).step_flops(1, "none")
    # held by the core op of the rank: heads / tp
    core = next(op for op in layer_work(with_sinks, ShardShape(micro_batch=1, seq_length=512, tp=2,
                                                                  flash_attention=True), 1).forward
                if op.kind == "attention")
    assert core.params == 2


def test_gpt_oss_120b_parameters_by_hand():
    m = resolve_model("gpt-oss-120b")
    h, q, kv, experts, ffn, vocab = 2880, 64 * 64, 8 * 64, 128, 2880, 201_088
    layer = (h * q + q + 2 * (h * kv + kv) + q * h + h   # q, k, v, o with biases
             + 64                                       # attention sinks, one per head
             + 2 * h                                    # two RMSNorms
             + h * experts + experts                    # router with its bias
             + experts * (h * 2 * ffn + 2 * ffn + ffn * h + h))  # SwiGLU experts with biases
    assert total_params(m) == 36 * layer + 2 * vocab * h + h == 116_829_156_672  # model card: 116.83B
    # active: the model card's 5.13B leaves out the embedding table (a lookup)
    assert round((active_params(m) - vocab * h) / 1e9, 2) == 5.13
    assert [m.is_window_layer(i) for i in range(4)] == [True, False, True, False]
    assert (m.sliding_window_tokens, m.attention_width, m.kv_heads, m.moe.top_k) == (128, 4096, 8, 4)


def test_window_needs_its_size_and_refuses_mla():
    with pytest.raises(ConfigError, match="window_every"):
        resolve_model({**_tiny().model_dump(exclude={"attention_head_dim"}), "sliding_window_tokens": None})
    with pytest.raises(ConfigError, match="sliding_window_tokens"):
        resolve_model({**resolve_model("deepseek-v3").model_dump(exclude={"attention_head_dim"}),
                       "sliding_window_tokens": 128})
    with pytest.raises(ConfigError, match="sliding_window_tokens"):
        resolve_model({**_tiny().model_dump(exclude={"attention_head_dim"}), "sliding_window_tokens": 0})


def _scenario(cp: int) -> dict:
    return {"name": "w", "model": "gpt-oss-120b", "cluster": {"node": "dgx-h100", "num_gpus": 64},
            "parallelism": {"tp": 1, "pp": 4, "cp": cp, "ep": 8, "global_batch_size": 64, "micro_batch_size": 1},
            "training": {"seq_length": 4096, "precision": "bf16", "attention": "flash"}}


def test_window_with_context_parallelism_is_refused():
    load_scenario(_scenario(1))
    with pytest.raises(ConfigError, match="sliding-window") as err:
        load_scenario(_scenario(2))
    assert err.value.field == "parallelism.cp"


def test_bad_window_exits_2_naming_the_field(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: w\nmodel: {name: t, num_layers: 2, hidden_size: 64, num_attention_heads: 4,\n"
                        "  vocab_size: 100, seq_length: 16, sliding_window_tokens: -4}\n"
                        "cluster: {node: dgx-a100-80g, num_gpus: 1}\n"
                        "parallelism: {global_batch_size: 1, micro_batch_size: 1}\n")
    run = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(scenario)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "sliding_window_tokens" in run.stderr and "Traceback" not in run.stderr
