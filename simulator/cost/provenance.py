"""Which of a run's efficiency constants were measured and which are assumed.

A user who asks about hardware the project holds no measurement of must be told so: every
efficiency the compute model uses for a scenario is listed with the data it was fitted on
(``fitted_on`` in the spec) or as *assumed*. ``clustersim simulate`` prints the assumed ones
and ``--json`` carries the whole map (``efficiency_provenance``).
"""

from __future__ import annotations

import dataclasses

from simulator.cost.compute import fp8_curve_key
from simulator.scenario import Scenario

ASSUMED = "assumed"


def gemm_curve_key(scenario: Scenario) -> str:
    """The curve the run's main GEMMs are priced on (see simulator/cost/compute.py)."""
    if scenario.training.precision == "fp8":
        return fp8_curve_key(scenario.accelerator, scenario.training.fp8_recipe)
    if scenario.training.tf32:
        return "tf32"
    return scenario.training.precision


def efficiency_provenance(scenario: Scenario) -> dict[str, str]:
    """Component -> fitted_on (data and rows) or "assumed", for the constants this run uses (on a
    mixed cluster, each node group's, keyed ``<node>:<component>``)."""
    if scenario.mixed:
        out: dict[str, str] = {}
        for group in scenario.groups:
            one = dataclasses.replace(scenario, node=group.node, accelerator=group.accelerator, node_groups=())
            out.update({f"{group.node.name}:{k}": v for k, v in efficiency_provenance(one).items()})
        return out
    accel = scenario.accelerator
    eff = accel.efficiency
    out: dict[str, str] = {}

    def curve(key: str) -> str:
        if key in eff.gemm_curves:
            return eff.gemm_curves[key].fitted_on or ASSUMED
        if key in ("tf32", "fp32"):  # the default curve was fitted on 16-bit runs: its fraction of this peak is assumed
            return ASSUMED
        return eff.fitted_on or ASSUMED

    key = gemm_curve_key(scenario)
    out[f"gemm_{key}"] = curve(key)
    if key in eff.conv_efficiency:  # convolutions by shape (simulator/cost/conv.py); else on the GEMM curve
        out[f"conv_{key}"] = eff.conv_efficiency[key].fitted_on or ASSUMED
    if scenario.training.precision == "fp8" and key != {"nvfp4": "nvfp4", "mxfp8": "mxfp8",
                                                        "blockwise": "fp8_block"}.get(scenario.training.fp8_recipe, "fp8"):
        out[f"gemm_{scenario.training.fp8_recipe}"] = ASSUMED  # the recipe's kernel not measured: fp8 curve used
    if scenario.training.precision == "fp8":
        out["gemm_bf16"] = curve("bf16")  # the GEMMs kept in higher precision
    if eff.in_training_gemm_factor != 1.0:
        out["in_training_gemm_factor"] = eff.in_training_gemm_factor_fitted_on or ASSUMED
    if scenario.training.attention == "flash" and eff.attention is not None:
        out["attention_kernel"] = eff.attention.fitted_on or ASSUMED
        for name in eff.attention.assumed:  # parts of the kernel no row measured (e.g. FlashAttention-3's backward)
            out[f"attention_kernel.{name}"] = ASSUMED
    else:
        out["attention_efficiency_factor"] = ASSUMED  # no run of this project has measured it
    out["memory_bound"] = eff.memory_bound_efficiency_fitted_on or ASSUMED
    if eff.memory_kernels is not None:  # pooling / concatenation kernels by class (simulator/cost/memory_kernels.py)
        out["memory_kernels"] = eff.memory_kernels.fitted_on or ASSUMED
    if _has_grouped_convolutions(scenario.model):  # depthwise / grouped passes as direct kernels (simulator/cost/conv.py)
        out["direct_conv"] = eff.direct_conv.fitted_on or ASSUMED if eff.direct_conv is not None else ASSUMED
    clock = accel.sustained_clock
    if clock is None and eff.fitted_on is not None and "(sibling " in eff.fitted_on:
        # the GEMM level came from a sibling die's runs at the sibling's power limit: that this part
        # holds the same fraction of its own datasheet peak under its own limit is assumed
        out["sustained_clock"] = ASSUMED
    if clock is not None:  # listed where measured (the GEMM curve fitted on it holds it)
        precision = "bf16" if scenario.training.precision == "fp8" and "fp8" not in clock.under_load_mhz \
            else scenario.training.precision
        fraction = clock.clock_fraction(precision)
        held = f"{fraction:.0%} of the {clock.peak_clock_mhz:g} MHz peak clock" if fraction else "measured"
        out["sustained_clock"] = (f"{held} under {clock.power_limit_watts:g} W; "
                                  f"{clock.fitted_on or clock.source}")
    node = scenario.node
    laws = node.intra_laws or {}
    if "all_reduce" in laws and laws["all_reduce"].fitted_on:
        out["intra_node_collectives"] = laws["all_reduce"].fitted_on
    else:  # the link rate times collective_efficiency: measured where the node's source says so
        out["intra_node_collectives"] = _stated(node.intra_node.source)
    if scenario.num_gpus > node.domain_gpus:
        inter = node.inter_node_collectives or {}
        if "all_reduce" in inter and inter["all_reduce"].fitted_on:
            out["inter_node_collectives"] = inter["all_reduce"].fitted_on
        else:
            out["inter_node_collectives"] = _stated(node.source)
    return out


def _has_grouped_convolutions(model) -> bool:
    """A catalog network with grouped or depthwise convolutions (ResNeXt's ``groups``, EfficientNet's
    MBConv), whose direct-kernel bandwidth is then part of the result; read off the spec, no graph built."""
    return getattr(model, "family", None) == "efficientnet" or getattr(model, "groups", 1) > 1


def _stated(source: str) -> str:
    """A hand-written spec's provenance: "assumed" where its source says a figure is assumed."""
    return ASSUMED if "assum" in source.lower() else f"stated in the spec: {source}"


def assumed_components(provenance: dict[str, str]) -> list[str]:
    return [name for name, where in provenance.items() if where == ASSUMED]
