"""Synchronisation skew: how long the fastest rank waits for the slowest at a collective.

Ranks that do the same work between two synchronisations do not finish together: each one's
time varies by a few percent (other processes, the scheduler, caches, clocks), and every
collective that blocks waits for the slowest member. Over n ranks with independent relative
jitter of standard deviation σ the expected wait is σ·e_n of the segment, e_n the expected
maximum of n standard normals (the "system noise" model of Petrini et al. 2003 and Hoefler
et al. 2010, SC'10). This benchmark measures it directly: all ranks leave a barrier, run the
same GEMM count (a segment of about ``segment_s``), time it, and all-gather their times; the
row's ``relative_wait`` is the mean over repetitions of (max - mean) / mean. Calibration turns
it into ``efficiency.sync_jitter`` σ (simulator/cost/calibration.py).

On this 2-vCPU VM: 5-12% of the segment for segments of 4-90 ms (two runs), nearly flat in
the segment length, so the wait grows with the work between synchronisations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from validation.harness.launcher import RankContext


@dataclass(frozen=True)
class SkewConfig:
    segments_s: tuple[float, ...] = (0.004, 0.02, 0.08)
    reps: int = 20

    @classmethod
    def for_device(cls, is_cuda: bool, quick: bool) -> SkewConfig:
        if is_cuda:
            return cls(segments_s=(0.0005, 0.002, 0.01), reps=10 if quick else 20)
        return cls(segments_s=(0.004, 0.02), reps=10) if quick else cls()


def bench_sync_skew(ctx: RankContext, cfg: SkewConfig) -> list[dict]:
    """One row per segment length (the same on every rank; rank 0's copy is kept)."""
    if ctx.world_size < 2:
        return []
    m, n, k = (4096, 4096, 4096) if ctx.is_cuda else (512, 1024, 256)
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(11)
    a = torch.randn(m, k, generator=gen).to(ctx.device, dtype)
    b = torch.randn(k, n, generator=gen).to(ctx.device, dtype)
    # one GEMM's time, agreed by all ranks, so every rank runs the same count per segment
    torch.mm(a, b)
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(5):
        torch.mm(a, b)
    ctx.sync()
    per = torch.tensor([(time.perf_counter() - t0) / 5], device=ctx.device, dtype=torch.float64)
    dist.all_reduce(per)
    per_gemm_s = float(per) / ctx.world_size
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rows = []
    for segment in cfg.segments_s:
        count = max(1, round(segment / per_gemm_s))
        waits, means = [], []
        for _ in range(cfg.reps):
            dist.barrier()
            ctx.sync()
            t0 = time.perf_counter()
            for _ in range(count):
                torch.mm(a, b)
            ctx.sync()
            mine = torch.tensor([time.perf_counter() - t0], device=ctx.device, dtype=torch.float64)
            every = torch.zeros(ctx.world_size, device=ctx.device, dtype=torch.float64)
            gather(every, mine)
            mean = float(every.mean())
            waits.append(float(every.max()) - mean)
            means.append(mean)
        seg = sum(means) / len(means)
        rows.append({"world_size": ctx.world_size, "segment_target_s": segment, "gemms": count,
                     "segment_mean_s": seg, "wait_mean_s": sum(waits) / len(waits),
                     "relative_wait": sum(waits) / len(waits) / seg, "reps": cfg.reps,
                     "gemm_mnk": [m, n, k]})
    return rows
