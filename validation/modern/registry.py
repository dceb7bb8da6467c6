"""The modern validation sets by name, how each is simulated, fitted and reported.

Targets (issue 23): framework sets median |error| <= 10% and every row <= 25% on the held-out
half, BF16 and FP8 reported apart; vTrain median |error| <= 8% single-node, <= 12% multi-node. A set
meets them only when its held-out rows whose simulated scenario no fit row has meet them too
(validation/modern/new_scenarios.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from validation.modern import cnn, llmfoundry, nemo, other, torchtitan, vtrain
from validation.modern.case import CaseOutcome, ModernCase, Summary, Unrepresentable, outcome, summarize
from validation.modern.profiles import (
    MIN_ATTENTION_FIT_CASES,
    fit_attention_only,
    fit_conv_sm_only,
    fit_group,
    fit_jitter_only,
    load_groups,
    multi_gpu,
    resolved_scenario,
    write_profile,
)

Builder = Callable[[], tuple[list[ModernCase], list[Unrepresentable]]]


@dataclass(frozen=True)
class ModernSet:
    name: str
    csv: str
    source: str
    build: Builder
    median_target: float
    max_target: float | None
    grid: tuple[dict[str, float], ...] = ({},)
    profile: str | None = None   # profile file name (modern-<profile>.yaml); default: the set's name
    fitted: bool = True          # False: its fit half is not used to fit (the profile comes from another set)
    criterion: str = "median"    # how a grid point is chosen: fit-half "median" |error|, "mean_log" |log error|
    #                              or "set_median" (the mean of the member sets' medians; profiles.CRITERIA)
    attention_groups: tuple[str, ...] = ()  # groups fitted on the attention factor alone (profiles.fit_attention_only)
    fit_elsewhere: tuple[str, ...] = ()  # tags of groups whose one-GPU fit rows fit another calibration: no GEMM
    #                                      factor; their multi-GPU fit rows fit sync_jitter alone (profiles.fit_jitter_only)
    conv_sm_precisions: tuple[str, ...] = ()  # groups of these precisions fit the SM cycles per convolution byte
    #                                         alone (profiles.fit_conv_sm_only: Lambda's fp16 rows, validation/modern/cnn.py)
    derived: Callable[[], list[ModernCase]] | None = None  # rows on boards whose efficiencies are derived by rule
    #                                         (never fitted on, not in the set's figures): :func:`derived_report`
    assumed: Callable[[], dict[str, Any]] | None = None  # what the set's rows assume that their source does not state
    #                                         (cnn.assumed_statement): :func:`report`'s ``assumed`` block

    @property
    def profile_name(self) -> str:
        return self.profile or self.name


FRAMEWORK_MEDIAN, FRAMEWORK_MAX = 0.10, 0.25
#: Megatron-DeepSpeed runs eager PyTorch: the host issues each kernel and collective (a floor on a
#: layer's passes, simulator/cost/host_floor.py) that the single-node rows (small models, micro-batch
#: 1-8, up to tp 8) pin down, and its large GEMMs gain more over its small ones than the catalog A100
#: curve says (a tilt), up to a ceiling at a fraction of the A100 microbenchmark's best matmul that
#: the multi-node rows' large GEMMs pin down; grid of (host time per kernel, ceiling) at tilt 0.1, the
#: catalog launch overhead and a 15 us intra-node latency (validation/modern/vtrain.py says what else
#: was tried on the fit halves).
VTRAIN_GRID = tuple({"host_dispatch_us_per_kernel": host, "gemm_tilt": 0.1,
                     "gemm_ceiling": round(share * vtrain.a100_matmul_ceiling(), 4), "intra_node_latency_us": 15.0}
                    for host in (75.0, 80.0) for share in (0.9, 1.0))

#: The fused attention kernel a framework runs against the FlashAttention-2 paper's kernel (the
#: ``attention`` spec): a factor on its efficiency per framework|accelerator|precision, chosen on the
#: fit half by mean |log error| (validation/modern/profiles.py says why).
ATTENTION_GRID = tuple({"attention_scale": scale} for scale in (1.0, 0.85, 0.7, 0.6, 0.5, 0.4))

#: DLE's multi-GPU rows keep 0.82-0.97x of their one-GPU rate per GPU while the simulated step hardly
#: changes (an all-reduce of 25-49 M gradients overlapped with the backward): each step waits for the
#: slowest of N ranks (simulator/cost/jitter.py; Hoefler, Schneider and Lumsdaine, SC'10), ranks whose
#: eager PyTorch steps and input pipelines vary. ``sync_jitter`` sigma per framework|GPU|precision, chosen
#: on the fit half beside the GEMM factor (a group of one-GPU rows only cannot tell it: it keeps 0).
JITTER_GRID = tuple({"sync_jitter": sigma} for sigma in (0.0, 0.03, 0.06, 0.09, 0.12, 0.15))

#: Megatron-Core's MoE layer costs a fixed time per layer and micro-batch beyond what the layer graph prices
#: (validation/modern/nemo.py says how the rows show it): ``moe_layer_fixed_us`` on a grid, chosen on the fit half
#: by mean |log error| (the median of a set whose fit half is two-thirds dense rows would not see it); 0 to 4 ms
#: in 0.5 ms steps (python -m validation.modern.moe_audit: the rows leave 2.1-3.1 ms over).
NEMO_GRID = tuple({"moe_layer_fixed_us": float(us)} for us in range(0, 4001, 500))

SETS: dict[str, ModernSet] = {s.name: s for s in (
    ModernSet("nemo", "nemo_perf_summary.csv", "NeMo / Megatron-Bridge performance summary, DGX H100",
              nemo.cases, FRAMEWORK_MEDIAN, FRAMEWORK_MAX, NEMO_GRID, criterion="mean_log"),
    ModernSet("torchtitan", "torchtitan_perf.csv", "torchtitan benchmarks (H100, H200, MI300X, A100)",
              torchtitan.cases, FRAMEWORK_MEDIAN, FRAMEWORK_MAX, ATTENTION_GRID, criterion="mean_log",
              attention_groups=torchtitan.ATTENTION_GROUPS),
    ModernSet("llmfoundry", "llmfoundry_throughput.csv", "MosaicML llm-foundry MPT throughput (H100, A100)",
              llmfoundry.cases, FRAMEWORK_MEDIAN, FRAMEWORK_MAX, ATTENTION_GRID, criterion="mean_log"),
    ModernSet("other", "other_llm_training_throughput.csv",
              "NeMo AutoModel, IBM fms-fsdp, DeepSpeed, FlashAttention-2 paper", other.cases,
              FRAMEWORK_MEDIAN, FRAMEWORK_MAX),
    ModernSet("vtrain_single", "vtrain2024_ground_truth_single.csv",
              "vTrain (MICRO 2024) Megatron-DeepSpeed iteration times, one 8-GPU A100 node",
              vtrain.single_cases, 0.08, None, VTRAIN_GRID, profile="vtrain", criterion="set_median"),
    ModernSet("vtrain_multi", "vtrain2024_ground_truth_multi.csv",
              "vTrain (MICRO 2024) Megatron-DeepSpeed iteration times, 64-512 A100s",
              vtrain.multi_cases, 0.12, None, VTRAIN_GRID, profile="vtrain", criterion="set_median"),
    ModernSet("cnn_dle", "cnn_training_throughput_dle.csv",
              "NVIDIA DeepLearningExamples CNN training throughput (ResNet-50 v1.5; A100, V100)",
              cnn.dle_cases, FRAMEWORK_MEDIAN, FRAMEWORK_MAX, JITTER_GRID, fit_elsewhere=cnn.FIT_ELSEWHERE,
              derived=cnn.dle_derived_cases, assumed=cnn.assumed_statement),
    ModernSet("cnn_lambda", "cnn_training_throughput_lambda.csv",
              "Lambda deeplearning-benchmark, DLE PyTorch ResNet-50 (A100, H100, H200)",
              cnn.lambda_cases, FRAMEWORK_MEDIAN, FRAMEWORK_MAX, conv_sm_precisions=("fp16",),
              derived=cnn.lambda_derived_cases),
)}


@cache
def built(name: str) -> tuple[tuple[ModernCase, ...], tuple[Unrepresentable, ...]]:
    cases, skipped = SETS[name].build()
    return tuple(cases), tuple(skipped)


def _simulate(raw: dict[str, Any]) -> dict[str, Any]:
    from simulator.simulate import simulate_point

    result = simulate_point(raw, run_if_oom=True)
    keep = ("tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "fits", "infeasible_reason", "step_time_s")
    return {k: result.get(k) for k in keep}


def simulate_many(raws: list[dict[str, Any]], workers: int | None = 2) -> list[dict[str, Any]]:
    """Simulate scenario mappings in parallel (local processes); a crash becomes a row with the error."""
    from simulator.explore.sweep import parallel_map

    out: list[dict[str, Any]] = [{} for _ in raws]
    chunk = max(1, len(raws) // (max(1, workers or 2) * 4))
    for index, ok, result in parallel_map(_simulate, raws, workers=workers, chunk_size=chunk):
        out[index] = result if ok else {"error": str(result)}
    return out


def evaluate(name: str, half: str = "heldout", workers: int | None = 2,
             overrides: tuple[str, ...] = (), groups: dict[str, dict[str, Any]] | None = None) -> list[CaseOutcome]:
    """Simulate the set's cases of one half ("heldout", "fit" or "all") with its fitted profile (or
    ``groups``: constants not yet written); ``overrides`` (``key.path=value``, as ``clustersim simulate
    --set``) change every case's scenario: what-if figures (e.g. ``parallelism.moe_dispatch=deepep``),
    never a validation result."""
    from simulator.scenario import apply_overrides

    cases = [c for c in built(name)[0]
             if half == "all" or (half == "heldout") == c.heldout]
    groups = load_groups(SETS[name].profile_name) if groups is None else groups
    raws = [resolved_scenario(c, groups) for c in cases]
    if overrides:
        raws = [apply_overrides(raw, list(overrides)) for raw in raws]
    results = simulate_many(raws, workers)
    return [outcome(c, r) for c, r in zip(cases, results, strict=True)]


def catalog_only(name: str, outcomes: list[CaseOutcome], workers: int | None = 2,
                 overrides: tuple[str, ...] = ()) -> list[CaseOutcome]:
    """The same cases with the catalog constants alone: no fitted profile, the framework's settings
    (attention kernel, overlaps, recompute, compile) kept. That is what a user gets for a framework x
    accelerator x precision no profile covers (an unseen run, a Blackwell cluster). Reported beside the
    fitted figures and never a target: nothing is fitted on it, and no catalog constant is tuned to it.
    Cases whose group has no fitted constants are already catalog-only and are not simulated again.
    ``overrides``: the same what-if :func:`evaluate` applied to ``outcomes``."""
    from simulator.scenario import apply_overrides

    groups = load_groups(SETS[name].profile_name)
    redo = [i for i, o in enumerate(outcomes) if o.case.profile_group in groups]
    raws = [resolved_scenario(outcomes[i].case, {}) for i in redo]
    if overrides:
        raws = [apply_overrides(raw, list(overrides)) for raw in raws]
    results = simulate_many(raws, workers)
    out = list(outcomes)
    for i, result in zip(redo, results, strict=True):
        out[i] = outcome(outcomes[i].case, result)
    return out


def user_framework(case: ModernCase) -> str:
    """The ``training.framework`` a user describing the row's run names: its framework where the package
    ships a profile of it (validation/modern/shipped.py), else the default (the catalog constants). A row of a
    group that fits another constant (DLE's EfficientNets, ``ModernSet.fit_elsewhere``) names the same
    framework: the user gets its factors fitted on other networks (the output says they were carried)."""
    from hardware_specs.framework import DEFAULT_FRAMEWORK
    from validation.modern.shipped import FRAMEWORKS

    prefix = case.profile_group.split("|")[0]
    for tag in SETS[case.case_set].fit_elsewhere:  # DLE's EfficientNet rows: the same framework, other networks
        prefix = prefix.removesuffix(tag)
    return next((name for name, (_, p, _) in FRAMEWORKS.items() if p == prefix), DEFAULT_FRAMEWORK)


def user_scenario(case: ModernCase) -> dict[str, Any]:
    """The row as a user writes it: the catalog node (with the row's datasheet overrides) and
    ``training.framework`` naming its framework; no per-row or per-group constants."""
    import copy

    from validation.modern.profiles import with_constants

    raw = copy.deepcopy(with_constants(case, None))
    raw["training"]["framework"] = user_framework(case)
    return raw


@dataclass(frozen=True)
class UserOutcome:
    """A row predicted as a user gets it: the framework's shipped profile entry and how it was chosen."""

    outcome: CaseOutcome
    framework: str
    state: str               # default | calibrated | derived | assumed (simulator/cost/framework.py)
    entry: str               # "<accelerator> <precisions>" of the entry used, or "catalog"


def user_profile(name: str, outcomes: list[CaseOutcome], workers: int | None = 2) -> tuple[list[UserOutcome], int]:
    """The same rows with the profile a user gets by naming the row's framework (``training.framework``),
    and how many had to be simulated again: a row whose shipped entry holds exactly the constants its
    fitted group holds is the same simulation (tests/test_framework_profiles.py checks that bit for bit)."""
    from hardware_specs.framework import FACTOR_KEYS
    from simulator.cost.framework import FrameworkChoice
    from simulator.scenario import load_scenario

    groups = load_groups(SETS[name].profile_name)
    raws = [user_scenario(o.case) for o in outcomes]
    known: dict[str, FrameworkChoice] = {}  # one scenario built per framework x node x precision x recipe x model
    choices: list[FrameworkChoice] = []
    for raw in raws:
        training = raw["training"]
        key = json.dumps([raw["cluster"]["node"], training.get("framework"), training.get("precision"),
                          training.get("fp8_recipe"), training.get("tf32"), raw["model"]], sort_keys=True, default=str)
        if key not in known:
            known[key] = load_scenario(raw).frameworks[0]
        choices.append(known[key])
    redo = []
    for i, (o, choice) in enumerate(zip(outcomes, choices, strict=True)):
        fitted = groups.get(o.case.profile_group) or {}
        fitted_factors = {k: v for k, v in fitted.items() if k in FACTOR_KEYS and v is not None}
        if fitted_factors != choice.factors or _settings_filled(raws[i]):
            redo.append(i)
    results = simulate_many([raws[i] for i in redo], workers)
    fresh = dict(zip(redo, (outcome(outcomes[i].case, r) for i, r in zip(redo, results, strict=True)), strict=True))
    out = []
    for i, (o, choice) in enumerate(zip(outcomes, choices, strict=True)):
        entry = f"{choice.entry.accelerator} {'/'.join(choice.entry.precisions)}" if choice.entry else "catalog"
        out.append(UserOutcome(fresh.get(i, o), choice.name, choice.state, entry))
    return out, len(redo)


def _settings_filled(raw: dict[str, Any]) -> bool:
    """Whether the framework's own settings (its profile's ``fitted_with``) fill a setting the row leaves out,
    e.g. fms-fsdp-compile's H100 ``attention_kernel: fa2`` on an A100 row: a different simulation from the row's."""
    from simulator.cost.framework import with_framework_settings

    return bool(with_framework_settings(raw)[1])


def _summaries(name: str, outcomes: list[CaseOutcome]) -> tuple[Summary, dict[str, list[Summary]]]:
    overall = summarize(name, outcomes)
    by: dict[str, list[Summary]] = {"precision": [], "accelerator": []}
    for attr in by:
        for value in sorted({getattr(o.case, attr) for o in outcomes}):
            by[attr].append(summarize(value, [o for o in outcomes if getattr(o.case, attr) == value]))
    return overall, by


def report(name: str, outcomes: list[CaseOutcome], catalog: list[CaseOutcome] | None = None,
           user: tuple[list[UserOutcome], int] | None = None) -> dict[str, Any]:
    """Overall, per precision and per accelerator summaries, and whether the targets are met; with
    ``catalog`` (:func:`catalog_only`'s outcomes of the same cases) the same summaries with the catalog
    constants alone under ``catalog_only`` (not a target); with ``user`` (:func:`user_profile`'s) the
    summaries of the rows as a user naming their framework gets them, under ``user_profile``, judged
    against the same targets (``met``) and split by framework x accelerator x precision x state. Each block
    also carries ``new_scenarios``: its held-out rows whose simulated scenario no fit row has
    (validation/modern/new_scenarios.py), and ``met`` asks both the held-out figures and these to be within
    the targets (a held-out row that repeats a fit row's scenario is not evidence)."""
    from validation.modern.new_scenarios import fit_twin, new_scenario_block

    spec = SETS[name]
    aside = [o for o in outcomes if o.case.set_aside]
    outcomes = [o for o in outcomes if not o.case.set_aside]   # set-aside rows: listed below, not counted
    overall, by = _summaries(name, outcomes)
    groups = load_groups(spec.profile_name)
    extra: dict[str, Any] = {}
    if catalog is not None:
        kept = [o for o in catalog if not o.case.set_aside]
        c_overall, c_by = _summaries(name, kept)
        extra["catalog_only"] = {
            "overall": c_overall.as_dict(),
            "new_scenarios": new_scenario_block(name, kept, spec.median_target, spec.max_target),
            "by_precision": [s.as_dict() for s in c_by["precision"]],
            "by_accelerator": [s.as_dict() for s in c_by["accelerator"]],
            "resimulated": sum(1 for o in kept if o.case.profile_group in groups),
            "cases": [{"row": o.case.row, "relative_error": o.relative_error} for o in kept],
        }
    if user is not None:
        kept_user = [u for u in user[0] if not u.outcome.case.set_aside]
        u_overall, u_by = _summaries(name, [u.outcome for u in kept_user])
        cells: dict[tuple[str, str, str, str], list[CaseOutcome]] = {}
        for u in kept_user:
            cells.setdefault((u.framework, u.outcome.case.accelerator, u.outcome.case.precision, u.state),
                             []).append(u.outcome)
        u_new = new_scenario_block(name, [u.outcome for u in kept_user], spec.median_target, spec.max_target)
        extra["user_profile"] = {
            "overall": u_overall.as_dict(),
            "new_scenarios": u_new,
            "met": u_overall.met(spec.median_target, spec.max_target) and (u_new is None or u_new["met"]),
            "by_precision": [s.as_dict() for s in u_by["precision"]],
            "by_accelerator": [s.as_dict() for s in u_by["accelerator"]],
            "by_framework": [{"framework": k[0], "accelerator": k[1], "precision": k[2], "state": k[3],
                              **summarize(f"{k[0]} {k[1]} {k[2]}", v).as_dict()} for k, v in sorted(cells.items())],
            "resimulated": user[1],
            "cases": [{"row": u.outcome.case.row, "framework": u.framework, "state": u.state, "entry": u.entry,
                       "relative_error": u.outcome.relative_error, "fits": u.outcome.fits} for u in kept_user],
        }
    if spec.assumed is not None:
        extra["assumed"] = assumed_block(spec, outcomes)
    new = new_scenario_block(name, outcomes, spec.median_target, spec.max_target)
    return {
        "case_set": name, "source": spec.source, "csv": spec.csv,
        "median_target": spec.median_target, "max_target": spec.max_target,
        "overall": overall.as_dict(),
        "new_scenarios": new,
        "by_precision": [s.as_dict() for s in by["precision"]],
        "by_accelerator": [s.as_dict() for s in by["accelerator"]],
        "heldout_met": overall.met(spec.median_target, spec.max_target),
        "met": overall.met(spec.median_target, spec.max_target) and (new is None or new["met"]),
        "unrepresentable": len(built(name)[1]),
        "profile_groups": sorted(groups),
        "catalog_groups": sorted({o.case.profile_group for o in outcomes} - set(groups)),
        "cases": [{"label": o.case.label, "row": o.case.row, "precision": o.case.precision,
                   "accelerator": o.case.accelerator,
                   "attention_kernel": o.case.scenario["training"].get("attention_kernel", "auto"),
                   "measured": o.measured_rate_per_gpu,
                   "simulated": o.simulated_rate_per_gpu, "relative_error": o.relative_error,
                   "fits": o.fits, "reason": o.reason,
                   "repeats_fit_row": fit_twin(o.case) if o.case.heldout else None,
                   **({"assumed": o.case.assumed} if o.case.assumed else {})} for o in outcomes],
        "set_aside": [{"label": o.case.label, "row": o.case.row, "why": o.case.set_aside,
                       "measured": o.measured_rate_per_gpu, "simulated": o.simulated_rate_per_gpu,
                       "relative_error": o.relative_error} for o in aside],
        **extra,
    }


def assumed_block(spec: ModernSet, outcomes: list[CaseOutcome]) -> dict[str, Any]:
    """The set's ``assumed`` block: what its rows take that their source does not state (``spec.assumed``), which of
    the counted rows (``outcomes``, set-aside rows left out) rest on it, each row's assumption, and the figures of
    those rows and of the others apart, so a reader sees how much of the set's figure stands on an assumption."""
    resting = [o for o in outcomes if o.case.assumed]
    others = [o for o in outcomes if not o.case.assumed]
    return {**spec.assumed(),
            "rows": [{"row": o.case.row, "label": o.case.label, "assumed": o.case.assumed,
                      "relative_error": o.relative_error} for o in resting],
            "resting_on_it": summarize("resting on the assumption", resting).as_dict(),
            "the_others": summarize("stated by the source", others).as_dict()}


@cache
def derived_cases(name: str) -> tuple[ModernCase, ...]:
    """The set's rows on boards whose efficiencies are derived by rule (``ModernSet.derived``; none: empty)."""
    build = SETS[name].derived
    return tuple(build()) if build is not None else ()


def evaluate_derived(name: str, workers: int | None = 2) -> tuple[list[CaseOutcome], tuple[list[UserOutcome], int]]:
    """The derived-parts rows, every one (no half: none is fitted on), simulated with the catalog constants
    alone and as a user naming the row's framework gets them (:func:`user_profile`: the shipped entry for the
    row's part and precision, or the one carried over to it, or none)."""
    cases = list(derived_cases(name))
    results = simulate_many([c.scenario for c in cases], workers)
    catalog = [outcome(c, r) for c, r in zip(cases, results, strict=True)]
    return catalog, user_profile(name, catalog, workers)


def derived_report(name: str, catalog: list[CaseOutcome], user: tuple[list[UserOutcome], int]) -> dict[str, Any]:
    """The "derived parts" line of a set: its rows on boards no row of the set was fitted on, whose
    efficiencies come from a sibling part by a stated rule (validation/derive_parts.py) or whose node is new
    (hardware_specs/nodes/), and its rows of a part and precision too few fit rows fitted (Lambda's A100 SXM fp16:
    validation/modern/cnn.py; each case's ``why`` says which), as a user naming the row's framework gets them,
    judged against the set's own
    targets (``met``) and reported apart from its figures; the catalog-only errors of the same rows beside
    (not a target). Set-aside rows are listed with their errors and reasons, not counted."""
    spec = SETS[name]
    kept = [u for u in user[0] if not u.outcome.case.set_aside]
    overall, by = _summaries(name, [u.outcome for u in kept])
    c_overall, c_by = _summaries(name, [o for o in catalog if not o.case.set_aside])
    by_catalog = {o.case.row: o for o in catalog}
    return {
        "overall": overall.as_dict(), "met": overall.met(spec.median_target, spec.max_target),
        "by_precision": [s.as_dict() for s in by["precision"]],
        "by_accelerator": [s.as_dict() for s in by["accelerator"]],
        "resimulated": user[1],
        "catalog_only": {"overall": c_overall.as_dict(), "by_accelerator": [s.as_dict() for s in c_by["accelerator"]]},
        "cases": [{"row": u.outcome.case.row, "label": u.outcome.case.label, "accelerator": u.outcome.case.accelerator,
                   "node": u.outcome.case.scenario["cluster"]["node"] if isinstance(
                       u.outcome.case.scenario["cluster"]["node"], str)
                   else u.outcome.case.scenario["cluster"]["node"]["base"],
                   "framework": u.framework, "state": u.state, "entry": u.entry,
                   "measured": u.outcome.measured_rate_per_gpu, "simulated": u.outcome.simulated_rate_per_gpu,
                   "relative_error": u.outcome.relative_error, "fits": u.outcome.fits,
                   "catalog_relative_error": by_catalog[u.outcome.case.row].relative_error,
                   "why": u.outcome.case.derived_why, "set_aside": u.outcome.case.set_aside,
                   **({"assumed": u.outcome.case.assumed} if u.outcome.case.assumed else {})} for u in user[0]],
    }


#: A group's constants that add time outside the catalog's kernels in a way a ratio of two boards' catalog-only
#: rates does not cancel: the host's input cost per sample, the SM cycles per convolution byte (they scale with
#: each board's own SMs and clock, not as the kernels do).
OUTSIDE_KERNEL_CONSTANTS = ("input_us_per_sample", "conv_sm_cycles_per_byte")


def board_ratio_check(name: str, workers: int | None = 2) -> dict[str, Any]:
    """The derivation rule checked apart from any framework factor: each derived-parts row's measured rate over the
    median measured rate of the set's rows of the same configuration (network, precision, GPU count, framework) on
    its sibling board (cnn.BOARD_SIBLING), against the same ratio simulated with the catalog constants on both
    boards (a factor applied alike to both would cancel). Pairs whose sibling rows run a fitted time outside the
    catalog's kernels (:data:`OUTSIDE_KERNEL_CONSTANTS`, or set aside for it) are not the rule alone: listed as
    skipped with that reason. Not a target (the derived-parts line is): it says which part of a miss is the rule."""
    import statistics

    from validation.modern.cnn import BOARD_SIBLING

    groups = load_groups(SETS[name].profile_name)

    def config(c: ModernCase) -> tuple:
        model = c.scenario["model"]
        return (model if isinstance(model, str) else model["name"], c.precision, c.scenario["cluster"]["num_gpus"],
                c.profile_group.split("|")[0])

    pairs, skipped = [], []
    # a sibling part's rows: the set's, and its own rows on the derived-parts line (Lambda's A100 SXM fp16, which run
    # a constant carried from another part outside the catalog's kernels)
    pool = [*built(name)[0], *(c for c in derived_cases(name) if c.accelerator in set(BOARD_SIBLING.values()))]
    for d in derived_cases(name):
        siblings = [c for c in pool if c.accelerator == BOARD_SIBLING.get(d.accelerator) and config(c) == config(d)]
        if d.set_aside or not siblings:
            continue
        host = [c for c in siblings if c.set_aside or c.derived_why or any(
            (groups.get(c.profile_group) or {}).get(k) for k in OUTSIDE_KERNEL_CONSTANTS)]
        if host:
            skipped.append({"row": d.row, "why": f"the {host[0].accelerator} rows of this configuration run a fitted "
                                                 "time outside the catalog's kernels (or one carried from another part, "
                                                 "or are set aside), which a ratio of catalog constants does not "
                                                 "cancel"})
            continue
        pairs.append((d, siblings))
    results = simulate_many([d.scenario for d, _ in pairs] + [s[0].scenario for _, s in pairs], workers)
    rows = []
    for i, (d, siblings) in enumerate(pairs):
        mine, theirs = results[i].get("samples_per_s"), results[len(pairs) + i].get("samples_per_s")
        measured = d.measured_rate_per_gpu / statistics.median(c.measured_rate_per_gpu for c in siblings)
        simulated = mine / theirs if mine and theirs else None
        rows.append({"row": d.row, "accelerator": d.accelerator, "sibling": siblings[0].accelerator,
                     "precision": d.precision, "gpus": d.scenario["cluster"]["num_gpus"], "sibling_rows": len(siblings),
                     "measured_ratio": measured, "simulated_ratio": simulated,
                     "relative_error": None if simulated is None else simulated / measured - 1})
    errors = [abs(r["relative_error"]) for r in rows if r["relative_error"] is not None]
    return {"pairs": rows, "skipped": skipped,
            "median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None}


def fit(name: str, workers: int | None = 2) -> dict[str, dict[str, Any]]:
    """Fit every group with enough fit-half cases of the sets sharing ``name``'s profile."""
    spec = SETS[name]
    members = [s for s in SETS.values() if s.profile_name == spec.profile_name and s.fitted]
    fit_cases = [c for s in members for c in built(s.name)[0] if not c.heldout and not c.set_aside]
    groups: dict[str, dict[str, Any]] = {}
    for group in sorted({c.profile_group for c in fit_cases}):
        cases = [c for c in fit_cases if c.profile_group == group]
        if group in spec.attention_groups and len(cases) >= MIN_ATTENTION_FIT_CASES:
            entry = fit_attention_only(cases, lambda raws: simulate_many(raws, workers))
            entry["fitted_on"] = fit_half_note(members, cases, "; attention factor only (GEMMs: the catalog's)")
            groups[group] = entry
            continue
        if group.split("|")[-1] in spec.conv_sm_precisions:
            # SM-bound work beside the convolutions sets these rows: its SM cycles per convolution byte alone
            if len(cases) >= MIN_ATTENTION_FIT_CASES:
                entry = fit_conv_sm_only(cases, lambda raws: simulate_many(raws, workers))
                entry["fitted_on"] = fit_half_note(members, cases, "; conv_sm_cycles_per_byte only (the GPU's "
                                                                   "kernels: the catalog's)")
                groups[group] = entry
            continue
        if any(tag in group for tag in spec.fit_elsewhere):
            # kernel constants fitted elsewhere on the one-GPU rows: the multi-GPU rows fit the skew alone
            multi = [c for c in cases if multi_gpu(c)]
            if len(multi) >= MIN_ATTENTION_FIT_CASES:
                entry = fit_jitter_only(multi, lambda raws: simulate_many(raws, workers))
                entry["fitted_on"] = fit_half_note(members, multi, "; sync_jitter only (kernel constants: fitted on "
                                                                   "the one-GPU rows elsewhere)", "multi-GPU rows")
                groups[group] = entry
            continue
        if len(cases) < 3:
            continue
        entry = fit_group(cases, lambda raws: simulate_many(raws, workers), identifiable_grid(spec.grid, cases),
                          spec.criterion)
        entry["fitted_on"] = fit_half_note(members, cases)
        groups[group] = entry
    for group, figures in heldout_figures(name, groups, workers).items():
        groups[group] = {**groups[group], **figures}
    return groups



def fit_half_note(members, cases, what: str = "", rows_label: str = "") -> str:
    """A fitted group's ``fitted_on``: the sets' files, the half (md5 of the row key even), the rows fitted
    on (``rows_label`` names a subset of them) and what was fitted (``what``; nothing: the whole profile)."""
    label = f", {rows_label}" if rows_label else ""
    return (f"{', '.join(s.csv for s in members)} (validation/data/), fit half (md5 of the row key even){label}: "
            f"{fitted_rows(cases)}{what}")

def heldout_figures(name: str, groups: dict[str, dict[str, Any]] | None = None,
                    workers: int | None = 2) -> dict[str, dict[str, Any]]:
    """Per fitted group of the sets sharing ``name``'s profile: its held-out rows (set-aside rows left out)
    simulated with the group's constants (``groups``, or the profile on disk), as ``heldout_cases``,
    ``heldout_median_abs_error`` and ``heldout_max_abs_error`` (hardware_specs/framework.py HELDOUT_KEYS):
    what a user of the shipped entry is told of it. A group with no held-out row gets none."""
    import statistics

    spec = SETS[name]
    groups = load_groups(spec.profile_name) if groups is None else groups
    members = [s for s in SETS.values() if s.profile_name == spec.profile_name and s.fitted]
    errors: dict[str, list[float]] = {}
    for member in members:
        for o in evaluate(member.name, "heldout", workers, groups=groups):
            if o.case.profile_group in groups and not o.case.set_aside and o.relative_error is not None:
                errors.setdefault(o.case.profile_group, []).append(abs(o.relative_error))
    return {group: {"heldout_cases": len(errs), "heldout_median_abs_error": round(statistics.median(errs), 4),
                    "heldout_max_abs_error": round(max(errs), 4)} for group, errs in sorted(errors.items())}


LISTED_ROWS = 60


def identifiable_grid(grid: tuple[dict[str, float], ...], cases: list[ModernCase]) -> tuple[dict[str, float], ...]:
    """The grid a group can pin down: an attention factor needs fit rows at two sequence lengths at
    least (at one length the attention share is fixed, so the factor trades off against the GEMM
    factor); without them the group keeps the catalog kernel (no ``attention_scale``)."""
    seqs = {c.scenario["training"].get("seq_length") for c in cases}
    if len(seqs) >= 2 or not any("attention_scale" in p for p in grid):
        return grid
    kept: list[dict[str, float]] = []
    for point in grid:
        rest = {k: v for k, v in point.items() if k != "attention_scale"}
        if rest not in kept:
            kept.append(rest)
    return tuple(kept)


def fitted_rows(cases: list[ModernCase]) -> str:
    """The rows a group was fitted on: listed ("set:row, ...") up to :data:`LISTED_ROWS`, else
    named as every fit-half row of the group (the split rule determines them)."""
    if len(cases) <= LISTED_ROWS:
        return f"{len(cases)} rows ({', '.join(f'{c.case_set}:{c.row}' for c in cases)})"
    sets = sorted({c.case_set for c in cases})
    return f"{len(cases)} rows (all fit-half rows of the group in {', '.join(sets)})"


def write_fit(name: str, groups: dict[str, dict[str, Any]]) -> None:
    spec = SETS[name]
    members = [s for s in SETS.values() if s.profile_name == spec.profile_name and s.fitted]
    write_profile(spec.profile_name, " and ".join(s.csv for s in members),
                  "; ".join(s.source for s in members), groups)
