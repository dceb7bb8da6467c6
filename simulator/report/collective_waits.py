"""The collectives of a run on several ranks, read from every rank's profiler trace (``clustersim validate-runs``).

A CPU (gloo) run records each collective as a ``gloo:<name>`` event on the process group's own thread, from the
moment the rank's work starts to the moment it ends, and every rank of the harness runs on one host, so its traces
share one clock. Set side by side, the k-th collective of every rank gives:

- its time on each rank (``own``): what the rank's main thread waits when the collective blocks it (FSDP2's gathers
  and reduces, the tensor-parallel all-reduces on a CPU);
- the wait for the group's last rank: the last start less this rank's start. The profile prices a mean wait per
  collective from the ``collective_cadence`` rows of ``skew.csv`` (equal GEMM segments, then an all-reduce);
- the spread of one collective's time (median against mean): a long right tail is what made
  ``simulator.cost.calibration.collective_time_column`` fit the laws on the rows' means.

Sends and receives are left out; where the ranks' sequences of collectives differ, the wait is not computed. The source of the
method is the fifteenth session's diagnosis of fsdp's and tp's under-prediction (validation/harness/README.md).
Nothing here feeds a prediction.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from simulator.report.compare import _steps, load_trace

#: a group collective as the process group's thread records it (gloo; NCCL's host-side records alike); not a
#: send or receive: a pipeline posts its receive ahead, so its time is the wait for the sender's schedule
COLLECTIVE_EVENT = re.compile(r"^(gloo|nccl):(?!.*(send|recv)$)")


def _rank_collectives(path: str | Path) -> tuple[list[tuple[str, float, float]], int]:
    """(name, start us, duration us) of the collectives that start inside the trace's profiled steps, in start
    order, and the number of steps."""
    doc = load_trace(path)
    events = doc["_complete"]
    windows = _steps(events)
    out = []
    for e in events:
        name = str(e.get("name", ""))
        if not COLLECTIVE_EVENT.match(name):
            continue
        ts = float(e["ts"])
        if any(lo <= ts < hi for _, lo, hi in windows):
            out.append((name, ts, float(e["dur"])))
    out.sort(key=lambda c: c[1])
    return out, len(windows)


def traced_collectives(paths: list[str | Path]) -> dict[str, Any] | None:
    """Per profiled step, the mean over ranks of the collectives' count, their time (s) on the rank, and the wait
    (s) for the group's last rank to start (None where the ranks' sequences of collectives differ); the median and
    mean of one collective's time. None without collectives or steps."""
    ranks = [_rank_collectives(p) for p in paths]
    ranks = [(c, n) for c, n in ranks if c and n]
    if not ranks:
        return None
    per_rank_steps = [n for _, n in ranks]
    own = [sum(d for _, _, d in c) / n for c, n in ranks]
    count = [len(c) / n for c, n in ranks]
    durations = sorted(d for c, _ in ranks for _, _, d in c)
    wait = None
    seqs = [[name for name, _, _ in c] for c, _ in ranks]
    if len(ranks) >= 2 and all(s == seqs[0] for s in seqs) and len(set(per_rank_steps)) == 1:
        total = [0.0] * len(ranks)
        for k in range(len(seqs[0])):
            starts = [c[k][1] for c, _ in ranks]
            last = max(starts)
            for r, s in enumerate(starts):
                total[r] += last - s
        wait = sum(t / n for t, (_, n) in zip(total, ranks, strict=True)) / len(ranks) * 1e-6
    mid = len(durations) // 2
    median = durations[mid] if len(durations) % 2 else (durations[mid - 1] + durations[mid]) / 2
    return {"ranks": len(ranks), "collectives_per_step": sum(count) / len(count),
            "traced_s_per_step": sum(own) / len(own) * 1e-6, "wait_for_last_rank_s_per_step": wait,
            "one_median_s": median * 1e-6, "one_mean_s": sum(durations) / len(durations) * 1e-6}
