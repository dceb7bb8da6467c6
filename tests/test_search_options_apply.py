"""A search enumerates only layout options that change something for the workload (issue 20: on a CNN,
``recompute: selective`` re-runs nothing, so every selective row duplicated a ``none`` row)."""

from __future__ import annotations

from pathlib import Path

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
