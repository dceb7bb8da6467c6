"""Memory model of one rank (simulator/memory/analytic.py) against ZeRO 2020 and Korthikanti 2022."""

from __future__ import annotations

import csv
import math
from fractions import Fraction
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import ConfigError
from simulator.memory.analytic import (
    GIB,
    MemoryBreakdown,
    bytes_per_param,
    fits,
    max_params_for_memory,
    microbatches_in_flight,
    model_state_bytes,
    peak_rank_memory,
    rank_memory,
    stage_layer_indices,
    stage_params,
)
from simulator.scenario import load_scenario
from simulator.strategies.spmd.layout import Parallelism
from validation.closed_form_activations import (
    activation_bytes_per_layer,
    output_layer_activation_bytes,
    pipeline_output_tensor_bytes,
)
from workloads.counting import embedding_params, layer_params, output_head_params, total_params
from workloads.schema import TransformerSpec

DATA = Path(__file__).resolve().parents[1] / "validation" / "data"


def _rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- ZeRO (Rajbhandari 2020)

_STAGE = {"Pos": 1, "Pos+g": 2, "Pos+g+p": 3}
_SIZE = {"B": 1e9, "T": 1e12}


def _count(text: str) -> float:
    """'7.5B' -> 7.5e9, '1T' -> 1e12 (the paper's B and T are decimal)."""
    return float(text[:-1]) * _SIZE[text[-1]]


def _unit_of_last_digit(printed: str) -> float:
    return 10.0 ** -(len(printed.split(".")[1]) if "." in printed else 0)


TABLE1 = _rows("zero2020_table1_model_state_memory_gb.csv")


@pytest.mark.parametrize("row", TABLE1, ids=lambda r: f"{r['model']}-{r['zero_stage']}-Nd{r['dp_degree']}")
def test_zero_table1(row):
    """Every cell of ZeRO Table 1 (K = 12, GB = 1e9) to the table's printed precision: within one
    unit of the last printed digit. The table rounds small values (41.25 -> 41.3, 1.875 -> 1.88) and
    truncates large ones (4011.7 -> 4011, 257.75 -> 257), so half a unit is not always met."""
    psi = _count(row["model"])
    nd = int(row["dp_degree"])
    total_gb = sum(model_state_bytes(psi, _STAGE[row["zero_stage"]], nd, "fp16", "adam")) / 1e9
    printed = row["per_device_model_state_memory_GB"]
    assert abs(total_gb - float(printed)) < _unit_of_last_digit(printed), (total_gb, printed)


def test_zero_table1_bold_cells_fit_32gb():
    """Bold = fits a 32 GB V100; each bold cell's value is below 32 GB by our formula."""
    for row in TABLE1:
        if row["bold_fits_32GB_V100"] == "yes":
            psi, nd = _count(row["model"]), int(row["dp_degree"])
            assert sum(model_state_bytes(psi, _STAGE[row["zero_stage"]], nd)) <= 32e9


def test_zero_fig1_example_and_1p88_vs_1p9_caveat():
    """ZeRO Fig. 1 / text: Ψ = 7.5B, Nd = 64, K = 12: 120, 31.4, 16.6, 1.9 GB. The Pos+g+p value is
    exactly 1.875 GB: Table 1 prints it to 3 digits (1.88), the figure/text to 2 (1.9)."""
    row = next(r for r in _rows("zero2020_formulas_and_text.csv") if r["item"].startswith("Fig.1 example"))
    assert "120 GB" in row["value"] and "31.4 GB" in row["value"] and "16.6 GB" in row["value"] and "1.9 GB" in row["value"]
    gb = [sum(model_state_bytes(7.5e9, z, 64)) / 1e9 for z in (0, 1, 2, 3)]
    assert gb[0] == pytest.approx(120.0)
    assert round(gb[1], 1) == 31.4
    assert round(gb[2], 1) == 16.6
    assert gb[3] == pytest.approx(1.875)
    assert round(gb[3], 2) == 1.88 and round(gb[3], 1) == 1.9


@pytest.mark.parametrize(
    "item, stage, coeff_replicated, coeff_sharded",
    [("Pos per-device", 1, 4, 12), ("Pos+g per-device", 2, 2, 14), ("Pos+g+p per-device", 3, 0, 16)],
)
def test_zero_formulas_rows(item, stage, coeff_replicated, coeff_sharded):
    """The CSV's per-device formulas (4Ψ + KΨ/Nd, 2Ψ + 14Ψ/Nd, 16Ψ/Nd) hold for every Nd."""
    row = next(r for r in _rows("zero2020_formulas_and_text.csv") if r["item"] == item)
    assert row["value"].replace(" ", "") in {"4Psi+K*Psi/Nd", "2Psi+14Psi/Nd", "16Psi/Nd"}
    for nd in (1, 3, 64, 1000):
        assert sum(model_state_bytes(1.0, stage, nd)) == pytest.approx(coeff_replicated + coeff_sharded / nd)


def test_zero_mixed_precision_adam_is_16_bytes():
    assert bytes_per_param("fp16", "adam") == {"weights": 2, "gradients": 2, "optimizer": 12}
    assert bytes_per_param("bf16", "adamw") == {"weights": 2, "gradients": 2, "optimizer": 12}
    assert bytes_per_param("fp8", "adam") == {"weights": 2, "gradients": 2, "optimizer": 12}
    assert bytes_per_param("fp32", "adam") == {"weights": 4, "gradients": 4, "optimizer": 8}
    assert bytes_per_param("bf16", "sgd") == {"weights": 2, "gradients": 2, "optimizer": 8}
    assert bytes_per_param("fp32", "sgd") == {"weights": 4, "gradients": 4, "optimizer": 4}


TABLE2 = _rows("zero2020_table2_max_model_size.csv")
_T2_STAGE = {"baseline": 0, "Pos": 1, "Pos+g": 2, "Pos+g+p": 3}


@pytest.mark.parametrize("row", TABLE2, ids=lambda r: f"mp{r['mp']}")
@pytest.mark.parametrize("stage_name", list(_T2_STAGE))
def test_zero_table2_max_theoretical_model_size(row, stage_name):
    """ZeRO Table 2: largest model whose model states fit 32 GB (1e9) V100s, Nd = gpus/mp = 64.
    The paper computes the mp = 1 value, truncates it to 0.1B (7.64 -> 7.6B, 14.42 -> 14.4B) and
    multiplies by mp (121.6B = 16 x 7.6B); the Pos+g+p column (128B x mp) prints 512B, 1024B,
    2048B as 0.5T, 1T, 2T, so those get a 1-significant-digit tolerance (5%)."""
    mp, gpus = int(row["mp"]), int(row["gpus"])
    nd = gpus // mp
    assert nd == 64
    printed = row[f"max_theoretical_{stage_name}"].split(" ")[0].rstrip("*")
    table = _count(printed)
    per_mp1 = max_params_for_memory(32e9, _T2_STAGE[stage_name], nd, mp=1)
    if printed.endswith("T"):
        assert per_mp1 * mp == pytest.approx(table, rel=0.05)
    else:
        assert math.floor(per_mp1 / 1e8 + 1e-9) / 10 * mp == pytest.approx(table / 1e9)
    assert max_params_for_memory(32e9, _T2_STAGE[stage_name], nd, mp=mp) == pytest.approx(per_mp1 * mp)


@pytest.mark.parametrize("row", TABLE2, ids=lambda r: f"mp{r['mp']}")
def test_zero_table2_measured_below_theoretical(row):
    """Measured max sizes also hold activations and buffers, so they sit below the model-state bound."""
    nd = int(row["gpus"]) // int(row["mp"])
    mp = int(row["mp"])
    for col, stage in (("measured_baseline", 0), ("measured_ZeRO-DP_Pos", 1)):
        measured = _count(row[col].split(" ")[0].rstrip("*"))
        assert measured < max_params_for_memory(32e9, stage, nd, mp=mp)


# --------------------------------------------------------------------------- Korthikanti 2022 per layer

SHAPES = {  # Korthikanti Table 3: (heads, hidden, layers, tp, pp)
    "22B": (64, 6144, 48, 8, 1),
    "175B": (96, 12288, 96, 8, 8),
    "530B": (128, 20480, 105, 8, 35),
    "1T": (160, 25600, 128, 8, 64),
}
S = 2048


def _F(x) -> Fraction:
    return Fraction(x)


KORTHIKANTI = {  # configuration row -> (tp, sp, recompute, formula with Fractions)
    "no parallelism": (False, False, "none", lambda s, b, h, a, t: s * b * h * (34 + _F(5 * a * s) / h)),
    "tensor parallel (baseline)": (True, False, "none",
                                   lambda s, b, h, a, t: s * b * h * (10 + _F(24) / t + _F(5 * a * s) / (h * t))),
    "tensor + sequence parallel": (True, True, "none",
                                   lambda s, b, h, a, t: s * b * h * (_F(34) / t + _F(5 * a * s) / (h * t))),
    "tensor parallel + selective activation recomputation": (True, False, "selective",
                                                             lambda s, b, h, a, t: s * b * h * (10 + _F(24) / t)),
    "tensor parallel + sequence parallel + selective activation recomputation": (
        True, True, "selective", lambda s, b, h, a, t: s * b * h * _F(34) / t),
    "full activation recomputation": (False, False, "full", lambda s, b, h, a, t: s * b * h * 2),
}
FORMULA_TEXT = {
    "no parallelism": "sbh(34 + 5as/h)",
    "tensor parallel (baseline)": "sbh(10 + 24/t + 5as/(ht))",
    "tensor + sequence parallel": "sbh(34/t + 5as/(ht))",
    "tensor parallel + selective activation recomputation": "sbh(10 + 24/t)",
    "tensor parallel + sequence parallel + selective activation recomputation": "sbh(34/t)",
    "full activation recomputation": "sbh(2)",
}
KROWS = {r["configuration"]: r["activation_memory_per_layer_bytes_or_note"] for r in _rows("korthikanti2022_activation_memory_formulas.csv")}


def test_korthikanti_csv_rows_are_the_formulas_we_test():
    for config, text in FORMULA_TEXT.items():
        assert KROWS[config] == text


@pytest.mark.parametrize("config", list(KORTHIKANTI))
@pytest.mark.parametrize("shape", ["22B", "175B", "530B", "1T"])
@pytest.mark.parametrize("b", [1, 4])
def test_korthikanti_per_layer_formulas_exact(config, shape, b):
    use_tp, sp, recompute, formula = KORTHIKANTI[config]
    a, h, _, t, _ = SHAPES[shape]
    t = t if use_tp else 1
    got = activation_bytes_per_layer(S, b, h, a, t, sp, recompute)
    assert got == pytest.approx(float(formula(S, b, h, a, t)), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_full_recompute_with_sequence_parallel_divides_by_t(t):
    assert activation_bytes_per_layer(S, 1, 12288, 96, t, True, "full") == 2 * S * 12288 / t


def test_selective_recompute_savings_quoted_in_text():
    """Korthikanti Sec. 5: 5as/h = 80 for GPT-3 (70% saved) and 64 for MT-NLG (65% saved)."""
    for shape, ratio, saved in (("175B", 80, "70%"), ("530B", 64, "65%")):
        a, h, _, t, _ = SHAPES[shape]
        assert 5 * a * S / h == ratio
        none = activation_bytes_per_layer(S, 1, h, a, t, True, "none")
        sel = activation_bytes_per_layer(S, 1, h, a, t, True, "selective")
        assert f"{round(100 * (1 - sel / none))}%" == saved
        assert saved in KROWS[f"selective recompute saving {'GPT-3' if shape == '175B' else 'MT-NLG'} (5as/h={ratio})"]


@pytest.mark.parametrize("shape", ["175B", "530B", "1T"])
def test_korthikanti_eq5_eq6_first_stage_totals(shape):
    """Eq. 5: first 1F1B stage holds p micro-batches x L/p layers = sbhL/t (34 + 5as/h) (TP+SP);
    Eq. 6 (selective): 34 sbhL/t; interleaved multiplies by (1 + (p-1)/(p m)), m = chunks."""
    a, h, L, t, p = SHAPES[shape]
    assert KROWS["total activations, first pipeline stage (1F1B), TP+SP, no recompute"].startswith("sbhL/t * (34 + 5as/h)")
    assert KROWS["selective recompute total"].startswith("34*sbhL/t")
    layers_per_stage = L // p
    m = 4 * p
    for recompute, expected in (("none", Fraction(S * h * L, t) * (34 + Fraction(5 * a * S, h))),
                                ("selective", 34 * Fraction(S * h * L, t))):
        per_layer = activation_bytes_per_layer(S, 1, h, a, t, True, recompute)
        total = per_layer * layers_per_stage * microbatches_in_flight("1f1b", p, 0, m)
        assert total == pytest.approx(float(expected), rel=1e-12)
        for v in (2, 3):
            inter = per_layer * layers_per_stage * microbatches_in_flight("interleaved", p, 0, m, v)
            assert inter == pytest.approx(float(expected * (1 + Fraction(p - 1, p * v))), rel=1e-12)


def test_korthikanti_output_layer_extra():
    """Korthikanti Sec. 4.3 extra for the output layer with p = 1: 4 sbh/t (1 + v/h) with 4 B logits
    (we use 6 B at the loss by default: 16-bit logits + the fp32 softmax copy)."""
    assert "4/L * (1 + v/h)" in KROWS["extra for embeddings/last LN/output layer"]
    a, h, L, t, _ = SHAPES["22B"]
    V = 51200
    ours4 = output_layer_activation_bytes(S, 1, h, V, t, True, logits_bytes_per_element=4)
    assert ours4 == pytest.approx(4 * S * h / t * (1 + V / h), rel=1e-12)
    assert output_layer_activation_bytes(S, 1, h, V, t, True) - ours4 == pytest.approx(2 * S * V / t)


def test_korthikanti_app_b_output_tensor_deallocation_530b():
    """App. B: 530B first stage (p = 35 micro-batches in flight with 1F1B) saves sbhp = 2.73 GB
    (2 B x s b h p in units of 2^30)."""
    assert KROWS["output-tensor deallocation saving, 530B first stage (App. B)"] == "sbhp = 2.73 GB"
    a, h, L, t, p = SHAPES["530B"]
    in_flight = microbatches_in_flight("1f1b", p, 0, 280)
    assert in_flight == 35
    assert round(pipeline_output_tensor_bytes(S, 1, h, in_flight) / GIB, 2) == 2.73


def test_generalised_shapes_per_tensor():
    s, b, h, a, t = 1024, 2, 4096, 32, 4
    base = activation_bytes_per_layer(s, b, h, a, t, False, "selective")
    # GQA with 8 KV heads: K and V shrink from 2*2*sbh/t to 2*2*sb*d*g/t.
    gqa = activation_bytes_per_layer(s, b, h, a, t, False, "selective", kv_heads=8)
    assert base - gqa == pytest.approx(4 * s * b * (h - 8 * 128) / t)
    # tp > kv heads: each rank keeps one (replicated) KV head.
    mqa = activation_bytes_per_layer(s, b, h, a, 8, False, "selective", kv_heads=2)
    ref = activation_bytes_per_layer(s, b, h, a, 8, False, "selective", kv_heads=8)
    assert mqa == ref
    # gated MLP: 6 sbf/t instead of 4 sbf/t.
    f = 11008
    plain = activation_bytes_per_layer(s, b, h, a, t, False, "selective", ffn=f)
    gated = activation_bytes_per_layer(s, b, h, a, t, False, "selective", ffn=f, gated=True)
    assert gated - plain == pytest.approx(2 * s * b * f / t)
    # no dropout: two 1-byte masks per sbh, and 3 of the 5 bytes per attention score go.
    nod = activation_bytes_per_layer(s, b, h, a, t, False, "none", dropout=False)
    withd = activation_bytes_per_layer(s, b, h, a, t, False, "none")
    assert withd - nod == pytest.approx(2 * s * b * h + 3 * a * s * s * b / t)
    # context parallel divides s (s^2 in the core).
    assert activation_bytes_per_layer(s, b, h, a, t, True, "none", cp=2) == activation_bytes_per_layer(s // 2, b, h, a, t, True, "none")
    # fp32 activations double every non-mask tensor.
    assert activation_bytes_per_layer(s, b, h, a, t, False, "full", element_bytes=4) == 4 * s * b * h


@pytest.mark.parametrize(
    "kwargs",
    [dict(tp=3), dict(cp=3), dict(recompute="sometimes"), dict(tp=1, sequence_parallel=True), dict(kv_heads=5), dict(seq=0)],
)
def test_activation_bad_input_raises_config_error(kwargs):
    args = dict(seq=2048, micro_batch=1, hidden=4096, heads=32, tp=4, sequence_parallel=False, recompute="none")
    args.update(kwargs)
    with pytest.raises(ConfigError):
        activation_bytes_per_layer(**args)


# --------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("p, m", [(1, 1), (4, 8), (8, 64), (4, 2)])
def test_schedules_gpipe_and_1f1b(p, m):
    assert all(microbatches_in_flight("gpipe", p, i, m) == m for i in range(p))
    assert microbatches_in_flight("1f1b", p, 0, m) == min(p, m)
    assert microbatches_in_flight("1f1b", p, p - 1, m) == 1
    assert [microbatches_in_flight("1f1b", p, i, m) for i in range(p)] == [min(p - i, m) for i in range(p)]


def test_interleaved_megatron_warmup():
    # p = 4, v = 2, m = 8: rank 0 warm-up (4-0-1)*2 + (2-1)*4 = 10, +1 = 11 chunk-micro-batches.
    assert microbatches_in_flight("interleaved", 4, 0, 8, 2) == 11 / 2
    assert microbatches_in_flight("interleaved", 4, 0, 8, 2) == 4 + (4 - 1) / 2  # p + (p-1)/v
    assert microbatches_in_flight("interleaved", 4, 3, 8, 2) == (0 + 4 + 1) / 2
    # cap: m = 4, v = 2, p = 4: rank 0 warm-up 10 >= m*v = 8 -> all 8 forwards first -> 8/2 = 4 = m.
    assert microbatches_in_flight("interleaved", 4, 0, 4, 2) == 4


@given(p=st.integers(1, 16), m=st.integers(1, 64), v=st.integers(1, 4), data=st.data())
@settings(max_examples=80, deadline=None)
def test_in_flight_never_more_than_m(p, m, v, data):
    i = data.draw(st.integers(0, p - 1))
    for schedule, vv in (("gpipe", 1), ("1f1b", 1), ("interleaved", v)):
        x = microbatches_in_flight(schedule, p, i, m, vv)
        assert 0 < x <= m
    # GPipe holds every micro-batch; 1F1B at most the stages from here to the last; interleaving at
    # least as many as 1F1B (a longer warm-up)
    assert microbatches_in_flight("gpipe", p, i, m) == m
    assert microbatches_in_flight("1f1b", p, i, m) == min(p - i, m)
    assert microbatches_in_flight("interleaved", p, i, m, v) >= min(p - i, m)


@pytest.mark.parametrize("args", [("1f1b", 4, 4, 8), ("1f1b", 4, -1, 8), ("zigzag", 4, 0, 8), ("1f1b", 4, 0, 0), ("1f1b", 4, 0, 8, 2)])
def test_schedule_bad_input(args):
    with pytest.raises(ConfigError):
        microbatches_in_flight(*args)


# --------------------------------------------------------------------------- parameters per stage

TINY = dict(name="tiny", num_layers=6, hidden_size=64, num_attention_heads=4, vocab_size=1000, seq_length=128,
            make_vocab_size_divisible_by=1)   # the hand counts below take V = 1000 rows (tp 1, 2, 4, 8 divide it)


def _model(**kw) -> TransformerSpec:
    return TransformerSpec(**{**TINY, **kw})


def test_stage_params_single_rank_is_total():
    for kw in ({}, {"tied_embeddings": True}, {"gated_mlp": True, "num_kv_heads": 2, "linear_bias": False, "norm": "rmsnorm",
                                                 "position_embedding": "rope", "ffn_hidden_size": 160}):
        model = _model(**kw)
        assert stage_params(model, Parallelism(dp=1), 0) == total_params(model)


def test_stage_params_pipeline_sum_and_tied_copy():
    untied, tied = _model(), _model(tied_embeddings=True)
    par = Parallelism(pp=3, dp=1)
    assert sum(stage_params(untied, par, i) for i in range(3)) == total_params(untied)
    # tied and pp > 1: the last stage holds a copy of the word embedding (Megatron).
    assert sum(stage_params(tied, par, i) for i in range(3)) == total_params(tied) + 1000 * 64
    lp = layer_params(untied)
    assert stage_params(untied, par, 0) == 2 * lp + embedding_params(untied)
    assert stage_params(untied, par, 2) == 2 * lp + output_head_params(untied)


def test_stage_params_tensor_parallel_split():
    model = _model()
    h, f, V, s = 64, 256, 1000, 128
    t = 2
    # per layer per rank: QKV+O matrices/t, QKV bias/t, O bias, FC1 (+bias)/t, FC2/t, FC2 bias, 2 layernorms
    layer = (4 * h * h + 3 * h) / t + h + (2 * h * f + f) / t + h + 4 * h
    expected0 = 6 * layer + V * h / t + s * h + 2 * h + V * h / t
    assert stage_params(model, Parallelism(tp=t, dp=1), 0) == expected0


def test_interleaved_layer_placement():
    # 8 layers, pp 2, v 2: chunks of 2; rank 0 holds chunks 0 and 2, rank 1 chunks 1 and 3.
    assert stage_layer_indices(8, 2, 2, 0) == [0, 1, 4, 5]
    assert stage_layer_indices(8, 2, 2, 1) == [2, 3, 6, 7]
    with pytest.raises(ConfigError):
        stage_layer_indices(8, 2, 2, 2)


def test_moe_experts_split_by_ep():
    moe = _model(moe={"num_experts": 8, "top_k": 2})
    one = stage_params(moe, Parallelism(dp=4, ep=1), 0)
    four = stage_params(moe, Parallelism(dp=4, ep=4), 0)
    expert = 2 * 64 * 256 + 256 + 64
    assert one - four == 6 * (8 - 2) * expert


# --------------------------------------------------------------------------- scenarios


@cache
def _scenario(num_gpus=64, model="gpt3-175b", training=(), **par):
    raw = {
        "model": dict(model) if isinstance(model, tuple) else model,
        "cluster": {"node": "dgx-a100-80g", "fabric": "fat-tree", "num_gpus": num_gpus},
        "parallelism": par,
        # Korthikanti's activation formulas: the softmax materialised (Megatron-LM 2022)
        "training": dict(training) or {"precision": "bf16", "attention": "standard"},
    }
    return load_scenario(raw)


def _inline(name, a, h, L) -> tuple:
    return tuple(dict(name=name, num_layers=L, hidden_size=h, num_attention_heads=a, vocab_size=51200, seq_length=2048).items())


@pytest.mark.parametrize("row", _rows("korthikanti2022_table3_table5.csv"), ids=lambda r: r["model"])
def test_korthikanti_published_runs_fit_a100_80g(row):
    """Korthikanti Table 3 ran each model with SP + selective recompute on A100 80GB: they must fit."""
    a, h, L = int(row["attention_heads"]), int(row["hidden_size"]), int(row["num_layers"])
    v = int(row["interleave_stages_m"] or 1)
    sc = _scenario(
        int(row["num_gpus"]), _inline(row["model"], a, h, L),
        tp=int(row["tensor_parallel"]), pp=int(row["pipeline_parallel"]), dp=1, sequence_parallel=True,
        recompute="selective", micro_batch_size=int(row["micro_batch_size"]),
        global_batch_size=int(row["global_batch_size"]), virtual_stages=v,
        schedule="interleaved" if v > 1 else ("1f1b"),
    )
    stage, peak, stages = peak_rank_memory(sc)
    ok, reason = fits(sc, peak)
    assert ok, reason
    assert len(stages) == sc.parallelism.pp and peak.total_bytes == max(b.total_bytes for b in stages)


def test_rank_memory_fp32_main_grads_for_bf16_by_default():
    # Megatron-LM keeps fp32 main_grad buffers for bf16 training: 4 B of gradient per parameter.
    sc = _scenario(64, tp=8, pp=8, schedule="1f1b", global_batch_size=64)
    n = stage_params(sc.model, sc.parallelism, 3)
    assert rank_memory(sc, 3).gradients_bytes == 4 * n
    fp16 = _scenario(64, tp=8, pp=8, schedule="1f1b", global_batch_size=64, training=(("precision", "fp16"),))
    assert rank_memory(fp16, 3).gradients_bytes == 2 * n


def test_rank_memory_model_states_175b_no_zero():
    sc = _scenario(64, tp=8, pp=8, schedule="1f1b", global_batch_size=64,
                   training=(("precision", "bf16"), ("grad_dtype", "bf16")))
    for i in (0, 3, 7):
        b = rank_memory(sc, i)
        n = stage_params(sc.model, sc.parallelism, i)
        assert (b.weights_bytes, b.gradients_bytes, b.optimizer_bytes) == (2 * n, 2 * n, 12 * n)
        assert b.stage == i
    # 175B / 64 model-parallel ranks x 16 B ~ 40.7 GiB of model states in the middle stages
    mid = rank_memory(sc, 3)
    assert (mid.weights_bytes + mid.gradients_bytes + mid.optimizer_bytes) / GIB == pytest.approx(16 * 175e9 / 64 / GIB, rel=0.02)


def test_rank_memory_zero_shards_over_dp():
    for zero in (1, 2, 3):
        sc = _scenario(512, tp=8, pp=8, dp=8, zero_stage=zero, global_batch_size=512)
        n = stage_params(sc.model, sc.parallelism, 3)
        b = rank_memory(sc, 3)
        w, g, o = model_state_bytes(n, zero, 8, grad_bytes=4)  # bf16: fp32 main grads
        assert (b.weights_bytes, b.gradients_bytes, b.optimizer_bytes) == pytest.approx((w, g, o))
        assert b.other_bytes >= 2 * 25 * 2**20  # gradient buckets


def test_rank_memory_activations_first_and_last_stage():
    sc = _scenario(64, tp=8, pp=8, schedule="1f1b", global_batch_size=64, sequence_parallel=True, recompute="selective")
    h, a, t = 12288, 96, 8
    per_layer = activation_bytes_per_layer(S, 1, h, a, t, True, "selective")
    core = activation_bytes_per_layer(S, 1, h, a, t, True, "none") - per_layer
    first = rank_memory(sc, 0).activations_bytes
    assert first == pytest.approx(per_layer * 12 * 8 + core + S * h / t * 8)  # + embedding dropout masks
    last = rank_memory(sc, 7).activations_bytes
    assert last == pytest.approx(per_layer * 12 * 1 + core + output_layer_activation_bytes(S, 1, h, 51200, t, True))


def test_fits_reason_string():
    sc = _scenario(8, tp=8, pp=1, global_batch_size=8)  # 175B on one node: cannot fit
    stage, peak, _ = peak_rank_memory(sc)
    ok, reason = fits(sc, peak)
    assert not ok
    assert reason == f"needs {peak.total_bytes / GIB:.1f} GiB of 78.0 GiB usable (HBM 80 GiB - 2 GiB reserve) on stage 0"
    small = MemoryBreakdown(1.0, 1.0, 1.0, 1.0, 1.0)
    assert fits(sc, small) == (True, None)


def test_reserve_not_below_hbm_is_config_error():
    raw = {"model": "gpt3-175b", "cluster": {"node": "dgx-a100-80g", "num_gpus": 64},
           "parallelism": {"tp": 8, "pp": 8, "global_batch_size": 64}, "simulation": {"hbm_reserve_gib": 80}}
    sc = load_scenario(raw)
    with pytest.raises(ConfigError):
        fits(sc, MemoryBreakdown(0, 0, 0, 0, 0))


def test_rank_memory_bad_stage():
    sc = _scenario(64, tp=8, pp=8, schedule="1f1b", global_batch_size=64)
    with pytest.raises(ConfigError):
        rank_memory(sc, 8)


def test_breakdown_gib_and_total():
    b = MemoryBreakdown(GIB, 2 * GIB, 3 * GIB, 4 * GIB, 5 * GIB)
    assert b.total_bytes == 15 * GIB
    assert b.gib() == {"weights": 1.0, "gradients": 2.0, "optimizer": 3.0, "activations": 4.0, "other": 5.0}


# --------------------------------------------------------------------------- properties


@given(psi=st.floats(1e6, 1e13), nd=st.integers(1, 4096), k=st.integers(1, 8),
       precision=st.sampled_from(["fp32", "bf16", "fp16", "fp8"]), optimizer=st.sampled_from(["adam", "sgd"]))
@settings(max_examples=100, deadline=None)
def test_model_states_monotone(psi, nd, k, precision, optimizer):
    totals = [sum(model_state_bytes(psi, z, nd, precision, optimizer)) for z in (0, 1, 2, 3)]
    assert totals[3] <= totals[2] <= totals[1] <= totals[0]
    for z in (1, 2, 3):
        assert sum(model_state_bytes(psi, z, nd * k, precision, optimizer)) <= totals[z]
    assert all(math.isfinite(x) and x >= 0 for x in totals)


@given(s=st.sampled_from([128, 512, 2048, 8192]), b=st.integers(1, 8), heads=st.sampled_from([8, 16, 32, 64]),
       d=st.sampled_from([64, 128]), t=st.sampled_from([1, 2, 4, 8]), sp=st.booleans(), cp=st.sampled_from([1, 2, 4]),
       gated=st.booleans(), g_div=st.sampled_from([1, 2, 4, 8]), dropout=st.booleans())
@settings(max_examples=150, deadline=None)
def test_activation_recompute_order(s, b, heads, d, t, sp, cp, gated, g_div, dropout):
    sp = sp and t > 1
    kv = heads // g_div
    if kv % t and t % kv:
        return
    kw = dict(tp=t, sequence_parallel=sp, kv_heads=kv, gated=gated, cp=cp, dropout=dropout)
    vals = [activation_bytes_per_layer(s, b, heads * d, heads, recompute=r, **kw) for r in ("full", "selective", "none")]
    assert vals[0] <= vals[1] <= vals[2]
    assert all(math.isfinite(x) and x > 0 for x in vals)


@given(zero=st.sampled_from([1, 2, 3]), recompute=st.sampled_from(["none", "selective", "full"]),
       schedule=st.sampled_from(["gpipe", "1f1b"]))
@settings(max_examples=12, deadline=None)
def test_rank_memory_never_grows_with_dp(zero, recompute, schedule):
    model = _inline("m", 16, 2048, 8)
    prev = None
    for dp in (1, 2, 4, 8):
        sc = _scenario(dp * 4, model, tp=2, pp=2, dp=dp, zero_stage=zero, recompute=recompute, schedule=schedule,
                       global_batch_size=64)
        peaks = [rank_memory(sc, i) for i in range(2)]
        for p in peaks:
            assert all(math.isfinite(v) and v >= 0 for v in p.gib().values())
        if prev is not None:
            for before, now in zip(prev, peaks, strict=True):
                assert now.total_bytes <= before.total_bytes
        prev = peaks


@given(recompute=st.sampled_from(["none", "selective", "full"]))
@settings(max_examples=3, deadline=None)
def test_rank_memory_zero_order(recompute):
    model = _inline("m", 16, 2048, 8)
    totals = [rank_memory(_scenario(16, model, tp=2, pp=2, dp=4, zero_stage=z, recompute=recompute,
                                    global_batch_size=64), 0).total_bytes for z in (0, 1, 2, 3)]
    assert totals[3] <= totals[2] <= totals[1] <= totals[0]
