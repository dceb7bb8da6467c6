"""Every pipeline stage's peak memory at once: :func:`simulator.memory.analytic.peak_rank_memory`
for a search's thousands of layouts.

The analytic model (simulator/memory/analytic.py, :func:`~simulator.memory.analytic.rank_memory`)
is the reference and stays as it is; this module computes the same numbers, stage by stage, with
the per-layer quantities read off the layer graph once per graph and the per-stage sums taken by
``numpy.bincount`` over the layers (it adds each stage's layers in layer order, the order
``rank_memory``'s ``sum`` uses, so the sums are the same floating-point numbers). A search calls
it for every candidate that passed the divisibility checks: for GPT-3 175B on 1,024 GPUs, 1,158
layouts and 20,340 stages, where ``rank_memory`` walks every stage's layers in Python.

``tests/test_memory_vectorised.py`` compares every field of every stage with ``rank_memory`` over
random layouts of several models (hypothesis): equal within 1e-12 relative.
"""

from __future__ import annotations

import numpy as np

from simulator.errors import ConfigError
from simulator.memory.analytic import (
    MIB,
    MemoryBreakdown,
    _check_schedule,
    _chunk_count_in_flight,
    bytes_per_param,
    chunks_in_flight_at_peak,
    frozen_weight_bytes,
    held_gradient_bytes,
    model_state_bytes,
    peak_stage,
)
from simulator.memory.checkpoints import kept_per_layer, plan_of, stage_bytes
from simulator.scenario import gradient_bytes
from simulator.strategies.spmd.split import chunk_counts
from workloads.graph import partial_full_of

_GRAPH_ARRAYS: dict[int, tuple] = {}
_KEPT = 64
_STATES_CHECKED: set[tuple] = set()


def _graph_arrays(graph, recompute: str) -> dict:
    """Per pipelined layer of ``graph``: dense and expert parameters, what it keeps under
    ``recompute``, its rematerialisation working set and its output bytes; the prologue's and
    epilogue's kept bytes. Cached per graph (the layer graphs are themselves cached per shard)."""
    key = id(graph)
    hit = _GRAPH_ARRAYS.get(key)
    if hit is None or hit[0] is not graph:
        if len(_GRAPH_ARRAYS) >= _KEPT:
            _GRAPH_ARRAYS.clear()
        hit = _GRAPH_ARRAYS[key] = (graph, {})
    per_mode = hit[1]
    arrays = per_mode.get(recompute)
    if arrays is None:
        pipelined = graph.pipelined
        first, last = graph.prologue, len(graph.layers) - graph.epilogue
        every = kept_per_layer(graph, recompute)
        kept_bytes = list(every[first:last])
        arrays = per_mode[recompute] = {
            "dense": np.array([layer.params - layer.expert_params - layer.frozen_params for layer in pipelined],
                              dtype=float),
            "frozen": np.array([layer.frozen_params for layer in pipelined], dtype=float),
            "expert": np.array([layer.expert_params for layer in pipelined], dtype=float),
            "params": [layer.params for layer in pipelined],
            "kept": np.array(kept_bytes, dtype=float),
            "working": np.array([max(0.0, layer.saved_bytes - k) for layer, k in zip(pipelined, kept_bytes,
                                                                                      strict=True)], dtype=float),
            "output": np.array([layer.output_bytes for layer in pipelined], dtype=float),
            "prologue": graph.layers[:first],
            "epilogue": graph.layers[last:],
            "prologue_kept": sum(every[:first]),
            "epilogue_kept": sum(every[last:]),
        }
        if recompute == "full" and not plan_of(graph).per_layer:  # units of several layers
            plan = plan_of(graph)
            arrays["unit"] = np.array(plan.unit[first:last])
            arrays["saved"] = np.array(plan.saved_bytes[first:last], dtype=float)
            arrays["plan"], arrays["graph"], arrays["first"] = plan, graph, first
    return arrays


def _stage_max(values: np.ndarray, stage_of: np.ndarray, pp: int) -> np.ndarray:
    """Per stage, the largest of its layers' ``values`` (-inf for a stage without layers)."""
    out = np.full(pp, -np.inf)
    np.maximum.at(out, stage_of, values)
    return out


def stage_memories(scenario) -> list[MemoryBreakdown]:
    """:func:`~simulator.memory.analytic.rank_memory` of every pipeline stage (module docstring)."""
    par, tr = scenario.parallelism, scenario.training
    pp, v, tp, cp = par.pp, par.virtual_stages, par.tp, par.cp
    dp = par.dp_degree
    m = par.num_micro_batches
    _check_schedule(par.schedule, pp, 0, m, v)  # the same for every stage but its index, in range here
    if par.ep > 1 and not par.experts_folded and (dp * cp) % par.ep:
        raise ConfigError("parallelism.ep", f"{par.ep} does not divide dp*cp = {dp * cp}")

    graph = scenario.layer_graph()
    counts = chunk_counts(scenario, graph)
    arrays = _graph_arrays(graph, par.recompute_mode)
    # the stage of every pipelined layer: global chunk k sits on pipeline rank k mod pp
    stage_of = np.repeat(np.arange(pp * v) % pp, counts)
    layers_per_stage = np.bincount(stage_of, minlength=pp)

    # Model states (rank_memory: _stage_param_split, then model_state_bytes).
    dense = np.bincount(stage_of, weights=arrays["dense"], minlength=pp)
    expert = np.bincount(stage_of, weights=arrays["expert"], minlength=pp)
    frozen = np.bincount(stage_of, weights=arrays["frozen"], minlength=pp)
    tied_extra = graph.tied_copy_params if pp > 1 else 0.0
    last_layer = graph.layers[-1]
    end_modules: dict[int, list[float]] = {}
    for stage, ends in ((0, arrays["prologue"]), (pp - 1, arrays["epilogue"])):
        for layer in ends:
            tied = tied_extra if layer is last_layer else 0.0
            tied_frozen = tied if graph.layers[0].frozen_params else 0.0
            dense[stage] += layer.params - layer.frozen_params + tied - tied_frozen
            frozen[stage] += layer.frozen_params + tied_frozen
            end_modules.setdefault(stage, []).append(layer.params + tied)
    zdp = par.zero_shard_size or dp * cp
    gb = gradient_bytes(tr)
    fp32_params = tr.param_dtype == "fp32"
    edp = zdp // par.ep if not par.experts_folded else par.expert_data_parallel_size
    w1, g1, o1 = _states(dense, par.zero_stage, zdp, tr.precision, tr.optimizer, gb, fp32_params)
    w2, g2, o2 = _states(expert, par.zero_stage, edp, tr.precision, tr.optimizer, gb, fp32_params)
    weights, grads, optim = w1 + w2, g1 + g2, o1 + o2
    if frozen.any():
        weights = weights + frozen_weight_bytes(frozen, tr.precision, par.zero_stage, zdp)

    def modules(stage: int) -> list[float]:
        """The stage's module sizes, as _stage_param_split lists them (layers, then the ends)."""
        params = arrays["params"]
        out = []
        for c in range(v):
            k = c * pp + stage
            start = int(sum(counts[:k]))
            out.extend(params[start:start + counts[k]])
        return out + end_modules.get(stage, [])

    if getattr(tr, "optimizer_fusion", "none") == "backward" and m == 1:
        for stage in range(pp):
            sizes = modules(stage)
            if sizes:
                grads[stage] = max(sizes) * held_gradient_bytes(gb, tr.precision, tr.optimizer, fp32_params)

    # Activations: kept bytes × micro-batches in flight, the working set, the two ends. Interleaved:
    # each chunk's layers times that chunk's own micro-batches in flight (rank_memory's count).
    partial = partial_full_of(par.recompute_mode) is not None
    if partial:
        kept, working = _partial_parts(graph, par.recompute_mode, counts, pp)
    elif "unit" in arrays:
        kept, working = _unit_parts(arrays, stage_of, pp)
    else:
        kept = arrays["kept"]
    prologue_held = epilogue_held = _chunk_count_in_flight(par.schedule, pp, 0, m, v, 0)
    if v == 1:
        stored = np.bincount(stage_of, weights=kept, minlength=pp) * _in_flight(par.schedule, pp, m, v)
        epilogue_held = _chunk_count_in_flight(par.schedule, pp, pp - 1, m, v, 0)
    else:  # each chunk's micro-batches in flight at the rank's peak (chunks_in_flight_at_peak)
        chunk_kept = np.bincount(np.repeat(np.arange(pp * v), counts), weights=kept, minlength=pp * v)
        stored = np.zeros(pp)
        for stage in range(pp):
            own = chunk_kept[stage::pp]
            sizes = own.copy()
            if stage == 0:
                sizes[0] += arrays["prologue_kept"]
            if stage == pp - 1:
                sizes[-1] += arrays["epilogue_kept"]
            held = chunks_in_flight_at_peak(par.schedule, pp, stage, m, v, sizes.tolist())
            stored[stage] = float(own @ np.asarray(held, dtype=float))
            if stage == 0:
                prologue_held = held[0]
            if stage == pp - 1:
                epilogue_held = held[-1]
    if "unit" not in arrays and not partial:
        if par.recompute == "none":
            working = np.zeros(pp)
        else:
            working = np.where(layers_per_stage > 0, _stage_max(arrays["working"], stage_of, pp), 0.0)
    activations = stored + working
    if graph.prologue:
        activations[0] += arrays["prologue_kept"] * prologue_held
    if graph.epilogue:
        activations[pp - 1] += arrays["epilogue_kept"] * epilogue_held

    # Communication buffers.
    other = np.full(pp, 0.0 + 2 * par.gradient_bucket_mb * MIB)
    if par.zero_stage == 3:
        wbytes = bytes_per_param(tr.precision, tr.optimizer)["weights"]
        for stage in range(pp):
            sizes = modules(stage)
            if sizes:
                top2 = sum(sorted(sizes)[-2:])
                other[stage] += top2 * wbytes * (1.0 if fp32_params else 1 - 1 / zdp)
    if pp > 1:
        boundary = 2 * _stage_max(arrays["output"], stage_of, pp) / (tp if par.sequence_parallel else 1)
        other = np.where(layers_per_stage > 0, other + boundary, other)
    return [MemoryBreakdown(float(w), float(g), float(o), float(a), float(x), stage=stage)
            for stage, (w, g, o, a, x) in enumerate(zip(weights.tolist(), grads.tolist(), optim.tolist(),
                                                         activations.tolist(), other.tolist(), strict=True))]


def _partial_parts(graph, recompute: str, counts: list[int], pp: int) -> tuple[np.ndarray, np.ndarray]:
    """Megatron-Core's partial full recompute (simulator/memory/checkpoints.py ``_partial_full_bytes``, the
    units cut per model chunk): (kept bytes of every pipelined layer, the working set of every stage)."""
    kept: list[float] = []
    working = np.zeros(pp)
    start = graph.prologue
    for k, count in enumerate(counts):
        chunk_kept, chunk_working = stage_bytes(graph, recompute, list(range(start, start + count)))
        kept.extend(chunk_kept)
        working[k % pp] = max(working[k % pp], chunk_working)
        start += count
    return np.array(kept, dtype=float), working


def _unit_parts(arrays: dict, stage_of: np.ndarray, pp: int) -> tuple[np.ndarray, np.ndarray]:
    """Full recompute over units of several layers (simulator/memory/checkpoints.py
    ``stage_bytes``): every layer's kept bytes (plus, on a chunk that starts inside a unit, what
    its layers receive from the unit's layers before the cut) and every stage's working set, the
    largest ``saved - kept`` over the parts of units on its chunks."""
    unit = arrays["unit"]
    n = len(unit)
    kept = arrays["kept"].copy()
    if n == 0:
        return kept, np.zeros(pp)
    starts = np.ones(n, dtype=bool)  # adjacent layers on two stages: two chunks
    starts[1:] = (stage_of[1:] != stage_of[:-1]) | (unit[1:] != unit[:-1])
    plan, graph, first = arrays["plan"], arrays["graph"], arrays["first"]
    for cut in np.flatnonzero(starts[1:] & (unit[1:] == unit[:-1])) + 1:  # chunks that start inside a unit
        seen: set[int] = set()
        i = int(cut)
        while i < n and (i == cut or not starts[i]):
            kept[i] = kept[i] + plan.received_bytes(graph, first + int(cut), first + i, seen)
            i += 1
    part = np.cumsum(starts) - 1
    parts = int(part[-1]) + 1
    part_working = np.maximum(0.0, np.bincount(part, weights=arrays["saved"], minlength=parts)
                              - np.bincount(part, weights=kept, minlength=parts))
    working = np.maximum(_stage_max(part_working, stage_of[starts], pp), 0.0)
    return kept, working


def _in_flight(schedule: str, pp: int, m: int, v: int) -> np.ndarray:
    """:func:`~simulator.memory.analytic.microbatches_in_flight` of every stage (its formulas, per
    stage index: GPipe m·v; 1F1B and ZB-H1 min(p - i, m); interleaved (p - i - 1)·2 + (v - 1)·p + 1,
    capped at m·v), over v."""
    stage = np.arange(pp)
    if schedule == "gpipe":
        chunks = np.full(pp, m * v)
    elif schedule in ("1f1b", "zb-h1"):
        chunks = np.minimum(pp - stage, m)
    else:
        warmup = (pp - stage - 1) * 2 + (v - 1) * pp
        chunks = np.where(warmup >= m * v, m * v, warmup + 1)
    return chunks / v


def _states(params: np.ndarray, zero_stage: int, dp: int, precision: str, optimizer: str, grad_bytes: float,
            fp32_params: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~simulator.memory.analytic.model_state_bytes` of every stage's parameters."""
    settings = (zero_stage, dp, precision, optimizer, grad_bytes, fp32_params)
    if settings not in _STATES_CHECKED:
        model_state_bytes(0.0, *settings)  # its checks of the settings
        _STATES_CHECKED.add(settings)
    if not (params.min() >= 0 and np.isfinite(params.max())):
        bad = params[~np.isfinite(params) | (params < 0)][0]
        raise ConfigError("num_params", f"must be a non-negative finite number, got {bad}")
    bpp = bytes_per_param(precision, optimizer, fp32_params)
    w = bpp["weights"] * params
    g = held_gradient_bytes(grad_bytes, precision, optimizer, fp32_params) * params
    o = bpp["optimizer"] * params
    if zero_stage >= 1:
        o = o / dp
    if zero_stage >= 2:
        g = g / dp
    if zero_stage >= 3:
        w = w / dp
    return w, g, o


def peak_memory(scenario) -> tuple[int, MemoryBreakdown, list[MemoryBreakdown]]:
    """:func:`~simulator.memory.analytic.peak_rank_memory`, every stage at once."""
    return peak_stage(stage_memories(scenario))
