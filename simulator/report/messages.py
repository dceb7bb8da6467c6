"""The WARNINGs and NOTEs a run's figures come with, collected in one place for every command.

``clustersim simulate`` prints them under its table (and ``--json`` carries ``warnings`` and ``notes``);
``search``, ``sweep``, ``scale``, ``plan`` and ``compare`` report simulated figures of the same scenarios,
so they say the same things: each simulated point carries its own lists (:func:`scenario_messages`, added
to the point's row by :func:`simulator.simulate.simulate_point` with ``messages=True``), and the command
prints each distinct message once (:func:`distinct_messages`, :func:`message_lines`), not once per layout
or point. What each message says and why is documented where it is produced:

- :func:`simulator.cost.provenance.kernel_warnings`: an FP8 recipe priced on a curve nobody measured;
- :func:`simulator.cost.provenance.framework_setting_warnings`: a run set otherwise than the runs its
  ``training.framework`` factors were fitted on;
- :func:`simulator.cost.provenance.network_field_warnings`: training fields a layer-graph network does
  not act on (fp8 priced as bf16, a fixed attention kernel);
- :func:`simulator.cost.default_framework.default_framework_warning`: no ``training.framework`` named,
  with the held-out errors of the named frameworks on the run's part;
- :func:`simulator.strategies.optimizer_fusion.accumulation_notes` and
  :func:`simulator.cost.provenance.moe_field_notes`: settings accepted and changing nothing (NOTEs);
- :func:`nvlink_domain_notes`: a layout's TP/CP/EP groups that straddle two NVLink domains of a GB200/GB300
  NVL72 cluster, and ``cluster.gpus_used_per_nvlink_domain`` where set (NOTEs);
- :func:`workloads.networks.profiles.profile_flops_notes`: a measured profile's layers whose FLOPs count 0
  (their lines give no shapes), so TFLOP/s and MFU are a lower bound (a NOTE).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def scenario_messages(scenario) -> dict[str, Any]:
    """``warnings`` and ``notes`` (lists of text, in the order ``clustersim simulate`` prints them) of a
    loaded scenario, and ``default_framework`` (the held-out block behind the no-framework WARNING, None
    when a framework is named)."""
    from simulator.cost.default_framework import default_framework_block, default_framework_warning
    from simulator.cost.provenance import (
        framework_setting_warnings,
        kernel_warnings,
        moe_field_notes,
        network_field_warnings,
    )
    from simulator.strategies.optimizer_fusion import accumulation_notes

    warnings = kernel_warnings(scenario) + framework_setting_warnings(scenario) + network_field_warnings(scenario)
    default = default_framework_block(scenario)  # no training.framework named: how far off the named ones are
    if default is not None:
        warnings.append(default_framework_warning(default))
    # optimizer fusion accepted but changing no memory; MoE-only fields on a model without experts; a
    # measured profile's layers whose lines give no shapes (their FLOPs count 0)
    notes = accumulation_notes(scenario) + moe_field_notes(scenario) + nvlink_domain_notes(scenario)
    if getattr(scenario.model, "family", None) == "profile":  # the network builder loads only for a profile
        from workloads.networks.profiles import profile_flops_notes

        notes += profile_flops_notes(scenario)
    return {"warnings": warnings, "notes": notes, "default_framework": default}


def nvlink_domain_notes(scenario) -> list[str]:
    """Where the node's NVLink domain spans several nodes (GB200/GB300 NVL72): what
    ``cluster.gpus_used_per_nvlink_domain`` set, and the TP/CP/EP groups that straddle two domains with the
    value that keeps them inside one (:func:`simulator.cost.topology.placement_note`; counted, not simulated)."""
    from simulator.cost.topology import placement_note

    notes = []
    use = getattr(scenario, "nvlink_domain_use", None)
    if use:
        used, physical = use
        node, per_node = scenario.node, scenario.node.gpus_per_node
        domains = -(-scenario.num_gpus // used)
        if used == physical:
            notes.append(f"cluster.gpus_used_per_nvlink_domain {used}: ranks fill each {physical}-GPU NVLink domain "
                         f"whole, in order, as when the field is left out: {scenario.num_gpus:,} GPUs over {domains:,} "
                         "domains")
        else:
            notes.append(f"cluster.gpus_used_per_nvlink_domain {used}: ranks fill {used} of each {physical}-GPU "
                         f"NVLink domain ({used // per_node} of its {physical // per_node} {node.name} nodes), then "
                         f"the next: {scenario.num_gpus:,} GPUs over {domains:,} domains; the other {physical - used} "
                         "GPUs of each are not the job's (not in its GPU count, cost or power)")
    said = placement_note(scenario, *(use or (None, None)))
    return notes + ([said] if said else [])


def distinct_messages(rows: Iterable[dict[str, Any] | None]) -> tuple[list[str], list[str]]:
    """The distinct ``warnings`` and ``notes`` of result rows, each once, in the order first met."""
    warnings: dict[str, None] = {}
    notes: dict[str, None] = {}
    for row in rows:
        if not row:
            continue
        warnings.update(dict.fromkeys(_listed(row.get("warnings"))))
        notes.update(dict.fromkeys(_listed(row.get("notes"))))
    return list(warnings), list(notes)


def _listed(value: Any) -> list[str]:
    """A row's ``warnings``/``notes``: a list, or its JSON text (a sweep's CSV/Parquet cell), or nothing."""
    if value is None or value != value:  # None, or a NaN cell read back from a file
        return []
    if isinstance(value, str):
        import json

        value = json.loads(value) if value.strip() else []
    return [str(v) for v in value]


def message_lines(warnings: Iterable[str], notes: Iterable[str], indent: str = "  ") -> list[str]:
    """The lines that say them (``clustersim simulate``'s table ends with these). A message of several lines
    (the no-framework WARNING's one line per framework) has the lines after its first indented under it."""
    return [line for kind, texts in (("WARNING", warnings), ("NOTE", notes)) for text in texts
            for line in _said(kind, text, indent)]


def _said(kind: str, text: str, indent: str) -> list[str]:
    first, *rest = str(text).split("\n")
    return [f"{indent}{kind}: {first}", *(f"{indent}    {line}" for line in rest)]
