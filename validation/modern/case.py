"""One published end-to-end training row as a simulator case, the fit/held-out split, and the errors.

A row becomes either a :class:`ModernCase` (a scenario that reproduces it and the measured rate)
or an :class:`Unrepresentable` (the reason it cannot be simulated: a model or a feature the
simulator lacks, a layout the source does not give). Nothing is dropped silently: every CSV row
is one or the other. A case may be *set aside* (``ModernCase.set_aside``: the reason it is judged
inconsistent with another source for the same GPU, model and precision): it is simulated and listed
with its error, but neither fitted on nor counted in the set's figures.

**What is compared**: tokens per second per GPU (images per second per GPU for the CNN sets,
``ModernCase.rate``). Where a source gives only model TFLOP/s per GPU
(NeMo's long-context table) or MFU (some fms-fsdp rows), the measured rate is converted with the
*simulated* model FLOPs per token (``measured_tflops``): both count the GEMMs and the full
(uncausal) attention score and context products (Korthikanti 2022 Eq. 2 for GPT; per op otherwise),
as NeMo's and torchtitan's FLOP counters do. Where a source uses its own FLOP formula (the
FlashAttention-2 paper) the mapper converts with that formula instead; where a source counts only
the causal half of the attention core (ml-engineering's Llama-3.1-8B step: "model FLOPs with causal
attention counted"), the mapper gives the FLOPs per token its count leaves out
(``uncounted_flops_per_token``) and the conversion takes them off the simulated count.

**The split** (as validation/layout_ranking.py): a case is *held out* when the md5 of its key is
odd, in the *fit* half when even. The key is the run's configuration without the software release
(model, GPUs, layout, batch, precision and settings), so repeated measurements of one configuration
across releases fall in the same half. A row made representable after its set's profiles were fitted
(``ModernCase.added_after_fit``: the LoRA rows of the NeMo and other sets) is held out whatever its key's
half: it was never fitted on, and the fit stays the one the profiles record.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field
from typing import Any


def is_heldout(key: str) -> bool:
    """Odd md5 of the key = held-out, even = fit."""
    return int(hashlib.md5(key.encode()).hexdigest(), 16) % 2 == 1


@dataclass(frozen=True)
class ModernCase:
    case_set: str
    row: int                      # 0-based data row of the CSV
    label: str                    # readable: model, GPUs, layout, precision
    key: str                      # split key (configuration, no release)
    scenario: dict[str, Any]      # raw scenario mapping on the catalog node (profiles applied later)
    precision: str                # "bf16" | "fp8" (as reported apart)
    accelerator: str              # the group a framework profile is fitted per: catalog accelerator name
    profile_group: str            # framework|accelerator|precision: the fitted constant this case uses
    measured_rate_per_gpu: float | None = None  # in the unit of ``rate``, per GPU
    measured_tflops: float | None = None   # model TFLOP/s per GPU when tokens/s are not given
    notes: str = ""
    rate: str = "tokens_per_s"    # the result field compared: tokens/s (LLM sets), samples_per_s (images/s, CNN sets)
    set_aside: str = ""           # why the row is judged inconsistent with another source: simulated and listed
                                  # with its error, not counted in the set's figures nor fitted on (HELPER rules)
    uncounted_flops_per_token: float = 0.0  # model FLOPs per token the source's ``measured_tflops`` count leaves
                                  # out that the simulator's includes (the causal half of the attention core)
    assumed: str = ""             # what the row's scenario takes that its source does not state (the EfficientNet
                                  # rows' batch and image size: validation/modern/cnn.py), empty where nothing is
    derived_why: str = ""         # why the row is on its set's "derived parts" line (a board, or a part's precision,
                                  # no row of the set was fitted on: registry.derived_report), empty for a set's case
    added_after_fit: str = ""     # why the row is held out whatever its key's half: made representable after the set's
                                  # profiles were fitted (the LoRA rows), so never fitted on; empty for every other row

    @property
    def heldout(self) -> bool:
        """Odd md5 of the key (module docstring), or a row added after the fit (``added_after_fit``)."""
        return is_heldout(self.key) or bool(self.added_after_fit)


@dataclass(frozen=True)
class Unrepresentable:
    case_set: str
    row: int
    label: str
    reason: str


@dataclass(frozen=True)
class CaseOutcome:
    case: ModernCase
    simulated_rate_per_gpu: float | None
    measured_rate_per_gpu: float | None
    fits: bool
    reason: str | None = None

    @property
    def relative_error(self) -> float | None:
        sim, meas = self.simulated_rate_per_gpu, self.measured_rate_per_gpu
        if not sim or not meas:
            return None
        return sim / meas - 1.0


def outcome(case: ModernCase, result: dict[str, Any]) -> CaseOutcome:
    """Compare one simulated result (``simulate_point(..., run_if_oom=True)``) with the row."""
    n = case.scenario["cluster"]["num_gpus"]
    tokens = result.get(case.rate)
    if not tokens:
        return CaseOutcome(case, None, case.measured_rate_per_gpu, False,
                           result.get("infeasible_reason") or result.get("error") or "no step time")
    measured = case.measured_rate_per_gpu
    if measured is None and case.measured_tflops is not None:
        flops_per_token = result["model_tflops_per_gpu"] * 1e12 * n / tokens - case.uncounted_flops_per_token
        measured = case.measured_tflops * 1e12 / flops_per_token
    return CaseOutcome(case, tokens / n, measured, bool(result.get("fits")), result.get("infeasible_reason"))


@dataclass
class Summary:
    """Errors of a group of outcomes (one set, one half, one precision or accelerator)."""

    label: str
    count: int
    median_abs_error: float | None
    max_abs_error: float | None
    median_error: float | None
    predicted_oom: int = 0
    failed: list[str] = field(default_factory=list)

    def met(self, median_target: float, max_target: float | None) -> bool:
        """Within the targets and no row predicted out of memory: every published row ran, so a
        predicted OOM is a miss whatever its time error (the plan ``search`` would have pruned)."""
        if self.median_abs_error is None or self.predicted_oom:
            return False
        return self.median_abs_error <= median_target and (max_target is None or self.max_abs_error <= max_target)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "cases": self.count, "median_abs_error": self.median_abs_error,
                "max_abs_error": self.max_abs_error, "median_error": self.median_error,
                "predicted_oom": self.predicted_oom, "not_simulated": self.failed}


def summarize(label: str, outcomes: list[CaseOutcome]) -> Summary:
    errors = [o.relative_error for o in outcomes if o.relative_error is not None]
    failed = [f"{o.case.label}: {o.reason}" for o in outcomes if o.relative_error is None]
    oom = sum(1 for o in outcomes if o.relative_error is not None and not o.fits)
    if not errors:
        return Summary(label, 0, None, None, None, oom, failed)
    absolute = [abs(e) for e in errors]
    return Summary(label, len(errors), statistics.median(absolute), max(absolute), statistics.median(errors),
                   oom, failed)


def log_error(outcome_: CaseOutcome) -> float | None:
    err = outcome_.relative_error
    return None if err is None else math.log1p(err)
