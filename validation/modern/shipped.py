"""The framework profiles shipped in the package (hardware_specs/frameworks/*.yaml), made from the fitted
validation profiles (validation/profiles/modern-*.yaml).

``python -m validation.modern --fit --write`` writes both; ``--ship`` writes the shipped ones again from
the validation profiles on disk (no refit). tests/test_framework_profiles.py rebuilds them and compares
with the shipped files, so the two never drift. A fitted group ``framework|accelerator|precision``
becomes one entry of that framework's profile, keyed by the catalog accelerator a user names:

- groups of a framework no user names (the FlashAttention-2 paper's training script) stay validation-only,
  and so do the CNN groups whose rows fit another constant (DLE's EfficientNet groups: their one-GPU rows
  fit the direct-kernel bandwidth, their ``sync_jitter`` only describes those networks): ``dle-pytorch``
  is its ResNet-50 / ResNeXt-101 / SE-ResNeXt-101 groups, and a profile fitted on networks (not
  transformers) names them (``networks``);
- torchtitan's float8 *rowwise* group is the fp8 entry for ``training.fp8_recipe: rowwise`` (``fp8_recipes``);
- a group on a variant of a catalog part (torchtitan's Grand Teton H100s: 96 GB HBM2e at 500 W) is
  keyed by the catalog part with ``measured_on`` naming the variant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hardware_specs.framework import FACTOR_KEYS, FOLDER, HELDOUT_KEYS
from validation.modern.profiles import load_groups

#: framework name -> (validation profile, group prefix, description)
FRAMEWORKS: dict[str, tuple[str, str, str]] = {
    "nemo": ("nemo", "nemo", "NVIDIA NeMo / Megatron-Bridge: Megatron-Core with Transformer Engine, the "
                             "overlaps of its performance recipes"),
    "torchtitan": ("torchtitan", "torchtitan", "PyTorch torchtitan: FSDP2, DTensor TP (AsyncTP), torchao float8 "
                                               "(tensorwise; rowwise as training.fp8_recipe: rowwise), SDPA "
                                               "attention, torch.compile or eager"),
    "llm-foundry": ("llmfoundry", "llmfoundry", "MosaicML llm-foundry / Composer: PyTorch FSDP, MPT models with "
                                                "Triton FlashAttention, Transformer Engine FP8 (amp_fp8)"),
    "fms-fsdp": ("other", "fms-fsdp", "IBM foundation-model-stack fms-fsdp: PyTorch FSDP1, SDPA FlashAttention-2, "
                                      "eager (no torch.compile)"),
    "fms-fsdp-compile": ("other", "fms-fsdp-compile", "IBM fms-fsdp with torch.compile"),
    "megatron-deepspeed": ("vtrain", "megatron-deepspeed", "Megatron-DeepSpeed (eager PyTorch: a host time per "
                                                           "kernel, a tilted GEMM curve; vTrain's A100 runs)"),
    "dle-pytorch": ("cnn_dle", "dle-pytorch", "NVIDIA DeepLearningExamples PyTorch ConvNets (ResNet-50 v1.5, "
                                              "ResNeXt-101, SE-ResNeXt-101; DALI input, AMP with channels-last, "
                                              "DDP): a GEMM/convolution factor and the wait for the slowest rank "
                                              "(sync_jitter)"),
    "dle-mxnet": ("cnn_dle", "dle-mxnet", "NVIDIA DeepLearningExamples MXNet ResNet-50 v1.5 (DALI input, Horovod "
                                          "or KVStore all-reduce)"),
    "lambda-pytorch": ("cnn_lambda", "lambda-pytorch", "Lambda deeplearning-benchmark: its fork of DLE's PyTorch "
                                                       "ResNet-50 on Lambda's hosts; fp16 (AMP) runs by work beside "
                                                       "each convolution at the SMs' instruction rate "
                                                       "(conv_sm_cycles_per_byte: SM cycles per byte of a "
                                                       "convolution pass), TF32 runs by a GEMM/convolution factor"),
}

#: Group accelerator labels that name a variant of a catalog part: (catalog accelerator, the variant in words).
VARIANTS = {"h100-96g-500w": ("h100-sxm-80g", "H100 96 GB HBM2e at a 500 W limit (Meta Grand Teton; "
                                              "the catalog H100 SXM runs at 700 W)")}
#: The catalog node of such a board, where one is shipped (hardware_specs/nodes/grand-teton-h100.yaml is
#: validation/modern/torchtitan.py GRAND_TETON): a run on it gets the entry as calibrated.
VARIANT_NODES = {"h100-96g-500w": "grand-teton-h100"}

#: Group precision labels that stand for several precisions or for one FP8 recipe: (precisions, fp8 recipes).
PRECISIONS: dict[str, tuple[list[str], list[str] | None]] = {"fp8-rowwise": (["fp8"], ["rowwise"]),
                                                             "bf16+fp8": (["bf16", "fp8"], None)}

#: The scenario settings that describe how a framework runs (not the run's layout, batch or precision): a
#: profile records those every fit row of the framework shares (``fitted_with``).
FRAMEWORK_SETTINGS = (
    "parallelism.overlap_grad_reduce", "parallelism.overlap_param_gather", "parallelism.overlap_p2p_comm",
    "parallelism.overlap_tp_grad_comm", "parallelism.tp_overlap", "parallelism.cp_comm",
    "parallelism.zero3_backward_prefetch", "parallelism.zero_buffer_copies", "training.attention",
    "training.attention_kernel", "training.elementwise_kernels", "training.unfused_eager_kernels",
    "training.fp8_saved_inputs", "training.fused_cross_entropy", "training.param_dtype")


def _default(key: str):
    from simulator.scenario import TrainingSpec
    from simulator.strategies.spmd.layout import Parallelism

    section, name = key.split(".")
    return (Parallelism if section == "parallelism" else TrainingSpec).model_fields[name].default


def _setting(case, key: str):
    """The value a case's scenario runs with: given, else the schema's default."""
    section, name = key.split(".")
    given = case.scenario.get(section) or {}
    return given[name] if name in given else _default(key)


def fitted_with(profile: str, prefix: str) -> dict[str, Any]:
    """The framework's own settings: those every fit-half row of its fitted groups ran with, where that is
    not the scenario default (a default every row shares says nothing of the framework)."""
    from validation.modern.registry import SETS, built

    groups = load_groups(profile)
    cases = [c for s in SETS.values() if s.profile_name == profile and s.fitted for c in built(s.name)[0]
             if not c.heldout and not c.set_aside and c.profile_group in groups
             and c.profile_group.split("|")[0] == prefix]
    common: dict[str, Any] = {}
    for key in FRAMEWORK_SETTINGS:
        values = {repr(_setting(c, key)) for c in cases}
        if len(values) == 1 and _setting(cases[0], key) != _default(key):
            common[key] = _setting(cases[0], key)
    return common


ENTRY_KEYS = (*FACTOR_KEYS, "fit_cases", "fit_median_abs_error", *HELDOUT_KEYS)


def fitted_networks(profile: str, prefix: str) -> list[str] | None:
    """The catalog networks the framework's fitted groups were fitted on, where they are networks (CNNs ...),
    not transformers: a run of another network under the profile is told its factors were fitted elsewhere."""
    from validation.modern.registry import SETS, built
    from workloads.catalog import resolve_model
    from workloads.schema import TransformerSpec

    groups = load_groups(profile)
    models = {}
    for s in SETS.values():
        if s.profile_name != profile or not s.fitted:
            continue
        for c in built(s.name)[0]:
            if not c.heldout and not c.set_aside and c.profile_group in groups \
                    and c.profile_group.split("|")[0] == prefix:
                ref = c.scenario["model"]
                models[ref if isinstance(ref, str) else str(ref["name"])] = ref
    if not models or any(isinstance(resolve_model(ref), TransformerSpec) for ref in models.values()):
        return None
    return sorted(models)


def _profile_source(profile: str) -> str:
    from validation.modern.registry import SETS

    return "; ".join(f"{s.source} ({s.csv})" for s in SETS.values() if s.profile_name == profile and s.fitted)


def shipped_profiles() -> dict[str, dict[str, Any]]:
    """framework name -> the profile document (hardware_specs/framework.py FrameworkProfile)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (profile, prefix, description) in FRAMEWORKS.items():
        entries = []
        for group, fitted in load_groups(profile).items():
            framework, accelerator, precision = group.split("|")
            precisions, recipes = PRECISIONS.get(precision, ([precision], None))
            if framework != prefix:
                continue
            catalog, variant = VARIANTS.get(accelerator, (accelerator, None))
            entry: dict[str, Any] = {"accelerator": catalog, "precisions": precisions}
            if recipes:
                entry["fp8_recipes"] = recipes
            entry.update({k: fitted[k] for k in ENTRY_KEYS if fitted.get(k) is not None})
            if variant:
                entry["measured_on"] = variant
            if accelerator in VARIANT_NODES:
                entry["measured_on_node"] = VARIANT_NODES[accelerator]
            entry["fitted_on"] = fitted["fitted_on"]
            entries.append(entry)
        if entries:
            out[name] = {"name": name, "description": description, "source": _profile_source(profile),
                         "fitted_with": fitted_with(profile, prefix)}
            networks = fitted_networks(profile, prefix)
            if networks:
                out[name]["networks"] = networks
            out[name]["entries"] = entries
    return out


HEADER = ("# Written by `python -m validation.modern --fit --write` (or --ship) from validation/profiles/{profile};\n"
          "# do not edit by hand. Factors fitted on the fit half of the named rows only\n"
          "# (hardware_specs/framework.py says what each factor does).\n")


def render(name: str, doc: dict[str, Any]) -> str:
    return HEADER.format(profile=f"modern-{FRAMEWORKS[name][0]}.yaml") + yaml.safe_dump(doc, sort_keys=False, width=110)


def write_shipped(folder: Path = FOLDER) -> list[Path]:
    """Write every shipped profile (and remove a shipped file no fitted group backs any more)."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = shipped_profiles()
    paths = []
    for name, doc in docs.items():
        path = folder / f"{name}.yaml"
        path.write_text(render(name, doc))
        paths.append(path)
    for stale in folder.glob("*.yaml"):
        if stale.stem not in docs:
            stale.unlink()
    return paths
