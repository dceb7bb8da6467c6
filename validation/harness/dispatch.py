"""Eager dispatch: what a training step of the harness GPT costs the host beyond its kernels' work.

PyTorch eager runs every op from Python: the module calls, the dispatcher, autograd's graph and
its backward nodes, allocation and gradient accumulation sit between the kernels, and on a CPU
the same core runs them and the kernels, so none of it is hidden. The simulator prices it as
``kernel_launch_overhead_us`` on each of its kernels. A one-element linear layer
(``memory.csv`` ``tiny_linear_fwd_bwd``) gives that per kernel for a bare op; a step of the
harness's own GPT runs ~3.5 real ops (views, splits, transposes, adds, the autograd engine's
nodes) per kernel the simulator counts, and those are not in it.

This benchmark times the harness GPT's forward + loss + backward at a tiny shape
(:data:`DISPATCH_SPEC`: the default model's layers, heads, norm, biases and embeddings with
hidden 16, vocabulary 64, 8 tokens), where the kernels do almost no work and the time is the
dispatch. ``clustersim calibrate`` simulates the same step and sets the per-kernel overhead that
makes the simulator's step equal the measured one (simulator/cost/calibration.py
``fit_eager_dispatch``): the simulator's own kernel count, so the ops it does not model one by
one are carried by those it does. On a CPU only: on a GPU the host queues kernels ahead of the
device and this time is hidden (the spmd planner's eager floor, ``host_dispatch_us_per_kernel``,
is another mechanism).
"""

from __future__ import annotations

import json

import numpy as np
import torch

from validation.harness.launcher import RankContext
from validation.harness.stats import summarize, time_op

#: The tiny shape: the harness default's structure (validation/harness/model.py DEFAULT_SPEC) with
#: hidden 16, vocabulary 64 and 8 tokens of one sequence.
DISPATCH_SHAPE = {"hidden_size": 16, "vocab_size": 64, "seq_length": 8}
DISPATCH_MICRO_BATCH = 1


def dispatch_spec(base: dict | None = None) -> dict:
    """The model mapping of the dispatch row: ``base`` (default the harness's DEFAULT_SPEC) at the tiny shape."""
    from validation.harness.model import DEFAULT_SPEC

    return {**(base or DEFAULT_SPEC), **DISPATCH_SHAPE, "name": "harness-gpt-dispatch",
            "source": "validation/harness/dispatch.py: the harness default's structure at a tiny shape"}


def tiny_gpt_step(ctx: RankContext):
    """(the tiny GPT's forward + loss + backward as a call, its model mapping): what the rows time; also the
    gauge of the host's eager speed beside other rows (validation/harness/fsdp_host.py)."""
    fwd_bwd, spec_map, _ = _tiny_gpt(ctx)
    return fwd_bwd, spec_map


def _tiny_gpt(ctx: RankContext):
    """(forward + loss + backward as a call, the model mapping, the module) of :func:`tiny_gpt_step`."""
    from validation.harness.model import GPT
    from workloads.schema import TransformerSpec

    spec_map = dispatch_spec()
    spec = TransformerSpec.model_validate(spec_map)
    torch.manual_seed(0)
    model = GPT(spec).to(ctx.device)
    params = list(model.parameters())
    b, s = DISPATCH_MICRO_BATCH, spec.seq_length
    gen = torch.Generator(device="cpu").manual_seed(5)
    tokens = torch.randint(0, spec.vocab_size, (b, s), generator=gen).to(ctx.device)
    targets = torch.randint(0, spec.vocab_size, (b, s), generator=gen).to(ctx.device)

    def fwd_bwd():
        for p in params:
            p.grad = None
        model(tokens, targets).backward()

    return fwd_bwd, spec_map, model


def bench_eager_dispatch(ctx: RankContext, warmup: int, reps: int, min_sample_s: float) -> list[dict]:
    """One row (this rank): the tiny GPT's forward + loss + backward, gradients reset to None
    before each call (so no accumulation kernels), fp32. Every rank runs it at once, as in a job."""
    if ctx.is_cuda:
        return []
    from validation.harness.microbench import _inner_count

    fwd_bwd, spec_map = tiny_gpt_step(ctx)
    b, s = DISPATCH_MICRO_BATCH, DISPATCH_SHAPE["seq_length"]
    inner = _inner_count(fwd_bwd, ctx.sync, min_sample_s)
    st = summarize(time_op(fwd_bwd, warmup, reps, ctx.sync, inner))
    rows = [{"kernel": "gpt_fwd_bwd", "precision": "fp32", "micro_batch_size": b, "tokens": b * s,
             "model": json.dumps(spec_map, sort_keys=True), **st, "rank": ctx.rank}]
    # three times the repetitions: the row is a difference of timed calls (B - C, each ~10x A), and the ranks' median
    # of two is their mean (at load ~5 on 2 cores one rank's 40-repetition median read 5.9 where three others read 2.1-2.5)
    return rows + bench_cold_dispatch(ctx, warmup, COLD_REPS_PER_REP * reps)


#: repetitions of the cold row per repetition of the warm one
COLD_REPS_PER_REP = 3


def evict_bytes(base: dict | None = None, micro_batch: int = 4) -> int:
    """Bytes each eviction streams: the harness model's MLP activation at its training micro-batch (fp32
    tokens x ffn; the default: 4 x 128 x 1024 x 4 B = 2 MiB), what a training step's kernel touches
    between two of its ops (the GEMM outputs, GELU, the LayerNorms' inputs are this size or a quarter of it)."""
    from validation.harness.model import DEFAULT_SPEC
    from workloads.schema import TransformerSpec

    spec = TransformerSpec.model_validate(base or DEFAULT_SPEC)
    return micro_batch * spec.seq_length * spec.ffn_size * 4


def tiny_gpt_evicting_step(ctx: RankContext, nbytes: int):
    """The dispatch row's step with the caches emptied between its ops as a training step's kernels empty them.

    Returns (step(evict: bool), evictions alone (count), evictions per step). Every leaf module's forward pre-hook
    and every parameter's post-accumulate-grad hook (its gradient is ready, in the backward) streams ``nbytes``
    (``buf.add_(1)``, two buffers in turn, so each is last touched two evictions earlier: out of the per-core
    caches); with ``evict`` False the same hooks run and return at once, so the hooks' own Python is in both."""
    fwd_bwd, _, model = _tiny_gpt(ctx)
    bufs = [torch.zeros(max(1, nbytes // 4), device=ctx.device) for _ in range(2)]
    state = {"on": False, "turn": 0, "count": 0}

    def evict(*_args) -> None:
        state["count"] += 1
        if state["on"]:
            state["turn"] ^= 1
            with torch.no_grad():
                bufs[state["turn"]].add_(1.0)

    for m in model.modules():
        if not list(m.children()):
            m.register_forward_pre_hook(evict)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(evict)

    def step(on: bool) -> None:
        state["on"] = on
        fwd_bwd()

    state["count"] = 0
    step(False)
    per_step = state["count"]

    def alone(count: int) -> None:
        with torch.no_grad():
            for _ in range(count):
                state["turn"] ^= 1
                bufs[state["turn"]].add_(1.0)

    return step, alone, per_step


def bench_cold_dispatch(ctx: RankContext, warmup: int, reps: int) -> list[dict]:
    """One row (this rank, CPU): the dispatch row's step with the caches emptied between its ops, over the same
    step with them left warm, interleaved per repetition (so the host's drift hits both alike).

    The dispatch row (:func:`bench_eager_dispatch`) runs its step back to back: the interpreter's, the
    dispatcher's and autograd's code and data stay in the per-core caches. In a training step every op
    follows a kernel that streamed megabytes, and the same ops take several times longer: the harness GPT's
    forward + backward profiled at the dispatch row's shape and at the training shape in one process
    (2026-12-06, load 4.4, alternating): aten::view 89 -> 351 us per pass, aten::t 62 -> 285, transpose
    89 -> 294, as_strided 51 -> 184, empty 38 -> 168 (ops that touch no tensor data), framework self time
    0.85 -> 3.76 ms, Python between ops 1.04 -> 5.25 ms. Per repetition: A = the step with the hooks
    returning at once (after one such untimed step, so it runs warm), B = with every hook streaming
    :func:`evict_bytes`, C = the same number of evictions alone. ``median_s`` is the median of B - C; ``over_warm_median`` the median of (B - C) / A, the factor
    ``clustersim calibrate`` applies to the dispatch row (``fit_eager_dispatch``)."""
    if ctx.is_cuda:
        return []
    import time

    nbytes = evict_bytes()
    step, alone, per_step = tiny_gpt_evicting_step(ctx, nbytes)
    for _ in range(warmup):
        step(False)
        step(True)
        alone(per_step)
    a_s, net_s, ratios = [], [], []
    for _ in range(reps):
        step(False)  # back to back: the timed warm step follows a warm one, as in the dispatch row, not the evictions
        t0 = time.perf_counter()
        step(False)
        t1 = time.perf_counter()
        step(True)
        t2 = time.perf_counter()
        alone(per_step)
        t3 = time.perf_counter()
        a, net = t1 - t0, (t2 - t1) - (t3 - t2)
        a_s.append(a)
        net_s.append(net)
        ratios.append(net / a)
    b, s = DISPATCH_MICRO_BATCH, DISPATCH_SHAPE["seq_length"]
    st = summarize(net_s)
    return [{"kernel": "gpt_fwd_bwd_cold", "precision": "fp32", "micro_batch_size": b, "tokens": b * s,
             "model": json.dumps(dispatch_spec(), sort_keys=True), **st, "rank": ctx.rank,
             "warm_hooked_median_s": float(np.median(a_s)), "over_warm_median": float(np.median(ratios)),
             "evictions": per_step, "evict_bytes": nbytes}]
