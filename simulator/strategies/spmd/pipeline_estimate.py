"""A pipeline step's length from its passes' times: the critical path of the schedule's own order.

Each pipeline rank runs its passes in the order :func:`~simulator.strategies.spmd.schedule.stage_order`
gives (GPipe, 1F1B, interleaved 1F1B); a forward of global chunk g waits for the same micro-batch's
forward of chunk g - 1 and its send, a backward of chunk g for the backward of chunk g + 1 and its
send (the last chunk's backward for its own forward). With every pass at its kernel time and each
send alone on its link, the step's pipeline time is the longest path through these dependencies:
exact for this schedule model, no more. It is what the approximations in the literature estimate:
GPipe's bubble, (p - 1)/(m + p - 1) of the step for equal stages (Huang et al. 2019, Sec. 2.3);
DAPPLE's latency ``Σ_i (F_i + B_i) + (M - 1) · max_i (F_i + B_i)`` (Fan et al. 2021, PPoPP '21,
Sec. 4.1, its warm-up / steady / ending phases with the pivot stage). For uneven stages that formula
overstates some cuts: at 2 micro-batches on 2 stages, a first stage heavier than the second's
forward and backward together never waits (step ≈ 2·(F_0 + B_0)), which the ``(M - 1)·max`` term
does not see -- ResNet-50 on 8 A100s, pp 2, 2 micro-batches of 256, is fastest cut near layer 82
(stage 0 carries 63% of the compute), not at the 50/50 cut that minimises the slowest stage
(tests/test_pp_split_estimate.py).

Not modelled: the data-parallel all-reduce and optimizer after the last backward, collectives
inside a pass, and contention between sends and other traffic (the engine prices them); zero-bubble
schedules are estimated with 1F1B's order (their B/W split is chosen by the planner from these times).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from simulator.strategies.spmd.schedule import stage_order


def step_estimate_s(schedule: str, micro_batches: int, pp: int, virtual_stages: int,
                    forward_s: Sequence[float], backward_s: Sequence[float], send_s: Sequence[float]) -> float:
    """The makespan of one step's passes: ``forward_s[g]`` / ``backward_s[g]`` are global chunk g's
    pass seconds per micro-batch (chunk g on rank g mod pp), ``send_s[g]`` the seconds of one transfer
    across the cut after chunk g (activations forward, the same bytes of gradient back)."""
    chunks = pp * virtual_stages
    if len(forward_s) != chunks or len(backward_s) != chunks or len(send_s) < chunks - 1:
        raise ValueError("one forward and backward time per chunk, one send per cut")
    order_of = "1f1b" if schedule == "zb-h1" else schedule
    v = virtual_stages if order_of == "interleaved" else 1
    seconds = [*forward_s, *backward_s]
    gaps = [0.0, *send_s[:chunks - 1]]  # gaps[g]: the send into chunk g's forward (none into chunk 0)
    m = micro_batches
    orders = [[(slot, wait, gaps[gap] if gap >= 0 else send_s[-gap - 1] if gap != -chunks - 1 else 0.0,
                seconds[pass_index]) for slot, wait, gap, pass_index in template]
              for template in _templates(order_of, m, pp, v)]
    end: list[float | None] = [None] * (2 * chunks * m)
    position, clock = [0] * pp, [0.0] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for stage in range(pp):
            order, i, t = orders[stage], position[stage], clock[stage]
            while i < len(order):
                slot, wait, gap, seconds = order[i]
                if wait >= 0:
                    ready = end[wait]
                    if ready is None:
                        break
                    ready += gap
                    if ready > t:
                        t = ready
                t += seconds
                end[slot] = t
                i += 1
            if i != position[stage]:
                remaining -= i - position[stage]
                position[stage], clock[stage] = i, t
                progressed = True
        if not progressed:  # an order that waits on itself (internal invariant, not user input)
            raise RuntimeError(f"schedule {schedule!r} deadlocks in the estimate")
    return max(clock)


@lru_cache(maxsize=256)
def _templates(order_of: str, m: int, pp: int, v: int) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
    """Per rank, its passes in order as (slot of its end, slot it waits on or -1, which send precedes
    it: g >= 0 the send into forward chunk g, -(g + 1) the send back out of chunk g + 1 into g,
    -(chunks + 1) none, index into forward + backward seconds): the schedule's shape, the same for
    every cut, built once."""
    chunks = pp * v
    last, out = chunks - 1, []
    for stage in range(pp):
        order = []
        for phase, mb, local in stage_order(order_of, m, pp, stage, v):
            g = local * pp + stage
            if phase == "F":
                order.append((2 * (g * m + mb), 2 * ((g - 1) * m + mb) if g else -1, g, g))
            elif g == last:
                order.append((2 * (g * m + mb) + 1, 2 * (g * m + mb), -chunks - 1, chunks + g))
            else:
                order.append((2 * (g * m + mb) + 1, 2 * ((g + 1) * m + mb) + 1, -(g + 1), chunks + g))
        out.append(tuple(order))
    return tuple(out)
