"""The search's per-candidate checks (simulator/explore/checks.py) against the checks as they were
(``reference=True``: ``build_scenario`` per candidate, ``peak_rank_memory``, the bound priced on its
own): over every candidate of several searches, the same scenario or the same error, the same rows,
memory (within 1e-12 relative) and step-time bounds."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.explore.checks import build_layout, check_layout
from simulator.explore.search import SearchConstraints, SearchSpace, prepare
from simulator.scenario import build_scenario
from tests.test_search_bounds import CASES as BOUND_CASES

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CASES = {**BOUND_CASES,
         # training.framework: torchtitan fills layout fields the mapping leaves out (its profile's fitted_with)
         "torchtitan-llama3-8b": (EXAMPLES / "llama3-8b-torchtitan-sac-h100.yaml", [], None,
                                  SearchSpace(micro_batch_size=[1], virtual_stages=[1], recompute=["none", "full"],
                                              zero_stage=[0, 3])),
         # a balanced split cuts by kernel seconds: micro-batch and recompute move the cut, and with it the
         # stages' parameters (the step's tail is shared across them only under an even split)
         "bert-large-balanced": (EXAMPLES / "bert-large-tp4-dgx-a100.yaml", [], None,
                                 SearchSpace(tp=[1], pp=[2], virtual_stages=[2], micro_batch_size=[1, 2],
                                             zero_stage=[1], recompute=["none", "full"], sequence_parallel=[False],
                                             pp_split=["balanced"])),
         # overlap_moe_comm: a pass's exposed all-to-all share depends on the whole pass (priced whole)
         "deepseek-v3": (EXAMPLES / "deepseek-v3-h800.yaml", [], None,
                         SearchSpace(tp=[2, 4], pp=[2, 4], virtual_stages=[1], micro_batch_size=[1],
                                     recompute=["full"], zero_stage=[1], sequence_parallel=[True]))}

# a space with layouts that fail validation in every way a search meets (pydantic included: a
# micro-batch of 0 is not enumerated by a search, but a caller's mapping may hold one)
EXTRA_POINTS = [{"tp": 3}, {"micro_batch_size": 0}, {"tp": 2, "sequence_parallel": True, "tp_comm_overlap": True},
                {"pp": 2, "virtual_stages": 2, "schedule": "1f1b"}, {"unknown_key": 1}, {"zero_stage": 5}]


def _points(case: str) -> list[dict]:
    source, overrides, gpus, space = CASES[case]
    raw, _, candidates = prepare(str(source) if source else None, overrides, gpus, space, SearchConstraints())
    points = []
    # and a layout given in part (the rest from defaults, or from a framework profile's settings)
    partial = {k: candidates[0][k] for k in ("tp", "pp", "dp", "micro_batch_size", "global_batch_size")}
    for cand in candidates + [{**candidates[0], **extra} for extra in EXTRA_POINTS] + [partial]:
        point = copy.deepcopy(raw)
        point["parallelism"] = cand
        points.append(point)
    return points


def _same(a, b, path="") -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert a == b or (math.isfinite(a) and abs(a - b) <= 1e-12 * max(abs(a), abs(b))), (path, a, b)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("case", sorted(CASES))
def test_scenarios_and_errors_as_built_whole(case):
    for point in _points(case):
        try:
            want = build_scenario(point)
        except ConfigError as exc:
            with pytest.raises(ConfigError) as got:
                build_layout(point)
            assert str(got.value) == str(exc)
            continue
        assert build_layout(point) == want


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_checks_as_the_reference(case):
    points = _points(case)
    extra = len(EXTRA_POINTS) + 1
    for point in points[:-extra][::2] + points[-extra:]:
        fast = check_layout(point, None, True, True)
        reference = check_layout(point, None, True, True, reference=True)
        _same(fast, reference)
