"""Packed sequences (``training.packing``, workloads/packing.py): attention per document, counted by hand on a
toy model; everything but the attention core as unpacked; a whole-sequence document is the unpacked run; bad
input exits 2 naming the field."""

from __future__ import annotations

import pytest
from test_lora import _cli  # simulate the LoRA example (packed, row 38) with --set overrides

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from workloads.graph import ShardShape, layer_work
from workloads.packing import causal_fraction, document_lengths, squared_tokens

# 2 blocks, h 256, 4 heads of 64 (MHA), FFN 1024, V 512, s 1000: documents of 300 -> 300, 300, 300, 100
TOY = {"name": "toy-packed", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "ffn_hidden_size": 1024,
       "vocab_size": 512, "seq_length": 1000, "position_embedding": "rope", "norm": "rmsnorm", "linear_bias": False,
       "dropout": False}
L, HEADS, HD, S, D, B = 2, 4, 64, 1000, 300, 2
SUM_D2 = 3 * 300 ** 2 + 100 ** 2                     # 280,000 (query, key) pairs of the four documents' full squares
# FlashAttention's causal tiles of 128: a 300-token document runs 3·4/2 = 6 of its 9 tiles (1/2 + 1/6 of 300²),
# the 100-token one its one tile whole
EXECUTED = (3 * (0.5 + 1 / 6) * 300 ** 2 + 1.0 * 100 ** 2) / SUM_D2   # 0.678571...


def _scenario(packing: dict | None = None, **training) -> dict:
    raw = {"name": "toy", "model": TOY, "cluster": {"node": "dgx-h100", "num_gpus": 1},
           "parallelism": {"tp": 1, "pp": 1, "dp": 1, "micro_batch_size": B, "global_batch_size": 4 * B},
           "training": {"precision": "bf16", "attention": "flash", **training}}
    if packing is not None:
        raw["training"]["packing"] = packing
    return raw


def _work(document_tokens: int | None, seq: int = S):
    model = load_scenario(_scenario()).model
    return layer_work(model, ShardShape(micro_batch=B, seq_length=seq, flash_attention=True,
                                        document_tokens=document_tokens))


def test_documents_and_their_squares_by_hand():
    assert document_lengths(S, D) == (300, 300, 300, 100)
    assert document_lengths(1200, 300) == (300, 300, 300, 300)
    assert squared_tokens(S, D) == SUM_D2
    assert causal_fraction(S, D) == pytest.approx(EXECUTED, rel=1e-12)
    assert causal_fraction(S, S) == pytest.approx(0.5 + 0.5 / 8)   # one document: the unpacked rule (8 tiles)


def test_attention_core_counted_per_document_by_hand():
    core = next(op for op in _work(D).forward if op.name == "flash_attention")
    # Q·K^T and P·V, 2·d FLOPs per (query, key) pair each, per head and sequence: 4·b·heads·hd·Σd²
    assert core.flops == 4 * B * HEADS * HD * SUM_D2 == 573_440_000
    assert core.executed_fraction == pytest.approx(EXECUTED, rel=1e-12)
    assert (core.m, core.n, core.k, core.batch) == (D, D, HD, B * HEADS * 4)   # priced at a 300-token kernel
    unpacked = next(op for op in _work(None).forward if op.name == "flash_attention")
    assert unpacked.flops == 4 * B * HEADS * HD * S * S
    assert core.bytes_moved == unpacked.bytes_moved   # q, k, v, o of every token once, as unpacked
    backward = next(op for op in _work(D).backward if op.name.startswith("flash_attention"))
    assert backward.flops == pytest.approx(2.5 * core.flops)


def test_every_other_op_is_the_unpacked_one():
    packed, unpacked = _work(D), _work(None)
    for phase in ("forward", "backward"):
        rest = [op for op in getattr(packed, phase) if not op.name.startswith("flash_attention")]
        assert rest == [op for op in getattr(unpacked, phase) if not op.name.startswith("flash_attention")]


def test_one_document_a_sequence_is_the_unpacked_run():
    assert _work(S) == _work(None)
    plain = simulate(load_scenario(_scenario()))
    whole = simulate(load_scenario(_scenario({"document_tokens": S})))
    assert whole.step_time_s == plain.step_time_s and whole.model_flops_per_step == plain.model_flops_per_step


def test_model_flops_drop_by_the_attention_pairs_packing_removes():
    plain = simulate(load_scenario(_scenario()))
    packed = simulate(load_scenario(_scenario({"document_tokens": D})))
    sequences = 4 * B
    # model FLOPs 3 x forward: per layer and sequence 3·4·heads·hd·(s² - Σd²) fewer
    assert plain.model_flops_per_step - packed.model_flops_per_step == pytest.approx(
        sequences * L * 3 * 4 * HEADS * HD * (S * S - SUM_D2), rel=1e-9)
    assert packed.step_time_s < plain.step_time_s


def test_sliding_window_pairs_per_document_by_hand():
    model = load_scenario(_scenario()).model.model_copy(update={"sliding_window_tokens": 128, "window_every": 1})
    core = next(op for op in layer_work(model, ShardShape(micro_batch=1, seq_length=S, flash_attention=True,
                                                          document_tokens=D)).forward
                if op.name == "flash_attention")
    # a 300-token document: 300·128 - 128·127/2 = 30,272 pairs; the 100-token one its causal triangle 5,050
    assert core.flops == 4 * HEADS * HD * (3 * 30_272 + 5_050)


@pytest.mark.parametrize("setting, field", [
    ("training.packing.document_tokens=0", "training.packing.document_tokens"),
    ("training.packing.document_tokens=-5", "training.packing.document_tokens"),
    ("training.packing.document_tokens=5000", "training.packing.document_tokens"),
    ("training.packing.document_tokens=2.5", "training.packing.document_tokens"),
    ("training.packing.documents=4", "training.packing"),
])
def test_bad_packing_input_exits_2_naming_the_field(setting, field):
    run = _cli(setting)
    assert run.returncode == 2, run.stderr
    assert field in run.stderr and "Traceback" not in run.stderr


def test_packing_is_refused_where_it_is_not_priced():
    for raw, why in ((_scenario({"document_tokens": D}, attention="standard"), "attention: flash"),
                     ({**_scenario({"document_tokens": D}), "model": "deepseek-v3"}, "latent attention")):
        with pytest.raises(ConfigError, match=why) as err:
            load_scenario(raw)
        assert err.value.field == "training.packing"
    raw = _scenario({"document_tokens": D})
    raw["cluster"]["num_gpus"] = 2
    raw["parallelism"].update(cp=2)
    with pytest.raises(ConfigError, match="context parallelism") as err:
        load_scenario(raw)
    assert err.value.field == "training.packing"
    raw = {"name": "cnn", "model": "resnet50", "cluster": {"node": "dgx-a100-80g", "num_gpus": 1},
           "parallelism": {"micro_batch_size": 32, "global_batch_size": 32},
           "training": {"packing": {"document_tokens": 8}}}
    with pytest.raises(ConfigError, match="decoder transformers") as err:
        load_scenario(raw)
    assert err.value.field == "training.packing"


def test_nemo_fine_tuning_rows_pack_squad_and_automodel_rows_do_not():
    # NeMo's SFT and LoRA rows fine-tune on SQuAD packed to the sequence (the 24.07 notes; Megatron-Bridge 0.6.2's
    # _sft_common / _peft_common); AutoModel's LoRA rows ran its mock data, one full sequence a sample
    from validation.modern.nemo import SQUAD_DOCUMENT_TOKENS
    from validation.modern.registry import built

    packed = {c.row: c.scenario["training"]["packing"] for c in built("nemo")[0] if "packing" in c.scenario["training"]}
    assert set(packed) == {10, 11, 12, 13, 14, 15, 37, 38}   # SFT 10-12, 37; LoRA 13-15, 38
    assert all(p == {"document_tokens": SQUAD_DOCUMENT_TOKENS} for p in packed.values())
    row38 = next(c for c in built("nemo")[0] if c.row == 38).scenario["training"]["finetune"]
    assert (row38["rank"], row38["target_modules"]) == (16, ["linear_qkv"])   # the 0.6.2 perf recipe
    assert not any("packing" in c.scenario["training"] for c in built("other")[0])
