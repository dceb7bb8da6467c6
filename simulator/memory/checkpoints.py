"""What full recompute keeps: the graph's checkpoint units, their kept inputs and working sets.

Full recompute ("activation checkpointing") keeps the input of each *unit* of the network, drops
every activation inside it, and re-runs the unit's forward before its backward (Chen et al. 2016,
"Training deep nets with sublinear memory cost", arXiv:1604.06174, Sec. 3-4). The peak is then the
kept inputs plus one unit's re-created activations. What a unit is decides whether anything is
saved at all: a CNN's layer graph has one layer per kernel (a convolution, its batch norm, its
ReLU), and keeping each such layer's input keeps what it saved anyway. So the units are

- a transformer builder's graph (layers of kind ``transformer_block`` / ``mlp_block``): every layer
  its own unit, keeping what :meth:`workloads.layer_graph.Layer.kept_bytes` says (its input;
  Megatron's per-layer checkpoint, Korthikanti et al. 2022 Sec. 5) -- unchanged;
- a graph with residual blocks (simulator/strategies/residual_blocks.py, read from the wiring: a
  ResNet's bottlenecks, ViT/BERT layers, GNMT's residual LSTMs): each residual block a unit, and
  the layers before the first (the stem, an embedding), after the last (the head) and any run of
  non-residual layers between two of them one unit each -- what ``torch.utils.checkpoint`` around
  every block and the stem does;
- a graph without residual blocks (VGG, U-Net, Inception, BigLSTM): Chen et al.'s sqrt(n)
  segments, ceil(sqrt(n)) consecutive runs of the n layers in topological order, the first
  ``n mod k`` one layer longer (Sec. 4.1: k segments of n/k layers cost O(n/k + k) memory, least
  at k = sqrt(n)); equal layer counts, as ``torch.utils.checkpoint.checkpoint_sequential`` splits
  a sequential model, not Chen et al.'s memory-planned split (their Sec. 4.2 greedy search over a
  budget; on VGG-16 at 32 images it would keep 0.61 GiB where these segments keep 0.81, none 1.28).

A unit keeps every tensor it reads from outside itself: the outputs of layers in other units
(each tensor once, counted at its first reader across a unit border -- U-Net's skips too) and the
batch a layer with no inputs reads (what that layer saves of it, its ``saved_bytes``: the images
of a CNN's first convolution). The tensor is counted on its reader, so a pipeline stage counts the
checkpoints its own layers read. Its working set in the backward is what its layers save, less
what it keeps (the kept input is one of the saved tensors): ``max(0, sum(saved) - sum(kept))``.

A pipeline chunk that starts inside a unit keeps what it receives from the unit's layers before
the cut (every tensor its layers read from them, a residual skip too: a cut sends every tensor
that crosses it) and re-runs its part of the unit: each part of a unit on a chunk is a unit of
its own.

:func:`stage_bytes` is what :func:`simulator.memory.analytic.rank_memory` and the memory-over-time
tasks count; :mod:`simulator.memory.vectorised` computes the same per stage with numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.strategies.residual_blocks import BLOCK_LAYER_KINDS, residual_chain
from workloads.graph import full_units, partial_full_of
from workloads.layer_graph import LayerGraph

_PLANS: dict[int, tuple[LayerGraph, CheckpointPlan]] = {}
_KEPT = 64


@dataclass(frozen=True)
class CheckpointPlan:
    """Full recompute of one graph, per layer of ``graph.layers``: its unit's index, the bytes it
    keeps (checkpoints it reads first across a unit border), the bytes it reads from its own unit
    (kept where a pipeline chunk starts at it) and what it saves without recompute."""

    unit: tuple[int, ...]
    kept_bytes: tuple[float, ...]
    saved_bytes: tuple[float, ...]
    sources: tuple[tuple[int, ...], ...]  # the layers each layer reads (indices, each once)
    per_layer: bool  # every layer its own unit (a transformer builder's graph)

    def received_bytes(self, graph: LayerGraph, cut: int, i: int, seen: set[int]) -> float:
        """What layer ``i`` of a unit cut at layer ``cut`` (a chunk starting inside the unit) reads
        from the unit's layers before the cut, less the tensors in ``seen`` (added to it)."""
        total = 0.0
        for j in self.sources[i]:
            if j < cut and self.unit[j] == self.unit[i] and j not in seen:
                seen.add(j)
                total += graph.layers[j].output_bytes
        return total


def sqrt_segments(n: int) -> list[int]:
    """Layers per segment of Chen et al.'s sqrt(n) split of ``n`` layers: ceil(sqrt(n)) segments,
    the first ``n mod k`` one layer longer."""
    if n <= 0:
        return []
    k = math.isqrt(n - 1) + 1  # ceil(sqrt(n))
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def units_of(graph: LayerGraph) -> tuple[int, ...]:
    """The checkpoint unit of every layer of ``graph.layers`` (module docstring), numbered in order."""
    layers = graph.layers
    if any(layer.kind in BLOCK_LAYER_KINDS for layer in layers):
        return tuple(range(len(layers)))
    opening, blocks, closing = residual_chain(graph)
    sizes: list[int]
    if blocks:
        sizes = [len(opening)] + [len(block.layers) for block in blocks] + [len(closing)]
    else:
        sizes = sqrt_segments(len(layers))
    unit: list[int] = []
    for number, size in enumerate(s for s in sizes if s):
        unit.extend([number] * size)
    return tuple(unit)


def plan_of(graph: LayerGraph) -> CheckpointPlan:
    """The graph's :class:`CheckpointPlan` (cached per graph; the graphs are cached per shard)."""
    key = id(graph)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is graph:
        return hit[1]
    layers = graph.layers
    unit = units_of(graph)
    per_layer = any(layer.kind in BLOCK_LAYER_KINDS for layer in layers)
    index = {layer.name: i for i, layer in enumerate(layers)}
    kept: list[float] = []
    every_source: list[tuple[int, ...]] = []
    taken: set[int] = set()
    for i, layer in enumerate(layers):
        sources = tuple(index[name] for name in dict.fromkeys(layer.inputs))
        every_source.append(sources)
        if per_layer:
            kept.append(layer.kept_bytes("full", graph.input_bytes(layer)))
            continue
        outside = 0.0
        for j in sources:
            if unit[j] != unit[i] and j not in taken:
                taken.add(j)
                outside += layers[j].output_bytes
        if not sources:  # reads the batch: what it saves of it
            outside += layer.checkpoint_bytes if layer.checkpoint_bytes is not None else layer.saved_bytes
        kept.append(outside)
    plan = CheckpointPlan(unit, tuple(kept), tuple(layer.saved_bytes for layer in layers), tuple(every_source),
                          per_layer)
    if len(_PLANS) >= _KEPT:
        _PLANS.clear()
    _PLANS[key] = (graph, plan)
    return plan


def kept_per_layer(graph: LayerGraph, recompute: str) -> tuple[float, ...]:
    """Bytes every layer of ``graph.layers`` keeps for its backward under ``recompute`` (full: the
    checkpoints of :func:`plan_of`; the other modes: :meth:`Layer.kept_bytes`)."""
    if recompute == "full":
        return plan_of(graph).kept_bytes
    return tuple(layer.kept_bytes(recompute, graph.input_bytes(layer)) for layer in graph.layers)


def graph_kept_bytes(graph: LayerGraph, recompute: str) -> float:
    """Activation bytes one micro-batch through the whole graph keeps under ``recompute``."""
    return sum(kept_per_layer(graph, recompute))


def stage_bytes(graph: LayerGraph, recompute: str, indices: list[int],
                scale: list[float] | None = None,
                saved_scale: list[float] | None = None) -> tuple[list[float], float]:
    """(kept bytes of each layer of ``indices``, the rematerialisation working set) for the layers
    of ``graph.layers`` at ``indices`` (ascending; a gap is a chunk border) held by one rank;
    ``scale`` (one factor per index): the share of each layer's activations the rank holds (a
    subnetwork's masked layers, simulator/strategies/subnetwork_dp.py; None: all); ``saved_scale``:
    the share of everything each layer saves, where it differs from the share of what it keeps
    (a neuron-masked transformer block keeps its whole input under full recompute but re-creates
    only its kept heads and units; default: ``scale``).

    Without recompute the working set is 0; selective modes re-create one layer's dropped tensors
    (the largest ``saved - kept`` over the layers); full recompute one unit's part on a chunk (the
    largest ``saved - kept`` over the parts), where a part that continues a unit from before the
    chunk also keeps what its first layer reads from that unit. Megatron-Core's partial full recompute
    (``full:<method>:<N>``): :func:`_partial_full_bytes`."""
    layers = graph.layers
    saved_scale = saved_scale if saved_scale is not None else scale
    if partial_full_of(recompute) is not None:
        return _partial_full_bytes(graph, recompute, indices, scale, saved_scale)
    if recompute != "full":
        kept = [layers[i].kept_bytes(recompute, graph.input_bytes(layers[i])) for i in indices]
        saved = [layers[i].saved_bytes for i in indices]
        if scale is not None:
            kept = [k * f for k, f in zip(kept, scale, strict=True)]
        if saved_scale is not None:
            saved = [b * f for b, f in zip(saved, saved_scale, strict=True)]
        if recompute == "none" or not indices:
            return kept, 0.0
        return kept, max(max(0.0, b - k) for b, k in zip(saved, kept, strict=True))
    plan = plan_of(graph)
    kept = []
    working = 0.0
    part_saved = part_kept = 0.0
    previous = None
    cut = None  # the first layer of a part that continues a unit begun before its chunk
    seen: set[int] = set()
    for n, i in enumerate(indices):
        k = plan.kept_bytes[i]
        starts = previous is None or i != previous + 1 or plan.unit[i] != plan.unit[previous]
        if starts:
            if previous is not None:
                working = max(working, max(0.0, part_saved - part_kept))
            part_saved = part_kept = 0.0
            cut = i if i > 0 and plan.unit[i] == plan.unit[i - 1] else None
            seen = set()
        if cut is not None:  # what the chunk receives from the unit's layers before it
            k += plan.received_bytes(graph, cut, i, seen)
        saved = plan.saved_bytes[i]
        if scale is not None:
            k *= scale[n]
        if saved_scale is not None:
            saved *= saved_scale[n]
        part_saved += saved
        part_kept += k
        kept.append(k)
        previous = i
    if previous is not None:
        working = max(working, max(0.0, part_saved - part_kept))
    return kept, working


def _partial_full_bytes(graph: LayerGraph, recompute: str, indices: list[int], scale: list[float] | None,
                        saved_scale: list[float] | None) -> tuple[list[float], float]:
    """:func:`stage_bytes` under Megatron-Core's partial full recompute (``recompute_method`` /
    ``recompute_num_layers``; a transformer builder's graph, every layer a block): each run of consecutive
    ``indices`` is a model chunk, cut into the checkpoint units of :func:`workloads.graph.full_units`. A unit's
    first layer keeps its input (:meth:`Layer.kept_bytes`, as under ``full``), its other layers keep nothing
    (``tensor_parallel.checkpoint`` saves only the unit's inputs); a layer in no unit (``block``: past the
    chunk's first N) keeps what it saves. The working set is the largest unit's re-created activations, the
    sum of what its layers save less its kept input (uniform N: N layers' worth at once)."""
    layers = graph.layers
    working = 0.0
    runs: list[list[int]] = []  # positions in ``indices`` of each chunk
    for n, i in enumerate(indices):
        if n == 0 or i != indices[n - 1] + 1:
            runs.append([])
        runs[-1].append(n)
    kept = [0.0] * len(indices)
    for run in runs:
        in_unit = [False] * len(run)
        for first, end in full_units(recompute, len(run)):
            part_saved = part_kept = 0.0
            for position in range(first, end):
                n = run[position]
                layer = layers[indices[n]]
                k = layer.kept_bytes(recompute, graph.input_bytes(layer)) if position == first else 0.0
                saved = layer.saved_bytes
                if scale is not None:
                    k *= scale[n]
                if saved_scale is not None:
                    saved *= saved_scale[n]
                kept[n] = k
                part_saved += saved
                part_kept += k
                in_unit[position] = True
            working = max(working, max(0.0, part_saved - part_kept))
        for position, n in enumerate(run):
            if not in_unit[position]:
                k = layers[indices[n]].saved_bytes
                kept[n] = k * scale[n] if scale is not None else k
    return kept, working
