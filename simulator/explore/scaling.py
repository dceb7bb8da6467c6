"""Scaling curves: samples/s (and tokens/s where the model has a sequence) and MFU against the
number of GPUs, with ideal scaling.

For each GPU count N the layout is either

- ``search`` (default): the best layout :func:`simulator.search.search` finds on N GPUs, or
- ``fixed``: the scenario's own layout with ``dp`` inferred (tp, pp, cp, virtual stages, ZeRO,
  recompute and micro-batch kept; the rule Narayanan et al. 2021 Fig. 8 / Table 1 follow when they
  scale out data parallelism).

Strong scaling keeps the scenario's global batch; weak scaling keeps the batch per GPU
(``global_batch_size · N / N₀``, N₀ the scenario's GPU count, rounded to an integer).
Ideal scaling is linear from the smallest GPU count that has a feasible layout:
``samples/s(N) = samples/s(N_min) · N / N_min`` (tokens/s likewise), and MFU stays at its value
there; the scaling efficiency is measured over ideal.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError

CSV_COLUMNS = (
    "num_gpus", "global_batch_size", "tp", "pp", "dp", "cp", "virtual_stages", "schedule", "zero_stage",
    "recompute", "sequence_parallel", "micro_batch_size", "fits", "step_time_s", "samples_per_s",
    "samples_per_s_per_gpu", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "hfu", "peak_memory_gib",
    "ideal_samples_per_s", "ideal_tokens_per_s", "ideal_mfu",
    "scaling_efficiency", "layouts_tried", "infeasible_reason", "warnings", "notes",
)


def parse_gpu_counts(text: str | Sequence[int]) -> list[int]:
    """``"64,128,256"`` (or a list) into sorted unique positive GPU counts (the curve runs from the fewest GPUs;
    ``clustersim scale`` says so when the order given differs). An empty item (``8,,16``, ``8,``) is refused: it
    was dropped silently, where it is likely a count left out."""
    if isinstance(text, str):
        items = [t.strip() for t in text.split(",")]
        if any(items) and not all(items):
            raise ConfigError("--gpus", f"empty item in {text!r} (write comma-separated GPU counts, e.g. 64,128,256)")
        items = [t for t in items if t]
        try:
            counts = [int(t) for t in items]
        except ValueError:
            raise ConfigError("--gpus", f"expected comma-separated integers, got {text!r}") from None
    else:
        counts = [int(t) for t in text]
    if not counts:
        raise ConfigError("--gpus", "needs at least one GPU count")
    bad = [c for c in counts if c < 1]
    if bad:
        raise ConfigError("--gpus", f"GPU counts must be positive, got {bad[0]}")
    from simulator.scenario import check_gpu_count

    for count in counts:
        check_gpu_count(count)
    return sorted(set(counts))


def _fixed_task(args: tuple[dict[str, Any], Any]) -> dict[str, Any]:
    from simulator.explore.sweep import run_point

    raw, fn = args
    return run_point(raw, fn)


def _rate(row: dict[str, Any]) -> float | None:
    """The throughput a row is judged by: samples/s, or tokens/s for results that only carry that."""
    return row.get("samples_per_s") or row.get("tokens_per_s")


def _row(n: int, gbs: int, result: dict[str, Any] | None, tried: int) -> dict[str, Any]:
    result = result or {}
    par = result.get("parallelism") or {}
    ok = bool(result.get("fits")) and bool(_rate(result))
    samples = result.get("samples_per_s") if ok else None
    tokens = result.get("tokens_per_s") if ok else None
    row = {"num_gpus": n, "global_batch_size": gbs, "layouts_tried": tried,
           **{k: result.get(k) for k in ("model", "node", "accelerator", "seq_length", "precision")},
           **{k: par.get(k) for k in ("tp", "pp", "dp", "cp", "virtual_stages", "schedule", "zero_stage",
                                      "recompute", "sequence_parallel", "micro_batch_size")},
           "fits": bool(result.get("fits")), "step_time_s": result.get("step_time_s") if ok else None,
           "samples_per_s": samples, "samples_per_s_per_gpu": samples / n if samples else None,
           "tokens_per_s": tokens, "tokens_per_s_per_gpu": tokens / n if tokens else None,
           "mfu": result.get("mfu") if ok else None, "hfu": result.get("hfu") if ok else None,
           "peak_memory_gib": result.get("peak_memory_gib"),
           "infeasible_reason": None if ok else (result.get("infeasible_reason") or "no feasible layout"),
           # what `clustersim simulate` says of the row's run (simulator/report/messages.py); None: not simulated
           "warnings": result.get("warnings"), "notes": result.get("notes")}
    return row


def scaling_curve(
    source: str | dict[str, Any] | None,
    gpu_counts: Sequence[int],
    *,
    overrides: list[str] | None = None,
    weak: bool = False,
    layout: str = "search",
    space=None,
    constraints=None,
    workers: int | None = None,
    dask: str | None = None,
    simulate_fn=None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """One row per GPU count (see the module docstring); rows follow ``CSV_COLUMNS``. ``progress``:
    a tqdm bar over the GPU counts (and the searches' own bars) on stderr."""
    from simulator.explore.search import search
    from simulator.explore.sweep import absolutize, parallel_map, trace_imported_models
    from simulator.scenario import apply_overrides, load_raw

    if layout not in ("search", "fixed"):
        raise ConfigError("--layout", f"must be 'search' or 'fixed', got {layout!r}")
    counts = parse_gpu_counts(list(gpu_counts))
    raw, base_dir = load_raw(source)
    raw = absolutize(apply_overrides(raw, overrides or []), base_dir)
    if raw.get("co_located_jobs"):
        from simulator.colocation.spec import refuse_co_located

        refuse_co_located("scale")
    par = raw.setdefault("parallelism", {})
    n0 = (raw.get("cluster") or {}).get("num_gpus")
    if not isinstance(n0, int) or n0 < 1:
        raise ConfigError("cluster.num_gpus", "must be a positive integer")
    gbs0 = par.get("global_batch_size", 512)
    if not isinstance(gbs0, int) or gbs0 < 1:
        raise ConfigError("parallelism.global_batch_size", "must be a positive integer")

    def gbs_for(n: int) -> int:
        return max(1, round(gbs0 * n / n0)) if weak else gbs0

    points = []
    for n in counts:
        point = copy.deepcopy(raw)
        point["cluster"]["num_gpus"] = n
        point["parallelism"]["global_batch_size"] = gbs_for(n)
        if layout == "fixed":
            point["parallelism"]["dp"] = "auto"
        points.append(point)

    rows: list[dict[str, Any]] = []
    if layout == "fixed":
        results: dict[int, dict[str, Any]] = {}
        items = [(p, simulate_fn) for p in points]
        if not dask:  # Dask's workers are not forked from here
            trace_imported_models(points)
        for idx, ok, result in parallel_map(_fixed_task, items, workers=workers, dask=dask):
            results[idx] = result if ok else {"fits": False, "infeasible_reason": str(result)}
        for idx, n in enumerate(counts):
            res = results.get(idx) or {}
            if res.get("status") == "error":
                res = {**res, "fits": False, "infeasible_reason": res.get("error")}
            rows.append(_row(n, gbs_for(n), res, 1))
    else:
        from tqdm import tqdm

        for n, point in tqdm(list(zip(counts, points, strict=True)), desc="GPU counts", unit="count",
                             file=sys.stderr, disable=not progress, dynamic_ncols=True):
            try:
                found = search(point, space=space, constraints=constraints, workers=workers, dask=dask,
                               simulate_fn=simulate_fn, progress=progress)
            except ConfigError as exc:  # the scenario at this count (its fabric's regions): say which count
                raise ConfigError(exc.field, f"{exc.reason} (at --gpus {n})") from None
            best = found[0] if found and found[0].get("fits") and _rate(found[0]) else None
            if best is None and found:
                reasons = {str(r.get("infeasible_reason")).split(":")[0] for r in found[:50]}
                best = {"fits": False, "infeasible_reason": f"none of {len(found)} layouts fits or is valid "
                        f"({'; '.join(sorted(reasons))[:120]})"}
            rows.append(_row(n, gbs_for(n), best, len(found)))
    _add_ideal(rows)
    return rows


def _add_ideal(rows: list[dict[str, Any]]) -> None:
    ref = next((r for r in rows if _rate(r)), None)
    for r in rows:
        if ref is None or r["num_gpus"] < ref["num_gpus"]:  # below the first feasible count: no reference
            r.update(ideal_samples_per_s=None, ideal_tokens_per_s=None, ideal_mfu=None, scaling_efficiency=None)
            continue
        for key in ("samples_per_s", "tokens_per_s"):
            r[f"ideal_{key}"] = ref[key] * r["num_gpus"] / ref["num_gpus"] if ref[key] else None
        r["ideal_mfu"] = ref["mfu"]
        key = "samples_per_s" if ref["samples_per_s"] else "tokens_per_s"
        r["scaling_efficiency"] = r[key] / r[f"ideal_{key}"] if r[key] else None


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else json.dumps(r[k]) if isinstance(r[k], list) else r[k])
                             for k in CSV_COLUMNS})
    return path


def scaling_figure(rows: list[dict[str, Any]], title: str = ""):
    """Two panels: tokens/s vs GPUs (log-log, ideal dashed) and MFU vs GPUs (ideal dashed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.0, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    ok = [r for r in rows if _rate(r)]
    key = "tokens_per_s" if ok and all(r["tokens_per_s"] for r in ok) else "samples_per_s"
    xs = [r["num_gpus"] for r in ok]
    last = max(xs, default=0)  # no ideal line past the last count that has a feasible layout
    ideal = [r for r in rows if r.get(f"ideal_{key}") and r["num_gpus"] <= last]
    ax1.plot(xs, [r[key] for r in ok], "o-", color="#4c72b0", label="simulated")
    if ideal:
        ax1.plot([r["num_gpus"] for r in ideal], [r[f"ideal_{key}"] for r in ideal], "--", color="gray",
                 label="ideal (linear)")
    ax2.plot(xs, [100 * (r["mfu"] or 0) for r in ok], "o-", color="#c44e52", label="simulated")
    for r in ok:  # the layout chosen at each count
        label = f"tp{r.get('tp')} pp{r.get('pp')} dp{r.get('dp')}" + (f" cp{r['cp']}" if (r.get("cp") or 1) > 1 else "")
        ax2.annotate(label, (r["num_gpus"], 100 * (r["mfu"] or 0)), textcoords="offset points", xytext=(0, 7),
                     ha="center", fontsize=6.5, color="#555555")
    if ideal:
        ax2.plot([r["num_gpus"] for r in ideal], [100 * (r["ideal_mfu"] or 0) for r in ideal], "--", color="gray",
                 label="ideal (constant)")
    infeasible = [r["num_gpus"] for r in rows if not _rate(r)]
    all_n = [r["num_gpus"] for r in rows]
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_n, [str(n) for n in all_n], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("GPUs")
        ax.grid(True, which="both", alpha=0.3)
        for n in infeasible:
            ax.axvline(n, color="#c44e52", alpha=0.25, lw=6)
    if ok:
        ax1.set_yscale("log")
        ax1.set_xticks(all_n, [str(n) for n in all_n], fontsize=8)
    ax1.set_ylabel("tokens/s" if key == "tokens_per_s" else "samples/s")
    ax2.set_ylabel("MFU (%)")
    ax2.set_ylim(0, max([100 * (r["mfu"] or 0) for r in ok] + [1.0]) * 1.25)
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    if infeasible:
        ax2.text(0.01, 0.02, f"no feasible layout at {', '.join(map(str, infeasible))} GPUs (shaded)",
                 transform=ax2.transAxes, fontsize=7, color="#c44e52")
    known = next((r for r in rows if r.get("model")), None)
    what = (f"{known['model']} on {known['node']} ({known['accelerator']})"
            + (f", sequence {known['seq_length']}" if known.get("seq_length") else "")
            + f", {known['precision']}" if known else "")
    fig.suptitle("\n".join(t for t in (title, what) if t) or "scaling", fontsize=10)
    return fig


def write_outputs(rows: list[dict[str, Any]], out_dir: str | Path, title: str = "",
                  formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """``scaling.csv`` and ``scaling.{png,svg}`` in ``out_dir``."""
    out = Path(out_dir)
    paths = [write_csv(rows, out / "scaling.csv")]
    from simulator.report.plots import save_figures

    paths += save_figures(scaling_figure(rows, title), out, "scaling", formats)
    return paths


#: The layout columns of :func:`render_table`: (field, header, width, align).
_LAYOUT_COLUMNS: tuple[tuple[str, str, int, str], ...] = (
    ("tp", "tp", 3, ">"), ("pp", "pp", 3, ">"), ("dp", "dp", 5, ">"), ("virtual_stages", "vp", 3, ">"),
    ("micro_batch_size", "mbs", 3, ">"), ("zero_stage", "zero", 4, ">"), ("recompute", "recomp", 9, "<"))


def render_table(rows: list[dict[str, Any]], read: frozenset[str] | None = None) -> str:
    """One line per GPU count: its batch, layout, rates, MFU and scaling efficiency. ``read``: the ``parallelism:``
    fields the strategy kind reads (:func:`simulator.strategies.registry.layout_fields_read`); the layout columns
    of the others are left out (subnetwork DP's rows printed tp, pp, vp and zero it never reads); None: all."""
    def f(v, spec):
        return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)

    columns = [c for c in _LAYOUT_COLUMNS if read is None or c[0] in read]
    # per GPU: tokens where a row has them (a sequence model), else samples (a CNN's tokens/s are all "-")
    tokens = any(r.get("tokens_per_s") for r in rows)
    per_gpu, per_gpu_header = ("tokens_per_s_per_gpu", "tok/s/GPU") if tokens else ("samples_per_s_per_gpu",
                                                                                    "smp/s/GPU")
    lines = [f"{'GPUs':>6} {'gbs':>6} " + "".join(f"{header:{align}{width}} " for _, header, width, align in columns)
             + f"{'samples/s':>11} {'tokens/s':>13} {per_gpu_header:>10} {'MFU':>6} {'eff':>6}"]
    for r in rows:
        if not _rate(r):
            lines.append(f"{r['num_gpus']:>6} {r['global_batch_size']:>6}  -- {r['infeasible_reason']}")
            continue
        lines.append(
            f"{r['num_gpus']:>6} {r['global_batch_size']:>6} "
            + "".join(f"{r[name]!s:{align}{width}} " for name, _, width, align in columns)
            + f"{f(r['samples_per_s'], ',.1f'):>11} {f(r['tokens_per_s'], ',.0f'):>13} "
            f"{f(r[per_gpu], ',.0f' if tokens else ',.1f'):>10} "
            f"{f(r['mfu'] and 100 * r['mfu'], '.1f'):>5}% {f(r['scaling_efficiency'] and 100 * r['scaling_efficiency'], '.0f'):>5}%")
    import textwrap

    lines += textwrap.wrap(
        f"columns: gbs: global batch (samples per step); samples/s, tokens/s: the whole cluster's; {per_gpu_header}: "
        f"{'tokens' if tokens else 'samples'}/s per GPU; MFU: model FLOP/s over peak; eff: scaling efficiency, "
        "the rate over ideal (linear from the first GPU count that runs)", 108, initial_indent="  ",
        subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(lines)
