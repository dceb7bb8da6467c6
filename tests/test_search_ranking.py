"""The fast path's ranking against the engine's (issue 24: "the ranking of every `search` in
`examples/` is identical for the top 20"): ``search(..., timed_by="fast")`` ranks by the fast path
alone, by the same branch and bound, and must give the engine's top k, in its order. Narrowed spaces
here; benchmarks/bench_search_ranking.py runs every example's own (or the default) space."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.explore.search import SearchSpace, search

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = (["model=gpt-1.7b", "training.seq_length=1024", "parallelism.global_batch_size=64"], 16,
         SearchSpace(micro_batch_size=[1, 2], zero_stage=[1], recompute=["full"]))


def _key(row):
    return tuple(sorted(row["parallelism"].items()))


def _tops(k: int, **kwargs) -> tuple[list[dict], list[dict]]:
    engine = [r for r in search(top_k=k, workers=1, **kwargs) if r.get("evaluated_by") == "engine"]
    fast = [r for r in search(top_k=k, workers=1, timed_by="fast", **kwargs) if r.get("evaluated_by") == "fast"]
    return engine[:k], fast[:k]


def test_fast_path_ranks_the_top_k_as_the_engine_does():
    overrides, gpus, space = SMALL
    engine, fast = _tops(6, source=None, overrides=overrides, num_gpus=gpus, space=space)
    assert len(engine) == 6
    assert [_key(r) for r in fast] == [_key(r) for r in engine]
    for f, e in zip(fast, engine, strict=True):
        assert f["step_time_s"] == pytest.approx(e["fast_step_time_s"], rel=1e-9)  # the fast path's own
        assert f["engine_step_time_s"] is None and e["engine_step_time_s"] == e["step_time_s"]
        assert f["step_time_s"] == pytest.approx(e["step_time_s"], rel=0.005 if e.get("fast_path_approximation") is None
                                                 else 0.03)


RANKED_EXAMPLES = {  # narrowed so that both searches take seconds
    "bert-large-tp4-dgx-a100.yaml": SearchSpace(tp=[1, 4], micro_batch_size=[32], zero_stage=[0],
                                                recompute=["none", "full"]),
    "gpt-1.7b-two-regions-wan.yaml": SearchSpace(tp=[4, 8], pp=[2, 4], micro_batch_size=[1, 4], zero_stage=[1],
                                                 recompute=["full"], virtual_stages=[1]),
    "mixed-a100-t4.yaml": SearchSpace(micro_batch_size=[1, 2], zero_stage=[1], recompute=["none", "full"]),
    "resnet50-8xa100.yaml": SearchSpace(tp=[1], micro_batch_size=[64, 256], recompute=["none"], virtual_stages=[1],
                                        sequence_parallel=[False]),
    "gpt3-175b-1024-a100.yaml": SearchSpace(tp=[8], pp=[4, 8], micro_batch_size=[1], zero_stage=[1],
                                            recompute=["selective", "full"]),
}


UNMET = {  # example -> why its fast-path ranking is not yet the engine's (issue 24 target, strict xfail)
    "mixed-a100-t4.yaml": "the engine's #15-#17 (2,654.8 / 2,661.6 / 2,670.5 ms, 0.6% apart) come out #16, #17, "
                          "#15: the fast path's contention correction puts tp 1 pp 2 vp 2 (full recompute, "
                          "A100+T4) at 2,654.6 ms, -0.60% (within issue 24's 3% for contended layouts, not "
                          "close enough to order ties 0.3% apart)",
}


@pytest.mark.slow
@pytest.mark.parametrize("example", [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=UNMET[name]))
                                     if name in UNMET else name for name in sorted(RANKED_EXAMPLES)])
def test_fast_path_ranking_is_the_engines_on_the_examples(example):
    engine, fast = _tops(20, source=str(EXAMPLES / example), space=RANKED_EXAMPLES[example])
    assert engine
    assert [_key(r) for r in fast] == [_key(r) for r in engine]
