"""Framework constants fitted on the fit half, one per (framework, accelerator, precision).

What a framework adds to the hardware's kernels is not in any microbenchmark: its kernel choice
and fusion (Transformer Engine, torch.compile, FlashAttention version), host overheads, the clock a
power cap allows. It is modelled as one factor on the accelerator's GEMM efficiency curve
(``gemm_scale``, each point times the factor, at most 1) and, where fitted, the kernel launch
overhead, and, for the sets whose grid names it, a factor on the fused attention kernel
(``attention_scale``: the accelerator's ``attention`` efficiency levels, or its
``attention_efficiency_factor`` where it has no fused-kernel spec, times the factor, at most 1),
for each group ``framework|accelerator|precision`` that has at least
:data:`MIN_FIT_CASES` fit-half rows. Groups with fewer keep the catalog constants (reported as
*catalog*). The factor is the one that makes the fit half's median simulated/measured ratio 1
(bisection on the log of the factor; the rate rises monotonically with it); with a grid (launch
overhead, intra-node latency, attention factor), the grid value with the smallest fit-half error wins
(median |error|, or mean |log error| for the sets that ask for it: the attention factor is pinned by
the long-sequence minority of rows, which a median ignores).

Why an attention factor: the kernel microbenchmark (FlashAttention-2 paper Fig 7 on H100, the
``attention`` spec) is the kernel at its best; the framework may run another kernel (Triton
FlashAttention, FlashAttention-1, SDPA's cuDNN or FA2 backend) or add work around it (ring-attention
merges under context parallelism). The end-to-end rows show it: on H100 llm-foundry's and torchtitan's
sequences of 16K-256K tokens, where attention is 45-90% of the simulated step, imply a fused attention
rate of 0.51-0.60 of the FA2-paper kernel whatever the model (760M-13B, head size 80 or 128).

Written by ``python -m validation.modern --fit --write`` to ``validation/profiles/modern-<set>.yaml``
with ``fitted_on`` naming the CSV and the rows; never edited by hand.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from simulator.cost.framework import EFFICIENCY_FACTORS, efficiency_with_factors, scaled_efficiency_block
from validation.layout_ranking import _catalog_yaml, profiled_node
from validation.modern.case import CaseOutcome, ModernCase, outcome

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
MIN_FIT_CASES = 3
SCALE_BOUNDS = (0.15, 1.6)
BISECTION_STEPS = 8


def profile_path(case_set: str) -> Path:
    return PROFILES / f"modern-{case_set}.yaml"


def load_groups(case_set: str) -> dict[str, dict[str, Any]]:
    """The fitted groups of a set's profile ({} when none was written)."""
    path = profile_path(case_set)
    if not path.exists():
        return {}
    return (yaml.safe_load(path.read_text()) or {}).get("groups", {}) or {}


def scaled_efficiency(accelerator: str, gemm_scale: float, launch_us: float | None,
                      attention_scale: float | None = None, host_dispatch_us: float | None = None,
                      gemm_tilt: float | None = None, gemm_ceiling: float | None = None) -> dict[str, Any]:
    """The catalog accelerator's efficiency block with a profile's constants
    (simulator/cost/framework.py ``scaled_efficiency_block``: the one definition ``training.framework``
    uses too)."""
    return scaled_efficiency_block(_catalog_yaml("accelerators", accelerator)["efficiency"], gemm_scale, launch_us,
                                   attention_scale, host_dispatch_us, gemm_tilt, gemm_ceiling)


def with_constants(case: ModernCase, constants: dict[str, Any] | None) -> dict[str, Any]:
    """The case's scenario on its node with a profile entry's constants (``gemm_scale``,
    ``kernel_launch_overhead_us``, ``intra_node_latency_us``, ``attention_scale``,
    ``host_dispatch_us_per_kernel``, ``sync_jitter``); a node given as {base, overrides}
    becomes a plain mapping either way."""
    node = case.scenario["cluster"]["node"]
    if not constants and not isinstance(node, dict):
        # a copy: a caller that edits the mapping must not edit the case (tests/test_nemo_moe_audit.py set row 52's
        # parallelism in place and the catalog-only nemo check run after it in the same process read pp 1, ep 16)
        return copy.deepcopy(case.scenario)
    constants = constants or {}
    raw = copy.deepcopy(case.scenario)
    base, overrides = (node["base"], dict(node["overrides"])) if isinstance(node, dict) else (node, {})
    eff = None
    if any(constants.get(k) is not None for k in (*EFFICIENCY_FACTORS, "sync_jitter", "input_us_per_sample",
                                                   "moe_layer_fixed_us", "conv_sm_cycles_per_byte")):
        accelerator = _catalog_yaml("nodes", base)["accelerator"]  # sync_jitter: the wait for the slowest rank
        eff = efficiency_with_factors(_catalog_yaml("accelerators", accelerator)["efficiency"], constants)
    if constants.get("intra_node_latency_us") is not None:
        overrides["intra_node"] = {"latency_us": constants["intra_node_latency_us"]}
    raw["cluster"]["node"] = profiled_node(base, eff, overrides or None)
    return raw


def resolved_scenario(case: ModernCase, groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The scenario a report simulates: with the group's fitted constants where there are any."""
    return with_constants(case, groups.get(case.profile_group))


def _median_log_error(outcomes: list[CaseOutcome]) -> float:
    logs = [math.log1p(o.relative_error) for o in outcomes if o.relative_error is not None]
    return statistics.median(logs) if logs else 0.0


def _mean_abs_log_error(outcomes: list[CaseOutcome]) -> float:
    logs = [abs(math.log1p(o.relative_error)) for o in outcomes if o.relative_error is not None]
    return statistics.fmean(logs) if logs else math.inf


def _median_abs_error(outcomes: list[CaseOutcome]) -> float:
    errs = [abs(o.relative_error) for o in outcomes if o.relative_error is not None]
    return statistics.median(errs) if errs else math.inf


def _mean_set_median_abs_error(outcomes: list[CaseOutcome]) -> float:
    """The mean over the case sets of each set's median |error| (sets sharing one profile weigh alike,
    whatever their row counts)."""
    sets = sorted({o.case.case_set for o in outcomes})
    return statistics.fmean(_median_abs_error([o for o in outcomes if o.case.case_set == s]) for s in sets)


CRITERIA = {"median": ("fit_median_abs_error", _median_abs_error),
            "mean_log": ("fit_mean_abs_log_error", _mean_abs_log_error),
            "set_median": ("fit_mean_set_median_abs_error", _mean_set_median_abs_error)}


def fit_group(cases: list[ModernCase], simulate_many: Callable[[list[dict]], list[dict]],
              grid: tuple[dict[str, float], ...] = ({},), criterion: str = "median") -> dict[str, Any]:
    """For each grid point (fixed launch overhead / intra-node latency / attention factor), the GEMM
    factor that centres the fit cases' errors; the grid point with the smallest fit-half error wins:
    median |error| (``criterion="median"``), mean |log error| (``"mean_log"``) or the mean of each
    case set's median |error| (``"set_median"``: a profile fitted on the fit halves of several sets)."""
    best: dict[str, Any] | None = None
    for point in grid:
        lo, hi = (math.log(b) for b in SCALE_BOUNDS)
        for _ in range(BISECTION_STEPS):
            mid = (lo + hi) / 2
            results = simulate_many([with_constants(c, {**point, "gemm_scale": math.exp(mid)}) for c in cases])
            outcomes = [outcome(c, r) for c, r in zip(cases, results, strict=True)]
            if _median_log_error(outcomes) > 0:  # simulated too fast: lower the factor
                hi = mid
            else:
                lo = mid
        candidate = {"gemm_scale": round(math.exp((lo + hi) / 2), 4), **point}
        results = simulate_many([with_constants(c, candidate) for c in cases])
        fitted = [outcome(c, r) for c, r in zip(cases, results, strict=True)]
        candidate.update({"fit_median_abs_error": round(_median_abs_error(fitted), 4), "fit_cases": len(cases)})
        key, measure = CRITERIA[criterion]
        candidate[key] = round(measure(fitted), 4)
        if best is None or candidate[key] < best[key]:
            best = candidate
    if best is None:
        raise ValueError("fit_group needs a non-empty grid")
    return best


#: An attention-only group (``ModernSet.attention_groups``) needs this many fit rows: it fits one constant.
MIN_ATTENTION_FIT_CASES = 2
ATTENTION_SCALE_BOUNDS = (0.1, 1.0)


def fit_attention_only(cases: list[ModernCase], simulate_many: Callable[[list[dict]], list[dict]]) -> dict[str, Any]:
    """One factor on the fused attention kernel (``attention_scale``), the GEMM curve left as the
    catalog's microbenchmark fit: the factor that makes the fit cases' median log error 0 (bisection;
    the rate rises monotonically with it). For an accelerator whose attention kernel no row measured
    (the catalog prices it from the GEMM curve, *assumed*) and whose framework ran one configuration
    in BF16 and FP8: the precisions change the GEMMs only, so the rows together pin the attention."""
    lo, hi = (math.log(b) for b in ATTENTION_SCALE_BOUNDS)
    for _ in range(BISECTION_STEPS + 2):
        mid = (lo + hi) / 2
        results = simulate_many([with_constants(c, {"attention_scale": math.exp(mid)}) for c in cases])
        if _median_log_error([outcome(c, r) for c, r in zip(cases, results, strict=True)]) > 0:
            hi = mid
        else:
            lo = mid
    entry: dict[str, Any] = {"attention_scale": round(math.exp((lo + hi) / 2), 4)}
    results = simulate_many([with_constants(c, entry) for c in cases])
    fitted = [outcome(c, r) for c, r in zip(cases, results, strict=True)]
    entry.update({"fit_median_abs_error": round(_median_abs_error(fitted), 4), "fit_cases": len(cases)})
    return entry


#: Bounds of the ``sync_jitter`` sigma a jitter-only group fits (simulator/cost/jitter.py).
JITTER_BOUNDS = (0.0, 0.5)


def multi_gpu(case: ModernCase) -> bool:
    """Whether the case runs on more than one GPU (the rows a synchronisation constant is seen in)."""
    return int(case.scenario["cluster"]["num_gpus"]) > 1


def _fit_one_constant(cases: list[ModernCase], simulate_many: Callable[[list[dict]], list[dict]], name: str,
                      bounds: tuple[float, float], steps: int, digits: int) -> dict[str, Any]:
    """Bisect one constant ``name`` within ``bounds`` so the cases' median log error is 0 (the rate falls
    monotonically with it), ``bounds[0]`` where the cases are too slow already; the entry carries the value
    rounded to ``digits`` and its fit error. The GEMM curve stays the catalog's."""
    def median_log(value: float) -> float:
        results = simulate_many([with_constants(c, {name: value}) for c in cases])
        return _median_log_error([outcome(c, r) for c, r in zip(cases, results, strict=True)])

    lo, hi = bounds
    if median_log(lo) <= 0:
        hi = lo
    for _ in range(steps if hi > lo else 0):
        mid = (lo + hi) / 2
        if median_log(mid) > 0:  # still too fast: more of the constant
            lo = mid
        else:
            hi = mid
    entry: dict[str, Any] = {name: round((lo + hi) / 2, digits)}
    results = simulate_many([with_constants(c, entry) for c in cases])
    fitted = [outcome(c, r) for c, r in zip(cases, results, strict=True)]
    entry.update({"fit_median_abs_error": round(_median_abs_error(fitted), 4), "fit_cases": len(cases)})
    return entry


def fit_jitter_only(cases: list[ModernCase], simulate_many: Callable[[list[dict]], list[dict]]) -> dict[str, Any]:
    """One ``sync_jitter`` sigma, the GEMM curve left as the catalog's: the sigma that makes the median log
    error of the multi-GPU ``cases`` 0 (bisection; the rate falls monotonically with it), 0 where they are
    too slow already. For a group whose kernel constants another calibration fits on its one-GPU rows
    (``ModernSet.fit_elsewhere``): its multi-GPU rows then say only how long a step waits for its slowest
    rank, which no kernel constant changes."""
    return _fit_one_constant(cases, simulate_many, "sync_jitter", JITTER_BOUNDS, BISECTION_STEPS + 2, 4)


def fit_input_only(cases: list[ModernCase], simulate_many: Callable[[list[dict]], list[dict]]) -> dict[str, Any]:
    """One ``input_us_per_sample`` (the framework's host time per sample, beside the GPU's step: a step takes at
    least samples per rank x it; simulator/strategies/spmd/plan.py), the GEMM curve left as the catalog's: the
    time that makes the fit cases' median log error 0 (bisection from 0 to twice the slowest row's time per
    sample; the rate falls monotonically with it), 0 where the cases are too slow already. For a group whose
    rows a host-side bound sets (Lambda's fp16 runs, validation/modern/cnn.py): the GPU's rate is not what
    they measure, so no kernel constant is fitted on them."""
    bounds = (0.0, 2e6 / min(c.measured_rate_per_gpu for c in cases))
    return _fit_one_constant(cases, simulate_many, "input_us_per_sample", bounds, BISECTION_STEPS + 6, 2)


#: Bounds of the SM cycles per convolution byte a conv-SM-only group fits (simulator/cost/compute.py): 0 to 4 SM
#: cycles per byte (Lambda's fp16 groups fit 0.3-0.5; 4 would be an SM moving a quarter of a byte per clock).
CONV_SM_BOUNDS = (0.0, 4.0)


def fit_conv_sm_only(cases: list[ModernCase], simulate_many: Callable[[list[dict]], list[dict]]) -> dict[str, Any]:
    """One ``conv_sm_cycles_per_byte`` (work the framework runs beside each convolution pass at the SMs' instruction
    rate, simulator/cost/compute.py), the GEMM curve left as the catalog's: the value that makes the fit cases'
    median log error 0 (bisection; the rate falls monotonically with it), 0 where the cases are too slow already.
    For a group whose rows run slower than the catalog's kernels by a time the SMs' count and clock set (Lambda's
    fp16 runs, validation/modern/cnn.py): counted in SM cycles, the constant carries to a part with other SMs."""
    return _fit_one_constant(cases, simulate_many, "conv_sm_cycles_per_byte", CONV_SM_BOUNDS, BISECTION_STEPS + 6, 4)


def write_profile(case_set: str, csv_name: str, source: str, groups: dict[str, dict[str, Any]]) -> Path:
    path = profile_path(case_set)
    doc = {"name": f"modern-{case_set}", "source": source, "groups": groups}
    header = ("# Written by `python -m validation.modern --fit --write`; do not edit by hand.\n"
              f"# Fitted on the fit half of {csv_name} only (md5 of the row key even; validation/modern/case.py);\n"
              "# the held-out half is what tests/test_modern_validation.py checks.\n")
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=110))
    return path
