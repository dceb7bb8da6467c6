"""A model imported from PyTorch (``model: torchvision:resnet50``) is traced once per search, sweep,
scale or plan, not once per layout or per worker: the traced module is kept per process
(workloads/networks/torch_import.py) and traced in the parent before a process pool forks
(simulator/explore/sweep.py ``trace_imported_models``; a search's ``prepare`` builds the graph
there). Each trace is counted through a file, so that the forked workers' traces count too.
benchmarks/bench_search_traced.py times the search against its catalog twin."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from simulator.explore.search import SearchSpace, search
from simulator.explore.sweep import absolutize
from simulator.scenario import load_raw

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "resnet50-torchvision-8xa100.yaml"
#: A small space with three micro-batches (three graphs mapped from the one trace) and two pipeline depths.
SPACE = SearchSpace(tp=[1], pp=[1, 2], micro_batch_size=[64, 128, 256], zero_stage=[0], recompute=["none"])


@pytest.fixture
def traces(monkeypatch, tmp_path, torchvision):
    """A function returning the traces made so far (one ``pid ref`` line each), from empty caches,
    with the on-disk cache of finished points off (a cached point would build nothing)."""
    from simulator import scenario
    from workloads.networks import torch_import

    monkeypatch.setattr(torch_import, "_TRACED", {})
    monkeypatch.setattr(torch_import, "_GRAPHS", {})
    scenario._cached_graph.cache_clear()
    monkeypatch.setenv("CLUSTERSIM_CACHE", "0")
    log = tmp_path / "traces.log"
    real = torch_import.trace

    def counted(module, input_shape, ref):
        with log.open("a") as out:
            out.write(f"{os.getpid()} {ref}\n")
        return real(module, input_shape, ref)

    monkeypatch.setattr(torch_import, "trace", counted)
    return lambda: log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_search_traces_the_model_once(traces, workers):
    rows = search(str(EXAMPLE), space=SPACE, workers=workers, top_k=4)
    timed = [r for r in rows if r.get("evaluated_by") == "engine"]
    assert len({r["parallelism"]["micro_batch_size"] for r in timed}) > 1  # several graphs were built
    assert traces() == [f"{os.getpid()} torchvision:resnet50"]  # once, in this process, none in the workers


def test_a_sweep_and_a_fixed_scale_trace_the_model_once(traces, tmp_path):
    from simulator.explore.scaling import scaling_curve
    from simulator.explore.sweep import load_sweep, run_sweep

    raw, base = load_raw(EXAMPLE)
    sweep = load_sweep({"base": absolutize(raw, base), "grid": {"parallelism.micro_batch_size": [64, 128, 256]}})
    counts = run_sweep(sweep, tmp_path / "out.csv", workers=2, progress=False)
    assert counts["ok"] == 3
    assert traces() == [f"{os.getpid()} torchvision:resnet50"]
    rows = scaling_curve(str(EXAMPLE), [8, 16], layout="fixed", weak=True, workers=2)
    assert all(r["fits"] for r in rows)
    assert len(traces()) == 1  # the trace above serves the scale too


def test_a_plan_traces_the_model_once(traces):
    from simulator.explore.planners import get_planner

    raw, base = load_raw(EXAMPLE)
    result = get_planner("deeppool").run(absolutize(copy.deepcopy(raw), base), {})
    assert result.plans_simulated > 1 and result.step_time_s
    assert traces() == [f"{os.getpid()} torchvision:resnet50"]
