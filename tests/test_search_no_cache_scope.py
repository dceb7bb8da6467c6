"""`clustersim search --no-cache` turns the point cache off for that run only: run in-process (``simulator.cli.main``
from a notebook, or a test worker), it must not leave ``CLUSTERSIM_CACHE=0`` behind in the caller's environment. It
did: a later search in the same process stopped caching (CI, 2026-12-06: tests/test_search_fast.py's
test_rerun_reads_the_cache failed after test_bad_input_mutations.py ran `search --no-cache` in the same xdist worker)."""

from __future__ import annotations

import os

from simulator.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = os.path.join(ROOT, "examples", "resnet50-8xa100.yaml")
ARGS = ["search", SCENARIO, "--no-cache", "--workers", "1", "--space", "tp=1", "--space", "pp=1",
        "--space", "zero_stage=0", "--space", "micro_batch_size=256", "--space", "recompute=none", "--top", "1"]


def test_no_cache_does_not_outlive_the_run(monkeypatch, capsys):
    monkeypatch.delenv("CLUSTERSIM_CACHE", raising=False)
    assert main(ARGS) == 0
    assert "CLUSTERSIM_CACHE" not in os.environ


def test_a_callers_own_setting_is_restored(monkeypatch, capsys):
    monkeypatch.setenv("CLUSTERSIM_CACHE", "1")
    assert main(ARGS) == 0
    assert os.environ["CLUSTERSIM_CACHE"] == "1"
