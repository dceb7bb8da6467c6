"""What a training framework really holds beyond the analytic breakdown of ``simulator.memory.analytic``.

``simulator.memory.analytic`` counts the bytes a layout needs (model states by ZeRO stage, Korthikanti
activations, communication buffers). Frameworks hold more: the caching allocator's reserve and
fragmentation, un-fused kernels' saved intermediates (an unfused RMSNorm keeps fp32 copies of
its input), fp32 casts, workspace, duplicated gradient buffers. Measured peaks are therefore a
framework-specific multiple of the analytic one (nanotron on the Ultra-Scale Playbook sweep
reports ~1.5-1.9x the breakdown). A :class:`MemoryOverhead` maps the breakdown to the peak the
framework would report::

    peak = states_factor · (weights + gradients) + optimizer_factor · optimizer
           + activations_factor[variant] · activations · (1 + β·(F − 1)) / F + other + constant_gib

where F is the number of micro-batches in flight on the stage (``simulator.memory.
microbatches_in_flight``) and β = ``later_microbatch_factor``: the micro-batches waiting for
their backward beyond the first count β times as much as the one being worked on (β = 1: all
alike, the analytic count). β < 1 describes a framework whose peak carries working memory
proportional to the micro-batch in process (activation gradients, allocator blocks sized to it)
on top of what every stored micro-batch holds; it is fitted like the other factors.

and a layout fits when that peak is at most the accelerator's HBM less the scenario's reserve
(``simulator.memory.usable_hbm_bytes``). The factors are FITTED on named measurements (the spec
records ``source`` and ``fitted_on``); ``variant`` names a framework setting that changes the
activation overhead (e.g. a fused RMSNorm kernel or not). The default (all factors 1, constant 0)
is the plain breakdown. Pure functions, no SimPy; ``simulator.memory.analytic`` is not changed by this.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from simulator.errors import ConfigError
from simulator.memory.analytic import (
    GIB,
    MemoryBreakdown,
    microbatches_in_flight,
    peak_rank_memory,
    usable_hbm_bytes,
)


class MemoryOverhead(BaseModel):
    """Fitted map from the analytic breakdown to a framework's measured peak (see module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    framework: str
    states_factor: float = Field(default=1.0, gt=0)
    optimizer_factor: float = Field(default=1.0, gt=0)
    activations_factor: dict[str, float] = Field(default_factory=lambda: {"default": 1.0})
    later_microbatch_factor: float = Field(default=1.0, ge=0, le=1)
    constant_gib: float = 0.0
    source: str
    fitted_on: str | None = None

    def factor(self, variant: str | None) -> float:
        key = variant or "default"
        if key not in self.activations_factor:
            raise ConfigError("memory_overhead.activations_factor",
                              f"no factor for variant {key!r} (has: {', '.join(self.activations_factor)})")
        return self.activations_factor[key]


def framework_peak_bytes(breakdown: MemoryBreakdown, overhead: MemoryOverhead, variant: str | None = None,
                         in_flight: float = 1.0) -> float:
    """The peak the framework would report for a rank whose analytic breakdown is ``breakdown``
    with ``in_flight`` micro-batches' activations stored (the F of the module doc)."""
    f = max(1.0, in_flight)
    in_flight_weight = (1.0 + overhead.later_microbatch_factor * (f - 1.0)) / f
    return (overhead.states_factor * (breakdown.weights_bytes + breakdown.gradients_bytes)
            + overhead.optimizer_factor * breakdown.optimizer_bytes
            + overhead.factor(variant) * breakdown.activations_bytes * in_flight_weight
            + breakdown.other_bytes + overhead.constant_gib * GIB)


def framework_peak(scenario, overhead: MemoryOverhead, variant: str | None = None) -> tuple[int, float]:
    """(stage, bytes) of the rank with the highest framework peak over all pipeline stages."""
    _, _, stages = peak_rank_memory(scenario)
    par = scenario.parallelism
    values = [framework_peak_bytes(b, overhead, variant, microbatches_in_flight(
        par.schedule, par.pp, i, par.num_micro_batches, par.virtual_stages)) for i, b in enumerate(stages)]
    best = max(range(len(values)), key=lambda i: (values[i], -i))
    return best, values[best]


def fits_with_overhead(scenario, overhead: MemoryOverhead, variant: str | None = None) -> tuple[bool, float, str | None]:
    """(fits, peak GiB, reason) with the framework overhead applied."""
    stage, peak = framework_peak(scenario, overhead, variant)
    usable = usable_hbm_bytes(scenario)
    if peak <= usable:
        return True, peak / GIB, None
    return False, peak / GIB, (f"{overhead.framework}: needs {peak / GIB:.1f} GiB of {usable / GIB:.1f} GiB usable "
                               f"on stage {stage} (fitted overhead)")
