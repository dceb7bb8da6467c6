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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from simulator.cost.host_floor import issue_bound_s, stretch
from simulator.cost.jitter import sync_stretch
from simulator.engine.engine import Task

#: The terms, by the efficiency field that sets each.
TERMS = ("sync_jitter", "host_dispatch_us_per_kernel", "input_us_per_sample")

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
    lines = [f"{term} ({getattr(efficiency, term):g}) not applied by {kind}: {why}"
             for term, why in reasons.items() if getattr(efficiency, term, None)]
    return {DROPPED_KEY: lines} if lines else {}
