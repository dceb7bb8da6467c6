"""The search's default micro-batch space: the scenario's own micro-batch and the powers of two
that split a replica's batch, so that the scenario's own layout is always a candidate (a CNN
trained at 256 images per GPU was searched at 1, 2 and 4 only, and its "best" was 2.4x slower
than the scenario itself)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.explore.search import (
    _RECOMPUTE,
    SearchConstraints,
    SearchSpace,
    _derived_micro_batches,
    enumerate_layouts,
    search,
)
from simulator.scenario import load_raw, load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.layout import Parallelism

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def test_derived_micro_batches_split_the_replica_batch():
    # global batch 2048 over dp 8: 256 per replica, every power of two up to it
    assert _derived_micro_batches([2048], 8, 256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    # 1536 over dp 16 = 96 per replica: powers of two that divide 96, and the scenario's own 3 and 12
    assert _derived_micro_batches([1536], 16, 3) == [1, 2, 3, 4, 8, 16, 32]
    assert _derived_micro_batches([1536], 16, 12) == [1, 2, 4, 8, 12, 16, 32]
    # interleaved on pp 4: the micro-batches per replica must be a multiple of 4 (96/m in 4, 8, ...)
    assert _derived_micro_batches([1536], 16, 1, groups=4) == [1, 2, 4, 8]
    # several global batches: each size splits at least one of them
    assert _derived_micro_batches([256, 1024], 8, 32) == [1, 2, 4, 8, 16, 32, 64, 128]
    # nothing splits the batch (dp does not divide it) or dp is not whole: one (invalid) row
    assert _derived_micro_batches([100], 8, 4) == [4]
    assert _derived_micro_batches([2048], None, 256) == [256]


def test_the_default_space_enumerates_the_scenario_micro_batch_at_every_dp():
    cands = enumerate_layouts({"schedule": "1f1b", "global_batch_size": 96}, 16, 16, 8, SearchSpace(),
                              SearchConstraints(), own_micro_batch=3)
    by_dp: dict[int, set[int]] = {}
    for c in cands:
        by_dp.setdefault(16 // (c["tp"] * c["pp"]), set()).add(c["micro_batch_size"])
    # 96 per replica at dp 1 ... 6 per replica at dp 16
    assert by_dp == {1: {1, 2, 3, 4, 8, 16, 32}, 2: {1, 2, 3, 4, 8, 16}, 4: {1, 2, 3, 4, 8},
                     8: {1, 2, 3, 4}, 16: {1, 2, 3}}
    for c in cands:  # every derived layout is a valid split (interleaved: a multiple of pp micro-batches)
        per_replica = 96 // (16 // (c["tp"] * c["pp"]))
        assert per_replica % c["micro_batch_size"] == 0
        if c["schedule"] == "interleaved":
            assert (per_replica // c["micro_batch_size"]) % c["pp"] == 0
    # a searched global batch pairs each size with a batch it splits
    over = enumerate_layouts({"schedule": "1f1b"}, 8, 8, 8, SearchSpace(tp=[1], pp=[1], global_batch_size=[64, 2048]),
                             SearchConstraints(), own_micro_batch=256)
    assert {(c["global_batch_size"], c["micro_batch_size"]) for c in over} == (
        {(64, m) for m in (1, 2, 4, 8)} | {(2048, m) for m in (1, 2, 4, 8, 16, 32, 64, 128, 256)})
    # an explicit list is taken as given
    given = enumerate_layouts({"schedule": "1f1b", "global_batch_size": 96}, 16, 16, 8,
                              SearchSpace(micro_batch_size=[5]), SearchConstraints(), own_micro_batch=3)
    assert {c["micro_batch_size"] for c in given} == {5}


def _own_layout_space(path: Path) -> SearchSpace:
    """Every field but the micro-batch pinned to the scenario's own: the search then tries the own
    layout and the derived micro-batches beside it."""
    raw, _ = load_raw(str(path))
    p = Parallelism.model_validate(raw.get("parallelism") or {})
    return SearchSpace(tp=[p.tp], pp=[p.pp], cp=[p.cp], ep=[p.ep], virtual_stages=[p.virtual_stages],
                       zero_stage=[p.zero_stage], recompute=[p.recompute],
                       sequence_parallel=[p.sequence_parallel])


def _searchable_spmd_examples() -> list[Path]:
    """The spmd examples whose own layout is in search's space (not: torchtitan's per-op selective
    recompute, which search does not vary; co-located jobs, which search refuses; a traced torchvision model,
    whose catalog twin is searched)."""
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        raw, _ = load_raw(str(path))
        if (raw.get("strategy") or {}).get("kind", "spmd") != "spmd" or raw.get("co_located_jobs"):
            continue
        if (raw.get("parallelism") or {}).get("recompute", "none") not in _RECOMPUTE:
            continue
        if str(raw.get("model", "")).startswith("torchvision:"):
            continue  # the catalog twin of a traced model (resnet50-8xa100) is searched; tracing at every micro-batch is slow
        out.append(path)
    return out


def test_the_searchable_examples_are_most_spmd_examples():
    names = {p.stem for p in _searchable_spmd_examples()}
    assert {"resnet50-8xa100", "bert-large-tp4-dgx-a100", "gpt3-175b-1024-a100", "stragglers-dp-a100"} <= names
    assert len(names) >= 15


@pytest.mark.parametrize("path", _searchable_spmd_examples(), ids=lambda p: p.stem)
def test_the_search_best_is_never_slower_than_the_scenario_own_layout(path, monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_CACHE", "0")
    own = simulate(load_scenario(path))
    assert own.fits, own.infeasible_reason
    rows = search(str(path), space=_own_layout_space(path), workers=1)
    raw, _ = load_raw(str(path))
    own_mbs = Parallelism.model_validate(raw.get("parallelism") or {}).micro_batch_size
    assert own_mbs in {r["parallelism"]["micro_batch_size"] for r in rows}
    best = rows[0]
    assert best["fits"] and best["samples_per_s"] >= own.samples_per_s * (1 - 1e-9), (
        best["parallelism"], best["samples_per_s"], own.samples_per_s)


def test_resnet50_search_from_the_cli_finds_the_scenario_micro_batch():
    """The audit's case: `clustersim search examples/resnet50-8xa100.yaml` picked micro-batch 4 at
    10,202 images/s where the scenario (256 per GPU) runs at 24,078. Data parallel only (tp and pp
    1) keeps it to the nine micro-batches 1 ... 256."""
    env = {**os.environ, "CLUSTERSIM_CACHE": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "search", str(EXAMPLES / "resnet50-8xa100.yaml"),
                          "--space", "tp=1", "--space", "pp=1", "--workers", "1", "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    rows = json.loads(out.stdout)
    assert sorted({r["parallelism"]["micro_batch_size"] for r in rows}) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    own = simulate(load_scenario(EXAMPLES / "resnet50-8xa100.yaml"))
    assert rows[0]["parallelism"]["micro_batch_size"] == 256
    assert rows[0]["samples_per_s"] >= own.samples_per_s * (1 - 1e-9)
    # the micro-batches of 1, 2, 4 the old default space stopped at: skipped by their step-time bound
    # (images per second at most the bound's), below half the scenario's
    for r in rows:
        if r["parallelism"]["micro_batch_size"] <= 4:
            assert r["evaluated_by"] == "bound"
            assert 2048 / r["step_time_lower_bound_s"] < 0.5 * own.samples_per_s
