"""Time of one kernel on one accelerator: a roofline with calibrated efficiencies.

    t(op) = max(flops / (peak · eff_gemm(size)), bytes / (hbm_bw · eff_mem)) + launch overhead

``eff_gemm`` is the accelerator's GEMM efficiency curve (efficiency vs GFLOP of one GEMM,
interpolated in log10 size; batched attention GEMMs use the size of one GEMM and the
``attention_efficiency_factor``). Where the constants come from is recorded in the spec's
``efficiency.source`` / ``fitted_on``. Each distinct op shape is priced once (memoized).
An op's ``executed_fraction`` scales the FLOPs its kernel runs (a causal fused attention kernel
skips the masked tiles) while the counted FLOPs stay as they are.
"""

from __future__ import annotations

import math
from functools import lru_cache

from hardware_specs.schema import Accelerator
from workloads.graph import Op, gemm_class


def gemm_efficiency(accelerator: Accelerator, gflop: float) -> float:
    """Efficiency of one GEMM of ``gflop`` GFLOP, log-linear between the curve's points."""
    points = accelerator.efficiency.gemm_curve
    if gflop <= points[0].gflop:
        return points[0].efficiency
    if gflop >= points[-1].gflop:
        return points[-1].efficiency
    for lo, hi in zip(points, points[1:], strict=False):
        if lo.gflop <= gflop <= hi.gflop:
            frac = (math.log10(gflop) - math.log10(lo.gflop)) / (math.log10(hi.gflop) - math.log10(lo.gflop))
            return lo.efficiency + frac * (hi.efficiency - lo.efficiency)
    return points[-1].efficiency  # unreachable: the curve is sorted


class ComputeModel:
    """Prices ops for one accelerator and one precision (fp8 GEMMs use the fp8 peak)."""

    def __init__(self, accelerator: Accelerator, precision: str, fp8_gemms=("attention_proj", "mlp", "experts")):
        self.accelerator = accelerator
        self.precision = precision
        self.peak_flops = accelerator.peak_tflops[precision] * 1e12
        # FP8 (Micikevicius et al. 2022; Transformer Engine): the GEMMs of the classes in
        # ``fp8_gemms`` run at the fp8 peak and cast their two inputs to fp8 (read 2 B, write 1 B
        # per element, plus the amax reduction folded into the same pass) as extra memory-bound
        # work; attention and the other GEMMs (LM head, router by default) stay in bf16.
        self.fp8 = precision == "fp8"
        self.fp8_gemms = frozenset(fp8_gemms)
        self.bf16_peak_flops = (accelerator.peak_tflops.get("bf16", accelerator.peak_tflops[precision]) * 1e12
                                     if self.fp8 else self.peak_flops)
        eff = accelerator.efficiency
        self.mem_bw = accelerator.hbm_bandwidth_gb_per_s * 1e9 * eff.memory_bound_efficiency
        self.optimizer_bw = accelerator.hbm_bandwidth_gb_per_s * 1e9 * (
            eff.optimizer_efficiency if eff.optimizer_efficiency is not None else eff.memory_bound_efficiency)
        self.launch_s = eff.kernel_launch_overhead_us * 1e-6
        self._time = lru_cache(maxsize=None)(self._time_uncached)

    def time_s(self, op: Op) -> float:
        """Seconds for one op (collectives are priced by the network, not here)."""
        if op.kind == "collective":
            raise ValueError(f"{op.name} is a collective: the network model prices it")
        kind = op.kind
        if kind == "gemm" and self.fp8 and gemm_class(op.name) not in self.fp8_gemms:
            kind = "gemm_bf16"  # a GEMM kept in higher precision in an fp8 run
        return self._time(kind, op.flops * op.executed_fraction, op.bytes_moved, op.m, op.n, op.k, op.batch)

    def _time_uncached(self, kind: str, flops: float, bytes_moved: float, m: int, n: int, k: int, batch: int) -> float:
        memory_s = bytes_moved / self.mem_bw
        if kind == "memory":
            return memory_s + self.launch_s
        eff = gemm_efficiency(self.accelerator, 2.0 * m * n * k / 1e9)
        if kind == "attention":
            eff *= self.accelerator.efficiency.attention_efficiency_factor
            return max(flops / (self.bf16_peak_flops * eff), memory_s) + self.launch_s
        if kind == "gemm_bf16":
            return max(flops / (self.bf16_peak_flops * eff), memory_s) + self.launch_s
        gemm_s = max(flops / (self.peak_flops * eff), memory_s) + self.launch_s
        if self.fp8:
            gemm_s += batch * (m * k + k * n) * 3 / self.mem_bw + self.launch_s
        return gemm_s

    def ops_time_s(self, ops) -> float:
        return sum(self.time_s(op) for op in ops if op.kind != "collective")

    def copy_s(self, nbytes: float) -> float:
        """A device copy of ``nbytes``: read and write once."""
        return 2 * nbytes / self.mem_bw + self.launch_s if nbytes > 0 else 0.0

    def add_into_s(self, nbytes: float) -> float:
        """``x += y`` over ``nbytes`` of x: read both, write x (a memory-bound kernel)."""
        return 3 * nbytes / self.mem_bw + self.launch_s if nbytes > 0 else 0.0

    def optimizer_step_s(self, local_params: float, bytes_per_param_touched: float) -> float:
        """Optimizer step as a streaming kernel over the local (possibly sharded) parameters, at
        the optimizer's own achieved bandwidth (``optimizer_efficiency``; measured by the harness's
        fused-Adam row, where a streaming step over four states runs faster than the mean of the
        activation kernels ``memory_bound_efficiency`` describes)."""
        return local_params * bytes_per_param_touched / self.optimizer_bw + self.launch_s
