"""The components of a layer graph and the parallelism choices each can take, for the adaptive
per-component planner (:mod:`.adaptive`).

**Components.** A component is a run of consecutive layers (graph order) that do one job:

- ``embedding``: embedding and patch-embedding layers (token, position, type tables) and what
  follows them up to the first block;
- ``attention``: one attention layer and its dropout, residual add and norm;
- ``mlp``: the linear layers between two attention layers (a transformer's feed-forward block)
  and their activation, dropout, residual add and norm;
- ``conv@HxW``: the convolutions producing one spatial resolution (a CNN's stage), with their
  norms, activations and the pooling that ends the stage;
- ``recurrent``: LSTM layers;
- ``head``: the linear layers, softmax and loss after the last attention, convolution or LSTM
  (a classifier, an LM head, BERT's pre-training heads) -- except those whose name puts them in
  the last attention's block (``encoder.layer.23.intermediate.dense``: the last MLP).

A layer of another kind (norm, activation, dropout, add, pool, flatten...) joins the component
before it (the layers before the first such anchor join the first component). Rules on layer
kinds and output shapes only, so they hold for every graph the builders and importers make.

**Choices.** Each component takes one :class:`Choice`, turned into a split of each of its layers
(:func:`component_splits`; the per_layer kind's splits, simulator/strategies/per_layer/):

- ``data g``: every layer batch-split over the first g GPUs (g = all: data parallelism; g fewer:
  a burst, DeepPool's per-layer GPU count applied to the component);
- ``tensor d×t``: every channel-mixing layer (linear, convolution, embedding) split by output
  channels over t GPUs (an attention layer: by heads), the per-channel layers after it by
  channels, the rest by batch; batch-split d ways on top;
- ``megatron d×t``: as ``tensor``, but a mixing layer that follows a column-split one takes its
  input channels (the reduction) over t GPUs: Megatron-LM's column-then-row pairing (Shoeybi et
  al. 2019, Sec. 3), whose partial sums are reduced once after the pair;
- ``spatial d×r×c``: a convolution stage's layers split over an r×c grid of their feature map
  (domain parallelism, Gholami et al. 2018 Sec. 3.3) and the batch d ways;
- ``per_layer``: each layer of the component its own split, PaSE's exact dynamic program
  (:mod:`.pase_dp`) over the component alone (its layers' configurations over all GPUs).

A cut a layer cannot make (a layer norm has no channel cut, a flatten no grid) folds into its
batch cut on the same GPUs; a choice that leaves a component exactly as ``data`` does (a
``spatial`` choice on an attention block) is not offered for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import ConfigError
from simulator.strategies.per_layer.config import Split
from simulator.strategies.per_layer.sharding import CHANNEL_MIXING, check_split

#: Layer kinds that anchor a component; every other kind joins the component before it.
_BODY_KINDS = frozenset({"attention", "conv2d", "conv_transpose2d", "lstm"})
_EMBEDDING_KINDS = frozenset({"embedding", "patch_embedding"})
_DENSE_KINDS = frozenset({"linear", "lm_head", "mlp_block", "transformer_block"})
_HEAD_ONLY_KINDS = frozenset({"loss", "softmax"})
#: Choice names, in the order the planner lists them.
CHOICE_NAMES: tuple[str, ...] = ("data", "tensor", "megatron", "spatial", "per_layer")


@dataclass(frozen=True)
class Component:
    """A run of layers: ``name`` (``family.ordinal``), ``family`` (embedding, attention, mlp,
    conv@HxW, recurrent, head, block) and the graph indices ``first``..``last`` (inclusive)."""

    name: str
    family: str
    first: int
    last: int

    @property
    def indices(self) -> range:
        return range(self.first, self.last + 1)


def block_prefix(name: str) -> str | None:
    """The name up to its last all-digit part (``encoder.layer.23`` of
    ``encoder.layer.23.attention``): the block a layer belongs to, where names say it."""
    parts = name.split(".")
    last = max((i for i, part in enumerate(parts) if part.isdigit()), default=None)
    return None if last is None else ".".join(parts[:last + 1]) + "."


def _anchor(layer, index: int, last_body: int, last_block: str | None) -> str | None:
    kind = layer.kind
    if kind in _EMBEDDING_KINDS:
        return "embedding"
    if kind == "attention":
        return "attention"
    if kind in ("conv2d", "conv_transpose2d"):
        shape = layer.output_shape or ()
        return f"conv@{shape[1]}x{shape[2]}" if len(shape) == 3 else "conv"
    if kind == "lstm":
        return "recurrent"
    if kind in _DENSE_KINDS:
        if layer.output_shape is None and kind == "transformer_block":
            return "block"
        in_last_block = last_block is not None and layer.name.startswith(last_block)
        return "head" if index > last_body and not in_last_block else "mlp"
    if kind in _HEAD_ONLY_KINDS and index > last_body:
        return "head"
    return None


def find_components(graph) -> list[Component]:
    """The graph's components in order (see the module docstring)."""
    layers = graph.layers
    last_body = max((i for i, layer in enumerate(layers) if layer.kind in _BODY_KINDS), default=-1)
    # the last attention's block (by name) still holds its MLP: dense layers there are not the head
    last_block = (block_prefix(layers[last_body].name)
                  if last_body >= 0 and layers[last_body].kind == "attention" else None)
    runs: list[list] = []  # [family, first, last]
    for i, layer in enumerate(layers):
        family = _anchor(layer, i, last_body, last_block)
        current = runs[-1][0] if runs else None
        starts_new = family is not None and (family != current or family in ("attention", "block"))
        if runs and current is None and family is not None:  # leading layers join the first anchor
            runs[-1][0] = family
            starts_new = False
        if not runs or starts_new:
            runs.append([family, i, i])
        else:
            runs[-1][2] = i
    ordinal: dict[str, int] = {}
    out = []
    for family, first, last in runs:
        family = family or "other"
        n = ordinal.get(family, 0)
        ordinal[family] = n + 1
        out.append(Component(f"{family}.{n}", family, first, last))
    return out


@dataclass(frozen=True)
class Choice:
    """One way to parallelise a component: ``name`` (data, tensor, megatron, spatial, per_layer)
    and its degrees: ``data`` (batch cut), ``model`` (tensor/megatron cut), ``rows`` × ``cols``
    (spatial grid)."""

    name: str
    data: int = 1
    model: int = 1
    rows: int = 1
    cols: int = 1

    def label(self) -> str:
        if self.name == "data":
            return f"data {self.data}"
        if self.name in ("tensor", "megatron"):
            return f"{self.name} {self.data}x{self.model}"
        if self.name == "spatial":
            return f"spatial {self.data}x{self.rows}x{self.cols}"
        return "per_layer"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choices_for(num_gpus: int, names: tuple[str, ...]) -> list[Choice]:
    """Every choice of the named kinds on ``num_gpus`` GPUs (bursts: every divisor below it)."""
    out: list[Choice] = []
    for name in names:
        if name == "data":
            out += [Choice("data", data=g) for g in reversed(_divisors(num_gpus))]
        elif name in ("tensor", "megatron"):
            out += [Choice(name, data=num_gpus // t, model=t) for t in _divisors(num_gpus) if t > 1]
        elif name == "spatial":
            out += [Choice("spatial", data=num_gpus // (r * c), rows=r, cols=c)
                    for r in _divisors(num_gpus) for c in _divisors(num_gpus // r) if r * c > 1]
        elif name == "per_layer":
            out.append(Choice("per_layer"))
    return out


def _fits(layer, split: Split, batch: int, num_gpus: int) -> Split | None:
    try:
        return check_split(layer, split, batch, num_gpus, "refuse", "config")
    except ConfigError:
        return None


def _first_that_fits(layer, options: list[Split], batch: int, num_gpus: int) -> Split | None:
    for split in options:
        found = _fits(layer, split, batch, num_gpus)
        if found is not None:
            return found
    return None


def component_splits(graph, component: Component, choice: Choice, batch: int,
                     num_gpus: int) -> tuple[Split, ...] | None:
    """The split of each layer of ``component`` under ``choice`` (not ``per_layer``: the planner
    solves that one), or None when the component cannot take it or it adds nothing over ``data``
    (see the module docstring)."""
    layers = [graph.layers[i] for i in component.indices]
    devices = choice.data * choice.model * choice.rows * choice.cols
    flat = Split(batch=devices)
    splits: list[Split] = []
    cut_any = False
    state = "none"  # the last mixing layer's cut in a tensor/megatron choice: column, row, none
    for layer in layers:
        d, t = choice.data, choice.model
        if choice.name == "data":
            wanted = [flat]
        elif choice.name == "spatial":
            wanted = [Split(batch=d, rows=choice.rows, cols=choice.cols), flat]
        elif layer.kind == "attention":
            wanted = [Split(batch=d, heads=t), flat]
            state = "none"  # its output projection is row-parallel: partial sums, reduced after
        elif layer.kind in CHANNEL_MIXING and layer.kind not in _HEAD_ONLY_KINDS:
            if choice.name == "megatron" and state == "column":
                wanted, state = [Split(batch=d, reduction=t), flat], "row"
            else:
                wanted, state = [Split(batch=d, channels=t), flat], "column"
        elif state == "column":
            wanted = [Split(batch=d, channels=t), flat]
        else:
            wanted = [flat]
        split = _first_that_fits(layer, wanted, batch, num_gpus)
        if split is None:
            return None
        if split == flat:
            state = "none"  # no model cut here: the next mixing layer starts a new column
        cut_any = cut_any or (split != flat and choice.name != "data")
        splits.append(split)
    if choice.name != "data" and not cut_any:
        return None
    return tuple(splits)
