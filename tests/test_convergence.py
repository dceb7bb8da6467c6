"""Statistical efficiency as inputs (simulator/economics/convergence.py): steps to target as a
function of global batch (McCandlish et al. 2018), staleness and local steps; time to target; the
search ranking by it. The numbers are the block's, never predictions, and the output says so."""

from __future__ import annotations

import math

import pytest
from test_cli import TINY

from simulator.cli import main
from simulator.economics.convergence import ConvergenceSpec, resolve, steps_to_target
from simulator.errors import ConfigError
from simulator.explore.search import SearchSpace, search
from simulator.scenario import load_scenario
from simulator.simulate import simulate

BLOCK = {"source": "test numbers", "batch": {"s_min": 1000, "b_noise": 4096}}


def spec(**kw) -> ConvergenceSpec:
    return ConvergenceSpec.model_validate({**BLOCK, **kw})


def test_mccandlish_steps_by_hand():
    # S = S_min (1 + B_noise / B): B = 1024 -> 1000 (1 + 4) = 5000; B = 4096 -> 2000; B -> inf: 1000.
    assert steps_to_target(spec(), 1024, 2048) == pytest.approx(5000)
    assert steps_to_target(spec(), 4096, 2048) == pytest.approx(2000)
    assert steps_to_target(spec(), 1e12, 2048) == pytest.approx(1000, rel=1e-6)
    # batch counted in tokens: 2 sequences of 2048 tokens = 4096 tokens -> 2000
    tokens = spec(batch={"s_min": 1000, "b_noise": 4096, "unit": "tokens"})
    assert steps_to_target(tokens, 2, 2048) == pytest.approx(2000)


def test_staleness_and_local_steps_multiply():
    # tau = 2 steps of delay at 0.1 per step: x1.2; H = 4 local steps at 0.05 per extra step: x1.15.
    s = spec(staleness={"per_step_of_delay": 0.1}, local_steps={"per_extra_local_step": 0.05})
    assert steps_to_target(s, 4096, 1, staleness_steps=2, local_steps=4) == pytest.approx(2000 * 1.2 * 1.15)
    fixed = ConvergenceSpec.model_validate({"source": "a run", "steps_to_target": 300})
    assert steps_to_target(fixed, 1, 1) == 300


def test_curve_has_shallues_shape():
    # Shallue et al. 2019 Fig. 1: steps to target fall in proportion to the batch (perfect scaling),
    # then less and less (diminishing returns), approaching a floor. With the ResNet-50 preset:
    resnet = resolve(ConvergenceSpec(preset="resnet50-imagenet-assumed"))
    batches = [2**k for k in range(4, 23)]
    steps = [steps_to_target(resnet, b, 1) for b in batches]
    slopes = [math.log2(steps[i + 1] / steps[i]) for i in range(len(steps) - 1)]
    b_noise = resnet.batch.b_noise
    assert all(s2 < s1 for s1, s2 in zip(steps, steps[1:], strict=False))          # more batch, fewer steps
    assert all(b >= a - 1e-12 for a, b in zip(slopes, slopes[1:], strict=False))   # returns only diminish
    perfect = [s for b, s in zip(batches, slopes, strict=False) if 2 * b <= b_noise / 32]
    flat = [s for b, s in zip(batches, slopes, strict=False) if b >= 32 * b_noise]
    assert perfect and all(s == pytest.approx(-1.0, abs=0.05) for s in perfect)
    assert flat and all(s > -0.05 for s in flat)
    samples = [b * s for b, s in zip(batches, steps, strict=True)]                  # data to target only grows
    assert all(b >= a for a, b in zip(samples, samples[1:], strict=False))


def test_block_needs_a_source_and_a_base():
    with pytest.raises(ConfigError, match="convergence"):
        load_scenario({**TINY, "convergence": {"batch": {"s_min": 10, "b_noise": 1}}})
    with pytest.raises(ConfigError, match="convergence"):
        load_scenario({**TINY, "convergence": {"source": "x"}})
    with pytest.raises(ConfigError, match="convergence.preset"):
        simulate(load_scenario({**TINY, "convergence": {"preset": "nope"}}))


def test_simulate_reports_time_to_target_and_its_source():
    r = simulate(load_scenario({**TINY, "convergence": BLOCK})).to_dict()
    assert r["steps_to_target"] == pytest.approx(1000 * (1 + 4096 / 8))  # TINY: global batch 8
    assert r["time_to_target_s"] == pytest.approx(r["steps_to_target"] * r["step_time_s"])
    assert "test numbers" in r["convergence_source"] and "not a prediction" in r["convergence_source"]
    assert "time_to_target_s" not in simulate(load_scenario(TINY)).to_dict()


def test_search_ranks_by_time_to_target_over_global_batch():
    # On the same 8 GPUs a step's time grows about in proportion to the global batch B (more
    # micro-batches) and tokens/s rises a little with B (less pipeline bubble), while the steps to
    # target are 100 (1 + 64 / B) = 900, 200, 112.5: time to target ~ B + 64 grows with B. So the
    # fastest by tokens/s is the largest batch, and the fastest to the target the smallest.
    raw = {**TINY, "convergence": {"source": "test", "batch": {"s_min": 100, "b_noise": 64}}}
    space = SearchSpace(tp=[2], pp=[2], virtual_stages=[1], micro_batch_size=[1], zero_stage=[0],
                        recompute=["none"], sequence_parallel=[False], global_batch_size=[8, 64, 512])
    rows = search(raw, space=space, workers=1, rank_by="time_to_target_s")
    assert [r["parallelism"]["global_batch_size"] for r in rows] == [8, 64, 512]
    assert [r["steps_to_target"] for r in rows] == pytest.approx([900, 200, 112.5])
    times = [r["time_to_target_s"] for r in rows]
    assert times == sorted(times)
    by_rate = search(raw, space=space, workers=1)
    assert [r["parallelism"]["global_batch_size"] for r in by_rate] == [512, 64, 8]


def test_search_rank_by_time_needs_a_convergence_block(capsys):
    assert main(["search", "--rank-by", "time_to_target_s", "--gpus", "8"]) == 2
    assert "convergence" in capsys.readouterr().err
