"""validation/memory_classifier_ceiling.py counts like the ranking target it reasons about.

The analysis itself needs scikit-learn, which is not a dependency. These checks do not need it.
They check two things. First, with the profile's verdict, its Spearman equals
``layout_ranking.ranking_report``'s; with the measured labels (the oracle), it equals the report's
ranking by simulated rate alone. Second, its margin feature says OOM exactly when the
profile's memory check does."""

from __future__ import annotations

import pytest

from validation import layout_ranking as lr
from validation import memory_classifier_ceiling as ceiling


@pytest.fixture(scope="module")
def heldout_subset():
    cases, profile = lr.calibrated("hagemann")
    held = lr.heldout(cases)
    runs = [c for c in held if not c.measured_oom]
    by_group: dict = {}
    for c in runs:
        by_group.setdefault(c.group, []).append(c)
    chosen = [c for members in by_group.values() if len(members) >= lr.MIN_GROUP for c in members[:7]]
    return held, chosen, profile.memory_overhead


def test_the_profile_verdict_and_the_oracle_give_the_reports_two_figures(heldout_subset):
    _, runs, overhead = heldout_subset
    report = lr.ranking_report(runs, workers=2, overhead=overhead)
    table = report["table"]
    rate_if_run = {str(k): v or 0.0 for k, v in zip(table["case_id"], table["predicted_tokens_per_s_per_gpu_if_run"],
                                                      strict=True)}
    feats = ceiling.features(runs, overhead)
    profile_verdict = {c.case_id: feats[c.case_id]["margin_gib"] > 0 for c in runs}
    assert any(profile_verdict.values())  # the subset holds measured runs the profile calls OOM
    assert ceiling.mean_spearman(runs, rate_if_run, profile_verdict) == pytest.approx(report["mean_spearman"])
    oracle = {c.case_id: False for c in runs}  # every run here ran
    assert ceiling.mean_spearman(runs, rate_if_run, oracle) == pytest.approx(report["mean_spearman_if_run"])


def test_the_margin_says_oom_exactly_when_the_profile_does(heldout_subset):
    held, _, overhead = heldout_subset
    feats = ceiling.features(held, overhead)
    for case in held:
        if case.case_id in feats:
            assert (feats[case.case_id]["margin_gib"] > 0) == (not lr.predict_memory(case, overhead)["fits"])
