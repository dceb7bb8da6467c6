"""Optimizer fusion (``training.optimizer_fusion``; Jiang et al. 2021, "Optimizer Fusion: Efficient
Training with Better Locality and Parallelism", arXiv:2104.00237, Sec. 3) for the strategy kinds
that build their own task lists (simulator/strategies/tasklists.py): the same meaning as the spmd
kind's (simulator/strategies/spmd/plan_tasks.py, ``_build_actor``), at the granularity those kinds
simulate, one task per stage pass.

- ``backward`` ("backward-fusion"): a parameter group's update is issued as memory-bound kernels
  right after the group's last gradient contribution (after its gradient reduction where there is
  one). When an update follows a single micro-batch's backward (no gradient accumulation: PipeDream's
  update per micro-batch, or one micro-batch per step), each module's gradients are freed by its
  update as soon as they are computed, so only the largest module's are alive at a time (PyTorch's
  optimizer step in backward, ``register_post_accumulate_grad_hook``): the backward pass holds that
  module's gradient bytes while it runs instead of the stage's whole gradient until the update.
  With gradient accumulation the gradients must outlive every micro-batch: no memory changes.
- ``forward`` ("forward-fusion"): the update is applied just before the group's first use in the
  next forward: the update task leaves its place after the backward and is issued before the
  stage's next forward pass (at the end of the run where no forward follows). The gradients live
  until then.

:func:`largest_module_gradient_bytes` gives the analytic count's bytes for the first case
(simulator/memory/analytic.py: step in backward keeps ``max(modules) x gradient bytes``), so that
the simulated peak and each kind's analytic peak count the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from simulator.engine.engine import Task
from simulator.errors import ConfigError
from simulator.memory.analytic import rank_memory

FIELD = "training.optimizer_fusion"


def fusion_mode(scenario) -> str:
    """``none``, ``backward`` or ``forward``."""
    return getattr(scenario.training, "optimizer_fusion", "none")


def refuse(scenario, kind: str, modes: tuple[str, ...], reason: str) -> None:
    """A fusion mode a kind cannot express: one ConfigError naming the field and the kind."""
    mode = fusion_mode(scenario)
    if mode in modes:
        raise ConfigError(FIELD, f"{mode!r} is not modelled by strategy kind {kind}: {reason}")


def largest_module_gradient_bytes(scenario, stage: int) -> float:
    """Gradient bytes of the stage's largest module (a layer, the embedding or the head) on one
    rank: the analytic count of one micro-batch per step under step in backward
    (simulator/memory/analytic.py, ``rank_memory``)."""
    par = scenario.parallelism
    one = par.model_copy(update={"global_batch_size": par.micro_batch_size * par.dp_degree, "schedule": "1f1b"})
    training = scenario.training.model_copy(update={"optimizer_fusion": "backward"})
    return rank_memory(dataclasses.replace(scenario, parallelism=one, training=training), stage).gradients_bytes


def unfused_gradient_bytes(scenario, stage: int) -> float:
    """The stage's whole gradient bytes on one rank (the analytic count without fusion)."""
    training = scenario.training.model_copy(update={"optimizer_fusion": "none"})
    return rank_memory(dataclasses.replace(scenario, training=training), stage).gradients_bytes


class FusedUpdates:
    """Where a stage's optimizer tasks go under ``training.optimizer_fusion`` on a
    :class:`simulator.strategies.tasklists.StageTasks` stream.

    ``update(...)`` makes the update task: appended now (``none``, ``backward``) or held for
    ``before_forward`` (``forward``), which issues the stage's held updates before its next forward;
    ``finish(stage)`` issues what is still held at the end of the run. ``in_backward(stage,
    backward, per_micro_batch)``: the memory of step in backward on a backward pass (see the
    module docstring); True when it applied (the caller then allocates no gradient buffer)."""

    def __init__(self, tasks, scenario):
        self.tasks = tasks
        self.scenario = scenario
        self.mode = fusion_mode(scenario)
        self._held: dict[int, list[Task]] = defaultdict(list)
        self._largest: dict[int, float] = {}

    def largest_module_bytes(self, stage: int) -> float:
        if stage not in self._largest:
            self._largest[stage] = largest_module_gradient_bytes(self.scenario, stage)
        return self._largest[stage]

    def steps_in_backward(self, per_micro_batch: bool) -> bool:
        """Step in backward without accumulation: the update follows one micro-batch's backward."""
        return self.mode == "backward" and per_micro_batch

    def in_backward(self, stage: int, backward: Task, per_micro_batch: bool, module_bytes: float | None = None) -> bool:
        """Step in backward on ``backward``: one module's gradients (``module_bytes``, default the
        stage's largest) alive while it runs, freed by its end (each module's update follows its
        gradient)."""
        if not self.steps_in_backward(per_micro_batch):
            return False
        nbytes = self.largest_module_bytes(stage) if module_bytes is None else module_bytes
        backward.alloc_bytes += nbytes
        backward.free_bytes += nbytes
        return True

    def update(self, stage: int, name: str, seconds: float, deps: tuple[Task, ...] = (),
               free_bytes: float = 0.0) -> Task:
        """The stage's optimizer step over a parameter group (memory-bound kernels, "optimizer"),
        freeing ``free_bytes`` of gradients."""
        tasks = self.tasks
        actor = tasks.actors[stage]
        task = Task(name, actor, "compute", "optimizer", duration_s=seconds, deps=list(deps))
        task.free_bytes += free_bytes
        if self.mode == "forward":
            self._held[stage].append(task)
        else:
            self._issue(stage, task)
        return task

    def before_forward(self, stage: int) -> None:
        """Forward fusion: the stage's held updates, issued before the forward about to be added."""
        for task in self._held.pop(stage, []):
            self._issue(stage, task)

    def finish(self, stage: int) -> None:
        """The run's end: updates still held (no forward follows them) are issued now."""
        self.before_forward(stage)

    def _issue(self, stage: int, task: Task) -> None:
        actor = self.tasks.actors[stage]
        self.tasks.streams[(actor, "compute")].append(task)
        self.tasks.compute[actor].append(task)


def accumulation_notes(scenario) -> list[str]:
    """One line where ``training.optimizer_fusion`` is accepted but changes no memory: the step
    accumulates gradients over more than one micro-batch per worker, so they stay whole until the
    update (the module docstring; Jiang et al. 2021 Sec. 3 fuse the update into the backward of the
    one pass that produces the gradients). PipeDream's (non-2BW) ``async_pipeline`` updates after
    every micro-batch and accumulates nothing. Shown under ``clustersim simulate``'s result and in
    its ``--json`` ``notes``: a setting must not be dropped without a word."""
    mode = fusion_mode(scenario)
    micro_batches = scenario.parallelism.num_micro_batches
    if mode == "none" or micro_batches <= 1:
        return []
    if scenario.strategy_kind == "async_pipeline" and getattr(scenario.strategy, "variant", None) != "2bw":
        return []
    if mode == "backward":
        return [f"{FIELD}=backward saves no memory here: the {micro_batches} micro-batches a step (per worker) "
                "accumulate their gradients, which stay whole until each chunk's update (step in backward frees them "
                "as they are computed only with one micro-batch a step)"]
    return [f"{FIELD}=forward changes no memory: the {micro_batches} micro-batches a step (per worker) accumulate "
            "their gradients, which stay whole until each chunk's update before the next forward, as without fusion "
            "(forward fusion moves only where the update runs)"]
