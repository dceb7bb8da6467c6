"""The layer graph: the one description of a network that compute, memory and every strategy read.

A :class:`LayerGraph` is a DAG of :class:`Layer` s in topological order (usually a chain), built
for one micro-batch on one rank after a layout's shard (a transformer builder takes the layout's
``ShardShape``; a CNN builder takes the micro-batch and precision). Each layer holds

- its kernels: ``forward`` and ``backward`` :class:`~workloads.graph.Op` s in execution order
  (GEMMs and convolutions as implicit GEMMs with M×N×K, memory-bound ops, attention, collectives
  of the layout), from which FLOPs and HBM bytes are summed;
- ``params``: the parameters this rank holds for the layer;
- ``saved_bytes``: the activation bytes it keeps for its backward (per micro-batch);
- ``output_bytes``: the bytes it hands to each consumer (what a pipeline sends across a stage
  boundary after it);
- ``splittable``: which dimensions of its iteration space may be split over devices (batch,
  channels, heads, reduction, spatial, sequence, experts), for per-layer parallelism;
- ``inputs``: the names of the layers it reads (empty for the graph's first layer, and for an
  embedding of a second input such as a translation model's target tokens).

Parameters, FLOPs and activation memory of a whole model are the sums over this description
(:meth:`LayerGraph.total_params`, :meth:`forward_flops`, :meth:`saved_bytes`); nothing else
describes a layer again. ``check`` refuses cycles, unknown inputs, duplicate names, unknown
kinds and shapes that do not chain, naming the layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from simulator.errors import ConfigError
from workloads.graph import Op

SplitDim = Literal["batch", "channels", "heads", "reduction", "spatial", "sequence", "experts"]
SPLIT_DIMS: frozenset[str] = frozenset(SplitDim.__args__)

#: Layer kinds a graph may hold. A builder or an importer that meets something else maps it
#: to one of these or refuses the model naming the layer.
LAYER_KINDS: frozenset[str] = frozenset({
    "embedding", "transformer_block", "lm_head", "loss",
    "conv2d", "conv_transpose2d", "linear", "batchnorm", "layernorm", "groupnorm",
    "relu", "activation", "maxpool", "avgpool", "adaptive_avgpool", "dropout",
    "add", "concat", "flatten", "upsample", "softmax",
    "lstm", "attention", "patch_embedding", "mlp_block", "other",
})


@dataclass(frozen=True)
class Layer:
    """One layer of the graph for one micro-batch on one rank (see the module docstring)."""

    name: str
    kind: str
    forward: tuple[Op, ...] = ()
    backward: tuple[Op, ...] = ()
    params: int = 0
    saved_bytes: float = 0.0
    output_bytes: float = 0.0
    inputs: tuple[str, ...] = ()
    splittable: frozenset[str] = frozenset({"batch"})
    input_shape: tuple[int, ...] | None = None   # per sample, e.g. (C, H, W) or (tokens, hidden)
    output_shape: tuple[int, ...] | None = None

    @property
    def forward_flops(self) -> float:
        return sum(op.flops for op in self.forward)

    @property
    def backward_flops(self) -> float:
        return sum(op.flops for op in self.backward)


@dataclass(frozen=True)
class LayerGraph:
    """A network as layers in topological order, built for ``micro_batch`` samples on one rank.

    ``sample``: what one sample is ("sequence" for language models, "image", "sentence"...);
    ``seq_length``: tokens per sample where the model has a sequence (None otherwise)."""

    name: str
    layers: tuple[Layer, ...]
    micro_batch: int
    sample: str = "sequence"
    seq_length: int | None = None
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update({layer.name: i for i, layer in enumerate(self.layers)})

    def layer(self, name: str) -> Layer:
        return self.layers[self._index[name]]

    def predecessors(self, layer: Layer) -> tuple[Layer, ...]:
        return tuple(self.layers[self._index[n]] for n in layer.inputs)

    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    def forward_flops(self) -> float:
        return sum(layer.forward_flops for layer in self.layers)

    def backward_flops(self) -> float:
        return sum(layer.backward_flops for layer in self.layers)

    def saved_bytes(self) -> float:
        return sum(layer.saved_bytes for layer in self.layers)

    def is_chain(self) -> bool:
        return all(layer.inputs == ((self.layers[i - 1].name,) if i else ()) for i, layer in enumerate(self.layers))

    def check(self) -> LayerGraph:
        """Refuse a graph that cannot run; one error naming the layer. Returns the graph."""
        seen: set[str] = set()
        if not self.layers:
            raise ConfigError("model", f"{self.name}: the graph has no layers")
        for i, layer in enumerate(self.layers):
            where = f"model.layers.{layer.name}"
            if layer.name in seen:
                raise ConfigError(where, "a second layer has this name")
            if layer.kind not in LAYER_KINDS:
                raise ConfigError(where, f"unknown layer kind {layer.kind!r} (known: {', '.join(sorted(LAYER_KINDS))})")
            bad_split = set(layer.splittable) - SPLIT_DIMS
            if bad_split:
                raise ConfigError(where, f"unknown splittable dimension(s) {sorted(bad_split)}")
            if i and not layer.inputs and layer.kind != "embedding":
                raise ConfigError(where, "has no inputs (only the first layer and embeddings of a second input, "
                                         "such as a decoder's target tokens, may)")
            for name in layer.inputs:
                if name == layer.name:
                    raise ConfigError(where, "reads its own output (a cycle)")
                if name not in self._index:
                    raise ConfigError(where, f"reads {name!r}, which is not a layer of the graph")
                if name not in seen:
                    raise ConfigError(where, f"reads {name!r}, which comes after it (a cycle, or not in "
                                             "topological order)")
            if len(layer.inputs) == 1 and layer.input_shape is not None:
                source = self.layer(layer.inputs[0])
                if source.output_shape is not None and source.output_shape != layer.input_shape:
                    raise ConfigError(where, f"expects input {list(layer.input_shape)} but {source.name} gives "
                                             f"{list(source.output_shape)}")
            for number, label in ((layer.params, "params"), (layer.saved_bytes, "saved_bytes"),
                                  (layer.output_bytes, "output_bytes")):
                if not number >= 0:
                    raise ConfigError(f"{where}.{label}", f"must be a non-negative number, got {number!r}")
            seen.add(layer.name)
        return self
