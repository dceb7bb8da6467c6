"""Time, cost and energy to train, with goodput under failures.

``training_economics(scenario, result)`` turns one simulated step into the numbers a buyer
asks for, given ``training.tokens``:

- **ideal wall-clock** ``tokens / tokens_per_s`` (``time_to_train_days``);
- **effective wall-clock** ``ideal / goodput`` (``effective_time_to_train_days``), goodput from
  :mod:`simulator.economics.goodput` (interruptions, checkpoints, restarts);
- **GPU-hours** ``num_gpus · effective hours`` (a reserved GPU is paid while it waits for a
  restart) and **dollars** ``gpu_hours · gpu_hour_usd``;
- **energy** ``PUE · (N_gpu · P_gpu + N_node · P_node) · effective hours`` in MWh, where the GPU
  draws ``P_gpu = idle + (TDP − idle) · u`` — linear in its utilisation ``u`` between the idle and
  TDP figures of the accelerator spec (a first-order power model; GPUs running large GEMMs sit
  close to TDP, e.g. A100 at ~400 W). ``u`` is by default the busy fraction of the step
  (compute + recompute + optimizer time over step time, from the simulated breakdown); ``"hfu"``, ``"mfu"`` or
  a number may be chosen. Node overhead (CPUs, NICs, fans) is drawn in full by every node.
  Restarts and lost work are charged at the same average draw (a slight over-estimate).

Narayanan et al. 2021 (arXiv:2104.04473, Sec. 5.1) estimate end-to-end training time as
``8·T·P / (n·X)`` (T tokens, P parameters, n GPUs, X achieved FLOP/s per GPU, recompute
included): 175B on 1024 A100 at 140 TFLOP/s for 300B tokens ≈ 34 days; 1T on 3072 at 163 for
450B ≈ 84 days. :func:`narayanan_training_days` is that formula; tests/test_economics.py checks
both it and ``training_economics`` against those figures.

Every default below is a stated assumption with a source; override it in the scenario's
``economics:`` mapping (``--set economics.gpu_hour_usd=2.5``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.economics import goodput as gp
from simulator.errors import ConfigError

if TYPE_CHECKING:  # the scenario module imports this one; keep the import one-way at run time
    from simulator.scenario import Scenario

# Narayanan et al. 2021 Sec. 5.10: checkpoint save at 273 GB/s (40% of peak write) and initial
# load at 1 TB/s peak read, on 384 DGX A100 nodes (their 1T run) -> per node:
NARAYANAN_WRITE_GB_PER_S_PER_NODE = 273.0 / 384
NARAYANAN_READ_GB_PER_S_PER_NODE = 1000.0 / 384

ECONOMICS_KEYS = (
    "time_to_train_days",
    "effective_time_to_train_days",
    "goodput",
    "gpu_hours",
    "cost_usd",
    "energy_mwh",
    "avg_power_kw",
    "gpu_power_watts",
    "job_mtbf_hours",
    "expected_interruptions",
    "checkpoint_gb",
    "checkpoint_write_s",
    "checkpoint_interval_min",
    "restart_s",
)
"""Keys :func:`training_economics` returns (all present; None where they cannot be computed)."""


class EconomicsSpec(BaseModel):
    """Prices, power and failure inputs for time/cost/energy to train (``economics:`` in a scenario).

    ``None`` means "take it from the hardware spec" (TDP, idle, node overhead) or "derive it"
    (checkpoint bytes from precision and optimizer; interval from Young/Daly; failure rates
    from Llama 3 Table 5).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    gpu_hour_usd: float = Field(
        default=2.0, ge=0, description="price of one GPU-hour (assumption: 2024 cloud A100/H100 rates span ~1-4 USD)"
    )
    pue: float = Field(
        default=1.2, ge=1.0, description="facility power / IT power (assumption: modern hyperscale data centres 1.1-1.2)"
    )
    gpu_tdp_watts: float | None = Field(default=None, gt=0, description="default: accelerator tdp_watts")
    gpu_idle_watts: float | None = Field(default=None, ge=0, description="default: accelerator idle_watts")
    idle_fraction_of_tdp: float = Field(
        default=0.15, ge=0, le=1, description="idle draw when the spec has no idle_watts (A100: 60 of 400 W)"
    )
    utilisation: str | float = Field(
        default="busy", description="'busy' (compute share of the step), 'hfu', 'mfu', or a number in [0, 1]"
    )
    node_overhead_watts: float | None = Field(default=None, ge=0, description="default: node node_overhead_watts")
    checkpoint_bytes_per_parameter: float | None = Field(
        default=None, gt=0, description="default: weights + optimizer state (14 for mixed-precision Adam)"
    )
    checkpoint_write_gb_per_s_per_node: float = Field(
        default=NARAYANAN_WRITE_GB_PER_S_PER_NODE, gt=0, description="Narayanan 2021 Sec. 5.10: 273 GB/s on 384 nodes"
    )
    checkpoint_read_gb_per_s_per_node: float = Field(
        default=NARAYANAN_READ_GB_PER_S_PER_NODE, gt=0, description="Narayanan 2021 Sec. 5.10: 1 TB/s on 384 nodes"
    )
    storage_max_gb_per_s: float | None = Field(default=None, gt=0, description="cap on aggregate storage bandwidth")
    checkpoint_interval_minutes: float | None = Field(default=None, gt=0, description="default: Young/Daly optimum")
    restart_overhead_minutes: float = Field(
        default=10.0, ge=0, description="reschedule + initialise + warm up, checkpoint read excluded (assumption)"
    )
    failures: bool = Field(default=True, description="model interruptions (false: goodput from checkpoints only)")
    failure_rates_per_gpu_hour: dict[str, float] | None = Field(
        default=None, description="interruptions per GPU-hour by component; default Llama 3 Table 5"
    )
    failure_rate_scale: float = Field(default=1.0, ge=0, description="multiplies every failure rate")

    @field_validator("utilisation")
    @classmethod
    def _utilisation(cls, value: str | float) -> str | float:
        if isinstance(value, str):
            if value not in ("busy", "hfu", "mfu"):
                raise ValueError("must be 'busy', 'hfu', 'mfu' or a number in [0, 1]")
            return value
        if not (0.0 <= float(value) <= 1.0):
            raise ValueError("a number must lie in [0, 1]")
        return float(value)

    @field_validator("failure_rates_per_gpu_hour")
    @classmethod
    def _rates(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            for name, rate in value.items():
                if not (rate >= 0 and math.isfinite(rate)):
                    raise ValueError(f"{name}: a rate must be finite and >= 0")
        return value


def narayanan_training_days(tokens: float, num_parameters: float, num_gpus: int, tflops_per_gpu: float) -> float:
    """Narayanan et al. 2021 Sec. 5.1: end-to-end training time ≈ 8·T·P/(n·X), in days."""
    if tokens <= 0 or num_parameters <= 0 or num_gpus <= 0 or tflops_per_gpu <= 0:
        raise ConfigError("economics", "tokens, parameters, GPUs and TFLOP/s must be positive")
    return 8.0 * tokens * num_parameters / (num_gpus * tflops_per_gpu * 1e12) / 86400.0


def checkpoint_bytes_per_parameter(precision: str, optimizer: str) -> float:
    """Bytes of model state saved per parameter: weights in the training precision (fp8 runs
    keep bf16 weights) plus an fp32 master copy when that precision is lower, plus the
    optimizer's fp32 moments (Adam: 2, SGD with momentum: 1). Mixed-precision Adam: 2+4+8 = 14,
    as Narayanan 2021's 13.8 TB for 1T parameters."""
    moments = 2 if optimizer in ("adam", "adamw") else 1
    if precision == "fp32":
        return 4.0 + 4.0 * moments
    return 2.0 + 4.0 + 4.0 * moments


def gpu_power_watts(spec: EconomicsSpec, tdp_watts: float, idle_watts: float | None, utilisation: float) -> float:
    """Average GPU draw: linear between idle and TDP in the utilisation."""
    tdp = spec.gpu_tdp_watts if spec.gpu_tdp_watts is not None else tdp_watts
    if spec.gpu_idle_watts is not None:
        idle = spec.gpu_idle_watts
    elif idle_watts is not None:
        idle = idle_watts
    else:
        idle = spec.idle_fraction_of_tdp * tdp
    if idle > tdp:
        raise ConfigError("economics.gpu_idle_watts", f"idle draw {idle} W exceeds TDP {tdp} W")
    u = min(1.0, max(0.0, utilisation))
    return idle + (tdp - idle) * u


def _number(result: dict[str, Any], key: str) -> float | None:
    value = result.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def utilisation_of(spec: EconomicsSpec, result: dict[str, Any]) -> float:
    """The utilisation the power model uses (see module docstring)."""
    choice = spec.utilisation
    if not isinstance(choice, str):
        return float(choice)
    if choice in ("hfu", "mfu"):
        return _number(result, choice) or 0.0
    step = _number(result, "step_time_s")
    breakdown = result.get("time_breakdown_s") or {}
    if step and isinstance(breakdown, dict) and "compute" in breakdown:
        busy = sum(float(breakdown.get(k) or 0.0) for k in ("compute", "recompute", "optimizer"))
        return min(1.0, max(0.0, busy / step))
    return _number(result, "hfu") or 0.0  # no breakdown: the tensor-core share is the best we have


def training_economics(scenario: Scenario, result: dict[str, Any]) -> dict[str, Any]:
    """Time/cost/energy to train ``scenario.training.tokens`` at the simulated throughput.

    ``result`` is a ``SimulationResult.to_dict()``-shaped mapping (``tokens_per_s``,
    ``step_time_s``, ``time_breakdown_s``, ``hfu``, ``mfu``, ``fits``, ``num_parameters``, and
    ``num_parameters_padded`` where the layout holds a padded vocabulary).
    Returns every key of :data:`ECONOMICS_KEYS`; time/cost/energy are None when the layout does
    not fit, has no throughput, or no tokens are given.
    """
    spec: EconomicsSpec = getattr(scenario, "economics", None) or EconomicsSpec()
    out: dict[str, Any] = dict.fromkeys(ECONOMICS_KEYS)
    n_gpus = scenario.num_gpus
    n_nodes = scenario.num_nodes

    # Power does not depend on tokens.
    u = utilisation_of(spec, result)
    # each node group's GPUs at their own TDP and nodes at their own overhead (one group: the node's)
    groups = getattr(scenario, "groups", None) or ()
    if len(groups) > 1:
        gpu_watts = sum(g.num_gpus * gpu_power_watts(spec, g.accelerator.tdp_watts, g.accelerator.idle_watts, u)
                        for g in groups)
        node_watts = sum(g.num_nodes * (spec.node_overhead_watts if spec.node_overhead_watts is not None
                                        else g.node.node_overhead_watts) for g in groups)
        p_gpu = gpu_watts / n_gpus
    else:
        p_gpu = gpu_power_watts(spec, scenario.accelerator.tdp_watts, scenario.accelerator.idle_watts, u)
        p_node = spec.node_overhead_watts if spec.node_overhead_watts is not None else scenario.node.node_overhead_watts
        gpu_watts, node_watts = n_gpus * p_gpu, n_nodes * p_node
    facility_watts = spec.pue * (gpu_watts + node_watts)
    out["gpu_power_watts"] = p_gpu
    out["avg_power_kw"] = facility_watts / 1e3

    # Checkpoints and failures do not depend on throughput either.
    # a checkpoint holds what the ranks hold: the padded vocabulary's rows too (Megatron saves them)
    params = _number(result, "num_parameters_padded") or _number(result, "num_parameters")
    if params is None:
        from workloads.counting import total_params

        params = float(total_params(scenario.model))
    per_param = spec.checkpoint_bytes_per_parameter or checkpoint_bytes_per_parameter(
        scenario.training.precision, scenario.training.optimizer
    )
    ckpt_bytes = params * per_param
    write_bw = spec.checkpoint_write_gb_per_s_per_node * n_nodes
    read_bw = spec.checkpoint_read_gb_per_s_per_node * n_nodes
    if spec.storage_max_gb_per_s is not None:
        write_bw = min(write_bw, spec.storage_max_gb_per_s)
        read_bw = min(read_bw, spec.storage_max_gb_per_s)
    if spec.failures:
        rates = spec.failure_rates_per_gpu_hour
        if rates is None:
            rates = gp.llama3_failure_rates_per_gpu_hour()
    else:
        rates = {}
    report = gp.analyse_goodput(
        num_gpus=n_gpus,
        checkpoint_bytes=ckpt_bytes,
        write_gb_per_s=write_bw,
        read_gb_per_s=read_bw,
        restart_overhead_s=spec.restart_overhead_minutes * 60.0,
        rates_per_gpu_hour=rates,
        rate_scale=spec.failure_rate_scale,
        interval_s=spec.checkpoint_interval_minutes * 60.0 if spec.checkpoint_interval_minutes else None,
    )
    out["goodput"] = report.goodput
    out["job_mtbf_hours"] = report.job_mtbf_hours
    out["checkpoint_gb"] = ckpt_bytes / 1e9
    out["checkpoint_write_s"] = report.checkpoint_write_s
    out["checkpoint_interval_min"] = (
        report.checkpoint_interval_s / 60.0 if report.checkpoint_interval_s is not None else None
    )
    out["restart_s"] = report.restart_s

    tokens = scenario.training.tokens
    rate = _number(result, "tokens_per_s")
    if tokens is None or result.get("fits") is False or not rate or rate <= 0:
        return out
    ideal_s = tokens / rate
    out["time_to_train_days"] = ideal_s / 86400.0
    if report.goodput <= 0:
        return out  # never finishes: effective time, cost and energy stay None
    wall_s = ideal_s / report.goodput
    hours = wall_s / 3600.0
    out["effective_time_to_train_days"] = wall_s / 86400.0
    out["gpu_hours"] = n_gpus * hours
    out["cost_usd"] = out["gpu_hours"] * spec.gpu_hour_usd
    out["energy_mwh"] = facility_watts * hours / 1e6
    out["expected_interruptions"] = hours * report.job_interruptions_per_day / 24.0
    return out
