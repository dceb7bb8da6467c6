"""The spmd planner's task building: the engine's task lists of every actor, their dependencies, and the
pipeline links between stages.

Part of :class:`simulator.strategies.spmd.plan.Planner` (a mixin: the methods read the planner's state, set up
in ``Planner.__init__``, and ask plan_costs.py for prices and plan_model.py for the model). It holds ``build``
(the :class:`Plan`), one actor's step (``_build_actor``, a short driver of
:class:`~simulator.strategies.spmd.actor_tasks.ActorTasks` in actor_tasks.py: passes in schedule order, their
collectives, gradient reduction, ZeRO gathers, the optimizer step), the pipeline sends and their links
(``_link_pipeline``, ``_stage_order``), and the fused forward and chained backward passes those steps ask for.
"""

from __future__ import annotations

from collections import defaultdict

from simulator.engine.engine import Task, TaskPart
from simulator.strategies.framework_terms import input_task, mark_interference
from simulator.strategies.plan import Plan
from simulator.strategies.spmd.actor_tasks import ActorTasks, kernel_info
from simulator.strategies.spmd.schedule import stage_order, zero_bubble
from workloads.graph import Op

__all__ = ["PlanTasks", "kernel_info"]


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
            passes: dict[str, ActorTasks] = {}  # actor -> its step's passes (their pipeline entries and exits)
            self.final_step = step == steps - 1
            for actor, rank in self.actor_ranks.items():
                tasks, boundary[actor] = self._build_actor(actor, rank, streams, passes, boundary.get(actor, ()))
                compute_tasks[actor].extend(tasks)
                load = self.input_task(actor, rank)
                if load is not None:  # the next step's samples, loaded beside this step: both end the step
                    streams[(actor, "input")].append(load)
                    boundary[actor] = (*boundary[actor], load)
            self._link_pipeline(passes)
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

    def _build_actor(self, actor: str, rank: int, streams, passes: dict[str, ActorTasks],
                     after: tuple[Task, ...] = ()) -> tuple[list[Task], tuple[Task, ...]]:
        """One step of ``actor``: its tasks on every stream, starting after ``after`` (the end of
        its previous step), recorded in ``passes[actor]`` for :meth:`_link_pipeline`. Returns its compute
        tasks and the tasks that end its step. The phases are
        :class:`~simulator.strategies.spmd.actor_tasks.ActorTasks`' methods (actor_tasks.py)."""
        tasks = passes[actor] = ActorTasks(self, actor, rank, streams, after)
        tasks.gather_chunk_params()  # ZeRO-1/2 with overlapped gathers: each chunk's weights at the start
        tasks.run_passes()  # forward / backward / W passes in schedule order, reductions that overlap them
        tasks.reduce_gradients()  # reductions after the backward
        return tasks.compute_list, tasks.optimizer_update()

    def _link_pipeline(self, passes: dict[str, ActorTasks]) -> None:
        """Add the sends between stages and the cross-stage dependencies: actor by actor (the order of
        ``passes``, the build's), each actor's passes in its schedule order (the engine runs a stream's
        tasks in list order and wakes waiters in the order they came). A pass's entry and exit are found
        by position (``mb * virtual_stages + chunk``: :attr:`ActorTasks.f_entry`), not looked up by a key."""
        par = self.par
        last, pp, v = self.chunks - 1, par.pp, par.virtual_stages
        for actor, at in passes.items():
            c = self.layout.coords(at.rank)
            stage, f_exit, b_entry, b_exit = c.pp, at.f_exit, at.b_entry, at.b_exit
            edges: dict[int, tuple] = {}  # chunk g's forward (g) or backward (~g) -> how its pass hands on
            for phase, mb, chunk in at.order:
                g = chunk * pp + stage
                i = mb * v + chunk
                if phase == "F":
                    task = f_exit[i]
                    if g == last:
                        b_entry[i].deps.append(task)
                        continue
                    key, to = g, mb * v + (g + 1) // pp  # the receiver's slot: chunk g + 1 of its stage
                elif phase != "B" or g == 0:
                    continue
                else:
                    task = b_exit[i]
                    key, to = ~g, mb * v + (g - 1) // pp
                hit = edges.get(key)
                if hit is None:
                    hit = edges[key] = self._pipeline_edge(passes, actor, c, phase == "F", g)
                entries, local, prefix, demands, latency, per_send, pp_stream = hit
                if local:
                    entries[to].deps.append(task)
                    continue
                name = f"{prefix}.mb{mb}.c{g}"
                if per_send is None:  # the edge's send renamed
                    send = Task(name, actor, "pp", "pp_comm", demands=demands, latency_s=latency, deps=[task])
                else:
                    send = self.send_task(actor, per_send[0], name, per_send[1])
                    send.deps.append(task)
                pp_stream.append(send)
                entries[to].deps.append(send)

    def _pipeline_edge(self, passes: dict[str, ActorTasks], actor: str, c, forward: bool, g: int) -> tuple:
        """How chunk ``g``'s forward (or backward) pass of ``actor`` (at coordinates ``c``) hands on: (the
        receiving passes' entries, whether within the stage, the send name's prefix, the send's demands and
        latency, None or (peer, payload) where each send is asked for apart, the actor's pp stream). The same
        for every micro-batch of the chunk, so worked out once (:meth:`_link_pipeline`)."""
        pp = self.par.pp
        dst_stage = (g + 1) % pp if forward else (g - 1) % pp
        dst = self._pipeline_peer(self.layout.rank(type(c)(c.tp, c.cp, c.dp, dst_stage)), dst_stage)
        receiver = passes[self.rank_actor[dst]]
        entries = receiver.f_entry if forward else receiver.b_entry
        if dst_stage == c.pp:
            return entries, True, None, None, None, None, None
        prefix = "send_act" if forward else "send_grad"
        payload = self._pp_payload(g if forward else g - 1)
        proto = self.send_task(actor, dst, prefix, payload)
        # a cached pipeline edge: every micro-batch's send is this one renamed (a wide-area route
        # is asked for per send, as before)
        per_send = None if self.wan is None and proto.propagation_s == 0.0 else (dst, payload)
        return (entries, False, prefix, proto.demands, proto.latency_s, per_send,
                self._streams_ref[(actor, "pp")])

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

