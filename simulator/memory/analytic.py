"""Memory of one rank: model states (ZeRO), activations (Korthikanti), buffers; peak and ``fits``.

Pure functions, no SimPy. Byte counts are floats named ``*_bytes``; GiB = 2^30 bytes
(DESIGN.md), except where a published table is reproduced in its own unit (ZeRO Table 1
uses GB = 10^9; the caller divides).

Sources
-------
- Model states: Rajbhandari et al. 2020, "ZeRO" (SC20, arXiv:1910.02054) Sec. 3 and Table 1:
  mixed-precision Adam keeps 2Ψ fp16 weights + 2Ψ fp16 gradients + KΨ optimizer state
  (fp32 master weights, momentum, variance: K = 4+4+4 = 12). Per device with Nd-way data
  parallelism: P_os (stage 1) 4Ψ + KΨ/Nd; P_os+g (stage 2) 2Ψ + (2+K)Ψ/Nd;
  P_os+g+p (stage 3) (2+2+K)Ψ/Nd.
- Activations per transformer layer: Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models" (arXiv:2205.05198) Sec. 4, Table 2, as the layer
  graph states them (workloads/transformer_graph.py ``block_saved_tensors``); the paper's closed
  forms are test oracles in validation/closed_form_activations.py.
- Micro-batches in flight: Narayanan et al. 2021 (SC21) Sec. 2.2 and Megatron-LM
  ``megatron/core/pipeline_parallel/schedules.py`` (``get_num_warmup_microbatches`` logic of
  ``forward_backward_pipelining_with_interleaving`` / ``..._without_interleaving``).

What each bucket of :class:`MemoryBreakdown` holds
--------------------------------------------------
- weights / gradients / optimizer: :func:`stage_params` × :func:`bytes_per_param`, sharded by
  ZeRO over the data-parallel group. The group is ``dp·cp`` for dense parameters (context-
  parallel ranks hold the same weights; Megatron's distributed optimizer shards over the
  dp×cp group) and ``dp·cp/ep`` for routed-expert parameters (Megatron's expert-data-parallel
  group; ``tp·cp·dp/(etp·ep)`` when the expert groups fold over the tp ranks, ``Parallelism.etp``).
  ZeRO-1 with Megatron's distributed optimizer is the same sharding as DeepSpeed's.
- activations: per-layer activations × the stage's layers × micro-batches in flight, plus the
  embedding-dropout mask on the first stage, the final norm / LM-head inputs and the logits on
  the last stage, plus the working set of rematerialisation (with recompute, the backward
  re-creates one layer's activations; they are alive on top of the stored checkpoints).
  What a layer keeps is read off the layer graph (workloads/transformer_graph.py
  ``block_saved_tensors``), which also follows three framework settings: FP8 linear layers keep
  their inputs quantized (``training.fp8_saved_inputs``, Transformer Engine; 1 B plus block
  scales), models without dropout keep no masks (``model.dropout``), and a fused cross entropy
  keeps the 16-bit logits only (``training.fused_cross_entropy``, 2 B instead of 6 B per logit).
- other: communication buffers only: gradient buckets, 2 × ``gradient_bucket_mb`` MiB (one
  being filled while one is reduced; counted whatever the dp degree, as the DDP / ZeRO wrapper
  allocates them anyway); under ZeRO-3 the gathered weights of the current module and the
  prefetched next one (the two largest modules of the stage — layers, embedding, head — at
  full, un-sharded size, less the 1/dp shards already counted in ``weights``; DeepSpeed
  ``stage3_prefetch_bucket_size`` / FSDP ``forward_prefetch``); and pipeline send/recv
  buffers when pp > 1 (one activation received, one being sent).
- The CUDA context, NCCL's internal buffers and allocator fragmentation are NOT in the
  breakdown: they are what ``scenario.simulation.hbm_reserve_gib`` (default 2 GiB) keeps free.
  :func:`fits` compares the breakdown against ``hbm_gib - hbm_reserve_gib``. So there is no
  separate fixed framework overhead in "other" (it would be counted twice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import ConfigError
from simulator.memory.checkpoints import kept_per_layer, stage_bytes
from simulator.scenario import gradient_bytes
from simulator.strategies.spmd.layout import Parallelism, chunk_layer_counts, split_layers
from simulator.strategies.spmd.split import chunk_counts
from workloads.graph import ShardShape
from workloads.layer_graph import LayerGraph
from workloads.transformer_graph import DROPOUT_MASK_BYTES, LOGITS_BYTES_PER_ELEMENT  # noqa: F401 (re-exported)

GIB = float(2**30)
MIB = float(2**20)

#: Bytes per element of a stored 16-bit activation; fp32 training stores 4.
ACTIVATION_ELEMENT_BYTES_16BIT = 2

_MIXED = ("bf16", "fp16", "fp8")
_OPTIMIZERS = ("adam", "adamw", "sgd")
_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")  # zb-h1 keeps 1F1B's in-flight limit


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes held by one rank at its peak, by kind. ``stage`` names the pipeline stage (if known)."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    stage: int | None = None

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes + self.other_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    def gib(self) -> dict[str, float]:
        """The five kinds in GiB (2^30 bytes)."""
        return {
            "weights": self.weights_bytes / GIB,
            "gradients": self.gradients_bytes / GIB,
            "optimizer": self.optimizer_bytes / GIB,
            "activations": self.activations_bytes / GIB,
            "other": self.other_bytes / GIB,
        }


# --------------------------------------------------------------------------- model states


def bytes_per_param(precision: str = "bf16", optimizer: str = "adam", fp32_params: bool = False) -> dict[str, int]:
    """Bytes per parameter of weights, gradients and optimizer state.

    - Mixed precision (bf16/fp16) with Adam/AdamW: 2 / 2 / 12 (fp32 master 4 + momentum 4 +
      variance 4): ZeRO (Rajbhandari 2020) Sec. 3, K = 12.
    - fp8 is counted as mixed precision: the bf16 weight copy is kept and the fp8 casts of weights
      and activations are transient (Transformer Engine recipe), so 2 / 2 / 12 too.
    - fp32 with Adam: 4 / 4 / 8 (no master copy; momentum + variance).
    - SGD with momentum: mixed 2 / 2 / 8 (fp32 master 4 + momentum 4); fp32 4 / 4 / 4.

    - ``fp32_params`` (``TrainingSpec.param_dtype: fp32``) with mixed precision: the parameters are
      the fp32 master weights (PyTorch FSDP/FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16)`` keeps
      the sharded parameters in fp32 and casts the gathered copy; torch.autocast): 4 / 4 / 8 with
      Adam, 4 / 4 / 4 with SGD -- no separate 16-bit weight copy, and the gradient the optimizer
      reads is in the parameter's dtype, fp32: see :func:`held_gradient_bytes`.

    Otherwise gradients are counted at 2 B as in ZeRO; ``model_state_bytes(grad_bytes=4)`` models
    the fp32 ``main_grad`` buffer that Megatron-LM (and nanotron) keep for bf16 training
    (``TrainingSpec.grad_dtype``).
    """
    if optimizer not in _OPTIMIZERS:
        raise ConfigError("training.optimizer", f"unknown optimizer {optimizer!r} (known: {', '.join(_OPTIMIZERS)})")
    if precision in _MIXED:
        if fp32_params:
            return {"weights": 4, "gradients": 4, "optimizer": 8 if optimizer in ("adam", "adamw") else 4}
        opt = 12 if optimizer in ("adam", "adamw") else 8
        return {"weights": 2, "gradients": 2, "optimizer": opt}
    if precision == "fp32":
        opt = 8 if optimizer in ("adam", "adamw") else 4
        return {"weights": 4, "gradients": 4, "optimizer": opt}
    raise ConfigError("training.precision", f"unknown precision {precision!r} (known: fp32, bf16, fp16, fp8)")


def held_gradient_bytes(grad_bytes: float | None, precision: str = "bf16", optimizer: str = "adam",
                        fp32_params: bool = False) -> float:
    """Bytes per parameter of the gradient held for the optimizer (per shard under ZeRO-2/3).

    ``grad_bytes`` is ``TrainingSpec.grad_dtype``'s element size (:func:`gradient_bytes`: the dtype
    gradients are accumulated and reduced in); None counts :func:`bytes_per_param`'s.

    With ``fp32_params`` (``param_dtype: fp32``) the held gradient is the parameter's dtype, 4 B,
    whatever ``grad_dtype`` says: ``grad_dtype`` is then FSDP's ``reduce_dtype`` (the bytes the
    reduce-scatter / all-reduce moves, priced by the planner from :func:`gradient_bytes`), and
    PyTorch casts the reduced gradient back to the parameter's dtype before the optimizer sees it.
    torch 2.13 FSDP1 ``fsdp/_runtime_utils.py`` ``_accumulate_sharded_grad`` calls
    ``_cast_grad_to_param_dtype`` ("Casts ``sharded_grad`` back to the full parameter dtype so that
    the optimizer step runs with that dtype") on every reduce-scattered shard and accumulates it in
    ``_saved_grad_shard``; FSDP2 ``_fully_shard/_fsdp_collectives.py`` ``foreach_reduce`` does
    ``reduce_output = _to_dtype_if_needed(reduce_output, orig_dtype)`` (``orig_dtype`` = the sharded
    parameter's dtype, ``_fsdp_param.py``) before viewing it into ``sharded_param.grad``; under
    torch.autocast the leaf is fp32, so its ``.grad`` is fp32. So the parameter's dtype wins over an
    explicit ``grad_dtype: bf16``: no PyTorch path keeps the optimizer's gradient below the
    parameter's dtype except FSDP1 with a low-precision communication hook (``bf16_compress_hook``:
    the cast is left to the hook) or NO_SHARD with ``keep_low_precision_grads``, neither modelled.
    The transient 16-bit unsharded gradient of the module being reduced is not counted here.
    """
    if fp32_params:
        return 4.0
    return float(bytes_per_param(precision, optimizer)["gradients"] if grad_bytes is None else grad_bytes)


def model_state_bytes(
    num_params: float, zero_stage: int, dp: int, precision: str = "bf16", optimizer: str = "adam",
    grad_bytes: float | None = None, fp32_params: bool = False,
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per device for ``num_params`` parameters replicated
    over ``dp`` data-parallel ranks, sharded by ZeRO stage (Rajbhandari 2020 Table 1):
    stage 1 shards the optimizer state over dp, stage 2 also the gradients, stage 3 also the weights."""
    if num_params < 0 or not math.isfinite(num_params):
        raise ConfigError("num_params", f"must be a non-negative finite number, got {num_params}")
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError("parallelism.zero_stage", f"must be 0, 1, 2 or 3, got {zero_stage}")
    if not isinstance(dp, int) or dp < 1:
        raise ConfigError("parallelism.dp", f"must be a positive integer, got {dp!r}")
    bpp = bytes_per_param(precision, optimizer, fp32_params)
    w = bpp["weights"] * num_params
    g = held_gradient_bytes(grad_bytes, precision, optimizer, fp32_params) * num_params
    o = bpp["optimizer"] * num_params
    if zero_stage >= 1:
        o /= dp
    if zero_stage >= 2:
        g /= dp
    if zero_stage >= 3:
        w /= dp
    return w, g, o


def max_params_for_memory(
    memory_bytes: float, zero_stage: int, dp: int, mp: int = 1, precision: str = "bf16", optimizer: str = "adam"
) -> float:
    """Largest model whose model states fit ``memory_bytes`` per device with ``mp``-way model
    parallelism and ``dp``-way ZeRO data parallelism (ZeRO Table 2's "max theoretical model
    size": model states only, no activations or buffers)."""
    if memory_bytes < 0 or mp < 1:
        raise ConfigError("memory_bytes", "memory must be >= 0 and mp >= 1")
    per_param = sum(model_state_bytes(1.0, zero_stage, dp, precision, optimizer))
    return memory_bytes * mp / per_param


# --------------------------------------------------------------------------- pipeline schedule


def _check_schedule(schedule: str, pp: int, stage: int, num_micro_batches: int, virtual_stages: int) -> None:
    if schedule not in _SCHEDULES:
        raise ConfigError("parallelism.schedule", f"unknown schedule {schedule!r} (known: {', '.join(_SCHEDULES)})")
    if not isinstance(pp, int) or pp < 1:
        raise ConfigError("parallelism.pp", f"must be a positive integer, got {pp!r}")
    if not isinstance(stage, int) or not 0 <= stage < pp:
        raise ConfigError("stage", f"must be in 0..{pp - 1}, got {stage!r}")
    if not isinstance(num_micro_batches, int) or num_micro_batches < 1:
        raise ConfigError("parallelism.global_batch_size", f"needs at least one micro-batch per replica, got {num_micro_batches!r}")
    if not isinstance(virtual_stages, int) or virtual_stages < 1:
        raise ConfigError("parallelism.virtual_stages", f"must be a positive integer, got {virtual_stages!r}")
    if virtual_stages > 1 and schedule != "interleaved":
        raise ConfigError("parallelism.virtual_stages", "more than 1 needs schedule: interleaved")


def _chunk_microbatches_in_flight(schedule: str, pp: int, stage: int, m: int, v: int) -> int:
    """Chunk-micro-batches whose forward has run and backward has not, at the rank's peak
    (end of warm-up plus the first steady-state forward)."""
    if schedule == "gpipe":
        return m * v
    if schedule in ("1f1b", "zb-h1"):
        # Megatron: warm-up = min(p - i - 1, m), then one more forward before the first backward.
        return min(pp - stage, m)
    # Interleaved (Megatron get_num_warmup_microbatches, microbatch group size = p):
    warmup = (pp - stage - 1) * 2 + (v - 1) * pp
    total = m * v
    if warmup >= total:  # Megatron: all forwards first, no steady state
        return total
    return warmup + 1


def microbatches_in_flight(schedule: str, pp: int, stage: int, num_micro_batches: int, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations are alive at the peak of pipeline stage ``stage`` (0-based)
    of ``pp``, in units of full-stage micro-batches (multiply by one micro-batch's activations
    through all the stage's layers).

    - GPipe (Huang 2019; Narayanan 2021 Sec. 2.2.1): all m forwards run before any backward: m.
    - 1F1B (PipeDream-Flush; Narayanan 2021 Sec. 2.2.1): stage i warms up with p − i − 1 forwards
      and runs one more before its first backward: min(p − i, m).
    - Interleaved with v chunks (Narayanan 2021 Sec. 2.2.2; Megatron-LM schedules.py
      ``get_num_warmup_microbatches``): warm-up = (p − i − 1)·2 + (v − 1)·p chunk-micro-batches,
      + 1 in steady state, capped at m·v (then all forwards run first); each chunk-micro-batch
      holds 1/v of the stage's layers, so the value is that count / v. For stage 0 this is
      p + (p − 1)/v = p·(1 + (p − 1)/(p·v)), Korthikanti 2022 Sec. 4.2.3's factor.

    Never more than m.
    """
    _check_schedule(schedule, pp, stage, num_micro_batches, virtual_stages)
    v = virtual_stages
    return _chunk_microbatches_in_flight(schedule, pp, stage, num_micro_batches, v) / v


def _chunk_count_in_flight(schedule: str, pp: int, stage: int, m: int, v: int, chunk: int) -> int:
    """How many micro-batches of model chunk ``chunk`` are in flight on rank ``stage`` at its peak.
    Megatron's interleaved order runs forward k on chunk (k mod p·v) // p."""
    if schedule != "interleaved":
        return _chunk_microbatches_in_flight(schedule, pp, stage, m, v)
    n = _chunk_microbatches_in_flight(schedule, pp, stage, m, v)
    rounds, rest = divmod(n, pp * v)  # each round of p·v forwards runs p on every chunk, in chunk order
    return rounds * pp + min(max(rest - chunk * pp, 0), pp)


def chunks_in_flight_at_peak(schedule: str, pp: int, stage: int, m: int, v: int,
                             chunk_bytes: list[float]) -> list[int]:
    """Micro-batches of each local chunk (0..v-1) in flight on rank ``stage`` at the moment its saved
    activations peak, where one micro-batch of chunk c keeps ``chunk_bytes[c]``.

    Not interleaved: one chunk, :func:`_chunk_microbatches_in_flight` (the first backward).
    Interleaved (Narayanan et al. 2021 Sec. 2.2.2; Megatron-LM ``forward_backward_pipelining_with_
    interleaving``, as simulator/strategies/spmd/schedule.py orders it): W = (p-i-1)·2 + (v-1)·p
    warm-up forwards, then forward W+j before backward j, then the cool-down backwards. Forward k
    runs chunk (k mod p·v) // p and backward k chunk v-1 - (k mod p·v) // p, so just before backward
    j, min(W+1+j, m·v) forwards and j backwards have run: from one such state to the next, forward
    W+1+j joins (while any is left) and backward j leaves. The peak is the largest of those states by
    bytes: at the first backward when every chunk keeps the same bytes, later when the chunks differ
    (a chunk with more layers, or the embedding or head, runs again before an earlier, smaller chunk's
    backward frees its micro-batch). The states repeat with period p·v in the steady state and only
    shrink in the cool-down, so backwards 0..min(p·v, m·v)-1 are all that need looking at. Ties go to
    the earliest backward."""
    n0 = _chunk_microbatches_in_flight(schedule, pp, stage, m, v)
    if schedule != "interleaved":
        return [n0] * v
    total, period = m * v, pp * v
    held = [_chunk_count_in_flight(schedule, pp, stage, m, v, c) for c in range(v)]
    size = sum(n * b for n, b in zip(held, chunk_bytes, strict=True))
    best, best_held = size, list(held)
    for j in range(min(period, total) - 1):
        if n0 + j < total:
            c = ((n0 + j) % period) // pp
            held[c] += 1
            size += chunk_bytes[c]
        c = v - 1 - (j % period) // pp
        held[c] -= 1
        size -= chunk_bytes[c]
        if size > best + 1e-12 * abs(best):
            best, best_held = size, list(held)
    return best_held


# --------------------------------------------------------------------------- parameters per stage


def stage_layer_indices(num_layers: int, pp: int, virtual_stages: int, stage: int,
                        counts: list[int] | None = None) -> list[int]:
    """Global 0-based layer indices held by pipeline rank ``stage``: the layers of chunks
    c·pp + stage for c in 0..v−1 (Megatron's interleaved placement), split by :func:`split_layers`
    unless ``counts`` (layers per global chunk, :func:`chunk_layer_counts`) is given."""
    if not isinstance(stage, int) or not 0 <= stage < pp:
        raise ConfigError("stage", f"must be in 0..{pp - 1}, got {stage!r}")
    if counts is None:
        counts = split_layers(num_layers, pp * virtual_stages)
    layers: list[int] = []
    for c in range(virtual_stages):
        k = c * pp + stage
        start = sum(counts[:k])
        layers.extend(range(start, start + counts[k]))
    return layers


def _params_graph(model, par: Parallelism) -> LayerGraph:
    """A layer graph for parameter counts only (they depend on tp and ep, not on the micro-batch)."""
    return model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length or 1, tp=par.tp, ep=par.ep,
                                        etp=par.etp_degree))


def _stage_param_split(model, par: Parallelism, stage: int, graph: LayerGraph | None = None,
                       counts: list[int] | None = None) -> tuple[float, float, list[float], float]:
    """(dense, expert) trained parameters of one rank of ``stage``, the size of each module (every
    parameter it holds, for ZeRO-3 prefetch) and the frozen parameters it holds (LoRA's base,
    workloads/lora.py: dense ones, LoRA refuses routed experts), read off the layer graph: the stage's
    pipelined layers, the prologue (embedding) on the first stage, the epilogue (final norm, head) on the
    last; with tied embeddings and pp > 1 the last stage also holds a copy of the word embedding (Megatron),
    frozen where the embedding is."""
    graph = graph or _params_graph(model, par)
    pipelined = graph.pipelined
    dense = expert = frozen = 0.0
    modules: list[float] = []
    counts = counts or chunk_layer_counts(par, len(pipelined))
    for idx in stage_layer_indices(len(pipelined), par.pp, par.virtual_stages, stage, counts):
        layer = pipelined[idx]
        dense += layer.params - layer.expert_params - layer.frozen_params
        expert += layer.expert_params
        frozen += layer.frozen_params
        modules.append(layer.params)
    ends = []
    if stage == 0:
        ends += list(graph.layers[:graph.prologue])
    if stage == par.pp - 1:
        ends += list(graph.layers[len(graph.layers) - graph.epilogue:])
    for layer in ends:
        size, tied = layer.params, 0.0
        if layer is graph.layers[-1] and par.pp > 1 and graph.tied_copy_params:
            tied = graph.tied_copy_params
        tied_frozen = tied if graph.layers[0].frozen_params else 0.0
        dense += size - layer.frozen_params + tied - tied_frozen
        frozen += layer.frozen_params + tied_frozen
        modules.append(size + tied)
    return dense, expert, modules, frozen


def frozen_weight_bytes(frozen: float, precision: str, zero_stage: int, shard: int) -> float:
    """Bytes of ``frozen`` parameters one rank holds (LoRA's base, workloads/lora.py): the weights alone, in the
    16 bits the forward reads (4 bytes under fp32 training), no fp32 master copy, gradient or optimizer state
    whatever ``param_dtype`` says (nothing updates them); sharded over ``shard`` ranks under ZeRO-3 (FSDP shards
    every parameter, frozen or not)."""
    held = frozen * (4 if precision == "fp32" else 2)
    return held / shard if zero_stage >= 3 else held


def stage_params(model, parallelism: Parallelism, stage: int) -> int:
    """Parameters held by one rank of pipeline stage ``stage`` (0-based) after the TP split (and
    the EP split of routed experts), from the layer graph (see :func:`_stage_param_split`)."""
    dense, expert, _, frozen = _stage_param_split(model, parallelism, stage)
    return int(round(dense + expert + frozen))


# --------------------------------------------------------------------------- one rank


def _stage_indices(scenario, stage: int) -> tuple[LayerGraph, list[int]]:
    """The layer graph and the indices (into ``graph.layers``) of ``stage``'s pipelined layers."""
    graph = scenario.layer_graph()
    counts = chunk_counts(scenario, graph)
    par = scenario.parallelism
    first = graph.prologue
    return graph, [first + i for i in stage_layer_indices(len(graph.pipelined), par.pp, par.virtual_stages, stage,
                                                          counts)]


def recompute_working_bytes(scenario, stage: int) -> float:
    """Rematerialisation working set of ``stage``: the backward re-creates one checkpoint unit's
    activations (full: a transformer layer, a CNN's residual block or sqrt(n) segment,
    simulator/memory/checkpoints.py), one attention core (selective) or what per-op selective
    checkpointing dropped (selective_op: the norm outputs, K, w3's output, the FC2 input) on top
    of the stored checkpoints; the largest over the stage's layers or units (0 without
    recompute). Approximation: under sequence parallelism the re-gathered norm outputs count ÷t
    (Megatron's accounting) though torchtitan re-gathers them whole."""
    graph, indices = _stage_indices(scenario, stage)
    return stage_bytes(graph, scenario.parallelism.recompute_mode, indices)[1]


def chunk_activation_bytes(scenario, global_chunk: int) -> float:
    """Bytes one micro-batch's forward through model chunk ``global_chunk`` (0-based, over all
    pp·v chunks) keeps until its backward, on one rank: what its layers keep under the recompute
    mode (as :func:`rank_memory` counts them), plus the prologue (embedding) on the first chunk and
    the epilogue (final norm, head, loss) on the last. What the planner allocates at a chunk's
    forward and frees at the end of its backward (memory over time)."""
    graph = scenario.layer_graph()
    counts = chunk_counts(scenario, graph)
    recompute = scenario.parallelism.recompute_mode
    start = graph.prologue + sum(counts[:global_chunk])
    kept, _ = stage_bytes(graph, recompute, list(range(start, start + counts[global_chunk])))
    every = kept_per_layer(graph, recompute)
    if global_chunk == 0:
        kept += every[:graph.prologue]
    if global_chunk == len(counts) - 1:
        kept += every[len(graph.layers) - graph.epilogue:]
    return sum(kept)


def rank_memory(scenario, stage: int) -> MemoryBreakdown:
    """Peak memory of one rank of pipeline stage ``stage`` (all ranks of a stage are alike)."""
    par, tr = scenario.parallelism, scenario.training
    pp, v, tp, cp = par.pp, par.virtual_stages, par.tp, par.cp
    dp = par.dp_degree
    m = par.num_micro_batches
    _check_schedule(par.schedule, pp, stage, m, v)
    if par.ep > 1 and not par.experts_folded and (dp * cp) % par.ep:
        raise ConfigError("parallelism.ep", f"{par.ep} does not divide dp*cp = {dp * cp}")

    # Model states.
    graph = scenario.layer_graph()
    counts = chunk_counts(scenario, graph)
    dense, expert, modules, frozen = _stage_param_split(scenario.model, par, stage, graph, counts)
    zdp = par.zero_shard_size or dp * cp  # hybrid sharding shards over its group only
    gb = gradient_bytes(tr)
    fp32_params = tr.param_dtype == "fp32"
    w1, g1, o1 = model_state_bytes(dense, par.zero_stage, zdp, tr.precision, tr.optimizer, gb, fp32_params)
    # routed experts: sharded over the ranks holding the same expert shard (dp*cp/ep; folded: tp*cp*dp/(etp*ep))
    edp = zdp // par.ep if not par.experts_folded else par.expert_data_parallel_size
    w2, g2, o2 = model_state_bytes(expert, par.zero_stage, edp, tr.precision, tr.optimizer, gb, fp32_params)
    weights, grads, optim = w1 + w2, g1 + g2, o1 + o2
    if frozen:
        weights += frozen_weight_bytes(frozen, tr.precision, par.zero_stage, zdp)
    if getattr(tr, "optimizer_fusion", "none") == "backward" and m == 1 and modules:
        # optimizer step in backward with no gradient accumulation: each module's gradients are
        # freed by its update right after they are computed, so at most the largest is alive
        # (PyTorch tutorial "How to save memory by fusing the optimizer step into the backward pass").
        grads = max(modules) * held_gradient_bytes(gb, tr.precision, tr.optimizer, fp32_params)

    # Activations, read off the layer graph: what each of the stage's layers keeps under the
    # recompute mode, times the micro-batches in flight; the prologue (embedding) and epilogue
    # (head) times those of the first and last chunk.
    pipelined = graph.pipelined
    recompute = par.recompute_mode
    indices = [graph.prologue + i for i in stage_layer_indices(len(pipelined), pp, v, stage, counts)]
    layers = [graph.layers[i] for i in indices]
    every = kept_per_layer(graph, recompute)

    # What the stage's layers keep (full recompute: the checkpoints of the graph's units,
    # simulator/memory/checkpoints.py), and the rematerialisation working set: the backward
    # re-creates one unit's activations (full) or one attention core (selective) on top of them.
    # Each chunk's layers count its own micro-batches in flight (interleaved: chunks may differ in
    # layers and in micro-batches in flight; one chunk otherwise, the same as microbatches_in_flight).
    kept, working = stage_bytes(graph, recompute, indices)
    per_chunk, start = [], 0
    for c in range(v):
        n = counts[c * pp + stage]
        per_chunk.append(sum(kept[start:start + n]))
        start += n
    prologue = sum(every[:graph.prologue]) if stage == 0 else 0.0
    epilogue = sum(every[len(graph.layers) - graph.epilogue:]) if stage == pp - 1 else 0.0
    chunk_bytes = list(per_chunk)
    chunk_bytes[0] += prologue
    chunk_bytes[-1] += epilogue
    held = chunks_in_flight_at_peak(par.schedule, pp, stage, m, v, chunk_bytes)
    stored = 0.0
    for c in range(v):
        stored += per_chunk[c] * held[c]
    activations = stored + working
    if stage == 0:
        activations += prologue * held[0]
    if stage == pp - 1:
        activations += epilogue * held[-1]

    # Communication buffers.
    wbytes = bytes_per_param(tr.precision, tr.optimizer)["weights"]
    other = 0.0
    other += 2 * par.gradient_bucket_mb * MIB  # PyTorch DDP bucket_cap_mb is in MiB
    if par.zero_stage == 3 and modules:
        # gathered current module + prefetched next, at full size, less the shards already counted
        # (fp32 parameters: the gathered copies are 16-bit casts, none of them counted in ``weights``)
        top2 = sum(sorted(modules)[-2:])
        other += top2 * wbytes * (1.0 if fp32_params else 1 - 1 / zdp)
    if pp > 1 and layers:  # p2p recv + send of the stage's boundary activation
        other += 2 * max(layer.output_bytes for layer in layers) / (tp if par.sequence_parallel else 1)
    return MemoryBreakdown(weights, grads, optim, activations, other, stage=stage)


def peak_stage(stages: list[MemoryBreakdown]) -> tuple[int, MemoryBreakdown, list[MemoryBreakdown]]:
    """(stage with the highest total, its breakdown, every stage's breakdown); ties go to the first.
    The form every strategy kind's ``memory`` returns."""
    best = max(range(len(stages)), key=lambda i: (stages[i].total_bytes, -i))
    return best, stages[best], stages


def peak_rank_memory(scenario) -> tuple[int, MemoryBreakdown, list[MemoryBreakdown]]:
    """The spmd kind's memory: :func:`peak_stage` over every pipeline stage's :func:`rank_memory`."""
    return peak_stage([rank_memory(scenario, i) for i in range(scenario.parallelism.pp)])


def usable_hbm_bytes(scenario, accelerator=None) -> float:
    """HBM one rank may fill: ``accelerator.hbm_gib - simulation.hbm_reserve_gib`` in bytes (the
    scenario's accelerator, or the one given: a mixed cluster's group)."""
    hbm, reserve = (accelerator or scenario.accelerator).hbm_gib, scenario.simulation.hbm_reserve_gib
    if reserve >= hbm:
        raise ConfigError("simulation.hbm_reserve_gib", f"{reserve:g} GiB leaves nothing of {hbm:g} GiB HBM")
    return (hbm - reserve) * GIB


def stage_group_indices(scenario, stage: int) -> list[int]:
    """The node groups of a mixed cluster that hold ranks of pipeline stage ``stage`` (ranks are
    numbered tp-cp-dp-pp, so stage s is the s-th block of world / pp consecutive ranks)."""
    per_stage = scenario.num_gpus // scenario.parallelism.pp
    lo, hi = stage * per_stage, (stage + 1) * per_stage
    return [i for i, g in enumerate(scenario.groups) if g.first_rank < hi and g.first_rank + g.num_gpus > lo]


def fits(scenario, breakdown: MemoryBreakdown,
         per_stage: list[MemoryBreakdown] | None = None) -> tuple[bool, str | None]:
    """Whether ``breakdown`` fits the accelerator's HBM minus the reserve; if not, why. On a mixed
    cluster every stage of ``per_stage`` (or ``breakdown``'s) is checked against each node group
    holding its ranks, and the reason names the group (the A100s may hold what the T4s cannot)."""
    if getattr(scenario, "mixed", False):
        for part in per_stage or [breakdown]:
            stage = part.stage or 0
            for i in stage_group_indices(scenario, stage):
                group = scenario.groups[i]
                usable = usable_hbm_bytes(scenario, group.accelerator)
                if part.total_bytes > usable:
                    return False, (f"needs {part.total_bytes / GIB:.1f} GiB of {usable / GIB:.1f} GiB usable on "
                                   f"{group.accelerator.name} (cluster.groups.{i}: {group.label}; HBM "
                                   f"{group.accelerator.hbm_gib:g} GiB - {scenario.simulation.hbm_reserve_gib:g} GiB "
                                   f"reserve) on stage {stage}")
        return True, None
    usable = usable_hbm_bytes(scenario)
    total = breakdown.total_bytes
    if total <= usable:
        return True, None
    hbm, reserve = scenario.accelerator.hbm_gib, scenario.simulation.hbm_reserve_gib
    where = f" on stage {breakdown.stage}" if breakdown.stage is not None else ""
    return False, (f"needs {total / GIB:.1f} GiB of {usable / GIB:.1f} GiB usable "
                   f"(HBM {hbm:g} GiB - {reserve:g} GiB reserve){where}")
