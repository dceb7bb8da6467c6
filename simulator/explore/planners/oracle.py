"""The simulator as a planner's cost oracle: a raw scenario mapping in, its simulated step out.

Each call builds the scenario (bad plans are ConfigErrors the caller may skip), checks memory
with the strategy kind's own model, and runs the discrete-event engine; the count of calls is
the "plans simulated" a planner reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.errors import ConfigError

#: ``parallelism`` fields of a uniform layout that per_layer's layout does not have: its layout has one
#: replica (each layer's GPUs are its split's), and expert degrees would be checked against that one
#: replica (``etp*ep = 1*8 does not divide the 1 ranks``, a false reason).
UNIFORM_LAYOUT_FIELDS: frozenset[str] = frozenset({"dp", "ep", "etp"})
#: ``parallelism`` fields per_layer refuses (simulator/strategies/per_layer/kind.py: it does not
#: recompute, nor shard model state by ZeRO): dropped from every per-layer plan, and said so in the
#: plan's header (:func:`dropped_recompute_notes`), so a scenario that states them still gets a plan that runs.
#: Megatron-Core's recompute fields (``recompute_modules``, ``recompute_method``, ``recompute_num_layers``: read
#: with ``recompute``, refused by every kind but spmd, simulator/scenario.py ``_layout``) go with it.
PER_LAYER_REFUSED_FIELDS: frozenset[str] = frozenset({"recompute", "recompute_modules", "recompute_method",
                                                      "recompute_num_layers", "zero_stage"})


def with_per_layer(raw: dict[str, Any], strategy: dict[str, Any]) -> dict[str, Any]:
    """The user's scenario with ``strategy`` (a ``per_layer`` block) in place of its own. The
    data-parallel and expert degrees its layout states (``parallelism.dp``, ``ep``, ``etp``: a
    data-parallel, subnetwork-DP or expert-parallel scenario) are dropped: per_layer lays out each
    layer on its own split (a mixture of experts is then refused by name, :class:`Pricer`). So is
    ``parallelism.recompute`` and ``zero_stage``, which per_layer does not model; the planners say so
    in the plan's header (:func:`dropped_recompute_notes`)."""
    import copy

    out = copy.deepcopy(raw)
    out["strategy"] = strategy
    if out.get("parallelism"):
        dropped = UNIFORM_LAYOUT_FIELDS | PER_LAYER_REFUSED_FIELDS
        out["parallelism"] = {k: v for k, v in out["parallelism"].items() if k not in dropped}
    return out


def stated_recompute(raw: dict[str, Any]) -> str:
    """The scenario's ``parallelism.recompute`` (``none`` when it states none)."""
    return str((raw.get("parallelism") or {}).get("recompute", "none"))


#: How a plan's header names the strategy kind of a plan that cannot recompute.
_KIND_WORDS = {"per_layer": "the per-layer kind", "replicated_pipeline": "the replicated_pipeline kind (DAPPLE's plans)"}


def dropped_recompute_notes(raw: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The header lines saying the scenario's recompute, and for a per_layer plan its ZeRO stage, were
    dropped for ``plan`` (a raw scenario mapping a planner returns); none when the scenario states
    neither or the plan keeps them.
    A plan must never change what the user asked for without a word."""
    kind = (plan.get("strategy") or {}).get("kind", "spmd")
    what = _KIND_WORDS.get(kind, f"strategy kind {kind}")
    notes = []
    asked = stated_recompute(raw)
    if asked != "none" and stated_recompute(plan) != asked:
        notes.append(f"{what} does not model recompute; the scenario's recompute: {asked} was dropped for this plan")
    zero = int((raw.get("parallelism") or {}).get("zero_stage", 0))
    if kind == "per_layer" and zero != 0 and "zero_stage" not in (plan.get("parallelism") or {}):
        notes.append(f"{what} does not shard model state (ZeRO); the scenario's zero_stage: {zero} was dropped "
                     "for this plan")
    return notes


def per_layer_pricer(raw: dict[str, Any]):
    """``(scenario, pricer)`` for the per-layer planners (PaSE, DeepPool): the user's scenario with its
    strategy replaced by ``per_layer``, and the kind's layer and reshard pricer over it
    (simulator/strategies/per_layer/cost.py); see :func:`with_per_layer`."""
    from simulator.scenario import build_scenario
    from simulator.strategies.per_layer.cost import pricer

    probe = with_per_layer(raw, {"kind": "per_layer"})
    scenario = build_scenario(probe)
    return scenario, pricer(scenario)


@dataclass(frozen=True)
class Evaluation:
    """One simulated plan: ``step_time_s`` (None when it cannot run, with ``reason``)."""

    raw: dict[str, Any]
    step_time_s: float | None
    samples_per_s: float | None
    fits: bool
    reason: str | None


class Oracle:
    """Simulates plans and counts them."""

    def __init__(self) -> None:
        self.simulated = 0

    def evaluate(self, raw: dict[str, Any]) -> Evaluation:
        from simulator.scenario import build_scenario
        from simulator.simulate import simulate

        self.simulated += 1
        try:
            scenario = build_scenario(raw)
            result = simulate(scenario, run_if_oom=False)
        except ConfigError as exc:
            return Evaluation(raw, None, None, False, str(exc))
        if not result.fits:
            return Evaluation(raw, None, None, False, result.infeasible_reason)
        return Evaluation(raw, result.step_time_s, result.samples_per_step / result.step_time_s, True, None)
