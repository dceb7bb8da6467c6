"""A speed probe: one fixed GEMM, sampled on every rank at the moments that matter.

On a shared host the same kernel runs at different speeds from one second to the next (this
2-vCPU VM: the 512x256x1024 fp32 GEMM of :data:`CPU_SHAPE`, timed back to back for 12 s in two
processes, had per-second medians from 3.2 to 5.6 ms, both processes slow in the same
seconds). The harness samples the probe during the compute microbenchmarks and once before
every timed training step, so the files say how fast the machine was when the profile was
fitted and while each run was timed (``clustersim validate-runs`` reports the ratio). Every
sample is taken right after other work (after a benchmark row, after a training step): the
first GEMM after a training step ran 6-13% slower than the same GEMM back to back, so samples
taken in bursts would read as a faster machine. The probe is a diagnostic: nothing is fitted
on it and no prediction is scaled by it (one run's probe said the machine was 20% faster
during the training runs while the steps were not).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch
import torch.distributed as dist

from validation.harness.launcher import RankContext
from validation.harness.microbench import last_level_cache_bytes, operand_copies

CPU_SHAPE = (512, 1024, 256)     # (m, n, k): the harness model's MLP GEMM (tokens x 4h x h), ~3.5 ms
CUDA_SHAPE = (8192, 8192, 8192)  # a large bf16 GEMM (1.1 TFLOP): a few ms on a current GPU


class SpeedProbe:
    """Times single calls of the probe GEMM; :meth:`summary` gives their median and spread."""

    def __init__(self, ctx: RankContext):
        self.ctx = ctx
        m, n, k = self.shape = CUDA_SHAPE if ctx.is_cuda else CPU_SHAPE
        dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
        gen = torch.Generator(device="cpu").manual_seed(7)
        # the same state as the GEMM microbenchmark's rows: operands from memory, fresh output
        copies = operand_copies((m * k + k * n) * (2 if ctx.is_cuda else 4), last_level_cache_bytes(ctx.is_cuda, ctx.device))
        self.pairs = [(torch.randn(m, k, generator=gen).to(ctx.device, dtype),
                       torch.randn(k, n, generator=gen).to(ctx.device, dtype)) for _ in range(copies)]
        self._turn = itertools.cycle(self.pairs)
        torch.mm(*self.pairs[0])  # first call: library initialisation, not timed
        self.samples_s: list[float] = []

    def sample(self, count: int = 1) -> None:
        """Time ``count`` probe GEMMs. Every rank calls it at the same points, and the ranks
        meet at a barrier first, so each sample times the GEMM with every rank running it at
        once, in the microbenchmarks and in every training strategy alike. Without the barrier
        a rank's sample overlapped whatever the other ranks were doing at that moment: in a
        pipeline, the other stage's backward (2026-12-04: pp_gpipe's samples 3.9-10.9 ms, median
        2.25x the calibration's, while its steps ran 10% over the prediction)."""
        for _ in range(count):
            a, b = next(self._turn)
            self.ctx.sync()
            if dist.is_available() and dist.is_initialized():
                dist.barrier()
            t0 = time.perf_counter()
            torch.mm(a, b)
            self.ctx.sync()
            self.samples_s.append(time.perf_counter() - t0)

    def summary(self) -> dict:
        return probe_summary(self.samples_s, self.shape)


def probe_summary(samples_s: list[float], shape) -> dict:
    """Median and p10/p90 of probe samples (pooled over ranks by the caller)."""
    if not samples_s:
        return {"median_s": None, "p10_s": None, "p90_s": None, "samples": 0, "shape_mnk": list(shape)}
    a = np.asarray(samples_s, dtype=float)
    return {"median_s": float(np.median(a)), "p10_s": float(np.percentile(a, 10)),
            "p90_s": float(np.percentile(a, 90)), "samples": int(a.size), "shape_mnk": list(shape)}
