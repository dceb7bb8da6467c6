"""Prices of per-layer parallelism: one layer under one split, and the reshard between two splits.

This is the interface the planners (``clustersim plan``: PaSE's dynamic program, DeepPool's burst
selection, the adaptive per-component planner) use as their cost oracle. Its contract, kept
stable:

``layer_cost(scenario, layer, config) -> LayerCost`` and ``layer_cost_s(...) -> float``
    ``scenario``: a resolved :class:`~simulator.scenario.Scenario` (any strategy kind; only its
    model, cluster, ``training`` and ``parallelism.global_batch_size`` are read). ``layer``: a
    layer name, an index, or a :class:`~workloads.layer_graph.Layer` of :func:`per_layer_graph`
    (the model's graph at the global batch). ``config``: a :class:`Split` or a mapping such as
    ``{"batch": 2, "rows": 2, "cols": 2}`` (fields: batch, sequence, rows, cols, channels, heads,
    reduction). Returns the seconds one device of the layer's ``config.devices`` spends on it
    per step, each part priced in isolation on the topology: forward and backward kernels
    (the first device's share, :func:`sharding.shard_ops`), forward halo exchange and backward halo
    accumulate (:mod:`.halo`; a spatially split batch norm's statistics all-reduce and a
    sequence-split attention's K/V all-gather with them),
    and the weight-gradient all-reduce over the replicas (batch,
    sequence, spatial cuts). ``layer_cost_s`` is their sum (no overlap assumed; the simulation
    overlaps the gradient all-reduce with the rest of the backward). A config the layer cannot
    take raises :class:`~simulator.errors.ConfigError` naming ``config.<field>``.

``reshard(scenario, layer, config_a, config_b, consumer=None) -> Reshard`` and ``reshard_cost_s(...)``
    The collectives that carry ``layer``'s output from the layout it leaves under ``config_a`` to
    the layout its consumer needs under ``config_b`` (forward), and the adjoint that carries the
    gradient back (backward), with exact bytes (:mod:`.sharding`), priced in isolation on the
    topology. ``consumer``: the reading layer (name, index or Layer; default: the first layer that
    reads ``layer``, else the next one). ``reshard_cost_s`` is forward + backward seconds (0 when
    the layouts agree).

Collectives are priced by :func:`simulator.cost.collectives.collective_cost` on the group's
placement (ranks 0..devices-1 of the cluster, numbered as :func:`sharding.subgroup` says),
with the node's measured laws where it has them; inside a simulation the same bytes become
flows on the ports of the flow network.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass

from pydantic import ValidationError

from simulator.cost.collectives import CollectiveCost, collective_cost
from simulator.cost.compute import ComputeModel
from simulator.cost.topology import Topology
from simulator.errors import ConfigError, from_pydantic
from simulator.scenario import gradient_bytes, layer_graph_of
from simulator.strategies.framework_terms import eager_stretch, kernel_stretch
from simulator.strategies.per_layer.config import MODEL_FIELDS, Split, as_split
from simulator.strategies.per_layer.halo import HaloPhase, halo_phases
from simulator.strategies.per_layer.sharding import (
    CHANNEL_MIXING,
    Collective,
    adjoint,
    check_split,
    edge_shape,
    gradient_group,
    input_layout,
    output_layout,
    plan_reshard,
    shard_ops,
    subgroup,
    work_ratio,
)
from workloads.layer_graph import Layer, LayerGraph

#: Bytes of a batch norm statistic (kept in fp32 under mixed precision).
FP32_BYTES = 4


def per_layer_graph(scenario) -> LayerGraph:
    """The model's layer graph for the whole global batch on one device (unsplit)."""
    shard = dataclasses.replace(scenario.shard, micro_batch=scenario.parallelism.global_batch_size, tp=1, cp=1, ep=1,
                                sequence_parallel=False)
    return layer_graph_of(scenario.model, shard)


@dataclass(frozen=True)
class LayerCost:
    """Seconds one device spends on a layer per step under a split (see the module docstring).
    ``halo_forward_s`` / ``halo_backward_s``: what a spatial or sequence split adds around the
    kernels (halo exchange and accumulate, a batch norm's statistics all-reduce, an attention
    layer's K/V all-gather and its adjoint reduce-scatter); ``gradient_bytes``: the all-reduced
    weight-gradient payload (0 when the weights are not replicated)."""

    forward_s: float
    backward_s: float
    halo_forward_s: float
    halo_backward_s: float
    gradient_reduce_s: float
    devices: int
    flops_per_device: float
    gradient_bytes: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.halo_forward_s + self.halo_backward_s + self.gradient_reduce_s


@dataclass(frozen=True)
class Reshard:
    """The forward collectives (in order) and the backward adjoint ones, with their seconds."""

    forward: tuple[Collective, ...]
    backward: tuple[Collective, ...]
    forward_s: float
    backward_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


class Pricer:
    """Prices kernels and collectives of one scenario (memoized; one per scenario)."""

    def __init__(self, scenario):
        if getattr(scenario, "mixed", False):
            raise ConfigError("cluster.groups", "per_layer prices every device on one accelerator: give cluster.node "
                                                "(mixed clusters run with spmd, local_sgd and the pipeline kinds)")
        if getattr(scenario.model, "is_moe", False):
            # The split dimensions have no expert axis: a batch cut would replicate every expert and a
            # channel cut would tensor-split each one, with no dispatch all-to-all and no routing
            # imbalance, so neither the kind nor the planners searching it can price expert parallelism.
            raise ConfigError("model", f"{scenario.model.name} is a mixture of experts "
                                       f"({scenario.model.moe.num_experts} experts): per_layer and the per-layer "
                                       "planners do not split experts; use `clustersim search`")
        self.scenario = scenario
        self.graph = per_layer_graph(scenario)
        self.batch = self.graph.micro_batch
        self.elem_bytes = scenario.shard.act_bytes
        self.topo = Topology(scenario.node, scenario.fabric, scenario.num_gpus)
        self.links = self.topo.links
        tr = scenario.training
        self.compute = ComputeModel(scenario.accelerator, tr.precision, tr.fp8_gemms, tr.fp8_recipe, tf32=tr.tf32)
        self.grad_elem_bytes = gradient_bytes(tr)
        self._collectives: dict = {}
        self._placements: dict = {}
        # the framework profile's step-level terms, as spmd applies them (simulator/strategies/framework_terms.py):
        # every kernel waits for the slowest of the job's ranks; an eager framework's host issues each kernel
        efficiency = scenario.accelerator.efficiency
        self.jitter = kernel_stretch(efficiency, scenario.num_gpus)
        self.host_dispatch_us = efficiency.host_dispatch_us_per_kernel

    # -- lookups -----------------------------------------------------------------------------

    def layer(self, ref) -> Layer:
        if isinstance(ref, Layer):
            return ref
        if isinstance(ref, int) and not isinstance(ref, bool):
            if not 0 <= ref < len(self.graph.layers):
                raise ConfigError("layer", f"index {ref} outside 0..{len(self.graph.layers) - 1}")
            return self.graph.layers[ref]
        if ref not in self.graph._index:
            raise ConfigError("layer", f"{ref!r} is not a layer of {self.graph.name}")
        return self.graph.layer(ref)

    def consumer_of(self, layer: Layer) -> Layer | None:
        for candidate in self.graph.layers:
            if layer.name in candidate.inputs:
                return candidate
        return None

    # -- pricing -----------------------------------------------------------------------------

    def collective(self, kind: str, payload_bytes: float, ranks: tuple[int, ...]) -> CollectiveCost:
        placement = self._placements.get(ranks)
        if placement is None:  # placing a group walks its ranks (16,384 of a burst): once per group
            placement = self._placements[ranks] = self.topo.placement(ranks)
        key = (kind, payload_bytes, placement.size, placement.members_per_node, placement.num_nodes, placement.num_pods)
        hit = self._collectives.get(key)
        if hit is None:
            node = self.scenario.node
            hit = self._collectives[key] = collective_cost(
                kind, payload_bytes, placement, self.links, node.intra_laws, node.inter_node_collectives,
                node.nvls_all_reduce, mesh_peers=node.gpus_per_node - 1 if node.intra_node.kind == "xgmi" else None)
        return hit

    def collective_s(self, c: Collective) -> float:
        return self.collective(c.kind, c.payload_bytes, c.ranks).isolated_time_s(self.links)

    def halo_collectives(self, layer: Layer, split: Split) -> tuple[Collective, ...]:
        """What a spatial or sequence split adds to a layer, forward (and, adjoint, backward): each halo phase
        as a neighbour exchange (``send_recv``) on its sub-communicator; for a batch norm, the
        all-reduce of its per-channel statistics over the spatial grid (mean and variance
        forward, the sums of dy and dy·x̂ backward: 2 fp32 per local channel), without which the
        blocks of one image would normalise with different statistics (DistDL's distributed
        batch norm, Hewett & Grady 2020, Sec. 4)."""
        cut = split.reduction if layer.kind in CHANNEL_MIXING else split.channels
        phases: tuple[HaloPhase, ...] = halo_phases(layer, split, self.batch, cut, self.elem_bytes)
        out = [Collective("send_recv", p.bytes, subgroup(split, (p.axis,))[:2], p.bytes) for p in phases]
        grid = subgroup(split, ("rows", "cols"))
        if layer.kind == "batchnorm" and len(grid) > 1 and layer.output_shape:
            stats = 2 * -(-layer.output_shape[0] // split.channels) * FP32_BYTES
            out.append(Collective("all_reduce", stats, grid, 2 * stats * (len(grid) - 1) / len(grid)))
        classes = subgroup(split, ("reduction",))
        if layer.kind == "loss" and len(classes) > 1:
            # a loss split over its classes (vocabulary-parallel cross-entropy, Shoeybi et al. 2019
            # Sec. 3): each device reduces its slice of the logits; the per-token maximum, sum of
            # exponentials and target logit (3 fp32) are all-reduced over the class group
            tokens = -(-self.batch // split.batch) * -(-_tokens_per_sample(layer) // split.sequence)
            stats = 3 * tokens * FP32_BYTES
            out.append(Collective("all_reduce", stats, classes, 2 * stats * (len(classes) - 1) / len(classes)))
        ring = subgroup(split, ("sequence",))
        if layer.kind == "attention" and len(ring) > 1 and layer.output_shape:
            # a sequence split's queries attend to every key: the local heads' K and V of the whole
            # sequence are all-gathered forward (and their gradients reduce-scattered backward), as
            # context parallelism without the ring (Megatron-LM's all-gather CP variant)
            seq, width = layer.output_shape
            kv = 2 * -(-self.batch // split.batch) * seq * -(-width // split.heads) * self.elem_bytes
            out.append(Collective("all_gather", kv, ring, kv * (len(ring) - 1) / len(ring)))
        return tuple(out)

    def gradient_collective(self, layer: Layer, split: Split) -> Collective | None:
        group = gradient_group(split)
        if len(group) < 2 or layer.params <= 0:
            return None
        shards = 1
        for field in MODEL_FIELDS:
            shards *= getattr(split, field)
        payload = -(-layer.params // shards) * self.grad_elem_bytes
        return Collective("all_reduce", payload, group, 2 * payload * (len(group) - 1) / len(group))

    def layer_cost(self, layer: Layer, split: Split) -> LayerCost:
        forward, backward = (shard_ops(layer, split, self.batch, p) for p in ("forward", "backward"))
        halo = sum(self.collective_s(c) for c in self.halo_collectives(layer, split))
        grad = self.gradient_collective(layer, split)
        factor = self._eager_stretch(forward, backward)
        return LayerCost(
            forward_s=self._kernels_s(layer, forward, split, "forward") * self.jitter * factor,
            backward_s=self._kernels_s(layer, backward, split, "backward") * self.jitter * factor,
            halo_forward_s=halo, halo_backward_s=halo,
            gradient_reduce_s=self.collective_s(grad) if grad else 0.0,
            devices=split.devices,
            flops_per_device=sum(op.flops for op in forward + backward),
            gradient_bytes=grad.payload_bytes if grad else 0.0)

    def _eager_stretch(self, forward, backward) -> float:
        """The eager-dispatch floor's factor on the layer's passes (simulator/strategies/framework_terms.py:
        each pass issued kernel by kernel, its kernels stretched by the jitter as spmd prices them); 1
        without ``host_dispatch_us_per_kernel``."""
        if not self.host_dispatch_us:
            return 1.0
        passes = [[self.compute.time_s(op) * self.jitter for op in ops if op.kind != "collective"]
                  for ops in (forward, backward) if ops]
        return eager_stretch(passes, self.host_dispatch_us)

    def graph_at(self, micro_batch: int) -> LayerGraph:
        """The model's graph at ``micro_batch`` samples (a profiled model's times are measured,
        or interpolated, per batch size)."""
        shard = dataclasses.replace(self.scenario.shard, micro_batch=micro_batch, tp=1, cp=1, ep=1,
                                    sequence_parallel=False)
        return layer_graph_of(self.scenario.model, shard)

    def _kernels_s(self, layer: Layer, ops, split: Split, phase: str) -> float:
        """Kernel seconds on the first device. A profiled layer (``measured_*_s``) takes its time
        measured at the device's own batch, ceil(B / batch cut) (DeepPool's profiles hold one per
        batch size: small batches do not scale linearly), cut further by its other cuts."""
        if layer.measured_forward_s is None and layer.measured_backward_s is None:
            return self.compute.ops_time_s(ops)
        local = -(-self.batch // split.batch)
        same = self.graph_at(local).layers[self.graph._index[layer.name]]
        measured = same.measured_forward_s if phase == "forward" else same.measured_backward_s
        if measured is None:
            return self.compute.ops_time_s(ops)
        return measured * work_ratio(layer, split, self.batch) * self.batch / local

    def reshard(self, producer: Layer, split_a: Split, consumer: Layer, split_b: Split) -> Reshard:
        shape = edge_shape(producer, self.batch, self.elem_bytes)
        src = output_layout(producer, split_a, self.batch, shape)
        dst = input_layout(consumer, split_b, self.batch, shape)
        forward = plan_reshard(src, dst, self.elem_bytes)
        grad_src, grad_dst = adjoint(src, dst)
        backward = plan_reshard(grad_src, grad_dst, self.elem_bytes)
        return Reshard(forward, backward, sum(self.collective_s(c) for c in forward),
                       sum(self.collective_s(c) for c in backward))


_PRICERS: OrderedDict[int, tuple[object, Pricer]] = OrderedDict()
_PRICERS_KEPT = 16


def _tokens_per_sample(layer: Layer) -> int:
    """Positions per sample a loss scores: the sequence of its (sequence, classes) input, else 1."""
    shape = layer.input_shape or ()
    return shape[0] if len(shape) == 2 else 1


def pricer(scenario) -> Pricer:
    """The scenario's :class:`Pricer`, one per scenario object (the last 16 kept), so that a
    planner's many calls on one scenario price each op shape and collective once."""
    hit = _PRICERS.get(id(scenario))
    if hit is not None and hit[0] is scenario:
        _PRICERS.move_to_end(id(scenario))
        return hit[1]
    made = Pricer(scenario)
    _PRICERS[id(scenario)] = (scenario, made)
    while len(_PRICERS) > _PRICERS_KEPT:
        _PRICERS.popitem(last=False)
    return made


def _checked(p: Pricer, layer: Layer, config, where: str = "config") -> Split:
    try:
        split = as_split(config)
    except ValidationError as exc:  # a bad mapping: one error naming the field
        raise from_pydantic(exc, where) from None
    return check_split(layer, split, p.batch, p.scenario.num_gpus, "round_up", where)


def layer_cost(scenario, layer, config) -> LayerCost:
    """``layer`` under ``config`` on one of its devices (see the module docstring)."""
    p = pricer(scenario)
    target = p.layer(layer)
    return p.layer_cost(target, _checked(p, target, config))


def layer_cost_s(scenario, layer, config) -> float:
    """Seconds per step of ``layer`` under ``config``: kernels, halos and gradient all-reduce."""
    return layer_cost(scenario, layer, config).total_s


def reshard(scenario, layer, config_a, config_b, consumer=None) -> Reshard:
    """``layer``'s output from ``config_a``'s layout to what ``consumer`` needs under ``config_b``."""
    p = pricer(scenario)
    producer = p.layer(layer)
    if consumer is None:
        reader = p.consumer_of(producer)
        if reader is None:
            raise ConfigError("layer", f"{producer.name} has no consumer: nothing to reshard")
    else:
        reader = p.layer(consumer)
    return p.reshard(producer, _checked(p, producer, config_a, "config_a"), reader,
                     _checked(p, reader, config_b, "config_b"))


def reshard_cost_s(scenario, layer, config_a, config_b, consumer=None) -> float:
    """Forward + backward seconds of :func:`reshard` (0 when the layouts agree)."""
    return reshard(scenario, layer, config_a, config_b, consumer).total_s
