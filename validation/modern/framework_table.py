"""The table of ``training.framework``: framework x accelerator x precision, the profile entry a user
gets there (calibrated, derived, assumed) and the held-out error as a user gets it, beside the catalog
constants alone; then what a user gets on the parts no row of the framework ran on (Blackwell, H200,
AMD), from the shipped profiles alone (nothing simulated).

A third table checks the carry-over rule itself (simulator/cost/framework.py): each held-out row of a
framework on a part that framework has an entry for, predicted as if that part had never been measured
(its entries removed: the rule then carries another part's, or the catalog stands in). That is what a
user of the same framework on an unmeasured part (a B200) is told is *derived*, tried where the answer
is known.

``python -m validation.modern --framework-table`` prints the three as Markdown.
"""

from __future__ import annotations

import statistics
from typing import Any

#: The sets whose rows a user describes by naming a framework (the CNN benchmarks' too: dle-pytorch, dle-mxnet,
#: lambda-pytorch).
FRAMEWORK_SETS = ("nemo", "torchtitan", "llmfoundry", "other", "vtrain_single", "vtrain_multi", "cnn_dle", "cnn_lambda")
#: Parts the table states the choice on without rows: what a user buying today asks about.
UNMEASURED_PARTS = ("h200-sxm-141g", "b200", "gb200", "b300", "mi300x", "mi355x")


def _pct(errors: list[float | None]) -> str:
    absolute = [abs(e) for e in errors if e is not None]
    if not absolute:
        return "-"
    return f"{100 * statistics.median(absolute):.1f} / {100 * max(absolute):.1f}%"


def heldout_rows(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (framework, accelerator, precision, state) of the reports' held-out cases (set-aside rows
    left out, as in the set figures): the errors as a user gets them and with the catalog constants alone."""
    cells: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for block in blocks:
        catalog = {c["row"]: c["relative_error"] for c in block["catalog_only"]["cases"]}
        accelerator = {c["row"]: (c["accelerator"], c["precision"]) for c in block["cases"]}
        for case in block["user_profile"]["cases"]:
            part, precision = accelerator[case["row"]]
            key = (case["framework"], part, precision, case["state"])
            cell = cells.setdefault(key, {"sets": set(), "user": [], "catalog": [], "entry": case["entry"], "oom": 0})
            cell["sets"].add(block["case_set"])
            if case["relative_error"] is not None:
                cell["user"].append(case["relative_error"])
                cell["oom"] += not case["fits"]
            if catalog.get(case["row"]) is not None:
                cell["catalog"].append(catalog[case["row"]])
    return [{"framework": k[0], "accelerator": k[1], "precision": k[2], "state": k[3], **v}
            for k, v in sorted(cells.items())]


def markdown(blocks: list[dict[str, Any]]) -> str:
    lines = ["| framework | accelerator (rows ran on) | precision | profile entry used | held-out rows | "
             "as a user gets it: median / max |error| | catalog constants only |",
             "|---|---|---|---|---|---|---|"]
    for r in heldout_rows(blocks):
        entry = "catalog" if r["entry"] == "catalog" else f"{r['entry']}"
        oom = f" ({r['oom']} predicted OOM)" if r["oom"] else ""
        lines.append(f"| {r['framework']} | {r['accelerator']} | {r['precision']} | {r['state']}: {entry} | "
                     f"{len(r['user'])} ({', '.join(sorted(r['sets']))}) | {_pct(r['user'])}{oom} | {_pct(r['catalog'])} |")
    return "\n".join(lines)


def unmeasured_markdown() -> str:
    """What each shipped framework gives on parts none of its rows ran on, in bf16 and fp8."""
    from hardware_specs.catalog import ACCELERATORS
    from hardware_specs.framework import framework_names, framework_profile
    from simulator.cost.framework import choose
    from workloads.catalog import resolve_model

    lines = ["| framework | " + " | ".join(UNMEASURED_PARTS) + " |", "|---|" + "---|" * len(UNMEASURED_PARTS)]
    for name in framework_names()[1:]:
        networks = framework_profile(name).networks  # a CNN profile on its own network: only the part is carried
        model = resolve_model(networks[0]) if networks else None
        cells = []
        for part in UNMEASURED_PARTS:
            accelerator = ACCELERATORS.get(part)
            shown = []
            for precision in ("bf16", "fp8"):
                if precision not in accelerator.peak_tflops:
                    continue
                choice = choose(name, accelerator, precision, model=model)
                source = (f" ({choice.entry.accelerator} {'/'.join(choice.entry.precisions)})"
                          if choice.entry is not None and choice.entry.accelerator != part else "")
                shown.append(f"{precision} {choice.state}{source}")
            cells.append("; ".join(shown))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def leave_part_out(name: str, workers: int | None = 2) -> list[dict[str, Any]]:
    """Each held-out row (not set aside) of set ``name`` whose framework has an entry on the row's part,
    simulated with what the rule gives once that part's entries are removed: (row, framework, part, state,
    entry used, relative error, fits)."""
    import json

    from hardware_specs.catalog import ACCELERATORS
    from hardware_specs.framework import DEFAULT_FRAMEWORK, framework_profile
    from simulator.cost.framework import choose_in, precision_key
    from simulator.scenario import load_scenario
    from validation.modern.case import outcome
    from validation.modern.profiles import with_constants
    from validation.modern.registry import built, simulate_many, user_framework, user_scenario

    picked, raws = [], []
    part_of: dict[str, str] = {}
    for case in built(name)[0]:
        framework = user_framework(case)
        if not case.heldout or case.set_aside or framework == DEFAULT_FRAMEWORK:
            continue
        raw = user_scenario(case)
        node_key = json.dumps(raw["cluster"]["node"], sort_keys=True, default=str)
        if node_key not in part_of:
            part_of[node_key] = load_scenario(raw).accelerator.name
        accelerator = ACCELERATORS.get(part_of[node_key])
        profile = framework_profile(framework)
        others = [e for e in profile.entries if e.accelerator != accelerator.name]
        if len(others) == len(profile.entries):
            continue  # the part has no entry of its own: the user figure is already a carry-over (or the catalog)
        training = case.scenario["training"]
        choice = choose_in(profile.model_copy(update={"entries": others}), accelerator,
                           precision_key(training.get("precision", "bf16"), training.get("tf32", False)),
                           training.get("fp8_recipe", "delayed") if training.get("precision") == "fp8" else None)
        entry = f"{choice.entry.accelerator} {'/'.join(choice.entry.precisions)}" if choice.entry else "catalog"
        picked.append((case, framework, accelerator.name, choice.state, entry))
        raws.append(with_constants(case, choice.factors))
    results = simulate_many(raws, workers)
    return [{"row": case.row, "framework": framework, "part": part, "state": state, "entry": entry,
             "relative_error": outcome(case, result).relative_error, "fits": outcome(case, result).fits}
            for (case, framework, part, state, entry), result in zip(picked, results, strict=True)]


def carry_over_markdown(blocks: list[dict[str, Any]], checks: dict[str, list[dict[str, Any]]]) -> str:
    """Per framework and part: the held-out error with the part's own entry (as a user gets it) and
    without it (:func:`leave_part_out`), beside the catalog constants alone."""
    lines = ["| framework | part | held-out rows | own entry (as a user gets it) | without it: what the rule "
             "gives | its error | catalog constants only |", "|---|---|---|---|---|---|---|"]
    for block in blocks:
        own = {c["row"]: c["relative_error"] for c in block["user_profile"]["cases"]}
        catalog = {c["row"]: c["relative_error"] for c in block["catalog_only"]["cases"]}
        cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for check in checks.get(block["case_set"], []):
            cells.setdefault((check["framework"], check["part"], f"{check['state']}: {check['entry']}"),
                             []).append(check)
        for (framework, part, used), rows in sorted(cells.items()):
            errors = [r["relative_error"] for r in rows if r["relative_error"] is not None]
            lines.append(f"| {framework} | {part} | {len(errors)} | {_pct([own[r['row']] for r in rows])} | "
                         f"{used} | {_pct(errors)} | {_pct([catalog[r['row']] for r in rows])} |")
    return "\n".join(lines)
