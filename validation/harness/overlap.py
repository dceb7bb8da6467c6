"""Overlap microbenchmark: how much a compute kernel slows while a collective runs beside it.

Communication that overlaps compute is not free for the compute: NCCL kernels occupy SMs
and HBM bandwidth beside the GEMMs of the same GPU; gloo's threads take CPU cores from the
ops of the same process. The simulator models this as one number per accelerator,
``efficiency.overlap_compute_slowdown`` s: a kernel runs at rate 1/(1+s) while a collective
of its rank is in flight (simulator/engine/engine.py). This benchmark measures s directly:

1. ``gemm_alone``: the median time of one GEMM (each sample ``gemms_per_sample`` back to back);
2. ``gemm_overlapped``: the same, while ``collectives_in_flight`` asynchronous all-reduces
   (``async_op=True``) are queued on the communicator; a sample counts only if the last of
   them is still running when the GEMMs finish (so the whole sample was overlapped);
3. s = gemm_overlapped / gemm_alone - 1 (median over samples; every rank measures, since all
   ranks compute and communicate at once as in training).

It also records the collectives' time alone and under the GEMMs: communication slowed by
compute, which calibration turns into ``overlap_comm_slowdown`` c (the collectives move at
1/(1+c) of their pace while a kernel of their rank runs; simulator/cost/calibration.py). On CUDA, GEMMs are timed with events on the
compute stream (a device-wide synchronize would wait for the NCCL stream too).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from validation.harness.launcher import RankContext


@dataclass(frozen=True)
class OverlapConfig:
    gemm_shape: tuple[int, int, int] = (512, 1024, 1024)     # m, n, k of C = A·B
    collective_bytes: int = 16 * 1024 * 1024
    gemms_per_sample: int = 3
    collectives_in_flight: int = 10
    warmup: int = 2
    reps: int = 7

    @classmethod
    def for_device(cls, is_cuda: bool, quick: bool) -> OverlapConfig:
        if is_cuda:  # a large GEMM (~1 ms on an H100) beside 256 MiB all-reduces
            return cls(gemm_shape=(8192, 8192, 8192), collective_bytes=256 * 1024 * 1024, gemms_per_sample=10,
                       collectives_in_flight=8, reps=5 if quick else 9)
        return cls(reps=5) if quick else cls()


def _timer(ctx: RankContext):
    """``start(); ...; stop() -> seconds`` for work on the current (compute) stream only."""
    if ctx.is_cuda:
        def run(fn):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) / 1e3
        return run

    def run_cpu(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run_cpu


def bench_overlap(ctx: RankContext, cfg: OverlapConfig) -> list[dict]:
    if ctx.world_size < 2:
        return []
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    m, n, k = cfg.gemm_shape
    gen = torch.Generator(device="cpu").manual_seed(ctx.rank)
    a = torch.randn(m, k, generator=gen).to(ctx.device, dtype)
    b = torch.randn(k, n, generator=gen).to(ctx.device, dtype)
    buf = torch.ones(cfg.collective_bytes // 4, device=ctx.device)
    timed = _timer(ctx)

    def gemms():
        for _ in range(cfg.gemms_per_sample):
            torch.mm(a, b)

    def collectives():
        works = [dist.all_reduce(buf, async_op=True) for _ in range(cfg.collectives_in_flight)]
        for w in works:
            w.wait()
        ctx.sync()

    for _ in range(cfg.warmup):
        gemms()
        collectives()
    ctx.sync()
    alone, overlapped, comm_alone, comm_overlapped = [], [], [], []
    for _ in range(cfg.reps):  # the same count on every rank: each iteration is collective
        dist.barrier()
        alone.append(timed(gemms) / cfg.gemms_per_sample)
        dist.barrier()
        t0 = time.perf_counter()
        collectives()
        comm_alone.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(buf, async_op=True) for _ in range(cfg.collectives_in_flight)]
        t_gemm = timed(gemms) / cfg.gemms_per_sample
        still_running = not works[-1].is_completed()
        for w in works:
            w.wait()
        ctx.sync()
        comm_overlapped.append(time.perf_counter() - t0)
        if still_running:
            overlapped.append(t_gemm)
    if not overlapped:
        return [{"rank": ctx.rank, "collective": "all_reduce", "size_bytes": cfg.collective_bytes,
                 "valid_samples": 0, "note": "the collectives finished before the GEMMs: raise collectives_in_flight"}]
    g_alone, g_over = statistics.median(alone), statistics.median(overlapped)
    c_alone, c_over = statistics.median(comm_alone), statistics.median(comm_overlapped)
    flops = 2.0 * m * n * k
    return [{
        "rank": ctx.rank, "collective": "all_reduce", "size_bytes": cfg.collective_bytes,
        "collectives_in_flight": cfg.collectives_in_flight, "m": m, "n": n, "k": k,
        "precision": "bf16" if ctx.is_cuda else "fp32", "gemms_per_sample": cfg.gemms_per_sample,
        "valid_samples": len(overlapped), "samples": cfg.reps,
        "gemm_alone_s": g_alone, "gemm_overlapped_s": g_over,
        "gemm_alone_tflops": flops / g_alone / 1e12, "gemm_overlapped_tflops": flops / g_over / 1e12,
        "compute_slowdown": g_over / g_alone - 1.0,
        "collectives_alone_s": c_alone, "collectives_with_gemms_s": c_over,
    }]
