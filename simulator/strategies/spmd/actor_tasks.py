"""One actor's step as engine tasks: the spmd planner's ``_build_actor``, one concept per method.

:class:`ActorTasks` is made once per actor and step by :meth:`PlanTasks._build_actor
<simulator.strategies.spmd.plan_tasks.PlanTasks._build_actor>`, which calls its phases in order:

1. :meth:`~ActorTasks.gather_chunk_params` -- ZeRO-1/2 with overlapped parameter all-gather: each chunk's
   updated weights gathered at the start of the step;
2. :meth:`~ActorTasks.run_passes` -- the forward, backward (and zero bubble's weight-gradient) passes in
   the stage's schedule order (:meth:`~ActorTasks.forward_pass`, :meth:`~ActorTasks.backward_pass`,
   :meth:`~ActorTasks.backward_layers`, :meth:`~ActorTasks.weight_pass`), with the gradient reductions that
   overlap them and the pipeline entry / exit of each pass (:attr:`~ActorTasks.f_entry` and the like, which
   ``_link_pipeline`` joins);
3. :meth:`~ActorTasks.reduce_gradients` -- the reductions after the backward (ZeRO-0/1 without overlap,
   the tied embedding's gradients across the first and last stage);
4. :meth:`~ActorTasks.optimizer_update` -- the optimizer step (whole, or per chunk under optimizer fusion)
   and the parameter all-gather after it; returns the tasks that end the step.

The building blocks the phases share: :meth:`~ActorTasks.add` (append a task to the compute chain),
:meth:`~ActorTasks.run_ops` (a pass's kernels and collectives), :meth:`~ActorTasks.host_floor`,
:meth:`~ActorTasks.gather_params` (ZeRO-3), :meth:`~ActorTasks.flush_bucket` (a gradient bucket's reduction),
:meth:`~ActorTasks.backward_memory`, :meth:`~ActorTasks.accumulate_grads`, :meth:`~ActorTasks.chunk_update`
and :meth:`~ActorTasks.fused_backward_update` (optimizer fusion).

Prices come from the planner (plan_costs.py), the model from plan_model.py; nothing here computes a cost of
its own. The order in which tasks are made and streams first touched is the plan's order (the engine runs a
stream's tasks in list order and wakes waiters in the order they came), so every method keeps it.

Speed: the planner builds ~8,400 passes per Megatron-1T fold point, almost all by the two inline paths of
:meth:`~ActorTasks.run_passes` (a forward as one fused task, a backward as one chain task); that loop keeps
what it reads in local variables and calls no method per inline pass but :meth:`~ActorTasks.add` (measured:
``benchmarks/bench_simulate.py --phases``, the build phase as before the split, s13).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.engine.engine import Task
from simulator.scenario import gradient_bytes
from simulator.strategies.spmd.plan_costs import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_BYTES, comm_category
from workloads.graph import Op

if TYPE_CHECKING:
    from simulator.strategies.spmd.plan import Planner


class ActorTasks:
    """The tasks of one step of one actor (a simulated rank), on its streams (``compute``, ``tp``/``cp``/``ep``,
    ``dp``, ``pp``): see the module docstring for the phases. ``after``: the tasks that ended its previous
    step (its first kernel and its start-of-step gathers wait for them)."""

    __slots__ = (
        "planner", "par", "sc", "actor", "rank", "streams", "after", "stage", "compute", "m_total",
        "f_entry", "f_exit", "b_entry", "b_exit",
        "order", "compute_list", "prev", "dp_tasks", "copy_back", "zero", "dp_size", "shard", "weight_bytes", "grad_bytes",
        "layer_ends", "carry", "grads_held", "fusion", "optimizer_bytes", "fused", "deferred", "pending_forward",
        "bucket_limit", "bucket", "reduce_kind", "start_gathers", "per_layer_gathers", "reduces_every_pass",
    )

    def __init__(self, planner: Planner, actor: str, rank: int, streams, after: tuple[Task, ...] = ()):
        self.planner = planner
        par = self.par = planner.par
        sc = self.sc = planner.sc
        self.actor, self.rank, self.streams, self.after = actor, rank, streams, after
        self.stage = planner.layout.coords(rank).pp
        self.compute = planner.compute_of(rank)  # this rank's accelerator (its node group's on a mixed cluster)
        self.m_total = par.num_micro_batches
        self.order = planner._stage_order(rank, self.stage)
        # Each pass's first and last task (its pipeline entry and exit), at micro-batch x virtual stages +
        # chunk (the chunk's index on this stage): what ``_link_pipeline`` joins across stages.
        slots = self.m_total * par.virtual_stages
        self.f_entry: list[Task | None] = [None] * slots
        self.f_exit: list[Task | None] = [None] * slots
        self.b_entry: list[Task | None] = [None] * slots
        self.b_exit: list[Task | None] = [None] * slots
        self.compute_list: list[Task] = []  # this step's tasks on the compute stream, in order
        self.prev: Task | None = None  # last task on the compute/tp chain
        self.dp_tasks: list[Task] = []  # gradient reductions and gathers on the dp stream (the update waits)
        self.copy_back: list[tuple[Task, float]] = []  # DDP's reduced buckets and their bytes, copied back at the end
        zero = self.zero = par.zero_stage
        # weights are replicated over dp and cp (Megatron); a kind that does not reduce gradients every
        # step (local SGD) plans each replica on its own
        self.dp_size = par.dp_degree * par.cp if planner.sync_gradients else 1
        self.shard = planner.shard_size  # ZeRO shards: all of dp x cp, or a hybrid-sharding group
        self.weight_bytes = WEIGHT_BYTES[planner.precision]
        self.grad_bytes = gradient_bytes(sc.training)
        self.layer_ends: list[Task] = []  # last task of each layer pass, for ZeRO-3 prefetch distance
        self.carry: list[Task] = list(after)  # side tasks (overlapped collectives) the next chained task waits for
        self.grads_held: dict[int, float] = {}  # chunk -> its gradient bytes, all allocated at the first backward
        fusion = self.fusion = sc.training.optimizer_fusion
        self.optimizer_bytes = (OPTIMIZER_BYTES_PER_PARAM[sc.training.optimizer]
                                * (32 / 28 if planner.precision == "fp32" else 1))
        self.fused: list[Task] = []  # per-chunk updates (optimizer fusion)
        self.deferred: list[tuple[int, tuple[Task, ...]]] = []  # (chunk, the reductions its fused update waits for)
        # optimizer fusion "forward": the previous step's per-chunk updates, applied before each chunk's first forward
        self.pending_forward = planner._forward_updates.pop(actor, {}) if fusion == "forward" else {}
        # Gradient buckets (ZeRO 0/1: once, on the last micro-batch; ZeRO 2/3: every micro-batch).
        self.bucket_limit = par.gradient_bucket_mb * 1e6
        self.bucket = {"bytes": 0.0, "expert": 0.0, "n": 0}
        self.reduce_kind = "all_reduce" if zero == 0 else "reduce_scatter"
        self.start_gathers: dict[int, Task] = {}  # chunk -> its start-of-step parameter all-gather
        self.per_layer_gathers = zero >= 3 and self.dp_size > 1
        self.reduces_every_pass = self.dp_size > 1 and (par.overlap_grad_reduce or zero >= 2)

    # -- building blocks ------------------------------------------------------------------------

    def add(self, task: Task | None, extra_deps: tuple[Task, ...] = ()) -> Task | None:
        """Append ``task`` to the actor's chain: it waits for the chain's last task, ``extra_deps`` and the
        side tasks carried so far (overlapped collectives the next kernel must wait for); it becomes the
        chain's last. None passes through (a collective of one rank makes no task)."""
        if task is None:
            return None
        prev = self.prev
        if prev is not None:
            task.deps.append(prev)
        task.deps.extend(extra_deps)
        carry = self.carry
        if carry:
            task.deps.extend(carry)
            carry.clear()
        self.streams[(self.actor, task.stream)].append(task)
        if task.stream == "compute":
            self.compute_list.append(task)
        self.prev = task
        return task

    def run_ops(self, ops: tuple[Op, ...], label: str, category: str, first_deps: tuple[Task, ...] = (),
                layer: str | None = None) -> Task | None:
        """The tasks of ``ops`` (a pass, a layer's pass or part of it), chained; the first waits for
        ``first_deps`` too. Where TP traffic has its links to itself and no trace detail is asked for, one
        kernel task with the exposed TP time folded in (exact, fewer events); else one task per kernel run and
        per collective (plan_costs.py ``_segments``), an overlapped collective running beside the next kernel
        (which waits for it). Returns the last task added to the chain."""
        planner, actor, rank = self.planner, self.actor, self.rank
        first = True
        last = None
        if not planner.detail and planner.tp_exclusive:
            # TP traffic has its links to itself: fold it into the kernel task (exact, fewer events).
            duration, segments = planner._fused_pass(rank, ops, category)
            task = Task(label, actor, "compute", category, duration_s=duration, segments=segments)
            return self.add(task, first_deps)
        pending: Task | None = None  # an overlapped collective running beside the next kernel
        for kind, payload, name, overlapped in planner._segments(rank, ops):
            deps = first_deps if first else ()
            first = False
            if kind == "compute":
                task = Task(f"{label}.{name}", actor, "compute", category,
                            duration_s=planner._compute_time(payload, rank))
                if planner.detail:  # for the trace: the layer and the FLOPs the kernels run
                    task.info = kernel_info(payload, layer)
                last = self.add(task, deps) or last
                if pending is not None:
                    self.carry.append(pending)  # the kernel after the overlapped one waits for it
                    pending = None
                continue
            comm_cat = comm_category(payload[0][0])  # not `category`: the kernels after it keep theirs
            task = planner.comm_task(actor, comm_cat.removesuffix("_comm"), comm_cat, f"{label}.{name}", rank,
                                     payload, key=f"{label}.{name}")
            if task is not None and planner.detail and layer:
                task.info = (("layer", layer),)
            if task is not None and overlapped:
                task.deps.extend([t for t in (self.prev,) if t is not None] + list(deps))
                self.streams[(actor, task.stream)].append(task)
                pending = task
            else:
                last = self.add(task, deps) or last
        if pending is not None:
            self.carry.append(pending)
        return last

    def host_floor(self, label: str, phase: str, runs) -> Task | None:
        """The stage's host-side floor (simulator/cost/host_floor.py): a stall after the pass, or None."""
        stall = self.planner.host_floor_stall_s(self.rank, phase, runs)
        if stall <= 0:
            return None
        return self.add(Task(f"{label}.host_floor", self.actor, "compute", "host_stall", duration_s=stall))

    def weight_gather_parts(self, params: float, expert: float) -> list[tuple]:
        """The all-gathers that bring a rank's ``params`` weights (``expert`` of them routed experts) back
        from their ZeRO shards: the dense ones over the shard group (dp, x cp; hybrid: the shard set), the
        routed experts over the expert-data-parallel group -- the ranks holding the same experts, over
        which their optimizer state is sharded and their gradients reduced (:meth:`flush_bucket`;
        Megatron-Core's ``expert_parallel_buffers`` on ``get_expert_data_parallel_group()``, torchtitan's
        ``efsdp`` mesh). One task moves both in sequence (it meets its edp peers)."""
        weight_bytes = self.weight_bytes
        parts: list[tuple] = [(self.planner.shard_group, "all_gather", (params - expert) * weight_bytes)]
        if expert > 0:
            parts.append(("edp", "all_gather", expert * weight_bytes))
        return parts

    def gather_params(self, label: str, params: float, expert: float = 0.0) -> tuple[Task, ...]:
        """ZeRO-3: all-gather a layer's weights on the dp stream, prefetched one task ahead
        (``overlap_param_gather``), or, with it off, issued only when the layer before has
        finished, so the compute waits for every gather (a host-blocking backend). Returns what the
        layer's first kernel must wait for besides the chain (the gather, or nothing where a copy-out or
        host task on the chain already waits for it)."""
        planner, par, actor, compute = self.planner, self.par, self.actor, self.compute
        if self.zero < 3 or self.dp_size == 1:
            return ()
        weight_bytes, after, streams = self.weight_bytes, self.after, self.streams
        task = planner.comm_task(actor, "dp", "dp_comm", f"{label}.zero3_gather", self.rank,
                                 self.weight_gather_parts(params, expert), key=f"{label}.zero3_gather")
        if task is None:
            return ()
        task.deps.extend(after)  # the weights the previous step's optimizer updated
        if par.zero_buffer_copies:  # FSDP2's copy-in; FSDP1's low-precision cast of the shard, alike
            # Copy-in of this rank's shard of the layer's parameters into the all-gather input
            # (FSDP2 ``foreach_all_gather`` -> ``all_gather_copy_in``: ``torch._foreach_copy_`` of
            # the local shards, all_gather_input_numel = params / shard; torch 2.13
            # distributed/fsdp/_fully_shard/_fsdp_collectives.py). With overlapped gathers it runs
            # on FSDP2's all-gather copy-in stream (FSDPCommContext.get_all_gather_streams: forward
            # and pre-backward), which the gather waits for; with host-blocking gathers (gloo) on
            # the host before the gather. FSDP1 (``fsdp1``) casts its fp32 shard to the
            # low-precision ``_mp_shard`` it all-gathers from, on the unshard stream
            # (FlatParamHandle.pre_unshard -> _use_low_precision_shard; torch fsdp/_flat_param.py):
            # the same P/n elements at the same place.
            copy_in_s = planner.zero3_copy_in_s(compute, params, self.shard, weight_bytes)
            if par.overlap_param_gather:
                copy_in = Task(f"{label}.zero3_copy_in", actor, "dp", "compute", duration_s=copy_in_s)
                streams[(actor, "dp")].append(copy_in)
                task.deps.append(copy_in)
                copy_in.deps.extend(after)
                first = copy_in
            else:
                first = self.add(Task(f"{label}.zero3_copy_in", actor, "compute", "compute", duration_s=copy_in_s))
                task.deps.append(first)
        else:
            first = task
        post = par.zero3_backward_prefetch == "post" and label.startswith("B.")
        layer_ends = self.layer_ends
        issue = None
        if par.overlap_param_gather and not post and len(layer_ends) >= 2:
            issue = layer_ends[-2]  # prefetch: starts once the layer before the previous ends
        elif (post or not par.overlap_param_gather) and layer_ends:
            issue = layer_ends[-1]  # blocking: starts when the layer before ends, compute waits
        if issue is not None:
            task.deps.append(issue)
            if first is not task and issue not in first.deps:
                first.deps.append(issue)  # the copy-in is issued with the gather
        streams[(actor, "dp")].append(task)
        self.dp_tasks.append(task)
        # the framework's host work around the gather beyond the law and the copies (FSDP2's unshard /
        # reshard in Python; an eager CPU/gloo profile carries it: ComputeModel.zero3_gather_host_s). The
        # host is the device there, so it counts as compute, as that profile's eager dispatch does
        host = (Task(f"{label}.zero3_gather_host", actor, "compute", "compute",
                     duration_s=compute.zero3_gather_host_s) if compute.zero3_gather_host_s > 0 else None)
        if par.zero_buffer_copies is not True:  # the layer's parameters are views of the gathered buffer
            if host is not None:
                self.add(host, (task,))
                return ()
            return (task,)  # (FSDP1's FlatParameter, Megatron-FSDP's buffers)
        # Copy-out of the gathered flat buffer into the layer's parameters, on the compute stream
        # after the gather (FSDP2 ``foreach_all_gather_copy_out`` -> ``split_with_sizes_copy`` of
        # the whole all-gather output, every rank's shard including this rank's own: shard x
        # params / shard elements; torch 2.13 _fsdp_collectives.py): read + write, memory-bound.
        # DeepSpeed ZeRO-3 is priced the same (not checked against its source).
        self.add(Task(f"{label}.zero3_copy_out", actor, "compute", "compute",
                      duration_s=compute.copy_s(params * weight_bytes)), (task,))
        self.add(host)
        return ()

    def grad_copy_in(self, after: Task, label: str, grad_bytes: float) -> Task:
        """ZeRO-2/3 copy the bucket's gradients into the flat reduce-scatter input first
        (FSDP2 ``foreach_reduce`` -> ``foreach_reduce_scatter_copy_in`` -> ``chunk_cat`` of the
        unsharded gradients, every element once; torch 2.13 _fsdp_collectives.py; DeepSpeed's ipg
        bucket): a memory-bound kernel on the compute stream. Returns what the reduction waits for
        (``after`` where nothing is copied)."""
        if self.zero == 0:
            if not self.par.ddp_bucket_copies:
                return after
            # PyTorch DDP's reducer (torch 2.13 libtorch: RECORD_FUNCTION "torch::distributed::reducer::mul_out";
            # reducer.hpp: bucket_views_in[i].copy_(grad), div_factor_ = the process group's size): each
            # gradient into its bucket view times 1 / world size, or, where the gradient is the bucket view
            # (gradient_as_bucket_view), the view divided in place: read + write of the bucket, on the compute stream
            return self.add(Task(f"{label}.ddp_bucket_in", self.actor, "compute", "compute",
                                 duration_s=self.compute.copy_s(grad_bytes)))
        if self.zero < 2 or not self.par.zero_buffer_copies:
            return after
        actor, compute = self.actor, self.compute
        if self.par.zero_buffer_copies is True:
            return self.add(Task(f"{label}.grad_copy_in", actor, "compute", "compute",
                                 duration_s=compute.copy_s(grad_bytes)))
        # FSDP1 (torch fsdp/_flat_param.py, _runtime_utils.py): the layers' parameters are views split
        # from the flat parameter (FlatParamHandle._use_unsharded_views, as tensors in forward), so
        # autograd's split backward concatenates their gradients into the flat gradient, in the
        # parameters' dtype, on the compute stream; the post-backward hook then, on its own stream ahead
        # of the reduce-scatter, casts it to the reduce dtype where that differs
        # (``flat_param.grad.to(handle._reduce_dtype)``) and divides it in place by the predivide factor
        # (_reduce_grad -> _div_if_needed; _get_gradient_predivide_factor is > 1 for every world size >= 2).
        weight_bytes, reduce_bytes = WEIGHT_BYTES[self.planner.precision], gradient_bytes(self.sc.training)
        elements = grad_bytes / reduce_bytes
        gathered = self.add(Task(f"{label}.grad_cat", actor, "compute", "compute",
                                 duration_s=compute.copy_s(elements * weight_bytes)))
        cast = compute.copy_s(elements * (weight_bytes + reduce_bytes) / 2) if reduce_bytes != weight_bytes else 0.0
        divide = Task(f"{label}.grad_predivide", actor, "dp", "compute", duration_s=cast + compute.copy_s(grad_bytes))
        divide.deps.append(gathered)
        self.streams[(actor, "dp")].append(divide)
        return divide

    def flush_bucket(self, after: Task, label: str) -> None:
        """Reduce the gradients gathered in the bucket so far, on the dp stream after ``after``: dense
        gradients over dp (x cp) -- an all-reduce, or a reduce-scatter under ZeRO -- expert gradients over
        the expert-data-parallel group (dp / ep ranks holding the same experts); with hybrid sharding the
        reduce-scattered shard then all-reduced across the replicas. ZeRO-2/3's copy into the reduce input
        and ZeRO-3's host work come first (on the compute chain); with ``zero3_reduce_overlap`` off the next
        chained task waits for the reduction. Empties the bucket."""
        planner, actor, bucket = self.planner, self.actor, self.bucket
        dense, expert = bucket["bytes"] - bucket["expert"], bucket["expert"]
        bucket["bytes"] = bucket["expert"] = 0.0
        if dense + expert <= 0 or self.dp_size == 1:
            return
        zero = self.zero
        after = self.grad_copy_in(after, label, dense + expert)
        if zero >= 3 and self.compute.zero3_reduce_host_s > 0:
            # the framework's host work around the reduce beyond the law and the copy-in (FSDP2's
            # post_backward / foreach_reduce in Python; an eager CPU/gloo profile carries it)
            after = self.add(Task(f"{label}.zero3_reduce_host", actor, "compute", "compute",
                                  duration_s=self.compute.zero3_reduce_host_s), (after,))
        # Dense gradients are reduced over dp (x cp); expert gradients over the expert-data-
        # parallel group (dp / ep ranks holding the same experts).
        reduce_kind = self.reduce_kind
        steps = [(planner.shard_group if zero >= 1 else planner.grad_group, reduce_kind, dense),
                 ("edp", reduce_kind, expert)]
        if planner.hybrid_replicas > 1 and zero >= 1:
            # HSDP: the reduce-scattered shard is then all-reduced across the replicas.
            steps.insert(1, ("zrep", "all_reduce", dense / planner.shard_size))
        for group, kind, nbytes in steps:
            if nbytes <= 0:
                continue
            task = planner.comm_task(actor, "dp", "dp_comm", f"{label}.{group}_grad_{kind}", self.rank,
                                     [(group, kind, nbytes)], key=f"{label}.{group}grad{bucket['n']}")
            if task is None:
                continue
            task.deps.append(after)
            self.streams[(actor, "dp")].append(task)
            self.dp_tasks.append(task)
            if zero == 0 and self.par.ddp_bucket_copies is True:
                # ... and, with gradient_as_bucket_view false, the reduced bucket copied back into the gradients
                # (reducer.hpp copy_bucket_to_grad: grad.copy_(bucket_views_out[i]); RECORD_FUNCTION
                # "torch.distributed.ddp.reducer::copy_bucket_to_grad"): done by finalize_backward once every
                # bucket is reduced, on the compute stream before the optimizer step (:meth:`optimizer_update`)
                self.copy_back.append((task, nbytes))
            if zero >= 3 and not self.par.zero3_reduce_overlap:
                # host-blocking reduce (FSDP2 over gloo on a CPU, torch 2.13): post_backward runs on the
                # autograd thread and foreach_reduce calls reduce_scatter_comm without async_op (False:
                # dist.reduce_scatter_single waits for the work), inside device_handle.stream(...) of a
                # torch.cpu.Stream, whose stream context, wait_stream and events do nothing
                # (_fsdp_collectives.py foreach_reduce; _fsdp_param_group.py post_backward;
                # torch/cpu/__init__.py): the next layer's backward starts once the reduce is done
                self.carry.append(task)
        bucket["n"] += 1

    def backward_memory(self, g: int, entry: Task, exit_task: Task) -> None:
        """Memory over time of a backward pass: its recompute working set (and, on the rank's first
        backward of the step, every chunk's gradients) from its start; the working set and the
        chunk's saved activations freed at its end. Zero bubble's deferred W pass keeps only part of
        them (the linear layers' inputs); counted as freed with B, as the analytic count does (ZB-H1
        keeps 1F1B's peak, Qi et al. 2024 Sec. 3.1) -- an approximation."""
        planner, stage, grads_held = self.planner, self.stage, self.grads_held
        working = planner.working_bytes(stage)
        entry.alloc_bytes += working
        if self.fusion == "backward" and self.m_total == 1:
            # step in backward without accumulation: one module's gradients alive at a time
            transient = planner.largest_module_gradient_bytes(stage)
            entry.alloc_bytes += transient
            exit_task.free_bytes += transient
            grads_held[g] = 0.0
        elif not grads_held:  # every chunk's gradient buffer (Megatron-Core: one per chunk, all alive)
            for c in range(self.par.virtual_stages):
                chunk = c * self.par.pp + stage
                grads_held[chunk] = planner.gradient_bytes_of_chunk(stage, chunk)
                entry.alloc_bytes += grads_held[chunk]
        exit_task.free_bytes += working + planner.activation_bytes(g)

    def accumulate_grads(self, g: int, mb: int, tag: str) -> None:
        """``unfused_eager_kernels``: after every micro-batch's backward but the first, the new
        gradients are added into the held ones (PyTorch AccumulateGrad), over the chunk's
        local gradients (its shard of them where ZeRO-2/3 reduce-scatter every micro-batch)."""
        if not self.sc.training.unfused_eager_kernels or mb == 0:
            return
        nbytes = self.planner.chunk_params_local(g) * self.grad_bytes / (self.shard if self.zero >= 2 else 1)
        self.add(Task(f"B.{tag}.grad_accumulate", self.actor, "compute", "compute",
                      duration_s=self.compute.add_into_s(nbytes)))

    def chunk_update(self, g: int, name: str) -> Task:
        """The optimizer step of one model chunk's parameters, freeing its gradients (optimizer fusion)."""
        task = Task(name, self.actor, "compute", "optimizer",
                    duration_s=self.compute.optimizer_step_s(self.planner.chunk_params_local(g),
                                                             self.optimizer_bytes))
        task.free_bytes += self.grads_held.get(g, 0.0)
        return task

    def fused_backward_update(self, g: int, mb: int) -> None:
        """Optimizer fusion "backward": with no data parallelism the chunk's update runs inline right
        after its last backward (PyTorch's step in backward). With data parallelism it waits for the
        chunk's gradient reduction: queued after the backward, each chunk's update waits only for the
        buckets reduced so far (overlapped reduction) so it runs while later chunks' gradients are
        still reduced (memory-bound kernels overlapping communication); without overlapped
        reduction, after the final reduction (:meth:`optimizer_update`)."""
        if self.fusion != "backward" or mb != self.m_total - 1:
            return
        if self.dp_size > 1:
            overlapped = self.par.overlap_grad_reduce or self.zero >= 2
            self.deferred.append((g, tuple(self.dp_tasks) if overlapped else ()))
            return
        self.fused.append(self.add(self.chunk_update(g, f"optimizer_step.c{g}"), tuple(self.dp_tasks)))

    # -- phases ---------------------------------------------------------------------------------

    def gather_chunk_params(self) -> None:
        """ZeRO-1/2 with overlapped parameter all-gather: gather each chunk's updated weights at the
        start of the step, before its first forward (Megatron's overlap_param_gather); the chunk's first
        forward waits for its gather (:meth:`run_passes`)."""
        planner, par = self.planner, self.par
        if not (self.zero in (1, 2) and self.dp_size > 1 and par.overlap_param_gather):
            return
        for c in range(par.virtual_stages):
            g = c * par.pp + self.stage
            expert = planner._layers_params(planner.chunk_runs(g), expert_only=True)
            task = planner.comm_task(self.actor, "dp", "dp_comm", f"c{g}.param_all_gather", self.rank,
                                     self.weight_gather_parts(planner.chunk_params_local(g), expert),
                                     key=f"c{g}.param_gather")
            if task is not None:
                task.deps.extend(self.after)
                self.streams[(self.actor, "dp")].append(task)
                self.dp_tasks.append(task)
                self.start_gathers[g] = task

    def run_passes(self) -> None:
        """Every pass of the step in the stage's schedule order (``phase``, micro-batch, chunk), each one's
        pipeline entry and exit task recorded (:attr:`f_entry`, :attr:`f_exit`, :attr:`b_entry`, :attr:`b_exit`)
        for ``_link_pipeline``.

        The passes most plans are made of are built inline here (8,576 of 8,704 on a Megatron-1T fold point): a
        forward as one fused task (no trace detail, TP on links of its own, no per-layer gathers, no
        host-floor stall, no pending fused update) and a backward as one chain task (its recompute and its
        backward; no reduction inside the pass, no gradient accumulation kernel, not the step-in-backward
        case). Each builds the tasks, deps and bytes the general path (:meth:`forward_pass`,
        :meth:`backward_pass`) does -- per chunk (duration, segments, saved activation bytes) or (duration,
        parts, the bytes allocated and freed), found once -- with the same float operations (``0.0 + x``
        where the general path does ``+=``), and appends it as :meth:`add` does (inline: its chain's last
        task, then the side tasks carried, as the task's deps; on the compute stream and list)."""
        planner, par, actor, streams = self.planner, self.par, self.actor, self.streams
        stage, rank, m_total, pp, v = self.stage, self.rank, self.m_total, par.pp, par.virtual_stages
        start_gathers, pending_forward, grads_held = self.start_gathers, self.pending_forward, self.grads_held
        f_entry, f_exit, b_entry, b_exit = self.f_entry, self.f_exit, self.b_entry, self.b_exit
        carry, compute_list = self.carry, self.compute_list
        compute_stream = None  # fetched at the first inline pass, where add() would first touch it
        zero_bubble = par.schedule == "zb-h1"
        fast_forward: dict[int, tuple | None] | None = (
            {} if not (planner.detail or self.per_layer_gathers) and planner.tp_exclusive else None)
        fast_backward: dict[int, tuple | None] | None = (
            {} if planner.chains and not (zero_bubble or planner.detail or self.per_layer_gathers
                                          or self.sc.training.unfused_eager_kernels) else None)
        # where every backward with a reduction inside it takes the general path (overlapped_reduce)
        reduces_every_pass, zero = self.reduces_every_pass, self.zero
        step_in_backward = self.fusion == "backward" and m_total == 1
        working = None  # the stage's recompute working set, asked for at its first inline backward
        for phase, mb, chunk in self.order:
            g = chunk * pp + stage
            forward = phase == "F"
            if forward and fast_forward is not None and not pending_forward:
                hit = fast_forward.get(g, False)
                if hit is False:
                    hit = fast_forward[g] = (None if planner.host_floor_stall_s(rank, "F", planner.chunk_runs(g)) > 0
                                             else (*planner._fused_pass(rank, planner._chunk_ops("F", g), "compute"),
                                                   0.0 + planner.activation_bytes(g)))
            elif (phase == "B" and fast_backward is not None and grads_held and not step_in_backward
                  and not (reduces_every_pass and (zero >= 2 or mb == m_total - 1))):
                hit = fast_backward.get(g, False)
                if hit is False:
                    chain = planner._backward_chain_of(rank, g)
                    if chain is None:
                        hit = fast_backward[g] = None
                    else:
                        activations = planner.activation_bytes(g)
                        if working is None:
                            working = planner.working_bytes(stage)
                        hit = fast_backward[g] = (*chain, 0.0 + working, 0.0 + (working + activations))
            else:
                hit = None
            if hit is None:  # the general path
                if forward:
                    self.forward_pass(mb, g)
                elif phase == "W":
                    self.weight_pass(mb, g)
                else:
                    self.backward_pass(mb, g)
                continue
            # inline: appended as add() appends (its deps: the chain's last task, then the side tasks carried)
            prev = self.prev
            deps = [] if prev is None else [prev]
            if carry:
                deps.extend(carry)
                carry.clear()
            i = mb * v + chunk
            if forward:  # run_ops' fused task, the saved activations (+=, as forward_pass)
                task = Task(f"F.mb{mb}.c{g}", actor, "compute", "compute", duration_s=hit[0],
                            segments=hit[1], alloc_bytes=hit[2], deps=deps)
                f_entry[i] = f_exit[i] = task
            else:  # _backward_chain's task, backward_memory's bytes (+=, as there)
                task = Task(f"B.mb{mb}.c{g}", actor, "compute", "compute", duration_s=hit[0], parts=hit[1],
                            alloc_bytes=hit[2], free_bytes=hit[3], deps=deps)
                b_entry[i] = b_exit[i] = task
            if compute_stream is None:
                compute_stream = streams[(actor, "compute")]
            compute_stream.append(task)
            compute_list.append(task)
            self.prev = task
            if forward:
                if mb == 0 and g in start_gathers:
                    deps.append(start_gathers[g])
            elif mb == m_total - 1:
                self.fused_backward_update(g, mb)

    def forward_pass(self, mb: int, g: int) -> None:
        """Chunk ``g``'s forward of micro-batch ``mb`` (the general path): under optimizer fusion "forward"
        the previous step's update of the chunk first; per layer where trace detail or ZeRO-3 gathers ask
        for it (the embedding and head too), else one pass; its host-floor stall; the activations it saves
        for its backward allocated at its first task."""
        planner, actor = self.planner, self.actor
        tag = f"mb{mb}.c{g}"
        compute_list = self.compute_list
        pass_start = len(compute_list)
        if mb == 0 and g in self.pending_forward:  # optimizer fusion "forward": last step's update first
            update, waits_for = self.pending_forward.pop(g)
            self.add(update, waits_for)
            pass_start = len(compute_list)
        if planner.detail or self.per_layer_gathers:
            # ZeRO-3: the parameters outside the layers (embedding, final norm, untied head) are
            # gathered too, once per forward pass, and kept until the backward has run: FSDP2's
            # root fully_shard holds them and is not resharded after forward
            # (torch 2.13 fully_shard: reshard_after_forward is set False for the root). On one
            # stage that is one gather before the embedding; on a pipeline, the first and the
            # last stage gather their own part.
            last_chunk = planner.chunks - 1
            if g == 0:
                root = planner.prologue_params + (planner.epilogue_params if g == last_chunk else 0)
                self.run_ops(planner.embedding.forward, f"F.{tag}.embedding", "compute",
                             self.gather_params(f"F.{tag}.embedding", root) if root else (),
                             layer=planner.prologue_name)
            for layer in range(planner.layers_per_chunk[g]):
                label = f"F.{tag}.L{layer}"
                kind = planner.chunk_layer_kind(g, layer)
                done = self.run_ops(planner.layer_works[kind].forward, label, "compute",
                                    self.gather_params(label, planner.layer_params_held(kind),
                                                       planner.layer_params_split(kind)[1]),
                                    layer=planner.layer_name(g, layer))
                self.layer_ends.append(self.host_floor(label, "F", ((kind, 1),)) or done)
            if g == last_chunk:
                root = planner.epilogue_params if g != 0 else 0
                self.run_ops(planner.head.forward, f"F.{tag}.head", "compute",
                             self.gather_params(f"F.{tag}.head", root) if root else (), layer=planner.epilogue_name)
        else:  # one compute and one TP task for the whole chunk pass
            label = f"F.{tag}"
            self.run_ops(planner._chunk_ops("F", g), label, "compute", layer=planner.chunk_layers(g))
            if self.host_floor(label, "F", planner.chunk_runs(g)) is not None and planner.chains:
                self.prev = planner._chain_pass(compute_list, pass_start, self.streams[(actor, "compute")])
        entry = compute_list[pass_start]
        entry.alloc_bytes += planner.activation_bytes(g)  # saved for this chunk's backward
        if mb == 0 and g in self.start_gathers:
            entry.deps.append(self.start_gathers[g])
        i = mb * self.par.virtual_stages + g // self.par.pp
        self.f_entry[i], self.f_exit[i] = entry, self.prev

    def weight_pass(self, mb: int, g: int) -> None:
        """Zero bubble's weight-gradient pass of chunk ``g``, micro-batch ``mb``: the chunk's gradients
        are final after it, so its bucket is reduced then (on the last micro-batch, or every one under
        ZeRO-2/3)."""
        planner = self.planner
        tag = f"mb{mb}.c{g}"
        reduce_now = (mb == self.m_total - 1) if self.zero < 2 else True
        self.run_ops(planner._chunk_ops("W", g), f"W.{tag}", "compute", layer=planner.chunk_layers(g))
        self.host_floor(f"W.{tag}", "W", planner.chunk_runs(g))
        if reduce_now and self.dp_size > 1:
            bucket, grad_bytes = self.bucket, self.grad_bytes
            bucket["bytes"] += planner.chunk_params_local(g) * grad_bytes
            bucket["expert"] += planner._layers_params(planner.chunk_runs(g), expert_only=True) * grad_bytes
            self.flush_bucket(self.prev, f"W.{tag}")

    def backward_pass(self, mb: int, g: int) -> None:
        """Chunk ``g``'s backward of micro-batch ``mb`` (the general path): as one pass (its recompute, then
        its backward; one chain task where that is exact) unless trace detail, ZeRO-3 gathers or a gradient
        reduction overlapping it ask for layers (:meth:`backward_layers`); then the accumulation kernel,
        its memory and, on the last micro-batch, a fused update."""
        planner, actor, par = self.planner, self.actor, self.par
        tag = f"mb{mb}.c{g}"
        reduce_now = (mb == self.m_total - 1) if self.zero < 2 else True
        compute_list = self.compute_list
        pass_start = len(compute_list)
        overlapped_reduce = reduce_now and self.reduces_every_pass
        zero_bubble = par.schedule == "zb-h1"
        if not zero_bubble and (planner.detail or self.per_layer_gathers or overlapped_reduce):
            self.backward_layers(mb, g, tag, reduce_now, overlapped_reduce)
        else:
            chain = planner._backward_chain(actor, self.rank, g, tag) if planner.chains and not zero_bubble else None
            if chain is not None:
                self.add(chain)
            else:
                recompute_ops = planner._chunk_ops("R", g)
                if recompute_ops:
                    self.run_ops(recompute_ops, f"B.{tag}.recompute", "recompute", layer=planner.chunk_layers(g))
                    self.host_floor(f"B.{tag}.recompute", "R", planner.chunk_runs(g))
                self.run_ops(planner._chunk_ops("B", g), f"B.{tag}", "compute", layer=planner.chunk_layers(g))
                self.host_floor(f"B.{tag}", "B", planner.chunk_runs(g))
                if planner.chains:
                    self.prev = planner._chain_pass(compute_list, pass_start, self.streams[(actor, "compute")])
        self.accumulate_grads(g, mb, tag)
        self.backward_memory(g, compute_list[pass_start], self.prev)
        i = mb * par.virtual_stages + g // par.pp
        self.b_entry[i], self.b_exit[i] = compute_list[pass_start], self.prev
        self.fused_backward_update(g, mb)  # acts on the last micro-batch only

    def backward_layers(self, mb: int, g: int, tag: str, reduce_now: bool, overlapped_reduce: bool) -> None:
        """A backward built layer by layer (the head first, the embedding last): each layer's ZeRO-3 gather,
        recompute, backward and host-floor stall; with the reduction overlapped, each layer's gradients go
        into the bucket, reduced whenever it is full and at the pass's end.

        ZeRO-3 backward prefetch: the next layer's all-gather is queued before the reduce-scatter of
        the layer just done (FSDP BACKWARD_PRE, FSDP2 and Megatron-FSDP issue it when the current
        layer's backward starts), so the gather runs beside the current layer's kernels and the
        reduce-scatter beside the next one's; queued after it, every gather waited for the
        previous layer's reduce-scatter and the backward ran serially with its collectives.
        Host-blocking collectives (overlap_param_gather off: FSDP2 over gloo) keep that order."""
        planner, par = self.planner, self.par
        bucket, grad_bytes, flush_bucket = self.bucket, self.grad_bytes, self.flush_bucket
        if g == planner.chunks - 1:
            self.run_ops(planner.head.backward, f"B.{tag}.head", "compute", layer=planner.epilogue_name)
            if reduce_now:
                bucket["bytes"] += planner.epilogue_params * grad_bytes
        waiting_reduce: list[tuple[Task, str]] = []
        for layer in reversed(range(planner.layers_per_chunk[g])):
            label = f"B.{tag}.L{layer}"
            kind = planner.chunk_layer_kind(g, layer)
            work, lp = planner.layer_works[kind], planner.layer_params_local(kind)
            gathered = self.gather_params(label, planner.layer_params_held(kind), planner.layer_params_split(kind)[1])
            if waiting_reduce:
                flush_bucket(*waiting_reduce.pop())
            rc_ops, rc_runs = planner.unit_recompute(g, layer, par.recompute_mode)
            if rc_ops:
                self.run_ops(rc_ops, f"{label}.recompute", "recompute", gathered, layer=planner.layer_name(g, layer))
                self.host_floor(f"{label}.recompute", "R", rc_runs)
                gathered = ()
            done = self.run_ops(work.backward, label, "compute", gathered, layer=planner.layer_name(g, layer))
            done = self.host_floor(label, "B", ((kind, 1),)) or done
            self.layer_ends.append(done)
            if overlapped_reduce:
                bucket["bytes"] += lp * grad_bytes
                bucket["expert"] += planner.layer_params_split(kind)[1] * grad_bytes
                if bucket["bytes"] >= self.bucket_limit:
                    if self.per_layer_gathers and par.overlap_param_gather:
                        waiting_reduce.append((done, label))
                    else:
                        flush_bucket(done, label)
        if waiting_reduce:
            flush_bucket(*waiting_reduce.pop())
        if g == 0:
            self.run_ops(planner.embedding.backward, f"B.{tag}.embedding", "compute", layer=planner.prologue_name)
        if overlapped_reduce:
            if g == 0:
                bucket["bytes"] += planner.prologue_params * grad_bytes
            flush_bucket(self.prev, f"B.{tag}")

    def reduce_gradients(self) -> None:
        """The reductions after the whole backward: ZeRO-0/1 without overlapped reduction (and not zero
        bubble, which reduces after each W pass) reduce the stage's gradients in one bucket; with tied
        embeddings across pipeline stages, the first and last stage sum the two copies' gradients
        (Megatron's embedding all-reduce)."""
        planner, par, stage = self.planner, self.par, self.stage
        end_of_backward = self.prev
        if not (par.overlap_grad_reduce or self.zero >= 2 or par.schedule == "zb-h1") and self.dp_size > 1:
            bucket, grad_bytes = self.bucket, self.grad_bytes
            bucket["bytes"] = planner.stage_params_local(stage) * grad_bytes
            stage_kinds: dict[bool, int] = {}
            for c in range(par.virtual_stages):
                for kind, count in planner.chunk_runs(c * par.pp + stage):
                    stage_kinds[kind] = stage_kinds.get(kind, 0) + count
            bucket["expert"] = planner._layers_params(stage_kinds.items(), expert_only=True) * grad_bytes
            self.flush_bucket(end_of_backward, "grads")
        # Tied embeddings across pipeline stages: sum the two copies' gradients (Megatron).
        if planner.tied_trained_params and par.pp > 1 and stage in (0, par.pp - 1):
            task = planner.comm_task(self.actor, "dp", "dp_comm", "embedding_grad_all_reduce", self.rank,
                                     [("embedding", "all_reduce", planner.tied_trained_params * self.grad_bytes)],
                                     key="embedding_grad")
            if task is not None:
                task.deps.append(end_of_backward)
                self.streams[(self.actor, "dp")].append(task)
                self.dp_tasks.append(task)

    def optimizer_update(self) -> tuple[Task, ...]:
        """The optimizer step after the reductions, freeing the gradients (``zero_grad(set_to_none=True)``):
        one over the rank's parameters (its shard under ZeRO), followed by ZeRO-1/2's parameter all-gather
        unless that overlaps the next step's start (:meth:`gather_chunk_params`); or, under optimizer fusion,
        one per chunk -- "backward": the updates queued by :meth:`fused_backward_update`; "forward": deferred
        to the chunk's first forward of the next step (now on the run's last step). Returns the tasks that
        end the step (what the next step waits for)."""
        planner, par, dp_tasks = self.planner, self.par, self.dp_tasks
        for n, (reduced, nbytes) in enumerate(self.copy_back):  # DDP's finalize_backward (:meth:`flush_bucket`)
            self.add(Task(f"ddp_bucket_to_grad{n}", self.actor, "compute", "compute",
                          duration_s=self.compute.copy_s(nbytes)), (reduced,))
        local_params = planner.stage_params_local(self.stage)
        fusion, fused = self.fusion, self.fused
        if fusion == "backward":
            for g, waits_for in self.deferred:
                fused.append(self.add(self.chunk_update(g, f"optimizer_step.c{g}"), waits_for or tuple(dp_tasks)))
            return tuple(fused)
        if fusion == "forward":
            chunks = [c * par.pp + self.stage for c in range(par.virtual_stages)]
            if not planner.final_step:  # applied before each chunk's first forward of the next step
                planner._forward_updates[self.actor] = {
                    g: (self.chunk_update(g, f"optimizer_step.c{g}"), tuple(dp_tasks)) for g in chunks}
                return (self.prev, *dp_tasks)
            for g in chunks:  # the run's last step: nothing follows, update now
                fused.append(self.add(self.chunk_update(g, f"optimizer_step.c{g}"), tuple(dp_tasks)))
            return tuple(fused)
        zero = self.zero
        sharded = local_params / self.shard if zero >= 1 else local_params
        opt = Task("optimizer_step", self.actor, "compute", "optimizer",
                   duration_s=(self.compute.optimizer_step_s(sharded, self.optimizer_bytes)
                               if planner.local_update else 0.0))
        self.add(opt, tuple(dp_tasks))
        opt.free_bytes += sum(self.grads_held.values())  # zero_grad(set_to_none=True)
        ends: tuple[Task, ...] = (opt,)
        if zero in (1, 2) and self.dp_size > 1 and not par.overlap_param_gather:
            expert = sum(planner._layers_params(planner.chunk_runs(c * par.pp + self.stage), expert_only=True)
                         for c in range(par.virtual_stages))
            task = planner.comm_task(self.actor, "dp", "dp_comm", "param_all_gather", self.rank,
                                     self.weight_gather_parts(local_params, expert), key="param_gather")
            if task is not None:
                task.deps.append(opt)
                self.streams[(self.actor, "dp")].append(task)
                ends = (opt, task)
        return ends


def kernel_info(ops: tuple[Op, ...], layer: str | None) -> tuple[tuple[str, object], ...]:
    """Trace arguments of a kernel task: its layer and the FLOPs its kernels run (each op's FLOPs
    times the share it executes, e.g. causal attention's skipped tiles; workloads/graph.py ``Op``)."""
    flops = sum(op.flops * op.executed_fraction for op in ops if op.kind != "collective")
    out: tuple[tuple[str, object], ...] = (("layer", layer),) if layer else ()
    return (*out, ("flops", flops))
