"""FSDP's host work per all-gather and per reduce-scatter, beside the bare collectives of the same bytes.

The harness's ``fsdp`` strategy (validation/harness/training.py) runs ``torch.distributed.fsdp.fully_shard``
(FSDP2) per block and at the root. Around each collective FSDP2 runs Python and small kernels on the host:
before a gather ``foreach_all_gather`` builds the gather input (``all_gather_copy_in``) and allocates the
output, after it ``foreach_all_gather_copy_out`` splits the output into the parameters and
``init_unsharded_param`` / ``_to_unsharded`` swap the module's parameters, ``reshard`` frees them again; after
a block's backward ``post_backward`` collects the unsharded gradients, ``foreach_reduce`` copies them into the
reduce-scatter input (``chunk_cat``), divides them (gloo has no average: pre- and post-divide), reduce-scatters
and hands the shard to the sharded parameter's gradient (torch 2.13 distributed/fsdp/_fully_shard/
_fsdp_param_group.py, _fsdp_collectives.py). On a CPU with gloo, whose collectives block the host, all of it
sits on the critical path. The simulator prices the collective by its law (``collectives.csv``) and the
copy-in / copy-out / gradient copy-in as memory-bound copies; the rest is not priced. In the harness's
traced fsdp run (s12, /work/notes/s12/reports/harness2.md) that was ~1 ms per gather and ~1.7 ms per
reduce beyond the laws.

This benchmark measures it without the training runs, in a 2-rank job like the other rows, on the
harness model's own block (validation/harness/model.py ``Block`` at the default spec; FSDP's host work
grows with the number of parameter tensors, so the block's twelve matter):

- ``fsdp_gather_round_trip``: ``unshard()`` + ``reshard()`` of one fully_shard-ed block (the gather, its
  copy-in and copy-out, the parameter swap and the free), beside ``bare_all_gather``:
  ``all_gather_into_tensor`` of the same padded bytes;
- ``fsdp_fwd_bwd``: forward + backward of ``num_layers`` fully_shard-ed blocks under a fully_shard-ed
  root without parameters of its own (as the harness wraps them) on a few tokens (``FSDP_TOKENS``, so the
  kernels do little), beside ``plain_fwd_bwd``: the same blocks unsharded, on the same tokens, and
  ``bare_reduce_scatter``: ``reduce_scatter_tensor`` of one block's padded bytes (and, to show what gloo
  does with a reduce-scatter, ``bare_all_reduce`` of the same bytes).

Every sample starts at a barrier; the kinds of sample alternate within each repetition, so a load that
moves between repetitions moves them alike; each sample counts as its slowest rank's (a collective ends
when its last rank does). A seventh kind, ``dispatch_gauge``, is dispatch.csv's own step (the harness GPT at
a tiny shape, validation/harness/dispatch.py; each rank alone, the ranks' mean): how fast the host ran
Python and dispatch at that moment, so ``calibrate`` can put these rows on the scale of the dispatch row
when they were taken on a busier host (rows run later into a saved loop's files). Two derived rows hold
the medians over repetitions of the differences:

- ``fsdp_gather_host`` = gather round trip - bare all-gather;
- ``fsdp_reduce_host`` = (fsdp fwd+bwd - plain fwd+bwd - 2·L·gather round trip) / L - bare reduce-scatter,
  L blocks: each block gathers twice (forward, and again in backward after the reshard) and reduces once.

``clustersim calibrate`` takes from them what the simulator does not price already (the copies it prices,
simulator/cost/calibration.py ``fit_fsdp_host``). CPU only: on a GPU the gathers and reduces run on their
own streams while the host runs ahead.
"""

from __future__ import annotations

import copy
import json
import time

import numpy as np
import torch
import torch.distributed as dist

from validation.harness.launcher import RankContext
from validation.harness.stats import summarize

#: Tokens of the forward + backward samples (one sequence): enough for the blocks' kernels to run as in a
#: step, few enough that their work is small beside the gathers and reduces (~ms on gloo).
FSDP_TOKENS = 8
#: Repetitions per the microbenchmarks' ``reps``: each repetition's derived difference subtracts samples of a few
#: ms that a loaded 2-core host moves by as much (first tries at load 1.5-2: p10..p90 of the reduce's -4..7 ms),
#: so the medians need more of them than a row of one kind.
FSDP_REPS_PER_REP = 5


class _Blocks(torch.nn.Module):
    """The blocks in a row (fully_shard wants a module with a forward at the root)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, h):
        for block in self.blocks:
            h = block(h)
        return h


def _timed(fn, inner: int) -> float:
    """One sample: a barrier, then ``fn`` ``inner`` times; seconds per call on this rank."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def bench_fsdp_host(ctx: RankContext, warmup: int, reps: int, min_sample_s: float,
                    spec: dict | None = None, tokens: int = FSDP_TOKENS) -> list[dict]:
    """The rows (every rank's samples folded by the slowest rank; return them from rank 0): one per
    kind of sample and the two derived ``fsdp_gather_host`` / ``fsdp_reduce_host`` rows (module docstring)."""
    if ctx.is_cuda or ctx.world_size < 2:
        return []
    from torch.distributed.fsdp import fully_shard

    from validation.harness.dispatch import tiny_gpt_step
    from validation.harness.model import DEFAULT_SPEC, Block
    from workloads.schema import TransformerSpec

    spec_map = spec or DEFAULT_SPEC
    model_spec = TransformerSpec.model_validate(spec_map)
    layers = int(model_spec.num_layers)
    ws = ctx.world_size
    torch.manual_seed(0)
    plain = _Blocks(Block(model_spec) for _ in range(layers)).to(ctx.device)
    sharded = copy.deepcopy(plain)
    for block in sharded.blocks:
        fully_shard(block)
    fully_shard(sharded)  # the root, with no parameters of its own (training.py wraps the model so)
    block_params = sum(p.numel() for p in plain.blocks[0].parameters())
    tensors = sum(1 for _ in plain.blocks[0].parameters())
    # FSDP2 pads each parameter's dim 0 to the world size; the gather moves the padded total
    padded = sum(-(-p.shape[0] // ws) * ws * (p.numel() // max(p.shape[0], 1)) for p in plain.blocks[0].parameters())
    gen = torch.Generator(device="cpu").manual_seed(3)
    # a leaf that requires grad, as a block's input in a step does (FSDP2 hooks its post-backward on it)
    x = torch.randn(1, tokens, model_spec.hidden_size, generator=gen).to(ctx.device).requires_grad_(True)

    def fwd_bwd(blocks):
        def run():
            for p in blocks.parameters():
                p.grad = None
            x.grad = None
            blocks(x).sum().backward()
        return run

    first = sharded.blocks[0]

    def gather_round_trip():
        first.unshard()
        first.reshard()

    gauge, gauge_model = tiny_gpt_step(ctx)
    buf = torch.ones(padded, device=ctx.device)
    shard = torch.ones(padded // ws, device=ctx.device)
    out = torch.empty(padded // ws, device=ctx.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fns = {
        "fsdp_gather_round_trip": gather_round_trip,
        "bare_all_gather": lambda: gather(buf, shard),
        "fsdp_fwd_bwd": fwd_bwd(sharded),
        "plain_fwd_bwd": fwd_bwd(plain),
        "bare_reduce_scatter": lambda: scatter(out, buf),
        "bare_all_reduce": lambda: dist.all_reduce(buf),
        "dispatch_gauge": gauge,
    }
    inner = {}
    for name, fn in fns.items():
        for _ in range(max(1, warmup)):
            fn()
        probe = min(_timed(fn, 1) for _ in range(2))
        n = torch.tensor([max(1, min(1000, int(min_sample_s / max(probe, 1e-7))))])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)  # every rank runs as many (the collectives pair up)
        inner[name] = int(n.item())
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name].append(_timed(fn, inner[name]))
    folded = {}
    for name, values in samples.items():
        t = torch.tensor(values, dtype=torch.float64)
        if name == "dispatch_gauge":  # each rank's own speed, as dispatch.csv's rows are: the ranks' mean
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= ws
        else:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        folded[name] = np.asarray(t.tolist())
    shape = {"world_size": ws, "layers": layers, "hidden_size": int(model_spec.hidden_size), "tokens": tokens,
             "block_params": block_params, "block_param_tensors": tensors, "padded_elements": padded,
             "bytes": padded * 4, "dtype": "fp32"}
    rows = [{"op": name, **shape, "inner": inner[name], **summarize(list(values)),
             **({"model": json.dumps(gauge_model, sort_keys=True)} if name == "dispatch_gauge" else {})}
            for name, values in folded.items()]
    gather = folded["fsdp_gather_round_trip"] - folded["bare_all_gather"]
    reduce = ((folded["fsdp_fwd_bwd"] - folded["plain_fwd_bwd"] - 2 * layers * folded["fsdp_gather_round_trip"])
              / layers - folded["bare_reduce_scatter"])
    for name, diff, how in (
            ("fsdp_gather_host", gather, "fsdp_gather_round_trip - bare_all_gather"),
            ("fsdp_reduce_host", reduce, "(fsdp_fwd_bwd - plain_fwd_bwd - 2*layers*fsdp_gather_round_trip)/layers"
                                         " - bare_reduce_scatter")):
        st = summarize(list(diff))  # per repetition, then the median: a derived row
        rows.append({"op": name, **shape, "inner": 0, **st, "derived_from": how})
    return rows
