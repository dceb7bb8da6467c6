"""The report of a layout search (:func:`simulator.explore.search.search`): what happened to every
candidate (:func:`summarize`, :func:`counts_line`), the best-first table ``clustersim search`` prints
(:func:`render_table`) and its ``--csv`` (:func:`write_csv`)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from simulator.errors import ConfigError
from simulator.explore.search import _rate


def _invalid_reason(reason: str) -> str:
    """An invalid row's reason without ``invalid layout:``, the field and any parenthesis: ``parallelism.
    zero_stage: local_sgd keeps each replica's optimizer whole: needs 0`` -> its message whole."""
    text = str(reason).split(" (")[0].removeprefix("invalid layout:").strip()
    field, sep, message = text.partition(": ")
    return (message if sep else field).strip()[:70]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of what happened to every candidate, and the commonest invalid reasons.

    Every candidate is ``evaluated`` (considered): it is ``invalid`` (divisibility), ``pruned_by_memory``
    (out of memory), ``pruned_by_bound`` (its step-time lower bound per token was above the k-th best
    step time: never priced), ``failed``, or timed: ``engine_resimulated`` counts the layouts the engine
    timed (every one whose bound could reach the top k; with a replacement simulator or straggler draws,
    every feasible layout), ``priced_by_fast_path`` those the fast path timed (the top k, beside
    the engine). ``folded_as_same_plan``: candidates not counted above, each the same plan as a row
    (its ``folded_layouts``); ``folded_after_timing``: how many of those a strategy kind's search timed before
    folding them (:func:`simulator.explore.checks.fold_timed_twins`)."""
    simulated = sum(1 for r in rows if r.get("fits") and _rate(r))
    invalid = [r for r in rows if str(r.get("infeasible_reason") or "").startswith("invalid layout")]
    failed = [r for r in rows if str(r.get("infeasible_reason") or "").startswith("simulation failed")]
    oom = [r for r in rows if not r.get("fits") and r not in invalid and r not in failed]
    reasons = Counter(_invalid_reason(r["infeasible_reason"]) for r in invalid)
    by = Counter(r.get("evaluated_by") for r in rows if r.get("fits"))
    priced = sum(1 for r in rows if r.get("fits") and r.get("fast_step_time_s") is not None)
    folded = sum(len(r.get("folded_layouts") or ()) for r in rows)
    return {"layouts": len(rows), "folded_as_same_plan": folded,
            "folded_after_timing": sum(r.get("folded_after_timing") or 0 for r in rows), "simulated": simulated, "out_of_memory": len(oom), "invalid": len(invalid),
            "failed": len(failed), "invalid_reasons": reasons.most_common(3),
            "by_engine": by.get("engine", 0), "by_fast_path": by.get("fast", 0), "skipped_by_bound": by.get("bound", 0),
            "evaluated": len(rows), "pruned_by_memory": len(oom), "pruned_by_bound": by.get("bound", 0),
            "priced_by_fast_path": priced, "engine_resimulated": by.get("engine", 0)}


def counts_line(s: dict[str, Any]) -> str:
    """One line with every count of :func:`summarize`, as the table and the benchmarks print it."""
    return (f"{s['evaluated']:,} layouts evaluated: {s['invalid']:,} invalid, {s['pruned_by_memory']:,} pruned by "
            f"memory, {s['pruned_by_bound']:,} pruned by the step-time lower bound, {s['engine_resimulated']:,} "
            f"timed by the engine, {s['priced_by_fast_path']:,} by the fast path"
            + (f", {s['failed']:,} failed" if s["failed"] else "")
            + (f"; {s['folded_as_same_plan']:,} more folded as the same plan as one of them (ZeRO-1/2 without data "
               f"parallelism, a balanced cut equal to the even one: each row's folded_layouts)"
               if s.get("folded_as_same_plan") else "")
            + (f", {s['folded_after_timing']:,} of them timed first (a strategy kind's: told by the same layers per "
               f"stage, step and memory)" if s.get("folded_after_timing") else ""))


def _engine_s(row: dict[str, Any]) -> float | None:
    """The engine's step time of a row (a row from a replacement simulator, without the key: its step)."""
    if "engine_step_time_s" in row:
        return row["engine_step_time_s"]
    return row.get("step_time_s") if row.get("evaluated_by", "engine") == "engine" else None


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _time_cell(value: Any) -> str:
    """A breakdown cell: three decimals, and a time too small for them in two significant figures (``0.00033``,
    ``4.1e-05``; 7 characters at most), not ``0.000``: a 1 s step's 0.33 ms gradient all-reduce read as no time
    at all where a row shown took a second or more (the columns are then in seconds). An exact 0 stays ``0.000``."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or not 0 < abs(value) < 0.0005:
        return _fmt(value, ".3f")
    return format(value, ".2g")


SEARCH_COLUMNS = ("rank", "evaluated_by", "engine_step_time_s", "fast_step_time_s", "fast_path_lower_bound_s",
                  "step_time_lower_bound_s")
"""The columns a search's CSV puts before a sweep row's (:func:`write_csv`)."""


def flat_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, one flat mapping per row) of a search, best first: ``rank`` (1, 2, ... for the timed rows, None
    for the rest), who timed it (``evaluated_by``) and each path's step time
    (:func:`simulator.explore.search.labelled`), the bound, then the columns ``clustersim sweep`` writes
    (simulator/explore/sweep.py: the result's, its ``warnings`` and ``notes`` as JSON text, ``extra_json``
    last). ``--csv`` writes them; ``clustersim.search`` returns them as a DataFrame."""
    from simulator.explore.sweep import MESSAGE_COLUMNS, RESULT_COLUMNS, flatten_result, message_cells

    columns = [*SEARCH_COLUMNS, *RESULT_COLUMNS, *MESSAGE_COLUMNS, "extra_json"]
    out, rank = [], 0
    for row in rows:
        flat = flatten_result({k: v for k, v in row.items() if k not in (*SEARCH_COLUMNS, *MESSAGE_COLUMNS)})
        flat.update({k: row.get(k) for k in SEARCH_COLUMNS})
        flat.update(message_cells(row))
        timed = bool(row.get("fits") and _rate(row))
        rank += timed
        flat["rank"] = rank if timed else None
        out.append({c: flat.get(c) for c in columns})
    return columns, out


def write_csv(rows: list[dict[str, Any]], path: str) -> None:
    """Every row of a search as CSV, best first (:func:`flat_rows`)."""
    import csv

    from simulator.explore.sweep import _csv_text

    columns, flat = flat_rows(rows)
    try:
        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(columns)
            for row in flat:
                writer.writerow([_csv_text(row[c]) for c in columns])
    except OSError as exc:
        raise ConfigError("--csv", f"cannot write {path}: {exc.strerror or exc}") from None


#: Searched layout fields the table shows only where the rows shown differ in them, and their headers.
_VARIED_COLUMNS = {"global_batch_size": "gbs", "overlap_grad_reduce": "ogr", "overlap_param_gather": "opg",
                   "overlap_tp_grad_comm": "otgc", "overlap_p2p_comm": "op2p", "tp_comm_overlap": "tpco"}


def _yes_no(value: Any) -> str:
    return ("y" if value else "n") if isinstance(value, bool) else str(value if value is not None else "-")


#: The layout columns of the table: (field, header, width, align); a strategy kind's table keeps those it reads.
_LAYOUT_COLUMNS: tuple[tuple[str, str, int, str], ...] = (
    ("tp", "tp", 3, ">"), ("pp", "pp", 3, ">"), ("dp", "dp", 5, ">"), ("cp", "cp", 3, ">"), ("ep", "ep", 3, ">"),
    ("virtual_stages", "vp", 3, ">"), ("schedule", "sched", 11, "<"), ("zero_stage", "zero", 4, ">"),
    ("recompute", "recomp", 9, "<"), ("pp_split", "split", 8, "<"), ("sequence_parallel", "sp", 3, "<"),
    ("micro_batch_size", "mbs", 3, ">"))


def _layout_cell(p: dict[str, Any], name: str) -> Any:
    if name == "ep":
        return p.get("ep", 1)
    if name == "pp_split":
        return p.get("pp_split", "even")
    if name == "sequence_parallel":
        return "y" if p["sequence_parallel"] else "n"
    return p[name]


def render_table(rows: list[dict[str, Any]], top: int = 10, read: frozenset[str] | None = None) -> str:
    """Best-first table of the feasible layouts, then a summary of what was pruned. ``engine s`` is
    the discrete-event engine's step time, ``fast s`` the fast path's (``-`` where that path did not
    time the layout; the ranking and the other figures are the engine's where it ran). The last six
    columns are the step's time breakdown in seconds (``time_breakdown_s``): compute, tensor-,
    expert- (all-to-all), data- and pipeline-parallel communication, and the pipeline bubble. ``split``
    (``pp_split``: even or balanced) is shown where a row shown is balanced; the global batch and the overlap
    switches (:data:`_VARIED_COLUMNS`) where the rows shown differ in them. ``read``: the ``parallelism:`` fields
    the strategy kind reads (:func:`simulator.strategies.registry.layout_fields_read`); the layout columns of the
    others are left out (swarm's table had a ``sched`` column saying 1f1b: it runs GPipe); None: all (spmd)."""
    with_split = any(r.get("fits") and _rate(r) and (r.get("parallelism") or {}).get("pp_split") == "balanced"
                     for r in rows[:top])
    columns = [c for c in _LAYOUT_COLUMNS if (read is None or c[0] in read) and (c[0] != "pp_split" or with_split)]
    head = (f"{'#':>3} " + "".join(f"{header:{align}{width}} " for _, header, width, align in columns) +
            f"{'samples/s':>10} {'tokens/s':>12} {'MFU':>6} {'engine s':>8} {'fast s':>8} {'mem GiB':>8} "
            f"{'compute':>8} {'tp':>7} {'ep':>7} {'dp':>7} {'pp':>7} {'bubble':>7}")
    with_target = any(r.get("time_to_target_s") for r in rows)
    if with_target:  # the convergence block's steps to target x step time, and the batch it depends on
        head += f" {'gbs':>6} {'target s':>10}"
    # the searched fields the columns above omit, where the rows shown differ in them (else two rows could
    # read as one layout: a global batch or an overlap switch searched)
    shown_rows = [r for r in rows[:top] if r.get("fits") and _rate(r)]
    varied = [k for k in _VARIED_COLUMNS if not (k == "global_batch_size" and with_target)
              and len({repr((r.get("parallelism") or {}).get(k)) for r in shown_rows}) > 1]
    head += "".join(f" {_VARIED_COLUMNS[k]:>5}" for k in varied)
    lines = [head]
    shown = 0
    # the breakdown in milliseconds where every row shown steps in under a second (in seconds a ResNet-50 row read
    # "0.126 0.000 0.000 0.000 0.000 0.000": its 0.225 ms gradient all-reduce hidden), as simulate's table does
    steps = [_engine_s(r) or r.get("step_time_s") for r in shown_rows]
    in_ms = bool(steps) and all(t is not None and t < 1 for t in steps)
    scale = 1e3 if in_ms else 1.0
    for row in rows:
        if shown >= top or not (row.get("fits") and _rate(row)):
            break
        shown += 1
        p = row["parallelism"]
        b = row.get("time_breakdown_s") or {}
        lines.append(
            f"{shown:>3} " + "".join(f"{_layout_cell(p, name)!s:{align}{width}} " for name, _, width, align in columns)
            + f"{_fmt(row.get('samples_per_s'), ',.1f'):>10} "
            f"{_fmt(row.get('tokens_per_s'), ',.0f'):>12} "
            f"{_fmt(row.get('mfu') and 100 * row['mfu'], '.1f'):>5}% {_fmt(_engine_s(row), '.3f'):>8} "
            f"{_fmt(row.get('fast_step_time_s'), '.3f'):>8} "
            f"{_fmt(row.get('peak_memory_gib'), '.1f'):>8} "
            + " ".join(f"{_time_cell(None if b.get(k) is None else scale * b[k]):>{w}}" for k, w in
                       (("compute", 8), ("tp_comm", 7), ("ep_comm", 7), ("dp_comm", 7), ("pp_comm", 7), ("pipeline_bubble", 7)))
            + (f" {p.get('global_batch_size', '-'):>6} {_fmt(row.get('time_to_target_s'), ',.0f'):>10}" if with_target
               else "")
            + "".join(f" {_yes_no(p.get(k)):>5}" for k in varied))
    s = summarize(rows)
    if shown == 0:
        lines.append("  (no layout fits)")
    lines.append("")
    # one line of counts (until session 11 a shorter line said the same counts above it)
    lines.append(counts_line(s))
    for reason, count in s["invalid_reasons"]:
        lines.append(f"  invalid ({count:,}): {reason}")
    if shown:  # the header's tp ... pp come twice: the layout's degrees, then seconds of each one's communication
        lines.append("  columns: engine s / fast s: the step time by the engine / by the fast path; compute, tp, ep, "
                     f"dp, pp, bubble (after mem GiB): {'milliseconds' if in_ms else 'seconds'} of the step on the "
                     "critical rank: compute, exposed tp/ep/dp/pp communication, pipeline bubble")
    return "\n".join(lines)
