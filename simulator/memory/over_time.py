"""Memory over time from a kind's analytic breakdown: which task allocates and which frees what.

A strategy kind's ``memory`` function gives each actor's peak as a :class:`~simulator.memory.analytic.
MemoryBreakdown`; its plan gives the engine the same bytes over time (``Plan.memory_base_bytes`` and
``Task.alloc_bytes`` / ``Task.free_bytes``, simulator/strategies/plan.py), and the engine's counter per
actor is the simulated peak (``simulated_peak_memory_gib``, printed under the memory table, a sweep
column, ``--json``). :class:`MemoryLedger` does that from the breakdown itself, so the two count the
same bytes and differ only where the plan's order of passes holds more or less than the analytic count
assumes:

- held from the start (:attr:`MemoryLedger.base_bytes`): weights, optimizer state and the buffers
  (``other``);
- a forward pass allocates one micro-batch's saved activations (``micro_batch_bytes``) at its start;
- a backward pass holds the rematerialisation working set (``working_bytes``) while it runs and frees
  it and its micro-batch's activations at its end; the actor's first backward after an update allocates
  its gradients (``gradients_bytes`` of the breakdown) at its start;
- the optimizer step frees the gradients at its end (``zero_grad(set_to_none=True)``).

So with K micro-batches in flight at the first backward the simulated peak is base + gradients +
K · micro-batch + working: the analytic total when ``activations_bytes`` = K · micro-batch + working,
as the kinds using it count (the spmd kind's planner does the same per model chunk,
simulator/strategies/spmd/plan.py, and the task-list kinds through simulator/strategies/tasklists.py).
"""

from __future__ import annotations

from simulator.engine.engine import Task
from simulator.memory.analytic import MemoryBreakdown


def base_bytes(breakdown: MemoryBreakdown) -> float:
    """What an actor holds from time 0: weights, optimizer state and buffers."""
    return breakdown.weights_bytes + breakdown.optimizer_bytes + breakdown.other_bytes


class MemoryLedger:
    """One actor's allocations and frees on its tasks, from its analytic ``breakdown`` (module docstring).

    ``micro_batch_bytes``: what one micro-batch's forward keeps until its backward; ``working_bytes``:
    the recompute working set alive during a backward (0 without recompute)."""

    def __init__(self, breakdown: MemoryBreakdown, micro_batch_bytes: float, working_bytes: float = 0.0):
        if micro_batch_bytes < 0 or working_bytes < 0:
            raise ValueError(f"negative bytes: micro-batch {micro_batch_bytes}, working set {working_bytes}")
        self.breakdown = breakdown
        self.micro_batch_bytes = micro_batch_bytes
        self.working_bytes = working_bytes
        self._gradients_held = False

    @property
    def base_bytes(self) -> float:
        return base_bytes(self.breakdown)

    def forward(self, task: Task) -> None:
        """A forward saves its micro-batch's activations (from its start)."""
        task.alloc_bytes += self.micro_batch_bytes

    def backward(self, entry: Task, exit_task: Task | None = None) -> None:
        """A backward from ``entry``'s start to ``exit_task``'s end (one task: both the same): the working
        set while it runs, the gradients from the first backward after an update; frees the working set and
        the micro-batch's activations at its end."""
        exit_task = exit_task or entry
        entry.alloc_bytes += self.working_bytes
        if not self._gradients_held:
            entry.alloc_bytes += self.breakdown.gradients_bytes
            self._gradients_held = True
        exit_task.free_bytes += self.working_bytes + self.micro_batch_bytes

    def update(self, task: Task) -> None:
        """The optimizer step frees the gradients (held again from the next backward)."""
        if self._gradients_held:
            task.free_bytes += self.breakdown.gradients_bytes
            self._gradients_held = False
