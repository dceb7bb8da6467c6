"""The loss kernel as the harness's training runs it: ``F.cross_entropy`` forward + backward on fp32 logits.

The harness GPT's loss (validation/harness/model.py ``GPT.forward``, tp = 1) is
``F.cross_entropy(logits.float(), targets)``: a log-softmax over the vocabulary and the NLL gather
forward, the NLL scatter and the log-softmax backward. The simulator prices it as one memory-bound
op (workloads/graph.py ``head_work``: 3 passes over the b·s·V fp32 logits forward, 6 backward). On a
CPU the log-softmax is not bound by memory: it runs an exp and a log per element, and the
``memory.csv`` log_softmax row streams at ~10 GB/s where the memory-bound kernels' harmonic mean is
~13 GB/s; traced in a quiet loop (s12, single) the loss took 16.8 ms a step against 11.6 ms priced.

This benchmark times that call at the harness's logits shapes (the default model's vocabulary and
sequence, micro-batches 1..8: the strategies run 1, 2, 4 and 8 sequences), every rank at once as in
a job, on fresh logits each call cycling through copies larger than the last-level cache (a training
step's logits come from the LM head GEMM, not from cache). Each sample of the loss alternates with one
of ``memory.csv``'s ``log_softmax`` kernel on as many elements (the same rotating copies,
validation/harness/microbench.py ``memory_kernel_copies``): a gauge of how fast the host ran at that
moment, so the loss can be put on the scale of the memory rows even when the host's load moved
between the two (rows ``kernel=log_softmax_gauge``; the loss row's ``over_gauge_median`` is the median
over adjacent pairs of loss sample / gauge sample, which a load that changes from one pair to the
next does not move the way it moves either median). ``clustersim calibrate`` turns the rows into
the loss kernel's own efficiency (simulator/cost/calibration.py ``fit_loss_kernel``). CPU only: on a
GPU the fused loss runs near streaming bandwidth and the simulator's memory-bound price stands.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from validation.harness.launcher import RankContext
from validation.harness.stats import summarize, time_op

#: Micro-batches (sequences) of the rows: the harness strategies' micro-batch sizes (layouts.py).
LOSS_MICRO_BATCHES = (1, 2, 4, 8)


def bench_cross_entropy(ctx: RankContext, warmup: int, reps: int, min_sample_s: float, llc_bytes: int,
                        spec: dict | None = None, micro_batches: tuple[int, ...] = LOSS_MICRO_BATCHES) -> list[dict]:
    """Rows (this rank) per micro-batch: ``kernel=cross_entropy_fwd_bwd``, ``F.cross_entropy(logits,
    targets).backward()`` on (b·s, V) fp32 logits that require grad, the gradient reset to None before
    each call; and ``kernel=log_softmax_gauge``, memory.csv's log_softmax on b·s·V elements, its samples
    alternating with the loss's."""
    if ctx.is_cuda:
        return []
    from validation.harness.microbench import _inner_count, memory_kernel_copies, operand_copies
    from validation.harness.model import DEFAULT_SPEC

    spec = spec or DEFAULT_SPEC
    vocab, seq = int(spec["vocab_size"]), int(spec["seq_length"])
    gen = torch.Generator(device="cpu").manual_seed(7)
    rows = []
    for b in micro_batches:
        tokens = b * seq
        elements = tokens * vocab
        copies = operand_copies(2 * elements * 4, llc_bytes)  # the logits and their gradient
        sets = [(torch.randn(tokens, vocab, generator=gen).to(ctx.device).requires_grad_(True),
                 torch.randint(0, vocab, (tokens,), generator=gen).to(ctx.device)) for _ in range(copies)]
        state = {"i": 0}

        def loss_fwd_bwd(sets=sets, state=state):
            logits, target = sets[state["i"] % len(sets)]
            state["i"] += 1
            logits.grad = None
            F.cross_entropy(logits, target).backward()

        gauge, gauge_bytes, gauge_copies = memory_kernel_copies("log_softmax", elements, ctx.device, torch.float32,
                                                                llc_bytes)
        # both samples last as long (at least one loss call): a short sample on a host with more threads
        # than cores slips between preemptions more often than a long one, which would bias the ratio
        one_loss_s = min(time_op(loss_fwd_bwd, 1, 3, ctx.sync))
        target_s = max(min_sample_s, one_loss_s)
        inner = {"loss": _inner_count(loss_fwd_bwd, ctx.sync, target_s), "gauge": _inner_count(gauge, ctx.sync, target_s)}
        fns = {"loss": loss_fwd_bwd, "gauge": gauge}
        samples: dict[str, list[float]] = {"loss": [], "gauge": []}
        for _ in range(warmup):
            loss_fwd_bwd()
            gauge()
        for _ in range(reps):
            for name in ("loss", "gauge"):
                samples[name] += time_op(fns[name], 0, 1, ctx.sync, inner[name])
        shape = {"micro_batch_size": b, "tokens": tokens, "vocab": vocab, "elements": elements}
        ratios = [x / y for x, y in zip(samples["loss"], samples["gauge"], strict=True) if y > 0]
        rows.append({"kernel": "cross_entropy_fwd_bwd", "precision": "fp32", **shape, "operand_copies": copies,
                     **summarize(samples["loss"]), "over_gauge_median": float(np.median(ratios)), "rank": ctx.rank})
        rows.append({"kernel": "log_softmax_gauge", "precision": "fp32", **shape, "bytes": gauge_bytes,
                     "operand_copies": gauge_copies, **summarize(samples["gauge"]), "rank": ctx.rank})
        del sets, gauge, fns
    return rows
