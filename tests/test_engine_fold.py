"""The engine on a folded pipeline (simulator/strategies/spmd/fold.py) against the unrolled plan.

Every figure ``simulate`` reports from a folded run -- step time, breakdown, busiest stage and its
breakdown, simulated memory peaks -- equals the unrolled run's to 1e-9 relative, on a toy cluster
and on real models, for 1F1B and the interleaved schedule, with shared links, with sync jitter, in
symmetric and full mode. Where it does not fold (GPipe, ZB-H1, several steps, stragglers, traces, short
pipelines, every example; kernel / communication interference and a pipeline whose period spans several
micro-batches are refused by the fold's own checks) the engine runs the unrolled plan."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_simulate import toy_raw

from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.fast import fast_step
from simulator.strategies.spmd.fold import engine_fold_points

RTOL = 1e-9


def _same(folded, unrolled) -> None:
    """Every figure of the folded result equals the unrolled one's (1e-9 relative to the step)."""
    assert folded.extra.get("engine_fold") is not None, "expected a folded run"
    assert unrolled.extra.get("engine_fold") is None
    step = unrolled.step_time_s
    a, b = folded.to_dict(), unrolled.to_dict()
    a.pop("engine_fold")
    assert a.keys() == b.keys()

    def close(x, y, path):
        if isinstance(x, dict):
            assert x.keys() == y.keys(), path
            for k in x:
                close(x[k], y[k], f"{path}.{k}")
        elif isinstance(x, list):
            assert len(x) == len(y), path
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                close(u, v, f"{path}[{i}]")
        elif isinstance(x, float) and isinstance(y, float):
            assert math.isclose(x, y, rel_tol=RTOL, abs_tol=RTOL * step), (path, x, y)
        else:
            assert x == y, (path, x, y)

    close(a, b, "result")
    assert folded.busiest_stage == unrolled.busiest_stage


def _check(scenario, **kw):
    assert engine_fold_points(scenario)
    folded = simulate(scenario, **kw)
    unrolled = simulate(scenario, fold=False, **kw)
    _same(folded, unrolled)
    return folded, unrolled


def _toy(num_gpus: int, slowdown: float = 0.0, comm_slowdown: float = 0.0, jitter: float = 0.0,
         mode: str = "symmetric", nvl_gb_per_s: float = 500.0, latency_us: float = 0.0, **parallelism):
    raw = toy_raw(num_gpus, nvl_gb_per_s=nvl_gb_per_s, nvl_latency_us=latency_us, **parallelism)
    eff = raw["cluster"]["node"]["accelerator"]["efficiency"]
    eff.update(overlap_compute_slowdown=slowdown, overlap_comm_slowdown=comm_slowdown, sync_jitter=jitter)
    raw["model"]["num_layers"] = 8
    raw["simulation"] = {"mode": mode}
    return load_scenario(raw)


def test_toy_1f1b_folds_exactly():
    # pp 4, 120 micro-batches: the toy's step grows by one of two amounts, repeating every 4
    # micro-batches (below), so the period of one micro-batch (the run at 9) is refused and the
    # period of p = 4 (the run at 24: points 12, 16 and two periods more) folds; every figure is the
    # unrolled run's.
    scenario = _toy(4, pp=4, global_batch_size=120)
    assert engine_fold_points(scenario) == ((6, 7), (12, 16))
    folded, _ = _check(scenario)
    assert folded.extra["engine_fold"]["micro_batches_evaluated"] == [24]


def test_a_pipeline_periodic_over_several_micro_batches_is_not_folded():
    """On a slow link the toy's step grows by 5.652, 5.637, 5.652, 5.652 ms per micro-batch, over and
    over (a period of 4 micro-batches): one more micro-batch moves the later tasks by differing
    amounts, so the engine runs the unrolled plan."""
    scenario = _toy(4, nvl_gb_per_s=50.0, latency_us=5.0, pp=4, global_batch_size=40)
    assert engine_fold_points(scenario) == ((6, 7),)  # period p would cost more than half the plan
    assert simulate(scenario).extra.get("engine_fold") is None


def test_a_stream_that_drifts_is_not_folded():
    """ZeRO-3 gathers without overlapped reduction on gpt-1.7b, pp 2: the DP stream falls a little further
    behind every micro-batch, so the step grows by the same 25.4837 ms at 3, 4 and 5 micro-batches (and
    one more micro-batch moves every later task by that much) but by 25.4640, then 25.577 and 25.720 ms
    further on. The new period does not run one period after the one before it on that stream: not
    folded (extrapolating from 3-5 was 0.7% short at 40 micro-batches)."""
    scenario = load_scenario(None, ["model=gpt-1.7b", "training.seq_length=512", "cluster.num_gpus=32",
                                    "parallelism.tp=2", "parallelism.pp=2", "parallelism.virtual_stages=1",
                                    "parallelism.schedule=1f1b", "parallelism.zero_stage=3",
                                    "parallelism.overlap_grad_reduce=false", "parallelism.sequence_parallel=true",
                                    "parallelism.recompute=none", "parallelism.global_batch_size=320"])
    assert engine_fold_points(scenario) == ((4, 5),)
    assert simulate(scenario).extra.get("engine_fold") is None


def test_toy_interleaved_folds_exactly():
    # pp 4, v 2, 96 micro-batches: the period is p = 4 micro-batches; points 16, 20.
    scenario = _toy(4, pp=4, virtual_stages=2, schedule="interleaved", global_batch_size=96)
    assert engine_fold_points(scenario) == ((16, 20),)
    _check(scenario)


def test_toy_with_shared_links_and_jitter_folds_exactly():
    """DP reductions (ZeRO-2: every micro-batch) share the NVLink ports with the pipeline sends -- the
    flow network shares them, not only a max-plus DAG -- and sync jitter stretches the kernels."""
    scenario = _toy(8, jitter=0.1, pp=4, dp=2, global_batch_size=240, zero_stage=2)
    assert fast_step(scenario, fold=False).contended
    _check(scenario)


def test_interference_is_not_folded():
    """Kernels slowed beside communication: the toy's increments wander (6.43987, 6.44023, 6.44017 ms
    ... per micro-batch, no period), so one more period does not move the later tasks by one amount:
    the engine runs the unrolled plan."""
    scenario = _toy(8, slowdown=0.3, comm_slowdown=0.2, pp=4, dp=2, global_batch_size=240,
                    overlap_grad_reduce=True)
    assert engine_fold_points(scenario)
    assert simulate(scenario).extra.get("engine_fold") is None


def test_toy_full_mode_folds_exactly():
    # Every rank an actor, DP gradient all-reduces as rendezvous over the flow network.
    _check(_toy(8, mode="full", pp=4, dp=2, global_batch_size=240))


REAL = {
    # a transformer on H100s, tp 2 pp 4 dp 2, ZeRO-1
    "llama-1b 1f1b": ["model=llama-1b", "cluster.node=dgx-h100", "cluster.num_gpus=16",
                                "training.seq_length=1024", "parallelism.tp=2", "parallelism.pp=4",
                                "parallelism.global_batch_size=96", "parallelism.zero_stage=1",
                                "parallelism.schedule=1f1b", "parallelism.virtual_stages=1"],
    "gpt-1.7b interleaved": ["model=gpt-1.7b", "cluster.num_gpus=32", "training.seq_length=1024", "parallelism.tp=4",
                             "parallelism.pp=4", "parallelism.virtual_stages=2", "parallelism.schedule=interleaved",
                             "parallelism.global_batch_size=192"],
}


@pytest.mark.parametrize("case", sorted(REAL))
def test_real_layouts_fold_exactly(case):
    scenario = load_scenario(None, REAL[case])
    folded, _ = _check(scenario)
    assert folded.busiest_stage is None or folded.busiest_stage_breakdown_s


@pytest.mark.parametrize("scenario", [
    _toy(8, pp=4, dp=2, global_batch_size=240, zero_stage=2), _toy(8, mode="full", pp=4, dp=2, global_batch_size=240),
    _toy(4, pp=4, virtual_stages=2, schedule="interleaved", global_batch_size=96),
    load_scenario(None, REAL["llama-1b 1f1b"]), load_scenario(None, REAL["gpt-1.7b interleaved"]),
    load_scenario(None, ["model=llama-1b", "cluster.node=dgx-h100", "cluster.num_gpus=16", "training.seq_length=512",
                         "parallelism.tp=2", "parallelism.pp=2", "parallelism.virtual_stages=2",
                         "parallelism.schedule=interleaved", "parallelism.overlap_grad_reduce=true",
                         "parallelism.global_batch_size=944"]),
], ids=["zero2", "full", "toy interleaved", "llama 1f1b", "gpt interleaved", "llama interleaved overlapped"])
def test_the_fold_checks_where_more_micro_batches_first_differ(scenario):
    """The one run's t* (fold._divergence: after the backward that follows the last forward, or at it
    where it is the last micro-batch's) is no later than where the plan with q more micro-batches
    first differs on every compute stream, and every task before it is the same; the last
    micro-batch's backward is built apart (interleaved, overlapped reduction: split per layer)."""
    from simulator.strategies.spmd.fold import _divergence, _more, _plan

    for points in engine_fold_points(scenario):
        q = points[1] - points[0]
        ran = points[1] + _more(q) * q
        plan, more = _plan(scenario, ran, None), _plan(scenario, ran + q, None)
        for actor, tasks in plan.compute_tasks.items():
            longer = more.compute_tasks[actor]
            differs = next(i for i, (a, b) in enumerate(zip(tasks, longer, strict=False)) if a.name != b.name)
            d = _divergence(tasks, ran)
            assert 0 < d <= differs, (actor, d, differs)
            assert all(a.duration_s == b.duration_s and a.alloc_bytes == b.alloc_bytes
                       for a, b in zip(tasks[:d], longer[:d], strict=True))


@pytest.mark.parametrize("change", [
    {"schedule": "gpipe"},                    # memory grows with the micro-batches: no steady peak
    {"schedule": "zb-h1"},                    # a list schedule, not periodic
    {"global_batch_size": 16},                # the three points would not halve the work
])
def test_not_folded(change):
    raw = toy_raw(4, **{"pp": 4, "global_batch_size": 40, **change})
    scenario = load_scenario(raw)
    assert engine_fold_points(scenario) == ()
    assert simulate(scenario).extra.get("engine_fold") is None


def test_several_steps_and_traces_are_not_folded():
    raw = toy_raw(4, pp=4, global_batch_size=40)
    many = copy.deepcopy(raw)
    many["simulation"] = {"steps": 2}
    assert engine_fold_points(load_scenario(many)) == ()
    assert simulate(load_scenario(raw), detail=True).extra.get("engine_fold") is None


@pytest.mark.parametrize("example", ["gpt3-175b-1024-a100", "gpt3-175b-fp8-512-h100", "llama3-405b-16k-h100",
                                     "deepseek-v3-h800"])
def test_examples_are_not_folded(example):
    """The spmd examples run unrolled (their output stays bit for bit the engine's on the whole plan)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / f"{example}.yaml"
    assert engine_fold_points(load_scenario(path)) == ()


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([0, 1, 2, 3]),
       st.booleans(), st.integers(min_value=40, max_value=120))
def test_random_layouts_fold_exactly_or_not_at_all(tp, pp, v, zero, overlap, m):
    """llama-1b on 16 H100s, random tp / pp / schedule / ZeRO / overlap and micro-batches: where the
    engine folds, every figure is the unrolled run's; where its checks refuse, the result is the
    unrolled run's (compared the same way, without the fold's note)."""
    dp = 16 // (tp * pp)
    if dp < 1:
        return
    schedule = "interleaved" if v > 1 else "1f1b"
    if v > 1:
        m -= m % pp
    scenario = load_scenario(None, ["model=llama-1b", "cluster.node=dgx-h100", "cluster.num_gpus=16",
                                    "training.seq_length=512", f"parallelism.tp={tp}", f"parallelism.pp={pp}",
                                    f"parallelism.virtual_stages={v}", f"parallelism.schedule={schedule}",
                                    f"parallelism.zero_stage={zero}", f"parallelism.overlap_grad_reduce={str(overlap).lower()}",
                                    f"parallelism.global_batch_size={m * dp}"])
    folded = simulate(scenario)
    unrolled = simulate(scenario, fold=False)
    if folded.extra.get("engine_fold") is None:
        assert folded.to_dict() == unrolled.to_dict()
    else:
        _same(folded, unrolled)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([2, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([0, 1, 2, 3]),
       st.sampled_from([0.0, 0.1]), st.sampled_from([(500.0, 0.0), (50.0, 5.0), (5.0, 20.0)]),
       st.sampled_from(["symmetric", "full"]), st.integers(min_value=40, max_value=100))
def test_random_toy_pipelines_fold_exactly_or_not_at_all(pp, dp, v, zero, jitter, link, mode, m):
    """The toy on up to 16 GPUs, random pp / dp / schedule / ZeRO / jitter / link speed (fast, slow, very
    slow: contended sends) / mode and micro-batches: where the engine folds (two points), every figure is
    the unrolled run's to 1e-9; where its checks refuse, the result is the unrolled run's."""
    if pp * v > 8:  # the toy has 8 layers
        return
    schedule = "interleaved" if v > 1 else "1f1b"
    if v > 1:
        m -= m % pp
    scenario = _toy(pp * dp, jitter=jitter, mode=mode, nvl_gb_per_s=link[0], latency_us=link[1], pp=pp, dp=dp,
                    virtual_stages=v, schedule=schedule, zero_stage=zero, global_batch_size=m * dp)
    folded = simulate(scenario)
    unrolled = simulate(scenario, fold=False)
    if folded.extra.get("engine_fold") is None:
        assert folded.to_dict() == unrolled.to_dict()
    else:
        _same(folded, unrolled)
