"""The README table of ``training.framework``: framework x accelerator x precision, the profile entry a user
gets there (calibrated, derived, assumed) and the held-out error as a user gets it, beside the catalog
constants alone; then what a user gets on the parts no row of the framework ran on (Blackwell, H200,
AMD), from the shipped profiles alone (nothing simulated).

``python -m validation.modern --framework-table`` prints both as Markdown.
"""

from __future__ import annotations

import statistics
from typing import Any

#: The sets whose rows a user describes by naming a framework (the CNN sets' constants are per benchmark).
FRAMEWORK_SETS = ("nemo", "torchtitan", "llmfoundry", "other", "vtrain_single", "vtrain_multi")
#: Parts the table states the choice on without rows: what a user buying today asks about.
UNMEASURED_PARTS = ("h200-sxm-141g", "b200", "gb200", "b300", "mi300x", "mi355x")


def _pct(errors: list[float]) -> str:
    if not errors:
        return "-"
    absolute = [abs(e) for e in errors]
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
    from hardware_specs.framework import framework_names
    from simulator.cost.framework import choose

    lines = ["| framework | " + " | ".join(UNMEASURED_PARTS) + " |", "|---|" + "---|" * len(UNMEASURED_PARTS)]
    for name in framework_names()[1:]:
        cells = []
        for part in UNMEASURED_PARTS:
            accelerator = ACCELERATORS.get(part)
            shown = []
            for precision in ("bf16", "fp8"):
                if precision not in accelerator.peak_tflops:
                    continue
                choice = choose(name, accelerator, precision)
                source = (f" ({choice.entry.accelerator} {'/'.join(choice.entry.precisions)})"
                          if choice.entry is not None and choice.entry.accelerator != part else "")
                shown.append(f"{precision} {choice.state}{source}")
            cells.append("; ".join(shown))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
