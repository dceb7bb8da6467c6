"""Chrome trace-event JSON of a simulated step (opens in Perfetto or chrome://tracing).

One process per rank class (pipeline stage in symmetric mode), one thread per stream;
complete events ("ph": "X") with microsecond timestamps, per the Trace Event Format
(Google, "Trace Event Format" document).
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator.report.result import SimulationResult

_STREAM_ORDER = {"compute": 0, "tp": 1, "dp": 2, "pp": 3}


def chrome_trace(result: SimulationResult) -> dict:
    actors = sorted({e.rank_class for e in result.timeline}, key=lambda a: (len(a), a))
    pid = {a: i for i, a in enumerate(actors)}
    events: list[dict] = []
    for actor in actors:
        events.append({"ph": "M", "name": "process_name", "pid": pid[actor], "args": {"name": actor}})
        for stream, tid in _STREAM_ORDER.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid[actor], "tid": tid, "args": {"name": stream}})
    for e in result.timeline:
        events.append({
            "ph": "X", "name": e.name, "cat": e.category, "pid": pid[e.rank_class],
            "tid": _STREAM_ORDER.get(e.stream, 9), "ts": e.start_s * 1e6, "dur": (e.end_s - e.start_s) * 1e6,
        })
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"scenario": result.scenario_name, "step_time_s": result.step_time_s}}


def write_chrome_trace(result: SimulationResult, path: str | Path) -> Path:
    """Write the trace atomically (a temporary file renamed into place: nothing half-written)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(chrome_trace(result)))
    tmp.replace(path)
    return path
