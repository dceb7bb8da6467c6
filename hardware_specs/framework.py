"""Framework profiles: what a training framework does to the accelerator's kernel rates, per accelerator
and precision, fitted on published end-to-end runs of that framework (``training.framework``).

The catalog's efficiency curves come from kernel microbenchmarks (GEMM, attention, memory-bound
kernels, collectives) and describe a framework that runs those kernels back to back: Megatron-Core
with Transformer Engine (NeMo's fitted H100 FP8 factor is 0.98 of the catalog curve). Other frameworks
lose part of that rate to their kernel choice and fusion (torch.compile or eager, SDPA backends),
host overheads and the clock their cluster's power cap allows; the loss is in no microbenchmark.
A profile holds, per (accelerator, precisions), the factors fitted on the *fit half* of that
framework's rows in ``validation/data/modern/`` (``python -m validation.modern --fit --write``
writes them here and in ``validation/profiles/``; never edited by hand):

- ``gemm_scale``: each point of the accelerator's GEMM curves times the factor (at most 1), and
  with ``gemm_tilt`` times ``(gflop / 10)^tilt`` up to ``gemm_ceiling``;
- ``attention_scale``: the fused attention kernel's efficiency (or, without one, the GEMM-curve
  estimate's factor) times the factor;
- ``kernel_launch_overhead_us``, ``host_dispatch_us_per_kernel`` (an eager framework's host time per
  kernel, simulator/cost/host_floor.py), ``moe_layer_fixed_us`` (a fixed time per MoE layer and micro-batch:
  Megatron-Core's router and dispatcher bookkeeping), ``intra_node_latency_us``
  (the node's collective latency);
- ``sync_jitter`` (the wait for the slowest rank, simulator/cost/jitter.py) and ``input_us_per_sample`` (the
  framework's input pipeline: host time per sample beside the GPU's step, simulator/strategies/spmd/plan.py);
- ``conv_sm_cycles_per_byte``: work the framework runs beside each convolution pass, bound by the SMs'
  instruction issue, in SM cycles per byte of the pass's operands (simulator/cost/compute.py): counted in SM
  cycles, it carries to a part of other SM count and clock (Lambda's fp16 ResNet-50, validation/modern/cnn.py).

Each entry records ``fitted_on`` (CSV and rows) and ``measured_on`` where the rows ran on a variant of
the catalog part (torchtitan's H100s: 96 GB HBM2e at 500 W), and the profile its ``fitted_with``: the
framework's own settings every fit row ran with (set for a scenario that leaves them out). Which entry a
scenario gets, and what is said when none was fitted for its accelerator or precision:
simulator/cost/framework.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from hardware_specs.catalog import YamlCatalog
from hardware_specs.schema import Precision, Spec
from simulator.errors import ConfigError, did_you_mean

FOLDER = Path(__file__).parent / "frameworks"

#: The framework whose kernels the catalog constants describe: no factor (the default of ``training.framework``).
DEFAULT_FRAMEWORK = "megatron-core"


#: The constants an entry may set (the others stay at the catalog's).
FACTOR_KEYS = ("gemm_scale", "gemm_tilt", "gemm_ceiling", "attention_scale", "kernel_launch_overhead_us",
               "host_dispatch_us_per_kernel", "moe_layer_fixed_us", "intra_node_latency_us", "sync_jitter",
               "input_us_per_sample", "conv_sm_cycles_per_byte")

#: The held-out figures of an entry's group (the rows of the other half, with the entry's constants), where
#: the fit computed them (validation/modern/registry.py ``fit``): what the output tells a user of the entry.
HELDOUT_KEYS = ("heldout_cases", "heldout_median_abs_error", "heldout_max_abs_error")


class FrameworkEntry(Spec):
    """The factors of one framework on one accelerator for one or more precisions."""

    accelerator: str = Field(description="catalog accelerator name the factors apply to")
    precisions: list[Precision] = Field(min_length=1, description="training precisions (tf32: fp32 on TF32 cores)")
    fp8_recipes: list[Literal["delayed", "current", "rowwise", "blockwise", "mxfp8", "nvfp4"]] | None = Field(
        default=None, min_length=1, description="with fp8: the training.fp8_recipe values this entry is for "
                                                "(None: any recipe no other entry of the part names)")
    gemm_scale: float | None = Field(default=None, gt=0, description="factor on the GEMM curves' points")
    gemm_tilt: float | None = Field(default=None, description="exponent of (gflop / 10) on the GEMM curve")
    gemm_ceiling: float | None = Field(default=None, gt=0, le=1, description="cap of a tilted GEMM curve")
    attention_scale: float | None = Field(default=None, gt=0, description="factor on the fused attention kernel")
    kernel_launch_overhead_us: float | None = Field(default=None, ge=0)
    host_dispatch_us_per_kernel: float | None = Field(default=None, ge=0)
    moe_layer_fixed_us: float | None = Field(
        default=None, ge=0, description="fixed time per MoE layer and micro-batch, forward and "
                                        "backward (simulator/cost/host_floor.py)")
    intra_node_latency_us: float | None = Field(default=None, ge=0)
    sync_jitter: float | None = Field(default=None, ge=0, description="the wait for the slowest rank "
                                                                    "(simulator/cost/jitter.py)")
    input_us_per_sample: float | None = Field(
        default=None, ge=0, description="the framework's time per sample beside the GPU's step (its input "
                                        "pipeline, on the hosts its rows ran on)")
    conv_sm_cycles_per_byte: float | None = Field(
        default=None, ge=0, description="SM cycles per byte of a convolution pass's operands the framework spends "
                                        "beside the kernel, bound by the SMs' instruction issue "
                                        "(simulator/cost/compute.py)")
    fit_cases: int = Field(gt=0, description="fit-half rows the factors were fitted on")
    fit_median_abs_error: float = Field(ge=0, description="median |error| on those rows after the fit")
    heldout_cases: int | None = Field(default=None, gt=0, description="held-out rows of the entry's group")
    heldout_median_abs_error: float | None = Field(default=None, ge=0, description="median |error| on them")
    heldout_max_abs_error: float | None = Field(default=None, ge=0, description="largest |error| on them")
    measured_on: str | None = Field(default=None, description="the part the rows ran on, where not the catalog's")
    measured_on_node: str | None = Field(
        default=None, description="the catalog node of that board (hardware_specs/nodes/), where one is shipped: a run "
                                  "on it is calibrated, on the part's other boards derived")
    fitted_on: str = Field(description="CSV and rows (fit half only)")

    @property
    def factors(self) -> dict[str, float]:
        """The constants the entry sets (the ones it leaves at the catalog's are absent)."""
        return {k: getattr(self, k) for k in FACTOR_KEYS if getattr(self, k) is not None}


class FrameworkProfile(Spec):
    """One framework's fitted entries."""

    name: str
    description: str
    source: str = Field(description="the published runs the entries were fitted on")
    fitted_with: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="scenario settings (parallelism.* / training.*) every fit row ran with: "
                                          "the factors describe the framework run so; a run set otherwise is warned")
    networks: list[str] | None = Field(default=None, description="the catalog networks (not transformers) its fit "
                                                                 "rows trained, for a profile fitted on CNN runs")
    entries: list[FrameworkEntry] = Field(min_length=1)


#: The shipped profiles as a catalog (``clustersim specs list --kind framework``).
FRAMEWORKS = YamlCatalog("framework", FOLDER, FrameworkProfile)


def framework_names() -> list[str]:
    """Valid ``training.framework`` values: the default and every shipped profile."""
    return [DEFAULT_FRAMEWORK, *FRAMEWORKS.names()]


def framework_profile(name: str, field: str = "training.framework") -> FrameworkProfile | None:
    """The shipped profile of ``name`` (None for the default, whose constants are the catalog's);
    an unknown name is a ConfigError naming the valid ones."""
    if name == DEFAULT_FRAMEWORK:
        return None
    if not FRAMEWORKS.has(name):
        raise ConfigError(field, f"unknown framework {name!r}{did_you_mean(name, framework_names())} "
                                f"(known: {', '.join(framework_names())})")
    return FRAMEWORKS.get(name, field)
