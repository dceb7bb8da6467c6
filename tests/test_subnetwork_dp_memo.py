"""subnetwork_dp computes each distinct worker's work once per scenario (simulator/strategies/subnetwork_dp.py
``_MEMO``): the memoised work must be what a fresh walk of the graph gives, shared only between subnetworks whose
layers have the same scales, and never carried to another scenario; ``_replaced`` must build the op
``dataclasses.replace`` builds."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from graph_models import ChainSpec
from test_graph_simulate import chain_scenario

from simulator.strategies.subnetwork_dp import (
    _MEMO,
    _MEMO_SCENARIOS,
    SubnetworkDpConfig,
    _replaced,
    _worker_work,
    assignment,
    layer_scale,
    scaled_op,
    worker_work,
)
from workloads.graph import Op


def _scenario(mask: str, masking: str = "forward_backward", blocks: int = 4, recompute: str = "none"):
    sc = chain_scenario(4, ChainSpec(widths=(256,) * blocks, kind="mlp_block"), global_batch_size=4)
    sc = replace(sc, parallelism=sc.parallelism.model_copy(update={"recompute": recompute}))
    return replace(sc, strategy=SubnetworkDpConfig(mask=mask, masking=masking, keep_fraction=0.5, subnetworks=2))


def _fresh(sc, j):
    assign = assignment(sc)
    graph = sc.layer_graph()
    return _worker_work(sc, assign, graph, tuple(layer_scale(sc.strategy, assign, j, layer) for layer in graph.layers))


def test_neuron_masked_subnetworks_share_one_work_equal_to_a_fresh_walk():
    sc = _scenario("neuron")
    works = [worker_work(sc, j) for j in range(2)]
    assert works[0] is works[1]  # every neuron subnetwork keeps the same k of each layer
    assert works[0] == _fresh(sc, 0) and works[0].flops == _fresh(sc, 0).flops
    assert worker_work(sc, 0, assignment(sc)) is works[0]


def test_block_masked_subnetworks_keep_their_own_work():
    sc = _scenario("block")
    a, b = worker_work(sc, 0), worker_work(sc, 1)
    assert a is not b
    assert [layer.name for layer in sc.layer_graph().layers if layer_scale(sc.strategy, assignment(sc), 0, layer).forward
            ] != [layer.name for layer in sc.layer_graph().layers
                  if layer_scale(sc.strategy, assignment(sc), 1, layer).forward]
    assert a == _fresh(sc, 0) and b == _fresh(sc, 1)


def test_another_scenario_gets_its_own_work():
    plain, full = _scenario("block"), _scenario("block", recompute="full")
    a, b = worker_work(plain, 0), worker_work(full, 0)
    assert not a.recompute and b.recompute  # full recompute re-runs the masked forward
    assert b == _fresh(full, 0)
    # an equal scenario built again is another object: its own entry, the same figures
    again = _scenario("block")
    assert worker_work(again, 0) is not a and worker_work(again, 0) == a


def test_the_memo_holds_at_most_its_bound():
    for blocks in range(4, 4 + 20):
        worker_work(_scenario("neuron", blocks=blocks), 0)
    assert len(_MEMO) <= _MEMO_SCENARIOS == 2


def test_replaced_builds_what_dataclasses_replace_builds():
    op = Op("fc.fwd", "gemm", flops=8.0, bytes_moved=3.0, m=4, n=5, k=6, batch=2, recompute_class="attention_core",
            op_sac_share=0.5, weights=1.0, bias=5.0, tables=((5,),), op_class="mlp", kernels=3, backward_bytes=7.0)
    changes = {"flops": 2.0, "bytes_moved": 1.5, "n": 2, "k": 3}
    new = _replaced(op, **changes)
    assert new == dataclasses.replace(op, **changes) and type(new) is Op
    assert op.flops == 8.0 and op.n == 5  # the original is untouched
    for kind in ("gemm", "attention", "memory"):
        src = dataclasses.replace(op, kind=kind)
        assert scaled_op(src, 0.25, 0.5, 0.75) == dataclasses.replace(
            src, flops=2.0, bytes_moved=0.75,
            **({"n": 2, "k": 4} if kind == "gemm" else {"batch": 1} if kind == "attention" else {}))
