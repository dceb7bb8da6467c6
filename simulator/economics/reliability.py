"""The ``reliability:`` block of a scenario: failure processes, checkpoints and restarts that the
job timeline (:mod:`simulator.economics.job_timeline`) simulates over many steps.

Failure processes (``components``) are per *unit*: a GPU, a node (all its GPUs), a rack of
``rack_nodes`` nodes (a power or top-of-rack switch failure: correlated failures of all its GPUs)
or the whole job (a software bug). ``rates: llama3`` starts from Llama 3's Table 5 (Dubey et al.
2024, arXiv:2407.21783, Sec. 3.3.4: 419 unexpected interruptions in 54 days on 16,384 H100s), each
component at count / (54 d · 24 h · 16,384) per GPU-hour, as :mod:`simulator.economics.goodput`
reads it; an entry of ``components`` with a Table 5 name changes that component (its unit, its
distribution, its repair time), any other name adds a process and must give its rate.

Defaults that were not measured are marked *assumed* in their descriptions: the 10-minute restart
(as ``economics.restart_overhead_minutes``), 4 hours of repair, the 60 s collective timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.errors import ConfigError, no_bool_numbers

Unit = Literal["gpu", "node", "rack", "job"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)


class FailureComponent(_Strict):
    """One failure process: a rate per unit and what a failure takes down for how long."""

    rate_per_hour: float | None = Field(
        default=None, ge=0, description="failures per unit-hour (per GPU-hour for unit gpu); a Table 5 name may omit it")
    unit: Unit | None = Field(default=None, description="what fails: gpu | node | rack | job (Table 5 rows: gpu)")
    distribution: Literal["exponential", "weibull"] = Field(
        default="exponential", description="time between failures of one unit (exponential: Poisson, as Young/Daly)")
    weibull_shape: float = Field(default=1.0, gt=0, description="k of a Weibull distribution (< 1: infant mortality)")
    repair_hours: float | None = Field(default=None, ge=0, description="mean time a failed unit is out; default "
                                                                       "reliability.repair_hours")
    repair_distribution: Literal["fixed", "exponential", "lognormal"] = "exponential"
    repair_sigma: float = Field(default=1.0, ge=0, description="log-sd of a lognormal repair time")


class ReliabilitySpec(_Strict):
    """Failures, checkpoints and restarts over a simulated job (see the module docstring)."""

    seed: int = Field(default=0, ge=0, description="numpy Generator seed: one seed, one result, bit for bit")
    steps: int | None = Field(default=None, gt=0, description="training steps the job runs (or days)")
    days: float | None = Field(default=None, gt=0, description="wall-clock days simulated (default 54, Llama 3's "
                                                               "snapshot, when steps is not given)")
    rates: Literal["llama3", "none"] = Field(default="llama3", description="start from Llama 3 Table 5, or from nothing")
    rate_scale: float = Field(default=1.0, ge=0, description="multiplies every rate")
    components: dict[str, FailureComponent] = Field(default_factory=dict)
    rack_nodes: int = Field(default=32, gt=0, description="nodes per rack, for unit rack (assumed)")
    spare_nodes: int | None = Field(default=None, ge=0, description="healthy spare nodes; null: always enough, "
                                                                    "so a restart takes restart_minutes (Young/Daly)")
    repair_hours: float = Field(default=4.0, ge=0, description="mean repair or return time of a failed unit (assumed)")
    checkpoint_interval_minutes: float | None = Field(
        default=None, gt=0, description="default: Young's sqrt(2·write time·MTBF) rounded to whole steps")
    checkpoint_write_gb_per_s_per_node: float | None = Field(
        default=None, gt=0, description="default: economics.checkpoint_write_gb_per_s_per_node")
    checkpoint_read_gb_per_s_per_node: float | None = Field(
        default=None, gt=0, description="default: economics.checkpoint_read_gb_per_s_per_node")
    restart_minutes: float | None = Field(
        default=None, ge=0, description="reschedule + initialise, checkpoint read excluded; default "
                                        "economics.restart_overhead_minutes (10, assumed)")
    collective_timeout_s: float = Field(
        default=60.0, ge=0, description="elastic kinds: survivors wait this long for a failed peer before the group "
                                        "shrinks (assumed; NCCL/gloo timeouts are configurable)")
    download_gb_per_s_per_gpu: float | None = Field(
        default=None, gt=0, description="elastic kinds: a returning peer's state download rate per GPU; default its "
                                        "node's NIC bandwidth x efficiency / GPUs per node")

    @model_validator(mode="after")
    def _one_horizon(self):
        if self.steps is not None and self.days is not None:
            raise ValueError("give steps or days, not both")
        return self


@dataclass(frozen=True)
class Process:
    """A resolved failure process (rates scaled, defaults filled)."""

    name: str
    unit: Unit
    rate_per_hour: float
    distribution: str
    weibull_shape: float
    repair_s: float
    repair_distribution: str
    repair_sigma: float


def resolve_processes(spec: ReliabilitySpec, gpus_per_node: int = 8) -> list[Process]:
    """The failure processes of ``spec``: Table 5 rows then the user's additions, in order.

    A Table 5 row keeps its count of interruptions whatever unit it is given: its rate per GPU-hour
    times the GPUs of one unit (a node: ``gpus_per_node``; a rack: that x ``rack_nodes``; the job:
    the 16,384 GPUs of Llama 3's job), so a 16,384-GPU job still sees 419 in 54 days."""
    from simulator.economics.goodput import LLAMA3_SNAPSHOT_GPUS, llama3_failure_rates_per_gpu_hour

    gpus_per_unit = {"gpu": 1, "node": gpus_per_node, "rack": gpus_per_node * spec.rack_nodes,
                     "job": LLAMA3_SNAPSHOT_GPUS}

    base = llama3_failure_rates_per_gpu_hour() if spec.rates == "llama3" else {}
    processes: list[Process] = []

    def make(name: str, comp: FailureComponent, default_rate: float | None) -> Process:
        unit = comp.unit or "gpu"
        rate = comp.rate_per_hour
        if rate is None and default_rate is not None:
            rate = default_rate * gpus_per_unit[unit]
        if rate is None:
            known = ", ".join(base) if base else "none (rates: none)"
            raise ConfigError(f"reliability.components.{name}", "unknown component: not a Llama 3 Table 5 row and no "
                                                                f"rate_per_hour given (Table 5 rows: {known})")
        repair_h = comp.repair_hours if comp.repair_hours is not None else spec.repair_hours
        return Process(name, unit, rate * spec.rate_scale, comp.distribution, comp.weibull_shape,
                       repair_h * 3600.0, comp.repair_distribution, comp.repair_sigma)

    for name, rate in base.items():
        processes.append(make(name, spec.components.get(name, FailureComponent()), rate))
    for name, comp in spec.components.items():
        if name not in base:
            processes.append(make(name, comp, None))
    return processes
