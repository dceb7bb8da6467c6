"""The ``cyclic_dp`` strategy kind: Cyclic Data Parallelism (Fournier & Oyallon 2024,
"Cyclic Data Parallelism for Efficient Parallelism of Deep Neural Networks", arXiv:2403.08837).

The N data-parallel workers (``parallelism.dp``) run the same step as in data parallelism, but
worker i starts it i·T/N later (T the step time): a uniform delay instead of a simultaneous
start. Two things follow (paper, Sec. 3): the workers' activations peak at different times, so
their sum is (nearly) constant over the step instead of peaking at N times one worker's peak at
the end of every forward; and each worker's gradient is ready at a different time, so the
gradient communication is spread over the step and the update uses the gradient of the previous
step (a one-step delay: θ_{t+1} = θ_t - η·g_{t-1}).

What is simulated (one representative worker, symmetric mode): each step's micro-batch passes
priced by the SPMD planner; the gradient all-reduce of step t starts after its last backward and
runs beside step t + 1's passes on its own stream; the optimizer at the end of step t + 1 waits
for it. N = ``simulation.steps`` steps are measured in steady state, after one more that fills
the gradient stream: max(compute, communication) rather than their sum when the reduction
cannot overlap the backward. The collective keeps its data-parallel price (the paper's
point-to-point exchanges are not priced separately).

Memory: per GPU as data parallelism plus one more gradient buffer (the reduced gradient of step t
waits while step t + 1 accumulates its own). Over time (simulator/strategies/tasklists.py): weights,
optimizer state and buffers held from time 0; a micro-batch's activations from its forward to the
end of its backward; step t's gradient buffer from its first backward to the update that applies
it, the one ending step t + 1, so two buffers are alive from step t + 1's first backward on (the
simulated peak, equal to the analytic one) and one at every step's end. The summed activations of the N workers over the
step are reported (``cyclic_activation_*``): one worker's activations taken from its simulated
passes, growing linearly through each forward and falling linearly through each backward (a
continuous stand-in for layer-by-layer storage), summed over the N uniformly delayed copies,
against the simultaneous start of data parallelism (N times one worker's, from 0 at the step's start
to N times its peak); ``summed_activation_gib`` holds both ranges and the report prints them under
the memory table.

Optimizer fusion (``training.optimizer_fusion``, simulator/strategies/optimizer_fusion.py):
``backward`` with one micro-batch per step applies step t's (delayed) gradient layer by layer in
step t + 1's backward, right after each layer's backward (its weights are no longer read in the
step), freeing that layer's old gradient as its new one is made: one buffer plus one module's
gradients instead of two buffers (with accumulation the new buffer is whole before the last
backward: no change). ``forward``: the delayed update just before the next step's first forward.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict

from simulator.memory.analytic import rank_memory
from simulator.strategies.framework_terms import NO_PIPELINE, dropped_terms_extra
from simulator.strategies.optimizer_fusion import (
    FusedUpdates,
    largest_module_gradient_bytes,
    unfused_gradient_bytes,
)
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.tasklists import StageTasks, require

GIB = 2**30
#: Above this many workers the summed activations use the continuous limit (N times one worker's
#: mean over the step), which uniformly delayed copies approach as N grows.
EXACT_SUM_MAX_WORKERS = 512


class CyclicDpConfig(BaseModel):
    """Data parallelism with uniformly delayed workers and a one-step gradient delay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["cyclic_dp"] = "cyclic_dp"


def _check(scenario) -> CyclicDpConfig:
    par = scenario.parallelism
    require(par.pp == 1, "parallelism.pp", "cyclic_dp is modelled for data parallelism (pp 1); "
            "its pipelined form (workers sharing stages) is not")
    require(par.zero_stage == 0, "parallelism.zero_stage", "cyclic_dp is modelled without ZeRO sharding")
    return scenario.strategy


def activation_profile(passes: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """One worker's activations over a step as breakpoints (t, bytes) of a piecewise-linear
    function, from its passes ``(start_s, end_s, change_bytes)`` (a forward adds its micro-batch's
    activations, a backward frees them), each change linear over its pass."""
    points, level = [(0.0, 0.0)], 0.0
    for start, end, change in sorted(passes):
        points.append((start, level))
        level += change
        points.append((end, level))
    return points


def _value_at(points: list[tuple[float, float]], t: float, period: float) -> float:
    t %= period
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1] if t >= points[-1][0] else 0.0


def summed_activations(points: list[tuple[float, float]], period: float, workers: int,
                       delayed: bool = True) -> list[tuple[float, float]]:
    """The workers' summed activations over one period, exactly at every breakpoint of any copy:
    copies delayed by i·period/N (cyclic) or all starting together (data parallelism)."""
    offsets = [i * period / workers if delayed else 0.0 for i in range(workers)]
    times = sorted({(t + o) % period for t, _ in points for o in offsets} | {0.0})
    return [(t, sum(_value_at(points, t - o, period) for o in offsets)) for t in times]


def compile_cyclic_dp(scenario, mode: str | None = None, detail: bool = False):
    _check(scenario)
    tasks = StageTasks(scenario)
    m = scenario.parallelism.num_micro_batches
    steps = scenario.simulation.steps
    f_s, b_s = tasks.pass_s(0, "F"), tasks.pass_s(0, "B")
    update_s = tasks.planner.optimizer_step_s(0)
    ends, reduced, passes, loaded = [], None, [], None
    tasks.hold(0, tasks.held_bytes(0))
    grads = unfused_gradient_bytes(scenario, 0)  # the stage's whole gradient buffer
    fused = FusedUpdates(tasks, scenario)
    for k in range(steps + 1):
        for j in range(m):
            fused.before_forward(0)  # forward fusion: the delayed update just before the next forward
            forward = tasks.kernel(0, f"F.step{k}.mb{j}", f_s,
                                   deps=(loaded,) if j == 0 and loaded is not None else ())  # this step's samples
            tasks.forward_memory(0, forward)
            done = tasks.kernel(0, f"B.step{k}.mb{j}", b_s)
            # step in backward (one micro-batch): each layer's update with step k - 1's gradient right
            # after its backward of step k, freeing that layer's old gradient as the new one is made
            if k == 0 or not fused.in_backward(0, done, m == 1):
                tasks.backward_memory(0, done, grads if j == 0 else 0.0)  # step k's gradient buffer
            else:
                tasks.backward_memory(0, done)
            passes.append((k, forward, done))
        this_step = tasks.gradient_all_reduce(0, f"grad_all_reduce.step{k}", done)
        # one-step delay: the update ending step k applies the gradient reduced during it (step k - 1's);
        # step k - 1's buffer lived until this update applied it (freed layer by layer in step in backward)
        ends.append([fused.update(0, f"optimizer.step{k}", update_s, deps=(reduced,) if reduced else (),
                                  free_bytes=grads if k > 0 and not fused.steps_in_backward(m == 1) else 0.0)])
        reduced = this_step
        # the next step's samples, loaded beside this step (simulator/strategies/framework_terms.py): both end it
        loaded = tasks.input_load(0, f"input.next_batch.step{k}")
        if loaded is not None:
            ends[-1].append(loaded)
    fused.finish(0)
    workers = scenario.parallelism.dp_degree
    activations = rank_memory(scenario, 0).activations_bytes  # one micro-batch's (pp 1: F, B in turn)

    def summed() -> dict:
        last = steps
        step_start, period = ends[last - 1][0].end_s, ends[last][0].end_s - ends[last - 1][0].end_s
        own = [(f.start_s - step_start, f.end_s - step_start, activations) for k, f, _ in passes if k == last]
        own += [(b.start_s - step_start, b.end_s - step_start, -activations) for k, _, b in passes if k == last]
        points = activation_profile(own)
        if workers > EXACT_SUM_MAX_WORKERS:
            area = sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False))
            peak = low = workers * area / period
        else:
            series = summed_activations(points, period, workers)
            peak, low = max(v for _, v in series), min(v for _, v in series)
        dp_peak, dp_low = workers * max(v for _, v in points), workers * min(v for _, v in points)
        return {"cyclic_activation_peak_gib": peak / GIB, "cyclic_activation_min_gib": low / GIB,
                "simultaneous_activation_peak_gib": dp_peak / GIB,
                "simultaneous_activation_min_gib": dp_low / GIB,
                # the report's line under the memory table: the N workers' activations summed, min and
                # max over the step, cyclic against data parallelism's simultaneous start
                "summed_activation_gib": {"workers": workers, "cyclic_min": low / GIB, "cyclic_max": peak / GIB,
                                          "data_parallel_min": dp_low / GIB, "data_parallel_max": dp_peak / GIB},
                "gradient_delay_steps": 1}

    window = (ends[0], ends[1:])
    # the framework's terms as spmd applies them (framework_terms.py); a one-stage kind has no pipeline neighbour
    extra = dropped_terms_extra(scenario.accelerator.efficiency, "cyclic_dp", {"cross_node_pipeline_floor": NO_PIPELINE})
    return tasks.plan(window, extra, after_run=summed)


def memory_cyclic_dp(scenario):
    _check(scenario)
    base = rank_memory(scenario, 0)
    grads = 2 * base.gradients_bytes
    if scenario.training.optimizer_fusion == "backward" and scenario.parallelism.num_micro_batches == 1:
        # step in backward: the old buffer shrinks layer by layer as the new one grows (base's count
        # is already one module's under it, simulator/memory/analytic.py)
        grads = largest_module_gradient_bytes(scenario, 0) + unfused_gradient_bytes(scenario, 0)
    delayed = dataclasses.replace(base, gradients_bytes=grads)
    return 0, delayed, [delayed]


#: The fields of ``clustersim search``'s space that change what cyclic_dp simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): a worker's passes are priced by spmd's planner, so those fields (``schedule``
#: through spmd's memory model: GPipe holds every micro-batch's activations); not ``pp``, ``virtual_stages``,
#: ``pp_split``, ``overlap_p2p_comm`` (no pipeline: pp is refused unless 1), ``zero_stage`` (refused unless 0),
#: ``overlap_grad_reduce`` and ``overlap_param_gather`` (the kind builds its own delayed reduction).
CYCLIC_DP_SEARCHED_FIELDS: tuple[str, ...] = ("tp", "cp", "ep", "micro_batch_size", "recompute", "sequence_parallel",
    "schedule", "global_batch_size", "overlap_tp_grad_comm", "tp_comm_overlap")


def step_lower_bound_cyclic_dp(scenario, prices) -> float:
    """A lower bound on the simulated step (seconds) from spmd's chunk pass prices ``prices.passes``
    (:class:`simulator.explore.bounds.KindPrices`): m x (F + R + B) of the one stage, its kernels alone
    (without the update, the host floors or any wait). The step is measured from the later of step 0's update
    and the load of step 1's samples to the end of step N's update (or load), over N (the plan's window); every
    pass of steps 1..N comes after that update on the worker's compute stream (step 1's first forward waits for
    the load) and before step N's update. A stream runs its tasks one at a time and the engine never runs a
    fixed-duration task in less than its ``duration_s`` (simulator/engine/engine.py), and each pass task lasts at
    least its price here (``StageTasks.pass_s`` adds the host floor's stall). tests/test_kind_bounds.py checks
    it against the engine on random layouts."""
    par = scenario.parallelism
    passes = prices.passes
    return par.num_micro_batches * (passes[0]["F"] + passes[0]["R"] + passes[0]["B"])


CYCLIC_DP = register(StrategyKind(
    name="cyclic_dp",
    config=CyclicDpConfig,
    summary="data parallelism with uniformly delayed workers (Fournier & Oyallon 2024): gradient "
            "communication spread over the step, one-step gradient delay, summed activations flat",
    compile=compile_cyclic_dp,
    memory=memory_cyclic_dp,
    optimizer_fusion=("backward", "forward"),
    searched_layout_fields=lambda config: CYCLIC_DP_SEARCHED_FIELDS,
    derives_layout=True,
    step_lower_bound=step_lower_bound_cyclic_dp,
))
