"""Training runs of the harness GPT under each parallel strategy, in every rank of one job.

Every strategy trains on the same global batch of ``global_batch`` sequences (random tokens
from a fixed seed; the target is the next token), starting from the same weights (the full
model is built from the same seed in every rank and each strategy slices or shards it), with
Adam. So every strategy's loss at step 0 is the same number — a real check that the TP, PP
and FSDP code computes the same model — and later steps agree to rounding.

Strategies (world size W):
- ``single``: no communication; every rank trains its own full copy on the whole global batch
  (``global_batch / micro_batch`` accumulated micro-batches). A rank's device then has as busy
  neighbours as in the other runs and in the microbenchmarks (on a CPU host the ranks share
  memory bandwidth and caches; on GPUs the copies do not interact). Reported per step: the slowest copy;
- ``ddp``: ``DistributedDataParallel`` (bucketed gradient all-reduce overlapped with backward), dp = W;
- ``fsdp``: ``torch.distributed.fsdp.fully_shard`` per block and at the root (ZeRO-3: parameters,
  gradients and optimizer state sharded, all-gather before use, reduce-scatter of gradients), dp = W;
- ``pp_gpipe`` / ``pp_1f1b``: ``torch.distributed.pipelining`` with W stages, ``pp_micro_batches``
  micro-batches (tied embedding copies on the first and last stage, their gradients all-reduced);
- ``tp``: Megatron tensor parallelism over W ranks (see :mod:`validation.harness.model`);
- ``local_sgd`` (asked for only): every rank trains its own replica on its shard of the batch
  (dp = W, no gradient reduction) and the replicas' parameters are averaged (an all-reduce, the outer
  SGD step with learning rate 1) every ``LOCAL_SGD_STEPS`` = 4 steps; timed per period of 4 steps,
  divided by 4 (so a step is the mean over whole periods);
- ``step_in_backward`` / ``step_separate`` (asked for only): every rank its own copy (as ``single``)
  on the whole batch as one micro-batch, with Adam stepping each parameter from a
  ``register_post_accumulate_grad_hook`` as soon as its gradient is ready (PyTorch's tutorial
  "How to save memory by fusing the optimizer step into the backward pass"), or in one separate step;
- ``local_learning``: the layers split into W groups, one per rank (as the pipeline runs); every
  group but the last ends in an auxiliary head (a final norm and an LM head of its own, copied from
  the model's) and trains on its own loss (Laskin et al. 2020), so no gradient goes back between
  ranks: each rank runs forward, its loss and backward per micro-batch (``pp_micro_batches`` of
  them) and sends the activations on (``isend``, one way). Step 0's loss (the last group's) is the
  full model's; later steps differ from backpropagation's by construction.

Each run records per-step wall times (the slowest rank's per step), their median and p10/p90,
losses, peak memory (CUDA ``max_memory_allocated``; on CPU the process's peak-RSS growth during
the run, from ``VmHWM`` after resetting it through ``/proc/self/clear_refs``), the kernel-mode and
user-mode CPU time and minor page faults per timed step (``getrusage``; see :func:`_process_usage`), and a PyTorch
profiler Chrome trace of a few steps per rank.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from validation.harness.launcher import RankContext
from validation.harness.layouts import EXTRA_STRATEGIES, LOCAL_SGD_STEPS, STRATEGIES, layout_of
from validation.harness.model import GPT, TPGPT, AuxHead, StageModule, lm_loss, tied_weight_params
from validation.harness.probe import SpeedProbe, probe_summary
from validation.harness.stats import summarize
from workloads.schema import TransformerSpec


@dataclass
class TrainingConfig:
    spec: dict  # a TransformerSpec mapping (plain data, so it pickles and serialises)
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    global_batch: int = 8
    micro_batch: int = 4
    pp_micro_batches: int = 4
    warmup_steps: int = 3
    steps: int = 10
    profile_steps: int = 2
    lr: float = 1e-3
    seed: int = 1234
    trace_dir: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def check_config(cfg: TrainingConfig, world: int) -> None:
    spec = TransformerSpec.model_validate(cfg.spec)
    for s in cfg.strategies:
        if s not in STRATEGIES + EXTRA_STRATEGIES:
            raise ValueError(f"unknown strategy {s!r} (known: {', '.join(STRATEGIES + EXTRA_STRATEGIES)})")
    if cfg.global_batch % cfg.micro_batch:
        raise ValueError("global_batch must be a multiple of micro_batch")
    if cfg.global_batch % world and any(s in ("ddp", "fsdp", "local_sgd") for s in cfg.strategies):
        raise ValueError("global_batch must be divisible by the world size for ddp/fsdp")
    if cfg.global_batch % cfg.pp_micro_batches:
        raise ValueError("global_batch must be divisible by pp_micro_batches")
    if any(s.startswith("pp_") or s == "local_learning" for s in cfg.strategies) and spec.num_layers < world:
        raise ValueError("pipeline runs need at least one layer per stage")
    if "tp" in cfg.strategies and (spec.num_attention_heads % world or spec.vocab_size % world):
        raise ValueError("tp runs need heads and vocab divisible by the world size")


# --------------------------------------------------------------------------- memory
class PeakMemory:
    """Peak memory during a run: CUDA allocator peak, or the growth of the process's peak RSS."""

    def __init__(self, ctx: RankContext):
        self.ctx = ctx
        self.base = 0
        self.note = None

    @staticmethod
    def _status(key: str) -> int | None:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def start(self) -> None:
        if self.ctx.is_cuda:
            torch.cuda.synchronize(self.ctx.device)
            torch.cuda.reset_peak_memory_stats(self.ctx.device)
            self.base = torch.cuda.memory_allocated(self.ctx.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self.base = self._status("VmRSS") or 0
        except OSError:
            self.base = None

    def stop(self) -> dict:
        if self.ctx.is_cuda:
            peak = torch.cuda.max_memory_allocated(self.ctx.device)
            return {"peak_memory_bytes": int(peak), "peak_memory_kind": "cuda_max_memory_allocated",
                    "baseline_memory_bytes": int(self.base)}
        hwm = self._status("VmHWM")
        if self.base is None or hwm is None:
            return {"peak_memory_bytes": None, "peak_memory_kind": None,
                    "peak_memory_note": "this OS exposes no resettable peak RSS"}
        return {"peak_memory_bytes": int(max(0, hwm - self.base)), "peak_memory_kind": "cpu_rss_peak_delta",
                "baseline_memory_bytes": int(self.base),
                "peak_memory_note": "CPU: growth of the process's peak RSS over the run (VmHWM - VmRSS at start); "
                                    "includes allocator caching, so it is an upper bound of live tensors"}


# --------------------------------------------------------------------------- one strategy
class _Runner:
    """Builds one strategy's model and optimizer and runs one optimizer step at a time."""

    def __init__(self, strategy: str, ctx: RankContext, cfg: TrainingConfig, full: GPT, data):
        self.strategy, self.ctx, self.cfg = strategy, ctx, cfg
        self.tokens, self.targets = data
        self.world = ctx.world_size
        dev = ctx.device
        self.active = True  # every rank works in every strategy (single: each its own copy)
        self.tied = []
        self.schedule = None
        self.steps_per_call = LOCAL_SGD_STEPS if strategy == "local_sgd" else 1
        if strategy in ("single", "local_sgd", "step_in_backward", "step_separate"):
            self.model = copy.deepcopy(full).to(dev)
        elif strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.model = DDP(copy.deepcopy(full).to(dev), device_ids=[dev] if ctx.is_cuda else None)
        elif strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            m = copy.deepcopy(full).to(dev)
            for block in m.blocks:
                fully_shard(block)
            fully_shard(m)
            self.model = m
        elif strategy in ("pp_gpipe", "pp_1f1b"):
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            from simulator.strategies.spmd.layout import split_layers

            counts = split_layers(full.spec.num_layers, self.world)
            first = sum(counts[: ctx.rank])
            stage = StageModule(full, first, first + counts[ctx.rank], ctx.rank == 0, ctx.rank == self.world - 1)
            self.model = stage.to(dev)
            self.tied = tied_weight_params(self.model)
            pstage = PipelineStage(self.model, ctx.rank, self.world, dev)
            cls = ScheduleGPipe if strategy == "pp_gpipe" else Schedule1F1B
            self.schedule = cls(pstage, n_microbatches=cfg.pp_micro_batches, loss_fn=lm_loss)
        elif strategy == "tp":
            self.model = TPGPT(full, self.world, ctx.rank).to(dev)
        elif strategy == "local_learning":
            from simulator.strategies.spmd.layout import split_layers

            counts = split_layers(full.spec.num_layers, self.world)
            first = sum(counts[: ctx.rank])
            last = ctx.rank == self.world - 1
            self.model = StageModule(full, first, first + counts[ctx.rank], ctx.rank == 0, last).to(dev)
            self.aux_head = None if last else AuxHead(full).to(dev)
            if self.aux_head is not None:
                self.model.add_module("aux_head", self.aux_head)  # trained with the group
        else:
            raise ValueError(strategy)
        self.optimizer = make_adam(self.model.parameters(), cfg.lr) if self.active else None
        if strategy == "step_in_backward":
            self.optimizer = None  # one Adam per parameter, stepped by the hook as its gradient lands
            self._hooked = {p: make_adam([p], cfg.lr) for p in self.model.parameters()}

            def step_now(param) -> None:
                self._hooked[param].step()
                self._hooked[param].zero_grad(set_to_none=True)

            for param in self.model.parameters():
                param.register_post_accumulate_grad_hook(step_now)

    def step(self) -> float | None:
        """One optimizer step on the global batch; returns the global-batch mean loss (all ranks)."""
        ctx, cfg = self.ctx, self.cfg
        loss_val = torch.zeros(1, device=ctx.device)
        if not self.active:
            return None
        tokens, targets = self.tokens, self.targets
        if self.strategy == "local_sgd":
            return self._local_sgd_period(tokens, targets)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self.strategy in ("step_in_backward", "step_separate"):
            loss = self._forward_loss(tokens, targets)
            loss.backward()
            loss_val += loss.detach()
        elif self.strategy in ("single", "tp"):
            m = cfg.global_batch // cfg.micro_batch
            for i in range(m):
                sl = slice(i * cfg.micro_batch, (i + 1) * cfg.micro_batch)
                loss = self._forward_loss(tokens[sl], targets[sl]) / m
                loss.backward()
                loss_val += loss.detach()
        elif self.strategy == "local_learning":
            loss_val += self._local_learning_step(tokens, targets)
            dist.broadcast(loss_val, self.world - 1)
        elif self.strategy in ("ddp", "fsdp"):
            per = cfg.global_batch // self.world
            sl = slice(ctx.rank * per, (ctx.rank + 1) * per)
            loss = self.model(tokens[sl], targets[sl])
            loss.backward()
            loss_val += loss.detach()
            dist.all_reduce(loss_val)
            loss_val /= self.world
        else:  # pipeline
            last = ctx.rank == self.world - 1
            losses: list = []
            if ctx.rank == 0:
                self.schedule.step(tokens)
            elif last:
                self.schedule.step(target=targets, losses=losses)
            else:
                self.schedule.step()
            if self.tied:
                # the first and last stage hold copies of the tied embedding: sum their gradients
                for p in self.tied:
                    dist.all_reduce(p.grad)
            if last:
                loss_val += torch.stack([x.detach() for x in losses]).mean()
            dist.broadcast(loss_val, self.world - 1)
        if self.optimizer is not None:
            self.optimizer.step()
        ctx.sync()
        return float(loss_val.item())

    def _local_sgd_period(self, tokens, targets) -> float:
        """``steps_per_call`` inner steps on this rank's shard, then the replicas' parameters
        averaged (all-reduce / W). Returns the first inner step's loss averaged over the ranks."""
        ctx = self.ctx
        per = self.cfg.global_batch // self.world
        sl = slice(ctx.rank * per, (ctx.rank + 1) * per)
        first = torch.zeros(1, device=ctx.device)
        for i in range(self.steps_per_call):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.model(tokens[sl], targets[sl])
            loss.backward()
            self.optimizer.step()
            if i == 0:
                first += loss.detach()
        with torch.no_grad():
            for param in self.model.parameters():
                dist.all_reduce(param)
                param /= self.world
        dist.all_reduce(first)
        ctx.sync()
        return float(first.item()) / self.world

    def _forward_loss(self, tokens, targets):
        return self.model(tokens, targets)

    def _local_learning_step(self, tokens, targets) -> torch.Tensor:
        """Every micro-batch: receive the previous group's activations (rank > 0), forward the
        group, send its output on without waiting, and backpropagate the group's own loss (the
        auxiliary head's, or the model's on the last rank). Returns the last group's loss."""
        ctx, m = self.ctx, self.cfg.pp_micro_batches
        per = tokens.shape[0] // m
        spec = self.model.spec
        last = ctx.rank == self.world - 1
        loss_sum = torch.zeros(1, device=ctx.device)
        pending = []
        for i in range(m):
            sl = slice(i * per, (i + 1) * per)
            if ctx.rank == 0:
                x = tokens[sl]
            else:
                x = torch.empty(per, spec.seq_length, spec.hidden_size, device=ctx.device)
                dist.recv(x, src=ctx.rank - 1)
            out = self.model(x)
            if not last:
                sent = out.detach()
                pending.append((dist.isend(sent, dst=ctx.rank + 1), sent))
                out = self.aux_head(out)
            loss = lm_loss(out, targets[sl]) / m
            loss.backward()
            loss_sum += loss.detach()
        for handle, _ in pending:
            handle.wait()
        return loss_sum if last else torch.zeros(1, device=ctx.device)


#: Strategies whose ranks train independent copies: their steps are pooled, not maxed.
INDEPENDENT_COPIES = ("single", "step_in_backward", "step_separate")


def make_adam(params, lr: float) -> torch.optim.Optimizer:
    """Adam with the fused kernel (one pass over p, grad, m, v per tensor: what the simulator's
    optimizer model streams), falling back to the default implementation where unsupported."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


def _make_data(spec: TransformerSpec, cfg: TrainingConfig, device):
    gen = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, spec.vocab_size, (cfg.global_batch, spec.seq_length + 1), generator=gen)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def _run_one(strategy: str, ctx: RankContext, cfg: TrainingConfig, spec: TransformerSpec) -> dict:
    torch.manual_seed(cfg.seed)
    full = GPT(spec)
    data = _make_data(spec, cfg, ctx.device)
    runner = _Runner(strategy, ctx, cfg, full, data)
    del full
    dist.barrier()
    load_before = _load()
    probe = SpeedProbe(ctx)
    memory = PeakMemory(ctx)
    memory.start()
    losses, times, host = [], [], []
    for i in range(cfg.warmup_steps + cfg.steps):
        timed = i >= cfg.warmup_steps
        if timed:
            probe.sample()  # how fast the machine is now (outside the timed step)
        before = _process_usage() if timed else None
        t0 = time.perf_counter()
        loss = runner.step()
        dt = (time.perf_counter() - t0) / runner.steps_per_call  # local SGD: a period of H steps
        losses.append(loss)
        if timed:
            times.append(dt)
            after = _process_usage()
            if before is not None and after is not None:
                host.append(tuple((b - a) / runner.steps_per_call for a, b in zip(before, after, strict=True)))
    mem = memory.stop()
    mem["load_average_1min"] = [load_before, _load()]
    trace = None
    if cfg.trace_dir and cfg.profile_steps > 0 and runner.active:
        trace = _profile(runner, ctx, cfg, strategy)
    dist.barrier()
    return {"strategy": strategy, "rank": ctx.rank, "active": runner.active, "losses": losses,
            "step_times_s": times, "trace": trace, "probe_samples_s": probe.samples_s, "host_usage_per_step": host,
            "probe_shape": list(probe.shape),
            "local_params": _local_params(runner.model) if runner.active else 0, **mem}


def _process_usage() -> tuple[float, float, float] | None:
    """(kernel-mode CPU s, user-mode CPU s, minor page faults) of this rank's process so far (all its
    threads: gloo's too), from ``getrusage``; None where the OS has no ``resource`` module.

    Counted per timed step because the kernel-mode part is host work the simulator has no term for: on
    the 2-vCPU VM of 2026-12-06 the harness GPT's single step (glibc malloc's defaults) faulted in a median
    ~3.8k fresh 4 KiB pages (15 MiB: the allocator returns freed activations to the OS and touches new
    ones) and spent a median 5.9 ms (mean 6.9, up to 24) in the kernel, where the same step with
    ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` at 1 GiB faulted none and spent ~0. CPU
    time and fault counts, unlike wall time, barely move with other processes' load."""
    try:
        import resource
    except ImportError:
        return None
    u = resource.getrusage(resource.RUSAGE_SELF)
    return float(u.ru_stime), float(u.ru_utime), float(u.ru_minflt)


def _load() -> float | None:
    import os

    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _local_params(model: nn.Module) -> int:
    """Parameters held by this rank (a DTensor shard counts its local part)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())


def _profile(runner: _Runner, ctx: RankContext, cfg: TrainingConfig, strategy: str) -> str:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.is_cuda else [])
    path = Path(cfg.trace_dir) / f"{strategy}_rank{ctx.rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    def export(prof) -> None:
        prof.export_chrome_trace(str(path))

    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=cfg.profile_steps, repeat=1),
                 on_trace_ready=export, record_shapes=False) as prof:
        for _ in range(1 + cfg.profile_steps):
            runner.step()
            prof.step()
    return str(path)


def run_training(ctx: RankContext, cfg: TrainingConfig) -> list[dict]:
    """Rank function: every strategy in turn (one process group for all)."""
    spec = TransformerSpec.model_validate(cfg.spec)
    check_config(cfg, ctx.world_size)
    results = []
    for strategy in cfg.strategies:
        if strategy != "single" and ctx.world_size < 2:
            continue
        results.append(_run_one(strategy, ctx, cfg, spec))
    return results


def merge_ranks(per_rank: list[list[dict]], cfg: TrainingConfig, world: int) -> list[dict]:
    """One record per strategy from the ranks' records: the step time of a step is the
    slowest active rank's (the ranks of one job wait for each other); losses are rank 0's
    (all ranks agree by construction). ``single`` is the exception: its ranks are independent
    one-device jobs, so its steps are all ranks' steps pooled. The maximum of two unrelated
    jobs' steps would be a slower statistic than either job's (on this host by ~3%)."""
    runs = []
    by_strategy: dict[str, list[dict]] = {}
    for rank_results in per_rank:
        for rec in rank_results:
            by_strategy.setdefault(rec["strategy"], []).append(rec)
    for strategy, recs in by_strategy.items():
        active = [r for r in sorted(recs, key=lambda r: r["rank"]) if r["active"]]
        if strategy in INDEPENDENT_COPIES:
            steps = [t for r in active for t in r["step_times_s"]]
        else:
            steps = [max(vals) for vals in zip(*(r["step_times_s"] for r in active), strict=True)]
        stats = summarize(steps)
        mems = [r.get("peak_memory_bytes") for r in active]
        usage = [u for r in active for u in (r.get("host_usage_per_step") or [])]
        runs.append({
            "strategy": strategy,
            "layout": layout_of(strategy, cfg, world),
            "world_size": layout_of(strategy, cfg, world)["num_gpus"],
            "ranks_timed": len(active),
            "step_time_s": stats["median_s"],
            "step_time_p10_s": stats["p10_s"],
            "step_time_p90_s": stats["p90_s"],
            "step_time_min_s": stats["min_s"],
            "step_times_s": steps,
            "steps_timed": len(steps),
            "warmup_steps": cfg.warmup_steps,
            "losses": active[0]["losses"],
            "loss_step0": active[0]["losses"][0],
            "peak_memory_bytes_per_rank": mems,
            "peak_memory_kind": active[0].get("peak_memory_kind"),
            "peak_memory_note": active[0].get("peak_memory_note"),
            "local_params_per_rank": [r["local_params"] for r in active],
            "step_times_s_per_rank": [r["step_times_s"] for r in active],
            "speed_probe": probe_summary([x for r in active for x in r.get("probe_samples_s", [])],
                                         active[0].get("probe_shape", [])),
            "load_average_1min": active[0].get("load_average_1min"),
            # per timed step, median over every active rank's steps (a rank's process, all its threads)
            **({"system_cpu_s_per_step": float(np.median([u[0] for u in usage])),
                "user_cpu_s_per_step": float(np.median([u[1] for u in usage])),
                "minor_faults_per_step": float(np.median([u[2] for u in usage]))} if usage else {}),
            "traces": [r["trace"] for r in active if r.get("trace")],
        })
    return runs
