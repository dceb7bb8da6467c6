"""Chrome trace-event JSON of a simulated step (opens in Perfetto or chrome://tracing).

One process per rank class (pipeline stage in symmetric mode), one thread per stream;
complete events ("ph": "X") with microsecond timestamps, per the Trace Event Format
(Google, "Trace Event Format" document).
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator.report.result import SimulationResult

_STREAM_ORDER = {"compute": 0, "tp": 1, "cp": 2, "ep": 3, "dp": 4, "pp": 5}


def _stream_tid(stream: str) -> int:
    return _STREAM_ORDER.get(stream, len(_STREAM_ORDER) + sum(map(ord, stream)) % 1000)


def chrome_trace(result: SimulationResult, ranks: list[int] | None = None) -> dict:
    """The trace document. ``ranks``: only these rank classes (indices in the trace's process order:
    pipeline stages in symmetric mode), to keep a large step's trace small.

    Every stream that has an event gets a named track (compute, tp, cp, ep, dp, pp, ...). Events
    carry ``args`` (bytes on the busiest link, group size, the collective); a pipeline send carries
    a flow arrow ("s"/"f" events, Trace Event Format "Flow events") to the stage that receives it."""
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
    for e in result.timeline:
        if e.rank_class not in pid:
            continue
        ts, dur = e.start_s * 1e6, (e.end_s - e.start_s) * 1e6
        event = {"ph": "X", "name": e.name, "cat": e.category, "pid": pid[e.rank_class],
                 "tid": _stream_tid(e.stream), "ts": ts, "dur": dur}
        if e.args:
            event["args"] = dict(e.args)
        events.append(event)
        if e.flow_to in pid:
            flow_id += 1
            events.append({"ph": "s", "id": flow_id, "name": "pp send", "cat": "pp_flow", "pid": pid[e.rank_class],
                           "tid": _stream_tid(e.stream), "ts": ts})
            events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "pp send", "cat": "pp_flow",
                           "pid": pid[e.flow_to], "tid": _stream_tid("compute"), "ts": ts + dur})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"scenario": result.scenario_name, "step_time_s": result.step_time_s}}


def write_chrome_trace(result: SimulationResult, path: str | Path, ranks: list[int] | None = None) -> Path:
    """Write the trace atomically (a temporary file renamed into place: nothing half-written)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(chrome_trace(result, ranks)))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
