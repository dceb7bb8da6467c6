"""`search` with the fast path (simulator/explore/search.py): every candidate by the fast path or
skipped by its compute lower bound, the top k re-simulated by the engine and ranked by it -- the
same top k, in the same order and with the same step times, as timing every layout with the engine;
the on-disk cache of finished points; the same search on Dask over loopback."""

from __future__ import annotations

import pytest

from simulator.explore.search import SearchSpace, search
from simulator.report.search_table import summarize

SMALL = (["model=gpt-1.7b", "training.seq_length=1024", "parallelism.global_batch_size=64"], 16,
         SearchSpace(micro_batch_size=[1, 2], zero_stage=[1], recompute=["none", "full"]))


def engine_everywhere(raw):
    """Every feasible layout through the engine (the exhaustive reference)."""
    from simulator.simulate import simulate_point

    return simulate_point(raw, engine="full")


def _key(row):
    return tuple(sorted((k, v) for k, v in row["parallelism"].items()))


@pytest.fixture(scope="module")
def exhaustive():
    overrides, gpus, space = SMALL
    return search(None, overrides=overrides, num_gpus=gpus, space=space, simulate_fn=engine_everywhere, workers=1)


def test_top_k_is_the_exhaustive_engine_ranking_and_carries_both_times(exhaustive):
    """The same top k as the engine everywhere, and every top-k row carries both times: the engine's
    (``engine_step_time_s``, the one ``step_time_s`` and the ranking use) and the fast path's
    (``fast_step_time_s``, within 3% of it, above its every-transfer-alone bound)."""
    overrides, gpus, space = SMALL
    k = 5
    rows = search(None, overrides=overrides, num_gpus=gpus, space=space, top_k=k, workers=1)
    assert len(rows) == len(exhaustive)
    top = rows[:k]
    assert all(r["evaluated_by"] == "engine" for r in top)
    assert [_key(r) for r in top] == [_key(r) for r in exhaustive[:k]]
    for row, ref in zip(top, exhaustive[:k], strict=True):
        assert row["step_time_s"] == pytest.approx(ref["step_time_s"], rel=1e-12)
        assert row["engine_step_time_s"] == row["step_time_s"]
        assert row["fast_path_lower_bound_s"] <= row["fast_step_time_s"] <= row["step_time_s"] * (1 + 1e-9)
        assert row["fast_step_time_s"] == pytest.approx(row["step_time_s"], rel=0.03)
    s = summarize(rows)
    assert s["by_engine"] >= k and s["by_fast_path"] == 0 and s["priced_by_fast_path"] >= k
    assert s["by_engine"] + s["skipped_by_bound"] == summarize(exhaustive)["simulated"]
    kth_engine = sorted(r["step_time_s"] for r in rows if r.get("evaluated_by") == "engine")[k - 1]
    for row in rows:
        assert {"engine_step_time_s", "fast_step_time_s", "fast_path_lower_bound_s"} <= row.keys()
        if row.get("evaluated_by") == "bound":  # skipped only when it cannot reach the top k
            assert row["step_time_lower_bound_s"] > kth_engine
            assert row["fits"] and row["tokens_per_s"] is None and row["engine_step_time_s"] is None


def test_fast_path_beside_the_engine_walks_its_plans():
    """``fast_beside_engine`` times the fast path on the plans the engine builds (unrolled: the plan the
    engine runs; folded: the fold's two points, whose plans the engine's one run extends by two periods;
    not ``fast_step``'s three fold points): the engine's result is bit for bit the engine alone's, and
    the fast path's step and bound equal ``fast_step``'s (to round-off) on a folded 1F1B pipeline and
    an unrolled interleaved one."""
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate
    from simulator.strategies.spmd.fast import fast_beside_engine, fast_step
    from simulator.strategies.spmd.fold import _more, engine_fold_points

    base = ["model=gpt-1.7b", "training.seq_length=1024", "cluster.num_gpus=16", "parallelism.tp=2",
            "parallelism.pp=4", "parallelism.global_batch_size=128", "parallelism.micro_batch_size=1"]
    for layout, folded in ((["parallelism.schedule=1f1b", "parallelism.virtual_stages=1"], True),
                           (["parallelism.schedule=interleaved", "parallelism.virtual_stages=2"], False)):
        scenario = load_scenario(None, base + layout)
        alone = simulate(scenario, run_if_oom=False).to_dict()
        result, estimate = fast_beside_engine(scenario)
        assert result.to_dict() == alone
        assert ("engine_fold" in alone) == folded
        if folded:  # the pair whose run (one or two periods past its second point: fold._more) the engine folded
            (ran,) = alone["engine_fold"]["micro_batches_evaluated"]
            engine_points = next(p for p in engine_fold_points(scenario)
                                 if p[1] + _more(p[1] - p[0]) * (p[1] - p[0]) == ran)
        else:
            engine_points = (scenario.parallelism.num_micro_batches,)
        assert estimate.micro_batches_evaluated == engine_points
        reference = fast_step(scenario)
        assert reference.micro_batches_evaluated != engine_points or not folded
        assert estimate.step_time_s == pytest.approx(reference.step_time_s, rel=1e-9)
        assert estimate.lower_bound_s == pytest.approx(reference.lower_bound_s, rel=1e-9)
        assert estimate.lower_bound_s <= alone["step_time_s"] * (1 + 1e-9)


def test_cli_table_json_and_csv_name_both_times(tmp_path):
    """The table's columns say which time is whose (``engine s``, ``fast s``), and so do --json's and
    --csv's keys; every top-k row has both."""
    import csv
    import json
    import subprocess
    import sys

    overrides, gpus, _ = SMALL
    args = [sys.executable, "-m", "simulator.cli", "search", "--gpus", str(gpus), "--space", "tp=2",
            "--space", "pp=2,4", "--space", "micro_batch_size=2", "--space", "zero_stage=1", "--space", "recompute=full",
            "--top-k", "3", "--workers", "1", "--no-cache"] + [a for o in overrides for a in ("--set", o)]
    table = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert "engine s" in table.splitlines()[0] and "fast s" in table.splitlines()[0]
    out = tmp_path / "rows.csv"
    rows = json.loads(subprocess.run(args + ["--json", "--csv", str(out)], capture_output=True, text=True,
                                     check=True).stdout)
    timed = [r for r in rows if r["evaluated_by"] == "engine"]
    assert timed and all(r["engine_step_time_s"] and r["fast_step_time_s"] for r in timed[:3])
    with out.open() as fh:
        written = list(csv.DictReader(fh))
    assert len(written) == len(rows)
    assert [w["rank"] for w in written[:len(timed)]] == [str(i) for i in range(1, len(timed) + 1)]
    for w, r in zip(written, rows, strict=True):
        assert w["engine_step_time_s"] == ("" if r["engine_step_time_s"] is None else str(r["engine_step_time_s"]))
        assert w["fast_step_time_s"] == ("" if r["fast_step_time_s"] is None else str(r["fast_step_time_s"]))


def test_rerun_reads_the_cache(monkeypatch, tmp_path):
    """A re-run evaluates nothing: the simulator is never called the second time."""
    monkeypatch.setenv("CLUSTERSIM_CACHE_DIR", str(tmp_path))
    overrides, gpus, space = SMALL
    space = space.model_copy(update={"micro_batch_size": [2], "zero_stage": [1]})
    first = search(None, overrides=overrides, num_gpus=gpus, space=space, top_k=3, workers=1)
    assert list(tmp_path.rglob("*.json"))

    def fail(*args, **kwargs):
        raise AssertionError("simulated again")

    monkeypatch.setattr("simulator.simulate.simulate_point", fail)
    second = search(None, overrides=overrides, num_gpus=gpus, space=space, top_k=3, workers=1)
    assert [(_key(r), r["step_time_s"]) for r in second] == [(_key(r), r["step_time_s"]) for r in first]
    monkeypatch.setenv("CLUSTERSIM_CACHE", "0")  # off: simulates again
    with pytest.raises(AssertionError, match="simulated again"):
        from simulator.explore.cache import cached_point

        cached_point({"model": "gpt-1.7b", "cluster": {"num_gpus": 8}})


def test_search_on_dask_loopback(exhaustive):
    pytest.importorskip("distributed")
    overrides, gpus, space = SMALL
    space = space.model_copy(update={"tp": [2], "micro_batch_size": [2]})
    rows = search(None, overrides=overrides, num_gpus=gpus, space=space, top_k=3, workers=1, dask="local")
    exhaustive = [r for r in exhaustive if r["parallelism"]["tp"] == 2 and r["parallelism"]["micro_batch_size"] == 2]
    assert [_key(r) for r in rows[:3]] == [_key(r) for r in exhaustive[:3]]
    assert [r["step_time_s"] for r in rows[:3]] == pytest.approx([r["step_time_s"] for r in exhaustive[:3]], rel=1e-12)
