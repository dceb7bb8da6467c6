"""The ``async_pipeline`` strategy kind: pipelines that never flush.

Variants (``strategy.variant``):

- ``pipedream`` (Narayanan et al. 2019, "PipeDream: generalized pipeline parallelism for DNN
  training", Sec. 3.2-3.3): 1F1B without flushes; each stage updates its weights after every
  micro-batch's backward (after all-reducing the stage's gradient over its data-parallel
  replicas) and keeps one stashed weight version per micro-batch in flight, so that a
  micro-batch's backward uses the weights its forward used: stage i of p holds p - i versions.
- ``2bw`` (Narayanan et al. 2021, "Memory-efficient pipeline-parallel DNN training", PipeDream-2BW,
  Sec. 3.1): 1F1B without flushes, gradients accumulated over the step's micro-batches, one update
  per step applied with a delay of one step; two weight versions (double buffering).
- ``fine_grained`` (Kosson et al. 2020, "Pipelined backpropagation at scale", Sec. 3): one stage
  per layer (``parallelism.pp`` = the model's layers), batch 1 per micro-batch, an update per
  sample, no weight stashing (one version); never filled or drained, so the throughput is one
  sample per slowest stage's forward + backward + update.

What is simulated: each stage's forward and backward chunk passes priced by the SPMD planner,
the activation and gradient sends between stages, the per-update gradient all-reduce and the
optimizer step, in 1F1B order over ``p + N·m + p`` micro-batches (N = ``simulation.steps``). The
steps are measured over whole periods in steady state: step k from the end of micro-batch
p - 1 + k·m on stage 0 to the end of micro-batch p - 1 + (k+1)·m (fill and drain never count).
Memory over time (simulator/strategies/tasklists.py): weights, optimizer state, buffers and the
stashed versions beyond the live one held from time 0 (the steady state's count, also during the
fill); a micro-batch's activations from its forward to the end of its backward; the gradients
from the first backward after an update to that update (every micro-batch for PipeDream and
fine-grained, every m for 2BW). The simulated peak is the analytic one of :func:`stage_memory`.
Optimizer fusion (``training.optimizer_fusion``, simulator/strategies/optimizer_fusion.py):
``backward`` issues each update right after its backward (and all-reduce); PipeDream and fine-grained
update after every micro-batch, so with it only the stage's largest module's gradients are alive
while a backward runs (2BW accumulates: only with one micro-batch per step); ``forward`` issues each
update before the stage's next forward (the drain's updates at the end of the run).
The framework profile's step-level terms (simulator/strategies/framework_terms.py): the wait for the
slowest rank, the host floors (eager dispatch, NeMo's fixed time per MoE layer, the cross-node pipeline
floor) and the interference marks as spmd prices a stage's passes (:class:`StageTasks`); the input
pipeline feeds stage 0 one micro-batch at a time (there is no step boundary to load a step's samples at:
a forward waits for its micro-batch's samples, loaded one after another beside the stream), so a loader
slower than the pipeline sets the pace, micro-batch size x ``input_us_per_sample`` per micro-batch.
Approximations: the 2BW all-reduce blocks the stage's next pass (no bucketed overlap);
staleness is reported (updates between a micro-batch's forward and its backward on each stage),
not turned into convergence.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.memory.analytic import MemoryBreakdown, peak_stage, rank_memory
from simulator.strategies.optimizer_fusion import (
    FusedUpdates,
    largest_module_gradient_bytes,
    unfused_gradient_bytes,
)
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.spmd.schedule import one_f_one_b
from simulator.strategies.tasklists import StageTasks, require


class AsyncPipelineConfig(BaseModel):
    """An asynchronous pipeline over ``parallelism.pp`` stages (each replicated ``dp`` times)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["async_pipeline"] = "async_pipeline"
    variant: Literal["pipedream", "2bw", "fine_grained"] = Field(
        default="pipedream",
        description="pipedream: update per micro-batch, weight stashing; 2bw: update per step, two weight "
                    "versions; fine_grained: one stage per layer, batch 1, update per sample (Kosson 2020)")


def _check(scenario) -> AsyncPipelineConfig:
    cfg, par, model = scenario.strategy, scenario.parallelism, scenario.model
    require(par.virtual_stages == 1, "parallelism.virtual_stages", "async_pipeline runs one chunk per stage")
    require(par.zero_stage == 0, "parallelism.zero_stage", "async_pipeline keeps whole weight versions (ZeRO 0)")
    if cfg.variant == "fine_grained":
        require(par.pp == model.num_layers, "parallelism.pp",
                f"fine_grained pipelining puts one layer per stage: pp must be {model.num_layers}, got {par.pp}")
        require(par.micro_batch_size == 1, "parallelism.micro_batch_size",
                f"fine_grained pipelining trains on single samples: must be 1, got {par.micro_batch_size}")
    return cfg


def weight_versions(variant: str, pp: int, stage: int) -> int:
    """Weight versions a stage holds: PipeDream stashes one per micro-batch in flight (p - i
    under 1F1B), 2BW two, fine-grained pipelined backpropagation one (no stashing)."""
    return {"pipedream": pp - stage, "2bw": 2, "fine_grained": 1}[variant]


def staleness_updates(variant: str, pp: int, stage: int) -> int:
    """Weight updates a stage applies between a micro-batch's forward and its backward: under
    1F1B stage i has p - i micro-batches in flight, so p - i - 1 others' updates land in
    between (PipeDream, fine-grained); 2BW's updates use the gradient of the previous step (1)."""
    return 1 if variant == "2bw" else pp - stage - 1


def compile_async_pipeline(scenario, mode: str | None = None, detail: bool = False):
    cfg = _check(scenario)
    tasks = StageTasks(scenario)
    p, m = scenario.parallelism.pp, scenario.parallelism.num_micro_batches
    steps = scenario.simulation.steps
    n = p + steps * m + p
    forward, backward, finished = {}, {}, {}
    fused = FusedUpdates(tasks, scenario)
    per_micro_batch = cfg.variant != "2bw" or m == 1  # an update after every micro-batch's backward
    for s in range(p):
        update_s = tasks.planner.optimizer_step_s(s)
        # memory: the stashed versions beyond the live weights are held throughout (steady state)
        extra_versions = weight_versions(cfg.variant, p, s) - 1
        tasks.hold(s, tasks.held_bytes(s) + extra_versions * tasks.planner.stage_memory(s).weights_bytes)
        grads, grads_alive = unfused_gradient_bytes(scenario, s), False
        for phase, j, _ in one_f_one_b(n, p, s):
            if phase == "F":
                fused.before_forward(s)  # forward fusion: the last update just before this forward
                # the framework's input pipeline feeds the first stage a micro-batch at a time (a prefetching
                # loader, framework_terms.py): the forward of micro-batch j waits for its samples
                loaded = tasks.input_load(s, f"input.mb{j}", scenario.parallelism.micro_batch_size)
                forward[s, j] = tasks.kernel(s, f"F.mb{j}", tasks.pass_s(s, "F"),
                                             deps=(loaded,) if loaded is not None else ())
                tasks.forward_memory(s, forward[s, j])
                continue
            done = backward[s, j] = tasks.kernel(s, f"B.mb{j}", tasks.pass_s(s, "B"))
            if fused.in_backward(s, done, per_micro_batch):  # step in backward: one module's gradients at a time
                tasks.backward_memory(s, done)
                held = 0.0
            else:
                tasks.backward_memory(s, done, 0.0 if grads_alive else grads)  # gradients from the first backward
                grads_alive, held = True, grads
            if cfg.variant != "2bw" or (j + 1) % m == 0:
                label = f"mb{j}" if cfg.variant != "2bw" else f"step{j // m}"
                reduced = tasks.gradient_all_reduce(s, f"grad_all_reduce.{label}", done)
                done = fused.update(s, f"optimizer.{label}", update_s, deps=(reduced,) if reduced else (),
                                    free_bytes=held)  # to the update (zero_grad)
                grads_alive = False
            elif j == n - 1:  # 2BW: the run ends inside a step; its partial gradient is dropped
                done.free_bytes += held
            finished[s, j] = done
        fused.finish(s)
    for s in range(p):  # sends queue on the stage's pp stream in the order their passes ran
        for phase, j, _ in one_f_one_b(n, p, s):
            if phase == "F" and s + 1 < p:
                forward[s + 1, j].deps.append(tasks.send(s, s + 1, f"send_act.mb{j}", forward[s, j]))
            elif phase == "B" and s > 0:
                backward[s - 1, j].deps.append(tasks.send(s, s - 1, f"send_grad.mb{j}", backward[s, j]))
    window = ([finished[0, p - 1]], [[finished[0, p - 1 + (k + 1) * m]] for k in range(steps)])
    extra = {
        "async_variant": cfg.variant,
        "weight_versions_per_stage": [weight_versions(cfg.variant, p, s) for s in range(p)],
        "staleness_updates_per_stage": [staleness_updates(cfg.variant, p, s) for s in range(p)],
        "updates_per_step": m if cfg.variant != "2bw" else 1,
    }
    return tasks.plan(window, extra)


def stage_memory(scenario, stage: int) -> MemoryBreakdown:
    """1F1B's memory with p - i micro-batches in flight whatever m (no flush ever caps them),
    plus the stashed weight versions beyond the first (16-bit copies of the stage's weights)."""
    par = scenario.parallelism
    in_flight_batch = max(par.global_batch_size, par.pp * par.micro_batch_size * par.dp_degree)
    steady = dataclasses.replace(scenario, parallelism=par.model_copy(
        update={"global_batch_size": in_flight_batch, "schedule": "1f1b"}))
    base = rank_memory(steady, stage)
    variant = scenario.strategy.variant
    extra_versions = weight_versions(variant, par.pp, stage) - 1
    grads = base.gradients_bytes
    if scenario.training.optimizer_fusion == "backward" and (variant != "2bw" or par.num_micro_batches == 1):
        grads = largest_module_gradient_bytes(scenario, stage)  # step in backward: an update per micro-batch
    return dataclasses.replace(base, weights_bytes=base.weights_bytes * (1 + extra_versions), gradients_bytes=grads)


def memory_async_pipeline(scenario):
    _check(scenario)
    stages = [stage_memory(scenario, i) for i in range(scenario.parallelism.pp)]
    return peak_stage(stages)


#: The fields of ``clustersim search``'s space that change what async_pipeline simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): its stages are priced by spmd's planner (passes, TP collectives), so those
#: fields; not ``virtual_stages`` or ``zero_stage`` (refused unless 1 and 0), nor the overlap switches of the
#: data-parallel and pipeline streams (``overlap_grad_reduce``, ``overlap_param_gather``, ``overlap_p2p_comm``): the
#: kind builds its own weight-version updates and sends.
ASYNC_PIPELINE_SEARCHED_FIELDS: tuple[str, ...] = ("tp", "pp", "cp", "ep", "micro_batch_size", "recompute",
    "sequence_parallel", "schedule", "global_batch_size", "pp_split", "overlap_tp_grad_comm", "tp_comm_overlap")


def step_lower_bound_async_pipeline(scenario, prices) -> float:
    """A lower bound on the simulated step (seconds) from spmd's chunk pass prices ``prices.passes``
    (:class:`simulator.explore.bounds.KindPrices`): the first stage's passes inside the measured window,
    kernels alone (without updates, host floors or waits), over the window's steps.

    The window (:func:`compile_async_pipeline`) opens at the end of the first stage's task after micro-batch
    p - 1's backward and closes, step k, at its task after micro-batch p - 1 + k m's backward: both on the first
    stage's compute stream, so every pass between them in its 1F1B order (``one_f_one_b``: m forwards and m
    backwards per step in the steady state) starts after the window opens and ends by its close. A stream runs
    its tasks one at a time and the engine never runs a fixed-duration task in less than its ``duration_s``
    (simulator/engine/engine.py); each pass task lasts at least its price here (``StageTasks.pass_s`` adds the
    host floor's stall). tests/test_kind_bounds.py checks it against the engine on random layouts."""
    par = scenario.parallelism
    p, m, steps = par.pp, par.num_micro_batches, scenario.simulation.steps
    order = [(phase, j) for phase, j, _ in one_f_one_b(p + steps * m + p, p, 0)]
    first, last = order.index(("B", p - 1)), order.index(("B", p - 1 + steps * m))
    inside = order[first + 1:last + 1]
    forwards = sum(1 for phase, _ in inside if phase == "F")
    passes = prices.passes
    f_s, b_s = passes[0]["F"], passes[0]["R"] + passes[0]["B"]
    return (forwards * f_s + (len(inside) - forwards) * b_s) / steps


ASYNC_PIPELINE = register(StrategyKind(
    name="async_pipeline",
    config=AsyncPipelineConfig,
    summary="pipelines without flushes: PipeDream weight stashing, 2BW double buffering, fine-grained "
            "pipelined backpropagation (one layer per stage); steady-state step over whole periods",
    compile=compile_async_pipeline,
    memory=memory_async_pipeline,
    optimizer_fusion=("backward", "forward"),
    searched_layout_fields=lambda config: ASYNC_PIPELINE_SEARCHED_FIELDS,
    derives_layout=True,
    step_lower_bound=step_lower_bound_async_pipeline,
))
