"""Statistical efficiency as inputs: steps to a target loss, hence time to target.

The simulator predicts time per step, not accuracy. How many steps a run needs to reach a target
depends on the global batch, on how stale the gradients are and on how rarely replicas
synchronise; these are the user's (or a paper's) numbers, entered in a scenario's optional
``convergence:`` block, and every result that uses them says so (``convergence_source``).

Models (each factor documented with its source; they are multiplied, an assumption of independence):

- **Global batch** B (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training",
  arXiv:1812.06162, Sec. 2.2 Eq. 2.11 and Sec. 3): S(B) = S_min · (1 + B_noise / B). S_min is the
  number of steps at an infinite batch; B_noise the gradient noise scale (≈ the critical batch
  B_crit). Below B_noise, doubling the batch halves the steps (perfect scaling); above it the steps
  approach S_min (diminishing returns), the shape Shallue et al. 2019 ("Measuring the Effects of
  Data Parallelism on Neural Network Training", JMLR 20(112), Fig. 1) measured for every workload.
  B counts samples (sequences) or tokens (``batch.unit``), as the source counted it.
  Without a batch model, ``steps_to_target`` is a fixed count.
- **Staleness** τ (steps of delay between the weights a gradient was computed on and the weights it
  updates): S(τ) = S(0) · (1 + c_τ · τ). Asynchronous SGD's convergence bound gains a term linear in
  the delay (Lian et al. 2015, NeurIPS, Theorem 1; Stich & Karimireddy 2020, JMLR 21(237), Theorem 1:
  O(σ²/ε² + τ/ε) iterations); Dai et al. 2019 (ICLR, "Toward Understanding the Impact of Staleness
  in Distributed Machine Learning", Fig. 1) measured the steps to target growing with the delay.
  c_τ (``staleness.per_step_of_delay``) is the source's slope. τ comes from the strategy kind
  (0 for synchronous kinds; a kind's ``convergence_inputs``).
- **Local steps** H (replicas take H inner steps between synchronisations; local SGD, DiLoCo):
  S(H) = S(1) · (1 + c_H · (H − 1)) inner steps. Local SGD's bound gains a term growing with H
  (Stich 2019, ICLR, "Local SGD Converges Fast and Communicates Little", Theorem 2.2; Woodworth et
  al. 2020, NeurIPS); DiLoCo (Douillard et al. 2023, arXiv:2311.08105, Table 2/Fig. 3) reports
  small losses up to H = 500 with its outer Nesterov step. c_H (``local_steps.per_extra_local_step``)
  is the source's number; 0 states "no loss".

Presets (``preset:``) are named parameter sets in ``convergence_presets.yaml`` with their source;
values given in the block override a preset's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_specs.yaml_io import read_yaml
from simulator.errors import ConfigError

PRESETS_FILE = Path(__file__).with_name("convergence_presets.yaml")
NOT_A_PREDICTION = "steps to target are the convergence block's numbers (user's or a paper's), not a prediction"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchScaling(_Strict):
    """S(B) = s_min · (1 + b_noise / B) (McCandlish et al. 2018 Eq. 2.11)."""

    s_min: float = Field(gt=0, description="steps to target at an infinite batch")
    b_noise: float = Field(ge=0, description="gradient noise scale (~ critical batch), in `unit`")
    unit: Literal["samples", "tokens"] = "samples"


class StalenessPenalty(_Strict):
    per_step_of_delay: float = Field(default=0.0, ge=0, description="c_tau: S(tau) = S(0)·(1 + c_tau·tau)")


class LocalStepsPenalty(_Strict):
    per_extra_local_step: float = Field(default=0.0, ge=0, description="c_H: S(H) = S(1)·(1 + c_H·(H - 1))")


class ConvergenceSpec(_Strict):
    """The scenario's ``convergence:`` block (see the module docstring)."""

    source: str | None = Field(default=None, description="whose numbers these are (paper, run, 'assumed')")
    preset: str | None = Field(default=None, description="a named parameter set of convergence_presets.yaml")
    steps_to_target: float | None = Field(default=None, gt=0, description="fixed steps (no batch model)")
    batch: BatchScaling | None = None
    staleness: StalenessPenalty = StalenessPenalty()
    local_steps: LocalStepsPenalty = LocalStepsPenalty()

    @model_validator(mode="after")
    def _one_base(self):
        if self.preset is None:
            if self.batch is None and self.steps_to_target is None:
                raise ValueError("give batch (s_min, b_noise), steps_to_target or a preset")
            if self.batch is not None and self.steps_to_target is not None:
                raise ValueError("give batch or steps_to_target, not both")
            if not self.source:
                raise ValueError("source is required: whose numbers these are (a paper, a run, or 'assumed')")
        return self


def load_presets() -> dict[str, dict[str, Any]]:
    data = read_yaml(PRESETS_FILE, "convergence.preset")
    return dict(data or {})


def resolve(spec: ConvergenceSpec) -> ConvergenceSpec:
    """The block with its preset's values filled in (values given in the block win)."""
    if spec.preset is None:
        return spec
    presets = load_presets()
    if spec.preset not in presets:
        raise ConfigError("convergence.preset", f"unknown preset {spec.preset!r}; known: {', '.join(sorted(presets))}")
    merged = {**presets[spec.preset], **spec.model_dump(exclude_unset=True)}
    merged.pop("preset", None)
    merged.pop("description", None)
    try:
        return ConvergenceSpec.model_validate(merged)
    except ValueError as exc:
        raise ConfigError("convergence", str(exc)) from None


def steps_to_target(spec: ConvergenceSpec, global_batch_samples: float, seq_length: int,
                    staleness_steps: float = 0.0, local_steps: int = 1) -> float:
    """Steps (inner steps for local SGD) to the target under the block's models (module docstring)."""
    spec = resolve(spec)
    if spec.batch is not None:
        batch = global_batch_samples * (seq_length if spec.batch.unit == "tokens" else 1)
        steps = spec.batch.s_min * (1.0 + spec.batch.b_noise / batch)
    else:
        steps = float(spec.steps_to_target)
    steps *= 1.0 + spec.staleness.per_step_of_delay * staleness_steps
    steps *= 1.0 + spec.local_steps.per_extra_local_step * (local_steps - 1)
    return steps


def convergence_results(spec: ConvergenceSpec, step_time_s: float | None, global_batch_samples: float,
                        seq_length: int, staleness_steps: float = 0.0, local_steps: int = 1) -> dict[str, Any]:
    """The result keys: steps_to_target, time_to_target_s, and where the numbers come from."""
    resolved = resolve(spec)
    steps = steps_to_target(resolved, global_batch_samples, seq_length, staleness_steps, local_steps)
    return {
        "steps_to_target": steps,
        "time_to_target_s": steps * step_time_s if step_time_s else None,
        "convergence_source": f"{resolved.source}; {NOT_A_PREDICTION}",
        "convergence_staleness_steps": staleness_steps,
        "convergence_local_steps": local_steps,
    }
