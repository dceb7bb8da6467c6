"""Framework settings that change what a rank keeps for its backward (issue 23: published runs that
ran were predicted out of memory): FP8 linear inputs kept quantized (Transformer Engine), models
without dropout (no masks), a fused cross entropy (16-bit logits only); and the modern validation
sets counting a predicted OOM as a miss.

Each difference is checked exactly against the tensors the setting changes (counts per token of
one micro-batch on one rank, see workloads/transformer_graph.py block_saved_tensors)."""

from __future__ import annotations

import pytest

from simulator.memory.analytic import GIB, fits, peak_rank_memory
from simulator.scenario import load_scenario
from validation.modern.case import CaseOutcome, ModernCase, summarize
from validation.modern.cnn import dle_cases
from validation.modern.mapping import analytic_peak_fits
from validation.modern.memory_rows import UNEXPLAINED_OOM, main, memory_rows

SEQ, MBS, TP = 4096, 1, 4
LLAMA = {"name": "toy-llama", "num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
         "ffn_hidden_size": 14336, "gated_mlp": True, "vocab_size": 32000, "seq_length": SEQ,
         "position_embedding": "rope", "norm": "rmsnorm", "linear_bias": False}


def _scenario(model=None, **training):
    raw = {"model": dict(model or LLAMA),
           "cluster": {"node": "dgx-h100", "fabric": "fat-tree", "num_gpus": 8},
           "parallelism": {"tp": TP, "pp": 1, "dp": 2, "sequence_parallel": True, "micro_batch_size": MBS,
                           "global_batch_size": 2},
           "training": {"seq_length": SEQ, "precision": "bf16", "attention": "flash", **training}}
    return load_scenario(raw)


def _block_bytes(sc) -> float:
    graph = sc.layer_graph()
    block = graph.pipelined[0]
    return block.kept_bytes("none", graph.input_bytes(block))


def _head_bytes(sc) -> float:
    graph = sc.layer_graph()
    head = graph.layers[-1]
    return head.kept_bytes("none", graph.input_bytes(head))


def test_fp8_linear_inputs_are_kept_in_one_byte():
    """TE LayerNormLinear / LayerNormMLP keep the QKV and FC1 inputs (norm outputs) and the FC2 input in
    FP8; the projection's Linear keeps an FP8 copy beside the attention output FlashAttention keeps."""
    bf16 = _block_bytes(_scenario(precision="fp8", fp8_saved_inputs=False))
    fp8 = _block_bytes(_scenario(precision="fp8"))
    sb, h, f, t = SEQ * MBS, 4096, 14336, TP
    saved = (2 - 1) * sb * h / t * 2 + (2 - 1) * sb * f / t - 1 * sb * h / t  # qkv + fc1, fc2, minus the copy
    assert bf16 - fp8 == pytest.approx(saved)
    assert _block_bytes(_scenario(precision="bf16")) == pytest.approx(bf16)  # the flag is fp8-only


def test_fp8_block_scales_add_their_bytes():
    delayed = _block_bytes(_scenario(precision="fp8"))
    blockwise = _block_bytes(_scenario(precision="fp8", fp8_recipe="blockwise"))
    sb, h, f, t = SEQ * MBS, 4096, 14336, TP
    fp8_elements = sb * h / t * 3 + sb * f / t  # qkv, fc1, the projection's copy, fc2
    assert blockwise - delayed == pytest.approx(fp8_elements * 4 / 128)  # one fp32 scale per 1x128 block


def test_fp8_gemms_left_in_bf16_keep_16_bit_inputs():
    only_mlp = _block_bytes(_scenario(precision="fp8", fp8_gemms=["mlp"]))
    none = _block_bytes(_scenario(precision="fp8", fp8_saved_inputs=False))
    sb, h, f, t = SEQ * MBS, 4096, 14336, TP
    assert none - only_mlp == pytest.approx(sb * h / t + sb * f / t)  # fc1 and fc2 inputs only


def test_a_model_without_dropout_keeps_no_masks():
    with_masks = _scenario()
    without = _scenario({**LLAMA, "dropout": False})
    sb, h, t = SEQ * MBS, 4096, TP
    assert _block_bytes(with_masks) - _block_bytes(without) == pytest.approx(2 * sb * h / t)  # two 1-byte masks
    emb = [sc.layer_graph().layers[0] for sc in (with_masks, without)]
    assert emb[0].kept_bytes("none", 0.0) == pytest.approx(sb * h / t) and emb[1].kept_bytes("none", 0.0) == 0.0


def test_fused_cross_entropy_keeps_the_16_bit_logits_only():
    eager, fused = _head_bytes(_scenario()), _head_bytes(_scenario(fused_cross_entropy=True))
    # the logits over the vocabulary as Megatron pads it: 32000 -> 32256, a multiple of 128 x tp 4
    assert eager - fused == pytest.approx((6 - 2) * SEQ * MBS * 32256 / TP)


def test_nemo_llama3_70b_published_layout_fits_h100():
    """NeMo ran Llama 3 70B on 64 H100s at tp4 pp8 vp5, GBS 256, FP8 (nemo_perf_summary.csv rows 39..67):
    79.3 GiB predicted before FP8 inputs were kept in one byte, 72.7 GiB before the catalog's Llama 3 lost its
    dropout masks (it has none), 69.5 GiB since; it must fit the 78 GiB usable."""
    raw = {"model": "llama3-70b", "cluster": {"node": "dgx-h100", "fabric": "fat-tree", "num_gpus": 64},
           "parallelism": {"tp": 4, "pp": 8, "dp": "auto", "virtual_stages": 5, "schedule": "interleaved",
                           "sequence_parallel": True, "zero_stage": 1, "micro_batch_size": 1, "global_batch_size": 256},
           "training": {"seq_length": 8192, "precision": "fp8", "attention": "flash"}}
    sc = load_scenario(raw)
    _, peak, stages = peak_rank_memory(sc)
    ok, why = fits(sc, peak, stages)
    assert ok, why
    assert 65 < peak.total_bytes / GIB < 74


def _outcome(fits_: bool, error: float) -> CaseOutcome:
    case = ModernCase("toy", 0, "toy", "k", {"cluster": {"num_gpus": 1}}, "bf16", "a", "g", 100.0)
    return CaseOutcome(case, 100.0 * (1 + error), 100.0, fits_, None if fits_ else "needs 90 GiB of 78 GiB")


def test_a_row_predicted_out_of_memory_fails_the_set():
    """Every published row ran: one predicted OOM fails the set however small its time error."""
    good = summarize("s", [_outcome(True, 0.01), _outcome(True, -0.02), _outcome(True, 0.03)])
    assert good.met(0.10, 0.25) and good.predicted_oom == 0
    bad = summarize("s", [_outcome(True, 0.01), _outcome(False, -0.02), _outcome(True, 0.03)])
    assert bad.predicted_oom == 1 and bad.count == 3 and not bad.met(0.10, 0.25)


@pytest.mark.parametrize("name", ["nemo", "torchtitan", "llmfoundry", "other", "cnn_dle", "cnn_lambda"])
def test_published_rows_that_ran_fit_unless_listed(name):
    """Both halves (memory is not fitted): the rows predicted OOM are exactly the listed ones, so a
    fix turns a listed row into a failure to be removed, and a new over-count fails here."""
    oom = {(r.case_set, r.row): round(r.peak_gib, 1) for r in memory_rows(name) if not r.fits}
    assert set(oom) == {key for key in UNEXPLAINED_OOM if key[0] == name}, oom


def test_memory_rows_cli_lists_the_oom_rows(capsys):
    assert main(["--set", "other", "--set", "nemo"]) == 0
    out = capsys.readouterr().out
    assert "nemo: predicted OOM 1 of 25 fit-half rows, 2 of 33 held-out rows" in out  # + GPT-OSS row 63; 33: the LoRA rows
    assert "other: predicted OOM 0 of 15 fit-half rows, 0 of 24 held-out rows" in out  # 24: the LoRA rows
    assert "row    7 held-out OOM    85.7 /  78.0 GiB" in out


def test_an_assumed_batch_that_cannot_fit_is_halved_until_it_does():
    """DLE's EfficientNet rows give no batch (validation/modern/cnn.py ASSUMED_BATCH). B4 and widese-B4 in FP32 on
    the V100 16 GB at the assumed 32 need 19.7 GiB of 14 usable; the rows ran, so at a batch that fits: 16
    (10.0 GiB). Batches that fit stay as assumed; the split key keeps the assumed batch (no row changes half)."""
    cases = {c.row: c for c in dle_cases()[0]}
    for row in (72, 74, 80, 82):
        case = cases[row]
        par = case.scenario["parallelism"]
        assert par["micro_batch_size"] == 16 and par["global_batch_size"] == 16 * par["dp"]
        assert "bs16 (assumed 32, halved to fit)" in case.label and case.key.endswith("|32")
        assert analytic_peak_fits(case.scenario)[0]
        at_32 = {**case.scenario, "parallelism": {**par, "micro_batch_size": 32, "global_batch_size": 32 * par["dp"]}}
        assert not analytic_peak_fits(at_32)[0]
    for row, batch in ((75, 32), (44, 64), (68, 128)):  # B4 AMP on the V100, B4 TF32 on the A100, B0 FP32 on the V100
        assert cases[row].scenario["parallelism"]["micro_batch_size"] == batch and "halved" not in cases[row].label


@pytest.mark.parametrize("row, mapped, bf16_grads, full_recompute", [(7, 85.7, 75.0, 67.1), (12, 91.0, 82.9, 74.4)])
def test_the_listed_nemo_rows_fit_only_with_settings_no_source_here_shows(row, mapped, bf16_grads, full_recompute):
    """UNEXPLAINED_OOM's what-ifs, computed: NeMo 24.07's Nemotron-340B and Llama2-70B SFT rows fit with bf16
    gradients (row 7) or full recompute (both), settings the 24.07 launcher recipes (not in shared/) would have
    to show before the mapping may use them."""
    from validation.modern.profiles import load_groups, resolved_scenario
    from validation.modern.registry import SETS, built

    case = next(c for c in built("nemo")[0] if c.row == row)
    raw = resolved_scenario(case, load_groups(SETS["nemo"].profile_name))

    def peak(training=None, parallelism=None) -> tuple[bool, float]:
        sc = load_scenario({**raw, "training": {**raw["training"], **(training or {})},
                            "parallelism": {**raw["parallelism"], **(parallelism or {})}})
        _, best, stages = peak_rank_memory(sc)
        return fits(sc, best, stages)[0], round(best.total_bytes / GIB, 1)

    assert peak() == (False, mapped)
    assert peak(training={"grad_dtype": "bf16"}) == (row == 7, bf16_grads)
    assert peak(parallelism={"recompute": "full"}) == (True, full_recompute)
    assert str(mapped) in UNEXPLAINED_OOM[("nemo", row)]
