"""Where a modern row's simulated step goes, and whether the row follows its own model's sequence trend.

``python -m validation.modern.row_breakdown --case-set llmfoundry --rows 79,81`` prints, per row, what the
simulator assumes (layout, micro and global batch, precision, ZeRO stage / FSDP sharding, recompute, the
attention kernel and the head size it runs) and one micro-batch's kernel seconds by op class (fused
attention, each GEMM class, memory-bound kernels) in its forward, backward and recompute, with the rate
each class reaches on the FLOPs the model counts (a padded head runs more), on the set's fitted profile.

``--trend ROWS --predict ROW`` asks whether a row's cost follows the rows of the same model and GPU at
other sequence lengths: two factors, ``g`` on the kernels other than fused attention and ``f`` on fused
attention, are fitted by least squares so that ``g·other + f·attention + the step's non-kernel time``
matches the measured seconds per micro-batch of the ``ROWS``, and the ``ROW`` is predicted with them.
A row that only a kernel rate misprices comes out close (MPT-13B's 16K rows from its 1K-8K rows: -0.6%
on A100 80 GB, +0.5% on H100); a row that carries a cost no rate of the others explains does not
(MPT-30B's 8K rows from its 512-4K rows: +25% on A100 80 GB, +20% on H100; +30% / +28% with FSDP2's copy
kernels priced).

``--marginal ROWS`` reads the measurements alone: for rows of one model and GPU taken pairwise by sequence
length, the measured seconds per token the longer sequence adds against the fused-attention FLOPs per token
it adds (the other kernels' FLOPs per token do not depend on the sequence), i.e. the rate the run paid its
added attention at. Every head-128 MPT (1B-13B) pays one rate at each doubling from 4K to 64K: 87-119 TFLOP/s
counted on A100 (mostly 92-107; FlashAttention-2 paper's Triton kernel, causal, head 128, forward 111 and
backward 89 TFLOP/s, gives 94-98 for the same mix of passes, its FlashAttention-2 162-166) and 160-186 on H100.
MPT-30B (heads of 112) pays it at 92 -> 46 -> 25 TFLOP/s from 1K -> 2K to 4K -> 8K on A100 and 161 -> 114 -> 76
on H100: the 8K rows' cost grows with the sequence faster than any kernel rate. A diagnostic: nothing is
fitted or written.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from hardware_specs.schema import kernel_head_dim
from simulator.cost.compute import FALLBACK_ATTENTION_KERNEL, ComputeModel
from simulator.scenario import load_scenario
from simulator.simulate import simulate_point
from validation.case_set_option import add_case_set_option, require_case_set
from validation.modern.profiles import load_groups, resolved_scenario
from validation.modern.registry import SETS, built
from workloads.graph import gemm_class, is_fused_attention

PHASES = ("fwd", "bwd", "rec")


@dataclass(frozen=True)
class RowBreakdown:
    row: int
    label: str
    settings: dict[str, Any]                   # what the simulator assumes for the row
    seconds: dict[tuple[str, str], float]      # (op class, phase) -> kernel seconds of one micro-batch
    flops: dict[tuple[str, str], float]        # (op class, phase) -> FLOPs the kernels run
    step_per_micro_batch_s: float              # simulated step / micro-batches per step (comm, optimizer, bubbles in)
    measured_per_micro_batch_s: float | None   # tokens of a micro-batch / measured tokens/s per GPU

    def total(self, op_class: str | None = None) -> float:
        return sum(t for (c, _), t in self.seconds.items() if op_class is None or c == op_class)

    def total_flops(self, op_class: str) -> float:
        return sum(f for (c, _), f in self.flops.items() if c == op_class)

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one data-parallel rank."""
        return self.settings["micro_batch"] * self.settings["seq_length"]


def _op_class(op) -> str:
    if is_fused_attention(op):
        return "fused attention"
    return "gemm:" + gemm_class(op) if op.kind == "gemm" else op.kind


def breakdown(case_set: str, row: int) -> RowBreakdown:
    """One row's assumed settings and kernel seconds by op class on the set's fitted profile."""
    case = next(c for c in built(case_set)[0] if c.row == row)
    raw = resolved_scenario(case, load_groups(SETS[case_set].profile_name))
    sc = load_scenario(raw)
    par, tr = sc.parallelism, sc.training
    compute = ComputeModel(sc.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    flops: dict[tuple[str, str], float] = defaultdict(float)
    head_dims = set()
    for layer in sc.layer_graph().layers:
        for phase, ops in zip(PHASES, (layer.forward, layer.backward, layer.recompute_ops(par.recompute_mode)), strict=True):
            for op in ops:
                if op.kind == "collective":
                    continue
                key = (_op_class(op), phase)
                seconds[key] += compute.time_s(op)
                flops[key] += op.flops * op.executed_fraction
                if key[0] == "fused attention":
                    head_dims.add(op.k)
    kernel = sc.accelerator.efficiency.attention
    kernel_name = kernel.kernel if kernel is not None else f"GEMM-curve estimate ({FALLBACK_ATTENTION_KERNEL}'s head sizes)"
    runs = kernel.kernel if kernel is not None else FALLBACK_ATTENTION_KERNEL
    result = simulate_point(raw, run_if_oom=True)
    micro_batches = par.global_batch_size // (par.micro_batch_size * par.dp)
    tokens = par.micro_batch_size * sc.seq_length
    settings = {
        "model": sc.model.name, "accelerator": sc.accelerator.name, "gpus": sc.num_gpus,
        "layout": f"dp {par.dp} tp {par.tp} pp {par.pp} cp {par.cp}", "zero_stage": par.zero_stage,
        "micro_batch": par.micro_batch_size, "global_batch": par.global_batch_size,
        "micro_batches_per_step": micro_batches, "seq_length": sc.seq_length, "precision": tr.precision,
        "grad_dtype": tr.grad_dtype, "recompute": par.recompute, "attention": tr.attention,
        "attention_kernel": kernel_name,
        "head_size": ", ".join(f"{d} (runs {kernel_head_dim(runs, d)})" for d in sorted(head_dims)) or "-",
        "peak_memory_gib": round(result["peak_memory_gib"], 1), "hbm_gib": result["hbm_gib"],
    }
    measured = tokens / case.measured_rate_per_gpu if case.measured_rate_per_gpu else None
    return RowBreakdown(row, case.label, settings, dict(seconds), dict(flops),
                        result["step_time_s"] / micro_batches, measured)


def trend(case_set: str, rows: list[int], predict: int) -> tuple[float, float, RowBreakdown, float]:
    """``g``, ``f`` fitted on ``rows`` (module docstring), the predicted row's breakdown and its predicted
    seconds per micro-batch."""
    fitted = [breakdown(case_set, r) for r in rows]
    a = np.array([[b.total() - b.total("fused attention"), b.total("fused attention")] for b in fitted])
    y = np.array([b.measured_per_micro_batch_s - (b.step_per_micro_batch_s - b.total()) for b in fitted])
    (g, f), *_ = np.linalg.lstsq(a, y, rcond=None)
    target = breakdown(case_set, predict)
    attention = target.total("fused attention")
    predicted = g * (target.total() - attention) + f * attention + target.step_per_micro_batch_s - target.total()
    return float(g), float(f), target, float(predicted)


@dataclass(frozen=True)
class MarginalStep:
    shorter: RowBreakdown
    longer: RowBreakdown
    added_s_per_token: float            # measured seconds per token (one GPU) the longer sequence adds
    added_attention_flops_per_token: float  # fused-attention FLOPs per token it adds (counted; fwd, bwd, recompute)

    @property
    def tflops(self) -> float:
        """The rate the run paid its added attention at, read off the measurements alone."""
        return self.added_attention_flops_per_token / self.added_s_per_token / 1e12


def marginal_attention(case_set: str, rows: list[int]) -> list[MarginalStep]:
    """Rows of one model and GPU, sorted by sequence length, taken pairwise: what the longer sequence adds
    to the measured seconds per token against the fused-attention FLOPs per token it adds. The other
    kernels' FLOPs per token do not depend on the sequence, so where the micro-batch's tokens stay alike
    the added time is the attention's, and its rate is the kernel's as the run paid it (recompute included)."""
    rows_by_seq = sorted((breakdown(case_set, r) for r in rows), key=lambda b: b.settings["seq_length"])
    steps = []
    for short, long in pairwise(rows_by_seq):
        steps.append(MarginalStep(
            short, long,
            long.measured_per_micro_batch_s / long.tokens - short.measured_per_micro_batch_s / short.tokens,
            long.total_flops("fused attention") / long.tokens - short.total_flops("fused attention") / short.tokens))
    return steps


def print_breakdown(b: RowBreakdown) -> None:
    print(f"row {b.row} {b.label}")
    print("  assumes: " + ", ".join(f"{k} {v}" for k, v in b.settings.items()))
    total = b.total()
    print(f"  one micro-batch: kernels {total:.3f} s, simulated step / micro-batch {b.step_per_micro_batch_s:.3f} s"
          + (f", measured {b.measured_per_micro_batch_s:.3f} s" if b.measured_per_micro_batch_s else ""))
    for op_class in sorted({c for c, _ in b.seconds}):
        t = b.total(op_class)
        rate = sum(v for (c, _), v in b.flops.items() if c == op_class) / t / 1e12 if t else 0.0
        phases = " ".join(f"{p} {b.seconds.get((op_class, p), 0.0):.3f}" for p in PHASES)
        print(f"    {op_class:<22} {t:8.3f} s {100 * t / total:5.1f}%  {rate:6.1f} TFLOP/s counted  ({phases})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_set_option(parser, "case_set", sorted(SETS), repeatable=False)
    parser.add_argument("--rows", default="", help="comma-separated CSV rows (0-based) to break down")
    parser.add_argument("--trend", default="", help="comma-separated rows of one model and GPU to fit g and f on")
    parser.add_argument("--predict", type=int, help="with --trend: the row to predict")
    parser.add_argument("--marginal", default="", help="comma-separated rows of one model and GPU: the rate each "
                        "longer sequence paid its added attention at, from the measurements")
    args = parser.parse_args(argv)
    require_case_set(parser, args.case_set)
    for row in (int(r) for r in args.rows.split(",") if r):
        print_breakdown(breakdown(args.case_set, row))
    if args.trend and args.predict is not None:
        g, f, target, predicted = trend(args.case_set, [int(r) for r in args.trend.split(",")], args.predict)
        print(f"trend of rows {args.trend}: g {g:.3f} (kernels other than fused attention), f {f:.3f} (fused attention)")
        print(f"  row {target.row} {target.label}: predicted {predicted:.3f} s per micro-batch, measured "
              f"{target.measured_per_micro_batch_s:.3f}: rate error {target.measured_per_micro_batch_s / predicted - 1:+.1%} "
              f"(the simulator as fitted: {target.measured_per_micro_batch_s / target.step_per_micro_batch_s - 1:+.1%})")
    if args.marginal:
        for m in marginal_attention(args.case_set, [int(r) for r in args.marginal.split(",")]):
            print(f"rows {m.shorter.row} -> {m.longer.row} (s{m.shorter.settings['seq_length']} mbs"
                  f"{m.shorter.settings['micro_batch']} -> s{m.longer.settings['seq_length']} mbs"
                  f"{m.longer.settings['micro_batch']}): +{1e6 * m.added_s_per_token:.2f} us per token measured, "
                  f"+{m.added_attention_flops_per_token / 1e9:.2f} GFLOP of fused attention per token: "
                  f"{m.tflops:.0f} TFLOP/s counted")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
