"""The planners' costs at 16,384 GPUs. DAPPLE's placement rule (each stage inside one node or on whole nodes from a node boundary) as a
check of one replica vector, :func:`~simulator.explore.planners.dapple.placement_accepts`: the same
answer as membership in the enumeration :func:`~simulator.explore.planners.dapple.replica_vectors`,
which grows exponentially with the GPU count (the adaptive planner's pipeline choice enumerated it
to test one vector and did not finish at 16,384 GPUs in 25 minutes); and the per_layer kind's exact
reshard volumes counted in O(devices) (simulator/strategies/per_layer/sharding.py), equal to the
(devices x devices) definition to the bit."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.explore.planners.component_pipeline import pipeline_candidates
from simulator.explore.planners.components import find_components
from simulator.explore.planners.dapple import placement_accepts, replica_vectors
from simulator.explore.planners.oracle import per_layer_pricer
from simulator.explore.sweep import absolutize
from simulator.scenario import load_raw
from simulator.strategies.per_layer.config import Split
from simulator.strategies.per_layer.sharding import (
    _dense_elements,
    _exact_elements,
    adjoint,
    input_layout,
    output_layout,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("gpus_per_node", [1, 2, 3, 4, 8])
def test_placement_accepts_exactly_the_enumerated_vectors(gpus_per_node):
    for gpus in range(1, 13):
        for stages in range(1, 5):
            enumerated = set(replica_vectors(gpus, gpus_per_node, stages))
            every = [v for v in itertools.product(range(1, gpus + 1), repeat=stages) if sum(v) == gpus]
            assert {v for v in every if placement_accepts(v, gpus_per_node)} == enumerated


@pytest.mark.parametrize("gpus_per_node", [1, 3, 4, 8])
def test_replica_vectors_dividing_the_batch_are_the_enumeration_filtered(gpus_per_node):
    # DAPPLE enumerates only the vectors whose counts divide the global batch (no other yields a plan):
    # the same vectors in the same order as the whole enumeration filtered, so its estimates and their
    # order (the serial that breaks ties) are unchanged
    for gpus in (1, 6, 12, 16, 24, 40):
        for stages in range(1, 5):
            every = replica_vectors(gpus, gpus_per_node, stages)
            for batch in (1, 2, 6, 8, 12, 16, 24, 64, 96, 120):
                kept = [v for v in every if all(batch % r == 0 for r in v)]
                assert replica_vectors(gpus, gpus_per_node, stages, dividing=batch) == kept


def test_replica_vectors_dividing_the_batch_at_16384_gpus():
    # the whole enumeration has 1,427,508,223 vectors of 4 stages here; those dividing 32,768 are few
    vectors = replica_vectors(16384, 8, 4, dividing=32768)
    assert 0 < len(vectors) < 10_000
    assert all(sum(v) == 16384 and placement_accepts(v, 8) and all(32768 % r == 0 for r in v) for v in vectors)
    assert (4096,) * 4 in vectors and (8, 8, 8192, 8176) not in vectors


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


def test_dapple_plans_16384_gpus():
    # before the enumeration was restricted to vectors dividing the batch, DAPPLE's planner walked every
    # placement-valid vector (1.4 billion of 4 stages here) and did not finish; now ~1.2 CPU-s
    from simulator.explore.planners.dapple import run_dapple

    raw, base = load_raw(ROOT / "examples" / "vgg16-dapple-v100.yaml")
    raw = absolutize(raw, base)
    raw["cluster"]["num_gpus"] = 16384
    raw["parallelism"]["global_batch_size"] = 16384
    result = run_dapple(raw, {})
    stages = result.scenario["strategy"]["stages"]
    assert result.step_time_s is not None and sum(s["replicas"] for s in stages) == 16384
    assert sum(s["layers"] for s in stages) == 40 and 0 < result.plans_estimated < 1000


# --------------------------------------------------------------------------- reshard volumes in O(devices)

_KINDS = ("attention", "conv2d", "linear", "relu", "batchnorm")
_split = st.builds(Split, batch=st.sampled_from([1, 2, 3, 4]), sequence=st.sampled_from([1, 2]),
                   rows=st.sampled_from([1, 2, 3]), cols=st.sampled_from([1, 2]),
                   channels=st.sampled_from([1, 2, 4]), heads=st.sampled_from([1, 2]),
                   reduction=st.sampled_from([1, 2, 3]))


@settings(max_examples=150, deadline=None)
@given(a=_split, b=_split, producer=st.sampled_from(_KINDS), consumer=st.sampled_from(_KINDS),
       shape=st.sampled_from([(6, 5, 7), (7, 12), (10,), (4, 9, 9)]), batch=st.sampled_from([4, 5, 12]))
def test_reshard_volumes_equal_the_dense_definition_to_the_bit(a, b, producer, consumer, shape, batch):
    # the O(devices) counts of sharding._exact_elements against the (devices x devices) overlap matrix,
    # forward (partial sums reduced first, as plan_reshard does) and backward (the adjoint)
    src = output_layout(SimpleNamespace(kind=producer, output_shape=shape), a, batch, shape)
    dst = input_layout(SimpleNamespace(kind=consumer), b, batch, shape)
    grad_src, grad_dst = adjoint(src, dst)
    for x, y in ((replace(src, partial=1), dst), (replace(grad_src, partial=1), grad_dst)):
        assert _exact_elements.__wrapped__(x, y) == _dense_elements(x, y)
