"""The ``local_learning`` strategy kind: groups of layers trained on local losses.

The network is split into groups, one per pipeline stage (``parallelism.pp``, the layout's layer
split). Every group but the last ends in an auxiliary head that computes a local loss on the
group's output: a linear output layer (Laskin et al. 2020, "Parallel training of deep networks
with local updates", Sec. 3: greedy local learning with auxiliary heads) or a small local critic
network, ``aux_layers`` layers of the model's own kind before that output layer (Lee et al.
2022's local critics). A group's backward starts from its own loss, so no gradient ever flows
between groups: a stage runs forward, its head's forward and backward, and its backward for each
micro-batch without waiting for later stages; activations move one way (stage i to i + 1).
Each group updates its weights (and its head's) at the end of the step (gradients all-reduced
over its data-parallel replicas first).

What is simulated: the chunk passes priced by the SPMD planner, the heads' passes priced the same
way (the model's own output layer, and ``aux_layers`` of its first layer kind), the one-way sends,
the step-end all-reduce and optimizer, over N + 1 unrolled steps (N = ``simulation.steps``); the
last N are measured, each to its end on the stage that finishes last. Nothing holds a stage back
but its input, so stage 0 runs ahead into the next step, unless ``sync_steps`` makes every group
wait for all at the end of each step (a barrier, as a job timed step by step does): then a step
includes the fill of the groups' forward chain.
Memory (analytic, :func:`stage_memory`): a micro-batch's activations are freed by its local backward, so each stage keeps one
micro-batch's (1F1B keeps p - i), plus the head's weights, gradients, optimizer state and its
activations (or, if larger, the recompute working set of the group's backward, which runs after
the head's pass). The heads' FLOPs are reported (``aux_head_flops_per_step``), not counted in
model FLOPs or MFU.
Memory over time (simulator/strategies/tasklists.py): the group's and its head's weights and
optimizer state held from time 0; a micro-batch's activations from its forward to the end of its
backward; the head's activations while its pass (forward and backward, one task) runs; the
group's and head's gradients from the step's first head pass to the update. The simulated peak
is the analytic one. Statistical efficiency (local losses train worse than end-to-end
backpropagation) is not modelled.
The framework profile's step-level terms (simulator/strategies/framework_terms.py): the wait for the
slowest rank, the host floors and the interference marks as spmd prices a stage's passes
(:class:`StageTasks`); the input pipeline loads the first group's next step's samples beside its step
(as spmd loads a first stage's), and that step's first forward waits for them.
Optimizer fusion (``training.optimizer_fusion``, simulator/strategies/optimizer_fusion.py): each
group's update (its own and its head's parameters) right after the step's last local backward
(``backward``; with one micro-batch per step the head's pass and the group's backward each hold
only their largest module's gradients) or before the group's next forward (``forward``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.memory.analytic import (
    MemoryBreakdown,
    microbatches_in_flight,
    model_state_bytes,
    peak_stage,
    rank_memory,
    recompute_working_bytes,
)
from simulator.scenario import gradient_bytes
from simulator.strategies.optimizer_fusion import FusedUpdates, unfused_gradient_bytes
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.spmd.plan import Planner
from simulator.strategies.tasklists import StageTasks, require
from workloads.counting import param_counts, unsharded_graph
from workloads.schema import TransformerSpec


class LocalLearningConfig(BaseModel):
    """Groups = pipeline stages; each group but the last trains on its own auxiliary loss."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["local_learning"] = "local_learning"
    aux_layers: int = Field(
        default=0, ge=0, le=20_000,  # as a model's num_layers (workloads/schema.py MODEL_SIZE_LIMITS): a typo's
        # 10**6 layers per head would take minutes in per-layer loops, 10**30 for ever
        description="layers (of the model's first layer kind) in each auxiliary head before its output layer: "
                    "0 a linear head (Laskin 2020), > 0 a local critic network (Lee 2022); at most 20,000, "
                    "the bound on a model's own layers")
    sync_steps: bool = Field(
        default=False, description="every group waits for all at the end of each step (a barrier)")


def _check(scenario) -> LocalLearningConfig:
    par = scenario.parallelism
    require(par.virtual_stages == 1, "parallelism.virtual_stages", "local_learning runs one group per stage")
    require(par.pp > 1, "parallelism.pp", "local_learning needs at least two groups (pp > 1)")
    require(isinstance(scenario.model, TransformerSpec), "model",
            f"local_learning's auxiliary heads are the model's own output layer and blocks, built for transformers; "
            f"{scenario.model.name} is not one")
    require(getattr(scenario.model, "mla", None) is None or scenario.strategy.aux_layers == 0, "strategy.aux_layers",
            "critic layers are built for standard attention only")
    return scenario.strategy


def head_params_local(scenario, planner) -> float:
    """Parameters of one auxiliary head on one rank: an output layer (final norm + V·h, split by
    tp like the model's) and ``aux_layers`` layers of the model's first kind."""
    cfg, model, tp = scenario.strategy, scenario.model, scenario.parallelism.tp
    head = (param_counts(model, tp).head + unsharded_graph(model, tp).tied_copy_params) / tp  # padded vocabulary
    return head + cfg.aux_layers * planner.layer_params_local()


def compile_local_learning(scenario, mode: str | None = None, detail: bool = False):
    cfg = _check(scenario)
    tasks = StageTasks(scenario)
    planner = tasks.planner
    p, m = scenario.parallelism.pp, scenario.parallelism.num_micro_batches
    head_ops = aux_head_ops(scenario, planner)
    aux_params = head_params_local(scenario, planner)
    steps = scenario.simulation.steps
    step_ends: dict[tuple[int, int], object] = {}
    forward = {}
    inputs = {}  # (stage 0, step k) -> the load of step k + 1's samples
    fused = FusedUpdates(tasks, scenario)
    for s in range(p):
        has_head = s < p - 1
        update_s = planner.optimizer_step_s(s, aux_params if has_head else 0.0)
        # memory: the group's and its head's states held throughout; the gradients of both from the
        # step's first head pass (the last group: first backward) to the update; the head's
        # activations only while its forward and backward run (one task)
        head_states = head_state_bytes(scenario, planner) if has_head else (0.0, 0.0, 0.0)
        tasks.hold(s, tasks.held_bytes(s) + head_states[0] + head_states[2])
        # step in backward (one micro-batch per step): the head's and the group's modules are updated
        # as their gradients are made, so each pass holds only its largest module's gradients
        in_backward = fused.steps_in_backward(m == 1)
        grads = 0.0 if in_backward else unfused_gradient_bytes(scenario, s) + head_states[1]
        head_activations = head_activation_bytes(scenario) if has_head else 0.0
        for k in range(steps + 1):
            for j in range(m):
                fused.before_forward(s)  # forward fusion: the last step's update just before this forward
                loaded = inputs.get((s, k - 1)) if j == 0 else None  # this step's samples, loaded during the last
                forward[s, k, j] = tasks.kernel(s, f"F.step{k}.mb{j}", tasks.pass_s(s, "F"),
                                                deps=(loaded,) if loaded is not None else ())
                tasks.forward_memory(s, forward[s, k, j])
                new_grads = grads if j == 0 else 0.0
                if has_head:
                    head = tasks.kernel(s, f"aux_head.step{k}.mb{j}", tasks.ops_s(s, head_ops))
                    head.alloc_bytes += head_activations + new_grads
                    head.free_bytes += head_activations
                    fused.in_backward(s, head, m == 1, head_largest_module_gradient_bytes(scenario, planner))
                    new_grads = 0.0
                done = tasks.kernel(s, f"B.step{k}.mb{j}", tasks.pass_s(s, "B"))
                tasks.backward_memory(s, done, new_grads)
                fused.in_backward(s, done, m == 1)
            reduced = tasks.gradient_all_reduce(s, f"grad_all_reduce.step{k}", done,
                                                aux_params if has_head else 0.0)
            step_ends[s, k] = fused.update(s, f"optimizer.step{k}", update_s, deps=(reduced,) if reduced else (),
                                           free_bytes=grads)
            # the first group's next samples, loaded beside this step as spmd loads them (framework_terms.py)
            loaded = tasks.input_load(s, f"input.next_batch.step{k}")
            if loaded is not None:
                inputs[s, k] = loaded
        fused.finish(s)
    for (s, k, j), task in forward.items():  # one-way: activations only
        if s + 1 < p:
            forward[s + 1, k, j].deps.append(tasks.send(s, s + 1, f"send_act.step{k}.mb{j}", task))
    if cfg.sync_steps:  # the barrier: a step's first pass waits for every group's previous step
        for k in range(1, steps + 1):
            for s in range(p):
                forward[s, k, 0].deps.extend(step_ends[r, k - 1] for r in range(p))
    def ends(k: int) -> list:  # every group's update, and the next step's samples loaded beside the step
        return [step_ends[s, k] for s in range(p)] + ([inputs[0, k]] if (0, k) in inputs else [])

    window = (ends(0), [ends(k) for k in range(1, steps + 1)])
    head_flops = sum(op.flops for op in head_ops)
    extra = {"aux_heads": p - 1,
             "aux_head_flops_per_step": head_flops * (p - 1) * m * scenario.parallelism.dp_degree
             * scenario.parallelism.tp * scenario.parallelism.cp}
    return tasks.plan(window, extra)


def head_state_bytes(scenario, planner) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes of one auxiliary head on one rank (no ZeRO)."""
    tr = scenario.training
    return model_state_bytes(head_params_local(scenario, planner), 0, 1, tr.precision, tr.optimizer,
                             gradient_bytes(tr))


def head_largest_module_gradient_bytes(scenario, planner) -> float:
    """Gradient bytes of the head's largest module on one rank (its output layer or one critic
    layer): what step in backward keeps alive during the head's pass."""
    cfg, model, tp = scenario.strategy, scenario.model, scenario.parallelism.tp
    output = (param_counts(model, tp).head + unsharded_graph(model, tp).tied_copy_params) / tp
    largest = max(output, planner.layer_params_local() if cfg.aux_layers else 0.0)
    return largest * gradient_bytes(scenario.training)


def head_activation_bytes(scenario) -> float:
    """One micro-batch's activations through an auxiliary head, as the model's own layers keep them
    (read from the layout's layer graph, workloads/transformer_graph.py): its output layer's (the
    graph's LM head: norm and head inputs, logits) and its ``aux_layers`` critic layers' (the graph's
    first block under the run's recompute)."""
    graph, recompute = scenario.layer_graph(), scenario.parallelism.recompute
    head, block = graph.layers[-1], graph.pipelined[0]
    return (head.kept_bytes(recompute, graph.input_bytes(head))
            + scenario.strategy.aux_layers * block.kept_bytes(recompute, graph.input_bytes(block)))


def stage_memory(scenario, stage: int, planner) -> MemoryBreakdown:
    par = scenario.parallelism
    base = rank_memory(dataclasses.replace(scenario, parallelism=par.model_copy(update={"schedule": "1f1b"})), stage)
    # 1F1B's stored activations over its p - i micro-batches: one micro-batch's; the recompute
    # working set is one layer's whatever the micro-batches in flight
    working = recompute_working_bytes(scenario, stage)
    in_flight = microbatches_in_flight("1f1b", par.pp, stage, par.num_micro_batches)
    activations = (base.activations_bytes - working) / in_flight
    weights, grads, optim = base.weights_bytes, base.gradients_bytes, base.optimizer_bytes
    in_backward = scenario.training.optimizer_fusion == "backward" and par.num_micro_batches == 1
    if stage < par.pp - 1:
        w, g, o = head_state_bytes(scenario, planner)
        weights, optim = weights + w, optim + o
        # the head's pass (its forward and backward) ends before the group's backward starts: its
        # activations and the group's recompute working set are never alive together
        head_pass = head_activation_bytes(scenario)
        if in_backward:  # step in backward: each pass holds only its largest module's gradients (base's)
            head_grads = head_largest_module_gradient_bytes(scenario, planner)
            if head_pass + head_grads > working + grads:  # the peak is in the head's pass
                grads, working = head_grads, head_pass
            activations += working
        else:
            grads += g
            activations += max(head_pass, working)
    else:
        activations += working
    return MemoryBreakdown(weights, grads, optim, activations, base.other_bytes, stage=stage)


def memory_local_learning(scenario):
    _check(scenario)
    planner = Planner(scenario, mode="symmetric")
    stages = [stage_memory(scenario, i, planner) for i in range(scenario.parallelism.pp)]
    return peak_stage(stages)


#: The fields of ``clustersim search``'s space that change what local_learning simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): its groups are priced by spmd's planner (passes, TP collectives, ZeRO state), so
#: those fields; not ``virtual_stages`` (refused unless 1), nor ``overlap_grad_reduce``, ``overlap_param_gather`` and
#: ``overlap_p2p_comm``: the kind builds its own reductions and sends.
LOCAL_LEARNING_SEARCHED_FIELDS: tuple[str, ...] = ("tp", "pp", "cp", "ep", "micro_batch_size", "zero_stage",
    "recompute", "sequence_parallel", "schedule", "global_batch_size", "pp_split", "overlap_tp_grad_comm",
    "tp_comm_overlap")


def aux_head_ops(scenario, planner) -> tuple:
    """One micro-batch's auxiliary-head pass on a group (one task of :func:`compile_local_learning`): the model's
    output layer forward and backward, and ``aux_layers`` critic layers of its first kind forward and backward."""
    work = planner.layer_works[planner.layer_kinds[0]]
    return (planner.head.forward + planner.head.backward
            + (work.forward + work.backward) * scenario.strategy.aux_layers)


def step_lower_bound_local_learning(scenario, prices) -> float:
    """A lower bound on the simulated step (seconds) from spmd's chunk pass prices ``prices.passes`` and the
    auxiliary heads' passes (:class:`simulator.explore.bounds.KindPrices`), kernels plus exposed collectives alone
    (without the update, the host floors, the sends or any wait). With W_r = m x (F + R + B + H) of group r (H the
    head's pass, none on the last group) and F_r its forward: the least over groups s of
    max over r >= s of (F_s + ... + F_(r-1) + N x W_r), over N.

    Why it bounds the step: the step is measured over the window from the latest end among the opening tasks
    (every group's step-0 update, and the load of step 1's samples on group 0) to the latest end among the
    step-N updates, over N (simulator/strategies/plan.py ``window_step_times``). Let the opener that ends last
    be group s's update (or the load, then s = 0): group s's step-1 first forward comes after it on s's compute
    stream (or waits for the load). For every group r >= s, r's step-1 first forward waits for the activations
    of the forwards of steps 1 of groups s..r-1 (one-way sends, each forward after the one before it), so it
    starts at least F_s + ... + F_(r-1) after the window opens, and every pass of r's steps 1..N (forward, head,
    backward per micro-batch) comes after it on r's compute stream and before r's step-N update, which ends by
    the window's close (the update held for the next forward under forward fusion is issued at the run's end).
    A stream runs its tasks one at a time and the engine never runs a fixed-duration task in less than its
    ``duration_s`` (interference only slows it; simulator/engine/engine.py); each pass task lasts at least its
    price here (``StageTasks.pass_s`` adds the host floor's stall; the head's task is ``StageTasks.ops_s`` of
    :func:`aux_head_ops`). A barrier (``sync_steps``) only adds waits. Which group opens is not known: the
    least over s. tests/test_kind_bounds.py checks it against the engine on random layouts (with and without
    critic layers)."""
    par = scenario.parallelism
    p, m, steps = par.pp, par.num_micro_batches, scenario.simulation.steps
    passes = prices.passes
    work = [m * (passes[r]["F"] + passes[r]["R"] + passes[r]["B"]
                 + (prices.stage_ops_s("local_learning.aux_head", r, lambda planner: aux_head_ops(scenario, planner))
                    if r < p - 1 else 0.0)) for r in range(p)]
    best = float("inf")
    for s in range(p):
        fill, longest = 0.0, 0.0
        for r in range(s, p):
            longest = max(longest, fill + steps * work[r])
            fill += passes[r]["F"]
        best = min(best, longest)
    return best / steps


LOCAL_LEARNING = register(StrategyKind(
    name="local_learning",
    config=LocalLearningConfig,
    summary="layer groups on pipeline stages, each trained on a local loss (auxiliary head or critic): "
            "no backward between groups, one-way activations",
    compile=compile_local_learning,
    memory=memory_local_learning,
    optimizer_fusion=("backward", "forward"),
    searched_layout_fields=lambda config: LOCAL_LEARNING_SEARCHED_FIELDS,
    derives_layout=True,
    step_lower_bound=step_lower_bound_local_learning,
))
