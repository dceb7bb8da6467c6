"""Read a measured PyTorch profiler (Kineto) Chrome trace and set it beside a simulated step.

A trace's events are grouped into **compute**, **optimizer**, one row per kind of
**communication** (all_reduce, all_gather, reduce_scatter, broadcast, send_recv, all_to_all,
barrier) and **idle**:

- GPU traces (events with ``cat`` kernel / gpu_memcpy / gpu_memset): device events, every
  stream. NCCL kernels (``ncclKernel_AllReduce_...``, ``ncclDevKernel_SendRecv``) are
  communication; the rest is compute; kernels inside an ``Optimizer.step`` GPU annotation are
  the optimizer. A step's device window starts at the first kernel launched in it.
- CPU traces (gloo; no device events): the busiest thread's top-level ``cpu_op`` events are
  the work (ops inside ``Optimizer.step#...`` are the optimizer); ``gloo:all_reduce``-style
  annotations on gloo's threads and blocking ``c10d::`` ops are communication; what no event
  covers is idle (on a CPU this includes the Python between ops).

Busy time per category is the *union* of its intervals (several streams or threads running at
once count once), so communication hidden behind compute still shows as busy, and
``exposed communication`` is the part of it no compute overlaps. ``idle`` is the step window
less every category's union. Steps come from ``ProfilerStep#N`` annotations: pick one
(``step=N``) or average all; a trace without them is one step spanning its events.

The simulated side groups :class:`simulator.result.TimelineEvent` the same way (for one rank
class: the pipeline stage of the trace's rank), taking the communication kind from the event's
name where it says it and from its purpose otherwise (tp → all_reduce, pp → send_recv, ...).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError

COMM_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all", "barrier")
CATEGORIES = ("compute", "optimizer", *COMM_KINDS)
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}

_COMM_PATTERNS = [
    ("reduce_scatter", re.compile(r"reduce_?scatter|reducescatter", re.I)),
    ("all_gather", re.compile(r"all_?gather|allgather", re.I)),
    ("all_reduce", re.compile(r"all_?reduce|allreduce", re.I)),
    ("all_to_all", re.compile(r"all_?to_?all|alltoall", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("send_recv", re.compile(r"send_?recv|sendrecv|\b[i]?send\b|\b[i]?recv_?\b|:send|:recv|::send|::recv|"
                             r"batch_isend_irecv|_send\b|_recv\b", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
]
_COMM_PREFIX = re.compile(r"^(nccl|gloo[:_]|c10d::|record_param_comms|ucc|mpi[:_])", re.I)


def comm_kind(name: str, args: dict | None = None) -> str | None:
    """The communication kind of an event name (``None`` for compute)."""
    if name == "record_param_comms" and args:
        name = str(args.get("Collective name") or args.get("collective_name") or name)
        if name == "record_param_comms":
            return "all_reduce"
    elif not _COMM_PREFIX.search(name):
        return None
    for kind, pattern in _COMM_PATTERNS:
        if pattern.search(name):
            return kind
    return "barrier" if "wait" not in name.lower() else None


@dataclass
class Interval:
    start: float
    end: float
    category: str
    lane: str
    name: str


@dataclass
class StepBreakdown:
    """Per-category busy seconds of one step (or the average of several)."""

    source: str
    step: str
    duration_s: float
    busy_s: dict[str, float]
    communication_s: float
    exposed_communication_s: float
    idle_s: float
    intervals: list[Interval] = field(default_factory=list, repr=False)
    notes: list[str] = field(default_factory=list)

    def rows(self) -> dict[str, float]:
        out = {"step": self.duration_s}
        out.update(self.busy_s)
        out["communication"] = self.communication_s
        out["exposed_communication"] = self.exposed_communication_s
        out["idle"] = self.idle_s
        return out


# --------------------------------------------------------------------------- intervals
def union_length(spans: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(a, b) for a, b in out]


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of union(a) not covered by union(b)."""
    a, b = _merge(a), _merge(b)
    total, j = 0.0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            total += e - cur
    return total


def breakdown_of(intervals: list[Interval], window: tuple[float, float], source: str, step: str) -> StepBreakdown:
    lo, hi = window
    clipped = [Interval(max(i.start, lo), min(i.end, hi), i.category, i.lane, i.name)
               for i in intervals if i.end > lo and i.start < hi]
    by_cat: dict[str, list[tuple[float, float]]] = {}
    for i in clipped:
        by_cat.setdefault(i.category, []).append((i.start, i.end))
    busy = {c: union_length(by_cat.get(c, [])) for c in CATEGORIES}
    comm = [span for c in COMM_KINDS for span in by_cat.get(c, [])]
    work = [span for c in ("compute", "optimizer") for span in by_cat.get(c, [])]
    everything = comm + work
    duration = hi - lo
    return StepBreakdown(
        source=source, step=step, duration_s=duration, busy_s=busy,
        communication_s=union_length(comm), exposed_communication_s=_minus(comm, work),
        idle_s=max(0.0, duration - union_length(everything)),
        intervals=[Interval(i.start - lo, i.end - lo, i.category, i.lane, i.name) for i in clipped],
    )


def average(breakdowns: list[StepBreakdown], source: str) -> StepBreakdown:
    n = len(breakdowns)
    first = breakdowns[0]
    return StepBreakdown(
        source=source, step=f"average of {n} steps",
        duration_s=sum(b.duration_s for b in breakdowns) / n,
        busy_s={c: sum(b.busy_s[c] for b in breakdowns) / n for c in CATEGORIES},
        communication_s=sum(b.communication_s for b in breakdowns) / n,
        exposed_communication_s=sum(b.exposed_communication_s for b in breakdowns) / n,
        idle_s=sum(b.idle_s for b in breakdowns) / n,
        intervals=first.intervals,  # the timeline plot shows the first step
        # said without --plot too, so it names the plot (a bare "timeline shows ProfilerStep#1" under a table of
        # averages read as if the table were that one step)
        notes=[f"the --plot timeline shows {first.step}; the times are the average of {n} steps"] + first.notes,
    )


# --------------------------------------------------------------------------- reading a trace
def load_trace(path: str | Path) -> dict[str, Any]:
    """A Kineto / PyTorch-profiler Chrome trace (``.json`` or ``.json.gz``); ConfigError otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("--trace", f"file not found: {path}")
    raw = path.read_bytes()
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError("--trace", f"{path} is not a PyTorch profiler (Kineto) Chrome trace: not JSON ({exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ConfigError("--trace", f"{path} is not a PyTorch profiler (Kineto) Chrome trace: no 'traceEvents' list")
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]
    kineto = "schemaVersion" in doc or any(
        e.get("cat") in ("cpu_op", "kernel", "user_annotation", "gpu_user_annotation", "cuda_runtime") for e in complete)
    if not complete or not kineto:
        raise ConfigError("--trace", f"{path} is not a PyTorch profiler (Kineto) Chrome trace: no profiler events "
                                     "(cpu_op / kernel / user_annotation) in 'traceEvents'")
    doc["_complete"] = complete
    doc["_path"] = str(path)
    return doc


def _steps(events: list[dict]) -> list[tuple[str, float, float]]:
    steps = []
    for e in events:
        name = str(e.get("name", ""))
        if name.startswith("ProfilerStep#") and e.get("cat") in ("user_annotation", "cpu_op", None, "python_function"):
            steps.append((name, float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    steps.sort(key=lambda s: s[1])
    seen, out = set(), []
    for s in steps:
        if s[0] not in seen:
            seen.add(s[0])
            out.append(s)
    return out


def trace_world_size(doc: dict[str, Any]) -> int | None:
    """The world size a Kineto trace records (``distributedInfo.world_size``), if any."""
    size = (doc.get("distributedInfo") or {}).get("world_size")
    return int(size) if isinstance(size, int | float | str) and str(size).isdigit() else None


def trace_linear_weights(doc: dict[str, Any]) -> set[tuple[int, int]]:
    """The (out, in) weight shapes of the linear layers a trace ran, from the ``Input Dims`` the
    profiler records with ``record_shapes=True`` (empty without them): ``aten::linear`` (input,
    weight [out, in], bias) and ``aten::addmm`` (bias, mat1, mat2 [in, out])."""
    shapes: set[tuple[int, int]] = set()
    for e in doc.get("_complete", ()):
        name, dims = e.get("name"), (e.get("args") or {}).get("Input Dims")
        if not isinstance(dims, list) or len(dims) < 3:
            continue
        try:
            if name == "aten::linear" and len(dims[1]) == 2:
                shapes.add((int(dims[1][0]), int(dims[1][1])))
            elif name == "aten::addmm" and len(dims[2]) == 2:
                shapes.add((int(dims[2][1]), int(dims[2][0])))
        except (TypeError, ValueError):
            continue
    return shapes


def model_linear_weights(scenario) -> set[tuple[int, int]]:
    """The (out, in) weight shapes of the scenario model's matrix multiplies on one rank (its layout's
    shard): each forward GEMM C[m,n] = A[m,k]·B[k,n] of a single matrix has an n x k weight."""
    return {(op.n, op.k) for layer in scenario.layer_graph().layers for op in layer.forward
            if op.kind == "gemm" and op.batch == 1 and op.n and op.k}


def model_mismatch(doc: dict[str, Any], scenario) -> str | None:
    """Why the traced model is not the scenario's, or None: a trace with shapes whose linear layers'
    weights include none of the scenario model's (per rank, under its layout)."""
    traced = trace_linear_weights(doc)
    if not traced:
        return None  # recorded without shapes: nothing to check
    expected = model_linear_weights(scenario)
    if not expected or traced & expected:
        return None

    def shown(shapes):
        return ", ".join(f"{o}x{i}" for o, i in sorted(shapes, reverse=True)[:4]) + (", ..." if len(shapes) > 4 else "")

    return (f"the trace's linear layers have weights {shown(traced)} (out x in), {scenario.model.name} on this "
            f"layout has {shown(expected)}: the traced model is not the scenario's")


TRUNCATED_STEP_FRACTION = 0.8
"""A last ProfilerStep shorter than this fraction of the median of the others is taken as cut off
(the profiler stopped inside it) and left out of the average."""


def drop_truncated_last_step(windows: list[tuple[str, float, float]]) -> tuple[list[tuple[str, float, float]],
                                                                                str | None]:
    """The step windows without a cut-off last one, and a note saying so (None when none was dropped)."""
    if len(windows) < 3:
        return windows, None
    durations = sorted(hi - lo for _, lo, hi in windows[:-1])
    median = durations[len(durations) // 2]
    name, lo, hi = windows[-1]
    if median > 0 and hi - lo < TRUNCATED_STEP_FRACTION * median:
        return windows[:-1], (f"{name} left out of the average: {1e-3 * (hi - lo):.1f} ms against a median of "
                              f"{1e-3 * median:.1f} ms (cut off when the profiler stopped)")
    return windows, None


def trace_rank(doc: dict[str, Any]) -> int | None:
    info = doc.get("distributedInfo") or {}
    rank = info.get("rank")
    return int(rank) if isinstance(rank, int | float | str) and str(rank).isdigit() else None


def _device_intervals(events: list[dict], steps) -> tuple[list[Interval], list[tuple[str, float, float]], list[str]]:
    dev = [e for e in events if e.get("cat") in DEVICE_CATS]
    opt_ann = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
               if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("Optimizer.step")]
    intervals = []
    for e in dev:
        s, t = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        kind = comm_kind(str(e["name"]), e.get("args"))
        if kind is None:
            kind = "optimizer" if any(a <= s and t <= b for a, b in opt_ann) else "compute"
        intervals.append(Interval(s, t, kind, f"stream {e.get('tid')}", str(e["name"])))
    notes = []
    # step windows on the device: from the first kernel launched in the step to the next step's first
    launches = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and isinstance(e.get("args"), dict):
            corr = e["args"].get("correlation")
            if corr is not None:
                launches[corr] = float(e["ts"])
    starts = []
    for name, lo, hi in steps:
        first = None
        for e in dev:
            corr = (e.get("args") or {}).get("correlation")
            ts = launches.get(corr)
            if ts is not None and lo <= ts < hi:
                first = float(e["ts"]) if first is None else min(first, float(e["ts"]))
        starts.append((name, first))
    windows = []
    end_all = max((i.end for i in intervals), default=0.0)
    valid = [(n, s) for n, s in starts if s is not None]
    for idx, (name, s) in enumerate(valid):
        e = valid[idx + 1][1] if idx + 1 < len(valid) else end_all
        windows.append((name, s, e))
    if steps and not windows:
        notes.append("no launch correlation: device step windows taken from the host ProfilerStep ranges")
        windows = steps
    return intervals, windows, notes


def _host_intervals(events: list[dict]) -> tuple[list[Interval], list[str]]:
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    anns = [e for e in events if e.get("cat") == "user_annotation"]
    if not ops and not anns:
        return [], ["no cpu_op events"]
    load: dict[Any, float] = {}
    for e in ops:
        load[e.get("tid")] = load.get(e.get("tid"), 0.0) + float(e["dur"])
    main = max(load, key=load.get) if load else None
    opt = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in anns + ops
           if str(e.get("name", "")).startswith("Optimizer.step") and e.get("tid") == main]
    intervals: list[Interval] = []
    main_ops = sorted((e for e in ops if e.get("tid") == main), key=lambda e: (float(e["ts"]), -float(e["dur"])))
    # communication called from the main thread at any depth (a blocking c10d op inside an
    # autograd function is communication, not compute)
    main_comm = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), comm_kind(str(e["name"]), e.get("args")),
                  str(e["name"])) for e in main_ops if comm_kind(str(e["name"]), e.get("args"))]
    main_comm = _outermost(main_comm)
    for s, t, kind, name in main_comm:
        intervals.append(Interval(s, t, kind, f"thread {main}", name))
    comm_spans = [(s, t) for s, t, _, _ in main_comm]
    # top-level ops of the main thread (an op inside another is part of it), less their communication
    cur_end = -1.0
    for e in main_ops:
        s, t = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if s < cur_end:
            continue
        cur_end = t
        name = str(e["name"])
        if comm_kind(name, e.get("args")):
            continue
        kind = "optimizer" if any(a <= s and t <= b for a, b in opt) else "compute"
        for a, b in _pieces(s, t, comm_spans):
            intervals.append(Interval(a, b, kind, f"thread {main}", name))
    # communication executed by backend threads (gloo:all_reduce ...), and comm ops on other threads
    # (annotations such as gloo:all_reduce / gloo:recv span the backend's work until completion,
    # on whichever thread; they overlap compute when the op is asynchronous)
    for e in anns + [e for e in ops if e.get("tid") != main]:
        name = str(e.get("name", ""))
        kind = comm_kind(name, e.get("args"))
        if kind is None:
            continue
        intervals.append(Interval(float(e["ts"]), float(e["ts"]) + float(e["dur"]), kind,
                                  f"thread {e.get('tid')}", name))
    return intervals, []


def _outermost(spans: list[tuple]) -> list[tuple]:
    """Drop spans nested inside an earlier one (sorted by start)."""
    out, end = [], -1.0
    for span in sorted(spans, key=lambda x: (x[0], -x[1])):
        if span[0] >= end:
            out.append(span)
            end = span[1]
    return out


def _pieces(s: float, t: float, holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """[s, t) less the holes."""
    out, cur = [], s
    for a, b in holes:
        if b <= cur or a >= t:
            continue
        if a > cur:
            out.append((cur, a))
        cur = max(cur, b)
    if cur < t:
        out.append((cur, t))
    return out


def measured_breakdown(path: str | Path, step: int | None = None) -> StepBreakdown:
    """The measured step (``step`` = N of ``ProfilerStep#N``, or the average of all)."""
    doc = load_trace(path)
    events = doc["_complete"]
    steps = _steps(events)
    device = any(e.get("cat") in DEVICE_CATS for e in events)
    notes: list[str] = []
    if device:
        intervals, windows, notes = _device_intervals(events, steps)
        where = "device"
    else:
        intervals, notes = _host_intervals(events)
        windows = steps
        where = "host"
    if not intervals:
        raise ConfigError("--trace", f"{path}: no compute or communication events found")
    if not windows:
        lo = min(i.start for i in intervals)
        hi = max(i.end for i in intervals)
        windows = [("whole trace", lo, hi)]
        notes.append("no ProfilerStep#N annotations: the whole trace is taken as one step")
    if step is not None:
        chosen = [w for w in windows if w[0] == f"ProfilerStep#{step}"]
        if not chosen:
            names = ", ".join(w[0] for w in windows)
            raise ConfigError("--step", f"ProfilerStep#{step} is not in the trace (it has: {names})")
        windows = chosen
    else:
        windows, dropped = drop_truncated_last_step(windows)
        if dropped:
            notes.append(dropped)
    # the trace's clock is in µs
    sec = [Interval(i.start * 1e-6, i.end * 1e-6, i.category, i.lane, i.name) for i in intervals]
    per_step = [breakdown_of(sec, (lo * 1e-6, hi * 1e-6), str(path), name) for name, lo, hi in windows]
    result = per_step[0] if len(per_step) == 1 else average(per_step, str(path))
    missing = [c for c in CATEGORIES if result.busy_s[c] == 0.0]
    result.notes = notes + result.notes + [f"measured on the {where} timeline" + ("" if device else " (the trace has no device events)")]
    if missing:
        result.notes.append("not in the trace: " + ", ".join(missing))
    return result


# --------------------------------------------------------------------------- simulated side
_PURPOSE_KIND = {"tp_comm": "all_reduce", "pp_comm": "send_recv", "dp_comm": "all_reduce", "cp_comm": "send_recv",
                 "ep_comm": "all_to_all"}


def sim_comm_kind(name: str, category: str, zero_stage: int = 0) -> str:
    low = name.lower()
    for kind, pattern in _COMM_PATTERNS:
        if pattern.search(low):
            return kind
    if "gather" in low:
        return "all_gather"
    if "send" in low or "recv" in low:
        return "send_recv"
    if category == "dp_comm" and zero_stage >= 3:
        return "reduce_scatter" if low.startswith("b.") else "all_gather"
    return _PURPOSE_KIND.get(category, "all_reduce")


def simulated_breakdown(result, rank_class: str | None = None, zero_stage: int = 0) -> StepBreakdown:
    """The simulated step of one rank class, grouped like a measured trace."""
    events = list(result.timeline)
    classes = sorted({e.rank_class for e in events})
    if not classes:
        raise ConfigError("scenario", "the simulation produced no timeline (did the layout fit?)")
    if rank_class is None:
        rank_class = classes[0]
    if rank_class not in classes:
        raise ConfigError("--rank-class", f"{rank_class!r} is not simulated (rank classes: {', '.join(classes)})")
    intervals = []
    for e in events:
        if e.rank_class != rank_class:
            continue
        if e.category in ("compute", "recompute"):
            cat = "compute"
        elif e.category == "optimizer":
            cat = "optimizer"
        else:
            cat = sim_comm_kind(e.name, e.category, zero_stage)
        intervals.append(Interval(e.start_s, e.end_s, cat, e.stream, e.name))
    out = breakdown_of(intervals, (0.0, float(result.step_time_s)), "simulated", f"simulated step ({rank_class})")
    return out


def stage_of_rank(rank: int | None, num_gpus: int, pp: int) -> str | None:
    if rank is None:
        return None
    per_stage = max(1, num_gpus // max(pp, 1))
    return f"stage{min(rank // per_stage, pp - 1)}"


# --------------------------------------------------------------------------- comparison
def compare_rows(measured: StepBreakdown, simulated: StepBreakdown) -> list[dict[str, Any]]:
    """One row per category present on either side, with the relative error."""
    m, s = measured.rows(), simulated.rows()
    rows = []
    for key in m:
        mv, sv = m[key], s.get(key, 0.0)
        if key in CATEGORIES and mv == 0.0 and sv == 0.0:
            continue
        rows.append({"category": key, "measured_s": mv, "simulated_s": sv,
                     "relative_error": (sv - mv) / mv if mv > 0 else None})
    return rows


COLORS = {"compute": "#4C72B0", "optimizer": "#8172B2", "all_reduce": "#DD8452", "all_gather": "#55A868",
          "reduce_scatter": "#C44E52", "broadcast": "#937860", "send_recv": "#DA8BC3", "all_to_all": "#8C8C8C",
          "barrier": "#CCB974"}


def plot_timelines(measured: StepBreakdown, simulated: StepBreakdown, path: str | Path, title: str = "") -> Path:
    """PNG: the measured step's lanes above the simulated step's, coloured by category."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes: list[tuple[str, list[Interval]]] = []
    for label, b in (("measured", measured), ("simulated", simulated)):
        names = sorted({i.lane for i in b.intervals})
        for lane in names:
            lanes.append((f"{label}: {lane}", [i for i in b.intervals if i.lane == lane]))
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.45 * max(len(lanes), 1)))
    for row, (_, items) in enumerate(reversed(lanes)):
        by_cat: dict[str, list[tuple[float, float]]] = {}
        for i in items:
            by_cat.setdefault(i.category, []).append((i.start * 1e3, (i.end - i.start) * 1e3))
        for cat, bars in by_cat.items():
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=COLORS.get(cat, "#999999"))
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([name for name, _ in reversed(lanes)], fontsize=8)
    ax.set_xlabel("time in step (ms)")
    ax.set_xlim(0, max(measured.duration_s, simulated.duration_s) * 1e3 * 1.02)
    used = sorted({i.category for b in (measured, simulated) for i in b.intervals}, key=CATEGORIES.index)
    ax.legend(handles=[Patch(color=COLORS.get(c, "#999999"), label=c) for c in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.18 - 0.6 / max(len(lanes), 1)), fontsize=8, ncol=min(len(used), 6), frameon=False)
    ax.set_title(title or f"measured ({measured.duration_s * 1e3:.1f} ms) vs simulated ({simulated.duration_s * 1e3:.1f} ms)")
    fig.tight_layout()
    from simulator.report.plots import save_figure

    path = save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
