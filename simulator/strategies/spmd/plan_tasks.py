"""The spmd planner's task building: the engine's task lists of every actor, their dependencies, and the
pipeline links between stages.

Part of :class:`simulator.strategies.spmd.plan.Planner` (a mixin: the methods read the planner's state, set up
in ``Planner.__init__``, and ask plan_costs.py for prices and plan_model.py for the model). It holds ``build``
(the :class:`Plan`), one actor's step (``_build_actor``: passes in schedule order, their collectives, gradient
reduction, ZeRO gathers, the optimizer step), the pipeline sends and their links (``_link_pipeline``,
``_stage_order``), the ZeRO-3 copy-in tasks, the fused forward and chained backward passes, and the trace
arguments of a kernel task (``kernel_info``).
"""

from __future__ import annotations

from collections import defaultdict

from simulator.engine.engine import Task, TaskPart
from simulator.scenario import gradient_bytes
from simulator.strategies.framework_terms import input_task, mark_interference
from simulator.strategies.plan import Plan
from simulator.strategies.spmd.plan_costs import OPTIMIZER_BYTES_PER_PARAM, WEIGHT_BYTES, comm_category
from simulator.strategies.spmd.schedule import stage_order, zero_bubble
from workloads.graph import Op


class PlanTasks:
    """The task building of :class:`~simulator.strategies.spmd.plan.Planner` (see the module docstring)."""

    # -- building --------------------------------------------------------------------------

    def build(self) -> Plan:
        """The plan of ``simulation.steps`` steps back to back: each actor's step k+1 starts (its
        first kernel, its start-of-step parameter gathers) after its optimizer step of step k and
        any parameter all-gather that follows it. With more than one step, task names and
        rendezvous keys carry ``s<k>.``."""
        streams: dict[tuple[str, str], list[Task]] = defaultdict(list)
        self._streams_ref = streams
        compute_tasks: dict[str, list[Task]] = defaultdict(list)
        steps = self.steps
        step_ends: list[list[Task]] = []
        boundary: dict[str, tuple[Task, ...]] = {}
        for step in range(steps):
            before = {key: len(tasks) for key, tasks in streams.items()}
            lookup: dict[tuple, Task] = {}
            self.final_step = step == steps - 1
            for actor, rank in self.actor_ranks.items():
                tasks, boundary[actor] = self._build_actor(actor, rank, streams, lookup, boundary.get(actor, ()))
                compute_tasks[actor].extend(tasks)
                load = self.input_task(actor, rank)
                if load is not None:  # the next step's samples, loaded beside this step: both end the step
                    streams[(actor, "input")].append(load)
                    boundary[actor] = (*boundary[actor], load)
            self._link_pipeline(lookup)
            extra_ends = self.after_step(step, streams, boundary)
            if steps > 1:
                for key, tasks in streams.items():
                    for task in tasks[before.get(key, 0):]:
                        task.name = f"s{step}.{task.name}"
                        if task.rendezvous is not None:
                            task.rendezvous = f"s{step}.{task.rendezvous}"
            step_ends.append([t for ends in boundary.values() for t in ends] + extra_ends)
        if not self.par.overlap_p2p_comm:
            self._block_on_sends(streams)
        self._mark_interference(streams)
        stage_of = {a: self.layout.coords(r).pp for a, r in self.actor_ranks.items()}
        memory_base = {a: self.base_memory_bytes(stage_of[a]) for a in self.actor_ranks}
        return Plan(dict(streams), dict(self.actor_ranks), stage_of, self.layers_per_chunk, self.topo,
                    dict(compute_tasks), steps=steps, step_ends=step_ends, memory_base_bytes=memory_base,
                    mode=self.mode)

    def input_task(self, actor: str, rank: int) -> Task | None:
        """The framework's input pipeline on a first-stage rank (``efficiency.input_us_per_sample``, set by a
        framework profile; Lambda's ResNet-50 fp16 rows were fitted so in sessions 6-7, validation/modern/cnn.py
        says why they no longer are): the next step's samples (the
        rank's micro-batches) loaded on the host beside this step's kernels, as a prefetching loader (PyTorch
        DataLoader workers, DALI) runs in steady state. The step ends no earlier than the load, and the next
        step's first kernel waits for it: a step takes max(GPU step, samples x time per sample)."""
        if self.layout.coords(rank).pp != 0:
            return None
        return input_task(self.sc.rank_accelerator(rank).efficiency, actor,
                          self.par.micro_batch_size * self.par.num_micro_batches)

    def after_step(self, step: int, streams, boundary: dict[str, tuple[Task, ...]]) -> list[Task]:
        """Hook for kinds built on this planner: add tasks after step ``step`` (e.g. an outer
        synchronisation every H steps), possibly replacing an actor's ``boundary`` (what its next step
        waits for). Returns extra tasks that mark the end of the step. The spmd kind adds nothing."""
        return []

    def _block_on_sends(self, streams) -> None:
        """Blocking point-to-point (``overlap_p2p_comm: false``): the sender's first compute task
        after a send's source pass waits for the send to finish."""
        for (actor, stream), tasks in list(streams.items()):
            if stream != "pp":
                continue
            compute = streams.get((actor, "compute"), [])
            position = {id(t): i for i, t in enumerate(compute)}
            for send in tasks:
                source = next((d for d in send.deps if id(d) in position), None)
                if source is not None and position[id(source)] + 1 < len(compute):
                    compute[position[id(source)] + 1].deps.append(send)

    def _mark_interference(self, streams) -> None:
        """Kernels slow by ``accelerator.efficiency.overlap_compute_slowdown`` while a collective
        or send/recv of the same rank runs beside them (communication kernels take SMs), and
        communication slows by ``overlap_comm_slowdown`` while a kernel of its rank runs; the
        engine applies both (see simulator/engine/engine.py). Only communication on its own stream can
        run beside a kernel; a blocking one leaves the compute stream idle."""
        effs = [g.accelerator.efficiency for g in self.sc.groups]
        if all(e.overlap_compute_slowdown <= 0 and e.overlap_comm_slowdown <= 0 for e in effs):
            return
        mark_interference(effs[0], streams, efficiency_of=lambda actor: (
            self.sc.rank_accelerator(self.actor_ranks[actor]).efficiency if actor in self.actor_ranks else effs[0]))

    def _build_actor(self, actor: str, rank: int, streams, lookup,
                     after: tuple[Task, ...] = ()) -> tuple[list[Task], tuple[Task, ...]]:
        """One step of ``actor``: its tasks on every stream, starting after ``after`` (the end of
        its previous step). Returns its compute tasks and the tasks that end its step."""
        par, sc = self.par, self.sc
        stage = self.layout.coords(rank).pp
        compute = self.compute_of(rank)  # this rank's accelerator (its node group's on a mixed cluster)
        m_total = par.num_micro_batches
        order = self._stage_order(rank, stage)
        compute_list: list[Task] = []
        prev: list[Task | None] = [None]   # last task on the compute/tp chain
        dp_tasks: list[Task] = []
        zero = par.zero_stage
        # weights are replicated over dp and cp (Megatron); a kind that does not reduce gradients every
        # step (local SGD) plans each replica on its own
        dp_size = par.dp_degree * par.cp if self.sync_gradients else 1
        shard = self.shard_size           # ZeRO shards: all of dp x cp, or a hybrid-sharding group
        weight_bytes = WEIGHT_BYTES[self.precision]
        grad_bytes = gradient_bytes(sc.training)

        layer_ends: list[Task] = []  # last task of each layer pass, for ZeRO-3 prefetch distance
        carry: list[Task] = list(after)  # side tasks (overlapped collectives) the next chained task waits for

        def add(task: Task | None, extra_deps: tuple[Task, ...] = ()) -> Task | None:
            if task is None:
                return None
            if prev[0] is not None:
                task.deps.append(prev[0])
            task.deps.extend(extra_deps)
            if carry:
                task.deps.extend(carry)
                carry.clear()
            streams[(actor, task.stream)].append(task)
            if task.stream == "compute":
                compute_list.append(task)
            prev[0] = task
            return task

        def run_ops(ops: tuple[Op, ...], label: str, category: str, first_deps: tuple[Task, ...] = (),
                    layer: str | None = None) -> Task | None:
            first = True
            last = None
            if not self.detail and self.tp_exclusive:
                # TP traffic has its links to itself: fold it into the kernel task (exact, fewer events).
                duration, segments = self._fused_pass(rank, ops, category)
                task = Task(label, actor, "compute", category, duration_s=duration, segments=segments)
                return add(task, first_deps)
            pending: Task | None = None  # an overlapped collective running beside the next kernel
            for kind, payload, name, overlapped in self._segments(rank, ops):
                deps = first_deps if first else ()
                first = False
                if kind == "compute":
                    task = Task(f"{label}.{name}", actor, "compute", category,
                                duration_s=self._compute_time(payload, rank))
                    if self.detail:  # for the trace: the layer and the FLOPs the kernels run
                        task.info = kernel_info(payload, layer)
                    last = add(task, deps) or last
                    if pending is not None:
                        carry.append(pending)  # the kernel after the overlapped one waits for it
                        pending = None
                    continue
                comm_cat = comm_category(payload[0][0])  # not `category`: the kernels after it keep theirs
                task = self.comm_task(actor, comm_cat.removesuffix("_comm"), comm_cat, f"{label}.{name}", rank, payload,
                                      key=f"{label}.{name}")
                if task is not None and self.detail and layer:
                    task.info = (("layer", layer),)
                if task is not None and overlapped:
                    task.deps.extend([t for t in (prev[0],) if t is not None] + list(deps))
                    streams[(actor, task.stream)].append(task)
                    pending = task
                else:
                    last = add(task, deps) or last
            if pending is not None:
                carry.append(pending)
            return last

        def host_floor(label: str, phase: str, runs) -> Task | None:
            """The stage's host-side floor (simulator/cost/host_floor.py): a stall after the pass."""
            stall = self.host_floor_stall_s(rank, phase, runs)
            if stall <= 0:
                return None
            return add(Task(f"{label}.host_floor", actor, "compute", "host_stall", duration_s=stall))

        def gather_params(label: str, params: float) -> tuple[Task, ...]:
            """ZeRO-3: all-gather a layer's weights on the dp stream, prefetched one task ahead
            (``overlap_param_gather``), or, with it off, issued only when the layer before has
            finished, so the compute waits for every gather (a host-blocking backend)."""
            if zero < 3 or dp_size == 1:
                return ()
            task = self.comm_task(actor, "dp", "dp_comm", f"{label}.zero3_gather", rank,
                                  [(self.shard_group, "all_gather", params * weight_bytes)], key=f"{label}.zero3_gather")
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
                copy_in_s = self.zero3_copy_in_s(compute, params, shard, weight_bytes)
                if par.overlap_param_gather:
                    copy_in = Task(f"{label}.zero3_copy_in", actor, "dp", "compute", duration_s=copy_in_s)
                    streams[(actor, "dp")].append(copy_in)
                    task.deps.append(copy_in)
                    copy_in.deps.extend(after)
                    first = copy_in
                else:
                    first = add(Task(f"{label}.zero3_copy_in", actor, "compute", "compute", duration_s=copy_in_s))
                    task.deps.append(first)
            else:
                first = task
            post = par.zero3_backward_prefetch == "post" and label.startswith("B.")
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
            dp_tasks.append(task)
            # the framework's host work around the gather beyond the law and the copies (FSDP2's unshard /
            # reshard in Python; an eager CPU/gloo profile carries it: ComputeModel.zero3_gather_host_s). The
            # host is the device there, so it counts as compute, as that profile's eager dispatch does
            host = (Task(f"{label}.zero3_gather_host", actor, "compute", "compute",
                         duration_s=compute.zero3_gather_host_s) if compute.zero3_gather_host_s > 0 else None)
            if par.zero_buffer_copies is not True:  # the layer's parameters are views of the gathered buffer
                if host is not None:
                    add(host, (task,))
                    return ()
                return (task,)  # (FSDP1's FlatParameter, Megatron-FSDP's buffers)
            # Copy-out of the gathered flat buffer into the layer's parameters, on the compute stream
            # after the gather (FSDP2 ``foreach_all_gather_copy_out`` -> ``split_with_sizes_copy`` of
            # the whole all-gather output, every rank's shard including this rank's own: shard x
            # params / shard elements; torch 2.13 _fsdp_collectives.py): read + write, memory-bound.
            # DeepSpeed ZeRO-3 is priced the same (not checked against its source).
            add(Task(f"{label}.zero3_copy_out", actor, "compute", "compute",
                     duration_s=compute.copy_s(params * weight_bytes)), (task,))
            add(host)
            return ()

        def accumulate_grads(g: int, mb: int, tag: str) -> None:
            """``unfused_eager_kernels``: after every micro-batch's backward but the first, the new
            gradients are added into the held ones (PyTorch AccumulateGrad), over the chunk's
            local gradients (its shard of them where ZeRO-2/3 reduce-scatter every micro-batch)."""
            if not sc.training.unfused_eager_kernels or mb == 0:
                return
            nbytes = self.chunk_params_local(g) * grad_bytes / (shard if zero >= 2 else 1)
            add(Task(f"B.{tag}.grad_accumulate", actor, "compute", "compute",
                     duration_s=compute.add_into_s(nbytes)))

        grads_held: dict[int, float] = {}  # chunk -> its gradient bytes, all allocated at the rank's first backward
        fusion = sc.training.optimizer_fusion
        optimizer_bytes = OPTIMIZER_BYTES_PER_PARAM[sc.training.optimizer] * (32 / 28 if self.precision == "fp32" else 1)
        fused: list[Task] = []  # per-chunk updates (optimizer fusion)
        deferred: list[tuple[int, tuple[Task, ...]]] = []  # (chunk, the reductions its fused update waits for)

        def chunk_update(g: int, name: str) -> Task:
            """The optimizer step of one model chunk's parameters, freeing its gradients."""
            task = Task(name, actor, "compute", "optimizer",
                        duration_s=compute.optimizer_step_s(self.chunk_params_local(g), optimizer_bytes))
            task.free_bytes += grads_held.get(g, 0.0)
            return task

        def fused_backward_update(g: int, mb: int) -> None:
            """Optimizer fusion "backward": with no data parallelism the chunk's update runs inline right
            after its last backward (PyTorch's step in backward). With data parallelism it waits for the
            chunk's gradient reduction: queued after the backward, each chunk's update waits only for the
            buckets reduced so far (overlapped reduction) so it runs while later chunks' gradients are
            still reduced (memory-bound kernels overlapping communication); without overlapped
            reduction, after the final reduction."""
            if fusion != "backward" or mb != m_total - 1:
                return
            if dp_size > 1:
                overlapped = par.overlap_grad_reduce or zero >= 2
                deferred.append((g, tuple(dp_tasks) if overlapped else ()))
                return
            fused.append(add(chunk_update(g, f"optimizer_step.c{g}"), tuple(dp_tasks)))

        pending_forward = self._forward_updates.pop(actor, {}) if fusion == "forward" else {}

        def backward_memory(g: int, entry: Task, exit_task: Task) -> None:
            """Memory over time of a backward pass: its recompute working set (and, on the rank's first
            backward of the step, every chunk's gradients) from its start; the working set and the
            chunk's saved activations freed at its end. Zero bubble's deferred W pass keeps only part of
            them (the linear layers' inputs); counted as freed with B, as the analytic count does (ZB-H1
            keeps 1F1B's peak, Qi et al. 2024 Sec. 3.1) -- an approximation."""
            working = self.working_bytes(stage)
            entry.alloc_bytes += working
            if fusion == "backward" and m_total == 1:
                # step in backward without accumulation: one module's gradients alive at a time
                transient = self.largest_module_gradient_bytes(stage)
                entry.alloc_bytes += transient
                exit_task.free_bytes += transient
                grads_held[g] = 0.0
            elif not grads_held:  # every chunk's gradient buffer (Megatron-Core: one per chunk, all alive)
                for c in range(par.virtual_stages):
                    chunk = c * par.pp + stage
                    grads_held[chunk] = self.gradient_bytes_of_chunk(stage, chunk)
                    entry.alloc_bytes += grads_held[chunk]
            exit_task.free_bytes += working + self.activation_bytes(g)

        # Gradient buckets (ZeRO 0/1: once, on the last micro-batch; ZeRO 2/3: every micro-batch).
        bucket_limit = par.gradient_bucket_mb * 1e6
        bucket = {"bytes": 0.0, "expert": 0.0, "n": 0}
        reduce_kind = "all_reduce" if zero == 0 else "reduce_scatter"

        def flush_bucket(after: Task, label: str) -> None:
            dense, expert = bucket["bytes"] - bucket["expert"], bucket["expert"]
            bucket["bytes"] = bucket["expert"] = 0.0
            if dense + expert <= 0 or dp_size == 1:
                return
            after = self._copy_in(actor, after, label, dense + expert, zero, add)
            if zero >= 3 and compute.zero3_reduce_host_s > 0:
                # the framework's host work around the reduce beyond the law and the copy-in (FSDP2's
                # post_backward / foreach_reduce in Python; an eager CPU/gloo profile carries it)
                after = add(Task(f"{label}.zero3_reduce_host", actor, "compute", "compute",
                                 duration_s=compute.zero3_reduce_host_s), (after,))
            # Dense gradients are reduced over dp (x cp); expert gradients over the expert-data-
            # parallel group (dp / ep ranks holding the same experts).
            steps = [(self.shard_group if zero >= 1 else self.grad_group, reduce_kind, dense), ("edp", reduce_kind, expert)]
            if self.hybrid_replicas > 1 and zero >= 1:
                # HSDP: the reduce-scattered shard is then all-reduced across the replicas.
                steps.insert(1, ("zrep", "all_reduce", dense / self.shard_size))
            for group, kind, nbytes in steps:
                if nbytes <= 0:
                    continue
                task = self.comm_task(actor, "dp", "dp_comm", f"{label}.{group}_grad_{kind}", rank,
                                      [(group, kind, nbytes)], key=f"{label}.{group}grad{bucket['n']}")
                if task is None:
                    continue
                task.deps.append(after)
                streams[(actor, "dp")].append(task)
                dp_tasks.append(task)
                if zero >= 3 and not par.zero3_reduce_overlap:
                    # host-blocking reduce (FSDP2 over gloo on a CPU, torch 2.13): post_backward runs on the
                    # autograd thread and foreach_reduce calls reduce_scatter_comm without async_op (False:
                    # dist.reduce_scatter_single waits for the work), inside device_handle.stream(...) of a
                    # torch.cpu.Stream, whose stream context, wait_stream and events do nothing
                    # (_fsdp_collectives.py foreach_reduce; _fsdp_param_group.py post_backward;
                    # torch/cpu/__init__.py): the next layer's backward starts once the reduce is done
                    carry.append(task)
            bucket["n"] += 1

        # ZeRO-1/2 with overlapped parameter all-gather: gather each chunk's updated weights
        # at the start of the step, before its first forward (Megatron's overlap_param_gather).
        start_gathers: dict[int, Task] = {}
        if zero in (1, 2) and dp_size > 1 and par.overlap_param_gather:
            for c in range(par.virtual_stages):
                g = c * par.pp + stage
                task = self.comm_task(actor, "dp", "dp_comm", f"c{g}.param_all_gather", rank,
                                      [(self.shard_group, "all_gather", self.chunk_params_local(g) * weight_bytes)],
                                      key=f"c{g}.param_gather")
                if task is not None:
                    task.deps.extend(after)
                    streams[(actor, "dp")].append(task)
                    dp_tasks.append(task)
                    start_gathers[g] = task

        last_chunk = self.chunks - 1
        recompute = par.recompute_mode
        # the same for every pass (read once: the loop runs once per pass, 8,448 on a Megatron-1T fold point)
        per_layer_gathers = zero >= 3 and dp_size > 1
        zero_bubble = par.schedule == "zb-h1"
        reduces_every_pass = dp_size > 1 and (par.overlap_grad_reduce or zero >= 2)
        accumulates = sc.training.unfused_eager_kernels  # accumulate_grads adds a task only then
        pp, layers_per_chunk = par.pp, self.layers_per_chunk
        # The passes most plans are made of, built inline (8,448 on a Megatron-1T fold point): a forward as one
        # fused task (no trace detail, TP on links of its own, no per-layer gathers, no host-floor stall) and
        # a backward as one chain task (its recompute and its backward; no reduction inside the pass, no
        # gradient accumulation kernel). Each builds the tasks, deps and bytes the general path below does:
        # per chunk (duration, segments, saved activation bytes) or (duration, parts, activation bytes).
        fast_forward: dict[int, tuple | None] = {} if not (self.detail or per_layer_gathers) and self.tp_exclusive else None
        fast_backward: dict[int, tuple | None] = ({} if self.chains and not (zero_bubble or self.detail or per_layer_gathers
                                                                               or accumulates) else None)
        working = None  # the stage's recompute working set, asked for at its first backward
        for phase, mb, chunk in order:
            g = chunk * pp + stage
            if phase == "F" and fast_forward is not None and not pending_forward:
                hit = fast_forward.get(g, False)
                if hit is False:
                    hit = fast_forward[g] = (None if self.host_floor_stall_s(rank, "F", self.chunk_runs(g)) > 0 else
                                             (*self._fused_pass(rank, self._chunk_ops("F", g), "compute"),
                                              self.activation_bytes(g)))
                if hit is not None:  # run_ops' fused task, add(), the saved activations (+=, as below)
                    entry = add(Task(f"F.mb{mb}.c{g}", actor, "compute", "compute", duration_s=hit[0],
                                     segments=hit[1], alloc_bytes=0.0 + hit[2]))
                    if mb == 0 and g in start_gathers:
                        entry.deps.append(start_gathers[g])
                    lookup[("F_entry", actor, mb, g)] = entry
                    lookup[("F_exit", actor, mb, g)] = entry
                    continue
            elif (phase == "B" and fast_backward is not None and grads_held and not (fusion == "backward" and m_total == 1)
                  and not (reduces_every_pass and (zero >= 2 or mb == m_total - 1))):  # not overlapped_reduce
                hit = fast_backward.get(g, False)
                if hit is False:
                    chain = self._backward_chain_of(rank, g)
                    hit = fast_backward[g] = None if chain is None else (*chain, self.activation_bytes(g))
                if hit is not None:  # _backward_chain's task, add(), backward_memory's bytes (+=, as below)
                    if working is None:
                        working = self.working_bytes(stage)
                    task = add(Task(f"B.mb{mb}.c{g}", actor, "compute", "compute", duration_s=hit[0], parts=hit[1],
                                    alloc_bytes=0.0 + working, free_bytes=0.0 + (working + hit[2])))
                    lookup[("B_entry", actor, mb, g)] = task
                    lookup[("B_exit", actor, mb, g)] = task
                    if mb == m_total - 1:
                        fused_backward_update(g, mb)
                    continue
            n_layers = layers_per_chunk[g]
            tag = f"mb{mb}.c{g}"
            reduce_now = (mb == m_total - 1) if zero < 2 else True
            pass_start = len(compute_list)
            overlapped_reduce = reduce_now and reduces_every_pass
            if phase == "F":
                if mb == 0 and g in pending_forward:  # optimizer fusion "forward": last step's update first
                    update, waits_for = pending_forward.pop(g)
                    add(update, waits_for)
                    pass_start = len(compute_list)
                if self.detail or per_layer_gathers:
                    # ZeRO-3: the parameters outside the layers (embedding, final norm, untied head) are
                    # gathered too, once per forward pass, and kept until the backward has run: FSDP2's
                    # root fully_shard holds them and is not resharded after forward
                    # (torch 2.13 fully_shard: reshard_after_forward is set False for the root). On one
                    # stage that is one gather before the embedding; on a pipeline, the first and the
                    # last stage gather their own part.
                    if g == 0:
                        root = self.prologue_params + (self.epilogue_params if g == last_chunk else 0)
                        run_ops(self.embedding.forward, f"F.{tag}.embedding", "compute",
                                gather_params(f"F.{tag}.embedding", root) if root else (), layer=self.prologue_name)
                    for layer in range(n_layers):
                        label = f"F.{tag}.L{layer}"
                        kind = self.chunk_layer_kind(g, layer)
                        done = run_ops(self.layer_works[kind].forward, label, "compute",
                                       gather_params(label, self.layer_params_held(kind)),
                                       layer=self.layer_name(g, layer))
                        layer_ends.append(host_floor(label, "F", ((kind, 1),)) or done)
                    if g == last_chunk:
                        root = self.epilogue_params if g != 0 else 0
                        run_ops(self.head.forward, f"F.{tag}.head", "compute",
                                gather_params(f"F.{tag}.head", root) if root else (), layer=self.epilogue_name)
                else:  # one compute and one TP task for the whole chunk pass
                    label = f"F.{tag}"
                    run_ops(self._chunk_ops("F", g), label, "compute", layer=self.chunk_layers(g))
                    if host_floor(label, "F", self.chunk_runs(g)) is not None and self.chains:
                        prev[0] = self._chain_pass(compute_list, pass_start, streams[(actor, "compute")])
                entry = compute_list[pass_start]
                entry.alloc_bytes += self.activation_bytes(g)  # saved for this chunk's backward
                if mb == 0 and g in start_gathers:
                    entry.deps.append(start_gathers[g])
                lookup[("F_entry", actor, mb, g)] = entry
                lookup[("F_exit", actor, mb, g)] = prev[0]
                continue
            if phase == "W":  # zero-bubble weight-gradient pass; the chunk's gradients are final after it
                run_ops(self._chunk_ops("W", g), f"W.{tag}", "compute", layer=self.chunk_layers(g))
                host_floor(f"W.{tag}", "W", self.chunk_runs(g))
                if reduce_now and dp_size > 1:
                    bucket["bytes"] += self.chunk_params_local(g) * grad_bytes
                    bucket["expert"] += self._layers_params(self.chunk_runs(g), expert_only=True) * grad_bytes
                    flush_bucket(prev[0], f"W.{tag}")
                continue
            if zero_bubble or not (self.detail or per_layer_gathers or overlapped_reduce):
                chain = self._backward_chain(actor, rank, g, tag) if self.chains and not zero_bubble else None
                if chain is not None:
                    add(chain)
                else:
                    recompute_ops = self._chunk_ops("R", g)
                    if recompute_ops:
                        run_ops(recompute_ops, f"B.{tag}.recompute", "recompute", layer=self.chunk_layers(g))
                        host_floor(f"B.{tag}.recompute", "R", self.chunk_runs(g))
                    run_ops(self._chunk_ops("B", g), f"B.{tag}", "compute", layer=self.chunk_layers(g))
                    host_floor(f"B.{tag}", "B", self.chunk_runs(g))
                    if self.chains:
                        prev[0] = self._chain_pass(compute_list, pass_start, streams[(actor, "compute")])
                if accumulates:
                    accumulate_grads(g, mb, tag)
                backward_memory(g, compute_list[pass_start], prev[0])
                lookup[("B_entry", actor, mb, g)] = compute_list[pass_start]
                lookup[("B_exit", actor, mb, g)] = prev[0]
                if mb == m_total - 1:  # fused_backward_update acts on the last micro-batch only
                    fused_backward_update(g, mb)
                continue
            if g == last_chunk:
                run_ops(self.head.backward, f"B.{tag}.head", "compute", layer=self.epilogue_name)
                if reduce_now:
                    bucket["bytes"] += self.epilogue_params * grad_bytes
            # ZeRO-3 backward prefetch: the next layer's all-gather is queued before the reduce-scatter of
            # the layer just done (FSDP BACKWARD_PRE, FSDP2 and Megatron-FSDP issue it when the current
            # layer's backward starts), so the gather runs beside the current layer's kernels and the
            # reduce-scatter beside the next one's; queued after it, every gather waited for the
            # previous layer's reduce-scatter and the backward ran serially with its collectives.
            # Host-blocking collectives (overlap_param_gather off: FSDP2 over gloo) keep that order.
            waiting_reduce: list[tuple[Task, str]] = []
            for layer in reversed(range(n_layers)):
                label = f"B.{tag}.L{layer}"
                kind = self.chunk_layer_kind(g, layer)
                work, lp = self.layer_works[kind], self.layer_params_local(kind)
                gathered = gather_params(label, self.layer_params_held(kind))
                if waiting_reduce:
                    flush_bucket(*waiting_reduce.pop())
                rc_ops, rc_runs = self.unit_recompute(g, layer, recompute)
                if rc_ops:
                    run_ops(rc_ops, f"{label}.recompute", "recompute", gathered, layer=self.layer_name(g, layer))
                    host_floor(f"{label}.recompute", "R", rc_runs)
                    gathered = ()
                done = run_ops(work.backward, label, "compute", gathered, layer=self.layer_name(g, layer))
                done = host_floor(label, "B", ((kind, 1),)) or done
                layer_ends.append(done)
                if overlapped_reduce:
                    bucket["bytes"] += lp * grad_bytes
                    bucket["expert"] += self.layer_params_split(kind)[1] * grad_bytes
                    if bucket["bytes"] >= bucket_limit:
                        if per_layer_gathers and par.overlap_param_gather:
                            waiting_reduce.append((done, label))
                        else:
                            flush_bucket(done, label)
            if waiting_reduce:
                flush_bucket(*waiting_reduce.pop())
            if g == 0:
                run_ops(self.embedding.backward, f"B.{tag}.embedding", "compute", layer=self.prologue_name)
            if overlapped_reduce:
                if g == 0:
                    bucket["bytes"] += self.prologue_params * grad_bytes
                flush_bucket(prev[0], f"B.{tag}")
            accumulate_grads(g, mb, tag)
            backward_memory(g, compute_list[pass_start], prev[0])
            lookup[("B_entry", actor, mb, g)] = compute_list[pass_start]
            lookup[("B_exit", actor, mb, g)] = prev[0]
            fused_backward_update(g, mb)

        end_of_backward = prev[0]
        if not (par.overlap_grad_reduce or zero >= 2 or par.schedule == "zb-h1") and dp_size > 1:
            bucket["bytes"] = self.stage_params_local(stage) * grad_bytes
            stage_kinds: dict[bool, int] = {}
            for c in range(par.virtual_stages):
                for kind, count in self.chunk_runs(c * par.pp + stage):
                    stage_kinds[kind] = stage_kinds.get(kind, 0) + count
            bucket["expert"] = self._layers_params(stage_kinds.items(), expert_only=True) * grad_bytes
            flush_bucket(end_of_backward, "grads")
        # Tied embeddings across pipeline stages: sum the two copies' gradients (Megatron).
        if self.tied_trained_params and par.pp > 1 and stage in (0, par.pp - 1):
            task = self.comm_task(actor, "dp", "dp_comm", "embedding_grad_all_reduce", rank,
                                  [("embedding", "all_reduce", self.tied_trained_params * grad_bytes)],
                                  key="embedding_grad")
            if task is not None:
                task.deps.append(end_of_backward)
                streams[(actor, "dp")].append(task)
                dp_tasks.append(task)

        local_params = self.stage_params_local(stage)
        if fusion == "backward":
            for g, waits_for in deferred:
                fused.append(add(chunk_update(g, f"optimizer_step.c{g}"), waits_for or tuple(dp_tasks)))
            return compute_list, tuple(fused)
        if fusion == "forward":
            chunks = [c * par.pp + stage for c in range(par.virtual_stages)]
            if not self.final_step:  # applied before each chunk's first forward of the next step
                self._forward_updates[actor] = {g: (chunk_update(g, f"optimizer_step.c{g}"), tuple(dp_tasks))
                                                for g in chunks}
                return compute_list, (prev[0], *dp_tasks)
            for g in chunks:  # the run's last step: nothing follows, update now
                fused.append(add(chunk_update(g, f"optimizer_step.c{g}"), tuple(dp_tasks)))
            return compute_list, tuple(fused)
        sharded = local_params / shard if zero >= 1 else local_params
        opt = Task("optimizer_step", actor, "compute", "optimizer",
                   duration_s=compute.optimizer_step_s(sharded, optimizer_bytes) if self.local_update else 0.0)
        add(opt, tuple(dp_tasks))
        opt.free_bytes += sum(grads_held.values())  # zero_grad(set_to_none=True)
        ends: tuple[Task, ...] = (opt,)
        if zero in (1, 2) and dp_size > 1 and not par.overlap_param_gather:
            task = self.comm_task(actor, "dp", "dp_comm", "param_all_gather", rank,
                                  [(self.shard_group, "all_gather", local_params * weight_bytes)], key="param_gather")
            if task is not None:
                task.deps.append(opt)
                streams[(actor, "dp")].append(task)
                ends = (opt, task)
        return compute_list, ends

    def _link_pipeline(self, lookup: dict[tuple, Task]) -> None:
        """Add the sends between stages and the cross-stage dependencies (in the order of ``lookup``:
        the engine runs a stream's tasks in list order and wakes waiters in the order they came)."""
        par = self.par
        last = self.chunks - 1
        coords = {actor: self.layout.coords(rank) for actor, rank in self.actor_ranks.items()}
        edges: dict[tuple[str, str, int], tuple] = {}  # (kind, actor, chunk) -> how its pass hands on

        def edge(kind: str, actor: str, g: int) -> tuple:
            """(receiver actor, within the stage, send prototype or None, name prefix): the same for every
            micro-batch of the chunk, so worked out once."""
            forward = kind == "F_exit"
            dst_stage = (g + 1) % par.pp if forward else (g - 1) % par.pp
            c = coords[actor]
            dst = self._pipeline_peer(self.layout.rank(type(c)(c.tp, c.cp, c.dp, dst_stage)), dst_stage)
            dst_actor = self.rank_actor[dst]
            if dst_stage == c.pp:
                return dst_actor, True, None, None, None
            prefix = "send_act" if forward else "send_grad"
            payload = self._pp_payload(g if forward else g - 1)
            proto = self.send_task(actor, dst, prefix, payload)
            # a cached pipeline edge: every micro-batch's send is this one renamed (a wide-area route
            # is asked for per send, as before)
            reusable = self.wan is None and proto.propagation_s == 0.0
            return dst_actor, False, (proto if reusable else (dst, payload)), prefix, streams[(actor, "pp")]

        streams = self._streams_ref
        for (kind, actor, mb, g), task in lookup.items():  # read only: the tasks' deps change, not the keys
            if kind == "F_exit":
                if g == last:
                    lookup[("B_entry", actor, mb, g)].deps.append(task)
                    continue
            elif kind != "B_exit" or g == 0:
                continue
            key = (kind, actor, g)
            hit = edges.get(key)
            if hit is None:
                hit = edges[key] = edge(kind, actor, g)
            dst_actor, local, proto, prefix, pp_stream = hit
            receiver = ("F_entry", dst_actor, mb, g + 1) if kind == "F_exit" else ("B_entry", dst_actor, mb, g - 1)
            if local:
                lookup[receiver].deps.append(task)
                continue
            name = f"{prefix}.mb{mb}.c{g}"
            if isinstance(proto, Task):
                send = Task(name, actor, "pp", "pp_comm", demands=proto.demands, latency_s=proto.latency_s,
                            deps=[task])
            else:
                send = self.send_task(actor, proto[0], name, proto[1])
                send.deps.append(task)
            pp_stream.append(send)
            lookup[receiver].deps.append(send)

    def _pipeline_peer(self, rank: int, stage: int) -> int:
        """The simulated rank that receives a send meant for ``rank`` of ``stage``: itself, or in
        symmetric mode on a mixed cluster (each stage represented by a rank of its slowest group, not
        all of one replica) the stage's representative."""
        return rank if rank in self.rank_actor else self.stage_representative(stage)

    def _stage_order(self, rank: int, stage: int):
        par = self.par
        if par.schedule != "zb-h1":
            return stage_order(par.schedule, par.num_micro_batches, par.pp, stage, par.virtual_stages)
        if self._zero_bubble_orders is None:
            # Pass times of a middle stage (no embedding or loss), isolated, for the list schedule.
            g = min(1, self.chunks - 1) if self.chunks > 2 else 0
            t_f, t_b, t_w = (sum(self.pass_cost_s(rank, self._chunk_ops(ph, g))) for ph in ("F", "B", "W"))
            t_b += sum(self.pass_cost_s(rank, self._chunk_ops("R", g)))
            t_comm = 0.0
            if par.pp > 1:
                probe = self.send_task(self.rank_actor[self.stage_representative(0)],
                                       self.stage_representative(1), "probe", self._pp_payload())
                t_comm = probe.latency_s + max(b / self.topo.port_capacity(p) for p, b in probe.demands.items())
            self._zero_bubble_orders = zero_bubble(par.num_micro_batches, par.pp, t_f, t_b, t_w, t_comm)
        return self._zero_bubble_orders[stage]

    def _copy_in(self, actor: str, after: Task, label: str, grad_bytes: float, zero: int, add) -> Task:
        """ZeRO-2/3 copy the bucket's gradients into the flat reduce-scatter input first
        (FSDP2 ``foreach_reduce`` -> ``foreach_reduce_scatter_copy_in`` -> ``chunk_cat`` of the
        unsharded gradients, every element once; torch 2.13 _fsdp_collectives.py; DeepSpeed's ipg
        bucket): a memory-bound kernel on the compute stream."""
        if zero < 2 or not self.par.zero_buffer_copies:
            return after
        compute = self.compute_of(self.actor_ranks[actor])
        if self.par.zero_buffer_copies is True:
            return add(Task(f"{label}.grad_copy_in", actor, "compute", "compute",
                            duration_s=compute.copy_s(grad_bytes)))
        # FSDP1 (torch fsdp/_flat_param.py, _runtime_utils.py): the layers' parameters are views split
        # from the flat parameter (FlatParamHandle._use_unsharded_views, as tensors in forward), so
        # autograd's split backward concatenates their gradients into the flat gradient, in the
        # parameters' dtype, on the compute stream; the post-backward hook then, on its own stream ahead
        # of the reduce-scatter, casts it to the reduce dtype where that differs
        # (``flat_param.grad.to(handle._reduce_dtype)``) and divides it in place by the predivide factor
        # (_reduce_grad -> _div_if_needed; _get_gradient_predivide_factor is > 1 for every world size >= 2).
        weight_bytes, reduce_bytes = WEIGHT_BYTES[self.precision], gradient_bytes(self.sc.training)
        elements = grad_bytes / reduce_bytes
        gathered = add(Task(f"{label}.grad_cat", actor, "compute", "compute",
                            duration_s=compute.copy_s(elements * weight_bytes)))
        cast = compute.copy_s(elements * (weight_bytes + reduce_bytes) / 2) if reduce_bytes != weight_bytes else 0.0
        divide = Task(f"{label}.grad_predivide", actor, "dp", "compute", duration_s=cast + compute.copy_s(grad_bytes))
        divide.deps.append(gathered)
        self._streams_ref[(actor, "dp")].append(divide)
        return divide

    def _pp_stream(self, actor: str) -> list[Task]:
        return self._streams_ref[(actor, "pp")]

    def _fused_pass(self, rank: int, ops: tuple[Op, ...], category: str):
        """(seconds, segments) of one task for ``ops`` with its exposed TP time folded in (where TP
        traffic has its links to itself); segments None when nothing is exposed. Cached per op tuple."""
        key = ("fused_task", id(ops), self._comm_class(rank), category)
        hit = self._time_cache.get(key)
        if hit is None or hit[0] is not ops:
            compute_s, comm = self.pass_cost_by_category(rank, ops)
            comm = {k: v for k, v in comm.items() if v > 0}
            hit = self._time_cache[key] = (ops, compute_s + sum(comm.values()),
                                           ((category, compute_s), *comm.items()) if comm else None)
        return hit[1], hit[2]

    def _backward_chain(self, actor: str, rank: int, g: int, tag: str) -> Task | None:
        """The chain task of a backward pass with recompute (its recompute, then its backward: one engine
        task, simulator/engine/engine.py) built directly, or None where the pass has no recompute or a
        host-floor stall (then its tasks are built one by one and chained by :meth:`_chain_pass`)."""
        chain = self._backward_chain_of(rank, g)
        if chain is None:
            return None
        return Task(f"B.{tag}", actor, "compute", "compute", duration_s=chain[0], parts=chain[1])

    def _backward_chain_of(self, rank: int, g: int) -> tuple[float, tuple[TaskPart, ...]] | None:
        """:meth:`_backward_chain_parts`, cached per (chunk, rank) (asked once per backward pass)."""
        chain = self._time_cache.get(("backward_chain_of", g, rank), False)
        if chain is False:
            chain = self._time_cache[("backward_chain_of", g, rank)] = self._backward_chain_parts(rank, g)
        return chain

    def _backward_chain_parts(self, rank: int, g: int) -> tuple[float, tuple[TaskPart, ...]] | None:
        """(duration, parts) of the chain task of chunk ``g``'s backward on ``rank``, or None (:meth:`_backward_chain`)."""
        recompute_ops = self._chunk_ops("R", g)
        if not recompute_ops:
            return None
        runs = self.chunk_runs(g)
        if self.host_floor_stall_s(rank, "R", runs) > 0 or self.host_floor_stall_s(rank, "B", runs) > 0:
            return None
        key = ("backward_chain", g, self._comm_class(rank))
        hit = self._time_cache.get(key)
        if hit is None:
            r_s, r_segments = self._fused_pass(rank, recompute_ops, "recompute")
            b_s, b_segments = self._fused_pass(rank, self._chunk_ops("B", g), "compute")
            hit = self._time_cache[key] = (r_s + b_s, (TaskPart(".recompute", "recompute", r_s, r_segments),
                                                       TaskPart("", "compute", b_s, b_segments)))
        return hit

    def _chain_pass(self, compute_list: list[Task], pass_start: int, stream: list[Task]) -> Task:
        """Make the pass's compute tasks (``compute_list[pass_start:]``, the tail of the compute ``stream``)
        one chain task where there are several and each waits only for the one before it (its recompute,
        its backward, a host-floor stall): the first task stands for all (its deps), the others leave the
        lists. Called before the pass's memory is counted and before anything else refers to its tasks.
        Returns the pass's last task (the chain, or the last one left as it was)."""
        tasks = compute_list[pass_start:]
        if len(tasks) < 2 or stream[-len(tasks):] != tasks:
            return compute_list[-1]
        for before, task in zip(tasks, tasks[1:], strict=False):
            if len(task.deps) != 1 or task.deps[0] is not before:
                return compute_list[-1]
        for task in tasks:
            if (task.demands is not None or task.rendezvous is not None or task.parts is not None
                    or task.alloc_bytes or task.free_bytes or task.propagation_s or task.info):
                return compute_list[-1]
        name = min((t.name for t in tasks), key=len)  # the pass's name; its parts' names add a suffix
        if not all(t.name.startswith(name) for t in tasks):
            return compute_list[-1]
        head, last = tasks[0], tasks[-1]
        head.parts = tuple(TaskPart(t.name[len(name):], t.category, t.duration_s, t.segments) for t in tasks)
        head.duration_s = sum(t.duration_s for t in tasks)
        head.name, head.category, head.segments = name, last.category, None
        del compute_list[pass_start + 1:]
        del stream[len(stream) - len(tasks) + 1:]
        return head


def kernel_info(ops: tuple[Op, ...], layer: str | None) -> tuple[tuple[str, object], ...]:
    """Trace arguments of a kernel task: its layer and the FLOPs its kernels run (each op's FLOPs
    times the share it executes, e.g. causal attention's skipped tiles; workloads/graph.py ``Op``)."""
    flops = sum(op.flops * op.executed_fraction for op in ops if op.kind != "collective")
    out: tuple[tuple[str, object], ...] = (("layer", layer),) if layer else ()
    return (*out, ("flops", flops))
