"""`search` with the fast path (simulator/explore/search.py): every candidate by the fast path or
skipped by its compute lower bound, the top k re-simulated by the engine and ranked by it -- the
same top k, in the same order and with the same step times, as timing every layout with the engine;
the on-disk cache of finished points; the same search on Dask over loopback."""

from __future__ import annotations

import pytest

from simulator.explore.search import SearchSpace, search, summarize

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


@pytest.mark.parametrize("fast_top_k", [False, True])
def test_top_k_is_the_exhaustive_engine_ranking(exhaustive, fast_top_k):
    """The same top k as the engine everywhere; with ``fast_top_k`` every engine row of the top k
    carries the fast path's time too (without it, only those the fast path priced before the engine)."""
    overrides, gpus, space = SMALL
    k = 5
    rows = search(None, overrides=overrides, num_gpus=gpus, space=space, top_k=k, workers=1, fast_top_k=fast_top_k)
    assert len(rows) == len(exhaustive)
    top = rows[:k]
    assert all(r["evaluated_by"] == "engine" for r in top)
    assert [_key(r) for r in top] == [_key(r) for r in exhaustive[:k]]
    for fast, ref in zip(top, exhaustive[:k], strict=True):
        assert fast["step_time_s"] == pytest.approx(ref["step_time_s"], rel=1e-12)
        if fast_top_k:
            assert fast["fast_step_time_s"] is not None
        if fast["fast_step_time_s"] is not None:
            assert fast["fast_path_lower_bound_s"] <= fast["fast_step_time_s"] <= fast["step_time_s"] * (1 + 1e-9)
            assert fast["fast_step_time_s"] == pytest.approx(fast["step_time_s"], rel=0.03)
    s = summarize(rows)
    assert s["by_engine"] >= k
    assert s["by_engine"] + s["by_fast_path"] + s["skipped_by_bound"] == summarize(exhaustive)["simulated"]
    kth_engine = sorted(r["step_time_s"] for r in rows if r.get("evaluated_by") == "engine")[k - 1]
    for row in rows:
        if row.get("evaluated_by") == "bound":  # skipped only when it cannot reach the top k
            assert row["step_time_lower_bound_s"] > kth_engine
            assert row["fits"] and row["tokens_per_s"] is None
        elif row.get("evaluated_by") == "fast":
            assert row["fast_step_time_s"] > kth_engine


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
