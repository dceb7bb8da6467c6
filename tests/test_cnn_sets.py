"""The CNN throughput sets (validation/modern/cnn.py, issue 19): which rows are set aside and why, and
that a set-aside row is listed with its error but neither counted nor fitted on."""

from __future__ import annotations

from validation.modern import registry
from validation.modern.case import CaseOutcome
from validation.modern.cnn import LAMBDA_AMP_ASIDE, dle_cases, lambda_cases


def test_only_lambdas_amp_rows_on_a100_sxm_and_v100_16gb_are_set_aside():
    cases, _ = lambda_cases()
    aside = [c for c in cases if c.set_aside]
    assert aside and all(c.set_aside == LAMBDA_AMP_ASIDE for c in aside)
    assert {c.accelerator for c in aside} == {"a100-sxm-80g", "v100-sxm2-16g"}
    assert all(c.precision == "fp16" for c in aside)
    # the same GPUs' fp32/TF32 rows, and every H100/H200 row, are counted
    assert all(not c.set_aside for c in cases if c.precision != "fp16" or c.accelerator.startswith("h"))
    assert not any(c.set_aside for c in dle_cases()[0])


def test_a_set_aside_row_is_listed_with_its_error_and_not_counted():
    cases, _ = lambda_cases()
    counted = next(c for c in cases if not c.set_aside)
    aside = next(c for c in cases if c.set_aside)
    outcomes = [CaseOutcome(counted, 110.0, 100.0, True), CaseOutcome(aside, 300.0, 100.0, True)]
    block = registry.report("cnn_lambda", outcomes)
    assert block["overall"]["cases"] == 1
    assert abs(block["overall"]["max_abs_error"] - 0.1) < 1e-9
    assert [a["row"] for a in block["set_aside"]] == [aside.row]
    assert abs(block["set_aside"][0]["relative_error"] - 2.0) < 1e-9 and block["set_aside"][0]["why"] == LAMBDA_AMP_ASIDE
