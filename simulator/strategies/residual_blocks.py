"""A layer graph read as residual blocks: what subnetwork masks drop and what layer-parallel
training treats as its time steps.

The layer graph (workloads/layer_graph.py) describes kernels layer by layer (a ResNet's
convolution, batch norm and ReLU are separate layers, a GNMT layer's dropout, LSTM and add);
both kinds that need *blocks* find them here, from the graph's structure:

- a *residual step* is an ``add`` layer whose inputs share an ancestor: the skip and the chain
  fork at the latest layer both inputs descend from (the skip itself for an identity shortcut, the
  block's input for a downsampling shortcut), and the layers after that fork up to the add are
  the step ``x + F(x)`` (He et al. 2016 Eq. 1). An add of two unrelated sources (an embedding
  plus positions) is not one;
- steps whose adds carry one name key (the name up to and including its last number:
  ``encoder.layers.7.add_2`` -> ``encoder.layers.7``, ``features.4.1.add`` -> ``features.4.1``)
  and follow each other make one *block* (a transformer layer: the attention step and the MLP
  step); so do, whatever their names, a step holding an ``attention`` layer and the steps that
  directly follow it up to the first without one (a traced torchvision ViT layer, whose adds are
  fx's ``add_1``, ``add_2``: its attention step and its MLP step, one block as in the catalog
  and as ``torch.utils.checkpoint`` around each ``EncoderBlock``); steps that overlap (a long
  skip around others) merge; a block also takes the layers after its last add, up to the next
  step, that carry its key (a ResNet's ReLU after the add, BERT's post-norm) or that are
  single-input pointwise layers (``relu``, ``activation``, ``dropout``) reading the block's
  output (a traced torchvision Bottleneck's ``out += identity; out = self.relu(out)`` is
  ``add`` then ``layer1_0_relu_2``: no block key in either name; the wiring and the kind place
  the ReLU). So a traced network gets its catalog twin's blocks (tests/test_recompute_units.py);
- a whole ``transformer_block`` / ``mlp_block`` layer is a block by itself (the transformer
  builder's x + f(x) blocks);
- a residual block is an *identity* block when its output has its input's shape (no
  downsampling): it can be skipped (x -> x) and its state has one width through it;
- every other layer is grouped into non-residual blocks by its name up to its first number
  (``features.3.0.expand.conv`` -> ``features.3``).

The graph's chain is then ``opening`` (every layer before the first residual block: a stem, an
embedding), ``blocks`` (from the first residual block to the last; a run of non-residual layers
between two of them, such as GNMT's decoder bottom between its encoder's and decoder's residual
LSTMs, is one non-residual block) and ``closing`` (a head, a loss).

The names only join steps (and their trailing layers) into blocks: which layers are residual is
read from the wiring. On the catalog this gives the blocks the name grouping gave before
(ResNet/ResNeXt bottlenecks, ViT and BERT layers, transformer blocks; tests/test_residual_blocks.py)
and finds GNMT-16's 12 residual LSTM layers (Wu et al. 2016 Sec. 3.1: residual connections from
the third layer up), whose names carry no number. VGG-16, Inception-v3 and U-Net have no residual
step (U-Net's skips are concatenations across scales, Inception's branches are concatenated):
the kinds that need residual blocks refuse them and say why.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.layer_graph import Layer, LayerGraph

#: Layer kinds that are a whole residual block by themselves (workloads/transformer_graph.py).
BLOCK_LAYER_KINDS = frozenset({"transformer_block", "mlp_block"})

#: Single-input pointwise layer kinds that end the residual block whose output they read (a ReLU or
#: a dropout after the add): they belong to the block, not to a unit of their own.
TRAILING_KINDS = frozenset({"relu", "activation", "dropout"})


@dataclass(frozen=True)
class Block:
    """Consecutive layers of one block (see the module docstring)."""

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


def step_key(name: str) -> str:
    """A residual step's block key: its name up to and including its last number
    (``features.4.1.add`` -> ``features.4.1``, ``encoder.layer.0.output.residual`` ->
    ``encoder.layer.0``); a name without one is its own key (``encoder.residual2``)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return ".".join(parts[:i + 1])
    return name


def residual_steps(graph: LayerGraph) -> list[tuple[int, int]]:
    """(first, add) layer indices of every residual step: the layers after the fork of an add's
    inputs up to the add (see the module docstring), in the order of the adds."""
    layers = graph.layers
    index = {layer.name: i for i, layer in enumerate(layers)}
    ancestors: list[int] = []  # bit j set: layer j is the layer itself or feeds it
    for i, layer in enumerate(layers):
        mask = 1 << i
        for name in layer.inputs:
            if name in index:
                mask |= ancestors[index[name]]
        ancestors.append(mask)
    steps = []
    for i, layer in enumerate(layers):
        inputs = [index[name] for name in layer.inputs if name in index]
        if layer.kind != "add" or len(inputs) < 2:
            continue
        common = ancestors[inputs[0]]
        for j in inputs[1:]:
            common &= ancestors[j]
        if common:
            steps.append((common.bit_length(), i))  # the fork is the latest common ancestor
    return steps


def _trails(layers: tuple[Layer, ...], last: int, key: str) -> bool:
    """Whether layer ``last + 1`` ends the block that ends at layer ``last``: it carries the block's
    key (a catalog ResNet's ``layer1.0.relu3``, BERT's post-norm), or it is a pointwise layer
    (:data:`TRAILING_KINDS`) whose one input is the block's output (torchvision's Bottleneck
    ``out += identity; out = self.relu(out)``, traced as ``add`` then ``layer1_0_relu_2``: the
    traced names carry no block key, the wiring does)."""
    following = layers[last + 1]
    if step_key(following.name) == key:
        return True
    return following.kind in TRAILING_KINDS and tuple(following.inputs) == (layers[last].name,)


def _holds_attention(layers: tuple[Layer, ...], first: int, add: int) -> bool:
    return any(layers[j].kind == "attention" for j in range(first, add))


def _spans(graph: LayerGraph) -> list[tuple[int, int, str]]:
    """[first, last] layer indices and name of every residual block found from the steps."""
    layers = graph.layers
    spans: list[list] = []
    for first, add in residual_steps(graph):
        key = step_key(layers[add].name)
        attention = _holds_attention(layers, first, add)
        while spans and first <= spans[-1][1]:  # overlaps an earlier block: one block
            first = min(first, spans[-1][0])
            key = spans[-1][2]
            spans.pop()
        if spans and (spans[-1][2] == key or spans[-1][3]) and _follows(layers, spans[-1], first):
            spans[-1][1] = add  # the next step of the same block (a transformer layer's MLP)
            spans[-1][3] = attention
        else:
            spans.append([first, add, key, attention])
    for n, span in enumerate(spans):  # the layers after the last add that end the block
        stop = spans[n + 1][0] if n + 1 < len(spans) else len(layers)
        while span[1] + 1 < stop and _trails(layers, span[1], span[2]):
            span[1] += 1
    return [(first, last, key) for first, last, key, _ in spans]


def _follows(layers: tuple[Layer, ...], span: list, first: int) -> bool:
    """Whether a step starting at layer ``first`` directly follows the block ``span``: every layer
    between them ends that block (:func:`_trails`)."""
    last = span[1]
    while last + 1 < first and _trails(layers, last, span[2]):
        last += 1
    return last + 1 == first


def _is_identity(layers: tuple[Layer, ...]) -> bool:
    first, last = layers[0], layers[-1]
    if len(layers) == 1 and first.kind in BLOCK_LAYER_KINDS:
        return True
    if first.input_shape is None or last.output_shape is None:
        return False
    return tuple(first.input_shape) == tuple(last.output_shape)


def _by_key(layers: list[Layer]) -> list[Block]:
    """Layers outside residual steps, grouped by name key (a block-kind layer is residual)."""
    groups: list[tuple[str, list[Layer]]] = []
    for layer in layers:
        key = block_key(layer.name)
        if groups and groups[-1][0] == key and layer.kind not in BLOCK_LAYER_KINDS \
                and groups[-1][1][-1].kind not in BLOCK_LAYER_KINDS:
            groups[-1][1].append(layer)
        else:
            groups.append((key, [layer]))
    blocks = []
    for key, members in groups:
        residual = len(members) == 1 and members[0].kind in BLOCK_LAYER_KINDS
        blocks.append(Block(key, tuple(members), residual, residual))
    return blocks


def blocks_of(graph: LayerGraph) -> list[Block]:
    """The graph's layers grouped into blocks, in order (residual ones from the wiring)."""
    layers = graph.layers
    blocks: list[Block] = []
    position = 0
    for first, last, key in _spans(graph):
        blocks.extend(_by_key(list(layers[position:first])))
        members = tuple(layers[first:last + 1])
        blocks.append(Block(key, members, True, _is_identity(members)))
        position = last + 1
    blocks.extend(_by_key(list(layers[position:])))
    return blocks


def residual_chain(graph: LayerGraph) -> tuple[tuple[Layer, ...], list[Block], tuple[Layer, ...]]:
    """(opening layers, blocks from the first residual one to the last, closing layers); no
    residual block: ((), [], every layer). Non-residual layers between two residual blocks are
    one non-residual block (named by its first layer's key)."""
    blocks = blocks_of(graph)
    residual = [i for i, b in enumerate(blocks) if b.residual]
    if not residual:
        return (), [], graph.layers
    first, last = residual[0], residual[-1]
    opening = tuple(layer for b in blocks[:first] for layer in b.layers)
    closing = tuple(layer for b in blocks[last + 1:] for layer in b.layers)
    chain: list[Block] = []
    for block in blocks[first:last + 1]:
        if not block.residual and chain and not chain[-1].residual:
            previous = chain.pop()
            block = Block(previous.name, previous.layers + block.layers, False, False)
        chain.append(block)
    return opening, chain, closing


def no_residual_reason(graph: LayerGraph) -> str:
    """Why a network without residual steps is refused (the kinds' error messages)."""
    return (f"{graph.name} has no residual blocks (no add of a skip to the chain that leaves the same "
            "layer, x + F(x))")
