"""The spmd planner's prices: what a pass, a collective, a send and an optimizer step cost.

Part of :class:`simulator.strategies.spmd.plan.Planner` (a mixin: the methods read the planner's state, set up
in ``Planner.__init__``). It holds the pricing of ops and communication: the kernels of a pass on a rank
(``compute_of``, ``_compute_time``, ``pass_cost_s``), one collective on the topology (``_collective``, WAN
edges), the comm and send tasks, the host floors that stretch a layer (``layer_stretch``, eager / MoE floors),
the exposed share of an overlapped collective (``_exposure``, ``_segments``), the pipeline payload and the
ZeRO-3 copy-in, and the bytes per parameter of weights and optimizer steps. Kept apart from the task building
(plan_tasks.py) so what a thing costs reads in one place, apart from where its task goes.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

from simulator.cost.collectives import collective_cost
from simulator.cost.compute import ComputeModel
from simulator.cost.host_floor import floor_per_layer_s, stretch
from simulator.cost.interference import exposed_comm_share
from simulator.cost.moe_dispatch import node_dedup_all_to_all
from simulator.cost.topology import send_demands
from simulator.engine.engine import Task
from simulator.strategies.framework_terms import eager_floor_s
from workloads.graph import Op, gemm_class, partial_full_of

WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
# Adam step, mixed precision: read fp32 master+m+v and the 16-bit grad, write master+m+v and the
# 16-bit weight: 12 + 2 + 12 + 2 = 28 bytes per parameter (fp32 training: 4+8 read/write + 4 + 4 = 32).
# ``training.param_dtype: fp32`` (PyTorch FSDP1/FSDP2 MixedPrecision) is 28 too: the parameter is the fp32
# master and its sharded gradient is cast back to the parameter's dtype after the reduce-scatter (torch 2.13
# fsdp/_runtime_utils.py _cast_grad_to_param_dtype; _fully_shard/_fsdp_collectives.py foreach_reduce
# ``_to_dtype_if_needed(reduce_output, orig_dtype)``), so read param+m+v+grad 16, write param+m+v 12.
OPTIMIZER_BYTES_PER_PARAM = {"adam": 28.0, "adamw": 28.0, "sgd": 12.0}


def comm_category(group: str) -> str:
    """The breakdown category (and stream) of a layer's collective over ``group``: its own, except the
    expert tensor-parallel gather / scatter, which count with the expert all-to-alls they sit between."""
    return "ep_comm" if group == "etp" else f"{group}_comm"


class PlanCosts:
    """The pricing methods of :class:`~simulator.strategies.spmd.plan.Planner` (see the module docstring)."""

    # -- pricing ---------------------------------------------------------------------------

    def compute_of(self, rank: int) -> ComputeModel:
        """The kernel pricing of ``rank``'s accelerator (its node group's)."""
        return self.computes[self.topo.group_index(rank)]

    def _compute_time(self, ops, rank: int = 0) -> float:
        """Kernel seconds of ``ops`` on ``rank``'s accelerator, stretched by the expected wait for the
        slowest rank (simulator/cost/jitter.py; 1 where ``sync_jitter`` is 0 or the job has one rank)."""
        g = self.topo.group_index(rank)
        key = (id(ops), g)
        hit = self._time_cache.get(key)
        if hit is None or hit[0] is not ops:
            hit = self._time_cache[key] = (ops, self.computes[g].ops_time_s(ops) * self.sync_stretches[g])
        return hit[1]

    def _collective(self, rank: int, group: str, collective: str, payload: float):
        # The group and what its pricing reads of it, once per (rank, group): a data-parallel group of a
        # 16,384-GPU layout has 128 members, and every collective over it (each gradient bucket) would
        # walk them again (the symmetric mode's cost would grow with the data-parallel degree).
        hit = self._group_cache.get((rank, group))
        if hit is None:
            ranks = self.layout.group(rank, group)
            hit = self._group_cache[(rank, group)] = (
                ranks, self.topo.placement(ranks),
                self.topo.intra_slowdown(ranks),  # a group on a partial mesh (hybrid cube mesh, bridges)
                self.topo.groups_of(ranks),  # node groups of a mixed cluster the collective touches
                sum(r in self.rank_actor for r in ranks))
        ranks, placement, slowdown, spanned, simulated = hit
        key = (collective, payload, placement.size, placement.members_per_node, placement.num_nodes,
               placement.num_pods, slowdown, spanned)
        if self.wan is not None:
            key = (*key, ranks, group)
        cost = self._cost_cache.get(key)
        if cost is None:
            node = self.topo.groups[spanned[0]][0]
            # measured laws hold for their own kind of node: a collective across groups uses the α-β model
            # on the slowest member's ports (links_for)
            inter_laws = node.inter_node_collectives if len(spanned) == 1 else None
            if (collective == "all_to_all" and group == "ep" and self.par.moe_dispatch == "deepep"
                    and placement.num_nodes > 1):  # token dispatch once per node (simulator/cost/moe_dispatch.py)
                cost = node_dedup_all_to_all(payload, self.sc.model.moe.top_k, placement, self.topo.links_for(ranks))
            else:
                cost = collective_cost(collective, payload, placement, self.topo.links_for(ranks),
                                       node.intra_laws, inter_laws, node.nvls_all_reduce,
                                       mesh_peers=node.gpus_per_node - 1 if node.intra_node.kind == "xgmi" else None)
            if slowdown != 1.0 and cost.bytes_by_link.get("nvl"):
                cost = dataclasses.replace(cost, bytes_by_link={**cost.bytes_by_link,
                                                                "nvl": cost.bytes_by_link["nvl"] * slowdown})
            if self.wan is not None:  # crossing regions: pair ports, per-step delays (simulator/cost/wan.py)
                cost = self.wan.over_wan(cost, collective, payload, ranks, self._wan_edges(ranks, group),
                                         1.0 / max(1, simulated))
            self._cost_cache[key] = cost
        return cost, ranks, simulated

    def _wan_edges(self, ranks: tuple[int, ...], group: str):
        """Region-crossing ring edges of the groups that ``ranks``' group stands for: itself in full
        mode; in symmetric mode every group of the kind over the same pipeline stages (its copies at the
        other tp / cp / dp coordinates), summed per region pair."""
        if self.mode == "full":
            return self.wan.ring_crossings(ranks)
        stages = frozenset(self.layout.coords(r).pp for r in ranks)
        key = ("wan_edges", group, stages)
        hit = self._group_cache.get(key)
        if hit is None:
            groups = {self.layout.group(r, group) for r in range(self.layout.world)
                      if self.layout.coords(r).pp in stages}
            hit = Counter()
            for members in groups:
                if frozenset(self.layout.coords(r).pp for r in members) == stages:
                    hit.update(self.wan.ring_crossings(members))
            self._group_cache[key] = hit
        return hit

    def _wan_send_copies(self, src_rank: int, dst_rank: int) -> float:
        """Sends of the source's stage to the destination's stage that cross the same region pair as this
        one (the symmetric copies that share its pair port; 1 in full mode)."""
        if self.mode == "full":
            return 1.0
        src_stage, dst_stage = self.layout.coords(src_rank).pp, self.layout.coords(dst_rank).pp
        key = ("wan_send", src_stage, dst_stage)
        hit = self._group_cache.get(key)
        if hit is None:
            hit = Counter()
            for r in range(self.layout.world):
                c = self.layout.coords(r)
                if c.pp == src_stage:
                    peer = self.layout.rank(type(c)(c.tp, c.cp, c.dp, dst_stage))
                    hit[(self.wan.region_of(r), self.wan.region_of(peer))] += 1
            self._group_cache[key] = hit
        return float(hit[(self.wan.region_of(src_rank), self.wan.region_of(dst_rank))])

    def comm_task(self, actor: str, stream: str, category: str, name: str, rank: int,
                  parts: list[tuple], key: str, back_to_back: bool = False) -> Task | None:
        """One task moving one or more collectives ``(group, collective, payload[, share])`` in
        sequence; ``share`` scales an overlapped collective down to its exposed part.

        Each part's latency includes its law's wait for the group's last rank (``arrival_wait_s``, a calibrated
        CPU law's; simulator/cost/collectives.py), the ranks' drift over the compute before it. ``back_to_back``:
        the parts are issued one right after another with no compute between (a loop of blocking collectives
        over the parameter tensors, local SGD's ``outer_all_reduce: per_tensor``), so only the first, which
        follows compute, pays that wait; the later ones have no fresh drift to wait for. Without it every part
        pays it: the parts that the coarse planner merges per pass (``_segments``) each follow a kernel."""
        cache_key = (actor, tuple(parts), back_to_back)
        cached = self._comm_cache.get(cache_key)
        if cached is None:
            demands: dict[str, float] = defaultdict(float)
            latency, size, group_root = 0.0, 1, None
            for i, part in enumerate(parts):
                group, collective, payload = part[:3]
                share = part[3] if len(part) > 3 else 1.0  # exposed share of an overlapped collective
                cost, ranks, simulated = self._collective(rank, group, collective, payload)
                if back_to_back and i > 0 and cost.arrival_wait_s:
                    latency += (cost.latency_s - cost.arrival_wait_s) * share
                else:
                    latency += cost.latency_s * share
                for link, b in cost.bytes_by_link.items():
                    if link.startswith("wan:"):  # a wide-area pair port, shared by every flow crossing it
                        demands[link] += b * share
                        continue
                    demands[f"{actor}:{link}_tx"] += b * share
                    demands[f"{actor}:{link}_rx"] += b * share
                size, group_root = simulated, min(ranks)
            cached = self._comm_cache[cache_key] = (dict(demands), latency, size, group_root)
        demands, latency, size, group_root = cached
        if not demands and latency == 0.0:
            return None
        task = Task(name, actor, stream, category, demands=demands, latency_s=latency,
                    rendezvous=f"{key}@{group_root}" if size > 1 else None, rendezvous_size=size)
        if self.detail and len(parts) > 1:  # for the trace and validate-runs' count: the collectives it stands for
            task.info = (("collectives", len(parts)),)
        return task

    def send_task(self, actor: str, dst_rank: int, name: str, payload: float) -> Task:
        src_rank = self.actor_ranks[actor]
        dst = self.rank_actor[dst_rank]
        if self.wan is not None:
            # Crossing regions: the pair port (with the symmetric copies of this send), the NICs, and
            # the delay as propagation (simulator/cost/wan.py); None inside one region.
            route = self.wan.send(actor, src_rank, dst, dst_rank, payload, self._wan_send_copies(src_rank, dst_rank))
            if route is not None:
                demands, propagation = route
                return Task(name, actor, "pp", "pp_comm", demands=demands, propagation_s=propagation)
        key = (actor, dst_rank, payload)
        hit = self._send_cache.get(key)  # every micro-batch sends the same bytes to the same peer
        if hit is not None:
            return Task(name, actor, "pp", "pp_comm", demands=hit[0], latency_s=hit[1])
        pair = self.topo.links_for((src_rank, dst_rank))
        links = self.topo.send_links(src_rank, dst_rank)
        if links == ("nvl",):
            latency = pair.intra_latency_s
            payload *= self.topo.intra_slowdown((src_rank, dst_rank))  # a pair without a direct link
        else:
            latency = pair.inter_latency_s
        demands = send_demands(actor, dst, links, payload)
        self._send_cache[key] = (demands, latency)  # shared by the tasks: nothing writes a task's demands
        return Task(name, actor, "pp", "pp_comm", demands=demands, latency_s=latency)

    def pass_cost_s(self, rank: int, ops: tuple[Op, ...]) -> tuple[float, float]:
        """(kernel seconds, exposed collective seconds) of an op run in isolation, cached per op tuple."""
        compute_s, comm = self.pass_cost_by_category(rank, ops)
        return compute_s, sum(comm.values())

    def pass_cost_by_category(self, rank: int, ops: tuple[Op, ...]) -> tuple[float, dict[str, float]]:
        """Kernel seconds and exposed collective seconds per category ("tp_comm", "cp_comm")."""
        key = ("fused", id(ops), self._comm_class(rank))
        hit = self._time_cache.get(key)
        if hit is None or hit[0] is not ops:
            compute_s = self._compute_time(tuple(op for op in ops if op.kind != "collective"), rank)
            comm: dict[str, float] = {}
            for i, op in enumerate(ops):
                if op.kind == "collective":
                    seconds = self._isolated_comm_s(rank, [(op.group, op.collective, op.comm_bytes)])
                    category = comm_category(op.group)
                    comm[category] = comm.get(category, 0.0) + seconds * self._exposure(rank, ops, i)
            hit = self._time_cache[key] = (ops, (compute_s, comm))
        return hit[1]

    def chunk_pass_s(self, rank: int, phase: str, global_chunk: int) -> float:
        """Seconds of one chunk pass in isolation, kernels plus exposed collectives (the price
        other strategy kinds reuse): "F", "B", "R" (recompute) as in :meth:`_chunk_ops`."""
        return sum(self.pass_cost_s(rank, self._chunk_ops(phase, global_chunk)))

    def optimizer_step_s(self, stage: int, extra_params: float = 0.0) -> float:
        """Seconds of one optimizer step over the stage's local parameters (ZeRO-sharded), plus
        ``extra_params`` a kind adds to the stage (local-learning heads)."""
        params = self.stage_params_local(stage) + extra_params
        if self.par.zero_stage >= 1:
            params /= self.shard_size
        per_param = OPTIMIZER_BYTES_PER_PARAM[self.sc.training.optimizer] * (32 / 28 if self.precision == "fp32" else 1)
        return self.compute_of(self.stage_representative(stage)).optimizer_step_s(params, per_param)

    def pp_payload_bytes(self) -> float:
        """Bytes one rank sends to the next stage per micro-batch (activation or its gradient)."""
        return self._pp_payload()

    def layer_pass_ops(self, kind: bool, phase: str) -> tuple[Op, ...]:
        """One layer's ops of a pass: "F" forward, "B" backward (its input-gradient part under
        zero bubble), "W" weight gradients (zero bubble), "R" the recomputed forward work (cached:
        the pricing caches key on the tuple)."""
        key = ("layer", kind, phase)
        ops = self._pass_ops.get(key)
        if ops is None:
            work = self.layer_works[kind]
            if phase == "F":
                ops = work.forward
            elif phase == "B":
                ops = work.input_grad_ops() if self.par.schedule == "zb-h1" else work.backward
            elif phase == "W":
                ops = work.weight_grad_ops()
            else:
                ops = work.recompute_ops(self.par.recompute_mode)
            self._pass_ops[key] = ops
        return ops

    def layer_stretch(self, rank: int, kind: bool) -> float:
        """The host floor's factor on the passes of a layer of ``kind`` on ``rank``
        (simulator/cost/host_floor.py): 1 unless the layer's isolated forward + backward (+ recompute)
        is shorter than the floor: the cross-node pipeline floor (the rank's pipeline neighbour on
        another node) or the eager-dispatch floor (its passes issued kernel by kernel by the host)."""
        key = (rank, kind)
        hit = self._stretch_cache.get(key)
        if hit is None:
            work = self.layer_works[kind]
            passes = [ops for ops in (work.forward, work.backward, self.layer_pass_ops(kind, "R")) if ops]
            floor_s = max(floor_per_layer_s(self.host_floor, self.layout, self.topo, rank,
                                            self.remote_pipeline_neighbours),
                          self.eager_floor_s(rank, passes), self.moe_fixed_floor_s(rank, kind, passes))
            hit = 1.0
            if floor_s > 0:
                device_s = sum(sum(self.pass_cost_s(rank, ops)) for ops in passes)
                hit = stretch(device_s, floor_s)
            self._stretch_cache[key] = hit
        return hit

    def eager_floor_s(self, rank: int, passes: list[tuple[Op, ...]]) -> float:
        """The eager-dispatch floor of a layer's passes (forward, backward, recompute) on ``rank``:
        each pass issued kernel by kernel from an empty launch queue (simulator/cost/host_floor.py
        ``issue_bound_s``; a collective counts as one issue and takes its exposed time)."""
        if not self.host_dispatch_us:
            return 0.0
        compute, jitter = self.compute_of(rank), self.sync_stretches[self.topo.group_index(rank)]
        return eager_floor_s(([
            self._isolated_comm_s(rank, [(op.group, op.collective, op.comm_bytes)]) * self._exposure(rank, ops, i)
            if op.kind == "collective" else compute.time_s(op) * jitter for i, op in enumerate(ops)] for ops in passes),
            self.host_dispatch_us)

    def moe_fixed_floor_s(self, rank: int, kind, passes: list[tuple[Op, ...]]) -> float:
        """The floor of an MoE layer's passes (forward, backward, recompute) on ``rank``: their isolated time
        plus ``moe_layer_fixed_us`` (a fixed time per MoE layer and micro-batch; simulator/cost/host_floor.py).
        0 for a dense layer or without the constant."""
        if not self.moe_fixed_us or not any(gemm_class(op) == "experts" for op in self.layer_works[kind].forward):
            return 0.0
        return sum(sum(self.pass_cost_s(rank, ops)) for ops in passes) + self.moe_fixed_us * 1e-6

    def host_floor_stall_s(self, rank: int, phase: str, runs) -> float:
        """Seconds a pass over ``runs`` ((layer kind, count), ...) waits for the host floor."""
        if (self.host_floor is None or self.par.pp == 1) and not self.host_dispatch_us and not self.moe_fixed_us:
            return 0.0
        if phase == "R" and partial_full_of(self.par.recompute_mode) is not None:
            runs = self._rerun_runs(runs)  # the layers a partial full recompute re-runs
        stall = 0.0
        for kind, count in runs:
            factor = self.layer_stretch(rank, kind)
            if factor > 1.0:
                stall += count * (factor - 1.0) * sum(self.pass_cost_s(rank, self.layer_pass_ops(kind, phase)))
        return stall

    def _comm_class(self, rank: int) -> int | None:
        """What a rank's pricing caches are keyed by beyond the ops: None on a homogeneous cluster;
        on a mixed one the rank itself (its accelerator and the groups its collectives span differ)."""
        return rank if self.topo.mixed else None

    def _isolated_comm_s(self, rank: int, parts: list[tuple[str, str, float]]) -> float:
        key = ("isolated", tuple(parts), self._comm_class(rank))
        hit = self._comm_cache.get(key)
        if hit is None:
            hit = 0.0
            for group, collective, payload in parts:
                cost, ranks, _ = self._collective(rank, group, collective, payload)
                hit += cost.isolated_time_s(self.topo.links_for(ranks))
            self._comm_cache[key] = hit
        return hit

    def _tp_links_exclusive(self) -> bool:
        """Whether TP collectives never share a link with other streams: the TP group is inside a
        node, and neither DP/CP groups nor pipeline neighbours use that node's intra-node links."""
        par, topo = self.par, self.topo
        if par.cp > 1:
            return False  # ring passes share links with DP/PP traffic: simulate them as flows
        if par.tp == 1:
            return True
        rep = self.layout.representative(0)
        if topo.placement(self.layout.group(rep, "tp")).num_nodes > 1:
            return False
        for kind, size in (("dp", par.dp_degree), ("cp", par.cp), ("ep", par.ep), ("etp", par.etp_degree)):
            if size > 1 and topo.placement(self.layout.group(rep, kind)).members_per_node > 1:
                return False
        if par.pp > 1:
            stages = [self.layout.representative(i) for i in range(par.pp)]
            if len({topo.node_of(r) for r in stages}) < par.pp:
                return False
        return True

    def _exposure(self, rank: int, ops: tuple[Op, ...], i: int) -> float:
        """Fraction of collective ``ops[i]``'s isolated time left exposed: 1, or for a TP
        input-gradient collective overlapped with the next (weight-gradient) kernel, the
        pair's time beyond the kernel's over t_comm (simulator/cost/interference.py: the kernel
        slowed by ``overlap_compute_slowdown`` s and the collective by ``overlap_comm_slowdown``
        c while both run; with c = 0, max(t_comm - t_kernel, t_comm·s/(1+s)) / t_comm) -- what
        the engine gives when both run as tasks (detail mode); here it is counted with the
        collective's exposed time."""
        op = ops[i]
        if op.collective == "all_to_all" and self.par.overlap_moe_comm:
            return self._paired_moe_exposure(rank, ops)
        if not (op.overlaps_next and self._overlap_on(op)) or i + 1 >= len(ops):
            return 1.0
        t_comm = self._isolated_comm_s(rank, [(op.group, op.collective, op.comm_bytes)])
        nxt = ops[i + 1]
        t_next = self.compute_of(rank).time_s(nxt) if nxt.kind != "collective" else 0.0
        if t_comm <= 0:
            return 1.0
        eff = self.sc.rank_accelerator(rank).efficiency
        return exposed_comm_share(t_next, t_comm, eff.overlap_compute_slowdown, eff.overlap_comm_slowdown)

    def _paired_moe_exposure(self, rank: int, ops: tuple[Op, ...]) -> float:
        """``overlap_moe_comm``: the expert all-to-alls of a pass run beside the computation of
        another micro-batch's pass (DeepSeek-V3's DualPipe pairs a forward and a backward chunk,
        arXiv:2412.19437 Sec. 3.2.1; Megatron-core's EP all-to-all overlap). Approximated with
        the pass's own kernel time T as the budget that hides the pass's all-to-alls A: the
        exposed share (simulator/cost/interference.py; with no communication slowdown
        max(A - T, A·s/(1+s)) / A, s: the kernels' slowdown beside communication) is the same
        for each of them. Warm-up passes with no partner are treated alike."""
        key = ("moe_pair", id(ops), self._comm_class(rank))
        hit = self._time_cache.get(key)
        if hit is None or hit[0] is not ops:
            a2a = self._isolated_comm_s(rank, [(op.group, op.collective, op.comm_bytes) for op in ops
                                               if op.collective == "all_to_all"])
            kernels = self._compute_time(tuple(op for op in ops if op.kind != "collective"), rank)
            eff = self.sc.rank_accelerator(rank).efficiency
            share = exposed_comm_share(kernels, a2a, eff.overlap_compute_slowdown, eff.overlap_comm_slowdown)
            hit = self._time_cache[key] = (ops, share)
        return hit[1]

    def _overlap_on(self, op: Op) -> bool:
        if op.overlap_knob == "tp_comm":
            return self.par.tp_comm_overlap
        return self.par.overlap_cp_comm if op.group == "cp" else self.par.overlap_tp_grad_comm

    def _segments(self, rank: int, ops: tuple[Op, ...]):
        """Split ops into runs ``(kind, payload, name, overlapped)``: ("compute", ops) and
        ("comm", [(group, collective, payload)]). Coarse mode merges all kernels into one run and
        all collectives into one, with overlapped collectives reduced to their exposed share."""
        key = ("segments", id(ops), self.detail, self._comm_class(rank))
        hit = self._time_cache.get(key)
        if hit is not None and hit[0] is ops:
            return hit[1]
        out = []
        if not self.detail:
            compute = tuple(op for op in ops if op.kind != "collective")
            comms: dict[str, list] = {}
            for i, op in enumerate(ops):
                if op.kind == "collective":
                    share = self._exposure(rank, ops, i)
                    if share > 0:
                        comms.setdefault(op.group, []).append((op.group, op.collective, op.comm_bytes, share))
            if compute:
                out.append(("compute", compute, "compute", False))
            for group, parts in comms.items():
                out.append(("comm", parts, comm_category(group), False))
        else:
            for op in ops:
                if op.kind == "collective" and op.collective == "all_to_all" and self.par.overlap_moe_comm:
                    # hidden behind another micro-batch's pass: only the exposed share runs here
                    share = self._paired_moe_exposure(rank, ops)
                    if share > 0:
                        out.append(("comm", [(op.group, op.collective, op.comm_bytes, share)], op.name, False))
                elif op.kind == "collective":
                    overlapped = op.overlaps_next and self._overlap_on(op)
                    out.append(("comm", [(op.group, op.collective, op.comm_bytes)], op.name, overlapped))
                else:
                    out.append(("compute", (op,), op.name, False))
        self._time_cache[key] = (ops, out)
        return out

    def _pp_payload(self, global_chunk: int = 0) -> float:
        """Bytes sent across the boundary after ``global_chunk`` per micro-batch (or their
        gradients back): every tensor made before the cut and read after it (a chain: the last
        layer's output; a residual network cut inside a block: the skip tensor too), ÷tp:
        Megatron's scatter/gather optimisation (or the sequence-parallel shards)."""
        cut = self.graph.prologue + self.chunk_starts[global_chunk] + self.layers_per_chunk[global_chunk]
        hit = self._payload_cache.get(cut)
        if hit is None:
            layers = self.graph.layers
            after = {name for layer in layers[cut:] for name in layer.inputs}
            hit = self._payload_cache[cut] = sum(layer.output_bytes for layer in layers[:cut] if layer.name in after)
        return hit / self.par.tp

    def zero3_copy_in_s(self, compute, params: float, shard: int, gathered_bytes: float) -> float:
        """Seconds of the kernels that fill a ZeRO-3 all-gather's input from this rank's shard (``params /
        shard`` elements) of a layer's parameters, gathered at ``gathered_bytes`` each. The shard is held at
        ``training.param_dtype``: 4 bytes (fp32) under ``param_dtype: fp32`` with mixed precision, else the
        gathered width.

        - FSDP1 (``zero_buffer_copies: fsdp1``): one cast of the shard to the low-precision ``_mp_shard`` it
          gathers from (torch 2.13 fsdp/_flat_param.py FlatParamHandle._use_low_precision_shard:
          ``_mp_shard.copy_(_local_shard)``, which casts): read the shard, write the gathered width.
        - FSDP2 (``true``): where the shard's dtype differs from the gathered one (MixedPrecisionPolicy
          param_dtype), _fsdp_collectives.py ``_get_param_all_gather_inputs`` first casts every shard into one
          flat low-precision buffer (``torch._foreach_copy_``), then ``all_gather_copy_in`` copies that into the
          all-gather input (``torch._foreach_copy_``): the cast, then a plain copy. Shard in the gathered dtype:
          the copy-in alone (FSDPParam.all_gather_inputs returns the shard itself)."""
        held = 4.0 if self.sc.training.param_dtype == "fp32" and self.precision in ("bf16", "fp16", "fp8") \
            else gathered_bytes
        if held == gathered_bytes:
            return compute.copy_s(params * gathered_bytes / shard)
        elements = params / shard
        cast_s = compute.copy_s(elements * (held + gathered_bytes) / 2)  # read held, write gathered
        if self.par.zero_buffer_copies == "fsdp1":
            return cast_s
        return cast_s + compute.copy_s(elements * gathered_bytes)
