"""What a run that names no ``training.framework`` is told: the default used and how far that default was
from held-out runs of named frameworks on the run's accelerator and model family.

Without ``training.framework`` a scenario runs as ``megatron-core``: the catalog constants (kernel
microbenchmarks; the rates Megatron-Core with Transformer Engine reaches), no framework factor
(simulator/cost/framework.py). Whether a real run reaches them depends on its framework: on held-out rows of
``python -m validation.modern`` predicted with these constants alone, NeMo's H100 rows are within a few per
cent, torchtitan's H100 rows come out about a third too fast, vTrain's Megatron-DeepSpeed A100 rows 37% and
Lambda's ResNet-50 rows 60% (session 9 audit, gap 3). So the output says, as a WARNING and under ``--json``'s
``default_framework``, which default was used and those held-out errors, per framework, for the run's
accelerator and model family, and the provenance block lists ``framework_factors`` as assumed.

The errors are data, not code: ``hardware_specs/frameworks/default_heldout.csv`` (:data:`SHIPPED`), one line
per held-out row, written by ``python -m validation.modern.default_framework --write`` (its docstring says how
they are simulated). Which rows a run is told about, in this order:

1. the rows that ran on the run's catalog accelerator (a variant board counts under its part), in the run's
   model family (``llm``: a decoder transformer; ``cnn``: any layer-graph network -- the held-out network rows
   are all CNNs, said so for a network without convolutions);
2. a part whose efficiency block was derived by rule from another (``derived_from``, the PCIe boards): that
   part's rows, named;
3. none on either: the family's rows on every part, said to be from other parts (a B200's predictions come from
   specs and microbenchmarks alone; what the same constants did on the measured parts is the evidence there is).

``--set training.framework=null`` unsets the field (simulator/scenario.py ``apply_overrides``), so it is told
the same as a file that leaves the field out; naming ``megatron-core`` is naming a framework: no warning.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from hardware_specs.framework import DEFAULT_FRAMEWORK, FOLDER

SHIPPED: Path = FOLDER / "default_heldout.csv"
#: Model families of the shipped rows.
LLM, CNN = "llm", "cnn"
#: What the default (``training.framework`` unset or ``megatron-core``) prices with, in words: ``--json``'s
#: ``default_framework.meaning`` and ``clustersim specs show megatron-core``.
DEFAULT_MEANING = ("the catalog constants: kernel microbenchmarks, the rates Megatron-Core with Transformer Engine "
                   "reaches; no framework factor")
FAMILY_WORDS = {LLM: "decoder-transformer runs", CNN: "CNN runs"}


@dataclass(frozen=True)
class HeldoutRow:
    """One held-out row predicted with the catalog constants alone."""

    set: str
    row: int
    framework: str         # the framework the row ran with (its fitted group's tag)
    accelerator: str       # the catalog part
    board: str             # the row's board (a variant of the part, or the part)
    family: str            # llm | cnn
    precision: str
    relative_error: float | None   # simulated rate / measured - 1; None: not simulated
    fits: bool


@cache
def _load(path: str) -> tuple[HeldoutRow, ...]:
    with open(path, newline="") as f:
        return tuple(HeldoutRow(r["set"], int(r["row"]), r["framework"], r["accelerator"], r["board"], r["family"],
                                r["precision"], float(r["relative_error"]) if r["relative_error"] else None,
                                r["fits"] == "1")
                     for r in csv.DictReader(f))


def load(path: Path = SHIPPED) -> tuple[HeldoutRow, ...]:
    return _load(str(path))


@dataclass(frozen=True)
class FrameworkSummary:
    """The catalog-only errors of one framework's held-out rows in a (part, family) cell: the figures both
    ``--json``'s ``by_framework`` entries (:meth:`as_dict`) and the WARNING's lines (:func:`framework_text`) are
    written from. ``source`` .. ``worst_error`` are filled by :func:`summaries` from the rows (a summary made
    without them is said by its median and max alone, :meth:`text`)."""

    framework: str
    rows: int
    median_error: float
    median_abs_error: float
    max_abs_error: float
    precisions: tuple[str, ...]
    sets: tuple[str, ...] = ()            # the validation sets the rows are from (``--case-set`` names)
    abs_error_p90: float | None = None    # 90th percentile of |error|, from :data:`P90_MIN_ROWS` rows
    worst_set: str | None = None          # the row of the largest |error|: its set, row and error
    worst_row: int | None = None
    worst_error: float | None = None

    @property
    def source(self) -> str:
        """Where the rows were published, in words (:data:`SOURCES`; else the sets' names)."""
        return SOURCES.get(self.framework) or "the rows of " + ", ".join(self.sets)

    @property
    def shipped_profile(self) -> bool:
        """Whether ``training.framework`` can name this framework (DLE's TensorFlow rows: no)."""
        from hardware_specs.framework import framework_names

        return self.framework in framework_names()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "framework": self.framework, "rows": self.rows, "precisions": list(self.precisions),
            "median_error": round(self.median_error, 5), "median_abs_error": round(self.median_abs_error, 5),
            "max_abs_error": round(self.max_abs_error, 5)}
        if self.worst_set is not None:
            out.update({"source": self.source, "sets": list(self.sets), "shipped_profile": self.shipped_profile,
                        "abs_error_p90": None if self.abs_error_p90 is None else round(self.abs_error_p90, 5),
                        "worst": {"set": self.worst_set, "row": self.worst_row,
                                  "relative_error": round(self.worst_error, 5)}})
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FrameworkSummary:
        """The summary back from :meth:`as_dict` (the WARNING is written from ``--json``'s block)."""
        worst = d.get("worst") or {}
        return cls(d["framework"], d["rows"], d["median_error"], d["median_abs_error"], d["max_abs_error"],
                   tuple(d["precisions"]), tuple(d.get("sets", ())), d.get("abs_error_p90"), worst.get("set"),
                   worst.get("row"), worst.get("relative_error"))

    def text(self) -> str:
        # a framework of the published rows that training.framework cannot name (DLE's TensorFlow rows) says so
        shipped = "" if self.shipped_profile else " (no shipped training.framework profile)"
        return (f"{self.framework}{shipped} n={self.rows} median {100 * self.median_error:+.1f}% "
                f"(max |error| {100 * self.max_abs_error:.1f}%)")


#: Precisions reported together: 16-bit mixed precision (BF16 or FP16 on the same tensor cores), FP8, 32-bit
#: (FP32 or TF32) -- a framework's loss differs between them (Lambda's ResNet-50 on H100: fp16 rows +98%, TF32 +15%
#: with the catalog alone), so a run is told its own group's rows where there are any.
PRECISION_GROUPS = {"bf16": "16-bit", "fp16": "16-bit", "fp8": "fp8", "fp32": "32-bit", "tf32": "32-bit"}


def summaries(rows: tuple[HeldoutRow, ...], part: str | None, family: str,
              precision_group: str | None = None) -> list[FrameworkSummary]:
    """Per framework (by name) the errors of its rows on ``part`` (None: every part) in ``family`` (and, given,
    in ``precision_group``: :data:`PRECISION_GROUPS`)."""
    by: dict[str, list[HeldoutRow]] = {}
    for r in rows:
        if r.family == family and (part is None or r.accelerator == part) and r.relative_error is not None and (
                precision_group is None or PRECISION_GROUPS.get(r.precision) == precision_group):
            by.setdefault(r.framework, []).append(r)
    out = []
    for framework, group in sorted(by.items()):
        errors = [r.relative_error for r in group]
        ordered = sorted(abs(e) for e in errors)
        worst = max(group, key=lambda r: abs(r.relative_error))
        p90 = ordered[math.ceil(0.9 * len(ordered)) - 1] if len(ordered) >= P90_MIN_ROWS else None
        out.append(FrameworkSummary(framework, len(group), statistics.median(errors),
                                    statistics.median(ordered), ordered[-1],
                                    tuple(sorted({r.precision for r in group})), tuple(sorted({r.set for r in group})),
                                    p90, worst.set, worst.row, worst.relative_error))
    return out


def framework_named(scenario) -> bool:
    """Whether the scenario names ``training.framework`` (written in the file or set by ``--set``; a ``--set`` of
    null unsets it)."""
    return "framework" in scenario.training.model_fields_set


def _calibrated_here(accelerator) -> bool:
    """An accelerator fitted by ``clustersim calibrate`` on the user's own machine (a ``cluster.profile``): its
    kernels are priced from that machine's microbenchmarks, not from the catalog constants the WARNING is about."""
    return str(getattr(accelerator.efficiency, "source", "") or "").startswith("clustersim calibrate")


def _family(model) -> str:
    from simulator.cost.framework import _network_name

    return LLM if _network_name(model) is None else CNN


def _has_convolution(model) -> bool:
    from simulator.cost.provenance import graph_features

    return graph_features(model).convolution


def _counts_no_kernel(model) -> bool:
    """A measured per-layer profile no layer of which counts a FLOP (its layer strings give no shapes: DAPPLE's
    bare block names; :func:`workloads.networks.profiles.uncounted_flops_note`'s "counted for no layer" case); a
    catalog or traced network never."""
    if getattr(model, "family", None) != "profile":
        return False
    from workloads.graph import ShardShape
    from workloads.layer_graph import FLOPS_KINDS

    try:
        graph = model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length or 1, flash_attention=True))
    except Exception:  # noqa: BLE001 - unknown: the cautious wording
        return True
    return not any(op.kind in FLOPS_KINDS and op.flops for layer in graph.layers for op in layer.forward)


def part_block(accelerator, model, precision: str, rows: tuple[HeldoutRow, ...]) -> dict[str, Any]:
    """What the default's held-out errors are for one accelerator, the run's model family and precision
    (``precision``: :func:`simulator.cost.framework.precision_key`), in the module docstring's order of parts;
    on each part the rows of the run's precision group where there are any, else every precision (said)."""
    family, group = _family(model), PRECISION_GROUPS.get(precision)
    candidates = [(accelerator.name, "this part")]
    if accelerator.derived_from:
        candidates.append((accelerator.derived_from, f"{accelerator.derived_from} (this part's efficiencies were "
                                                     "derived from it)"))
    candidates.append((None, "other parts (no held-out run on this part)"))
    part, where, precision_group, found = next(
        ((part, where, precision_group, found) for part, where in candidates for precision_group in (group, None)
         if (found := summaries(rows, part, family, precision_group))),
        (None, candidates[-1][1], None, []))
    parts = sorted({r.accelerator for r in rows if r.family == family and (part is None or r.accelerator == part)
                    and r.relative_error is not None and (precision_group is None
                                                          or PRECISION_GROUPS.get(r.precision) == precision_group)})
    block: dict[str, Any] = {"accelerator": accelerator.name, "family": family, "precision": precision,
                             "rows_precisions": precision_group or "all (none in this run's precision)",
                             "rows_from": where, "rows_on": parts, "by_framework": [s.as_dict() for s in found]}
    if family == CNN and not _has_convolution(model):
        # a measured profile whose layer strings give no shapes (DAPPLE's bare block names) counts no kernel:
        # whether it convolves is not known, so it is not called a network without convolution
        block["family_note"] = ("the held-out network rows are CNNs; "
                                + ("a measured profile names no kernels" if _counts_no_kernel(model)
                                   else "this network has no convolution"))
    return block


def default_framework_block(scenario) -> dict[str, Any] | None:
    """``--json``'s ``default_framework``: None where the scenario names a framework; else the default used and,
    per accelerator of the run, the catalog-only held-out errors of named frameworks' runs (:func:`part_block`)."""
    if framework_named(scenario) or all(_calibrated_here(group.accelerator) for group in scenario.groups):
        return None
    from simulator.cost.framework import precision_key

    rows = load()
    precision = precision_key(scenario.training.precision, scenario.training.tf32)
    seen: dict[str, Any] = {}
    for group in scenario.groups:
        if group.accelerator.name not in seen:
            seen[group.accelerator.name] = part_block(group.accelerator, scenario.model, precision, rows)
    from hardware_specs.framework import framework_names, framework_profile

    cnn = _family(scenario.model) == CNN  # the shipped profiles of the run's kind: fitted on networks or not
    return {"named": False, "used": DEFAULT_FRAMEWORK,
            "meaning": DEFAULT_MEANING,
            "heldout_catalog_only": list(seen.values()),
            "error_sign": "simulated rate / measured - 1: positive = predicted faster than the run measured",
            "fields": f"per framework: source (where its rows were published), sets (python -m validation.modern "
                      f"--case-set SET lists them), rows (held-out count), median_error, abs_error_p90 (90th "
                      f"percentile of |error|; null under {P90_MIN_ROWS} rows, where it is the worst row or one "
                      f"next to it), worst (the row of the largest |error|)",
            "shipped_profiles": [n for n in framework_names()
                                 if n != DEFAULT_FRAMEWORK and bool(framework_profile(n).networks) == cnn],
            "source": f"{SHIPPED.relative_to(FOLDER.parents[1])} (python -m validation.modern.default_framework)"}


#: Columns a line of the no-framework WARNING is wrapped at (the WARNING prefix and indents keep it under 110).
WIDTH = 96


def _wrapped(text: str, first: str = "", rest: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False)


#: Where each framework's held-out rows were published, in words (validation/modern/registry.py ``SETS`` has each
#: set's source and file; ``python -m validation.modern --case-set SET`` lists its rows): the WARNING names the
#: source, not the framework tag alone. A framework missing here is named by its sets' keys.
SOURCES = {
    "nemo": "NVIDIA's NeMo performance summary",
    "torchtitan": "torchtitan's published benchmarks",
    "llm-foundry": "MosaicML llm-foundry's MPT throughput table",
    "megatron-deepspeed": "vTrain's Megatron-DeepSpeed iteration times, MICRO 2024",
    "automodel": "NeMo AutoModel's published throughput",
    "deepspeed": "DeepSpeed's published throughput",
    "fa2-paper": "the FlashAttention-2 paper's GPT training rows",
    "fms-fsdp": "IBM fms-fsdp's published throughput",
    "fms-fsdp-compile": "IBM fms-fsdp's published throughput with torch.compile",
    "dle-pytorch": "NVIDIA DeepLearningExamples' CNN throughput, PyTorch",
    "dle-mxnet": "NVIDIA DeepLearningExamples' CNN throughput, MXNet",
    "dle-paddlepaddle": "NVIDIA DeepLearningExamples' CNN throughput, PaddlePaddle",
    "dle-tf1-xla": "NVIDIA DeepLearningExamples' CNN throughput, TensorFlow 1 XLA",
    "lambda-pytorch": "Lambda's ResNet-50 benchmarks, DLE PyTorch",
}
#: From this many rows a framework's line gives the 90th percentile of |error| beside the worst row: the worst
#: of many rows is one layout (vTrain's 766 A100 rows: +580% is h 1024 at tp 8, micro-batch 1, where the eager
#: host dispatch the catalog constants leave out is most of the step; 9 in 10 rows are within 248%); with fewer
#: rows the 90th percentile is the worst row or one of the two next to it (DLE PyTorch's 17 16-bit rows: 53.6%
#: beside 54.5%), so it is left out.
P90_MIN_ROWS = 20


def framework_text(summary: FrameworkSummary) -> str:
    """One framework's held-out figures in words, from the same summary ``--json``'s ``by_framework`` entry is
    (:meth:`FrameworkSummary.as_dict`): where the rows were published, how many, the median signed error, the
    90th percentile of |error| (from :data:`P90_MIN_ROWS` rows) and the worst row, named by its set and row so
    ``python -m validation.modern --case-set SET`` finds it. A summary without its worst row: its median and max
    alone (:meth:`FrameworkSummary.text`)."""
    if summary.worst_set is None or summary.worst_error is None:
        return summary.text()
    shipped = "" if summary.shipped_profile else ", no shipped training.framework profile"
    worst = f"{100 * summary.worst_error:+.1f}% ({summary.worst_set} row {summary.worst_row})"
    if summary.rows == 1:
        return f"{summary.framework} ({summary.source}{shipped}): 1 held-out row, {worst}"
    spread = "" if summary.abs_error_p90 is None else f", 9 in 10 within \u00b1{100 * summary.abs_error_p90:.0f}%"
    return (f"{summary.framework} ({summary.source}{shipped}): {summary.rows} held-out rows, median "
            f"{100 * summary.median_error:+.1f}%{spread}, worst {worst}")


def default_framework_warning(block: dict[str, Any], framework_line_shown: bool = False) -> str:
    """The WARNING of :func:`default_framework_block`, in lines (``\\n``): what was used and what to name instead;
    then, for each accelerator of the run, which rows it is told about and, per framework of them, where they were
    published and their errors (:func:`framework_text`, wrapped to two lines).
    :func:`simulator.report.messages.message_lines` indents the lines after the first under the WARNING (it was
    one line of 900-2,100 characters until session 11). ``framework_line_shown``: printed under
    ``clustersim simulate``'s table, whose ``framework`` line already says what the default is (and, for a
    network, which profiles were fitted on which networks): the WARNING then leaves that out and adds only the
    profiles to name (a transformer) and the held-out errors; ``--json`` and the other commands carry the
    whole text."""
    names = f"(training.framework: {', '.join(block['shipped_profiles'])})"
    if not framework_line_shown:
        lead = (f"no training.framework named: priced as {block['used']} ({block['meaning']}). Name the run's "
                f"framework for its fitted factors {names}.")
    elif all(p["family"] == CNN for p in block["heldout_catalog_only"]):  # the line lists them by network
        lead = f"no training.framework named: priced as {block['used']}, as the framework line says."
    else:
        lead = (f"no training.framework named: priced as {block['used']}, as the framework line says; name the "
                f"run's framework for its fitted factors {names}.")
    lines = _wrapped(
        f"{lead} How far {block['used']} was from published runs of named frameworks, predicted with these "
        "constants alone, on held-out rows of `python -m validation.modern` (error: simulated/measured rate - 1; "
        "positive: predicted too fast):")
    for p in block["heldout_catalog_only"]:
        on = "" if p["rows_from"] == "this part" else f", from {p['rows_from']}: {', '.join(p['rows_on'])}"
        note = f" ({p['family_note']})" if p.get("family_note") else ""
        precisions = f"{p['rows_precisions']} " if p["rows_precisions"] in PRECISION_GROUPS.values() else ""
        lines += _wrapped(f"{precisions}{FAMILY_WORDS[p['family']]} on {p['accelerator']}{on}{note}:", "- ", "  ")
        summaries_ = [FrameworkSummary.from_dict(s) for s in p["by_framework"]]
        for s in summaries_:
            lines += _wrapped(framework_text(s), "    ", "      ")
        if not summaries_:
            lines.append("    none")
    return "\n".join(lines)
