"""The ``co_located_jobs:`` field of a scenario: other training jobs on the same GPUs.

DeepPool (Park et al., "Efficient Strong Scaling Through Burst Parallel Training", MLSys 2022,
Sec. 5) runs a latency-sensitive *foreground* job strong-scaled over many GPUs and lets
*background* training jobs use the GPU time the foreground leaves idle (its pipeline bubbles and
communication waits), at a lower CUDA stream priority; the background costs the foreground some
speed (interference). Here the scenario that holds the field *is* the foreground (priority 0),
and every entry names a whole scenario of its own (model, strategy, layout, training) that
runs on the foreground's cluster.

Why a scenario field (not ``simulate --with BG.yaml`` or a strategy kind that holds jobs): the
pair is one experiment a user wants to keep in one file and run through every command
(``simulate``, ``sweep`` with ``--set co_located_jobs.0.priority=2``, ``validate``); a CLI flag
would exist only in ``simulate``; a strategy kind owns *one* job's plan, while here each job keeps
its own kind. The background scenario leaves out ``cluster:`` (it inherits the foreground's; a
different one is an error: they share the GPUs).

``interference_slowdown`` s: while a job has kernels waiting on a GPU, every higher-priority job's
kernels on that GPU run at 1/(1+s) of their speed (thread blocks of the background in flight when
a foreground kernel arrives, caches, memory bandwidth). It is a stated parameter:
``interference_source`` names where the number came from; left out, it is *assumed* and the
output says so. No default value: a silent 0 would promise interference-free sharing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator.errors import no_bool_numbers

ASSUMED = "assumed"


class CoLocatedJobSpec(BaseModel):
    """One entry of ``co_located_jobs:`` as written."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)

    scenario: str | dict[str, Any] = Field(
        description="the background job: a scenario YAML path (relative to this file) or an inline mapping, "
                    "without cluster: (it runs on this scenario's GPUs)")
    priority: int = Field(ge=1, le=1000, description="lower runs first; the foreground (this scenario) is 0")
    interference_slowdown: float = Field(
        ge=0, le=100, description="s: higher-priority kernels on a GPU run at 1/(1+s) while this job has "
                                  "kernels waiting there")
    interference_source: str = Field(default=ASSUMED, min_length=1,
                                     description="where s comes from (a paper, a measurement); 'assumed' if not")


@dataclass(frozen=True)
class CoLocatedJob:
    """A resolved background job: its scenario (on the foreground's cluster) and how it shares."""

    scenario: Any  # simulator.scenario.Scenario
    priority: int
    interference_slowdown: float
    interference_source: str

    @property
    def interference_assumed(self) -> bool:
        return self.interference_source.strip().lower() == ASSUMED


def refuse_co_located(command: str) -> None:
    """``search`` and ``scale`` explore one job's layouts with the fast path; a scenario with co-located
    jobs would need every candidate timed with its background jobs by the engine. Refused by name:
    ``simulate`` or a ``sweep`` over the foreground's ``parallelism.*`` does it."""
    from simulator.errors import ConfigError

    raise ConfigError("co_located_jobs", f"{command} explores one job's layouts; for co-located jobs run simulate, "
                                         "or sweep the foreground's parallelism.* (every point timed with its jobs)")
