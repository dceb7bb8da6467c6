"""A layer graph read as residual blocks: what subnetwork masks drop and what layer-parallel
training treats as its time steps.

The layer graph (workloads/layer_graph.py) describes kernels layer by layer (a ResNet's
convolution, batch norm and ReLU are separate layers); both kinds that need *blocks* read them
here, from the layer names the builders give:

- a layer's block key is its name up to and including the first dotted component that is a
  number (``layer3.4.conv2`` -> ``layer3.4``, ``encoder.layers.7.mlp`` -> ``encoder.layers.7``);
  a name without one is its own key (``conv1``, ``block12``, ``embedding``);
- consecutive layers with one key form a :class:`Block`; a block is *residual* when it adds a
  shortcut to its output (an ``add`` layer among two or more layers) or is a whole
  ``transformer_block`` / ``mlp_block`` layer (the transformer builder's x + f(x) blocks);
- a residual block is an *identity* block when its output has its input's shape (no
  downsampling): it can be skipped (x -> x) and its state has one width through it.

The graph's chain is then ``opening`` (every layer before the first residual block: a stem, an
embedding), ``blocks`` (from the first residual block to the last, including any non-residual
block between them) and ``closing`` (a head, a loss).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.layer_graph import Layer, LayerGraph

#: Layer kinds that are a whole residual block by themselves (workloads/transformer_graph.py).
BLOCK_LAYER_KINDS = frozenset({"transformer_block", "mlp_block"})


@dataclass(frozen=True)
class Block:
    """Consecutive layers of one block key (see the module docstring)."""

    name: str
    layers: tuple[Layer, ...]
    residual: bool
    identity: bool

    @property
    def params(self) -> float:
        return sum(layer.params for layer in self.layers)

    @property
    def output_bytes(self) -> float:
        """Bytes of the block's output state (what a neighbour receives)."""
        return self.layers[-1].output_bytes


def block_key(name: str) -> str:
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return name


def _is_residual(layers: tuple[Layer, ...]) -> bool:
    if len(layers) == 1:
        return layers[0].kind in BLOCK_LAYER_KINDS
    return any(layer.kind == "add" and len(layer.inputs) >= 2 for layer in layers)


def _is_identity(layers: tuple[Layer, ...]) -> bool:
    first, last = layers[0], layers[-1]
    if len(layers) == 1 and first.kind in BLOCK_LAYER_KINDS:
        return True
    if first.input_shape is None or last.output_shape is None:
        return False
    return tuple(first.input_shape) == tuple(last.output_shape)


def blocks_of(graph: LayerGraph) -> list[Block]:
    """The graph's layers grouped into blocks, in order."""
    groups: list[tuple[str, list[Layer]]] = []
    for layer in graph.layers:
        key = block_key(layer.name)
        if groups and groups[-1][0] == key:
            groups[-1][1].append(layer)
        else:
            groups.append((key, [layer]))
    blocks = []
    for key, layers in groups:
        members = tuple(layers)
        residual = _is_residual(members)
        blocks.append(Block(key, members, residual, residual and _is_identity(members)))
    return blocks


def residual_chain(graph: LayerGraph) -> tuple[tuple[Layer, ...], list[Block], tuple[Layer, ...]]:
    """(opening layers, blocks from the first residual one to the last, closing layers); no
    residual block: ((), [], every layer)."""
    blocks = blocks_of(graph)
    residual = [i for i, b in enumerate(blocks) if b.residual]
    if not residual:
        return (), [], graph.layers
    first, last = residual[0], residual[-1]
    opening = tuple(layer for b in blocks[:first] for layer in b.layers)
    closing = tuple(layer for b in blocks[last + 1:] for layer in b.layers)
    return opening, blocks[first:last + 1], closing
