"""DAPPLE's planner (Fan et al. 2021, "DAPPLE: A Pipelined Data Parallel Approach for Training
Large Models", PPoPP '21, Sec. 4): stages with their own replica counts, placed topology-aware.

The plan space (Sec. 4.1-4.2): the layer graph (topological order) cut into S contiguous stages,
stage i replicated on r_i GPUs (data parallel inside the stage; Σ r_i = N), the global batch G in
M micro-batches, the early-backward (1F1B) schedule. Placement (Sec. 4.2, "fresh first" /
"append first"): stages take consecutive devices, and a stage either fits inside one node
(never straddles two) or spans whole nodes, so that a stage's all-reduce stays on NVLink
wherever it can; what crosses nodes is the pipeline's activations, which are far smaller than
gradients for the models DAPPLE targets.

The search:

1. *Estimate* every (S ≤ ``max_stages``, and S = N by default, ordered replica vector, M ≤ ``max_micro_batches``): the
   layers are cut to minimise the slowest stage (a binary search on the bound with a greedy
   fill, exact for contiguous cuts), and the plan is priced by DAPPLE's latency model (Sec. 4.1:
   the warm-up of one micro-batch through every stage, M - 1 more on the pivot stage, then the
   slowest stage's all-reduce and update):
   ``L = Σ_i (F_i + B_i) + 2 Σ_i send_i + (M - 1) · max_i max(F_i + B_i, 2 send_i) + max_i (AR_i + opt_i)``
   with F_i, B_i at the stage's per-replica batch G/(M·r_i), sends of the boundary tensors and
   all-reduces priced on the topology (the same functions the simulation uses,
   :class:`simulator.strategies.replicated_pipeline.StagePrices`). The uniform plans (every
   r_i = N/S, layers cut evenly) are candidates too, and each plan with and without ZeRO-1 (the
   optimizer state sharded over a stage's replicas; not in DAPPLE, but in the uniform layouts
   ``clustersim search`` compares against).
2. *Simulate* the ``top_k`` best estimates with the engine (the ``replicated_pipeline`` kind; plans
   that do not fit in memory are skipped and the next one taken), and the two best estimates of
   every stage count (the estimate's error grows with the pipeline's sends and bubbles, so no depth
   is ruled out by the estimate alone). DAPPLE's two baselines (Sec. 4.3: the planner weighs its
   pipelines against pure data parallelism and the straight pipeline, one GPU per stage) are always
   simulated (the straight pipeline unless ``max_stages`` is given), data parallelism with and
   without ZeRO-1: the latency model
   exposes every all-reduce, so it cannot see that data parallelism hides its all-reduce behind the
   backward (ZeRO 0) but not its weights' all-gather (ZeRO-1): BERT-24 on 8 V100s, 1.452 s against
   1.849 s, and the estimate ranks them the other way;
3. *Refine* the fastest plan of each of the three best replica vectors one move at a time (a stage
   boundary moved a few layers, the micro-batches doubled or halved, ZeRO-1 toggled, the warm-up
   one forward deeper or shallower), each move judged by the simulator (:func:`refine`; at most
   ``refine`` simulations each); return the fastest.

The warm-up: DAPPLE's early backward (Sec. 3.2) injects K_i micro-batches into stage i before its
first backward, K_i = S - i in the paper; K_i = S - i + e (``extra_warmup`` of the
``replicated_pipeline`` kind, e <= ``max_extra_warmup``, chosen by simulation) is the same schedule
with more in flight, which hides a boundary send as long as a pass (across 25 GbE) behind the
stage's next forward, at the memory of e more micro-batches' activations (checked). The plan's
summary says when e > 0; ``max_extra_warmup=0`` keeps the paper's K_i.

Why it matters, GNMT-16 on 8 V100s (2 nodes of 4, 25 GbE, batch 128; tests/test_plan_cli.py): with
K_i = S - i the best plan, 2 stages x 4 replicas cut 47/47, 32 micro-batches, ZeRO-1, takes 0.08091 s,
the best one-chunk layout of ``clustersim search`` to 1e-9, but search's interleaved pp 2 x dp 4
(2 virtual stages, Narayanan et al. 2021 Sec. 2.2.2) takes 0.07739 s. On the critical stage the
one-chunk plan spends 56.6 ms computing and 15.1 ms waiting (7.3 ms on sends over the Ethernet, 7.8
ms of bubble behind the heavier second stage: 67.9 ms of compute, since the LSTM layers are too
coarse to cut evenly; cut at 50/44, 63.1 / 61.3 ms, the waiting grows to 15.5 ms). Interleaving
halves the bubble and starts one chunk's all-reduce during the other's backward. Neither is
expressible in DAPPLE's plan space (one chunk per device), and no placement policy of Sec. 4.2
helps: "scatter first" (each stage's replicas split over both nodes, sends on NVLink) takes 0.546 s
(its gradient all-reduce over the Ethernet), stages straddling a node boundary ("append first")
find nothing faster. With one more micro-batch in flight (K_0 = 3) the sends overlap and the balanced cut pays: 51/43, 0.07394 s
(0.955 of search's best).

4. *Choose the schedule* by simulation (an extension beyond the paper, :mod:`.dapple_schedules`,
   option ``max_virtual_stages``, default 4; 1 turns it off): DAPPLE's best plans with equal
   replicas are also run interleaved, v chunks per stage, and the faster of DAPPLE's plan and the
   extension's is returned. The plan's header says which part is DAPPLE's and which the
   extension's (``details``: ``dapple_step_s``, ``dapple_scenario``, ``extension_step_s``).
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
import time
from typing import Any

import numpy as np

from simulator.cost.collectives import collective_cost
from simulator.cost.compute import ComputeModel
from simulator.cost.jitter import sync_stretch
from simulator.cost.topology import Topology
from simulator.errors import ConfigError
from simulator.explore.planners import PlannerKind, PlanResult, check_options, int_option, register
from simulator.explore.planners.dapple_schedules import choose_schedule, describe
from simulator.explore.planners.oracle import Oracle, dropped_recompute_notes
from simulator.scenario import build_scenario, gradient_bytes, layer_graph_of
from simulator.strategies.replicated_pipeline import layer_host_factor
from simulator.strategies.spmd.plan import OPTIMIZER_BYTES_PER_PARAM

OPTIONS = {
    "max_stages": "most pipeline stages tried (default: 4, and the straight pipeline of one GPU per stage; "
                  "given, no deeper pipeline is tried)",
    "max_micro_batches": "most micro-batches per step tried (default 64)",
    "top_k": "best estimates simulated by the engine (default 6)",
    "refine": "most plans simulated while refining each of the three finalists (default 16; 0: none)",
    "max_virtual_stages": "the extension beyond DAPPLE: most model chunks per stage tried with interleaved 1F1B "
                          "(default 4; 1: DAPPLE's own plan space only)",
    "schedule_budget": "most plans the extension simulates (default 24)",
    "max_extra_warmup": "most forwards a stage may run ahead of 1F1B's warm-up (DAPPLE's K_i = S - i + e, "
                        "e chosen by simulation while refining; default 2; 0: K_i = S - i only)",
}
_KEPT = ("overlap_grad_reduce", "gradient_bucket_mb")  # parallelism knobs the plan keeps from the scenario


def replica_vectors(num_gpus: int, gpus_per_node: int, stages: int,
                    dividing: int | None = None) -> list[tuple[int, ...]]:
    """Ordered replica counts of ``stages`` stages on consecutive devices, each stage inside one
    node or over whole nodes from a node boundary (DAPPLE Sec. 4.2's placement).

    ``dividing``: only the vectors whose every count divides it (the global batch: a stage's
    replicas split each micro-batch, and every micro-batch divides the batch, so no other vector
    yields a plan), in the same order as the unrestricted enumeration filtered. The restriction is
    applied while enumerating, not after, because the unrestricted enumeration grows exponentially
    with the GPUs (16,384 GPUs of 8 per node: 2,094,095 vectors of 3 stages, 1,427,508,223 of 4), while
    those dividing a power-of-two batch are a few hundred (tests/test_planner_placement.py)."""
    out: list[tuple[int, ...]] = []
    ok = (lambda r: True) if dividing is None else (lambda r: dividing % r == 0)

    def extend(prefix: tuple[int, ...], offset: int) -> None:
        left = num_gpus - offset
        if len(prefix) == stages:
            if left == 0:
                out.append(prefix)
            return
        if len(prefix) == stages - 1:  # the last stage takes what is left, if the placement allows it
            if ok(left) and placement_accepts(prefix + (left,), gpus_per_node):
                out.append(prefix + (left,))
            return
        in_node = gpus_per_node - offset % gpus_per_node
        sizes = list(range(1, min(in_node, left) + 1))
        if offset % gpus_per_node == 0:
            sizes += [k * gpus_per_node for k in range(2, left // gpus_per_node + 1)]
        for r in sizes:
            if left - r >= stages - len(prefix) - 1 and ok(r):
                extend(prefix + (r,), offset + r)

    extend((), 0)
    return out


def placement_accepts(replicas: tuple[int, ...], gpus_per_node: int) -> bool:
    """Whether stages of ``replicas`` GPUs each, laid on consecutive devices from device 0, keep each
    stage inside one node or on whole nodes from a node boundary: membership in
    :func:`replica_vectors` (for the GPUs they sum to) in O(stages), where the enumeration itself grows
    exponentially with the GPU count (16,384 GPUs in 3 stages: 220 million calls)."""
    offset = 0
    for r in replicas:
        if r < 1:
            return False
        within_node = r <= gpus_per_node - offset % gpus_per_node
        whole_nodes = offset % gpus_per_node == 0 and r % gpus_per_node == 0
        if not (within_node or whole_nodes):
            return False
        offset += r
    return True


class LayerTables:
    """Per-layer times (per replica batch), parameters and boundary bytes of the model."""

    def __init__(self, scenario):
        self.sc = scenario
        self.compute = ComputeModel(scenario.accelerator, scenario.training.precision, scenario.training.fp8_gemms,
                                    scenario.training.fp8_recipe, tf32=scenario.training.tf32)  # as spmd prices them
        self.stretch = sync_stretch(scenario.accelerator.efficiency.sync_jitter, scenario.num_gpus)
        one = self.graph(1)
        self.layers = len(one.layers)
        self.params = np.array([layer.params for layer in one.layers], dtype=float)
        self.param_prefix = np.concatenate([[0.0], np.cumsum(self.params)])
        index = {layer.name: i for i, layer in enumerate(one.layers)}
        last_use = list(range(self.layers))
        for i, layer in enumerate(one.layers):
            for name in layer.inputs:
                last_use[index[name]] = max(last_use[index[name]], i)
        crossing = np.zeros(self.layers + 1)  # crossing[k]: bytes per sample crossing the cut before layer k
        for i, layer in enumerate(one.layers):
            if last_use[i] > i:
                crossing[i + 1:last_use[i] + 1] += layer.output_bytes
        self.crossing_per_sample = crossing
        self._times: dict[int, np.ndarray] = {}

    def graph(self, batch: int):
        return layer_graph_of(self.sc.model, dataclasses.replace(self.sc.shard, micro_batch=batch))

    def prefix(self, batch: int) -> np.ndarray:
        """Prefix sums of forward + backward seconds per layer at ``batch`` samples per replica."""
        if batch not in self._times:
            g = self.graph(batch)
            eff = self.sc.accelerator.efficiency  # the host floors per layer as the kind prices them (not the
            # cross-node pipeline floor, which depends on the placement: the simulation adds it)
            t = [(self.compute.layer_time_s(layer, "forward") + self.compute.layer_time_s(layer, "backward"))
                 * self.stretch * layer_host_factor(self.compute, layer, self.stretch, eff) for layer in g.layers]
            self._times[batch] = np.concatenate([[0.0], np.cumsum(t)])
        return self._times[batch]


def bottleneck_cut(prefixes: list[np.ndarray], layers: int) -> list[int] | None:
    """Layer counts of contiguous stages minimising the slowest stage's time (stage i's layer
    times are ``prefixes[i]``'s differences): a binary search on the bound, each bound checked by
    filling every stage greedily with as many layers as fit (optimal for a fixed stage order)."""
    stages = len(prefixes)
    if stages > layers:
        return None

    def fill(bound: float) -> list[int] | None:
        start, counts = 0, []
        for i, prefix in enumerate(prefixes):
            if i == stages - 1:
                end = layers
            else:  # as many layers as fit under the bound, leaving one for each later stage
                end = int(np.searchsorted(prefix, prefix[start] + bound, side="right")) - 1
                end = min(end, layers - (stages - i - 1))
                if end <= start:
                    return None
            if prefix[end] - prefix[start] > bound:
                return None
            counts.append(end - start)
            start = end
        return counts

    lo, hi = 0.0, max(p[-1] for p in prefixes) * (1 + 1e-9) + 1e-12
    best = fill(hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        counts = fill(mid)
        if counts is None:
            lo = mid
        else:
            hi, best = mid, counts
        if hi - lo <= 1e-9 * hi:
            break
    return best


class Estimator:
    """DAPPLE's latency model of one plan (see the module docstring)."""

    def __init__(self, scenario, tables: LayerTables):
        self.sc, self.t = scenario, tables
        self.topo = Topology(scenario.node, scenario.fabric, scenario.num_gpus)
        self.links = self.topo.links
        self.grad_bytes = gradient_bytes(scenario.training)
        precision = scenario.training.precision
        self.opt_bytes = OPTIMIZER_BYTES_PER_PARAM[scenario.training.optimizer] * (32 / 28 if precision == "fp32" else 1)
        self._ar: dict[tuple, float] = {}

    def all_reduce_s(self, offset: int, replicas: int, params: float) -> float:
        key = (offset, replicas, params)
        if key not in self._ar:
            node = self.sc.node
            ranks = tuple(range(offset, offset + replicas))
            cost = collective_cost("all_reduce", params * self.grad_bytes, self.topo.placement(ranks), self.links,
                                   node.intra_laws, node.inter_node_collectives, node.nvls_all_reduce,
                                   mesh_peers=node.gpus_per_node - 1 if node.intra_node.kind == "xgmi" else None)
            self._ar[key] = cost.isolated_time_s(self.links)
        return self._ar[key]

    def send_s(self, cut: int, offsets: tuple[int, int, int], batches: tuple[int, int]) -> float:
        """One boundary transfer between consecutive stages (ranks ``offsets[0]:offsets[1]`` and
        ``offsets[1]:offsets[2]``), alone on its links."""
        nbytes = self.t.crossing_per_sample[cut] * max(batches)
        if nbytes <= 0:
            return 0.0
        first_node, last_node = self.topo.node_of(offsets[0]), self.topo.node_of(offsets[2] - 1)
        if first_node == last_node:
            return self.links.intra_latency_s + nbytes / self.links.intra_bytes_per_s
        return self.links.inter_latency_s + nbytes / self.links.inter_bytes_per_s

    def latency_s(self, counts: list[int], replicas: tuple[int, ...], micro_batches: int, zero: int = 0) -> float:
        micro = self.sc.parallelism.global_batch_size // micro_batches
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        offsets = np.concatenate([[0], np.cumsum(replicas)]).astype(int)
        work, sends, tails = [], [], []
        for i, r in enumerate(replicas):
            prefix = self.t.prefix(micro // r)
            work.append(prefix[starts[i + 1]] - prefix[starts[i]])
            params = float(self.t.param_prefix[starts[i + 1]] - self.t.param_prefix[starts[i]])
            opt = self.t.compute.optimizer_step_s(params / (r if zero else 1), self.opt_bytes)
            tails.append(self.all_reduce_s(int(offsets[i]), r, params) + opt)
            if i + 1 < len(replicas):
                sends.append(self.send_s(int(starts[i + 1]), (int(offsets[i]), int(offsets[i + 1]), int(offsets[i + 2])),
                                         (micro // r, micro // replicas[i + 1])))
        pivot = max(max(work), 2 * max(sends, default=0.0))
        return sum(work) + 2 * sum(sends) + (micro_batches - 1) * pivot + max(tails)


def _plan_words(replicas: tuple[int, ...], micro_batches: int, zero: int, batch: int) -> str:
    """A plan in words for a message: ``64 stages of 1 GPU each, 1 micro-batch of 256 samples`` (a
    ragged replica vector is listed)."""
    stages = len(replicas)
    if len(set(replicas)) == 1:
        shape = (f"data parallel over {replicas[0]} GPUs (one stage)" if stages == 1 else
                 f"{stages} stages of {replicas[0]} GPU{'s' if replicas[0] > 1 else ''} each")
    else:
        shape = f"{stages} stages of {list(replicas)} GPUs"
    return (f"{shape}, {micro_batches} micro-batch{'es' if micro_batches > 1 else ''} of {batch // micro_batches} "
            f"samples{', ZeRO-1' if zero else ''}")


def _stage_of(reason: str | None, stages: int) -> str:
    """The memory check's reason with its pipeline stage said as ``stage i of S`` (a one-stage plan:
    no stage), so a stage index is not read as a rank."""
    import re

    reason = reason or "does not fit"
    if stages == 1:
        return re.sub(r" on stage \d+$", "", reason)
    return re.sub(r" on stage (\d+)$", lambda m: f" on stage {m.group(1)} of {stages} (stages count from 0)", reason)


def plan_raw(raw: dict[str, Any], counts: list[int], replicas: tuple[int, ...], micro_batches: int,
             zero: int = 0, extra_warmup: int = 0) -> dict[str, Any]:
    """The scenario mapping of one plan (the input's, with the strategy and layout replaced)."""
    out = copy.deepcopy(raw)
    par = raw.get("parallelism") or {}
    out["parallelism"] = {"global_batch_size": par.get("global_batch_size", 512), "micro_batch_size": 1,
                          **{k: par[k] for k in _KEPT if k in par}, **({"zero_stage": 1} if zero else {})}
    out["strategy"] = {"kind": "replicated_pipeline", "micro_batches": micro_batches,
                       "stages": [{"layers": int(c), "replicas": int(r)} for c, r in zip(counts, replicas, strict=True)]}
    if extra_warmup:
        out["strategy"]["extra_warmup"] = int(extra_warmup)
    return out


def base_scenario(raw: dict[str, Any]):
    """The input scenario with a trivial layout (the planner sets its own): model, cluster, batch.
    The probe's strategy is ``per_layer`` with no split, whose layout needs no data-parallel degree
    (a global batch smaller than the GPU count, U-Net's 2 images on 8 GPUs, still builds; each plan
    checks its own divisibility)."""
    refuse_unmodelled_fusion(raw)
    probe = copy.deepcopy(raw)
    par = probe.get("parallelism") or {}
    probe["parallelism"] = {"global_batch_size": par.get("global_batch_size", 512), "micro_batch_size": 1}
    probe["strategy"] = {"kind": "per_layer"}
    return build_scenario(probe)


#: The strategy kind of every pipeline plan DAPPLE (and the adaptive planner's pipeline choice) returns.
PLAN_KIND = "replicated_pipeline"


def refuse_unmodelled_fusion(raw: dict[str, Any]) -> None:
    """A ``training.optimizer_fusion`` mode that DAPPLE's plans (:data:`PLAN_KIND`) cannot express:
    one ConfigError naming that kind. Checked before the probe, whose own kind (per_layer) would
    otherwise be the one the message names."""
    from simulator.strategies.registry import get_kind, load_kinds

    fusion = str((raw.get("training") or {}).get("optimizer_fusion", "none"))
    if fusion == "none" or fusion in get_kind(PLAN_KIND).optimizer_fusion:
        return
    modelled = ", ".join(name for name, kind in load_kinds().items() if fusion in kind.optimizer_fusion)
    raise ConfigError("training.optimizer_fusion",
                      f"{fusion!r} is not modelled by strategy kind {PLAN_KIND}, the kind of DAPPLE's plans "
                      f"(kinds that model it: {modelled}); use none, or `clustersim search` for a uniform layout")


SHIFTS = (1, -1, 2, -2, 4, -4, 8, -8)
PER_DEPTH = 2  # plans simulated (that fit) for every number of stages, best estimates first
REFINED = 3    # distinct replica vectors whose best simulated plan is refined


def _neighbours(counts: list[int], m: int, zero: int, replicas: tuple[int, ...], batch: int, extra: int = 0,
                max_extra: int = 0):
    """Plans one move away: a stage boundary moved by ``SHIFTS`` layers, the micro-batches doubled
    or halved (where each stage's replicas still divide the micro-batch), ZeRO-1 toggled, the
    early backward's warm-up one forward deeper or shallower (up to ``max_extra``)."""
    for boundary in range(len(counts) - 1):
        for shift in SHIFTS:
            trial = list(counts)
            trial[boundary] += shift
            trial[boundary + 1] -= shift
            if min(trial) >= 1:
                yield trial, m, zero, extra
    lcm = math.lcm(*replicas)
    for other in (m * 2, m // 2):
        if other >= 1 and batch % other == 0 and (batch // other) % lcm == 0:
            yield counts, other, zero, extra
    if max(replicas) > 1:
        yield counts, m, 1 - zero, extra
    if len(counts) > 1:
        for other in (extra + 1, extra - 1):
            if 0 <= other <= max_extra:
                yield counts, m, zero, other


def refine(raw: dict[str, Any], best, oracle: Oracle, seen: set, budget: int, max_extra: int = 0):
    """Hill-climb a simulated plan with the simulator as the judge: take the first of its
    :func:`_neighbours` that simulates faster, until none does or ``budget`` simulations are spent.
    (Not in DAPPLE, whose planner trusts its estimate; the estimate misses contention, the exposure
    of the gradient collectives and the sends on 1F1B's critical path: up to ~20% here.)
    Returns the best evaluation and whether it moved."""
    batch = best.raw["parallelism"]["global_batch_size"]
    replicas = tuple(s["replicas"] for s in best.raw["strategy"]["stages"])
    improved, moved = True, False
    while improved and oracle.simulated < budget:
        improved = False
        strategy = best.raw["strategy"]
        counts = [s["layers"] for s in strategy["stages"]]
        zero = best.raw["parallelism"].get("zero_stage", 0)
        for trial, m, z, e in _neighbours(counts, strategy["micro_batches"], zero, replicas, batch,
                                          strategy.get("extra_warmup", 0), max_extra):
            key = (tuple(trial), replicas, m, z, e)
            if key in seen or oracle.simulated >= budget:
                continue
            seen.add(key)
            evaluation = oracle.evaluate(plan_raw(raw, trial, replicas, m, z, e))
            if evaluation.fits and evaluation.step_time_s < best.step_time_s:
                best, improved, moved = evaluation, True, True
                break
    return best, moved


def _describe(evaluation) -> str:
    strategy = evaluation.raw["strategy"]
    extra = strategy.get("extra_warmup", 0)
    return (f"layers {[s['layers'] for s in strategy['stages']]}, replicas {[s['replicas'] for s in strategy['stages']]}, "
            f"{strategy['micro_batches']} micro-batches, ZeRO {evaluation.raw['parallelism'].get('zero_stage', 0)}"
            + (f", warm-up K_i = S - i + {extra}" if extra else ""))


def run_dapple(raw: dict[str, Any], options: dict[str, Any]) -> PlanResult:
    check_options(DAPPLE, options)
    max_stages = int_option(options, "max_stages", 4)
    max_micro = int_option(options, "max_micro_batches", 64)
    top_k = int_option(options, "top_k", 6)
    refine_budget = int_option(options, "refine", 16, minimum=0)
    max_virtual = int_option(options, "max_virtual_stages", 4)
    schedule_budget = int_option(options, "schedule_budget", 24, minimum=0)
    max_extra = int_option(options, "max_extra_warmup", 2, minimum=0)
    started = time.perf_counter()
    scenario = base_scenario(raw)
    tables = LayerTables(scenario)
    estimator = Estimator(scenario, tables)
    n, per_node = scenario.num_gpus, scenario.node.gpus_per_node
    g = scenario.parallelism.global_batch_size
    micro_options = [m for m in range(1, min(max_micro, g) + 1) if g % m == 0]
    estimates: list[tuple[float, int, list[int], tuple[int, ...], int, int]] = []
    serial = 0
    depths = list(range(1, min(max_stages, tables.layers, n) + 1))
    if "max_stages" not in options and n <= tables.layers and n not in depths:
        depths.append(n)  # the straight pipeline (one GPU per stage), a baseline of DAPPLE's (Sec. 4.3)
    for stages in depths:
        for replicas in replica_vectors(n, per_node, stages, dividing=g):  # no other yields a plan
            lcm = math.lcm(*replicas)
            for m in micro_options:
                if (g // m) % lcm:
                    continue
                prefixes = [tables.prefix(g // m // r) for r in replicas]
                cuts = [bottleneck_cut(prefixes, tables.layers)]
                if len(set(replicas)) == 1:  # the uniform plan with layers cut evenly
                    cuts.append([len(a) for a in np.array_split(np.arange(tables.layers), stages)])
                for counts in cuts:
                    if counts is None or min(counts) < 1:
                        continue
                    for zero in (0, 1) if max(replicas) > 1 else (0,):
                        serial += 1
                        estimates.append((estimator.latency_s(counts, replicas, m, zero), serial, counts, replicas,
                                          m, zero))
    if not estimates:
        raise ConfigError("parallelism.global_batch_size", f"{g} cannot be split over any plan of {n} GPUs "
                                                           f"(every micro-batch must divide over each stage's replicas)")
    oracle = Oracle()
    ranked = heapq.nsmallest(len(estimates), estimates)
    seen: set = set()
    simulated: list = []
    last: list = [None]

    def simulate_in_order(candidates, wanted: int, tries: int) -> None:
        fitted = tried = 0
        for estimate_s, _, counts, replicas, m, zero in candidates:
            if fitted >= wanted or tried >= tries:
                return
            key = (tuple(counts), replicas, m, zero, 0)
            if key in seen:
                continue
            seen.add(key)
            tried += 1
            evaluation = oracle.evaluate(plan_raw(raw, counts, replicas, m, zero))
            last[0] = (evaluation, replicas, m, zero)
            if evaluation.fits:
                fitted += 1
                simulated.append((evaluation.step_time_s, estimate_s, evaluation))

    simulate_in_order(ranked, top_k, 4 * top_k)
    # The estimate's error differs with the pipeline's depth (its sends and bubbles): the best
    # estimates of every stage count are simulated too, so no depth is ruled out by the estimate alone.
    for stages in sorted({len(item[3]) for item in ranked}):
        simulate_in_order([item for item in ranked if len(item[3]) == stages], PER_DEPTH, 4 * PER_DEPTH)
    # DAPPLE's two baselines (Sec. 4.3) are always simulated, each with and without ZeRO-1: pure data
    # parallelism and the straight pipeline. The latency model exposes every all-reduce, so it cannot
    # tell ZeRO 0 (all-reduce overlapped with the backward in simulation) from ZeRO-1 (the weights'
    # all-gather exposed before the first forward): BERT-24 on 8 V100s, 1.452 s against 1.849 s.
    baselines = {name: vector for name, vector in (("data_parallel", (n,)), ("straight_pipeline", (1,) * n))
                 if any(item[3] == vector for item in ranked)}
    for vector in baselines.values():
        for zero in (0, 1) if max(vector) > 1 else (0,):
            simulate_in_order([item for item in ranked if item[3] == vector and item[5] == zero], 1, 4)
    if not simulated:
        evaluation, replicas, m, zero = last[0]
        raise ConfigError("model", f"no DAPPLE plan of {scenario.model.name} fits on {n} GPUs "
                                   f"(tried {oracle.simulated}; the last, {_plan_words(replicas, m, zero, g)}: "
                                   f"{_stage_of(evaluation.reason, len(replicas))})")
    finalists: dict[tuple[int, ...], tuple] = {}  # the best simulated plan of the REFINED best replica vectors
    for item in sorted(simulated, key=lambda item: item[0]):
        vector = tuple(s["replicas"] for s in item[2].raw["strategy"]["stages"])
        if vector not in finalists and len(finalists) < REFINED:
            finalists[vector] = item
    results = []
    for _, estimate_s, start in finalists.values():
        refined, moved = refine(raw, start, oracle, seen, oracle.simulated + refine_budget, max_extra)
        results.append((refined.step_time_s, estimate_s, refined, start if moved else None))
    step_s, estimate_s, best, start = min(results, key=lambda item: item[0])
    summary = f"DAPPLE: {len(best.raw['strategy']['stages'])} stage(s), {_describe(best)}"
    if start is not None:
        summary += f"; refined by simulation from {_describe(start)} ({start.step_time_s:.6g} s)"
    else:
        summary += f" (estimated {estimate_s:.6g} s)"
    details: dict[str, Any] = {
        "simulated": [{"stages": e.raw["strategy"]["stages"], "micro_batches": e.raw["strategy"]["micro_batches"],
                       "zero_stage": e.raw["parallelism"].get("zero_stage", 0), "estimated_step_s": est,
                       "simulated_step_s": s} for s, est, e in simulated],
        "dapple_step_s": step_s, "dapple_scenario": best.raw}
    for name, vector in baselines.items():  # the best simulated plan of each baseline (None: none fits)
        steps = [s for s, _, e in simulated if tuple(st["replicas"] for st in e.raw["strategy"]["stages"]) == vector]
        details[f"{name}_step_s"] = min(steps, default=None)
    notes: list[str] = []
    if max_virtual > 1:
        # The extension (dapple_schedules.py): the best plans of DAPPLE's partitioner with equal
        # replicas, run with the other schedule the simulator offers (interleaved 1F1B).
        uniform: dict[tuple[int, ...], Any] = {}
        ranked_plans = sorted([(s, e) for s, _, e in simulated] + [(s, e) for s, _, e, _ in results],
                              key=lambda item: item[0])
        for _, evaluation in ranked_plans:
            vector = tuple(s["replicas"] for s in evaluation.raw["strategy"]["stages"])
            if len(vector) >= 2 and len(set(vector)) == 1 and vector not in uniform and len(uniform) < REFINED:
                uniform[vector] = evaluation
        spent = oracle.simulated
        chosen, plan = choose_schedule(raw, list(uniform.values()), tables.layers, oracle, seen, max_virtual,
                                       spent + schedule_budget)
        details["extension_simulated"] = oracle.simulated - spent
        details["extension_step_s"] = chosen.step_time_s if chosen is not None else None
        if chosen is not None and chosen.step_time_s < step_s:
            notes = [f"DAPPLE's part (Fan et al. 2021): {_describe(best)}, 1F1B = {step_s:.6g} s",
                     f"then the simulator's schedule choice (an extension, not in DAPPLE): {describe(plan)} = "
                     f"{chosen.step_time_s:.6g} s ({step_s / chosen.step_time_s:.3f}x)"]
            summary = f"{summary} = {step_s:.6g} s; extension: {describe(plan)} = {chosen.step_time_s:.6g} s"
            best = chosen
        else:
            found = (f"the best, {describe(plan)}, {chosen.step_time_s:.6g} s" if chosen is not None
                     else "none applies or fits")
            notes = [f"the simulator's schedule choice (an extension, not in DAPPLE) kept DAPPLE's plan: "
                     f"interleaved 1F1B tried on its equal-replica plans, {found}"]
    extra = details["dapple_scenario"]["strategy"].get("extra_warmup", 0)
    if extra:
        notes.append(f"DAPPLE's early backward with K_i = S - i + {extra} micro-batches in flight on every stage but the "
                     f"last (the paper's K_i = S - i; chosen by simulation, option max_extra_warmup=0 keeps the paper's)")
    return PlanResult("dapple", best.raw, best.step_time_s, best.samples_per_s, time.perf_counter() - started,
                      len(estimates), oracle.simulated, summary, details,
                      notes=[*dropped_recompute_notes(raw, best.raw), *notes])


DAPPLE = register(PlannerKind(
    name="dapple",
    summary="DAPPLE (Fan et al. 2021): stages with their own data-parallel degrees, placed inside nodes where "
            "possible, 1F1B; estimated by its latency model, the best simulated; then (an extension) the same "
            "stages interleaved where the simulator finds it faster",
    options=OPTIONS,
    run=run_dapple,
))
