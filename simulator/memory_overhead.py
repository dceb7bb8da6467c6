"""What a training framework really holds beyond the analytic breakdown of ``simulator.memory``.

``simulator.memory`` counts the bytes a layout needs (model states by ZeRO stage, Korthikanti
activations, communication buffers). Frameworks hold more: the caching allocator's reserve and
fragmentation, un-fused kernels' saved intermediates (an unfused RMSNorm keeps fp32 copies of
its input), fp32 casts, workspace, duplicated gradient buffers. Measured peaks are therefore a
framework-specific multiple of the analytic one (nanotron on the Ultra-Scale Playbook sweep
reports ~1.5-1.9x the breakdown). A :class:`MemoryOverhead` maps the breakdown to the peak the
framework would report::

    peak = states_factor · (weights + gradients) + optimizer_factor · optimizer
           + activations_factor[variant] · activations + other + constant_gib

and a layout fits when that peak is at most the accelerator's HBM less the scenario's reserve
(``simulator.memory.usable_hbm_bytes``). The factors are FITTED on named measurements (the spec
records ``source`` and ``fitted_on``); ``variant`` names a framework setting that changes the
activation overhead (e.g. a fused RMSNorm kernel or not). The default (all factors 1, constant 0)
is the plain breakdown. Pure functions, no SimPy; ``simulator.memory`` is not changed by this.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from simulator.errors import ConfigError
from simulator.memory import GIB, MemoryBreakdown, peak_rank_memory, usable_hbm_bytes


class MemoryOverhead(BaseModel):
    """Fitted map from the analytic breakdown to a framework's measured peak (see module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    framework: str
    states_factor: float = Field(default=1.0, gt=0)
    optimizer_factor: float = Field(default=1.0, gt=0)
    activations_factor: dict[str, float] = Field(default_factory=lambda: {"default": 1.0})
    constant_gib: float = 0.0
    source: str
    fitted_on: str | None = None

    def factor(self, variant: str | None) -> float:
        key = variant or "default"
        if key not in self.activations_factor:
            raise ConfigError("memory_overhead.activations_factor",
                              f"no factor for variant {key!r} (has: {', '.join(self.activations_factor)})")
        return self.activations_factor[key]


def framework_peak_bytes(breakdown: MemoryBreakdown, overhead: MemoryOverhead, variant: str | None = None) -> float:
    """The peak the framework would report for a rank whose analytic breakdown is ``breakdown``."""
    return (overhead.states_factor * (breakdown.weights_bytes + breakdown.gradients_bytes)
            + overhead.optimizer_factor * breakdown.optimizer_bytes
            + overhead.factor(variant) * breakdown.activations_bytes
            + breakdown.other_bytes + overhead.constant_gib * GIB)


def framework_peak(scenario, overhead: MemoryOverhead, variant: str | None = None) -> tuple[int, float]:
    """(stage, bytes) of the rank with the highest framework peak over all pipeline stages."""
    _, _, stages = peak_rank_memory(scenario)
    values = [framework_peak_bytes(b, overhead, variant) for b in stages]
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
