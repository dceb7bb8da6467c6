"""The search's memory check is the strategy kind's own model (simulator/explore/checks.py
``layout_memory``), not the spmd count: over the DiLoCo example's space (strategy kind local_sgd, whose
outer anchor and momentum the spmd count leaves out, and which refuses ZeRO) every row the search passes
as fitting, timed or skipped by the step-time bound, fits by ``local_sgd_memory`` as ``simulate``
judges it, every row it prunes by memory does not, and every row it calls invalid the kind refuses.
With the spmd count 1,141 of the 2,136 rows skipped by the bound said ``fits: true`` and do not fit
(1,091 ZeRO layouts local_sgd refuses, 50 out of memory), and 61 engine runs went to layouts the kind
refuses; now 995 are skipped, all fitting, 255 pruned by memory, 1,302 invalid, 22 engine runs. The
tokens/s top 20 is the one the spmd check gave (the engine judges memory by the kind's model anyway:
a layout it timed that does not fit ranks last). Since each kind declares the layout fields it reads
(tests/test_kind_layout_fields.py), the search keeps local_sgd's ZeRO stage at the scenario's 0: 1,287 rows,
15 invalid, 280 out of memory, 992 fitting (timed or skipped by spmd's pipeline chain, local_sgd's bound)."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest

import simulator.explore.checks as checks
from simulator.errors import ConfigError
from simulator.explore.search import SearchConstraints, SearchSpace, prepare, search
from simulator.memory.analytic import fits as memory_fits
from simulator.memory.vectorised import peak_memory
from simulator.report.search_table import summarize
from simulator.scenario import build_scenario
from simulator.strategies.local_sgd import local_sgd_memory

DILOCO = Path(__file__).resolve().parents[1] / "examples" / "llama3-8b-diloco-h100.yaml"


@pytest.fixture(scope="module")
def rows():
    return search(str(DILOCO), workers=1)


def _judged_by_the_kind(raw, row) -> tuple[bool, str | None]:
    point = copy.deepcopy(raw)
    point["parallelism"] = row["parallelism"]
    sc = build_scenario(point)
    _, peak, per_stage = local_sgd_memory(sc)
    return memory_fits(sc, peak, per_stage)


@pytest.mark.slow
def test_every_fits_claim_is_the_kinds_memory_model(rows):
    raw, _, _ = prepare(str(DILOCO), [], None, SearchSpace(), SearchConstraints())
    seen = Counter()
    for row in rows:
        reason = str(row.get("infeasible_reason") or "")
        if reason.startswith("invalid layout"):
            assert row["fits"] is False
            with pytest.raises(ConfigError):
                _judged_by_the_kind(raw, row)
            seen["invalid"] += 1
            continue
        ok, why = _judged_by_the_kind(raw, row)
        assert row["fits"] is ok, (row["parallelism"], row.get("evaluated_by"), why)
        if not ok:
            assert row.get("evaluated_by") is None and row["infeasible_reason"] == why  # pruned, not timed
        seen[(ok, row.get("evaluated_by"))] += 1
    # the space has all three kinds of row, so the test checks each of them
    assert seen[(True, "bound")] > 0 and seen[(True, "engine")] > 0 and seen[(False, None)] > 0, seen
    counts = summarize(rows)
    assert counts["pruned_by_memory"] == seen[(False, None)] and counts["invalid"] == seen["invalid"]


@pytest.mark.slow
def test_the_tokens_per_s_top_20_is_unchanged(rows, monkeypatch):
    # the check as it was: the spmd count (vectorised) for every kind
    monkeypatch.setattr(checks, "layout_memory", lambda sc, reference=False: peak_memory(sc))
    spmd_checked = search(str(DILOCO), workers=1)
    # the spmd count passes layouts the kind refuses: the first test fails on its rows
    assert summarize(spmd_checked)["skipped_by_bound"] > summarize(rows)["skipped_by_bound"]

    def top(found):
        return [(r["parallelism"], r["tokens_per_s"], r["fits"]) for r in found[:20]]

    assert top(rows) == top(spmd_checked)
    assert all(r["fits"] and r["evaluated_by"] == "engine" for r in rows[:20])
