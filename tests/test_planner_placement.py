"""DAPPLE's placement rule (each stage inside one node or on whole nodes from a node boundary) as a
check of one replica vector, :func:`~simulator.explore.planners.dapple.placement_accepts`: the same
answer as membership in the enumeration :func:`~simulator.explore.planners.dapple.replica_vectors`,
which grows exponentially with the GPU count (the adaptive planner's pipeline choice enumerated it
to test one vector and did not finish at 16,384 GPUs in 25 minutes)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from simulator.explore.planners.component_pipeline import pipeline_candidates
from simulator.explore.planners.components import find_components
from simulator.explore.planners.dapple import placement_accepts, replica_vectors
from simulator.explore.planners.oracle import per_layer_pricer
from simulator.explore.sweep import absolutize
from simulator.scenario import load_raw

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("gpus_per_node", [1, 2, 3, 4, 8])
def test_placement_accepts_exactly_the_enumerated_vectors(gpus_per_node):
    for gpus in range(1, 13):
        for stages in range(1, 5):
            enumerated = set(replica_vectors(gpus, gpus_per_node, stages))
            every = [v for v in itertools.product(range(1, gpus + 1), repeat=stages) if sum(v) == gpus]
            assert {v for v in every if placement_accepts(v, gpus_per_node)} == enumerated


def test_placement_rule_by_hand():
    assert placement_accepts((8, 8), 8) and placement_accepts((16, 16), 8)     # whole nodes
    assert placement_accepts((2, 6, 8), 8)                                     # inside node 0, then node 1
    assert not placement_accepts((4, 8, 4), 8)                                 # 8 GPUs across a node boundary
    assert not placement_accepts((8, 12, 12), 8)                               # 12: not whole nodes


def test_pipeline_candidates_at_16384_gpus():
    raw, base = load_raw(ROOT / "examples" / "llama3-405b-16k-h100.yaml")
    raw = absolutize(raw, base)
    raw["parallelism"]["global_batch_size"] = 16384  # one sequence per replica of one stage
    _, pricer = per_layer_pricer(raw)
    candidates, estimated = pipeline_candidates(raw, find_components(pricer.graph), max_stages=4)
    assert estimated == len(candidates) > 0
    # 3 stages do not divide 16,384 GPUs; 1, 2 and 4 equal stages are whole nodes each
    assert {c.replicas for c in candidates} == {(16384,), (8192,) * 2, (4096,) * 4}
