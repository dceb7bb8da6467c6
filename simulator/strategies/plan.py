"""What every strategy kind compiles to: per-actor task lists over many steps (the engine's input).

A kind's ``compile(scenario, mode, detail)`` returns a :class:`Plan`. The contract (see also
:mod:`simulator.strategies.registry`):

- ``streams``: ``{(actor, stream): [Task, ...]}`` in the order each stream runs them; every
  dependency across streams or actors is a ``Task.deps`` entry.
- ``steps``: how many training steps the lists hold (``simulation.steps``), unrolled back to back
  (for the spmd kind, the optimizer step of step k before the forward of step k+1). A kind that
  rounds the request (local_sgd: to whole periods of H) says why in ``steps_rounding``.
- ``step_ends``: for each step, the tasks whose last end marks the end of that step (spmd: every
  actor's optimizer step and any parameter gather after it; an asynchronous kind: the tasks that
  complete its k-th update). :func:`step_end_times` reads them after the run; the mean step time is
  the makespan / ``steps`` and step k lasts from the end of step k-1 to its own end (the last
  step to the makespan).
- ``compute_tasks``: per actor, its compute-stream tasks in order (the time breakdown walks them);
  ``stage_of``: the actor's pipeline stage (or 0), for picking the critical actor.
- ``memory_base_bytes``: ``{actor: bytes}`` held from the start by each actor (weights, ...);
  tasks add and free the rest (``Task.alloc_bytes`` / ``Task.free_bytes``), so the engine's
  counter per actor gives the simulated memory over time. Empty: the kind does not track memory.
- ``report`` (optional): called after the run, returns extra result keys measured from the task
  times (e.g. a parameter server's staleness per update). A ``staleness_steps_mean`` among them
  replaces the kind's ``convergence_inputs`` staleness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.engine.engine import Task

#: The engine counter name the planners use for device memory.
MEMORY_COUNTER = "memory"


@dataclass
class Plan:
    """Task lists per (actor, stream), plus what the analysis needs."""

    streams: dict[tuple[str, str], list[Task]]
    actors: dict[str, int]                                  # actor -> rank
    stage_of: dict[str, int]
    layers_per_chunk: list[int]
    topology: Any
    compute_tasks: dict[str, list[Task]] = field(default_factory=dict)
    steps: int = 1
    step_ends: list[list[Task]] = field(default_factory=list)
    memory_base_bytes: dict[str, float] = field(default_factory=dict)
    report: Callable[[], dict[str, float]] | None = None  # after the run: a kind's own figures (result keys)
    mode: str | None = None  # "symmetric" or "full": how the kind simulated it (it may force full)
    # Kinds whose period spans micro-batches or steps (asynchronous pipelines, delayed updates)
    # measure their steps in steady state: ``(tasks that open the window, per step the tasks that
    # close it)``; the fill before and the drain after are left out. None: steps from time 0.
    window: tuple[list[Task], list[list[Task]]] | None = None
    # Streams of other jobs run in the same engine (co-located jobs, simulator/colocation/run.py): shown in
    # the timeline and the trace, not analysed (breakdown, step times and memory are the plan's own).
    other_streams: dict[tuple[str, str], list[Task]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # a kind's own figures, merged into the result
    after_run: Callable[[], dict[str, Any]] | None = None  # more figures, read from the simulated times
    # Why ``steps`` differs from ``simulation.steps`` where a kind rounds it (local_sgd: "one whole period
    # of H = 16"); the report says "8 steps asked, 16 run (...)". None: the kind runs the steps asked.
    steps_rounding: str | None = None


def step_end_times(plan: Plan, makespan_s: float) -> list[float]:
    """The simulated end of every step (after the engine ran): the last end among the step's
    ``step_ends`` tasks, never before the previous step's end; the last step ends at the makespan."""
    if not plan.step_ends:
        return [makespan_s * (k + 1) / plan.steps for k in range(plan.steps)]
    ends: list[float] = []
    for tasks in plan.step_ends:
        end = max((t.end_s for t in tasks), default=0.0)
        ends.append(max(end, ends[-1] if ends else 0.0))
    ends[-1] = makespan_s
    return ends


def step_durations(ends_s: list[float]) -> list[float]:
    """Per-step seconds from the step ends (the first step from time 0)."""
    return [end - (ends_s[k - 1] if k else 0.0) for k, end in enumerate(ends_s)]


def window_step_times(plan: Plan) -> list[float]:
    """Per-step seconds inside a plan's steady-state window (after the engine ran): from the
    latest end among the opening tasks to the latest end among each step's closing tasks."""
    opens, closes = plan.window
    ends = [max(t.end_s for t in opens)] + [max(t.end_s for t in step) for step in closes]
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]
