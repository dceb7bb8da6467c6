"""End-to-end validation on current hardware and frameworks (validation/modern, issue 23 part B).

Each set's held-out half is simulated with the framework constants fitted on its fit half
(validation/profiles/modern-*.yaml) and FAILS past its target (frameworks: median |error| <= 10%
and every row <= 25%; vTrain: median <= 8% single-node, <= 12% multi-node). Targets not met today
are strict xfails that name the figure and the reason (an improvement turns them into failures to
be promoted). Also: every CSV row is a case or a listed reason; the split keeps repeated
configurations in one half; the profiles name fit-half rows only; mappings produce the settings the
frameworks document; the FlashAttention default and its errors.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys

import pandas as pd
import pytest

from simulator.errors import ConfigError
from simulator.scenario import TrainingSpec, load_scenario
from validation.layout_ranking import _catalog_yaml
from validation.modern import case as modern_case
from validation.modern.mapping import MODERN
from validation.modern.profiles import MIN_ATTENTION_FIT_CASES, load_groups, scaled_efficiency, with_constants
from validation.modern.registry import SETS, built, derived_cases, evaluate, report, user_profile

ROWS = {"nemo": 73, "torchtitan": 57, "llmfoundry": 216, "other": 65, "vtrain_single": 1440, "vtrain_multi": 109,
        "cnn_dle": 140, "cnn_lambda": 258}

#: Held-out targets not met today: the measured figure and why (see docs/validation.md).
UNMET: dict[str, str] = {
    "nemo": "FP8 held-out time errors met: median |error| 5.6%, max 16.5% over 26 rows with the four LoRA rows (13-15, "
            "38: +4.0, -1.0, +3.6, +4.0% on packed SQuAD, training.packing; -17.7, -19.5, -9.7, -14.6% priced at full "
            "4,096-token attention; 6.2% / 16.5% over the 22 others) (DeepSeek-V3 row 69, -16.5%; Qwen3-30B-A3B "
            "pp2 ep8 row 52 +36.4 -> -5.9%, row 71 +22.2 -> -1.5%, Qwen3-235B row 72 +18.7 -> -1.5%; "
            "test_nemo_heldout_time_errors_within_target) since the Megatron-Bridge rows' Qwen3 MoE dispatch is DeepEP "
            "and the profile carries a fixed 3.0 ms per MoE layer and micro-batch (fitted on the fit half; "
            "validation/modern/nemo.py). Not met on memory: Nemotron-340B tp8 pp8 vp12 (row 7) is predicted OOM "
            "(85.7 of 78 GiB: 64.6 GiB of Megatron-Core distributed-optimizer states at dp 2, 6 + 12/2 B per "
            "parameter, and 103 one-layer chunks in flight on stage 0; 75.0 with bf16 gradients, which NeMo 2's "
            "performance recipe for the model sets but no source here shows NeMo 24.07's launcher recipe used). "
            "Not met on BF16: see NEMO_BF16",
    "llmfoundry": "held-out median |error| 4.0% over 108 rows (target 10%: met; 4.1% before the FULL_SHARD rows held "
                  "FSDP's fp32 shard alone, training.param_dtype: fp32; 3.6% with FSDP2's copy kernels "
                  "priced before Composer's FSDP1 got its own, zero_buffer_copies: fsdp1, and the profile was refitted; "
                  "4.0% over 110 before MPT-760m's A100 "
                  "80 GB s1024/s512 rows 119/120 were set aside: +25.8/+31.7%, 11/16% below the A100 40 GB table's "
                  "same model and sequences, listed with their reasons), max 35.3% (target 25%): A100 80 GB MPT-30b "
                  "s8192 +35.3% (+32.2% with FSDP2's copies, +32.5% before the ZeRO-3 root gather and FSDP2's full "
                  "copy kernels, +37.1% before its heads of 112 ran the zero-padded 128 kernel; measured 574 tok/s, "
                  "simulated 776; its s2048 twin +2.0%; H100's 8K twin, fit half, +17.9%); next MPT-13b s2048 mbs 2 "
                  "on 8 A100 80 GB +16.8%. Not an attention or GEMM rate: one factor on fused attention and one on "
                  "the other kernels, fitted on MPT-30b's own 512-4K rows, predict the 8K rows 25% (A100 80 GB) and "
                  "20% (H100) fast (30/28% with FSDP2's copies), where the same fit on MPT-13b's 1K-8K rows predicts "
                  "its 16K rows within 0.6% (python -m validation.modern.row_breakdown --trend). The 8K rows are the set's "
                  "fullest (66.1 of 80 GiB simulated, 72.8 while a bf16 shard was counted beside FSDP's fp32 one; the "
                  "30b 512-2K rows 64.1), so a cost of "
                  "running near full memory (allocator retries) would fit them, but the one other FSDP row as full "
                  "(other row 6, NeMo AutoModel Qwen3-30B-A3B on 8 H100s, 76.3 GiB) simulates 18.8% slow, not fast. "
                  "From the measurements alone (row_breakdown --marginal): the time each longer sequence adds per "
                  "attention FLOP is one rate for every head-128 MPT from 4K to 64K (87-119 TFLOP/s A100, 160-186 "
                  "H100) and for MPT-30b from 1K to 2K (92, 161), but 25 (A100) / 76 (H100) from 4K to 8K. The "
                  "benchmark configs that would say what ran are in no llm-foundry release on PyPI (0.2.0-0.22.0)",
}


#: NeMo's BF16 rows (GPT-OSS-120B, 64 H100, tp1 pp4 ep8; sliding window and sinks simulated; all held out, no fit
#: row in their group): the set's figure with the catalog constants, and as a user naming nemo gets it.
NEMO_BF16 = (
    "GPT-OSS-120B BF16, held out, catalog constants (no fit row in nemo|h100-sxm-80g|bf16), with the recipe's "
    "selective recompute of layernorm and moe_act (megatron-bridge 0.6.2 perf_recipes; "
    "parallelism.recompute_modules): rows 41/46/51/57 +28.0/+28.3/+24.6/+24.4%, median 26.3%, max 28.3% (+28.7/+29.0/+25.2/+25.0% before the session-15 audit gathered the experts' weights over their edp group), with the "
    "performance scripts' bf16 gradients (nemo.py BF16_GRADS_FROM; +27.7/+28.0/+24.3/+24.1% with fp32 ones). Row 63 "
    "(mbs 4; the recipe's modules assumed; +13.5%, predicted OOM at 96.0 of 78 GiB usable: "
    "memory_rows.UNEXPLAINED_OOM) is set aside: its GA column (2) disagrees with GBS 512 / (MBS 4 x DP 16) = 8 "
    "(nemo.py batch_contradiction); with it the five rows were median 25.2%, max 29.0% "
    "(+31.5/+31.8/+28.0/+27.8/+16.9% without the recompute; 52.5% / 57.1% before Megatron-Core's clamp and per-"
    "expert bias kernels were priced: workloads/graph.py _expert_bias_and_clamp). As a user naming nemo gets it (its"
    " H100 FP8 entry carried to BF16, derived: gemm_scale 0.9666 and moe_layer_fixed_us 3.0 ms): "
    "+4.9/+5.1/+2.1/+1.9% (row 63 set aside), median 3.5%, max 5.1%: the catalog constants lack the fixed time per MoE layer and "
    "micro-batch that every NeMo MoE row shows (fitted on the FP8 half; the set's rule keeps a group without fit "
    "rows on the catalog). Every layer at full attention instead of the alternating window: +25.7% (row 41, before "
    "the recompute)")
#: The sets also judged as a user gets them: each row with ``training.framework`` naming its framework (the
#: shipped profile, fitted / carried over / assumed as for any run; validation/modern/registry.py user_profile).
USER_SETS = ("nemo", "torchtitan", "llmfoundry", "other", "vtrain_single", "vtrain_multi", "cnn_dle", "cnn_lambda")
#: Held-out targets not met as a user gets them: the figure and why.
UNMET_USER: dict[str, str] = {
    "nemo": "as a user naming nemo gets it: FP8 5.6% / 16.5%, 1 row predicted OOM: the fitted figure (NeMo's one "
            "fitted entry, H100 FP8); BF16 (GPT-OSS-120B, the FP8 entry carried) 3.5% / 5.1% (row 63 set "
            "aside: its batch columns disagree); see UNMET['nemo'] and NEMO_BF16",
    "llmfoundry": "as a user naming llm-foundry gets it: 4.0% / 35.3%: the fitted figure (every row's accelerator and "
                  "precision has its entry); see UNMET['llmfoundry']",
}


@pytest.fixture(scope="module")
def reports():
    return {}


def _report(reports: dict, name: str) -> dict:
    if name not in reports:
        outcomes = evaluate(name, "heldout", workers=2)
        user = user_profile(name, outcomes, workers=2) if name in USER_SETS else None
        reports[name] = report(name, outcomes, None, user)
    return reports[name]


@pytest.mark.parametrize("name", list(SETS))
def test_every_row_is_a_case_or_a_reason(name):
    cases, skipped = built(name)
    derived = derived_cases(name)  # rows on boards derived by rule: their own line (tests/test_derived_parts.py)
    assert len(cases) + len(skipped) + len(derived) == ROWS[name]
    assert len({c.row for c in cases} | {s.row for s in skipped} | {d.row for d in derived}) == ROWS[name]
    assert all(s.reason.strip() for s in skipped)
    assert cases, "every set has simulated rows"


@pytest.mark.parametrize("name", list(SETS))
def test_both_halves_are_populated(name):
    cases, _ = built(name)
    held = sum(c.heldout for c in cases)
    assert 0.3 * len(cases) <= held <= 0.7 * len(cases)


def test_repeated_configurations_fall_in_one_half():
    # NeMo's LLAMA3_70B on 64 GPUs (tp4 pp8 vp5, gbs 256) was measured in four releases: one key, one half
    cases = [c for c in built("nemo")[0] if c.row in (39, 45, 50, 55)]
    assert len({c.key for c in cases}) == 1 and len({c.heldout for c in cases}) == 1


def test_split_is_md5_parity():
    assert modern_case.is_heldout("a") == (int("0cc175b9c0f1b6a831c399e269772661", 16) % 2 == 1)


@pytest.mark.parametrize("profile", sorted({s.profile_name for s in SETS.values()}))
def test_profiles_are_fitted_on_fit_half_rows_only(profile):
    groups = load_groups(profile)
    assert groups, f"validation/profiles/modern-{profile}.yaml is written (python -m validation.modern --fit --write)"
    by_row = {(c.case_set, c.row): c for s in SETS.values() for c in built(s.name)[0]}
    for group, entry in groups.items():
        in_fit_half = [c for (_, _), c in by_row.items() if c.profile_group == group and not c.heldout
                       and not c.set_aside and SETS[c.case_set].fitted and SETS[c.case_set].profile_name == profile]
        one_constant = "gemm_scale" not in entry and (
            "attention_scale" in entry or "sync_jitter" in entry or "input_us_per_sample" in entry
            or "conv_sm_cycles_per_byte" in entry)
        if "gemm_scale" not in entry and "sync_jitter" in entry:  # skew alone: fitted on the multi-GPU rows
            in_fit_half = [c for c in in_fit_half if c.scenario["cluster"]["num_gpus"] > 1]
        # a group fitted on one constant alone (attention factor, skew, input cost or SM cycles per conv byte; no GEMM
        # factor) needs 2 rows, the others 3
        least = MIN_ATTENTION_FIT_CASES if one_constant else 3
        assert entry["fit_cases"] == len(in_fit_half) >= least
        listed = entry["fitted_on"].split("rows (", 1)[1]
        if listed.startswith("all fit-half rows"):
            continue
        rows = re.findall(r"(\w+):(\d+)", listed)
        assert len(rows) == entry["fit_cases"]
        for case_set, row in rows:
            fitted = by_row[(case_set, int(row))]
            assert not fitted.heldout and fitted.profile_group == group


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=UNMET[n]))
                                  if n in UNMET else n for n in SETS])
def test_heldout_error_within_target(reports, name):
    block = _report(reports, name)
    o = block["overall"]
    worst = max((c for c in block["cases"] if c["relative_error"] is not None),
                key=lambda c: abs(c["relative_error"]))
    print(name, o, "worst:", worst["label"], worst["relative_error"])
    assert o["cases"] >= 3
    # every published row ran: a row predicted out of memory is a miss (its time error still counted)
    assert o["predicted_oom"] == 0, [c["label"] + ": " + str(c["reason"]) for c in block["cases"] if not c["fits"]]
    assert o["median_abs_error"] <= block["median_target"]
    if block["max_target"] is not None:
        assert o["max_abs_error"] <= block["max_target"]
    # and on the held-out rows whose simulated scenario no fit row has (validation/modern/new_scenarios.py):
    # a held-out row that re-simulates a fit row's scenario is not evidence
    new = block["new_scenarios"]
    print(name, "new scenarios:", new["cases"], "of", new["heldout"], new["median_abs_error"], new["max_abs_error"])
    assert new["cases"] >= 3 and new["predicted_oom"] == 0
    assert new["median_abs_error"] <= block["median_target"]
    if block["max_target"] is not None:
        assert new["max_abs_error"] <= block["max_target"]
    assert block["met"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=UNMET_USER[n]))
                                  if n in UNMET_USER else n for n in USER_SETS])
def test_heldout_error_as_a_user_naming_the_framework_gets_it(reports, name):
    # no per-row or per-group constants: the row's framework named, its shipped profile's entry for the row's
    # accelerator and precision (or the one carried over, or the catalog where none applies)
    user = _report(reports, name)["user_profile"]
    o = user["overall"]
    print(name, o, [(f["framework"], f["accelerator"], f["precision"], f["state"], f["median_abs_error"])
                    for f in user["by_framework"]])
    assert o["cases"] >= 3 and o["predicted_oom"] == 0
    assert o["median_abs_error"] <= _report(reports, name)["median_target"]
    if _report(reports, name)["max_target"] is not None:
        assert o["max_abs_error"] <= _report(reports, name)["max_target"]
    new = user["new_scenarios"]  # the rows whose scenario no fit row has, judged alike
    assert new["cases"] >= 3 and new["predicted_oom"] == 0
    assert new["median_abs_error"] <= _report(reports, name)["median_target"]
    if _report(reports, name)["max_target"] is not None:
        assert new["max_abs_error"] <= _report(reports, name)["max_target"]
    assert user["met"]


def test_report_splits_precisions_and_accelerators(reports):
    block = _report(reports, "llmfoundry")
    assert {s["label"] for s in block["by_precision"]} == {"bf16", "fp8"}
    assert {s["label"] for s in block["by_accelerator"]} == {"h100-sxm-80g", "a100-sxm-80g", "a100-sxm-40g"}
    total = sum(s["cases"] for s in block["by_precision"])
    assert total == block["overall"]["cases"]


@pytest.mark.parametrize("name", list(SETS))
def test_cached_heldout_errors_are_current(reports, name):
    # the table per accelerator (docs/validation.md) reads validation/modern/heldout_errors.csv (tests/test_accelerator_table.py)
    from validation.modern.by_accelerator import SET_LINE, STALE_HINT, stale_rows

    current = [(c["row"], c["relative_error"], c["fits"]) for c in _report(reports, name)["cases"]]
    assert not stale_rows(name, SET_LINE, current), (STALE_HINT, stale_rows(name, SET_LINE, current)[:5])


# --------------------------------------------------------------------------- mappings


def _case(name: str, row: int):
    return next(c for c in built(name)[0] if c.row == row)


def test_nemo_row_maps_to_megatron_core_settings():
    c = _case("nemo", 4)  # LLAMA2-70B, 64 H100, FP8, GBS 128, MBS 1, s 4096, TP 4 PP 4 VP 20
    par, tr = c.scenario["parallelism"], c.scenario["training"]
    assert c.scenario["model"] == "llama2-70b" and c.scenario["cluster"] == {
        "node": "dgx-h100", "fabric": "fat-tree", "num_gpus": 64}
    assert (par["tp"], par["pp"], par["cp"], par["virtual_stages"], par["schedule"]) == (4, 4, 1, 20, "interleaved")
    assert par["sequence_parallel"] and par["tp_comm_overlap"] and par["zero_stage"] == 1
    assert (par["micro_batch_size"], par["global_batch_size"]) == (1, 128)
    assert tr == {"seq_length": 4096, "precision": "fp8", "attention": "flash", "attention_kernel": "cudnn"}
    assert c.measured_rate_per_gpu == 1728
    load_scenario(c.scenario)  # a valid scenario


def test_nemo_unrepresentable_rows_say_why():
    reasons = {s.row: s.reason for s in built("nemo")[1]}
    assert not {13, 14, 15, 38} & set(reasons)  # LoRA: training.finetune (workloads/lora.py)
    assert "layout not given" in reasons[16]
    assert "Mamba" in reasons[36]
    assert 43 not in reasons  # Qwen3-235B EP 32 over TP 2 x DP 16: a case
    assert not {41, 46, 51, 57, 63} & set(reasons)  # GPT-OSS-120B: sliding window and sinks are simulated


@pytest.mark.parametrize("name, rows", [("nemo", {13, 14, 15, 38}), ("other", {10, 11, 12, 14})])
def test_lora_rows_are_cases_held_out_and_never_fitted(name, rows):
    # made representable after the fit (training.finetune): held out whatever their key's md5, so no fit of the
    # current profiles used them and none will (two NeMo keys are even: 13 and 38)
    lora = [c for c in built(name)[0] if c.scenario["training"].get("finetune")]
    assert {c.row for c in lora} == rows
    assert all(c.heldout and c.added_after_fit for c in lora)
    if name == "nemo":
        assert {c.row for c in lora if not modern_case.is_heldout(c.key)} == {13, 38}
    for c in lora:
        assert "lora" in c.key.lower() and load_scenario(c.scenario).training.finetune.method == "lora"


def test_nemo_bf16_rows_are_gpt_oss_held_out_and_never_fitted():
    # the table's only BF16 rows: GPT-OSS-120B, 64 H100, tp1 pp4 ep8; both configurations' keys have an odd md5
    bf16 = [c for c in built("nemo")[0] if c.precision == "bf16"]
    assert sorted(c.row for c in bf16) == [41, 46, 51, 57, 63]
    assert all(c.heldout and c.scenario["model"] == "gpt-oss-120b" for c in bf16)
    assert all(c.scenario["parallelism"]["moe_dispatch"] == "deepep" for c in bf16)  # bridge 0.3.1 recipe
    assert bf16[0].profile_group == "nemo|h100-sxm-80g|bf16" not in load_groups("nemo")  # no fit row: catalog


def test_nemo_qwen3_rows_use_the_decoupled_head_width():
    c = _case("nemo", 35)  # Qwen3-30B-A3B, 16 H100, FP8, EP 16: 32 heads of 128 on hidden 2048
    assert c.scenario["model"] == "qwen3-30b-a3b"
    model = load_scenario(c.scenario).model
    assert (model.head_dim, model.attention_width, model.hidden_size, model.qk_norm) == (128, 4096, 2048, True)
    assert "tokendrop" in _case("nemo", 71).key


def test_torchtitan_async_tp_and_grand_teton_hbm():
    c = _case("torchtitan", 11)  # Llama 3.1 70B, 256 H100 (96 GB, 500 W), FSDP 32 x TP 8, AsyncTP, float8
    par = c.scenario["parallelism"]
    assert (par["dp"], par["tp"], par["zero_stage"], par["global_batch_size"]) == (32, 8, 3, 512)
    assert par["tp_comm_overlap"] and par["sequence_parallel"] and par["recompute"] == "full"
    assert c.scenario["cluster"]["node"]["overrides"]["accelerator"]["hbm_gib"] == 96
    assert c.profile_group == "torchtitan|h100-96g-500w|fp8"


def test_torchtitan_mi300x_rows_pool_precisions_for_their_attention_factor():
    # no MI300X attention kernel was measured: torchao's bf16 and float8 rows of one configuration pin it
    from validation.modern.torchtitan import MI300X_GROUP

    mi300x = [c for c in built("torchtitan")[0] if c.accelerator == "mi300x"]
    assert {c.precision for c in mi300x} == {"bf16", "fp8"} and {c.profile_group for c in mi300x} == {MI300X_GROUP}
    entry = load_groups("torchtitan")[MI300X_GROUP]
    assert "gemm_scale" not in entry and 0.1 < entry["attention_scale"] < 1.0
    assert entry["fit_cases"] == sum(1 for c in mi300x if not c.heldout) >= 2


def test_torchtitan_405b_rows_are_compiled():
    # "yes (llama3_405b.toml at this commit)": compiled, not eager (the split key is left as drawn)
    assert all("eager" not in _case("torchtitan", row).label for row in (39, 40, 41))
    assert "eager" in _case("torchtitan", 0).label


def test_llmfoundry_row_maps_fsdp_settings():
    c = _case("llmfoundry", 0)  # MPT-70b, 512 H100, FULL_SHARD, checkpointing, amp_bf16 (DEFAULT)
    par, tr = c.scenario["parallelism"], c.scenario["training"]
    assert (par["zero_stage"], par["recompute"], par["dp"], par["micro_batch_size"]) == (3, "full", 512, 8)
    assert tr["grad_dtype"] == "fp32" and tr["attention"] == "flash" and tr["precision"] == "bf16"


def test_llmfoundry_sets_aside_only_mpt_760m_a100_80gb_short_sequences_with_their_twins():
    # rows 119/120 (A100 80 GB, s1024/s512) ran 11/16% below the A100 40 GB table's same model and sequences
    # (rows 192/193): set aside with that reason, listed with their error; both are held-out rows, so no fitted
    # constant moves, and the fit half is the same as before
    cases = built("llmfoundry")[0]
    aside = {c.row: c for c in cases if c.set_aside}
    assert set(aside) == {119, 120}
    assert all(c.heldout for c in aside.values())
    assert "33,422 (row 192" in aside[119].set_aside and "11% slower" in aside[119].set_aside
    assert "34,938 (row 193" in aside[120].set_aside and "16% slower" in aside[120].set_aside
    for row in (118, 192, 193):  # the rows they are judged against stay counted
        assert not _case("llmfoundry", row).set_aside


def test_fsdp_rows_map_the_buffers_and_prefetch_of_their_implementation():
    # Megatron-FSDP (NeMo FSDP column > 0) gathers into and reduces from persistent buffers: no copy kernels;
    # FSDP2 (NeMo AutoModel, torchtitan) copies out and in. Composer (llm-foundry) prefetches the backward's
    # gathers after each layer (BACKWARD_POST); it and fms-fsdp run FSDP1: its own kernels (the shard's cast,
    # the gradients' concatenation and predivide), no copy-out.
    nemo_fsdp = _case("nemo", 60).scenario["parallelism"]
    assert nemo_fsdp["zero_stage"] == 3 and nemo_fsdp["zero_buffer_copies"] is False
    assert "zero_buffer_copies" not in _case("nemo", 4).scenario["parallelism"]
    assert _case("other", 29).scenario["parallelism"]["zero_buffer_copies"] == "fsdp1"
    assert "zero_buffer_copies" not in _case("other", 9).scenario["parallelism"]
    assert _case("llmfoundry", 0).scenario["parallelism"]["zero3_backward_prefetch"] == "post"
    assert {c.scenario["parallelism"]["zero_buffer_copies"] for c in built("llmfoundry")[0]} == {"fsdp1"}


def test_fa2_paper_batch_is_the_largest_that_fits_and_the_8k_baseline_cannot_be_represented():
    # Materialised 8K softmax: one sequence's scores, softmax and dropout mask of every layer need more
    # than 80 GB without checkpointing (which the paper does not state): a reason, not a guessed case.
    reasons = {s.row: s.reason for s in built("other")[1]}
    for row, gib in ((56, 144), (62, 242)):
        assert reasons[row].startswith("materialised softmax at 8192 tokens") and f"{gib} GiB" in reasons[row]
    mbs = {c.row: c.scenario["parallelism"]["micro_batch_size"] for c in built("other")[0] if "fa2" in c.key}
    assert mbs == {53: 4, 55: 8, 58: 2, 59: 2, 61: 8, 64: 2}  # flash: 16,384 tokens; 2K baseline: what fits


def test_deepseek_v3_rows_dispatch_with_deepep():
    # NeMo's DeepSeek-V3 H100 recipe (flex dispatcher) and AutoModel's "TE + DeepEP" rows
    for name, row in (("nemo", 69), ("nemo", 70), ("other", 3), ("other", 4)):
        assert _case(name, row).scenario["parallelism"]["moe_dispatch"] == "deepep"
    assert "moe_dispatch" not in _case("nemo", 4).scenario["parallelism"]


def test_nemo_qwen3_rows_dispatch_as_their_release_s_scripts():
    # NeMo 2.5's scripts (25.09, token-drop): Megatron-Core's alltoall; Megatron-Bridge's (25.11 on): DeepEP
    for row in (35, 42, 43, 47, 48, 52, 53, 59, 65):
        assert _case("nemo", row).scenario["parallelism"]["moe_dispatch"] == "deepep", row
    for row in (71, 72):
        assert "moe_dispatch" not in _case("nemo", row).scenario["parallelism"], row


def test_nemo_profile_fits_a_fixed_time_per_moe_layer():
    entry = load_groups("nemo")["nemo|h100-sxm-80g|fp8"]
    assert 1000.0 <= entry["moe_layer_fixed_us"] <= 4000.0  # the audit's 2.1-3.1 ms per MoE layer pass
    assert entry["fit_mean_abs_log_error"] >= 0  # chosen on the fit half by mean |log error| (registry.NEMO_GRID)


def test_nemo_heldout_time_errors_within_target(reports):
    # the time targets alone (median <= 10%, every row <= 25%): met since the MoE rows dispatch as their scripts
    # say and carry the fixed time per MoE layer; the set as a whole still misses on memory (UNMET["nemo"])
    # on FP8, the precision its fit half holds; the BF16 rows (GPT-OSS-120B, no fit row) are judged apart below
    block = _report(reports, "nemo")
    fp8 = {c["row"] for c in block["cases"] if c["precision"] == "fp8"}
    errors = [abs(c["relative_error"]) for c in block["cases"] if c["relative_error"] is not None and c["row"] in fp8]
    (by_fp8,) = [p for p in block["by_precision"] if p["label"] == "fp8"]
    assert len(errors) == by_fp8["cases"] >= 20
    assert statistics.median(errors) <= block["median_target"]
    assert max(errors) <= block["max_target"]
    new = [abs(c["relative_error"]) for c in block["cases"]  # and on the rows whose scenario no fit row has
           if c["row"] in set(block["new_scenarios"]["rows"]) & fp8 and c["relative_error"] is not None]
    assert len(new) >= 20 and statistics.median(new) <= block["median_target"]
    assert max(new) <= block["max_target"]


@pytest.mark.xfail(strict=True, reason=NEMO_BF16)
def test_nemo_bf16_heldout_time_errors_within_target(reports):
    block = _report(reports, "nemo")
    (bf16,) = [p for p in block["by_precision"] if p["label"] == "bf16"]
    print(bf16, [(c["row"], c["relative_error"]) for c in block["cases"] if c["row"] in (41, 46, 51, 57)])
    assert bf16["cases"] == 4 and bf16["predicted_oom"] == 0
    assert bf16["median_abs_error"] <= block["median_target"] and bf16["max_abs_error"] <= block["max_target"]


def test_automodel_recompute_is_the_least_that_fits():
    # AutoModel's table states no activation checkpointing; a run that ran fitted its 80 GB. DeepSeek-V3 on
    # 1,024 GPUs (row 3) needs 79.9 GiB under selective once the experts' permuted inputs are counted: full.
    recompute = {row: _case("other", row).scenario["parallelism"]["recompute"] for row in (3, 4, 9)}
    assert recompute == {3: "full", 4: "full", 9: "full"}


def test_vtrain_row_maps_megatron_deepspeed():
    c = _case("vtrain_single", 0)  # 2 GPUs, GBS 16, MBS 8, h 1024, 16 heads, 24 layers, s 1024, TP1 DP1 PP2, 372.16 ms
    par = c.scenario["parallelism"]
    assert (par["tp"], par["dp"], par["pp"], par["micro_batch_size"], par["global_batch_size"]) == (1, 1, 2, 8, 16)
    assert c.scenario["model"]["hidden_size"] == 1024 and c.scenario["model"]["num_layers"] == 24
    assert c.measured_rate_per_gpu == pytest.approx(16 * 1024 / 0.372160408 / 2)


def test_vtrain_profile_has_the_eager_floor_and_a_tilted_gemm_curve_capped_below_the_microbenchmark():
    from validation.modern.vtrain import a100_matmul_ceiling

    assert a100_matmul_ceiling() == pytest.approx(271.2 / 312, abs=1e-3)  # ml-engineering MAMF, A100 SXM
    entry = load_groups("vtrain")["megatron-deepspeed|a100-sxm-80g|fp16"]
    assert 10 <= entry["host_dispatch_us_per_kernel"] <= 500
    assert 0.5 * a100_matmul_ceiling() <= entry["gemm_ceiling"] <= a100_matmul_ceiling()  # never above the kernel's best
    eff = scaled_efficiency("a100-sxm-80g", 0.9, None, gemm_tilt=0.1, gemm_ceiling=0.869)
    catalog = {p["gflop"]: p["efficiency"] for p in _catalog_yaml("accelerators", "a100-sxm-80g")["efficiency"]["gemm_curve"]}
    tilted = {p["gflop"]: p["efficiency"] for p in eff["gemm_curve"]}
    assert tilted[10] == pytest.approx(0.9 * catalog[10], abs=1e-5)            # the pivot keeps the scaled level
    assert tilted[1] == pytest.approx(0.9 * catalog[1] * 0.1 ** 0.1, abs=1e-5)  # small GEMMs lower
    assert tilted[1000] == pytest.approx(min(0.869, 0.9 * catalog[1000] * 100 ** 0.1), abs=1e-5)
    assert max(tilted.values()) <= 0.869
    raw = with_constants(_case("vtrain_single", 0), entry)
    assert raw["cluster"]["node"]["accelerator"]["efficiency"]["host_dispatch_us_per_kernel"] == \
        entry["host_dispatch_us_per_kernel"]


def test_vtrain_host_bound_rows_take_the_same_time_per_micro_batch():
    # h 1024, 24 layers, tp 2, pp 1, 4 micro-batches: measured 84.4 / 91.0 / 83.9 ms per micro-batch at 1 / 2 / 4
    # (the host issuing kernels, not the GPU, sets the pace); simulated with the profile, the time per
    # micro-batch stays within 15% across the three, where the GPU's work grows 3.5x from 1 to 4
    from validation.modern.registry import simulate_many

    groups = load_groups("vtrain")
    cases = [c for c in built("vtrain_single")[0] if c.label.startswith("h1024 L24 2 GPUs tp2 dp1 pp1 mbs")
             and c.scenario["parallelism"]["global_batch_size"] == 4 * c.scenario["parallelism"]["micro_batch_size"]]
    assert sorted(c.scenario["parallelism"]["micro_batch_size"] for c in cases) == [1, 2, 4]
    results = simulate_many([with_constants(c, groups[c.profile_group]) for c in cases], workers=1)
    per_micro_batch = [r["step_time_s"] / 4 for r in results]
    assert max(per_micro_batch) / min(per_micro_batch) < 1.15


def test_data_copies_match_shared_row_counts():
    for name, rows in (("nemo_perf_summary.csv", 73), ("torchtitan_perf.csv", 57),
                       ("llmfoundry_throughput.csv", 216), ("other_llm_training_throughput.csv", 65)):
        assert len(pd.read_csv(MODERN / name)) == rows


# --------------------------------------------------------------------------- the flash default


def test_attention_default_is_flash():
    assert TrainingSpec().attention == "flash"
    sc = load_scenario({"model": "gpt-1.7b", "cluster": {"node": "dgx-a100-80g", "num_gpus": 8}})
    assert sc.training.attention == "flash"


def test_default_falls_back_to_standard_without_fused_attention():
    sc = load_scenario({"model": "gpt-1.7b", "cluster": {"node": "dgx2-v100", "num_gpus": 16},
                        "training": {"precision": "fp16"}})
    assert sc.training.attention == "standard"


def test_explicit_flash_without_fused_attention_is_a_config_error():
    with pytest.raises(ConfigError, match="training.attention"):
        load_scenario({"model": "gpt-1.7b", "cluster": {"node": "dgx2-v100", "num_gpus": 16},
                       "training": {"precision": "fp16", "attention": "flash"}})


def test_cli_flash_on_v100_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "simulator", "simulate", "--set", "cluster.node=dgx2-v100",
                           "--set", "cluster.num_gpus=1024", "--set", "training.precision=fp16",
                           "--set", "training.attention=flash"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and "training.attention" in lines[0] and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- the framework's attention factor


def test_attention_scale_scales_the_fused_kernel_or_the_fallback_factor():
    h100 = _catalog_yaml("accelerators", "h100-sxm-80g")["efficiency"]
    eff = scaled_efficiency("h100-sxm-80g", 1.0, None, 0.5)
    assert eff["attention"]["fwd_efficiency"] == pytest.approx(h100["attention"]["fwd_efficiency"] * 0.5, abs=1e-5)
    assert eff["attention"]["bwd_efficiency"] == pytest.approx(h100["attention"]["bwd_efficiency"] * 0.5, abs=1e-5)
    assert "framework profile" in eff["attention"]["source"]
    assert eff["gemm_curve"] == h100["gemm_curve"]  # the GEMMs are left alone
    fa3 = h100["attention_kernels"]["fa3"]  # the other kernels alike
    assert eff["attention_kernels"]["fa3"]["fwd_efficiency"] == pytest.approx(fa3["fwd_efficiency"] * 0.5, abs=1e-5)
    mi300x = scaled_efficiency("mi300x", 1.0, None, 0.5)  # no fused-kernel spec: the fallback factor
    assert mi300x["attention_efficiency_factor"] == pytest.approx(
        _catalog_yaml("accelerators", "mi300x")["efficiency"]["attention_efficiency_factor"] * 0.5)
    assert scaled_efficiency("h100-sxm-80g", 1.0, None, 9.0)["attention"]["fwd_efficiency"] == 1.0  # capped


def test_attention_scale_slows_long_sequences_more_than_short_ones():
    from simulator.simulate import simulate_point

    def rate(row: int, scale: float) -> float:
        raw = with_constants(_case("llmfoundry", row), {"gemm_scale": 1.0, "attention_scale": scale})
        return simulate_point(raw)["tokens_per_s"]

    long_ratio = rate(61, 0.5) / rate(61, 1.0)   # MPT-760m, s 32768: attention most of the step
    short_ratio = rate(69, 0.5) / rate(69, 1.0)  # MPT-760m, s 512
    assert long_ratio < 0.7 and short_ratio > 0.9


def test_long_sequence_profiles_fit_an_attention_factor():
    # llm-foundry's and torchtitan's H100 sequences of 16K-256K tokens run the fused attention well
    # below the FlashAttention-2 paper's kernel (validation/modern/profiles.py); a group whose fit
    # rows are all at one sequence length keeps the catalog kernel
    assert load_groups("llmfoundry")["llmfoundry|h100-sxm-80g|bf16"]["attention_scale"] < 1.0
    titan = load_groups("torchtitan")
    assert titan["torchtitan|h100-96g-500w|fp8"]["attention_scale"] < 1.0
    assert "attention_scale" not in titan["torchtitan|h100-96g-500w|bf16"]  # fit rows all at 8K


def test_attention_factor_is_fitted_only_where_the_fit_rows_span_sequence_lengths():
    from validation.modern.registry import ATTENTION_GRID, VTRAIN_GRID, identifiable_grid

    cases = list(built("llmfoundry")[0])
    one_length = [c for c in cases if c.scenario["training"]["seq_length"] == 2048]
    assert identifiable_grid(ATTENTION_GRID, cases) == ATTENTION_GRID
    assert identifiable_grid(ATTENTION_GRID, one_length) == ({},)
    assert identifiable_grid(VTRAIN_GRID, one_length) == VTRAIN_GRID


def test_long_sequence_rows_imply_the_attention_rate_of_their_framework():
    # with catalog constants, llm-foundry's MPT-760m at 32K tokens (attention most of the step) implies
    # about half the FlashAttention-2-paper kernel; NeMo's Llama 2 7B at 256K (CP 32) nearly all of it
    from validation.modern.attention_share import attention_shares

    mpt = attention_shares([_case("llmfoundry", 61)], {}, workers=1)[0]
    assert mpt.share > 0.6 and 0.4 < mpt.implied < 0.65
    nemo = attention_shares([_case("nemo", 29)], load_groups("nemo"), workers=1)[0]
    assert nemo.share > 0.8 and nemo.implied > 0.85
