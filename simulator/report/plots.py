"""Figures of one simulated scenario (matplotlib, Agg; PNG and SVG).

- ``memory``: memory per GPU for each pipeline stage, stacked by kind (weights, gradients,
  optimizer state, activations, other), against the HBM capacity and the usable part of it
  (HBM minus ``simulation.hbm_reserve_gib``). From :func:`simulator.memory.peak_rank_memory`,
  the same model ``simulate`` reports.
- ``time_breakdown``: the step time of the critical rank split into compute, recompute,
  exposed communication by kind, pipeline bubble and optimizer (``time_breakdown_s``).
- ``timeline``: a Gantt chart of the simulated step, one row per rank class (pipeline stage)
  and stream (compute, tp, pp, dp, ...), coloured by category.
- ``memory_over_time``: the simulated memory of each rank class over the run (the engine's
  counter: weights, optimizer state and buffers held, activations allocated at each forward and
  freed at the backward, gradients), with each one's analytic peak dashed and the HBM line.

Figures are built on ``matplotlib.figure.Figure`` (no pyplot, no global backend state), so
plotting is safe from worker processes and tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simulator.errors import ConfigError

MEMORY_KINDS = ("weights", "gradients", "optimizer", "activations", "other")
MEMORY_COLOURS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer": "#c44e52",
                  "activations": "#8172b2", "other": "#937860"}
CATEGORY_COLOURS = {
    "compute": "#4c72b0", "recompute": "#64b5cd", "host_stall": "#8c8c8c", "optimizer": "#937860",
    "tp_comm": "#dd8452", "pp_comm": "#55a868", "dp_comm": "#c44e52", "cp_comm": "#8172b2",
    "ep_comm": "#da8bc3", "pipeline_bubble": "#cccccc", "input_wait": "#ccb974",
}
FORMATS = ("png", "svg")


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write one figure file (format from the suffix), creating its folder; the one place figures are saved."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lstrip(".") or "png", dpi=dpi, bbox_inches="tight")
    return path


def save_figures(fig: Figure, out_dir: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    for fmt in formats:
        if fmt not in FORMATS:
            raise ConfigError("--format", f"must be png or svg, got {fmt!r}")
    return [save_figure(fig, out_dir / f"{stem}.{fmt}") for fmt in formats]


def memory_figure(stages: Sequence[dict[str, float]], hbm_gib: float, usable_gib: float | None = None,
                  title: str = "") -> Figure:
    """Stacked bars of memory per GPU (GiB) for each stage, with HBM (and usable) lines."""
    fig = Figure(figsize=(max(5.0, 0.5 * len(stages) + 3), 4.0))
    ax = fig.add_subplot()
    xs = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for kind in MEMORY_KINDS:
        values = [float(s.get(kind) or 0.0) for s in stages]
        ax.bar(xs, values, bottom=bottom, color=MEMORY_COLOURS[kind], label=kind, width=0.7)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.axhline(hbm_gib, color="black", lw=1.2, label=f"HBM {hbm_gib:g} GiB")
    if usable_gib is not None and usable_gib < hbm_gib:
        ax.axhline(usable_gib, color="black", lw=1.0, ls="--", label=f"usable {usable_gib:g} GiB")
    ax.set_xticks(xs, [str(i) for i in xs])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_ylim(0, max(max(bottom, default=0.0), hbm_gib) * 1.12)
    ax.set_title(title or "memory per GPU by pipeline stage")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _step_text(step_time_s: float) -> str:
    """A step time in the breakdown's unit (:func:`time_breakdown_figure`): "21.7 ms", "27.3 s"."""
    from simulator.report.result import _breakdown_unit

    scale, unit = _breakdown_unit(step_time_s)
    return f"{scale * step_time_s:.3g} {unit}"


def time_breakdown_figure(breakdown: dict[str, float], step_time_s: float | None = None, title: str = "") -> Figure:
    """Horizontal bars of the step's time breakdown (time and share of the step), in the table's unit: seconds
    from a one-second step up, else milliseconds (:func:`simulator.report.result._breakdown_unit`; in seconds a
    ResNet-50 step's 0.0421 ms gradient all-reduce read "4.21e-05 s" beside the table's milliseconds)."""
    from simulator.report.result import _breakdown_unit

    items = [(k, float(v)) for k, v in breakdown.items() if v and float(v) > 0]
    fig = Figure(figsize=(7.0, 0.45 * max(len(items), 1) + 1.6))
    ax = fig.add_subplot()
    total = step_time_s or sum(v for _, v in items) or 1.0
    scale, unit = _breakdown_unit(total)
    names = [k for k, _ in items][::-1]
    values = [scale * v for _, v in items][::-1]
    ax.barh(names, values, color=[CATEGORY_COLOURS.get(k, "#777777") for k in names])
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.3g} {unit} ({100 * v / (scale * total):.1f}%)", va="center", fontsize=8)
    ax.set_xlim(0, max(values, default=1.0) * 1.35)
    ax.set_xlabel(f"{'seconds' if unit == 's' else 'milliseconds'} per step: exposed time on the critical rank (the "
                  "one that finishes last; communication hidden under compute not counted)", fontsize=8)
    ax.set_title(title or f"time breakdown of one step ({scale * total:.3g} {unit})")
    return fig


def timeline_figure(events: Iterable[Any], title: str = "", max_events: int = 20000) -> Figure:
    """Gantt chart: one row per (rank class, stream), bars coloured by category.

    ``events`` are TimelineEvents or mappings with rank_class, stream, category, start_s, end_s.
    Above ``max_events`` events, only the start of the run is drawn (every row up to the time the
    ``max_events``-th event starts, so no rank is cut off early), and the title says so."""
    flat = []
    for e in events:
        get = e.get if isinstance(e, dict) else (lambda k, _e=e: getattr(_e, k))
        flat.append(((str(get("rank_class")), str(get("stream"))), str(get("category")),
                     float(get("start_s")), float(get("end_s"))))
    shown_until = None
    if len(flat) > max_events:
        shown_until = sorted(start for _, _, start, _ in flat)[max_events - 1]
    rows: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}
    for key, category, start, end in flat:
        if shown_until is None or start <= shown_until:
            rows.setdefault(key, {}).setdefault(category, []).append((start, end - start))
    # An event narrower than a pixel would vanish: draw every event at least 1/1500 of the span wide
    # (about a pixel of the 11-inch figure at 120 dpi), so short collectives and sends stay visible.
    spans_all = [s for cats in rows.values() for spans in cats.values() for s in spans]
    span = (max((s + w for s, w in spans_all), default=1.0) - min((s for s, _ in spans_all), default=0.0)) or 1.0
    min_width = span / 1500
    # drawn in the breakdown's unit: milliseconds for a run under one second (its axis read 0.000-0.020 s beside
    # "events shorter than 0.0145 ms")
    from simulator.report.result import _breakdown_unit

    scale, unit = _breakdown_unit(span)
    for cats in rows.values():
        for category, spans in cats.items():
            cats[category] = [(scale * s, scale * max(w, min_width)) for s, w in spans]
    order = sorted(rows, key=lambda k: (_natural(k[0]), k[1] != "compute", k[1]))
    fig = Figure(figsize=(11.0, 0.32 * max(len(order), 1) + 1.6))
    ax = fig.add_subplot()
    used = set()
    for y, key in enumerate(order):
        for category, spans in rows[key].items():
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=CATEGORY_COLOURS.get(category, "#777777"), linewidth=0)
            used.add(category)
    ax.set_yticks(range(len(order)), [f"{rc} · {st}" for rc, st in order], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"time in the step ({unit}); events shorter than {min_width * 1e3:.3g} ms drawn that wide")
    ax.set_title((title or "simulated step timeline") + (
        f" (the first {scale * shown_until:.3g} {unit} of {len(flat):,} events)" if shown_until is not None else ""))
    ax.legend(handles=[Patch(color=CATEGORY_COLOURS.get(c, "#777777"), label=c) for c in sorted(used)],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def memory_over_time_figure(series: dict[str, Sequence[tuple[float, float]]], hbm_gib: float,
                            analytic_peak_gib: dict[str, float] | None = None, title: str = "") -> Figure:
    """Step lines of memory (GiB) against time, one per rank class; dashed: its analytic peak. Time in the
    breakdown's unit: milliseconds for a run under one second (:func:`timeline_figure`)."""
    from simulator.report.result import _breakdown_unit

    fig = Figure(figsize=(9.0, 4.2))
    ax = fig.add_subplot()
    top = 0.0
    scale, unit = _breakdown_unit(max((t for points in series.values() for t, _ in points), default=1.0))
    for actor in sorted(series, key=_natural):
        points = list(series[actor])
        if not points:
            continue
        xs = [scale * t for t, _ in points]
        ys = [b / 2**30 for _, b in points]
        line, = ax.step(xs, ys, where="post", lw=1.2, label=f"{actor} (peak {max(ys):.3g} GiB)")
        top = max(top, max(ys))
        if analytic_peak_gib and actor in analytic_peak_gib:
            ax.axhline(analytic_peak_gib[actor], color=line.get_color(), lw=0.8, ls=":")
    if hbm_gib <= 2 * top:  # far above the curves it would flatten them: named in the title instead
        ax.axhline(hbm_gib, color="black", lw=1.2, label=f"HBM {hbm_gib:g} GiB")
        top = max(top, hbm_gib)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_ylim(0, top * 1.1)
    ax.set_title(title or "simulated memory over time (dotted: analytic peak)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _natural(text: str) -> tuple:
    digits = "".join(ch for ch in text if ch.isdigit())
    return (text.rstrip("0123456789"), int(digits) if digits else -1, text)


def plot_scenario(scenario, out_dir: str | Path, formats: Sequence[str] = FORMATS, result=None) -> list[Path]:
    """Simulate ``scenario`` unrolled (unless ``result`` is given: a folded long pipeline has no memory series
    or timeline to draw) and write the figures; return the paths."""
    from simulator.memory.analytic import usable_hbm_bytes
    from simulator.simulate import simulate
    from simulator.strategies.registry import get_kind

    out = Path(out_dir)
    result = result if result is not None else simulate(scenario, fold=False)  # a folded run has no series or timeline
    _, _, per_stage = get_kind(scenario.strategy_kind).memory(scenario)  # the kind's own analytic count
    name = scenario.name
    paths = []
    paths += save_figures(memory_figure([b.gib() for b in per_stage], scenario.accelerator.hbm_gib,
                                 usable_hbm_bytes(scenario) / 2**30,
                                 title=f"{name}: memory per GPU by pipeline stage"), out, "memory", formats)
    if result.step_time_s:
        paths += save_figures(time_breakdown_figure(result.time_breakdown_s, result.step_time_s,
                                             title=f"{name}: step {_step_text(result.step_time_s)}"),
                       out, "time_breakdown", formats)
    if result.timeline:
        steps = f"{result.steps} simulated steps" if result.steps > 1 else "one simulated step"
        paths += save_figures(timeline_figure(result.timeline, title=f"{name}: {steps}"), out, "timeline", formats)
    if result.memory_series_bytes:
        stage_peaks = [b.total_bytes / 2**30 for b in per_stage]
        analytic = {a: stage_peaks[result.actor_stage[a]] for a in result.memory_series_bytes
                    if a in result.actor_stage}
        paths += save_figures(memory_over_time_figure(
            result.memory_series_bytes, scenario.accelerator.hbm_gib, analytic,
            title=f"{name}: simulated memory over time (dotted: analytic peak; HBM {scenario.accelerator.hbm_gib:g} GiB)"),
            out, "memory_over_time", formats)
    return paths
