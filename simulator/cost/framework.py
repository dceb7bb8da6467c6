"""Which framework profile a scenario runs with (``training.framework``) and what it does to the specs.

A profile (hardware_specs/framework.py, shipped in hardware_specs/frameworks/) holds factors fitted
per (accelerator, precision) on the fit half of that framework's published runs. For a scenario the
choice is, in this order (the output says which; ``--json`` carries ``framework``, ``framework_state``
and, from ``clustersim simulate``, ``framework_profile``: the entry, its factors and fit rows):

1. *calibrated*: an entry fitted on this accelerator and precision (*derived* where its rows ran on
   another board of the part, ``measured_on``: torchtitan's 500 W H100s; calibrated again on that board's
   own catalog node, ``measured_on_node``: grand-teton-h100);
2. *derived*, other precision: an entry of this accelerator fitted in another precision (fp8 takes the
   bf16 entry and the other way round: a framework's loss is mostly outside the GEMMs' precision);
3. *derived*, the part this one was derived from: a part whose efficiency block was derived by rule from another's
   (``derived_from``: validation/derive_parts.py, the H100/A100 PCIe from the SXM parts) takes that part's entry,
   whatever their speeds: the factor was fitted against the same kernel constants (:func:`_from_derivation_base`);
4. *derived*, other accelerator: the entry of the same vendor's accelerator nearest in bf16 peak
   among those *as fast or slower* (H200 and Blackwell take the H100 entry, MI325X/MI355X the MI300X
   one). The factor is then assumed hardware-independent: the kernels' own rates on the new part come
   from its specs and microbenchmarks, the framework's share of them from the older part (the entry's
   constants of the old part itself, :data:`PART_CONSTANTS`, stay behind). Only towards
   faster parts, because the fitted entries themselves show the share falling as the part gets faster
   (fms-fsdp: A100 0.84, H100 0.57 of the catalog GEMM curve; llm-foundry A100 80 GB 1.25 / 40 GB 0.93,
   H100 0.94): carried to a faster part the older factor is a floor on the loss (still optimistic, less
   so than the catalog); carried to a slower part it would overstate the loss (fms-fsdp's H100 factor is
   32% below its A100 one, the catalog's 1.0 19% above it). Tried on held-out rows as if their part had
   never been measured (``python -m validation.modern --framework-table``, third table; median / max
   |error|): llm-foundry's H100 rows with its A100 40 GB entry 7.2 / 20.3% (own entry 3.9 / 16.1%,
   catalog 21.9 / 74.2%), fms-fsdp's H100 rows with its A100 entry 28.9 / 44.2% (own 9.3 / 19.6%,
   catalog 49.3 / 56.1%): better than the catalog, not as good as a fit on the part;
   a factor also absorbs what the catalog assumed on its part (the H100's in-training GEMM factor is the
   A100's ratio, *assumed*), so carried to Blackwell it assumes the same there;
5. *assumed*: no such entry: the catalog constants (the kernel rates Megatron-Core reaches), said to be
   assumed for that framework.

The default framework, ``megatron-core``, is the catalog constants themselves: no factor, nothing changes.
For a network that is not a transformer (a CNN, an LSTM) the output says so plainly: no framework profile
applies, and which shipped profiles were fitted on runs of that network (or of other networks), to name
with ``training.framework``. A profile fitted on CNN runs (its ``networks``) used for another network is
*derived* (its factors carried from the networks it was fitted on, said in the note). A profile used on the
other kind of model than it was fitted on (one without ``networks``, fitted on decoder-transformer runs, for a
layer-graph network; a CNN profile for a decoder transformer) is *derived* with that reason (``across_kinds`` in
``--json``), less the factors that mean nothing there: the attention factor on a graph without attention, an
image input pipeline's time per sample on a transformer (*assumed*, the catalog constants, where nothing is left).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any

from hardware_specs.catalog import ACCELERATORS
from hardware_specs.framework import DEFAULT_FRAMEWORK, FrameworkEntry, FrameworkProfile, framework_profile
from hardware_specs.schema import Accelerator, ComputeEfficiency, Node

DEFAULT = "default"
CALIBRATED = "calibrated"
DERIVED = "derived"
ASSUMED = "assumed"

#: GEMM size (GFLOP) at which a tilted curve keeps its scaled level (``gemm_tilt``).
TILT_PIVOT_GFLOP = 10.0

#: A part takes another part's entry only if that part's bf16 peak is at most this times its own (see
#: the module docstring: a framework's factor falls as the part gets faster).
SAME_SPEED = 1.05

#: Constants that describe the part an entry was fitted on rather than the framework: an efficiency ceiling
#: (a share of that part's best measured matmul) and the node's collective latency. Not carried to another part.
PART_CONSTANTS = ("gemm_ceiling", "intra_node_latency_us")

#: Constants carried only to a part of the donor's own speed (bf16 peak within :data:`SAME_SPEED`): a host input
#: pipeline's time per sample is its host's, and a faster part's host is another machine (until session 8 Lambda's
#: fp16 rows were fitted so, per part: V100 1,243, H100 359 us; they are now fitted in SM cycles per convolution
#: byte, which carries to any part with an SM count and clock, validation/modern/cnn.py).
SAME_SPEED_CONSTANTS = ("input_us_per_sample",)

#: A precision no entry was fitted in takes an entry of these, in order (same accelerator first).
NEAR_PRECISIONS = {"fp8": ("bf16", "fp16"), "bf16": ("fp16", "fp8"), "fp16": ("bf16", "fp8"),
                   "fp32": ("tf32",), "tf32": ("fp32",)}


def _scaled_points(points: list[dict[str, Any]], scale: float, tilt: float = 0.0,
                   ceiling: float = 1.0) -> list[dict[str, Any]]:
    """Each point times ``scale`` and, with ``tilt``, times ``(gflop / 10)^tilt`` (a framework whose large
    GEMMs gain more over its small ones than the catalog curve says), capped at ``ceiling``."""
    return [{"gflop": p["gflop"], "efficiency": round(min(ceiling, p["efficiency"] * scale
                                                          * (p["gflop"] / TILT_PIVOT_GFLOP) ** tilt), 5)}
            for p in points]


def scaled_efficiency_block(efficiency: dict[str, Any], gemm_scale: float, launch_us: float | None,
                            attention_scale: float | None = None, host_dispatch_us: float | None = None,
                            gemm_tilt: float | None = None, gemm_ceiling: float | None = None) -> dict[str, Any]:
    """An accelerator's efficiency block (a mapping as in its YAML) with the GEMM curves scaled (capped at 1)
    and, with ``attention_scale``, the fused attention kernels' efficiency scaled too (capped at 1; without
    a fused-kernel spec, its ``attention_efficiency_factor``); with ``host_dispatch_us``, the framework's
    eager host time per kernel (simulator/cost/host_floor.py). The one definition the validation's fits
    (validation/modern/profiles.py) and ``training.framework`` both use."""
    eff = copy.deepcopy(efficiency)
    if host_dispatch_us is not None:
        eff["host_dispatch_us_per_kernel"] = host_dispatch_us
        eff["host_dispatch_source"] = "framework profile (fitted on its set's fit half)"
    if attention_scale is not None:
        if eff.get("attention"):
            for level in ("fwd_efficiency", "bwd_efficiency"):
                eff["attention"][level] = round(min(1.0, eff["attention"][level] * attention_scale), 5)
            eff["attention"]["source"] += f"; x {attention_scale:.4f} (framework profile)"
            for kernel in (eff.get("attention_kernels") or {}).values():  # the other kernels (fa3) alike
                for level in ("fwd_efficiency", "bwd_efficiency"):
                    kernel[level] = round(min(1.0, kernel[level] * attention_scale), 5)
        else:
            eff["attention_efficiency_factor"] = round(
                min(1.0, eff.get("attention_efficiency_factor", 1.0) * attention_scale), 5)
            sized = eff.get("attention_efficiency_by_gemm_macs")
            if sized:  # a calibrated profile's per-size table: each point scaled alike
                for point in sized["points"]:
                    point["efficiency"] = round(min(1.0, point["efficiency"] * attention_scale), 5)
                sized["fitted_on"] += f"; x {attention_scale:.4f} (framework profile)"
    tilt, ceiling = gemm_tilt or 0.0, gemm_ceiling or 1.0
    eff["gemm_curve"] = _scaled_points(eff["gemm_curve"], gemm_scale, tilt, ceiling)
    for curve in (eff.get("gemm_curves") or {}).values():  # per-precision curves, where the spec has them
        curve["points"] = _scaled_points(curve["points"], gemm_scale, tilt, ceiling)
    for conv in (eff.get("conv_efficiency") or {}).values():  # convolutions by shape: their level
        conv["level"] = round(min(1.0, conv["level"] * gemm_scale), 5)
    if launch_us is not None:
        eff["kernel_launch_overhead_us"] = launch_us
    eff["source"] = f"{eff.get('source', '')}; GEMM curve x {gemm_scale:.4f} (framework profile)"
    return eff


#: The constants that scale the efficiency block (``intra_node_latency_us`` changes the node, ``sync_jitter``
#: is set as it is).
EFFICIENCY_FACTORS = ("gemm_scale", "kernel_launch_overhead_us", "attention_scale", "host_dispatch_us_per_kernel",
                      "gemm_tilt", "gemm_ceiling")


def efficiency_with_factors(efficiency: dict[str, Any], constants: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`scaled_efficiency_block` with a profile entry's constants, and its ``sync_jitter`` (the wait for
    the slowest rank, simulator/cost/jitter.py), ``moe_layer_fixed_us`` (a fixed time per MoE layer and
    micro-batch, simulator/cost/host_floor.py), ``input_us_per_sample`` (the
    input pipeline's host time per sample) and ``conv_sm_cycles_per_byte`` (SM-bound work beside each convolution
    pass, simulator/cost/compute.py) where it has them; None when none of them is set."""
    eff = None
    if any(constants.get(k) is not None for k in EFFICIENCY_FACTORS):
        eff = scaled_efficiency_block(efficiency, constants.get("gemm_scale") or 1.0,
                                      constants.get("kernel_launch_overhead_us"), constants.get("attention_scale"),
                                      constants.get("host_dispatch_us_per_kernel"), constants.get("gemm_tilt"),
                                      constants.get("gemm_ceiling"))
    if constants.get("sync_jitter") is not None:
        eff = eff if eff is not None else copy.deepcopy(efficiency)
        eff["sync_jitter"] = constants["sync_jitter"]
        eff["sync_jitter_source"] = "framework profile (fitted on its set's fit half)"
    if constants.get("moe_layer_fixed_us") is not None:  # a fixed time per MoE layer and micro-batch
        eff = eff if eff is not None else copy.deepcopy(efficiency)
        eff["moe_layer_fixed_us"] = constants["moe_layer_fixed_us"]
        eff["moe_layer_fixed_source"] = "framework profile (fitted on its set's fit half)"
    if constants.get("conv_sm_cycles_per_byte") is not None:  # SM-bound work beside each convolution pass
        eff = eff if eff is not None else copy.deepcopy(efficiency)
        eff["conv_sm_cycles_per_byte"] = constants["conv_sm_cycles_per_byte"]
        eff["conv_sm_source"] = "framework profile (fitted on its set's fit half)"
    if constants.get("input_us_per_sample") is not None:  # the input pipeline beside the step (spmd/plan.py)
        eff = eff if eff is not None else copy.deepcopy(efficiency)
        eff["input_us_per_sample"] = constants["input_us_per_sample"]
        eff["input_source"] = "framework profile (fitted on its set's fit half)"
    return eff


def precision_key(precision: str, tf32: bool = False) -> str:
    """The precision a profile entry is keyed by: fp32 on TF32 tensor cores is ``tf32``."""
    return "tf32" if precision == "fp32" and tf32 else precision


@dataclass(frozen=True)
class FrameworkChoice:
    """What ``training.framework`` resolved to on one accelerator and precision."""

    name: str
    state: str                      # default | calibrated | derived | assumed
    entry: FrameworkEntry | None    # the factors used (None: the catalog constants)
    note: str                       # in words, for the output
    dropped: tuple[str, ...] = ()   # the entry's constants of its own part, not carried to this one
    settings: tuple[str, ...] = ()  # the framework's own settings the scenario left out, set as its fit rows ran
    network: bool = False           # the run's model is a network (CNN, LSTM ...), not a decoder transformer
    across_kinds: str = ""          # fitted on the other kind of network (transformer / CNN): why it is derived

    @property
    def factors(self) -> dict[str, float]:
        """The constants applied: the entry's, less those tied to the part it was fitted on."""
        if self.entry is None:
            return {}
        return {k: v for k, v in self.entry.factors.items() if k not in self.dropped}

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "state": self.state, "note": self.note, "factors": self.factors}
        if self.network and self.state == DEFAULT:
            out["profile_applies"] = False
        if self.settings:
            out["settings_applied"] = list(self.settings)
        if self.across_kinds:
            out["across_kinds"] = {"reason": self.across_kinds, "not_applied": [
                k for k in (self.entry.factors if self.entry else {}) if k in self.dropped]}
        if self.entry is not None:
            out.update({"fitted_for": {"accelerator": self.entry.accelerator, "precisions": list(self.entry.precisions)},
                        "fitted_on": self.entry.fitted_on, "fit_cases": self.entry.fit_cases})
            if self.entry.measured_on:
                out["measured_on"] = self.entry.measured_on
            if self.entry.heldout_cases:  # the entry's group on the held-out half (validation/modern/registry.py)
                out["heldout"] = {"cases": self.entry.heldout_cases,
                                  "median_abs_error": self.entry.heldout_median_abs_error,
                                  "max_abs_error": self.entry.heldout_max_abs_error}
        return out


def _vendor_and_peak(accelerator: str | Accelerator) -> tuple[str, float]:
    spec = accelerator if isinstance(accelerator, Accelerator) else ACCELERATORS.get(accelerator)
    peaks = spec.peak_tflops
    return spec.vendor, peaks.get("bf16") or peaks.get("fp16") or max(peaks.values())


def _in_precision(entries: list[FrameworkEntry], key: str, recipe: str | None = None) -> tuple[FrameworkEntry | None, bool]:
    """The entry fitted in ``key`` (exact: with fp8, the one naming ``recipe`` first, else one naming no
    recipe) or else in the nearest precision; (None, False) if neither."""
    exact = [e for e in entries if key in e.precisions]
    if key == "fp8":
        exact = ([e for e in exact if e.fp8_recipes and recipe in e.fp8_recipes]
                 or [e for e in exact if not e.fp8_recipes] or exact)
    if exact:
        return exact[0], True
    for near in NEAR_PRECISIONS.get(key, ()):
        for entry in entries:
            if near in entry.precisions:
                return entry, False
    return None, False


def _fitted(entry: FrameworkEntry) -> str:
    on = f", measured on {entry.measured_on}" if entry.measured_on else ""
    on += f", fp8 recipe {'/'.join(entry.fp8_recipes)}" if entry.fp8_recipes else ""
    shown = ", ".join(f"{k} {v:g}" for k, v in entry.factors.items())
    heldout = ""
    if entry.heldout_cases:
        heldout = (f"; held-out: median |error| {100 * entry.heldout_median_abs_error:.1f}%, max "
                   f"{100 * entry.heldout_max_abs_error:.1f}% over {entry.heldout_cases} rows")
    return f"{shown} (fitted on {entry.fit_cases} fit-half rows{on}{heldout})"


def _network_name(model: Any) -> str | None:
    """The catalog name of a model that is a network (CNN, LSTM, ViT ...), None for a decoder transformer."""
    from workloads.schema import TransformerSpec

    if model is None or isinstance(model, TransformerSpec):
        return None
    return str(getattr(model, "name", "network"))


def no_profile_note(network: str) -> str:
    """What the default framework means for a network: no profile applies; the shipped profiles fitted on
    runs of this network, else those fitted on other networks."""
    from hardware_specs.framework import FRAMEWORKS

    fitted = {name: FRAMEWORKS.get(name).networks for name in FRAMEWORKS.names()}
    own = [name for name, nets in fitted.items() if nets and network in nets]
    other = [f"{name} ({', '.join(nets)})" for name, nets in fitted.items() if nets and network not in nets]
    if own:
        hint = f"profiles fitted on {network} runs: {', '.join(own)} (name one with training.framework)"
    elif other:
        hint = f"no profile was fitted on {network} runs; those fitted on other networks: {'; '.join(other)}"
    else:
        hint = "no profile was fitted on a network's runs"
    return ("no framework profile applies (the default, megatron-core, is the catalog constants alone: kernel "
            "microbenchmarks, without what a framework loses to its input pipeline, dispatch and the wait for the "
            f"slowest rank); {hint}")


def choose(name: str, accelerator: Accelerator, precision: str, fp8_recipe: str | None = None,
           field: str = "training.framework", model: Any = None, node: str | None = None) -> FrameworkChoice:
    """The profile entry ``name`` gives on ``accelerator`` in ``precision`` (:func:`precision_key`), and
    whether it was fitted there (calibrated), carried over (derived) or not known (assumed); see the
    module docstring for the order. ``model`` (the run's): a network is told what applies to it. ``node``
    (the run's node name): an entry fitted on another board of the part is calibrated on that board's node."""
    profile = framework_profile(name, field)
    network = _network_name(model)
    if profile is None:
        if network is not None:
            return FrameworkChoice(DEFAULT_FRAMEWORK, DEFAULT, None, no_profile_note(network), network=True)
        return FrameworkChoice(DEFAULT_FRAMEWORK, DEFAULT, None,
                               "the catalog constants (kernel microbenchmarks; the rates Megatron-Core with "
                               "Transformer Engine reaches)")
    choice = choose_in(profile, accelerator, precision, fp8_recipe, node)
    if choice.entry is not None and bool(profile.networks) != (network is not None):  # fitted on the other kind
        return _across_kinds(profile, choice, model, network)
    if choice.entry is None or not profile.networks or network in profile.networks:
        return replace(choice, network=network is not None)
    ran = f"a {network} run" if network is not None else "a transformer run"
    return replace(choice, state=DERIVED, network=network is not None,
                   note=f"{profile.name}'s factors were fitted on {', '.join(profile.networks)} runs, carried to "
                        f"{ran} (assumed: the framework's share of the kernel rates taken to be the same): "
                        f"{choice.note}")


def _model_kind(model: Any, network: str | None) -> str:
    """The run's model in words for a note: a decoder transformer, a CNN (its graph has convolutions) or another
    layer graph (with or without attention)."""
    if network is None:
        return "this model is a decoder transformer"
    from simulator.cost.provenance import graph_features  # provenance imports this module

    features = graph_features(model)
    if features.convolution:
        return f"{network} is a CNN"
    return f"{network} is a layer graph {'with attention, ' if features.attention else ''}without convolutions"


def _across_kinds(profile: FrameworkProfile, choice: FrameworkChoice, model: Any, network: str | None) -> FrameworkChoice:
    """A profile fitted on one kind of network (decoder transformers: no ``networks``; CNNs: its ``networks``) run
    on the other kind: *derived*, with the reason, and without the factors that mean nothing there (the attention
    factor on a graph with no attention; an image input pipeline's time per sample on a token sequence)."""
    from simulator.cost.provenance import graph_features

    if profile.networks:
        fitted = f"fitted on CNN runs ({', '.join(profile.networks)})"
        # DALI/JPEG decoding per image, not a token sequence's; SM work beside convolutions the model does not have
        meaningless = ("input_us_per_sample",) + (() if graph_features(model).convolution
                                                  else ("conv_sm_cycles_per_byte",))
        why = ("an image input pipeline's time per sample, not a token sequence's; work beside convolutions, of which "
               "this model has none")
    else:
        fitted = "fitted on decoder-transformer runs"
        meaningless = () if graph_features(model).attention else ("attention_scale",)
        why = "this graph has no attention"
    reason = f"{fitted}; {_model_kind(model, network)}"
    dropped = tuple(k for k in meaningless if k in choice.entry.factors)
    kept = {k: v for k, v in choice.entry.factors.items() if k not in (*choice.dropped, *dropped)}
    if not kept:  # nothing of it means anything here: the catalog constants, said so
        return FrameworkChoice(profile.name, ASSUMED, None,
                               f"{profile.name}'s factors were {reason}: none of them carries here (its "
                               f"{', '.join(choice.entry.factors)}: {why}), the catalog constants (Megatron-Core's "
                               f"kernel rates), assumed for {profile.name}",
                               network=network is not None, across_kinds=reason)
    left_out = f"; {', '.join(dropped)} not applied ({why})" if dropped else ""
    return replace(choice, state=DERIVED, network=network is not None, dropped=(*choice.dropped, *dropped),
                   across_kinds=reason,
                   note=f"{profile.name}'s factors were {reason}: carried across (assumed: the framework's share "
                        f"of the kernel rates taken to be the same){left_out}; {choice.note}")


#: Constants counted in SM cycles (hardware_specs.schema.ComputeEfficiency): a part that records no SM count and
#: clock cannot run them, so they are left out there (said in the note).
SM_CYCLE_CONSTANTS = ("conv_sm_cycles_per_byte",)


def choose_in(profile: FrameworkProfile, accelerator: Accelerator, precision: str,
              fp8_recipe: str | None = None, node: str | None = None) -> FrameworkChoice:
    """:func:`choose` among ``profile``'s entries (the validation's carry-over check passes a profile without
    the entries of the row's own part: what the rule gives where that part was never measured). A constant
    counted in SM cycles (:data:`SM_CYCLE_CONSTANTS`) is left out on a part without ``sm_count`` and
    ``sm_clock_mhz``."""
    choice = _choose_in(profile, accelerator, precision, fp8_recipe, node)
    if choice.entry is None or accelerator.sm_cycles_per_s is not None:
        return choice
    uncountable = tuple(k for k in SM_CYCLE_CONSTANTS if k in choice.entry.factors and k not in choice.dropped)
    if not uncountable:
        return choice
    if set(choice.entry.factors) <= {*choice.dropped, *uncountable}:  # nothing of it runs here: the catalog
        return FrameworkChoice(profile.name, ASSUMED, None,
                               f"{choice.note}; but its {', '.join(uncountable)} cannot run on {accelerator.name}, "
                               "which records no sm_count and sm_clock_mhz: the catalog constants (Megatron-Core's "
                               f"kernel rates), assumed for {profile.name}")
    return replace(choice, dropped=(*choice.dropped, *uncountable),
                   note=f"{choice.note}; its {', '.join(uncountable)} not applied ({accelerator.name} records no "
                        "sm_count and sm_clock_mhz to run SM cycles at)")


def _choose_in(profile: FrameworkProfile, accelerator: Accelerator, precision: str,
               fp8_recipe: str | None = None, node: str | None = None) -> FrameworkChoice:
    name = profile.name
    here = [e for e in profile.entries if e.accelerator == accelerator.name]
    entry, exact = _in_precision(here, precision, fp8_recipe)
    if entry is not None and exact and entry.measured_on and node is not None and node == entry.measured_on_node:
        return FrameworkChoice(name, CALIBRATED, entry, f"{name} on {accelerator.name} {precision}, node {node}: "
                                                        f"fitted on rows measured on this board: {_fitted(entry)}")
    if entry is not None and exact and entry.measured_on:  # fitted on another board of the same part
        board = f"; that board is the catalog node {entry.measured_on_node}" if entry.measured_on_node else ""
        return FrameworkChoice(name, DERIVED, entry,
                               f"{name} on {accelerator.name} {precision}: fitted on rows measured on another board "
                               f"of this part, carried over: {_fitted(entry)}{board}")
    if entry is not None and exact:
        return FrameworkChoice(name, CALIBRATED, entry, f"{name} on {accelerator.name} {precision}: {_fitted(entry)}")
    if entry is not None:
        return FrameworkChoice(name, DERIVED, entry,
                               f"no {name} run on {accelerator.name} in {precision} was measured: its "
                               f"{'/'.join(entry.precisions)} factors there carried over: {_fitted(entry)}")
    derived = _from_derivation_base(profile, accelerator, precision, fp8_recipe)
    if derived is not None:
        return derived
    vendor, peak = _vendor_and_peak(accelerator)
    donors = sorted({e.accelerator for e in profile.entries if _vendor_and_peak(e.accelerator)[0] == vendor
                     and _vendor_and_peak(e.accelerator)[1] <= peak * SAME_SPEED},
                    key=lambda a: (abs(math.log(_vendor_and_peak(a)[1] / peak)), a))
    for donor in donors:
        entry, _ = _in_precision([e for e in profile.entries if e.accelerator == donor], precision, fp8_recipe)
        if entry is not None:
            same_speed = _vendor_and_peak(donor)[1] * SAME_SPEED >= peak
            kept_apart = PART_CONSTANTS if same_speed else (*PART_CONSTANTS, *SAME_SPEED_CONSTANTS)
            dropped = tuple(k for k in kept_apart if k in entry.factors)
            if len(dropped) == len(entry.factors):  # nothing of it carries here: the next donor, else the catalog
                continue
            left_out = f"; its {', '.join(dropped)} (of {donor} itself) not carried" if dropped else ""
            return FrameworkChoice(
                name, DERIVED, entry,
                f"no {name} run on {accelerator.name} was measured: its {donor} {'/'.join(entry.precisions)} "
                f"factors carried over, assumed hardware-independent (the kernels' rates are {accelerator.name}'s "
                f"own specs and microbenchmarks): {_fitted(entry)}{left_out}", dropped)
    fitted = sorted({e.accelerator for e in profile.entries})
    return FrameworkChoice(name, ASSUMED, None,
                           f"no {name} entry for {accelerator.name} in {precision}, nor one of a {vendor} part as fast "
                           f"or slower that carries here, was fitted (fitted on: {', '.join(fitted)}): the catalog constants "
                           f"(Megatron-Core's kernel rates), assumed for {name}")


def _from_derivation_base(profile: FrameworkProfile, accelerator: Accelerator, precision: str,
                          fp8_recipe: str | None) -> FrameworkChoice | None:
    """The entry of the part ``accelerator``'s efficiency block was derived from by rule (``derived_from``:
    validation/derive_parts.py, e.g. the H100 PCIe from the H100 SXM), in ``precision`` or the nearest one; None
    where that part has none. Taken before any other part's, whatever the two parts' speeds: a factor is fitted
    against its part's kernel constants and absorbs what the catalog assumed there (the H100's TF32 convolution
    model is the A100's, *assumed*, and Lambda's H100 TF32 factor 0.77 corrects it), and the derived part's
    constants are the same fractions of its own peak, so the base's factor corrects them alike; another part's
    factor corrects constants this part does not have (the A100's TF32 factor on the H100 PCIe: +19..+26% on
    Lambda's rows, validation/modern/cnn.py). Constants of the base part itself (:data:`PART_CONSTANTS`) and those
    carried only between parts of one speed stay behind, as for any other donor."""
    base = accelerator.derived_from
    if base is None:
        return None
    entry, _ = _in_precision([e for e in profile.entries if e.accelerator == base], precision, fp8_recipe)
    if entry is None:
        return None
    same_speed = _vendor_and_peak(base)[1] <= _vendor_and_peak(accelerator)[1] * SAME_SPEED
    kept_apart = PART_CONSTANTS if same_speed else (*PART_CONSTANTS, *SAME_SPEED_CONSTANTS)
    dropped = tuple(k for k in kept_apart if k in entry.factors)
    if len(dropped) == len(entry.factors):
        return None
    left_out = f"; its {', '.join(dropped)} (of {base} itself) not carried" if dropped else ""
    return FrameworkChoice(
        profile.name, DERIVED, entry,
        f"no {profile.name} run on {accelerator.name} was measured: the {base} {'/'.join(entry.precisions)} factors "
        f"carried over ({accelerator.name}'s kernel constants are derived from {base}'s by rule, so the factor "
        f"fitted against them applies alike): {_fitted(entry)}{left_out}", dropped)


def with_framework_settings(raw: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The raw scenario with the named framework's own settings (its profile's ``fitted_with``: what every row
    its factors were fitted on ran with, e.g. torchtitan's ``training.fp8_saved_inputs: false``) where the
    scenario leaves them out, and those settings as ``key=value``; a setting the scenario gives is kept (and
    warned about where it differs: simulator/cost/provenance.py). An unknown name is a ConfigError."""
    training = raw.get("training")
    name = training.get("framework", DEFAULT_FRAMEWORK) if isinstance(training, dict) else DEFAULT_FRAMEWORK
    if not isinstance(name, str) or name == DEFAULT_FRAMEWORK:
        return raw, ()
    profile = framework_profile(name)
    out = dict(raw)
    applied = []
    for key, value in profile.fitted_with.items():
        section, field = key.split(".")
        block = out.get(section, {})
        if not isinstance(block, dict) or field in block:
            continue
        out[section] = {**block, field: value}
        applied.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return out, tuple(applied)


def with_framework(choice: FrameworkChoice, accelerator: Accelerator, node: Node) -> tuple[Accelerator, Node]:
    """The accelerator and node with the chosen entry's constants (themselves without an entry)."""
    if choice.entry is None:
        return accelerator, node
    constants = choice.factors
    block = efficiency_with_factors(accelerator.efficiency.model_dump(exclude_none=True), constants)
    if block is not None:
        accelerator = accelerator.model_copy(update={"efficiency": ComputeEfficiency.model_validate(block)})
    latency = constants.get("intra_node_latency_us")
    if latency is not None:
        node = node.model_copy(update={"intra_node": node.intra_node.model_copy(update={"latency_us": latency})})
    return accelerator, node


def with_grouped_gemm_kernels(accelerator: Accelerator, framework: str) -> Accelerator:
    """The accelerator with only the grouped-GEMM entries whose kernel ``framework`` runs
    (``GroupedGemmEfficiency.frameworks``): a grouped kernel's rate is its library's (torchao's measured
    grouped GEMMs are torchtitan's MoE kernels; Megatron-Core's are Transformer Engine's, not measured), so
    another framework's experts stay dense GEMMs of a group's shape."""
    grouped = accelerator.efficiency.grouped_gemm
    kept = {key: entry for key, entry in grouped.items() if framework in entry.frameworks}
    if len(kept) == len(grouped):
        return accelerator
    return accelerator.model_copy(update={"efficiency": accelerator.efficiency.model_copy(
        update={"grouped_gemm": kept})})
