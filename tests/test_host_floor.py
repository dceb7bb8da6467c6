"""The host-side floor of a pipeline stage whose neighbour is on another node
(simulator/cost/host_floor.py): exact step times on the toy GPT of tests/test_simulate.py.

Toy: L = 4 layers, pp = 2 (2 layers per stage), tp = dp = 1, micro-batch 1, m micro-batches; a
layer's forward takes t = T_LAYER, its backward 2t, so F + B = 3t = 2.8186 ms per layer. Pipeline
sends and the LM head cost ~1e-15 s. 1F1B without a floor: step = (m + p - 1)·2·3t.
With a floor of 10 ms per layer above 3t, every layer pass is stretched by 10 ms / 3t: a stage's
forward + backward of one micro-batch takes 2·10 ms, so step = (m + 1)·20 ms, the critical stage
busy m·2·3t of it and stalled m·2·(10 ms - 3t)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from hardware_specs.schema import CrossNodePipelineFloor
from simulator.cost.host_floor import (
    floor_per_layer_s,
    has_cross_node_neighbour,
    issue_bound_s,
    stretch,
)
from simulator.cost.topology import RankLayout, Topology
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.layout import Parallelism

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import MODES, T_LAYER, toy_raw  # noqa: E402

FLOOR = {"per_layer_us": 6000.0, "per_layer_per_tp_rank_us": 4000.0, "source": "toy"}  # 10 ms at tp 1
FLOOR_S = 10e-3


def _pipeline(m: int, gpus_per_node: int, floor: dict | None = FLOOR, pp: int = 2, tp: int = 1, **par):
    raw = toy_raw(pp * tp, pp=pp, tp=tp, global_batch_size=m, **par)
    node = raw["cluster"]["node"]
    node["gpus_per_node"] = gpus_per_node
    node["nics_per_node"] = gpus_per_node
    if floor is not None:
        node["accelerator"]["efficiency"]["cross_node_pipeline_floor"] = copy.deepcopy(floor)
    return load_scenario(raw)


def test_the_floor_formula_and_the_stretch():
    spec = CrossNodePipelineFloor.model_validate(FLOOR)
    assert spec.per_layer_s(1) == pytest.approx(10e-3) and spec.per_layer_s(8) == pytest.approx(38e-3)
    assert stretch(2.0, 5.0) == 2.5 and stretch(5.0, 2.0) == 1.0 and stretch(1.0, 0.0) == 1.0


def test_a_floor_listed_for_a_tp_degree_overrides_the_rule():
    spec = CrossNodePipelineFloor.model_validate({**FLOOR, "per_layer_us_by_tp": {2: 9000.0, 8: 20000.0}})
    assert spec.per_layer_s(2) == pytest.approx(9e-3)       # listed: not 6 + 4·2 = 14 ms
    assert spec.per_layer_s(8) == pytest.approx(20e-3)
    assert spec.per_layer_s(4) == pytest.approx(22e-3)      # not listed: the rule, 6 + 4·4 ms


@pytest.mark.parametrize("table", [{0: 1000.0}, {2: -1.0}])
def test_a_floor_table_needs_positive_degrees_and_non_negative_floors(table):
    with pytest.raises(ValueError, match="per_layer_us_by_tp"):
        CrossNodePipelineFloor.model_validate({**FLOOR, "per_layer_us_by_tp": table})


@pytest.mark.parametrize(("mode", "detail"), MODES)
@pytest.mark.parametrize("m", [1, 4])
def test_stages_on_two_nodes_run_at_the_floor(mode, detail, m):
    r = simulate(_pipeline(m, gpus_per_node=1), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx((m + 1) * 2 * FLOOR_S, rel=1e-9)
    assert r.time_breakdown_s["host_stall"] == pytest.approx(m * 2 * (FLOOR_S - 3 * T_LAYER), rel=1e-9)
    assert r.time_breakdown_s["compute"] == pytest.approx(m * 2 * 3 * T_LAYER, rel=1e-9)


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_the_floor_covers_the_recomputed_forward_too(mode, detail):
    # Full recompute: F + R + B = 4t = 3.76 ms per layer, still below the 10 ms floor, so a
    # stage's micro-batch takes 2·10 ms as before; the stall is what the floor adds to 4t.
    r = simulate(_pipeline(4, gpus_per_node=1, recompute="full"), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(5 * 2 * FLOOR_S, rel=1e-9)
    assert r.time_breakdown_s["host_stall"] == pytest.approx(4 * 2 * (FLOOR_S - 4 * T_LAYER), rel=1e-9)


def test_zero_bubble_passes_are_floored_alike_in_both_modes():
    # zb-h1 splits the backward into input- and weight-gradient passes; stretched by the same
    # factor they still sum to the floor per layer and micro-batch: a stage's m micro-batches
    # take at least m·2·10 ms, and symmetric and full mode agree.
    steps = [simulate(_pipeline(4, gpus_per_node=1, schedule="zb-h1"), mode=mode).step_time_s
             for mode in ("symmetric", "full")]
    assert steps[0] == pytest.approx(steps[1], rel=1e-9)
    assert 4 * 2 * FLOOR_S <= steps[0] <= (4 + 1) * 2 * FLOOR_S * (1 + 1e-9)


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_no_floor_on_one_node_without_a_spec_or_below_the_device_time(mode, detail):
    plain = (4 + 1) * 2 * 3 * T_LAYER
    for scenario in (_pipeline(4, gpus_per_node=8),                   # both stages on one node
                     _pipeline(4, gpus_per_node=1, floor=None),       # no floor in the spec
                     _pipeline(4, gpus_per_node=1, floor={**FLOOR, "per_layer_us": 0.0,
                                                          "per_layer_per_tp_rank_us": 1000.0})):  # 1 ms < 3t
        r = simulate(scenario, mode=mode, detail=detail)
        assert r.step_time_s == pytest.approx(plain, rel=1e-9)
        assert r.time_breakdown_s["host_stall"] == 0.0


def test_the_floor_grows_with_tp():
    # tp = 2 halves the kernels (3t/2 per layer, no TP traffic cost: NVLink at 1e12 GB/s, no
    # latency) and raises the floor to 6 + 4·2 = 14 ms per layer.
    r = simulate(_pipeline(2, gpus_per_node=2, tp=2))
    assert r.step_time_s == pytest.approx(3 * 2 * 14e-3, rel=1e-6)
    # The same layout with the floor listed at tp = 2 (9 ms) runs at the listed floor.
    listed = simulate(_pipeline(2, gpus_per_node=2, tp=2, floor={**FLOOR, "per_layer_us_by_tp": {2: 9000.0}}))
    assert listed.step_time_s == pytest.approx(3 * 2 * 9e-3, rel=1e-6)


def test_which_stages_have_a_neighbour_on_another_node():
    # pp 4 on two nodes of 2 GPUs: stages 0-1 on node 0, 2-3 on node 1; only 1 and 2 border.
    par = Parallelism(pp=4, dp=1)
    layout = RankLayout(par)
    node = _pipeline(4, gpus_per_node=2, pp=4).node
    topology = Topology(node, load_scenario(toy_raw(4, pp=4, global_batch_size=4)).fabric, 4)
    assert [has_cross_node_neighbour(layout, topology, layout.representative(s)) for s in range(4)] == \
        [False, True, True, False]
    spec = CrossNodePipelineFloor.model_validate(FLOOR)
    assert [floor_per_layer_s(spec, layout, topology, layout.representative(s)) for s in range(4)] == \
        [0.0, pytest.approx(FLOOR_S), pytest.approx(FLOOR_S), 0.0]
    assert floor_per_layer_s(None, layout, topology, 1) == 0.0


# --------------------------------------------------------------------------- eager dispatch floor

def test_issue_bound_pass_ends_between_the_longer_and_the_sum():
    # host 2 s per kernel: kernel i starts at max(its issue 2i, the previous end)
    assert issue_bound_s([1.0, 1.0, 1.0], 2.0) == 7.0           # host-bound: 3·2 + the last kernel's 1
    assert issue_bound_s([5.0, 1.0, 1.0], 1.0) == 8.0           # GPU-bound after the first issue: 1 + 7
    assert issue_bound_s([1.0, 5.0, 1.0], 2.0) == 10.0          # 3, then max(3, 4) + 5 = 9, then 9 + 1
    assert issue_bound_s([], 2.0) == 0.0


def _eager(m: int, host_us: float | None, tp: int = 1, **par):
    raw = toy_raw(tp, tp=tp, global_batch_size=m, **par)
    raw["cluster"]["node"]["accelerator"]["efficiency"]["host_dispatch_us_per_kernel"] = host_us
    return load_scenario(raw)


@pytest.mark.parametrize(("mode", "detail"), MODES)
@pytest.mark.parametrize(("tp", "kernels"), [(1, 12 + 16), (2, 14 + 18)])
def test_a_host_bound_layer_takes_its_kernel_count_times_the_host_time(mode, detail, tp, kernels):
    # Toy GPT, L = 4, one GPU (tp 1) or two (tp 2, NVLink free), m = 3, host 10 ms per kernel, far above
    # any kernel: each pass ends one host time per op after it starts, plus its last kernel (a
    # layernorm gradient or a residual add, ~1e-15 s). A layer's forward has 12 ops and its backward
    # 16 (tests/test_simulate.py), and tp 2 adds an all-reduce after attention and after the MLP in
    # each; the embedding and head passes are not floored (~0 s). Step = m·L·kernels·10 ms.
    r = simulate(_eager(3, 10_000.0, tp=tp), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(3 * 4 * kernels * 10e-3, rel=1e-9)
    assert r.time_breakdown_s["host_stall"] == pytest.approx(r.step_time_s - 3 * 3 * 4 * T_LAYER / tp, rel=1e-6)


@pytest.mark.parametrize(("mode", "detail"), MODES)
def test_the_eager_floor_covers_the_recomputed_forward_and_adds_nothing_when_unset(mode, detail):
    # Full recompute: the backward pass re-runs the 12 forward ops before its 16 -> 40 per layer.
    r = simulate(_eager(2, 10_000.0, recompute="full"), mode=mode, detail=detail)
    assert r.step_time_s == pytest.approx(2 * 4 * 40 * 10e-3, rel=1e-9)
    plain = simulate(_eager(2, None), mode=mode, detail=detail)
    assert plain.step_time_s == pytest.approx(2 * 3 * 4 * T_LAYER, rel=1e-9)
    assert plain.time_breakdown_s["host_stall"] == 0.0


def test_a_small_host_time_delays_each_pass_by_its_first_issue_only():
    # 1 ns per kernel, far below every GEMM: each pass (forward, backward) waits for its first two
    # issues only -- a layernorm or residual op of ~0 s, then its first GEMM at 2 ns -- and the queue
    # stays ahead after that: 2 passes x 2 ns per layer and micro-batch.
    r = simulate(_eager(3, 1e-3))
    assert r.step_time_s == pytest.approx(3 * 3 * 4 * T_LAYER + 3 * 4 * 2 * 2e-9, rel=1e-9)
