"""Which of a run's efficiency constants were measured and which are assumed.

A user who asks about hardware the project holds no measurement of must be told so: every
efficiency the compute model uses for a scenario is listed with the data it was fitted on
(``fitted_on`` in the spec) or as *assumed*. Each entry is in one of four states
(:func:`provenance_state`): *calibrated* (fitted on named rows measured on this part), *derived*
(carried from another part or scaled by a ratio: the spec's ``fitted_on`` says from what, e.g.
"(sibling b200)", "(bf16; x0.958, ...)", "(transferred from dgx-b200 ...)", "(derived by rule from
h100-sxm-80g)": a constant no row of this part measures, carried by the rule the spec's source states),
*stated* (a figure the spec takes from a datasheet or another external source, its ``source`` field,
that no fit of this project checked: a node's link rate times its collective efficiency) or *assumed*.
``clustersim simulate`` prints the four lists and ``--json`` carries the whole map
(``efficiency_provenance``) and the states (``efficiency_states``).

Only the constants the run's layer graph uses are listed (:func:`graph_features`): the attention
kernel or factor where the graph has attention ops (not for a CNN, nor for GNMT's attention, which is
GEMMs), the convolution model where it has convolutions, a pooling / concatenation kernel's
efficiency where it has that kernel, ``misaligned_gemm_factor`` where a GEMM the run prices on the curve has a
row stride not a multiple of 16 bytes (:func:`has_misaligned_gemm`: calibrated on H100's d_ff sweep, carried to
the other Hopper boards, assumed elsewhere, where it is 1.0 -- no penalty -- and the ASSUMED line says so).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import cache

from simulator.cost.compute import BLOCK_SCALED_PEAK, RECIPE_CURVE, fp8_curve_key
from simulator.cost.default_framework import framework_named
from simulator.cost.framework import DEFAULT, FrameworkChoice
from simulator.cost.memory_kernels import memory_kernel_class
from simulator.scenario import BLOCKWISE_FP8_KERNELS, Scenario

ASSUMED = "assumed"
CALIBRATED = "calibrated"
DERIVED = "derived"
STATED = "stated"   # a datasheet or external figure written into the spec, not fitted by this project
STATES = (CALIBRATED, DERIVED, STATED, ASSUMED)
_STATED_PREFIX = "stated in the spec: "

# the markers hardware_specs/*.yaml write into a ``fitted_on`` that was not measured on the part itself
_SIBLING = re.compile(r"\(sibling ([\w.-]+)\)")  # a sibling die's level (same silicon, other board/power)
_RATIO = re.compile(r"\((\w+); x([0-9.]+),")  # another precision's level times a median ratio
_TRANSFER = re.compile(r"\(transferred from ([\w.-]+)")  # another node's fitted collective laws
_KINDS = re.compile(r"\(carried across network kinds from ([^)]+)\)")  # a profile fitted on transformers run on a CNN ...
_CARRIED = re.compile(r"\(carried over from ([^)]+)\)")  # a framework profile's entry of another part / precision
_RULE = re.compile(r"\(derived by rule from ([\w.-]+)\)")  # another part's constant by a stated rule (the source)
_CONV_RULE = re.compile(r"\(derived: convolutions on the (\w+) GEMM curve\)$")  # a precision with no conv model
_PEAK_RULE = re.compile(r"\(derived: the (\w+) curve's fraction of peak on the (\w+) peak\)")  # a recipe's GEMM


def gemm_curve_key(scenario: Scenario) -> str:
    """The curve the run's main GEMMs are priced on (see simulator/cost/compute.py)."""
    if runs_no_fp8_gemm(scenario):
        return "bf16"
    if scenario.training.precision == "fp8":
        return fp8_curve_key(scenario.accelerator, scenario.training.fp8_recipe)
    if scenario.training.tf32:
        return "tf32"
    return scenario.training.precision


@dataclass(frozen=True)
class GraphFeatures:
    """What kinds of kernels a model's layer graph holds (which efficiency constants a run of it reads)."""

    attention: bool                    # ops of kind "attention" (a fused or GEMM-priced attention core)
    convolution: bool                  # GEMMs that are convolutions (``Op.conv``: priced by the conv model)
    memory_kernels: frozenset[str]     # memory-bound kernel classes (simulator/cost/memory_kernels.py)
    # GEMM classes the graph's GEMMs carry (workloads/graph.py ``gemm_class``: what ``training.fp8_gemms`` selects);
    # None: every class (a decoder transformer, or a graph that cannot be built here)
    gemm_classes: frozenset[str] | None = None
    # how the graph's attention core runs whatever ``training.attention`` says: "fused" (a scaled-dot-product
    # kernel op, workloads/graph.py ``is_fused_attention``), "eager" (scores, softmax and weighted sum as separate
    # kernels, the scores materialised: Swin's window attention, an einsum); None: the field decides (a decoder
    # transformer, BERT, ViT, an imported nn.MultiheadAttention), or no attention
    fixed_attention: str | None = None
    # whether a graph's bias gradients are kernels of their own (``<layer>.bias_grad``: a network runs them as its
    # PyTorch code does, whatever ``training.unfused_eager_kernels`` says); False for a decoder transformer, whose
    # builder adds them under that field
    bias_grad_kernels: bool = False
    # whether the graph has a softmax cross-entropy loss layer over a vocabulary or classes (what
    # ``training.fused_cross_entropy`` acts on); True for a decoder transformer
    cross_entropy: bool = True

    def attention_paths(self, attention: str) -> frozenset[str]:
        """How the attention core runs under ``training.attention`` = ``attention``: {"fused"}, {"eager"}, both
        (a graph with attention of each kind), or none (no attention op)."""
        if not self.attention:
            return frozenset()
        if self.fixed_attention is not None:
            return frozenset({self.fixed_attention})
        return frozenset({"fused" if attention == "flash" else "eager"})


@cache
def graph_features(model) -> GraphFeatures:
    """The kernel kinds of ``model``'s layer graph, read off a one-sample graph (the kinds do not depend on
    the batch); a decoder transformer has attention and no convolution or pooling. A graph that cannot be
    built here (an import that needs a package) counts as having every kind: nothing is left unlisted."""
    from workloads.graph import ShardShape, gemm_class, is_fused_attention
    from workloads.schema import TransformerSpec

    if isinstance(model, TransformerSpec):
        return GraphFeatures(attention=True, convolution=False, memory_kernels=frozenset())
    shard = ShardShape(micro_batch=1, seq_length=model.seq_length or 1, flash_attention=True)
    try:
        graph = model.layer_graph(shard)
        standard = model.layer_graph(dataclasses.replace(shard, flash_attention=False))
    except Exception:  # noqa: BLE001 - listing more constants is the safe side
        return GraphFeatures(attention=True, convolution=True,
                             memory_kernels=frozenset({"maxpool", "avgpool", "adaptive_avgpool", "concat"}))
    ops = [op for layer in graph.layers for op in (*layer.forward, *layer.backward)]
    cores = [op for op in ops if op.kind == "attention"]
    # the field decides where the graph's attention ops differ between the two settings (BERT, ViT, an imported
    # nn.MultiheadAttention: workloads/networks/builder.py ``attention_kernel``); else the graph fixes them
    follows = [op.name for op in cores] != [op.name for layer in standard.layers
                                             for op in (*layer.forward, *layer.backward) if op.kind == "attention"]
    fixed = None if not cores or follows else "fused" if any(is_fused_attention(op) for op in cores) else "eager"
    return GraphFeatures(attention=bool(cores),
                         convolution=any(op.conv is not None for op in ops),
                         memory_kernels=frozenset(memory_kernel_class(op.name) for op in ops if op.kind == "memory"),
                         gemm_classes=frozenset(c for op in ops if op.kind == "gemm" and (c := gemm_class(op))),
                         fixed_attention=fixed,
                         bias_grad_kernels=any(op.name.endswith(".bias_grad") for layer in graph.layers
                                               for op in layer.backward),
                         cross_entropy=any(layer.kind == "loss" for layer in graph.layers))


def runs_no_fp8_gemm(scenario: Scenario) -> bool:
    """``precision: fp8`` on a model none of whose GEMMs is of a class in ``training.fp8_gemms``: every GEMM
    and convolution then runs on the bf16 curve (simulator/cost/compute.py keeps a GEMM outside ``fp8_gemms``
    in bf16, and has no fp8 convolution model) -- the step is a bf16 step. A CNN tags no GEMM class
    (Transformer Engine runs no convolution in FP8, and no FP8 convolution is measured), nor does an imported
    model's linear (its role is not known); BERT's and ViT's attention projections and MLP linears are tagged
    (workloads/networks/bert.py, vit.py)."""
    if scenario.training.precision != "fp8":
        return False
    classes = graph_features(scenario.model).gemm_classes
    return classes is not None and not classes & set(scenario.training.fp8_gemms)


#: The provenance entry of ``misaligned_gemm_factor``, listed only for a run with a misaligned GEMM.
MISALIGNED = "misaligned_gemm_factor"
#: What an assumed entry stands at, printed beside its name on the ASSUMED line (``clustersim simulate``).
ASSUMED_NOTES = {MISALIGNED: "1.0: no penalty assumed"}


def has_misaligned_gemm(scenario: Scenario) -> bool:
    """Whether a GEMM of the scenario's layer graph at its layout's shard (``scenario.layer_graph()``: forward and
    backward; a recomputed op is a copy of a forward one) is priced with ``misaligned_gemm_factor``
    (simulator/cost/compute.py ``ComputeModel.misaligned_gemm``: a row stride not a multiple of 16 bytes of the
    element type, on a route that reads the GEMM curve). A graph that cannot be built here counts as having one:
    listing more constants is the safe side."""
    from simulator.cost.compute import ComputeModel

    training = scenario.training
    compute = ComputeModel(scenario.accelerator, training.precision, training.fp8_gemms, training.fp8_recipe,
                           tf32=training.tf32)
    try:
        graph = scenario.layer_graph()
    except Exception:  # noqa: BLE001 - listing more constants is the safe side
        return True
    return any(compute.misaligned_gemm(op) for layer in graph.layers for op in (*layer.forward, *layer.backward))


def assumed_note(component: str) -> str:
    """What an assumed ``component`` (``<node>:<name>`` on a mixed cluster) stands at, where that says more than
    its name (:data:`ASSUMED_NOTES`), else ""."""
    return ASSUMED_NOTES.get(component.rsplit(":", 1)[-1], "")


def linear_rule_split(scenario: Scenario, shapes) -> tuple[int, int]:
    """(linear layers priced as 1x1 convolution passes, linear layers priced on the GEMM size curve) of the
    scenario's graph at its layout's shard (``scenario.shard``), by their forward (M, N, K) against ``shapes``
    (a GemmShapeRange; None: the rule applies at every shape). A graph that cannot be built here counts one of
    each: both rules listed."""
    from simulator.cost.compute import forward_shape
    from workloads.graph import gemm_class

    try:
        graph = scenario.model.layer_graph(scenario.shard)
    except Exception:  # noqa: BLE001 - listing more rules is the safe side
        return 1, 1
    linears = [op for layer in graph.layers for op in layer.forward
               if op.kind == "gemm" and op.conv is None and gemm_class(op) != "experts"]
    inside = sum(1 for op in linears if shapes is None or shapes.contains(*forward_shape(op)))
    return inside, len(linears) - inside


def efficiency_provenance(scenario: Scenario) -> dict[str, str]:
    """Component -> fitted_on (data and rows) or "assumed", for the constants this run uses (on a
    mixed cluster, each node group's, keyed ``<node>:<component>``)."""
    if scenario.mixed:
        out: dict[str, str] = {}
        for i, group in enumerate(scenario.groups):
            one = dataclasses.replace(scenario, node=group.node, accelerator=group.accelerator, node_groups=(),
                                      frameworks=scenario.frameworks[i:i + 1])
            out.update({f"{group.node.name}:{k}": v for k, v in efficiency_provenance(one).items()})
        return out
    accel = scenario.accelerator
    eff = accel.efficiency
    features = graph_features(scenario.model)
    out: dict[str, str] = {}
    if scenario.frameworks and scenario.frameworks[0].state != DEFAULT:
        out["framework_factors"] = framework_provenance(scenario.frameworks[0])
    elif not framework_named(scenario):
        # no training.framework named: the catalog constants stand for whatever the run's framework loses to
        # them, fitted for no framework of this run (simulator/cost/default_framework.py says how far that was
        # from held-out runs of named frameworks)
        out["framework_factors"] = ASSUMED

    def curve(key: str) -> str:
        if key in eff.gemm_curves:
            return eff.gemm_curves[key].fitted_on or ASSUMED
        if key in ("tf32", "fp32"):  # the default curve was fitted on 16-bit runs: its fraction of this peak is assumed
            return ASSUMED
        return eff.fitted_on or ASSUMED

    key = gemm_curve_key(scenario)
    out[f"gemm_{key}"] = curve(key)
    no_fp8 = runs_no_fp8_gemm(scenario)  # fp8 asked, no GEMM of the model in fp8_gemms: a bf16 step
    if features.convolution and scenario.training.precision == "fp8":
        # no convolution runs in FP8 (no class; no fp8 convolution model): the bf16 GEMM curve prices them,
        # no convolution model is read (simulator/cost/compute.py)
        out["conv_bf16"] = conv_provenance(eff.model_copy(update={"conv_efficiency": {}}), "bf16", curve("bf16"))
    elif features.convolution:
        out[f"conv_{key}"] = conv_provenance(eff, key, out[f"gemm_{key}"])
    if key in eff.linear_as_pointwise_conv and scenario.training.precision != "fp8":
        # linear layers priced as 1x1 convolution passes (simulator/cost/compute.py): no GEMM of this precision
        # is measured on this part, so the rule is an assumption whatever the convolution model was fitted on;
        # outside the shapes it was chosen on (linear_as_pointwise_conv_range) a linear is on the size curve
        # instead, which no linear of this precision measures either: each rule listed where it prices a linear
        inside, outside = linear_rule_split(scenario, eff.linear_as_pointwise_conv_range.get(key))
        if inside:
            out[f"linear_{key}"] = ASSUMED
        if outside:
            out[f"linear_{key}_gemm_curve"] = ASSUMED
    recipe = scenario.training.fp8_recipe
    if scenario.training.precision == "fp8" and not no_fp8 and key != RECIPE_CURVE[recipe]:
        # the recipe's kernel not measured: a block-scaled recipe runs the fp8 curve's fraction of peak on its own
        # datasheet peak (a rule, simulator/cost/compute.py BLOCK_SCALED_PEAK); the others the fp8 curve, assumed
        out[f"gemm_{recipe}"] = (block_scaled_rule(key, BLOCK_SCALED_PEAK[recipe]) if recipe in BLOCK_SCALED_PEAK
                                 else ASSUMED)
        if BLOCK_SCALED_PEAK.get(recipe, "fp8") != "fp8":  # nvfp4: the fp4 peak, no fp8 run reads
            out[f"peak_{BLOCK_SCALED_PEAK[recipe]}"] = _stated(accel.source)  # the datasheet figure the rule scales
    if scenario.training.precision == "fp8" and not no_fp8:
        out["gemm_bf16"] = curve("bf16")  # the GEMMs kept in higher precision
    if eff.in_training_gemm_factor != 1.0:
        out["in_training_gemm_factor"] = eff.in_training_gemm_factor_fitted_on or ASSUMED
    if has_misaligned_gemm(scenario):
        # a GEMM with a row stride not a multiple of 16 bytes runs at misaligned_gemm_factor of the curve
        # (simulator/cost/compute.py is_aligned): the rows it was measured on, or 1.0 (no penalty) assumed
        out[MISALIGNED] = eff.misaligned_gemm_factor_source or ASSUMED
    # no attention op in the graph (a CNN; GNMT's attention is GEMMs): neither constant is read; a fused kernel
    # on the FlashAttention kernel model where the spec has one, else (and the materialised path) on the GEMM
    # curve x attention_efficiency_factor (simulator/cost/compute.py)
    paths = features.attention_paths(scenario.training.attention)
    if "fused" in paths and eff.attention is not None:
        out["attention_kernel"] = eff.attention.fitted_on or ASSUMED
        if eff.attention.fitted_on is not None:  # a kernel measured nowhere (cudnn) is assumed whole: one entry
            for name in eff.attention.assumed:  # parts of the kernel no row measured (e.g. FlashAttention-3's backward)
                out[f"attention_kernel.{name}"] = ASSUMED
    if "eager" in paths or ("fused" in paths and eff.attention is None):
        sized = eff.attention_efficiency_by_gemm_macs  # a calibrated profile's table by size (compute.py reads it)
        if sized is not None:
            out["attention_efficiency_by_gemm_macs"] = sized.fitted_on
        else:
            out["attention_efficiency_factor"] = ASSUMED  # no run of this project has measured it
    if getattr(scenario.model, "moe", None) is not None:  # expert GEMMs as one grouped kernel (simulator/cost/compute.py)
        grouped = eff.grouped_gemm.get(RECIPE_CURVE[scenario.training.fp8_recipe]
                                       if scenario.training.precision == "fp8" else key)
        # without an entry for this framework's kernel: dense GEMMs of a group's shape (not measured as grouped)
        out["grouped_gemm"] = (grouped.fitted_on or ASSUMED) if grouped is not None else ASSUMED
    out["memory_bound"] = eff.memory_bound_efficiency_fitted_on or ASSUMED
    if eff.memory_kernels is not None and features.memory_kernels & set(eff.memory_kernels.by_kernel):
        # pooling / concatenation kernels by class (simulator/cost/memory_kernels.py), where the graph has them
        out["memory_kernels"] = eff.memory_kernels.fitted_on or ASSUMED
    if _has_grouped_convolutions(scenario.model):  # depthwise / grouped passes as direct kernels (simulator/cost/conv.py)
        out["direct_conv"] = eff.direct_conv.fitted_on or ASSUMED if eff.direct_conv is not None else ASSUMED
    clock = accel.sustained_clock
    if clock is None and eff.fitted_on is not None and ("(sibling " in eff.fitted_on
                                                         or "(derived by rule from " in eff.fitted_on):
        # the GEMM level came from a sibling die's runs at the sibling's power limit (or was carried from another
        # board of the chip by validation/derive_parts.py): that this part holds the same fraction of its own
        # datasheet peak under its own limit is assumed
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
    link = node.intra_node.collective_efficiency_fitted_on or _stated(node.intra_node.source)
    if "all_reduce" in laws and laws["all_reduce"].fitted_on:
        out["intra_node_collectives"] = laws["all_reduce"].fitted_on
        # the ring laws price the ring collectives; the link rate times collective_efficiency still prices sends,
        # all-to-alls and a cross-node collective's NVLink phase (simulator/cost/topology.py ``group_links``)
        out["intra_node_send_all_to_all"] = link
    else:  # the link rate times collective_efficiency prices every collective and send inside the node
        out["intra_node_collectives"] = link
    if scenario.num_gpus > node.domain_gpus:
        inter = node.inter_node_collectives or {}
        if "all_reduce" in inter and inter["all_reduce"].fitted_on:
            out["inter_node_collectives"] = inter["all_reduce"].fitted_on
        elif node.nic_fitted_on:  # the NIC model itself fitted on cross-node sweeps
            out["inter_node_collectives"] = node.nic_fitted_on
        else:
            out["inter_node_collectives"] = _stated(node.source)
    return out


def grouped_gemm_kernels(scenario: Scenario) -> list[dict]:
    """How an MoE run's expert GEMMs are priced on each accelerator of the run (empty without MoE): as one grouped
    kernel of the run's framework (``state`` calibrated: measured on the part; derived: from a sibling die, or
    carried from another recipe of the same die by validation/calibrate_microbench.py ``GROUPED_CARRY_RULE``; its
    ``level`` over the dense curve at one expert's shape, per-group cost, kernel and rows) or, where the part holds
    no grouped kernel of that framework, as dense GEMMs of one expert's shape (``state`` assumed), with the spec's
    reason where the kernel measured on another die is deliberately not carried to this one (``not_carried``, from
    ``grouped_gemm_not_carried``: torchtitan's ``torch._grouped_mm`` was measured on B200's sm100 build only, and
    Hopper does not carry its level). The parts that hold a grouped kernel of the framework in this precision are
    named (``parts_with_kernel``): a comparison between one of them and an assumed part sets a kernel priced from
    rows against an assumed one. ``clustersim simulate`` prints it; ``--json`` carries it as ``grouped_gemm``."""
    from hardware_specs.catalog import ACCELERATORS

    if getattr(scenario.model, "moe", None) is None:
        return []
    training = scenario.training
    key = RECIPE_CURVE[training.fp8_recipe] if training.precision == "fp8" else gemm_curve_key(scenario)
    out = []
    for i, group in enumerate(scenario.groups):
        accel = group.accelerator
        framework = scenario.frameworks[i].name if len(scenario.frameworks) > i else "megatron-core"
        measured = sorted(name for name, part in ACCELERATORS.all().items()
                          if key in part.efficiency.grouped_gemm and framework in part.efficiency.grouped_gemm[key].frameworks)
        entry = accel.efficiency.grouped_gemm.get(key)
        row = {"accelerator": accel.name, "framework": framework, "precision": key, "parts_with_kernel": measured}
        if entry is None:
            # the same framework's grouped kernels of this part in other precisions / recipes (a recipe comparison)
            others = sorted(k for k, e in accel.efficiency.grouped_gemm.items() if framework in e.frameworks)
            reason = accel.efficiency.grouped_gemm_not_carried.get(framework)
            if reason:
                row["not_carried"] = reason
            row.update(state=ASSUMED, note=(
                f"no {framework} grouped-GEMM kernel was measured on {accel.name} in {key} or carried to it: the "
                f"experts run as dense GEMMs of one expert's shape (assumed)"
                + (f" -- not carried here: {reason}" if reason else "") + (
                    f"; beside {', '.join(measured)} (grouped kernel measured there or carried from it) a comparison "
                    "sets a measured kernel against an assumed one" if measured else "") + (
                    f"; this part's {framework} experts in {', '.join(others)} run a grouped kernel priced from rows: "
                    f"a comparison of {key} with those sets an assumed kernel against a priced one" if others else "")))
        else:
            state, source = provenance_state(entry.fitted_on or ASSUMED)
            extra = f", quantisation at {entry.quantise_efficiency:g} of the memory-bound rate" \
                if entry.quantise_efficiency else ""
            row.update(state=state, kernel=entry.kernel, level=entry.level, per_group_us=entry.per_group_us,
                       quantise_efficiency=entry.quantise_efficiency, fitted_on=entry.fitted_on, note=(
                           f"{entry.kernel}: {entry.level:g} of the dense curve at one expert's shape, "
                           f"+{entry.per_group_us:g} us per expert{extra} ({state}"
                           + (f": {source}" if source else "") + f"; {entry.fitted_on})"
                           + ("; carried by rule, not measured here: beside the part it was measured on a "
                              "comparison sets the kernel against itself, as good as the rule (its source)"
                              if state == DERIVED else "")
                           + f"; a part with no {framework} grouped kernel in {key} runs the experts as dense GEMMs "
                           "(assumed): beside one of them a comparison sets this kernel against an assumed one"))
        out.append(row)
    return out


def framework_provenance(choice: FrameworkChoice) -> str:
    """``training.framework``'s factors: the rows they were fitted on, marked where carried over from
    another part or precision, or assumed (the catalog constants stand in)."""
    entry = choice.entry
    if entry is None:
        return ASSUMED
    if choice.state == CALIBRATED:
        return entry.fitted_on
    if choice.across_kinds:
        return (f"{entry.fitted_on} (carried across network kinds from {choice.name} {entry.accelerator} "
                f"{'/'.join(entry.precisions)}: {choice.across_kinds})")
    return f"{entry.fitted_on} (carried over from {choice.name} {entry.accelerator} {'/'.join(entry.precisions)})"


def _has_grouped_convolutions(model) -> bool:
    """A catalog network with grouped or depthwise convolutions (ResNeXt's ``groups``, EfficientNet's
    MBConv), whose direct-kernel bandwidth is then part of the result; read off the spec, no graph built."""
    return getattr(model, "family", None) == "efficientnet" or getattr(model, "groups", 1) > 1


def conv_provenance(eff, key: str, gemm: str) -> str:
    """The provenance of a run's convolution passes in curve ``key``: the spec's convolution model for that
    precision where it has one (``conv_efficiency[key]``, by shape: simulator/cost/conv.py), else the rule the
    compute model applies (simulator/cost/compute.py ``ComputeModel.time_s``): each pass priced as the implicit
    GEMM it is (Chetlur et al. 2014, Sec. 3) on the part's ``key`` GEMM curve, whose rows are GEMMs, not
    convolutions. No 16-bit or FP8 convolution is measured anywhere in this project (the only convolution model
    is TF32, fitted on DeepPool's A100 layers), so such a run's convolutions are *derived* by that rule, or
    *assumed* where the GEMM curve itself is."""
    if key in eff.conv_efficiency and not key.startswith("fp8"):
        return eff.conv_efficiency[key].fitted_on or ASSUMED
    if gemm == ASSUMED:
        return ASSUMED
    return (f"no {key} convolution measured on any part: each convolution pass priced as its implicit GEMM "
            f"(Chetlur et al. 2014, Sec. 3) on this part's {key} GEMM curve, fitted on GEMMs ({gemm}) "
            f"(derived: convolutions on the {key} GEMM curve)")


def block_scaled_rule(curve: str, peak: str) -> str:
    """The provenance of a block-scaled recipe's GEMM priced by rule: ``curve``'s measured fraction of its own
    peak at the GEMM's shape, times the part's datasheet ``peak`` of the recipe's element type."""
    return (f"the {curve} GEMM curve's fraction of peak at the same shape x the datasheet {peak} peak "
            f"(derived: the {curve} curve's fraction of peak on the {peak} peak)")


def _stated(source: str) -> str:
    """A hand-written spec's provenance: "assumed" where its source says a figure is assumed."""
    return ASSUMED if "assum" in source.lower() else f"{_STATED_PREFIX}{source}"


def assumed_components(provenance: dict[str, str]) -> list[str]:
    return [name for name, where in provenance.items() if where == ASSUMED]


def provenance_state(where: str) -> tuple[str, str]:
    """(state, from what) for one provenance entry: ``("derived", "b200 x 1.00 (sibling level)")``,
    ``("derived", "bf16 x 0.958")``, ``("stated", "")`` (the source is the entry itself),
    ``("calibrated", "")`` or ``("assumed", "")``."""
    if where == ASSUMED:
        return ASSUMED, ""
    if where.startswith(_STATED_PREFIX):
        return STATED, ""
    if match := _CONV_RULE.search(where):  # before the markers the embedded GEMM provenance may hold
        return DERIVED, (f"the {match.group(1)} GEMM curve at each convolution's implicit-GEMM shape; no "
                         f"{match.group(1)} convolution measured")
    if match := _SIBLING.search(where):
        return DERIVED, f"{match.group(1)} x 1.00 (its fraction of peak; no row on this part)"
    if match := _RATIO.search(where):
        return DERIVED, f"{match.group(1)} x {match.group(2)}"
    if match := _TRANSFER.search(where):
        return DERIVED, f"{match.group(1)} x 1.00 (transferred; not measured on this node)"
    if match := _KINDS.search(where):
        return DERIVED, f"{match.group(1)} (carried across network kinds)"
    if match := _CARRIED.search(where):
        return DERIVED, f"{match.group(1)} (carried over; not measured on this part or precision)"
    if match := _PEAK_RULE.search(where):
        return DERIVED, (f"{match.group(1)} curve by rule (its fraction of peak at the same shape, on the datasheet "
                         f"{match.group(2)} peak)")
    if match := _RULE.search(where):
        return DERIVED, f"{match.group(1)} by rule (the same fraction of this part's own ceiling; the spec's source)"
    return CALIBRATED, ""


def efficiency_states(provenance: dict[str, str]) -> dict[str, str]:
    """Component -> "calibrated", "derived: <from what>", "stated" or "assumed" (what the output prints)."""
    out = {}
    for name, where in provenance.items():
        state, source = provenance_state(where)
        out[name] = f"{state}: {source}" if source else state
    return out


def framework_setting_warnings(scenario: Scenario) -> list[str]:
    """``training.framework``'s factors were fitted on runs with the framework's own settings (the profile's
    ``fitted_with``): a run set otherwise is described by factors of another configuration; said in words."""
    from hardware_specs.framework import framework_profile

    if not scenario.frameworks or scenario.frameworks[0].state == DEFAULT:
        return []
    profile = framework_profile(scenario.frameworks[0].name)
    differ = []
    for key, fitted in profile.fitted_with.items():
        if not _SETTING_APPLIES.get(key, lambda _: True)(scenario):
            continue
        section, name = key.split(".")
        value = getattr(scenario.parallelism if section == "parallelism" else scenario.training, name, fitted)
        if value != fitted:
            differ.append(f"{key}={_shown(value)} (fitted with {_shown(fitted)})")
    if not differ:
        return []
    return [f"training.framework={profile.name}: its factors were fitted on runs set as {profile.name} runs; this one "
            f"differs in {', '.join(differ)}"]


#: Settings that change nothing in some runs (no CP, no TP, bf16 ...): not warned about there.
_SETTING_APPLIES = {
    "parallelism.cp_comm": lambda sc: sc.parallelism.cp > 1,
    "parallelism.tp_overlap": lambda sc: sc.parallelism.tp > 1 and sc.parallelism.tp_comm_overlap,
    "parallelism.overlap_tp_grad_comm": lambda sc: sc.parallelism.tp > 1,
    "parallelism.zero3_backward_prefetch": lambda sc: sc.parallelism.zero_stage == 3,
    "parallelism.zero_buffer_copies": lambda sc: sc.parallelism.zero_stage >= 2,
    "parallelism.ddp_bucket_copies": lambda sc: sc.parallelism.zero_stage == 0 and sc.parallelism.dp > 1,
    "parallelism.overlap_grad_reduce": lambda sc: sc.parallelism.dp > 1,
    "training.fp8_saved_inputs": lambda sc: sc.training.precision == "fp8",
}


def _shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def kernel_warnings(scenario: Scenario) -> list[str]:
    """What the run prices on a kernel nobody measured on this part, said in words (``clustersim simulate``
    prints them; ``--json`` carries ``warnings``): an FP8 recipe whose own GEMM curve the spec lacks runs
    on the per-tensor fp8 curve (a block-scaled one, MXFP8 / NVFP4, by a derived rule instead: no warning)."""
    if scenario.mixed:
        return [w for group in scenario.groups for w in kernel_warnings(
            dataclasses.replace(scenario, node=group.node, accelerator=group.accelerator, node_groups=()))]
    training, accel = scenario.training, scenario.accelerator
    recipe = training.fp8_recipe
    if training.precision != "fp8" or recipe in ("delayed", "current") or recipe in BLOCK_SCALED_PEAK or \
            fp8_curve_key(accel, recipe) != "fp8":
        return []
    kernel = f" (the kernel exists: {BLOCKWISE_FP8_KERNELS[accel.name]})" if recipe == "blockwise" and \
        accel.name in BLOCKWISE_FP8_KERNELS else ""
    return [f"training.fp8_recipe={recipe}: no {recipe} GEMM was measured on {accel.name}{kernel}; its GEMMs "
            f"are priced on the per-tensor fp8 curve plus the recipe's scaling traffic (gemm_{recipe}: assumed)"]


def network_field_notes(scenario: Scenario) -> list[tuple[str, str]]:
    """(field, warning) for each training setting a layer-graph network (CNN, BERT, ViT, an imported or
    profiled model: not a decoder transformer) does not act on as asked, said in words rather than printed
    as if applied (``clustersim simulate`` prints the warnings; ``--json`` carries them in ``warnings`` and
    the fields in ``training_fields_not_applied``):

    - ``training.precision``: fp8 where no GEMM of the model is in ``training.fp8_gemms`` (the step is priced
      in bf16, bit for bit), or where some are but the graph has convolutions (they stay in bf16: no FP8
      convolution is measured on any part, and Transformer Engine runs none);
    - ``training.attention`` where the graph fixes its attention kernel as the model's own code runs it
      (Swin's window attention, an einsum: eager whatever the field); BERT, ViT and an imported
      ``nn.MultiheadAttention`` follow the field (workloads/networks/builder.py ``attention_kernel``);
    - ``training.unfused_eager_kernels`` set false where the graph has bias gradients: a network runs them
      as separate reductions, as its PyTorch code does (the gradient-accumulation add follows the field);
    - ``training.elementwise_kernels: eager``: it expands RMSNorm, SwiGLU and RoPE, which no network graph
      has (its LayerNorm, BatchNorm and activations are one PyTorch kernel each either way);
    - ``training.fused_cross_entropy`` where the graph has no cross-entropy layer (a CNN's or ViT's loss is
      left out of its graph).

    Acted on (no note): ``training.fp8_gemms`` and ``fp8_recipe`` on BERT's and ViT's tagged linears,
    ``training.fp8_saved_inputs`` (their saved inputs quantized), ``training.attention`` on their
    self-attention, ``training.fused_cross_entropy`` on a graph's loss (workloads/networks/builder.py)."""
    if scenario.mixed:
        notes = [n for group in scenario.groups for n in network_field_notes(
            dataclasses.replace(scenario, node=group.node, accelerator=group.accelerator, node_groups=()))]
        return list(dict.fromkeys(notes))
    from workloads.schema import TransformerSpec

    training, model = scenario.training, scenario.model
    if isinstance(model, TransformerSpec):
        return []
    name = getattr(model, "name", None) or "this model"
    features = graph_features(model)
    out: list[tuple[str, str]] = []
    fp8_classes = sorted((features.gemm_classes or frozenset()) & set(training.fp8_gemms))
    if runs_no_fp8_gemm(scenario):
        out.append(("training.precision",
            f"precision fp8: no GEMM of {name} runs in FP8 -- training.fp8_gemms {sorted(training.fp8_gemms)} "
            f"names GEMM classes its layer graph does not tag ({'its convolutions: Transformer Engine runs none in FP8 and no FP8 convolution is measured; ' if features.convolution else ''}"
            f"its linears carry no class: a classifier, or an imported model's whose role is not known): every "
            f"GEMM is priced on the bf16 curve with 16-bit activations, the step is a bf16 step (precision "
            f"priced: bf16)"))
    elif training.precision == "fp8" and features.convolution:
        out.append(("training.precision",
            f"precision fp8: {name}'s convolutions run in bf16 (conv_bf16: Transformer Engine runs no convolution "
            f"in FP8 and no FP8 convolution is measured on any part); its GEMMs of class {fp8_classes} run in FP8"))
    fixed = features.fixed_attention
    if fixed == "eager" and training.attention == "flash":
        out.append(("training.attention",
            f"training.attention=flash is not applied to {name}: its layer graph runs the model's own eager "
            "attention (scores, softmax and the weighted sum as separate kernels, the scores materialised and "
            "saved), priced so (attention_efficiency_factor); the field acts on decoder transformers and on "
            "BERT's, ViT's and nn.MultiheadAttention's self-attention"))
    elif fixed == "fused" and training.attention == "standard":
        out.append(("training.attention",
            f"training.attention=standard is not applied to {name}: its layer graph runs the model's fused "
            "scaled-dot-product attention kernel (no scores saved), priced as such; the field acts on decoder "
            "transformers and on BERT's, ViT's and nn.MultiheadAttention's self-attention"))
    if "unfused_eager_kernels" in training.model_fields_set and not training.unfused_eager_kernels \
            and features.bias_grad_kernels:
        out.append(("training.unfused_eager_kernels",
            f"training.unfused_eager_kernels=false is not applied to {name}'s bias gradients: its layer graph "
            "runs each as its own reduction of the output gradient, as the model's PyTorch code does (the "
            "gradient-accumulation add does follow the field)"))
    if training.elementwise_kernels == "eager":
        out.append(("training.elementwise_kernels",
            f"training.elementwise_kernels=eager has nothing to act on in {name}: it expands RMSNorm, SwiGLU "
            "and RoPE into PyTorch's composite kernels, and the layer graph has none of them (its norms and "
            "activations run one PyTorch kernel each either way)"))
    if training.fused_cross_entropy and not features.cross_entropy:
        out.append(("training.fused_cross_entropy",
            f"training.fused_cross_entropy has nothing to act on in {name}: its layer graph has no cross-entropy "
            "layer (the classifier's loss is left out of it)"))
    return out


def network_field_warnings(scenario: Scenario) -> list[str]:
    """The warnings of :func:`network_field_notes`."""
    return [warning for _, warning in network_field_notes(scenario)]


def network_fields_not_applied(scenario: Scenario) -> list[str]:
    """The training fields :func:`network_field_notes` names, once each (``--json``
    ``training_fields_not_applied``)."""
    return list(dict.fromkeys(field for field, _ in network_field_notes(scenario)))


#: Parallelism fields that act only on a model with routed experts (workloads/graph.py ``_moe_block``).
MOE_ONLY_FIELDS = ("etp", "moe_load_imbalance", "overlap_moe_comm", "moe_dispatch")


def moe_field_notes(scenario: Scenario) -> list[str]:
    """MoE-only ``parallelism`` fields (:data:`MOE_ONLY_FIELDS`) written for a model without experts: accepted and
    changing nothing (no expert GEMM, dispatch or combine to act on), said rather than left silent (a NOTE:
    nothing is mispriced). ``parallelism.ep`` > 1 on such a model is already an error. A field written at its
    default value is not noted: it changes no model's step, and search, scale and the planners write every
    field of the scenario's ``parallelism`` into each layout they try (so a dense search is not told on
    every layout about fields its user never wrote)."""
    if getattr(scenario.model, "is_moe", False):
        return []
    par = scenario.parallelism
    given = [f"parallelism.{name}" for name in MOE_ONLY_FIELDS
             if name in par.model_fields_set and getattr(par, name) != type(par).model_fields[name].default]
    if not given:
        return []
    name = getattr(scenario.model, "name", None) or "this model"
    return [f"{', '.join(given)} {'acts' if len(given) == 1 else 'act'} only on a mixture-of-experts model; {name} "
            "has no experts, so the step does not change"]
