"""Microbenchmarks run by every rank of a launched job (see :mod:`validation.harness.launcher`).

- GEMM throughput over a sweep of shapes and precisions (fp32 on CPU; fp32/bf16/fp16 on GPU),
  each call on the next of several operand copies, so its operands come from memory as in a
  training step and not from the cache a back-to-back loop leaves warm (:func:`operand_copies`),
  plus batched attention-shaped GEMMs (``bmm``);
- memory-bound kernels (copy, add, GELU, LayerNorm, softmax, log-softmax, fused Adam) over tensor
  sizes, each call on the next of several operand copies as the GEMMs are (a training step's
  elementwise kernels read activations and states written long before), and tiny ops
  whose time is the per-kernel (launch / dispatch) overhead: a one-element add, and a
  one-element linear layer's forward and backward under autograd (the eager overhead);
- collectives (all_reduce, all_gather, reduce_scatter, broadcast, send_recv) over message sizes;
- a GEMM with and without all-reduces running beside it (:mod:`validation.harness.overlap`);
- how long ranks wait for each other after equal work, between barriers and, on a CPU, at all-reduces
  issued every few ms (:mod:`validation.harness.skew`);
- on a CPU, the harness GPT's forward and backward at a tiny shape: the eager dispatch between
  kernels (:mod:`validation.harness.dispatch`);
- on a CPU, FSDP2's all-gather and reduce-scatter round trips on the harness's block beside the bare
  collectives of the same bytes: its host work per gather / reduce (:mod:`validation.harness.fsdp_host`).

All ranks run the compute benchmarks at the same time (as in a training job, where every rank
computes), so contention for cores / memory bandwidth is part of what is measured. Each row
records the median and the p10/p90 spread of ``reps`` timed repetitions after ``warmup``.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from validation.harness.launcher import RankContext
from validation.harness.stats import summarize, time_op

KIB = 1024
MIB = 1024 * 1024

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")


@dataclass
class MicrobenchConfig:
    """What to sweep and how hard. ``quick`` keeps a run to a few seconds."""

    gemm_shapes: list[tuple[int, int, int]] = field(default_factory=lambda: [
        (64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
        (512, 256, 256), (512, 768, 256), (512, 1024, 256), (512, 256, 1024), (512, 4096, 256),
        (256, 1024, 512), (2048, 256, 256), (2048, 1024, 256), (2048, 256, 1024), (2048, 4096, 256),
    ])
    bmm_shapes: list[tuple[int, int, int, int]] = field(default_factory=lambda: [
        (16, 128, 128, 64), (16, 128, 64, 128), (32, 256, 256, 64), (32, 256, 64, 256),
    ])
    gemm_layouts: list[str] = field(default_factory=lambda: ["nn", "nt", "tn"])
    attention_shapes: list[tuple[int, int, int, int]] = field(default_factory=lambda: [
        (4, 4, 128, 64), (2, 4, 256, 64), (8, 8, 128, 32), (2, 16, 512, 64),
    ])  # (batch, heads, seq, head_dim)
    precisions: list[str] | None = None  # default: fp32 on CPU; fp32, bf16, fp16 on GPU
    memory_elements: list[int] = field(default_factory=lambda: [2**16, 2**18, 2**20, 2**22, 2**24])
    memory_kernels: list[str] = field(default_factory=lambda: ["copy", "add", "gelu", "layernorm", "softmax",
                                                              "log_softmax", "adam"])
    collective_bytes: list[int] = field(default_factory=lambda: [4 * KIB * 4**i for i in range(8)])  # 4 KiB..64 MiB
    collectives: list[str] = field(default_factory=lambda: list(COLLECTIVES))
    warmup: int = 3
    reps: int = 15
    min_sample_s: float = 2e-3  # short ops are repeated inside one sample to reach this
    cold_gemm_operands: bool = True  # GEMMs cycle through operand copies > 2x the LLC (see operand_copies)
    cold_memory_operands: bool = True  # memory-bound kernels cycle through copies too (memory_kernel_copies)
    sync_skew: bool = True      # run the synchronisation-skew benchmark (validation/harness/skew.py)
    overlap: bool = True        # run the overlap benchmark (compute slowed by communication)
    collectives_after_compute: bool = True  # also time each collective issued right after a kernel
    eager_dispatch: bool = True  # time the harness GPT's step at a tiny shape (validation/harness/dispatch.py; CPU)
    loss_kernel: bool = True  # time F.cross_entropy fwd+bwd at the harness's logits shapes (validation/harness/loss.py; CPU)
    fsdp_host: bool = True  # time FSDP2's gather / reduce beside the bare collectives (validation/harness/fsdp_host.py; CPU)

    @classmethod
    def quick(cls) -> MicrobenchConfig:
        return cls(
            gemm_shapes=[(128, 128, 128), (256, 256, 256), (512, 256, 256), (512, 768, 256), (512, 1024, 256),
                         (512, 256, 1024), (512, 4096, 256), (1024, 1024, 1024)],
            bmm_shapes=[(16, 128, 128, 64)],
            attention_shapes=[(4, 4, 128, 64), (2, 4, 256, 64)],
            memory_elements=[2**16, 2**18, 2**20, 2**22],
            collective_bytes=[4 * KIB * 4**i for i in range(7)],  # 4 KiB..16 MiB
            warmup=2,
            reps=7,
        )

    def to_dict(self) -> dict:
        return asdict(self)


MAX_OPERAND_COPIES = 64
MAX_OPERAND_BYTES = 512 * MIB
DEFAULT_LLC_BYTES = 32 * MIB


def last_level_cache_bytes(is_cuda: bool, device=None) -> int:
    """The last-level cache a kernel's operands would stay in: a CUDA device's L2, or the
    largest CPU cache that sysfs lists (L3 here: 32 MiB); 32 MiB where neither says."""
    if is_cuda:
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or DEFAULT_LLC_BYTES
    sizes = []
    try:
        from pathlib import Path

        for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
            text = entry.read_text().strip().upper()
            scale = {"K": 1024, "M": MIB, "G": 1024 * MIB}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        pass
    return max(sizes) if sizes else DEFAULT_LLC_BYTES


def operand_copies(bytes_per_set: int, llc_bytes: int) -> int:
    """How many copies of a kernel's operands, used in turn, make every call read them from
    memory rather than from cache: enough to fill twice the last-level cache (at most 64
    copies, 512 MiB). This is the state of a training step's GEMMs: a layer's weight and
    saved activation were last touched a whole pass earlier, and other kernels ran between.
    On this host one 512x256x1024 fp32 GEMM ran 11-14% slower on rotating copies than back
    to back on one warm set (interleaved, so host drift hits both alike)."""
    if bytes_per_set <= 0:
        return 1
    wanted = -(-2 * llc_bytes // bytes_per_set)
    return max(1, min(MAX_OPERAND_COPIES, wanted, MAX_OPERAND_BYTES // bytes_per_set))


def _inner_count(fn, sync, target_s: float) -> int:
    """How many calls make one sample last about ``target_s`` (at least 1)."""
    import time

    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    dt = max(time.perf_counter() - t0, 1e-7)
    return max(1, min(10_000, int(target_s / dt)))


def _rows_stats(samples: list[float]) -> dict:
    return summarize(samples)


def bench_gemm(ctx: RankContext, cfg: MicrobenchConfig, after_row=None) -> list[dict]:
    """GEMM rows; ``after_row()`` (the speed probe) runs after each mm row."""
    precisions = cfg.precisions or (["fp32", "bf16", "fp16"] if ctx.is_cuda else ["fp32"])
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(ctx.rank)
    llc = last_level_cache_bytes(ctx.is_cuda, ctx.device)
    for precision in precisions:
        dtype = DTYPES[precision]
        for m, n, k in cfg.gemm_shapes:
            for layout in cfg.gemm_layouts:
                # nn: C = A·B; nt: C = A·Bᵀ (a linear's forward, x·Wᵀ); tn: C = Aᵀ·B (its weight gradient)
                copies = operand_copies((m * k + k * n) * BYTES[precision], llc) if cfg.cold_gemm_operands else 1
                pairs = []
                for _ in range(copies):
                    a = torch.randn(*((k, m) if layout[0] == "t" else (m, k)), generator=gen).to(ctx.device, dtype)
                    b = torch.randn(*((n, k) if layout[1] == "t" else (k, n)), generator=gen).to(ctx.device, dtype)
                    pairs.append((a.t() if layout[0] == "t" else a, b.t() if layout[1] == "t" else b))
                turn = itertools.cycle(pairs)
                fn = lambda turn=turn: torch.mm(*next(turn))  # noqa: E731
                inner = _inner_count(fn, ctx.sync, cfg.min_sample_s)
                st = _rows_stats(time_op(fn, cfg.warmup, cfg.reps, ctx.sync, inner))
                flops = 2.0 * m * n * k
                rows.append({"kind": "mm", "layout": layout, "precision": precision, "batch": 1, "m": m, "n": n,
                             "k": k, "gflop": flops / 1e9, "operand_copies": copies,
                             **st, "tflops": flops / st["median_s"] / 1e12,
                             "tflops_p10": flops / st["p90_s"] / 1e12, "tflops_p90": flops / st["p10_s"] / 1e12})
                if after_row is not None:
                    after_row()
        for batch, m, n, k in cfg.bmm_shapes:
            a = torch.randn(batch, m, k, generator=gen).to(ctx.device, dtype)
            b = torch.randn(batch, k, n, generator=gen).to(ctx.device, dtype)
            fn = lambda a=a, b=b: torch.bmm(a, b)  # noqa: E731
            inner = _inner_count(fn, ctx.sync, cfg.min_sample_s)
            st = _rows_stats(time_op(fn, cfg.warmup, cfg.reps, ctx.sync, inner))
            flops = 2.0 * batch * m * n * k
            rows.append({"kind": "bmm", "layout": "nn", "precision": precision, "batch": batch, "m": m, "n": n, "k": k,
                         "gflop": flops / 1e9, **st, "tflops": flops / st["median_s"] / 1e12,
                         "tflops_p10": flops / st["p90_s"] / 1e12, "tflops_p90": flops / st["p10_s"] / 1e12})
        for batch, heads, seq, dim in cfg.attention_shapes:
            rows += _bench_attention(ctx, cfg, precision, batch, heads, seq, dim, gen)
    return rows


def _bench_attention(ctx, cfg, precision, batch, heads, seq, dim, gen) -> list[dict]:
    """Causal scaled-dot-product attention (the kernel the harness model runs), forward and
    forward+backward. ``gflop`` counts QKᵀ and AV in full (4·b·h·s²·d forward; backward 2x),
    as the simulator counts attention."""
    dtype = DTYPES[precision]
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=gen).to(ctx.device, dtype).requires_grad_()
               for _ in range(3))
    grad = torch.randn(batch, heads, seq, dim, generator=gen).to(ctx.device, dtype)
    fwd_flops = 4.0 * batch * heads * seq * seq * dim

    def fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    rows = []
    for kind, fn, flops in (("sdpa", fwd, fwd_flops), ("sdpa_fwd_bwd", fwd_bwd, 3 * fwd_flops)):
        inner = _inner_count(fn, ctx.sync, cfg.min_sample_s)
        st = _rows_stats(time_op(fn, cfg.warmup, cfg.reps, ctx.sync, inner))
        rows.append({"kind": kind, "layout": "causal", "precision": precision, "batch": batch * heads, "m": seq,
                     "n": seq, "k": dim, "gflop": flops / 1e9, **st, "tflops": flops / st["median_s"] / 1e12,
                     "tflops_p10": flops / st["p90_s"] / 1e12, "tflops_p90": flops / st["p10_s"] / 1e12})
    return rows


def _memory_kernel(name: str, n: int, device, dtype):
    """A memory-bound kernel on ``n`` elements and the bytes it moves (reads + writes)."""
    x = torch.randn(n, device=device, dtype=dtype)
    y = torch.randn(n, device=device, dtype=dtype)
    out = torch.empty_like(x)
    e = x.element_size()
    if name == "copy":
        return (lambda: out.copy_(x)), 2 * n * e
    if name == "add":
        return (lambda: torch.add(x, y, out=out)), 3 * n * e
    if name == "gelu":
        return (lambda: F.gelu(x)), 2 * n * e
    width = 256 if n >= 256 else n
    x2 = x.view(-1, width)
    if name == "layernorm":
        w = torch.ones(width, device=device, dtype=dtype)
        b = torch.zeros(width, device=device, dtype=dtype)
        return (lambda: F.layer_norm(x2, (width,), w, b)), 2 * n * e
    if name == "softmax":
        return (lambda: torch.softmax(x2, dim=-1)), 2 * n * e
    if name == "log_softmax":
        return (lambda: torch.log_softmax(x2, dim=-1)), 2 * n * e
    if name == "adam":
        # one fused Adam step over n parameters: reads p, g, m, v and writes p, m, v
        p = torch.nn.Parameter(x.clone())
        p.grad = y.clone()
        try:
            opt = torch.optim.Adam([p], lr=1e-3, fused=True)
        except (RuntimeError, TypeError, ValueError):
            opt = torch.optim.Adam([p], lr=1e-3)
        return opt.step, 7 * n * e
    raise ValueError(f"unknown memory kernel {name!r}")


def memory_kernel_copies(name: str, n: int, device, dtype, llc_bytes: int, cold: bool = True):
    """``_memory_kernel`` on ``operand_copies`` independent sets (inputs, outputs, Adam states),
    one call each in turn, and the bytes one call moves, and the number of copies.

    A training step's memory-bound kernels do not find their operands in cache: the GELU reads
    what the MLP GEMM wrote, the backward kernels read activations saved a whole pass earlier,
    the optimizer streams every parameter and state. Back to back on one set (the harness before
    2026-12-06) a set that fits the core's L2 (2 MiB on the 2-vCPU VM of 2026-12-06) stays there:
    in a 2-rank job, each row's one-set and rotating samples alternated, minimum of 9, rotating
    sets took 2.2x as long for add on 2^18 fp32 elements, 1.5-1.8x GELU on 2^20, 1.6x LayerNorm
    and 1.4x softmax on 2^18, 1.4x fused Adam on 2^18, and 0.93-1.07x on 2^22 elements (sets of
    16-112 MiB, in no cache either way). In one process beside the harness GPT's own step, that
    step's GELU (2^19 elements) took 2.2x the one-set row's time and 1.2x the rotating one's,
    its LayerNorm (2^17) 2.3x and 1.1x. The GEMMs were already timed this way."""
    fn, nbytes = _memory_kernel(name, n, device, dtype)
    copies = operand_copies(nbytes, llc_bytes) if cold else 1
    if copies == 1:
        return fn, nbytes, 1
    fns = [fn] + [_memory_kernel(name, n, device, dtype)[0] for _ in range(copies - 1)]
    for each in fns:  # touch every set once: outputs' first pages and Adam's lazily made states
        each()
    turn = itertools.cycle(fns)
    return (lambda: next(turn)()), nbytes, copies


def bench_memory(ctx: RankContext, cfg: MicrobenchConfig, after_row=None) -> list[dict]:
    """Memory-bound kernel rows; ``after_row()`` (the speed probe) runs after each. Each kernel
    cycles through operand copies (:func:`memory_kernel_copies`) unless ``cold_memory_operands``
    is off; the tiny rows (per-kernel overhead) stay on one set."""
    rows = []
    llc = last_level_cache_bytes(ctx.is_cuda, ctx.device)
    for precision in ["fp32"] + (["bf16"] if ctx.is_cuda else []):
        dtype = DTYPES[precision]
        for kernel in cfg.memory_kernels:
            for n in cfg.memory_elements:
                fn, nbytes, copies = memory_kernel_copies(kernel, n, ctx.device, dtype, llc, cfg.cold_memory_operands)
                inner = _inner_count(fn, ctx.sync, cfg.min_sample_s)
                st = _rows_stats(time_op(fn, cfg.warmup, cfg.reps, ctx.sync, inner))
                del fn  # free the copies before the next row allocates its own
                rows.append({"kernel": kernel, "precision": precision, "elements": n, "bytes": nbytes,
                             "operand_copies": copies, **st, "gb_per_s": nbytes / st["median_s"] / 1e9})
                if after_row is not None:
                    after_row()
        # per-kernel overhead: ops on one element, where the time is all dispatch/launch
        x = torch.ones(1, device=ctx.device, dtype=dtype)
        y = torch.ones(1, device=ctx.device, dtype=dtype)
        fn = lambda x=x, y=y: torch.add(x, y)  # noqa: E731
        inner = _inner_count(fn, ctx.sync, cfg.min_sample_s)
        st = _rows_stats(time_op(fn, cfg.warmup, cfg.reps, ctx.sync, inner))
        rows.append({"kernel": "tiny_add", "precision": precision, "elements": 1, "bytes": 3 * x.element_size(),
                     **st, "gb_per_s": 3 * x.element_size() / st["median_s"] / 1e9})
        rows += _eager_overhead_rows(ctx, cfg, dtype, precision)
    return rows


def _eager_overhead_rows(ctx: RankContext, cfg: MicrobenchConfig, dtype, precision: str) -> list[dict]:
    """What a kernel costs beyond its work in an eager autograd step: a one-element
    ``nn.Linear`` forward + backward (its three kernels -- forward, input gradient, weight
    gradient -- with their dispatch, autograd nodes and gradient accumulation), and the
    ``sum().backward()`` that drives it alone; calibration takes (linear - sum) / 3 per kernel."""
    lin = torch.nn.Linear(1, 1).to(ctx.device, dtype)
    x = torch.ones(1, 1, device=ctx.device, dtype=dtype)
    leaf = torch.ones(1, device=ctx.device, dtype=dtype, requires_grad=True)

    def linear_fwd_bwd():
        lin(x).sum().backward()

    def sum_bwd():
        leaf.sum().backward()

    rows = []
    for name, fn in (("tiny_linear_fwd_bwd", linear_fwd_bwd), ("tiny_sum_bwd", sum_bwd)):
        inner = _inner_count(fn, ctx.sync, cfg.min_sample_s)
        st = _rows_stats(time_op(fn, cfg.warmup, cfg.reps, ctx.sync, inner))
        rows.append({"kernel": name, "precision": precision, "elements": 1, "bytes": 0, **st, "gb_per_s": 0.0})
    return rows


def bus_bytes(collective: str, size_bytes: float, world: int) -> float:
    """NCCL-tests bus volume of a collective whose per-rank buffer is ``size_bytes``."""
    if collective == "all_reduce":
        return 2 * (world - 1) / world * size_bytes
    if collective in ("all_gather", "reduce_scatter"):
        return (world - 1) / world * size_bytes
    return float(size_bytes)


def _collective_fn(name: str, size_bytes: int, ctx: RankContext):
    ws, rank = ctx.world_size, ctx.rank
    n = max(ws, size_bytes // 4 // ws * ws)  # fp32 elements, divisible by the world size
    buf = torch.ones(n, device=ctx.device)
    if name == "all_reduce":
        return lambda: dist.all_reduce(buf)
    if name == "all_gather":
        shard = torch.ones(n // ws, device=ctx.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(buf, shard)
    if name == "reduce_scatter":
        shard = torch.empty(n // ws, device=ctx.device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(shard, buf)
    if name == "broadcast":
        return lambda: dist.broadcast(buf, 0)
    if name == "send_recv":
        # ping-pong between pairs (0,1), (2,3), ...; one sample is one one-way transfer
        peer = rank ^ 1
        if peer >= ws:
            return lambda: None

        def pingpong():
            if rank % 2 == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
        return pingpong
    raise ValueError(f"unknown collective {name!r}")


def _compute_between(ctx: RankContext):
    """The kernel run before each collective in the ``after_compute`` context: a GEMM of about
    a millisecond on a CPU core (0.13 GFLOP), ~0.1 ms on a GPU (bf16 4096^3)."""
    m, n, k, dtype = (512, 512, 256, torch.float32) if not ctx.is_cuda else (4096, 4096, 4096, torch.bfloat16)
    a = torch.randn(m, k).to(ctx.device, dtype)
    b = torch.randn(k, n).to(ctx.device, dtype)
    return lambda: torch.mm(a, b)


def bench_collectives(ctx: RankContext, cfg: MicrobenchConfig) -> list[dict]:
    """Each sample: a barrier, then ``inner`` operations (the same count on every rank, so that
    sub-millisecond ones are timed over a few ms), the time of one; the slowest rank's sample
    counts (a collective is done when its last rank is). Two contexts per (collective, size):

    - ``back_to_back``: the operations one after another (what nccl-tests measure);
    - ``after_compute``: each operation issued right after a kernel (``_compute_between``), as in a
      training step, its time being the pair's less the kernel's alone (measured just before on
      the same rank). On a CPU host this is markedly slower than back to back (gloo's threads
      wake from sleep, the buffers are cold in cache, the ranks arrive skewed); on GPUs the two
      should agree. ``clustersim calibrate`` fits the collectives on ``after_compute`` rows.
    """
    import time

    if ctx.world_size < 2:
        return []
    rows = []
    kernel = _compute_between(ctx) if cfg.collectives_after_compute else None
    for name in cfg.collectives:
        for size in cfg.collective_bytes:
            fn = _collective_fn(name, size, ctx)
            dist.barrier()
            for _ in range(cfg.warmup):
                fn()
            ctx.sync()
            t0 = time.perf_counter()
            fn()
            ctx.sync()
            probe = time.perf_counter() - t0
            inner = torch.tensor([max(1, min(1000, int(cfg.min_sample_s / max(probe, 1e-7))))])
            dist.all_reduce(inner, op=dist.ReduceOp.MAX)
            inner = int(inner.item())

            def timed(body, inner: int = inner) -> float:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(inner):
                    body()
                ctx.sync()
                return (time.perf_counter() - t0) / inner

            contexts = {"back_to_back": [timed(fn) for _ in range(cfg.reps)]}
            if kernel is not None:
                def pair(fn=fn):
                    kernel()
                    fn()
                after = []
                for _ in range(cfg.reps):
                    alone = timed(kernel)
                    after.append(max(timed(pair) - alone, 0.0))
                contexts["after_compute"] = after
            bb = bus_bytes(name, size, ctx.world_size)
            for context, samples in contexts.items():
                if name == "send_recv":
                    samples = [s / 2 for s in samples]  # one-way time of a round trip
                t = torch.tensor(samples, dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                st = summarize(t.tolist())
                rows.append({"collective": name, "context": context, "world_size": ctx.world_size,
                             "size_bytes": size, "bus_bytes": bb, "inner": inner, **st,
                             "algbw_gb_per_s": size / max(st["median_s"], 1e-12) / 1e9,
                             "busbw_gb_per_s": bb / max(st["median_s"], 1e-12) / 1e9})
    return rows


def run_microbenchmarks(ctx: RankContext, cfg: MicrobenchConfig) -> dict:
    """Rank function: every rank benchmarks compute; all join the collectives."""
    from validation.harness.probe import SpeedProbe

    # one probe sample after each GEMM and memory row: spread over the whole phase, and each
    # taken after other work, as the training runs take theirs (after a step)
    probe = SpeedProbe(ctx)
    dist.barrier()
    gemm = bench_gemm(ctx, cfg, after_row=probe.sample)
    dist.barrier()
    memory = bench_memory(ctx, cfg, after_row=probe.sample)
    dist.barrier()
    collectives = bench_collectives(ctx, cfg)
    overlap = []
    if cfg.overlap:
        from validation.harness.overlap import OverlapConfig, bench_overlap

        dist.barrier()
        overlap = bench_overlap(ctx, OverlapConfig.for_device(ctx.is_cuda, quick=cfg.reps < 10))
    dispatch = []
    if cfg.eager_dispatch and not ctx.is_cuda:
        from validation.harness.dispatch import bench_eager_dispatch

        dist.barrier()
        dispatch = bench_eager_dispatch(ctx, cfg.warmup, cfg.reps, cfg.min_sample_s)
    loss = []
    if cfg.loss_kernel and not ctx.is_cuda:
        from validation.harness.loss import bench_cross_entropy

        dist.barrier()
        loss = bench_cross_entropy(ctx, cfg.warmup, cfg.reps, cfg.min_sample_s,
                                   last_level_cache_bytes(ctx.is_cuda, ctx.device))
    fsdp = []
    if cfg.fsdp_host and not ctx.is_cuda:
        from validation.harness.fsdp_host import FSDP_REPS_PER_REP, bench_fsdp_host

        dist.barrier()
        fsdp = bench_fsdp_host(ctx, cfg.warmup, FSDP_REPS_PER_REP * cfg.reps, cfg.min_sample_s)
    skew = []
    if cfg.sync_skew:
        from validation.harness.skew import SkewConfig, bench_sync_skew

        dist.barrier()
        skew = bench_sync_skew(ctx, SkewConfig.for_device(ctx.is_cuda, quick=cfg.reps < 10))
        if not ctx.is_cuda:  # the waits at all-reduces every few ms (gloo on a CPU host)
            from validation.harness.skew import CADENCES_S, bench_collective_cadence

            dist.barrier()
            skew += bench_collective_cadence(ctx, reps=15 if cfg.reps < 10 else 40,
                                             cadences_s=CADENCES_S[::2] if cfg.reps < 10 else CADENCES_S)
    for row in gemm + memory:
        row["rank"] = ctx.rank
    return {"gemm": gemm, "memory": memory, "collectives": collectives, "overlap": overlap, "skew": skew,
            "dispatch": dispatch, "loss": loss, "fsdp": fsdp, "probe_samples_s": probe.samples_s, "probe_shape": list(probe.shape)}
