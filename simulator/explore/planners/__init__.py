"""Planners: algorithms from the literature that search a parallel plan with the simulator as
their cost oracle (``clustersim plan SCENARIO --planner NAME``).

A planner is one module under this package that calls :func:`register` once at import with a
:class:`PlannerKind`; :data:`PLANNER_MODULES` lists them (a new planner is one module and one
line there). ``run(raw, options)`` takes the scenario as a raw mapping (file references made
absolute) and the planner's options, and returns a :class:`PlanResult`: the plan as a scenario
mapping the user can simulate, its simulated step time, and what it cost to find (wall seconds,
plans priced by the planner's own estimate, plans simulated by the engine; and CPU seconds, this process's and its reaped worker processes', which
``clustersim plan`` fills in: on a loaded machine wall seconds say little about the work).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import ConfigError

#: Every planner module, imported by :func:`load_planners`.
PLANNER_MODULES: tuple[str, ...] = (
    "simulator.explore.planners.dapple",
    "simulator.explore.planners.pase",
    "simulator.explore.planners.deeppool",
    "simulator.explore.planners.adaptive",
)


@dataclass
class PlanResult:
    """A planner's answer: ``scenario`` (a raw scenario mapping holding the plan), its simulated
    ``step_time_s`` and ``samples_per_s`` (None, with the ``reason``, for a plan that cannot run:
    out of memory), and the cost of finding it."""

    planner: str
    scenario: dict[str, Any]
    step_time_s: float | None  # None: the plan cannot run (``reason``)
    samples_per_s: float | None
    wall_s: float
    plans_estimated: int
    plans_simulated: int
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    estimated_what: str = "plans estimated"  # what ``plans_estimated`` counts (a DP: costs priced)
    reason: str | None = None
    notes: list[str] = field(default_factory=list)  # more comment lines for the plan's YAML
    cpu_s: float | None = None  # CPU seconds of the search, workers included (set by `clustersim plan`)

    def header(self) -> str:
        """Comment lines for the top of the plan's YAML: what was found and what it cost."""
        lines = [f"plan found by `clustersim plan --planner {self.planner}`",
                 self.summary,
                 (f"simulated step time {self.step_time_s:.6g} s, {self.samples_per_s:,.1f} samples/s"
                  if self.step_time_s is not None else f"the plan cannot run: {self.reason}"),
                 f"cost to find: {self.wall_s:.2f} s wall"
                 + (f", {self.cpu_s:.2f} CPU-s (this process and its workers)" if self.cpu_s is not None else "")
                 + f", {self.plans_estimated} {self.estimated_what}, "
                 f"{self.plans_simulated} simulated", *self.notes]
        return "".join(f"# {line}\n" for line in lines)


@dataclass(frozen=True)
class PlannerKind:
    """A planner: its ``name``, a one-line ``summary``, its ``options`` (name -> help) and ``run``."""

    name: str
    summary: str
    options: dict[str, str]
    run: Callable[[dict[str, Any], dict[str, Any]], PlanResult]


_PLANNERS: dict[str, PlannerKind] = {}


def register(planner: PlannerKind) -> PlannerKind:
    if planner.name in _PLANNERS:
        raise ValueError(f"planner {planner.name!r} is registered twice")
    _PLANNERS[planner.name] = planner
    return planner


def planner_help() -> dict[str, tuple[str, dict[str, str]]]:
    """Every planner's name, summary and options (option -> help), read from the modules' source
    without importing them (simulator/registry_source.py: ``clustersim --help`` stays light); where a
    module's values are not literals (or an ``OPTIONS = {...}`` literal it names), it is imported."""
    from simulator.registry_source import literal_call_fields

    out: dict[str, tuple[str, dict[str, str]]] = {}
    for module in PLANNER_MODULES:
        found = literal_call_fields(module, "PlannerKind", ("name", "summary", "options"), names=True)
        if found is None:
            before = set(_PLANNERS)
            importlib.import_module(module)
            out.update({name: (_PLANNERS[name].summary, dict(_PLANNERS[name].options))
                        for name in set(_PLANNERS) - before})
        else:
            out[str(found["name"])] = (str(found["summary"]), {str(k): str(v) for k, v in dict(found["options"]).items()})
    return out


def planner_summaries() -> dict[str, str]:
    """Every planner's name and summary (:func:`planner_help`)."""
    return {name: summary for name, (summary, _) in planner_help().items()}


def load_planners() -> dict[str, PlannerKind]:
    for module in PLANNER_MODULES:
        importlib.import_module(module)
    return dict(_PLANNERS)


def get_planner(name: str) -> PlannerKind:
    planners = load_planners()
    if name not in planners:
        raise ConfigError("--planner", f"unknown planner {name!r}; known: {', '.join(sorted(planners))}")
    return planners[name]


def check_options(planner: PlannerKind, options: dict[str, Any]) -> None:
    for key in options:
        if key not in planner.options:
            known = ", ".join(planner.options) or "none"
            raise ConfigError(f"--option {key}", f"unknown option of planner {planner.name} (known: {known})")


def list_option(options: dict[str, Any], key: str, known: tuple[str, ...], default: tuple[str, ...],
                what: str) -> tuple[str, ...]:
    """A comma-separated option whose every item is one of ``known`` (a ConfigError naming the option and
    the unknown ``what`` otherwise)."""
    items = tuple(str(options.get(key, ",".join(default))).replace(" ", "").split(","))
    for item in items:
        if item not in known:
            raise ConfigError(f"--option {key}", f"unknown {what} {item!r} (known: {', '.join(known)})")
    return items


def int_option(options: dict[str, Any], key: str, default: int, minimum: int = 1) -> int:
    """An integer option (a ConfigError naming it when it is not an integer >= ``minimum``)."""
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"--option {key}", f"must be an integer >= {minimum}, got {value!r}")
    return value
