"""Stragglers (issue 21): seeded per-device speed draws in full mode, their exact effect on a
synchronous data-parallel step, and the ordering of synchronous vs infrequent-sync strategies.

A toy cluster of 8 one-GPU nodes with a nearly free network: a DP step is each device's kernels
scaled by its draw, the all-reduce once the slowest is done, then each device's optimizer step.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cost.stragglers import StragglerDraws, StragglerSpec
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from tests.test_mixed_clusters import TOY, _node, _with

N = 8
STEPS = 24
_NODE = {**_node("dev", 1.0, 8000), "nic_latency_us": 0.1}
MODEL = {"name": "toy", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_kv_heads": 8,
         "vocab_size": 1024, "seq_length": 256}
BASE = _with(TOY, model=MODEL, cluster={**TOY["cluster"], "groups": [{"node": _NODE, "nodes": N}]},
             parallelism={"global_batch_size": N * 4, "micro_batch_size": 4, "overlap_grad_reduce": False},
             simulation={"mode": "full", "steps": STEPS})
TRANSIENT = {"distribution": "lognormal", "sigma": 0.3, "seed": 7, "per": "step"}
PERSISTENT = {**TRANSIENT, "per": "device"}


def _run(raw: dict, stragglers: dict | None):
    sim = {**raw["simulation"], **({"stragglers": stragglers} if stragglers else {})}
    return simulate(load_scenario(_with(raw, simulation=sim)))


def test_draws_are_seeded_and_reproducible():
    spec = StragglerSpec(**TRANSIENT)
    a, b = StragglerDraws(spec, N), StragglerDraws(spec, N)
    assert [a.factor(r, k) for r in range(N) for k in range(5)] == [b.factor(r, k) for r in range(N) for k in range(5)]
    # device r's draws do not depend on the order others are drawn in
    c = StragglerDraws(spec, N)
    late = [c.factor(3, k) for k in range(5)]
    assert late == [a.factor(3, k) for k in range(5)]
    other = StragglerDraws(StragglerSpec(**{**TRANSIENT, "seed": 8}), N)
    assert other.factor(0, 0) != a.factor(0, 0)
    persistent = StragglerDraws(StragglerSpec(**PERSISTENT), N)
    assert persistent.factor(2, 0) == persistent.factor(2, 9)


def test_lognormal_draws_have_mean_one():
    draws = StragglerDraws(StragglerSpec(distribution="lognormal", sigma=0.3, seed=1), 1)
    values = np.array([draws.factor(0, k) for k in range(20000)])
    assert values.mean() == pytest.approx(1.0, abs=0.01)
    assert np.log(values).std() == pytest.approx(0.3, rel=0.03)


def test_fixed_slows_that_share_of_devices():
    draws = StragglerDraws(StragglerSpec(distribution="fixed", factor=2.0, fraction=0.25, per="device"), N)
    assert sorted(draws.factor(r, 0) for r in range(N)) == [1.0] * 6 + [2.0] * 2


def test_a_seeded_run_is_reproducible_bit_for_bit():
    one, two = _run(BASE, TRANSIENT), _run(BASE, TRANSIENT)
    assert one.step_times_s == two.step_times_s
    assert _run(BASE, {**TRANSIENT, "seed": 8}).step_times_s != one.step_times_s


def test_data_parallel_step_waits_for_the_slowest_draw_exactly():
    """Each step: device i computes f_ik x (forward + backward), the all-reduce starts at the latest
    end, then device i runs f_ik x its optimizer step; the next step starts after its own."""
    plain = _run(BASE, None)
    dur = {}
    for e in plain.timeline:
        if e.rank_class == "rank0" and e.name.startswith("s0."):
            dur[e.name.split(".", 1)[1].split(".")[0]] = e.end_s - e.start_s
    fb = dur["F"] + dur["B"]
    opt, reduce_s = dur["optimizer_step"], dur["grads"]
    draws = StragglerDraws(StragglerSpec(**TRANSIENT), N)
    start = [0.0] * N
    for k in range(STEPS):
        end = max(start[i] + draws.factor(i, k) * fb for i in range(N)) + reduce_s
        start = [end + draws.factor(i, k) * opt for i in range(N)]
    result = _run(BASE, TRANSIENT)
    assert result.makespan_s == pytest.approx(max(start), rel=1e-9)
    assert result.extra["stragglers"] == "lognormal (sigma 0.3), per step, seed 7"


@pytest.fixture(scope="module")
def slowdowns():
    """Step time with stragglers / without, per strategy and kind of straggler."""
    cases = {"spmd": BASE, "local_sgd": _with(BASE, strategy={"kind": "local_sgd", "local_steps": 8})}
    out = {}
    for name, raw in cases.items():
        plain = _run(raw, None).step_time_s
        out[name] = {per: _run(raw, spec).step_time_s / plain for per, spec in
                     (("step", TRANSIENT), ("device", PERSISTENT))}
    return out


def test_transient_stragglers_slow_synchronous_dp_by_the_expected_max_and_local_sgd_less(slowdowns):
    """Per-step draws: DP waits for the slowest of 8 every step (E[max of 8] = 1.49 for sigma 0.3,
    less the unscaled all-reduce share); local SGD (H = 8) waits for the slowest *sum* of 8 draws
    (1.14 on these draws)."""
    draws = StragglerDraws(StragglerSpec(**TRANSIENT), N)
    f = np.array([[draws.factor(r, k) for k in range(STEPS)] for r in range(N)])
    expected_max = f.max(axis=0).mean()
    local_expected = f.reshape(N, STEPS // 8, 8).mean(axis=2).max(axis=0).mean()
    assert 1.4 < expected_max < 1.6 and 1.08 < local_expected < 1.2
    dp, local = slowdowns["spmd"]["step"], slowdowns["local_sgd"]["step"]
    assert 1.0 < local < dp
    assert dp == pytest.approx(expected_max, rel=0.12)      # the unscaled all-reduce dilutes it a little
    assert local == pytest.approx(local_expected, rel=0.05)


def test_persistent_stragglers_slow_both_alike(slowdowns):
    """Per-device draws: the slowest device is slow every step, and local SGD's replicas wait for it
    at every outer all-reduce: no gain from synchronising less often."""
    dp, local = slowdowns["spmd"]["device"], slowdowns["local_sgd"]["device"]
    slowest = max(StragglerDraws(StragglerSpec(**PERSISTENT), N).factor(r, 0) for r in range(N))
    assert dp == pytest.approx(slowest, rel=0.1) and local == pytest.approx(slowest, rel=0.1)
    assert local > slowdowns["local_sgd"]["step"]


def test_asynchronous_pipeline_absorbs_transient_stragglers():
    """PipeDream (one device per stage, an update per micro-batch) vs the synchronous 1F1B pipeline
    with a flush per step, 8 stages: a transient draw delays one micro-batch's pass, not the step."""
    pipe = _with(BASE, model={**MODEL, "num_layers": N}, parallelism={"pp": N, "global_batch_size": 32,
                                                                       "micro_batch_size": 1})
    sync = _run(pipe, TRANSIENT).step_time_s / _run(pipe, None).step_time_s
    async_raw = _with(pipe, strategy={"kind": "async_pipeline"})
    asynchronous = _run(async_raw, TRANSIENT).step_time_s / _run(async_raw, None).step_time_s
    assert 1.0 < asynchronous < sync


@pytest.mark.parametrize(("stragglers", "sets", "field"), [
    ({"distribution": "lognormal"}, {}, "simulation.stragglers"),
    ({"distribution": "lognormal", "sigma": 0.2, "cv": 0.1}, {}, "simulation.stragglers"),
    ({"distribution": "fixed", "factor": 2}, {}, "simulation.stragglers"),
    ({"distribution": "gamma", "sigma": 0.2}, {}, "simulation.stragglers.distribution"),
    ({"distribution": "lognormal", "sigma": -1}, {}, "simulation.stragglers.sigma"),
    ({"distribution": "lognormal", "sigma": 0.2}, {"mode": "symmetric"}, "simulation.stragglers"),
])
def test_bad_stragglers_name_the_field(stragglers, sets, field):
    raw = _with(BASE, simulation={**BASE["simulation"], "steps": 1, "stragglers": stragglers, **sets})
    with pytest.raises(ConfigError) as exc:
        simulate(load_scenario(raw))
    assert exc.value.field == field


def test_the_table_names_the_draws():
    from simulator.report.result import render_table

    line = next(x for x in render_table(_run(BASE, TRANSIENT)).splitlines() if x.strip().startswith("stragglers"))
    assert "lognormal (sigma 0.3), per step, seed 7: time factors drawn" in line


def test_search_times_every_layout_by_the_engine_with_stragglers():
    """The fast path's bounds know nothing of the draws: a search with stragglers runs the engine."""
    from simulator.explore.search import SearchSpace, search

    raw = _with(BASE, simulation={**BASE["simulation"], "steps": 2, "stragglers": TRANSIENT})
    notes: list[str] = []
    rows = search(raw, space=SearchSpace(tp=[1], pp=[1, 2], micro_batch_size=[4], zero_stage=[0],
                                         recompute=["none"], virtual_stages=[1]), workers=1, notes=notes)
    timed = [r for r in rows if r.get("step_time_s")]
    assert timed and all(r["evaluated_by"] == "engine" for r in timed)
    # said, since it is why such a search prunes nothing by the bound and takes longer (session 11's newcomer)
    assert any(n.startswith("simulation.stragglers: the step-time lower bound knows nothing") for n in notes)
