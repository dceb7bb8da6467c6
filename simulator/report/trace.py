"""Chrome trace-event JSON of a simulated step (opens in Perfetto or chrome://tracing).

One process per rank class (pipeline stage in symmetric mode), one thread per stream;
complete events ("ph": "X") with microsecond timestamps, per the Trace Event Format
(Google, "Trace Event Format" document). Kernel events carry their layer and the FLOPs they run.

Summary mode (``--trace-summary``): a step of a large model has hundreds of thousands of kernels
(the default scenario: 428,267 events, 83 MB). The summary merges the consecutive events of one
layer pass on one stream (a layer's forward kernels, its recompute, its TP collectives) into one
event named after the pass, spanning its first start to its last end, whose args give the layer,
the summed FLOPs and bytes, how many events it stands for and their busy time (``busy_us`` <=
``dur`` when the stream waited inside the pass). Events with no layer (optimizer steps, gradient
buckets, pipeline sends) stay as they are; every timestamp is the simulated one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.report.result import SimulationResult, TimelineEvent

_STREAM_ORDER = {"compute": 0, "tp": 1, "cp": 2, "ep": 3, "dp": 4, "pp": 5}


def _stream_tid(stream: str) -> int:
    return _STREAM_ORDER.get(stream, len(_STREAM_ORDER) + sum(map(ord, stream)) % 1000)


def _pass_of(event: TimelineEvent) -> tuple[str, str] | None:
    """(the layer pass an event belongs to, its layer), or None. Planner names start with the pass:
    ``{phase}.mb{m}.c{chunk}.`` (simulator/strategies/spmd/plan_tasks.py); with the layer arg that names
    one layer's forward, backward or recompute in one micro-batch."""
    layer = dict(event.args).get("layer")
    parts = event.name.split(".")
    if layer is None or len(parts) < 4:
        return None
    return ".".join(parts[:3]), layer


def summarize(events: list[TimelineEvent]) -> list[dict[str, Any]]:
    """Merge consecutive events of one layer pass on one stream (see the module docstring). Returns
    dicts with the :class:`TimelineEvent` fields plus ``events`` and ``busy_s``."""
    out: list[dict[str, Any]] = []
    open_key = None
    for e in events:  # sorted by (rank class, stream, start) in the result's timeline
        part = _pass_of(e)
        key = (e.rank_class, e.stream, e.category, part) if part else None
        if key is not None and key == open_key:
            merged = out[-1]
            merged["end_s"] = max(merged["end_s"], e.end_s)
            merged["events"] += 1
            merged["busy_s"] += e.end_s - e.start_s
            for name, value in e.args:
                if name in ("flops", "bytes"):
                    merged["args"][name] = merged["args"].get(name, 0.0) + value
            continue
        args = dict(e.args)
        name = f"{part[0]}.{part[1]}" + (".recompute" if e.category == "recompute" else "") if part else e.name
        out.append({"rank_class": e.rank_class, "stream": e.stream, "name": name,
                    "category": e.category, "start_s": e.start_s, "end_s": e.end_s, "args": args,
                    "flow_to": e.flow_to, "events": 1, "busy_s": e.end_s - e.start_s})
        open_key = key
    for merged in out:
        if merged["events"] > 1:
            merged["args"].update(events=merged["events"], busy_us=merged["busy_s"] * 1e6)
    return out


def chrome_trace(result: SimulationResult, ranks: list[int] | None = None, summary: bool = False) -> dict:
    """The trace document. ``ranks``: only these rank classes (indices in the trace's process order:
    pipeline stages in symmetric mode), to keep a large step's trace small.

    Every stream that has an event gets a named track (compute, tp, cp, ep, dp, pp, ...). Events
    carry ``args`` (bytes on the busiest link, group size, the collective); a pipeline send carries
    a flow arrow ("s"/"f" events, Trace Event Format "Flow events") to the stage that receives it.
    ``summary``: one event per layer pass and stream (:func:`summarize`)."""
    actors = sorted({e.rank_class for e in result.timeline}, key=lambda a: (len(a), a))
    if ranks is not None:
        actors = [a for i, a in enumerate(actors) if i in set(ranks)]
    pid = {a: i for i, a in enumerate(actors)}
    events: list[dict] = []
    streams: dict[str, set[str]] = {a: set() for a in actors}
    for e in result.timeline:
        if e.rank_class in pid:
            streams[e.rank_class].add(e.stream)
    for actor in actors:
        events.append({"ph": "M", "name": "process_name", "pid": pid[actor], "args": {"name": actor}})
        for stream in sorted(streams[actor], key=_stream_tid):
            events.append({"ph": "M", "name": "thread_name", "pid": pid[actor], "tid": _stream_tid(stream),
                           "args": {"name": stream}})
    flow_id = 0
    timeline = [e for e in result.timeline if e.rank_class in pid]
    rows = summarize(timeline) if summary else [
        {"rank_class": e.rank_class, "stream": e.stream, "name": e.name, "category": e.category,
         "start_s": e.start_s, "end_s": e.end_s, "args": dict(e.args), "flow_to": e.flow_to} for e in timeline]
    for e in rows:
        ts, dur = e["start_s"] * 1e6, (e["end_s"] - e["start_s"]) * 1e6
        event = {"ph": "X", "name": e["name"], "cat": e["category"], "pid": pid[e["rank_class"]],
                 "tid": _stream_tid(e["stream"]), "ts": ts, "dur": dur}
        if e["args"]:
            event["args"] = e["args"]
        events.append(event)
        if e["flow_to"] in pid:
            flow_id += 1
            events.append({"ph": "s", "id": flow_id, "name": "pp send", "cat": "pp_flow",
                           "pid": pid[e["rank_class"]], "tid": _stream_tid(e["stream"]), "ts": ts})
            events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "pp send", "cat": "pp_flow",
                           "pid": pid[e["flow_to"]], "tid": _stream_tid("compute"), "ts": ts + dur})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"scenario": result.scenario_name, "step_time_s": result.step_time_s,
                         "summary": summary}}


def write_chrome_trace(result: SimulationResult, path: str | Path, ranks: list[int] | None = None,
                       summary: bool = False) -> Path:
    """Write the trace atomically (a temporary file renamed into place: nothing half-written)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(chrome_trace(result, ranks, summary)))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
