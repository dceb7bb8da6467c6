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

That benchmark times each rank's segment from its own exit of a barrier: it leaves out when each
rank *leaves* the synchronisation. On a CPU host with gloo a rank leaves a collective when the
scheduler next runs its main thread after gloo's threads finish, and ranks whose threads (main,
gloo's, the loopback transport's) outnumber the cores are sliced by the scheduler a few ms at a
time; a training step that all-reduces every few ms (the harness's tensor parallelism: 36
all-reduces in a step of ~250 ms) meets that at each one. Traced on the 2-vCPU VM (2026-12-06
04:08, the harness's tp run): each rank waited on average 1.0 ms for the other at its all-reduces,
3-4 ms stalls alternating between the ranks, where the same loop's barrier rows gave 0.18 ms at
3.8 ms segments. :func:`bench_collective_cadence` measures the wait where it happens: every rank runs
equal GEMM segments, each followed by an all-reduce (no barrier), notes the time it *arrives*
at each all-reduce (``time.perf_counter``: CLOCK_MONOTONIC, one clock for every process of the
host, which is where the launcher runs the ranks), and the wait at a collective is the last
rank's arrival less one's own -- release skew, scheduling and the segment's own jitter together.
Its rows (``method = collective_cadence``) give a CPU profile's wait per group collective, added to
the collectives' laws (simulator/cost/calibration.py ``fit_collective_wait``); ``sync_jitter`` stays
the barrier rows'.
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


#: Segment lengths (s) between the all-reduces of :func:`bench_collective_cadence`: the harness's tensor
#: parallelism all-reduces every ~3-10 ms, its pipeline stages send every ~10-30 ms, data parallelism ~once a step.
CADENCES_S = (0.004, 0.008, 0.016, 0.032)
#: The all-reduce between segments: the harness tp's activation all-reduce (4 x 128 tokens x 256 fp32 = 512 KiB).
CADENCE_ALL_REDUCE_BYTES = 512 * 1024


def bench_collective_cadence(ctx: RankContext, reps: int = 40, cadences_s: tuple[float, ...] = CADENCES_S,
                             size_bytes: int = CADENCE_ALL_REDUCE_BYTES) -> list[dict]:
    """Rows (rank 0's copy; ``method = collective_cadence``, CPU only): per cadence, ``reps`` rounds of a
    segment of equal GEMM work then an all-reduce of ``size_bytes``, back to back as a training step runs
    them; ``wait_mean_s`` is the mean over ranks and rounds (the first 3 dropped) of the last rank's arrival
    at the all-reduce less the rank's own, ``relative_wait`` that over the mean segment (see the module
    docstring)."""
    if ctx.world_size < 2 or ctx.is_cuda:
        return []
    m, n, k = 512, 256, 256
    gen = torch.Generator(device="cpu").manual_seed(13)
    a = torch.randn(m, k, generator=gen)
    b = torch.randn(k, n, generator=gen)
    buf = torch.randn(size_bytes // 4, generator=gen)
    torch.mm(a, b)
    t0 = time.perf_counter()
    for _ in range(10):
        torch.mm(a, b)
    per = torch.tensor([(time.perf_counter() - t0) / 10], dtype=torch.float64)
    dist.all_reduce(per)
    per_gemm_s = float(per) / ctx.world_size
    rows = []
    skip = min(3, reps - 1)
    for cadence in cadences_s:
        count = max(1, round(cadence / per_gemm_s))
        arrivals, segments = [], []
        dist.barrier()
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(count):
                torch.mm(a, b)
            t1 = time.perf_counter()
            arrivals.append(t1)
            segments.append(t1 - t0)
            dist.all_reduce(buf)
        mine = torch.tensor(arrivals, dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(every, mine)
        stacked = torch.stack(every)[:, skip:]
        waits = stacked.max(dim=0).values.unsqueeze(0) - stacked  # every rank's wait at every all-reduce
        seg = torch.tensor(segments[skip:], dtype=torch.float64)
        dist.all_reduce(seg)
        seg_mean = float(seg.mean()) / ctx.world_size
        wait_mean = float(waits.mean())
        rows.append({"method": "collective_cadence", "world_size": ctx.world_size, "segment_target_s": cadence,
                     "gemms": count, "segment_mean_s": seg_mean, "wait_mean_s": wait_mean,
                     "wait_median_s": float(waits.median()), "relative_wait": wait_mean / seg_mean,
                     "reps": reps - skip, "gemm_mnk": [m, n, k], "collective": "all_reduce",
                     "size_bytes": size_bytes})
    return rows
