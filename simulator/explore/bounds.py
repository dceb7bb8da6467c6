"""A lower bound on an SPMD layout's step time, priced and not simulated (search's branch and bound).

The search (simulator/explore/search.py) skips a layout without pricing it when this bound, per
token, is above the k-th best step time found: that keeps its top k identical to evaluating every
layout only because the bound is never above the engine's step time. Every term below is time the
planner (simulator/strategies/spmd/plan.py) puts on one actor's chain of dependent tasks, priced
as the planner prices it with each transfer alone on its links (contention, host stalls,
point-to-point sends and the slow-down of kernels beside collectives only add to it):

- **the pipeline chain** (after :func:`simulator.strategies.spmd.fast.compute_bound_s`, with
  the chunk passes priced like the planner's tasks, kernels *plus* the exposed share of their
  tensor-/context-/expert-parallel collectives, :meth:`Planner.chunk_pass_s`): stage s is busy
  m·Σ_chunks (F + R + B [+ W]) and cannot start before micro-batch 0's forward has passed the
  stages before it, nor end before the last backward on it has passed them again (every
  schedule but ZB-H1, whose weight-gradient passes may come last: there only the fill counts);
- **the step's tail on a stage** (one step, ``optimizer_fusion: none``): after the last backward
  of the stage, the gradient reduction when it is not overlapped (``overlap_grad_reduce`` off,
  ZeRO < 2, not ZB-H1: the whole stage's gradients reduced after the backward, Megatron-LM's
  ``finalize_model_grads``), then the optimizer step, then, for ZeRO-1/2 without
  ``overlap_param_gather``, the all-gather of the updated weights. The pipeline chain ends on
  stage 0 (the last backward passes it last), so its tail is stage 0's.

The bound is multiplied by (1 - 1e-9) so that round-off in a different summation order can never
put it above an engine time it equals (a layout with no communication).
``tests/test_search_bounds.py`` checks bound ≤ engine over random layouts of several models and
clusters (hypothesis).
"""

from __future__ import annotations

ROUND_OFF = 1e-9


def step_lower_bound_s(scenario, planner=None) -> float:
    """Seconds: never above the engine's step time of ``scenario`` (an SPMD layout); module docstring."""
    from simulator.strategies.spmd.plan import Planner

    planner = planner or Planner(scenario)
    par = scenario.parallelism
    pp, v, m = par.pp, par.virtual_stages, par.num_micro_batches
    zero_bubble = par.schedule == "zb-h1"
    phases = ("F", "R", "B", "W") if zero_bubble else ("F", "R", "B")
    reps = [planner.stage_representative(stage) for stage in range(pp)]

    def pass_s(phase: str, chunk: int) -> float:
        ops = planner._chunk_ops(phase, chunk)
        return sum(planner.pass_cost_s(reps[chunk % pp], ops)) if ops else 0.0

    per_chunk = {g: {ph: pass_s(ph, g) for ph in phases} for g in range(pp * v)}
    tails = [_tail_s(scenario, planner, stage, reps[stage]) for stage in range(pp)]
    best, fill, drain = 0.0, 0.0, 0.0
    for stage in range(pp):
        busy = m * sum(sum(per_chunk[c * pp + stage].values()) for c in range(v))
        best = max(best, fill + busy + tails[stage])
        if not zero_bubble:
            best = max(best, fill + busy + drain + tails[0])
        fill += per_chunk[stage]["F"]
        drain += per_chunk[stage]["R"] + per_chunk[stage]["B"]
    return best * (1 - ROUND_OFF)


def _tail_s(scenario, planner, stage: int, rank: int) -> float:
    """What follows stage ``stage``'s last backward on its chain (module docstring): 0 where the
    plan is not the plain one-step, one-update-per-step case."""
    from simulator.scenario import gradient_bytes
    from simulator.strategies.spmd.plan import WEIGHT_BYTES

    par = scenario.parallelism
    if scenario.simulation.steps != 1 or scenario.training.optimizer_fusion != "none" or not planner.local_update:
        return 0.0
    zero = par.zero_stage
    dp_size = par.dp_degree * par.cp if planner.sync_gradients else 1
    local_params = planner.stage_params_local(stage)
    tail = planner.optimizer_step_s(stage)
    if dp_size <= 1:
        return tail
    if not (par.overlap_grad_reduce or zero >= 2 or par.schedule == "zb-h1"):
        grad = gradient_bytes(scenario.training)
        kinds: dict = {}
        for c in range(par.virtual_stages):
            for kind, count in planner.chunk_runs(c * par.pp + stage):
                kinds[kind] = kinds.get(kind, 0) + count
        expert = planner._layers_params(kinds.items(), expert_only=True) * grad
        dense = local_params * grad - expert
        group = planner.shard_group if zero >= 1 else planner.grad_group
        collective = "all_reduce" if zero == 0 else "reduce_scatter"
        # the dense and the expert reductions queue on the one dp stream; the larger alone is a bound
        tail += max(planner._isolated_comm_s(rank, [(group, collective, dense)]) if dense > 0 else 0.0,
                    planner._isolated_comm_s(rank, [("edp", collective, expert)]) if expert > 0 else 0.0)
    if zero in (1, 2) and not par.overlap_param_gather:
        precision = planner.precision
        tail += planner._isolated_comm_s(rank, [(planner.shard_group, "all_gather",
                                                 local_params * WEIGHT_BYTES[precision])])
    return tail
