"""A search enumerates only layout options that change something for the workload (issue 20: on a CNN,
``recompute: selective`` re-runs nothing, so every selective row duplicated a ``none`` row)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.explore.search import SearchConstraints, SearchSpace, prepare

ROOT = Path(__file__).resolve().parents[1]


def _recomputes(example: str, **space) -> tuple[list[str], int]:
    _, _, candidates = prepare(str(ROOT / "examples" / example), [], None, SearchSpace(**space), SearchConstraints())
    return sorted({c["recompute"] for c in candidates}), len(candidates)


def test_selective_recompute_is_not_enumerated_where_the_model_has_no_attention_core():
    everything, n = _recomputes("resnet50-8xa100.yaml")
    assert everything == ["full", "none"]
    asked, n_asked = _recomputes("resnet50-8xa100.yaml", recompute=["selective"])
    assert asked == ["none"] and n_asked * 2 == n   # asked for alone, it is the "none" layouts


def test_a_transformer_keeps_selective_recompute():
    # 1,860 layouts: the default micro-batches are 1 and the powers of two splitting 1536/dp (tests/test_search_space.py)
    assert _recomputes("gpt3-175b-1024-a100.yaml") == (["full", "none", "selective"], 1860)


def _resnet(pp: int, mbs: int, gbs: int, recompute: str = "none"):
    from simulator.scenario import load_scenario

    # the catalog constants (no framework profile): the fold points below are where this run settles (pp 4:
    # [28, 32] until the gradient sums of 403489d changed the chunks' durations; it now settles at 44)
    return load_scenario(str(ROOT / "examples" / "resnet50-8xa100.yaml"), [
        "training.framework=megatron-core", f"parallelism.pp={pp}", "parallelism.virtual_stages=2", "parallelism.schedule=interleaved", "parallelism.dp=auto",
        f"parallelism.micro_batch_size={mbs}", f"parallelism.global_batch_size={gbs}", f"parallelism.recompute={recompute}"])


# the engine's one run: the fold's points (22, 24) and (44, 48) and two periods more (one run since 2026-12-06)
@pytest.mark.parametrize("pp,mbs,gbs,points", [(2, 1, 1024, [28]), (4, 4, 4096, [56])])
def test_a_resnet_interleaved_pipeline_that_settles_late_folds_as_unrolled(pp, mbs, gbs, points):
    """A global-batch search on ResNet-50 (issue 20) unrolled its interleaved layouts, thousands of
    micro-batches each (the fold's first points, from 3p, fall while its uneven chunks still settle);
    the fold now also tries from 4p, 6p and 10p, and gives the unrolled run's figures (1e-9)."""
    from simulator.simulate import simulate

    scenario = _resnet(pp, mbs, gbs)
    folded, unrolled = simulate(scenario), simulate(scenario, fold=False)
    assert folded.extra["engine_fold"]["micro_batches_evaluated"] == points
    step = unrolled.step_time_s
    assert folded.step_time_s == pytest.approx(step, rel=1e-9)
    for key, value in unrolled.time_breakdown_s.items():
        assert folded.time_breakdown_s[key] == pytest.approx(value, rel=1e-9, abs=1e-9 * step), key
    assert folded.simulated_peak_memory_gib == pytest.approx(unrolled.simulated_peak_memory_gib, rel=1e-9)
