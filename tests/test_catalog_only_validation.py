"""The framework sets' held-out rows with the catalog constants alone (no fitted profile, the framework's
settings kept): what a user gets for a framework x accelerator x precision no profile covers, e.g. an unseen
H100 or Blackwell run (issue 23's audit, item 1). These are NOT targets -- the per-set targets are in
tests/test_modern_validation.py, met with the fitted profiles -- and no catalog constant is fitted on these
rows. The pins below only stop the catalog-only figures from getting much worse unnoticed: each is the
figure measured when the pin was set (2026-12-05, main at f9f94a4) plus 5 points.

Measured (median / max |error|, median signed): nemo 5.8 / 35.6% (+1.7%), torchtitan 34.5 / 79.8% (+34.5%;
H100 +34.6%, MI300X +69%), llmfoundry 18.2 / 76.4% (+18.2%; H100 +21.9%, FP8 +42.7% on 2 rows), other
13.8 / 91.6% (+4.4%; H100 +33.5%): the catalog alone is too optimistic on H100 by about a fifth to a third.
The other sets: vTrain single-node 37.4 / 579.6% (no eager host floor: small models far too fast), multi-node
7.0 / 60.2%, CNN DLE 7.0 / 69.0%, CNN Lambda 78.8 / 160.2% (ResNet-50 on H100 +98%, H200 +111%; 59.8 / 142.1%
since the sixth session's change of its rows, see MEASURED).
"""

from __future__ import annotations

import re

import pytest

from validation.modern.case import outcome, summarize
from validation.modern.profiles import resolved_scenario
from validation.modern.registry import built, simulate_many

#: set -> (median |error|, max |error|) measured with the catalog constants alone, in points
#: (2026-12-05 11:15 UTC: "other" after the memory fixes of 2fc9682; vtrain_multi's max 60.2 -> 73.5 after the
#: cross-node double-binary tree of d5a49d9, its fitted profile unchanged at 6.4 / 64.1; "other"'s max 56.1 -> 62.2
#: after the ring's network latency was charged only on the steps that cross nodes, as NCCL's tuner does: fms-fsdp
#: 7B on 96 H100 with 2 NICs per node, ZeRO-3 gathers over 12 nodes, +56.1 -> +62.2% with the catalog alone,
#: +5.5 -> +5.7% with its fitted profile)
MEASURED = {"nemo": (7.0, 35.6), "torchtitan": (34.5, 79.8), "llmfoundry": (18.2, 76.4), "other": (9.0, 62.2),
            "vtrain_single": (37.4, 579.6), "vtrain_multi": (7.0, 73.5), "cnn_dle": (7.0, 69.0),
            "cnn_lambda": (59.8, 142.1)}
# cnn_lambda 78.8 -> 24.5: Hopper TF32 convolutions on the A100's shape model; 24.5 -> 59.8 (max 160.2 -> 142.1) is a
# change of population, not of model (d8e0dae, sixth session): the held-out rows are bimodal with the catalog alone
# -- 36 fp16 rows median 98.2% (no input cost in the catalog), 35 TF32/FP32 rows median 14.8%, max 24.1% -- and
# counting the V100 fp16 rows while the six GH200 rows left (they had been mapped to H200 SXM) put the median
# inside the fp16 group. The fitted set is 0.9% / 11.2% over the same 71 rows.
# nemo 5.8 / 35.6 -> 6.4 / 57.1: a change of population, not of model (session 9, gptoss): NeMo's five GPT-OSS-120B
# BF16 rows became cases (sliding window and sinks simulated), +38.5..+57.1% with the catalog alone; its 22 FP8 rows'
# catalog-only errors are byte-identical. Session 10: 7.0 / 57.1 with the four LoRA rows held out (bedb175), -> 7.0 / 35.6
# (gptoss): Megatron-Core's expert clamp and per-expert bias kernels priced (workloads/graph.py
# _expert_bias_and_clamp): the GPT-OSS rows +16.9..+31.8%, the max an FP8 row's again. Session 11 (recompute23): the
# GPT-OSS rows take their recipe's recompute_modules [layernorm, moe_act]: +13.3..+28.0%; 7.0 / 35.6 unchanged.
SLACK_POINTS = 5.0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MEASURED))
def test_catalog_only_heldout_error_does_not_get_much_worse(name):
    cases = [c for c in built(name)[0] if c.heldout and not c.set_aside]
    results = simulate_many([resolved_scenario(c, {}) for c in cases], workers=2)
    outcomes = [outcome(c, r) for c, r in zip(cases, results, strict=True)]
    summary = summarize(name, outcomes)
    median, worst = MEASURED[name]
    print(name, "catalog only:", summary.as_dict())
    assert summary.count == len(cases) >= 15  # every case simulated
    assert 100 * summary.median_abs_error <= median + SLACK_POINTS
    assert 100 * summary.max_abs_error <= worst + SLACK_POINTS
    # what a run naming no training.framework is told (simulator/cost/default_framework.py) is these rows: shipped
    # in hardware_specs/frameworks/default_heldout.csv, current with this run
    from validation.modern.default_framework import STALE_HINT, stale_lines

    current = [(o.case.row, o.relative_error, o.fits) for o in outcomes]
    assert not stale_lines(name, current), (STALE_HINT, stale_lines(name, current)[:5])


def test_the_report_carries_the_catalog_only_figures_beside_the_fitted_ones(monkeypatch):
    # registry.catalog_only re-simulates only the cases a fitted group covers, with the profile emptied
    from validation.modern import registry

    groups = registry.load_groups("torchtitan")
    heldout = [c for c in built("torchtitan")[0] if c.heldout]
    cases = [c for c in heldout if c.profile_group in groups][:2] + [c for c in heldout if c.profile_group not in groups][:1]
    assert len(cases) == 3
    fitted = [outcome(c, {"tokens_per_s": 1.0, "fits": True}) for c in cases]
    calls = []

    def fake_many(raws, workers=2):
        calls.append(raws)
        return [{"error": "not simulated in this test"} for _ in raws]

    monkeypatch.setattr(registry, "simulate_many", fake_many)
    catalog = registry.catalog_only("torchtitan", fitted, workers=1)
    covered = cases[:2]
    assert len(calls) == 1 and len(calls[0]) == 2
    assert [resolved_scenario(c, {}) for c in covered] == calls[0]
    block = registry.report("torchtitan", fitted, catalog)
    assert block["catalog_only"]["resimulated"] == 2
    assert catalog[2] is fitted[2]  # a case no profile covers is already catalog-only: kept
    assert "overall" in block["catalog_only"] and "by_accelerator" in block["catalog_only"]


@pytest.mark.slow
@pytest.mark.parametrize("command", [["-m", "validation.modern", "--set", "other"],
                                     ["-m", "simulator", "validate", "--case-set", "other"]])
def test_the_validation_commands_print_both_figures(command):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, *command, "--workers", "2"], capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr[-2000:]  # 1: a set misses its target (other: the median)
    text = out.stdout
    fitted = text.index("  all         other")
    catalog = text.index("  catalog constants only (no fitted profile")
    assert fitted < catalog and "not a target" in text[catalog:]
    assert re.search(r"\n    all +other +n=\d+ +median \|error\|", text[catalog:])
