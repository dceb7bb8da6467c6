"""Conservation invariants of the simulated timeline over random small layouts (hypothesis), added by the
session-15 audit (tests/test_properties.py checks that the breakdown adds up to the step; these check the
timeline it is read from):

- no two tasks overlap on one stream of one rank (a CUDA stream runs its kernels in order, one at a time;
  the compute stream carries compute, recompute and the optimizer);
- every rank's busy time on its compute stream plus its idle time is the step: every task lies inside
  [0, makespan], so busy <= makespan and idle = makespan - busy >= 0;
- FLOPs are conserved: the hardware FLOPs of the step (HFU's numerator) are the FLOPs every rank's kernels run,
  summed over the timeline (the session-15 audit found them 18-43% above it under causal fused attention: the
  skipped tiles were counted);
- bytes are conserved per transfer: every task that moves bytes puts as many on receive ports as on
  transmit ports (a collective's ring step and a pipeline send: what one rank sends another receives;
  ``rank:link_tx`` / ``rank:link_rx`` demands, simulator/strategies/spmd/plan_costs.py ``comm_task``).

Layouts from tests/test_properties.py (DGX A100, 8-layer GPT, 8 or 16 GPUs, any tp/pp/dp, ZeRO stage,
schedule, recompute); full mode with kernel detail, so every rank's every task is on the timeline.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given

from simulator.simulate import simulate
from tests.test_properties import SETTINGS, layouts, scenario

EPS = 1e-12


def _run(layout):
    num_gpus, par = layout
    plans = []
    result = simulate(scenario(num_gpus, par), mode="full", detail=True,
                      observe=lambda micro_batches, plan: plans.append(plan))
    return result, plans


@SETTINGS
@given(layout=layouts())
def test_no_two_tasks_overlap_on_a_stream_busy_fits_the_step_and_kernels_run_the_hardware_flops(layout):
    result, _ = _run(layout)
    makespan = result.makespan_s
    by_stream = defaultdict(list)
    for e in result.timeline:
        assert -EPS <= e.start_s <= e.end_s <= makespan * (1 + 1e-12) + EPS, e
        by_stream[(e.rank_class, e.stream)].append(e)
    assert any(stream == "compute" for _, stream in by_stream)
    for (rank, stream), events in by_stream.items():
        events.sort(key=lambda e: (e.start_s, e.end_s))
        for a, b in zip(events, events[1:], strict=False):
            assert b.start_s >= a.end_s - 1e-12 * max(1.0, makespan), (rank, stream, a, b)
        if stream == "compute":
            busy = sum(e.end_s - e.start_s for e in events)
            assert makespan - busy >= -1e-12 * makespan  # idle = step - busy is never negative
    run = sum(dict(e.args).get("flops", 0.0) for e in result.timeline)
    assert abs(run - result.hardware_flops_per_step) <= 1e-9 * result.hardware_flops_per_step


@SETTINGS
@given(layout=layouts())
def test_every_transfer_receives_the_bytes_it_sends(layout):
    _, plans = _run(layout)
    moved = 0
    for plan in plans:
        for tasks in plan.streams.values():
            for task in tasks:
                if not task.demands:
                    continue
                tx = sum(b for port, b in task.demands.items() if port.endswith("_tx"))
                rx = sum(b for port, b in task.demands.items() if port.endswith("_rx"))
                assert abs(tx - rx) <= 1e-9 * max(tx, rx), (task.name, task.demands)
                moved += tx > 0
    num_gpus, par = layout
    if par["tp"] > 1 or par["pp"] > 1 or num_gpus // (par["tp"] * par["pp"]) > 1:
        assert moved  # a layout that communicates moved bytes
