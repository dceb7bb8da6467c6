"""Timing helpers: warm-up, repetitions, median and spread (p10/p90)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def summarize(samples_s: list[float]) -> dict[str, float]:
    """Median, p10, p90, min, mean of a list of durations (seconds)."""
    a = np.asarray(samples_s, dtype=float)
    return {
        "median_s": float(np.median(a)),
        "p10_s": float(np.percentile(a, 10)),
        "p90_s": float(np.percentile(a, 90)),
        "min_s": float(a.min()),
        "mean_s": float(a.mean()),
        "reps": int(a.size),
    }


def time_op(fn: Callable[[], object], warmup: int, reps: int, sync: Callable[[], None] | None = None,
            inner: int = 1) -> list[float]:
    """Time ``fn`` ``reps`` times after ``warmup`` calls. Each sample runs ``fn`` ``inner`` times
    (for ops far shorter than the clock's resolution) and reports the time of one call."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / inner)
    return samples
