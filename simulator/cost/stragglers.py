"""Stragglers: per-device speed drawn from a distribution, simulated device by device.

``simulation.stragglers`` gives every simulated device a *time factor* f (its kernels take f times
their priced time) drawn from a seeded distribution, either once for the whole run (``per: device``:
a persistently slow GPU -- thermal throttling, a bad PCIe link, a noisy neighbour) or afresh for every
step of that device (``per: step``: transient slowdowns -- OS noise, garbage collection, data
loading). Distributions:

- ``lognormal``: f = exp(σZ − σ²/2), Z standard normal (mean 1, so one device alone keeps its expected
  time; heavy right tail, as measured step-time distributions are: Hoefler, Schneider and Lumsdaine,
  SC'10, Sec. 4);
- ``normal``: f = max(0.05, 1 + cv·Z) (mean ≈ 1; the floor keeps a time positive);
- ``fixed``: a ``fraction`` of the devices run ``factor`` times slower (per device: that many devices
  chosen by the seed; per step: each device is slow in a step with probability ``fraction``).

Draws are reproducible bit for bit: device r's draws come from ``numpy.random.default_rng([seed, r])``
in step order (the fixed per-device choice from ``default_rng([seed])``), whatever else the run holds.

How this differs from ``efficiency.sync_jitter`` (simulator/cost/jitter.py): the jitter stretch is an
*expected-value correction* applied to every kernel of every rank alike, 1 + σ·E[max of N normals], in
any mode; it cannot tell a synchronous strategy from an asynchronous one, nor a persistent straggler
from a transient one. Stragglers are *sampled* per device and simulated in full mode (every device an
actor): a synchronous collective waits for its slowest member in the engine, so a DP step takes
≈ E[max_i f_i]·T, while a strategy that synchronises every H steps (local SGD) waits for the slowest
*sum* of H draws, ≈ (1 + (E[max] − 1)/√H)·T for transient stragglers -- and gains nothing against a
persistent one. Which steps a draw covers: an actor's step ends at its task in the plan's
``step_ends`` (simulator/strategies/plan.py); an actor with none there (later stages of an
asynchronous pipeline) starts a new draw after each of its optimizer updates.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.errors import ConfigError, no_bool_numbers

if TYPE_CHECKING:  # numpy is imported only where stragglers are drawn: the scenario schema imports this module
    import numpy as np

#: The smallest time factor a normal draw may give (a device cannot run in zero time).
NORMAL_FLOOR = 0.05
#: Compute-stream categories whose time is device work (scaled); others are waits or host stalls.
DEVICE_CATEGORIES = ("compute", "recompute", "optimizer")


class StragglerSpec(BaseModel):
    """``simulation.stragglers``: per-device speed distribution (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)

    distribution: Literal["lognormal", "normal", "fixed"]
    sigma: float | None = Field(default=None, gt=0, le=3, description="lognormal: std of ln(time factor)")
    cv: float | None = Field(default=None, gt=0, le=1, description="normal: relative std of the time factor")
    factor: float | None = Field(default=None, gt=0, le=1000, description="fixed: time factor of a slow device")
    fraction: float | None = Field(default=None, ge=0, le=1, description="fixed: share of slow devices")
    seed: int = Field(default=0, ge=0)
    per: Literal["device", "step"] = Field(
        default="step", description="device: one draw per device for the run; step: a fresh draw every step")

    @model_validator(mode="after")
    def _parameters(self) -> StragglerSpec:
        need = {"lognormal": ("sigma",), "normal": ("cv",), "fixed": ("factor", "fraction")}[self.distribution]
        for name in need:
            if getattr(self, name) is None:
                raise ValueError(f"{self.distribution} needs {name}")
        for name in ("sigma", "cv", "factor", "fraction"):
            if name not in need and getattr(self, name) is not None:
                raise ValueError(f"{name} is not a parameter of {self.distribution}")
        return self

    def describe(self) -> str:
        params = ", ".join(f"{k} {getattr(self, k):g}" for k in ("sigma", "cv", "factor", "fraction")
                           if getattr(self, k) is not None)
        return f"{self.distribution} ({params}), per {self.per}, seed {self.seed}"


class StragglerDraws:
    """Time factors per (device rank, step of that device), drawn lazily in step order."""

    def __init__(self, spec: StragglerSpec, num_devices: int):
        import numpy as np

        self.spec = spec
        self.num_devices = num_devices
        self._rngs: dict[int, np.random.Generator] = {}
        self._drawn: dict[int, list[float]] = {}
        self._slow: set[int] | None = None
        if spec.distribution == "fixed" and spec.per == "device":
            count = round(spec.fraction * num_devices)
            order = np.random.default_rng([spec.seed]).permutation(num_devices)
            self._slow = {int(r) for r in order[:count]}

    def _draw(self, rank: int) -> float:
        spec = self.spec
        if spec.distribution == "fixed" and spec.per == "device":
            return spec.factor if rank in self._slow else 1.0
        rng = self._rngs.get(rank)
        if rng is None:
            import numpy as np

            rng = self._rngs[rank] = np.random.default_rng([spec.seed, rank])
        if spec.distribution == "lognormal":
            return math.exp(spec.sigma * rng.standard_normal() - spec.sigma ** 2 / 2)
        if spec.distribution == "normal":
            return max(NORMAL_FLOOR, 1.0 + spec.cv * rng.standard_normal())
        return spec.factor if rng.random() < spec.fraction else 1.0

    def factor(self, rank: int, step: int) -> float:
        """Device ``rank``'s time factor in its step ``step`` (the same for every step with per: device)."""
        if self.spec.per == "device":
            step = 0
        drawn = self._drawn.setdefault(rank, [])
        while len(drawn) <= step:
            drawn.append(self._draw(rank))
        return drawn[step]

    def drawn(self) -> dict[int, list[float]]:
        """Every factor drawn so far: rank -> [factor of step 0, 1, ...]."""
        return {r: list(v) for r, v in self._drawn.items()}


def apply_stragglers(plan, spec: StragglerSpec, num_devices: int, field: str = "simulation.stragglers") -> StragglerDraws:
    """Scale every device-work task on each actor's compute stream by its device's factor for the
    step the task belongs to (in place, before the engine runs). Every device must be an actor."""
    if len(plan.actors) != num_devices:
        raise ConfigError(field, f"per-device speeds need every device simulated: the plan has {len(plan.actors)} "
                                 f"actors for {num_devices} devices (set simulation.mode: full; kinds that simulate "
                                 "one actor per pipeline stage need one device per stage: tp = dp = cp = 1)")
    draws = StragglerDraws(spec, num_devices)
    step_of_end = {id(t): k for k, ends in enumerate(plan.step_ends) for t in ends}
    for actor, rank in plan.actors.items():
        tasks = plan.streams.get((actor, "compute"), [])
        own_ends = any(id(t) in step_of_end for t in tasks)
        step = 0
        for task in tasks:
            if task.demands is None and task.duration_s > 0 and task.category in DEVICE_CATEGORIES:
                f = draws.factor(rank, step)
                task.duration_s *= f
                if task.segments:
                    task.segments = tuple((c, s * f) for c, s in task.segments)
            if own_ends:
                k = step_of_end.get(id(task))
                if k is not None and k >= step:
                    step = k + 1
            elif task.category == "optimizer":
                step += 1
    return draws


def straggler_summary(draws: StragglerDraws) -> dict[str, float | str]:
    """What the result reports: the spec and the drawn factors' mean and extremes."""
    import numpy as np

    values = [f for fs in draws.drawn().values() for f in fs]
    return {"stragglers": draws.spec.describe(), "straggler_factor_mean": float(np.mean(values)) if values else 1.0,
            "straggler_factor_max": max(values, default=1.0), "straggler_factor_min": min(values, default=1.0)}
