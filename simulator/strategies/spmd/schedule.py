"""Pipeline schedules: the order in which one pipeline rank runs forward and backward passes.

Each item is ``(phase, micro_batch, chunk)`` with phase "F", "B" or (zero-bubble) "W" and ``chunk`` the local
model chunk (0 unless interleaved). Dependencies between ranks (activations forward,
gradients backward) are added by the planner; this module only orders one rank's work.

- GPipe (Huang et al. 2019): all forwards, then all backwards (reverse order).
  Bubble (p-1)/(m+p-1) of the step.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2.1): p-i-1 warm-up forwards, then
  one forward / one backward alternately, then cool-down backwards. Same bubble as GPipe,
  at most p-i micro-batches in flight.
- Interleaved 1F1B (Narayanan et al. 2021 Sec. 2.2.2; Megatron-LM ``schedules.py``):
  v chunks per rank, chunk c of rank i is global chunk c·p + i; warm-up
  (p-i-1)·2 + (v-1)·p chunk-passes; bubble shrinks by v: (p-1)/(v·m) of the ideal time.
"""

from __future__ import annotations

import functools
import heapq

from simulator.errors import ConfigError

Item = tuple[str, int, int]


def gpipe(num_micro_batches: int) -> list[Item]:
    forward = [("F", m, 0) for m in range(num_micro_batches)]
    backward = [("B", m, 0) for m in reversed(range(num_micro_batches))]
    return forward + backward


@functools.lru_cache(maxsize=8)
def _passes(num_micro_batches: int) -> tuple[tuple[Item, ...], tuple[Item, ...]]:
    """Every micro-batch's forward and backward item of a one-chunk schedule, made once per count: the
    stages' orders (64 of them on Megatron-1T's pp 64) share them rather than each making its own."""
    return (tuple(("F", m, 0) for m in range(num_micro_batches)),
            tuple(("B", m, 0) for m in range(num_micro_batches)))


def one_f_one_b(num_micro_batches: int, pp: int, stage: int) -> list[Item]:
    forward, backward = _passes(num_micro_batches)
    warmup = min(pp - stage - 1, num_micro_batches)
    order: list[Item] = list(forward[:warmup])
    next_b = 0
    for next_f in range(warmup, num_micro_batches):
        order.append(forward[next_f])
        order.append(backward[next_b])
        next_b += 1
    order += backward[next_b:]
    return order


def zero_bubble(num_micro_batches: int, pp: int, t_f: float, t_b: float, t_w: float,
                t_comm: float = 0.0) -> list[list[Item]]:
    """Zero-bubble orders for every stage (Qi et al. 2024, "Zero Bubble Pipeline Parallelism").

    The backward is split into B (input gradient, sent upstream at once) and W (weight
    gradient, needed only by the optimizer). Orders come from a list schedule on the pass
    times, as the paper's scheduler does: each stage runs a B whose gradient has arrived, else
    an F whose input has arrived while at most p-i micro-batches are in flight (1F1B's memory,
    as in ZB-H1), else a pending W to fill what would be bubble. With equal F, B, W times
    this reaches ZB-H1's step m(F+B+W) + (p-1)(F+B-W), against 1F1B's (m+p-1)(F+B+W)."""
    m, p = num_micro_batches, pp
    free = [0.0] * p
    next_f, in_flight = [0] * p, [0] * p
    f_ready: list[dict[int, float]] = [{mb: 0.0 for mb in range(m)}] + [{} for _ in range(p - 1)]
    b_ready: list[dict[int, float]] = [{} for _ in range(p)]
    pending_w: list[list[int]] = [[] for _ in range(p)]
    orders: list[list[Item]] = [[] for _ in range(p)]

    def candidate(i: int):
        """Stage i's next item as (start, kind, micro-batch), or None: what the rule above picks."""
        t = free[i]
        options = []
        if b_ready[i]:
            mb = min(b_ready[i])
            options.append((max(t, b_ready[i][mb]), 0, "B", mb))
        if next_f[i] < m and next_f[i] in f_ready[i] and in_flight[i] < p - i:
            options.append((max(t, f_ready[i][next_f[i]]), 1, "F", next_f[i]))
        startable = [o for o in options if o[0] <= t]
        if startable:
            start, _, kind, mb = min(startable, key=lambda o: o[1])
        elif pending_w[i]:
            start, kind, mb = t, "W", pending_w[i][0]
        elif options:
            start, _, kind, mb = min(options)
        else:
            return None
        return start, kind, mb

    # The earliest candidate over the stages runs next (ties: the lower stage). Running an item
    # on stage i changes only stages i-1, i and i+1 (its free time and queues, the activation
    # it sends down, the gradient it sends up), so only their candidates are recomputed; they
    # sit in a heap, and an entry whose stage has been recomputed since is skipped when popped.
    version = [0] * p
    heap = []

    def refresh(j: int) -> None:
        version[j] += 1
        item = candidate(j)
        if item is not None:
            start, kind, mb = item
            heapq.heappush(heap, ((start, j), version[j], kind, mb))

    for i in range(p):
        refresh(i)
    for _ in range(3 * m * p):
        while heap and heap[0][1] != version[heap[0][0][1]]:
            heapq.heappop(heap)
        if not heap:
            break
        (start, i), _, kind, mb = heapq.heappop(heap)
        if kind == "F":
            end = start + t_f
            next_f[i] += 1
            in_flight[i] += 1
            del f_ready[i][mb]
            (f_ready[i + 1] if i + 1 < p else b_ready[i])[mb] = end + (t_comm if i + 1 < p else 0.0)
        elif kind == "B":
            end = start + t_b
            in_flight[i] -= 1
            del b_ready[i][mb]
            pending_w[i].append(mb)
            if i > 0:
                b_ready[i - 1][mb] = end + t_comm
        else:
            end = start + t_w
            pending_w[i].pop(0)
        free[i] = end
        orders[i].append((kind, mb, 0))
        for j in (i - 1, i, i + 1):
            if 0 <= j < p:
                refresh(j)
    return orders


def _interleaved_chunk(k: int, pp: int, v: int, forward: bool) -> int:
    chunk = (k % (pp * v)) // pp
    return chunk if forward else v - 1 - chunk


def _interleaved_micro_batch(k: int, pp: int, v: int) -> int:
    group, within = divmod(k, pp * v)
    return group * pp + within % pp


def interleaved(num_micro_batches: int, pp: int, stage: int, v: int) -> list[Item]:
    if num_micro_batches % pp:
        raise ConfigError("parallelism.global_batch_size", "interleaved needs micro-batches divisible by pp")
    total = num_micro_batches * v
    warmup = min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    order: list[Item] = []

    def fwd(k: int) -> Item:
        return ("F", _interleaved_micro_batch(k, pp, v), _interleaved_chunk(k, pp, v, True))

    def bwd(k: int) -> Item:
        return ("B", _interleaved_micro_batch(k, pp, v), _interleaved_chunk(k, pp, v, False))

    order += [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(fwd(k + warmup))
        order.append(bwd(k))
    order += [bwd(k) for k in range(total - warmup, total)]
    return order


def stage_order(schedule: str, num_micro_batches: int, pp: int, stage: int, virtual_stages: int = 1) -> list[Item]:
    """The order of passes on pipeline rank ``stage`` for ``schedule``."""
    if schedule == "gpipe" or pp == 1:
        return gpipe(num_micro_batches) if schedule == "gpipe" else one_f_one_b(num_micro_batches, 1, 0)
    if schedule == "1f1b":
        return one_f_one_b(num_micro_batches, pp, stage)
    if schedule == "interleaved":
        return interleaved(num_micro_batches, pp, stage, virtual_stages)
    raise ConfigError("parallelism.schedule", f"unknown schedule {schedule!r}")


def ideal_bubble_fraction(schedule: str, num_micro_batches: int, pp: int, virtual_stages: int = 1) -> float:
    """Bubble as a fraction of the whole step: (p-1)/(v·m + p-1) (GPipe/1F1B: v = 1)."""
    v = virtual_stages if schedule == "interleaved" else 1
    return (pp - 1) / (v * num_micro_batches + pp - 1)
