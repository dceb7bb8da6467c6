"""A framework profile's step-level terms, applied the same way by every strategy kind.

A framework profile (``training.framework``, simulator/cost/framework.py) sets, besides the kernel-rate
factors every kind reads through :class:`~simulator.cost.compute.ComputeModel`, three terms that live at
the level of a step rather than of a kernel:

- ``sync_jitter`` (σ): every kernel of a multi-rank job stretched by 1 + σ·e_N, the expected wait for
  the slowest of N ranks at the collectives that synchronise them (simulator/cost/jitter.py; Petrini et
  al. SC'03, Hoefler et al. SC'10): :func:`kernel_stretch`;
- ``host_dispatch_us_per_kernel``: an eager framework issues each kernel from Python; each pass of a
  layer (forward, recomputed forward, backward) starts with an empty launch queue and ends no earlier
  than ``issue_bound_s`` (simulator/cost/host_floor.py); a layer's passes are stretched by
  ``max(1, floor / device time)``: :func:`eager_stretch`;
- ``input_us_per_sample``: the host input pipeline (decoding, augmentation) loads the next step's
  samples beside this step's kernels; the next step's first kernel waits for it, so a step takes
  max(GPU step, samples x time per sample) in steady state: :func:`input_task`.

They were written inside the ``spmd`` planner first (simulator/strategies/spmd/plan.py), and the other
kinds dropped them, so the same data-parallel plan came out up to 88% faster under another kind (the
seventh session's audit, top gap 1). Every kind now applies them through these functions at the
equivalent point of its step, or names a term it does not apply, and why, in its result
(:func:`dropped_terms_extra`, printed under the step time): never silently.

Beside the three, an efficiency block (a framework profile, or a calibration profile's ``compute_efficiency``)
sets step-level fields that spmd reads and each kind must apply or name (:data:`STEP_TERMS`;
tests/test_framework_terms_coverage.py runs every registered kind with each one set):

- ``moe_layer_fixed_us`` (NeMo's profile): a fixed time per MoE layer and micro-batch, spread over the
  layer's passes as the host floors are (simulator/cost/host_floor.py): :func:`layer_floor_stretch`;
- ``cross_node_pipeline_floor`` (nanotron's calibration profile): a floor per layer and micro-batch on a
  pipeline stage whose neighbour stage is on another node (simulator/cost/host_floor.py); a kind without
  pipeline stages cannot place it and says so;
- ``overlap_compute_slowdown`` / ``overlap_comm_slowdown``: a kernel slowed while a collective of its rank
  runs beside it and the other way round (simulator/cost/interference.py): :func:`mark_interference`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from simulator.cost.host_floor import issue_bound_s, stretch
from simulator.cost.jitter import sync_stretch
from simulator.engine.engine import Task
from workloads.graph import gemm_class

#: The terms, by the efficiency field that sets each.
TERMS = ("sync_jitter", "host_dispatch_us_per_kernel", "input_us_per_sample")

#: Every step-level field of an efficiency block that spmd applies (the three above and the others the module
#: docstring lists): what each kind applies or names in its result.
STEP_TERMS = (*TERMS, "moe_layer_fixed_us", "cross_node_pipeline_floor", "overlap_compute_slowdown",
              "overlap_comm_slowdown")

#: The result key (Plan.extra) listing the terms a kind drops and why.
DROPPED_KEY = "framework_terms_dropped"


def kernel_stretch(efficiency, ranks: int) -> float:
    """The factor on every kernel of a job of ``ranks`` ranks: 1 + σ·e_ranks (1 without jitter or
    with one rank; simulator/cost/jitter.py)."""
    return sync_stretch(efficiency.sync_jitter, ranks)


def eager_floor_s(passes_kernel_s: Iterable[Sequence[float]], host_dispatch_us: float | None) -> float:
    """The eager-dispatch floor of one layer's passes: each pass (its kernels' seconds, in issue order)
    issued kernel by kernel from an empty launch queue, one every ``host_dispatch_us``
    (simulator/cost/host_floor.py ``issue_bound_s``); 0 without the constant."""
    if not host_dispatch_us:
        return 0.0
    host_s = host_dispatch_us * 1e-6
    return sum(issue_bound_s(list(kernels), host_s) for kernels in passes_kernel_s)


def eager_stretch(passes_kernel_s: Sequence[Sequence[float]], host_dispatch_us: float | None) -> float:
    """The factor on each of a layer's passes under the eager floor: max(1, floor / device time), the
    device time being the passes' kernel seconds together (simulator/cost/host_floor.py ``stretch``)."""
    floor_s = eager_floor_s(passes_kernel_s, host_dispatch_us)
    if floor_s <= 0:
        return 1.0
    return stretch(sum(sum(kernels) for kernels in passes_kernel_s), floor_s)


def is_moe_layer(forward_ops) -> bool:
    """Whether a layer's forward runs expert GEMMs (an MoE layer: ``moe_layer_fixed_us`` applies to it)."""
    return any(gemm_class(op) == "experts" for op in forward_ops)


def layer_floor_stretch(passes_kernel_s: Sequence[Sequence[float]], host_dispatch_us: float | None,
                        moe_fixed_us: float | None = None, other_floor_s: float = 0.0) -> float:
    """The factor on each of a layer's passes (forward, backward, recompute: their kernels' seconds) under
    the host floors as spmd applies them (simulator/strategies/spmd/plan_costs.py ``layer_stretch``): the floor
    is the largest of the eager-dispatch floor (:func:`eager_floor_s`), the passes' device time plus
    ``moe_fixed_us`` (give it only for an MoE layer, :func:`is_moe_layer`) and ``other_floor_s`` (a
    cross-node pipeline floor); the factor max(1, floor / device time) (simulator/cost/host_floor.py)."""
    device_s = sum(sum(kernels) for kernels in passes_kernel_s)
    floor_s = max(eager_floor_s(passes_kernel_s, host_dispatch_us), other_floor_s,
                  device_s + moe_fixed_us * 1e-6 if moe_fixed_us else 0.0)
    return stretch(device_s, floor_s) if floor_s > 0 else 1.0


def mark_interference(efficiency, streams, efficiency_of=None) -> None:
    """Kernels slowed by ``overlap_compute_slowdown`` while a transfer of their actor runs beside them,
    transfers by ``overlap_comm_slowdown`` while a kernel runs (the engine applies both,
    simulator/engine/engine.py), as spmd marks its streams: compute-stream tasks without demands are
    kernels, tasks with demands on other streams are transfers. ``efficiency_of(actor)``: an actor's own
    efficiency block on a mixed cluster (default ``efficiency``). Nothing without either slowdown."""
    for (actor, stream), tasks in streams.items():
        eff = efficiency_of(actor) if efficiency_of is not None else efficiency
        slowdown, comm_slowdown = eff.overlap_compute_slowdown, eff.overlap_comm_slowdown
        if slowdown <= 0 and comm_slowdown <= 0:
            continue
        for task in tasks:
            if stream == "compute":
                if task.demands is None:
                    task.slowdown_while_contended = slowdown
                    task.slows_comm = comm_slowdown > 0
            elif task.demands is not None:
                task.contends = slowdown > 0
                task.comm_slowdown_while_computing = comm_slowdown


def input_load_s(efficiency, samples: float) -> float:
    """Host seconds to load ``samples`` samples (0 without ``input_us_per_sample``)."""
    per_sample_us = efficiency.input_us_per_sample
    return samples * per_sample_us * 1e-6 if per_sample_us else 0.0


def input_task(efficiency, actor: str, samples: float, name: str = "input.next_batch") -> Task | None:
    """The next step's samples loaded on ``actor``'s ``input`` stream beside this step (None without
    ``input_us_per_sample``). The caller puts it among the step's ends and makes the next step's first
    kernel wait for it (as a prefetching loader, PyTorch DataLoader workers or DALI, runs in steady
    state: Lambda's ResNet-50 harness, validation/modern/cnn.py)."""
    seconds = input_load_s(efficiency, samples)
    if seconds <= 0:
        return None
    return Task(name, actor, "input", "input_wait", duration_s=seconds)


def set_terms(efficiency) -> list[str]:
    """The terms of :data:`TERMS` the efficiency block sets (non-zero)."""
    return [t for t in TERMS if getattr(efficiency, t, None)]


def dropped_terms_extra(efficiency, kind: str, reasons: dict[str, str]) -> dict[str, list[str]]:
    """``{DROPPED_KEY: [line, ...]}`` for each term in ``reasons`` (term -> why ``kind`` does not apply
    it) that the efficiency block sets; {} when none is set. The result table prints the lines."""
    lines = [f"{term} ({_shown(getattr(efficiency, term))}) not applied by {kind}: {why}"
             for term, why in reasons.items() if getattr(efficiency, term, None)]
    return {DROPPED_KEY: lines} if lines else {}


def _shown(value) -> str:
    """A term's value in a dropped line: a number as ``%g``, a spec (the cross-node floor) as "set"."""
    return f"{value:g}" if isinstance(value, int | float) else "set"


#: Why a kind without pipeline stages cannot place the cross-node pipeline floor (its result's line).
NO_PIPELINE = ("the floor is for a pipeline stage whose neighbour stage is on another node, and this kind has no "
               "pipeline stages (spmd does not apply it at pp 1 either)")
