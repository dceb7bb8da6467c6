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

    return fwd_bwd, spec_map


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
    return [{"kernel": "gpt_fwd_bwd", "precision": "fp32", "micro_batch_size": b, "tokens": b * s,
             "model": json.dumps(spec_map, sort_keys=True), **st, "rank": ctx.rank}]
