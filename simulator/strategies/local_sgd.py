"""The ``local_sgd`` strategy kind: H local steps per replica, then an outer all-reduce of the
parameter deltas and an outer optimizer step (local SGD, Stich 2019; DiLoCo, Douillard et al. 2023,
arXiv:2311.08105, Algorithm 1; streaming DiLoCo with overlapped communication, Douillard et al.
2025, arXiv:2501.18512; PALSGD's pseudo-synchronisation).

Each data-parallel replica (``parallelism.dp`` of them; tp/pp inside a replica as the spmd kind)
runs its inner steps with no gradient reduction: an spmd step with every dp collective removed. After
every ``local_steps`` (H) inner steps, each rank

1. computes its parameter delta against the anchor (the parameters at the last synchronisation):
   a memory-bound kernel reading two fp32 copies and writing one (12 B per local parameter; a cast to
   the wire dtype when compressed),
2. all-reduces the deltas over its dp group, at ``compression``: ``none`` moves them in the gradient
   dtype the spmd kind reduces gradients in (``training.grad_dtype``), so the dp bytes per inner
   step are exactly DDP's / H; ``fp16`` 2 B, ``int8`` 1 B per element (quantisation as in
   DiLoCo's ablation, Table 5, and streaming DiLoCo's 4-bit outer gradients; the (de)quantisation
   kernels are counted in the delta and outer-step kernels' bytes); with ``outer_all_reduce:
   per_tensor`` one all-reduce per parameter tensor in turn, each paying its collective's latency (a
   plain loop over ``model.parameters()``, as validation/harness/training.py's local_sgd: the
   2026-12-06 loops' traces, 53 gloo all-reduces a period taking 53-68 ms where one flat one was
   priced at 14 ms); back to back, so only the first pays a calibrated law's wait for the last rank
   (``arrival_wait_us``; the traces: 0.6-3.7 ms at the first, 0.04-0.09 ms at each later one),
3. applies the outer optimizer (``nesterov``: DiLoCo's outer Nesterov momentum; ``sgd``: plain
   averaging, i.e. local SGD): a memory-bound kernel over the averaged delta, the momentum, the
   anchor and the model weights (read 4 + 4 + 4, write 4 + 4 + 2 = 22 B per parameter; ``sgd``
   reads the delta and anchor and writes the anchor and weights: 14 B).

With ``overlap_inner_steps`` τ > 0 (streaming DiLoCo's overlapping communication / PALSGD) the
all-reduce runs beside the next τ inner steps and the outer step is applied before inner step
t + τ + 1 (the merged update is τ steps stale: the ``convergence:`` block's staleness); with 0
the next inner step waits for it. The last period's all-reduce has no inner steps after it to hide
behind (a finite run).

Optimizer fusion (``training.optimizer_fusion``) applies to the inner steps as in the spmd kind
(simulator/strategies/spmd/plan_tasks.py); with ``forward`` an inner step that ends a period applies its
update before the delta against the anchor is taken. The delta, outer all-reduce and outer step stay.

Many steps: the plan holds ``simulation.steps`` inner steps rounded up to whole periods of H.
Memory: the spmd count without ZeRO (each replica keeps its whole optimizer state) plus DiLoCo's
outer state on the device: the fp32 anchor and, with Nesterov, the fp32 outer momentum (4 + 4 B per
local parameter; DiLoCo can offload them to the host, not modelled).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.engine.engine import Task
from simulator.errors import ConfigError
from simulator.memory.analytic import MemoryBreakdown, peak_stage, rank_memory, stage_params
from simulator.scenario import gradient_bytes
from simulator.strategies.registry import StrategyKind, register
from simulator.strategies.spmd.plan import Planner

#: Bytes per element of the outer all-reduce by compression (``none``: the gradient dtype).
COMPRESSION_BYTES = {"fp16": 2, "int8": 1}
#: Delta against the anchor: read the fp32 master weights and the fp32 anchor, write the fp32 delta.
DELTA_BYTES_PER_PARAM = 12.0
#: Outer step, per local parameter (see the module docstring).
OUTER_STEP_BYTES_PER_PARAM = {"nesterov": 22.0, "sgd": 14.0}
#: Outer state kept on the device, per local parameter: fp32 anchor (+ fp32 momentum for Nesterov).
OUTER_STATE_BYTES_PER_PARAM = {"nesterov": 8.0, "sgd": 4.0}


class LocalSgdConfig(BaseModel):
    """``strategy: {kind: local_sgd, local_steps: H, ...}``; the layout is ``parallelism:``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["local_sgd"] = "local_sgd"
    local_steps: int = Field(ge=1, le=100_000, description="H: inner steps between outer synchronisations")
    compression: Literal["none", "fp16", "int8"] = Field(
        default="none", description="dtype of the outer all-reduce (none: the gradient dtype, as DDP)")
    outer_optimizer: Literal["nesterov", "sgd"] = Field(
        default="nesterov", description="nesterov: DiLoCo's outer Nesterov momentum; sgd: plain averaging")
    overlap_inner_steps: int = Field(
        default=0, ge=0, description="tau: the outer all-reduce runs beside the next tau inner steps (streaming "
                                     "DiLoCo); 0: blocking")
    outer_all_reduce: Literal["flat", "per_tensor"] = Field(
        default="flat", description="flat: one all-reduce of the whole delta (one buffer, as DiLoCo and torch's "
                                    "model averagers flatten it); per_tensor: one all-reduce per parameter tensor "
                                    "in turn (a plain loop over model.parameters(), as the measurement harness's "
                                    "local_sgd)")


def _config(scenario) -> LocalSgdConfig:
    return scenario.strategy


def _check(scenario) -> None:
    par, cfg = scenario.parallelism, _config(scenario)
    if par.zero_stage != 0:
        raise ConfigError("parallelism.zero_stage", "local_sgd keeps each replica's optimizer whole: needs 0")
    if par.cp != 1:
        raise ConfigError("parallelism.cp", "local_sgd is modelled without context parallelism (cp 1)")
    if cfg.overlap_inner_steps >= cfg.local_steps:
        raise ConfigError("strategy.overlap_inner_steps",
                          f"must be less than local_steps ({cfg.local_steps}), got {cfg.overlap_inner_steps}")


def local_sgd_memory(scenario) -> tuple[int, MemoryBreakdown, list[MemoryBreakdown]]:
    """Per stage: the spmd count (no ZeRO) plus the outer state (anchor, momentum) per local parameter."""
    _check(scenario)
    per_param = OUTER_STATE_BYTES_PER_PARAM[_config(scenario).outer_optimizer]
    stages = [_stage_memory(scenario, i, per_param) for i in range(scenario.parallelism.pp)]
    return peak_stage(stages)


def _stage_memory(scenario, stage: int, per_param: float) -> MemoryBreakdown:
    base = rank_memory(scenario, stage)
    outer = per_param * stage_params(scenario.model, scenario.parallelism, stage)
    return dataclasses.replace(base, optimizer_bytes=base.optimizer_bytes + outer)


class LocalSgdPlanner(Planner):
    """The spmd planner with the per-step dp reduction removed and an outer sync every H steps."""

    def __init__(self, scenario, mode: str | None = None, detail: bool = False):
        _check(scenario)
        super().__init__(scenario, mode=mode, detail=detail)
        self.cfg = _config(scenario)
        h = self.cfg.local_steps
        self.steps = max(1, math.ceil(scenario.simulation.steps / h)) * h  # whole periods
        self.sync_gradients = False
        self._pending: dict[int, dict[str, Task]] = {}  # inner step -> actor -> outer step to apply before it
        self._outer_state = OUTER_STATE_BYTES_PER_PARAM[self.cfg.outer_optimizer]
        self._inner_step = 0  # the inner step being built (after_step advances it)
        self._tensor_cache: dict[int, list[float]] = {}  # stage -> its parameter tensors' elements (per_tensor)

    def _build_actor(self, *args, **kwargs):
        """Optimizer fusion "forward" defers each inner update to the next inner step's first forward;
        on a step that ends a period the update must land before the delta is taken (as on the run's
        last step), so such a step is built as a last one."""
        if (self._inner_step + 1) % self.cfg.local_steps == 0:
            self.final_step = True
        return super()._build_actor(*args, **kwargs)

    def stage_memory(self, stage: int) -> MemoryBreakdown:
        hit = self._memory_cache.get(("stage", stage))
        if hit is None:
            hit = self._memory_cache[("stage", stage)] = _stage_memory(self.sc, stage, self._outer_state)
        return hit

    def stage_tensors(self, stage: int, params: float) -> list[float]:
        """The elements of each trained parameter tensor a rank of ``stage`` holds, in the graph's order: per
        forward op of its layers ``weights`` k x n matrices, the bias, each table (workloads/graph.py ``Op``), a
        frozen op's none; scaled so they sum to the rank's local parameters ``params`` (the planner's count, which
        splits them by tp and ep). The harness GPT: 52 tensors, 4,240,896 parameters (12 per block)."""
        hit = self._tensor_cache.get(stage)
        if hit is None:
            layers: list = []
            for c in range(self.par.virtual_stages):
                g = c * self.par.pp + stage
                if g == 0:
                    layers += self.graph.layers[:self.graph.prologue]
                start = self.chunk_starts[g]
                layers += self.pipelined[start:start + self.layers_per_chunk[g]]
                if g == self.chunks - 1:
                    layers += self.graph.layers[len(self.graph.layers) - self.graph.epilogue:]
            sizes: list[float] = []
            for layer in layers:
                for op in layer.forward:
                    if op.frozen:
                        continue
                    whole = int(op.weights)
                    sizes += [float(op.k * op.n)] * whole
                    if op.weights > whole:
                        sizes.append((op.weights - whole) * op.k * op.n)
                    if op.bias:
                        sizes.append(float(op.bias))
                    sizes += [float(math.prod(shape)) for shape in op.tables]
            total = sum(sizes)
            hit = [n * params / total for n in sizes] if total > 0 else [params]
            self._tensor_cache[stage] = hit
        return hit

    def wire_bytes(self) -> int:
        return COMPRESSION_BYTES.get(self.cfg.compression) or gradient_bytes(self.sc.training)

    def after_step(self, step: int, streams, boundary) -> list[Task]:
        """Apply outer steps due before the next inner step; after every H-th inner step start the
        delta, the all-reduce and the outer step (blocking, or applied τ inner steps later)."""
        ends: list[Task] = []
        self._inner_step = step + 1
        due = self._pending.pop(step + 1, None)
        if due:  # an overlapped sync merges now: the next inner step waits for its outer step
            for actor, outer in due.items():
                streams[(actor, "compute")].append(outer)
                outer.deps.extend(boundary[actor])
                boundary[actor] = (outer,)
        if (step + 1) % self.cfg.local_steps:
            return ends
        tau = self.cfg.overlap_inner_steps
        wire = self.wire_bytes()
        for actor, rank in self.actor_ranks.items():
            stage = self.layout.coords(rank).pp
            params = self.stage_params_local(stage)
            delta = Task(f"outer_delta.p{step // self.cfg.local_steps}", actor, "compute", "optimizer",
                         duration_s=self.compute_of(rank).optimizer_step_s(params, DELTA_BYTES_PER_PARAM),
                         deps=list(boundary[actor]))
            streams[(actor, "compute")].append(delta)
            per_tensor = self.cfg.outer_all_reduce == "per_tensor"
            parts = ([(self.grad_group, "all_reduce", n * wire) for n in self.stage_tensors(stage, params)]
                     if per_tensor else [(self.grad_group, "all_reduce", params * wire)])
            # per tensor, the all-reduces run back to back: only the first waits for the other ranks' arrival
            reduce = self.comm_task(actor, "dp", "dp_comm", f"outer_all_reduce.p{step // self.cfg.local_steps}", rank,
                                    parts, key=f"outer{step}", back_to_back=per_tensor)
            outer = Task(f"outer_step.p{step // self.cfg.local_steps}", actor, "compute", "optimizer",
                         duration_s=self.compute_of(rank).optimizer_step_s(
                             params, OUTER_STEP_BYTES_PER_PARAM[self.cfg.outer_optimizer]))
            if reduce is not None:
                reduce.deps.append(delta)
                streams[(actor, "dp")].append(reduce)
                outer.deps.append(reduce)
            outer.deps.append(delta)
            last_period = step + 1 >= self.steps
            if tau == 0 or last_period:
                streams[(actor, "compute")].append(outer)
                boundary[actor] = (outer,)
                ends.append(outer)
            else:
                boundary[actor] = (delta,)
                self._pending.setdefault(step + tau + 1, {})[actor] = outer
        return ends


def compile_local_sgd(scenario, mode: str | None = None, detail: bool = False):
    plan = LocalSgdPlanner(scenario, mode=mode, detail=detail).build()
    if plan.steps != scenario.simulation.steps:
        periods = plan.steps // scenario.strategy.local_steps
        h = scenario.strategy.local_steps
        plan.steps_rounding = (f"one whole period of H = {h}" if periods == 1
                               else f"{periods} whole periods of H = {h}")
    return plan


def local_sgd_convergence_inputs(scenario) -> dict[str, float]:
    cfg = _config(scenario)
    return {"local_steps": cfg.local_steps, "staleness_steps": float(cfg.overlap_inner_steps)}


#: The fields of ``clustersim search``'s space that change what local_sgd simulates (``StrategyKind.searched_layout_fields``;
#: tests/test_kind_layout_fields.py): each replica runs spmd's layout (its planner), so every field of it but:
#: ``zero_stage`` and ``cp`` (refused unless 0 and 1), ``overlap_grad_reduce`` (no per-step gradient reduction:
#: ``sync_gradients`` is off) and ``overlap_param_gather`` (spmd gathers weights only under ZeRO).
LOCAL_SGD_SEARCHED_FIELDS: tuple[str, ...] = ("tp", "pp", "ep", "virtual_stages", "micro_batch_size", "recompute",
    "sequence_parallel", "schedule", "global_batch_size", "pp_split", "overlap_tp_grad_comm", "overlap_p2p_comm",
    "tp_comm_overlap")


LOCAL_SGD = register(StrategyKind(
    name="local_sgd",
    config=LocalSgdConfig,
    summary="H local steps per replica, then an outer all-reduce of parameter deltas (fp16/int8) and an outer "
            "Nesterov step (DiLoCo), optionally overlapped with the next inner steps (streaming DiLoCo)",
    compile=compile_local_sgd,
    memory=local_sgd_memory,
    optimizer_fusion=("backward", "forward"),
    convergence_inputs=local_sgd_convergence_inputs,
    searched_layout_fields=lambda config: LOCAL_SGD_SEARCHED_FIELDS,
    derives_layout=True,
    spmd_chain_bound=True,
))
