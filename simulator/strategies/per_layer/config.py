"""The ``per_layer`` strategy's configuration: one split of each layer's iteration space.

A :class:`Split` says over how many devices each dimension of one layer's iteration space is
cut: ``batch`` (samples), ``sequence`` (tokens), ``rows`` × ``cols`` (the spatial process grid
Pr × Pc of Gholami et al. 2018 and DistDL), ``channels`` (output channels / output features),
``heads`` (attention heads) and ``reduction`` (input channels / the GEMM's K). The layer runs on
``devices`` = the product of the cuts: the first ``devices`` GPUs of the cluster. A layer on
fewer GPUs than its neighbours is DeepPool's *burst* parallelism (Park et al. MLSys 2022): the
global batch (``parallelism.global_batch_size``) stays fixed and the activations are scattered
or gathered between the two device sets.

The strategy block::

    strategy:
      kind: per_layer
      default: {batch: 8}               # every layer no rule names
      uneven: refuse                    # or round_up
      layers:                           # rules, later ones win
        - match: "fc*"                  # fnmatch pattern on layer names, or
          split: {channels: 8}
        - range: [0, 12]                # first and last layer index (inclusive)
          devices: 4                    # shorthand for split {batch: 4}

A rule's dimension that its layer cannot split (``Layer.splittable``) is an error naming the rule;
the ``default``'s is folded into ``batch`` for that layer (a fully connected layer under a
spatial default runs batch-split on the same devices, the integrated layout of Gholami et al.
Sec. 3.4). ``uneven``: ``refuse`` (a cut that does not divide its dimension is an error) or
``round_up`` (the first device takes ceil(size / cut) of it and sets the pace; the layer's FLOPs
summed over the devices then exceed the unsplit layer's).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.errors import no_bool_numbers

#: The cuts, outermost first: a layer's devices are numbered mixed-radix in this order, so the
#: reduction and channel groups are neighbouring ranks (inside a node, as Megatron puts TP).
SPLIT_FIELDS: tuple[str, ...] = ("batch", "sequence", "rows", "cols", "channels", "heads", "reduction")
#: The layer-graph dimension (``Layer.splittable``) each cut needs.
SPLITTABLE_OF: dict[str, str] = {"batch": "batch", "sequence": "sequence", "rows": "spatial", "cols": "spatial",
                                 "channels": "channels", "heads": "heads", "reduction": "reduction"}
#: Cuts over which a layer's weights are replicated (their gradients are all-reduced over them).
REPLICA_FIELDS: tuple[str, ...] = ("batch", "sequence", "rows", "cols")
#: Cuts that shard a layer's weights.
MODEL_FIELDS: tuple[str, ...] = ("channels", "heads", "reduction")


class Split(BaseModel):
    """How one layer's iteration space is cut (each field: devices along that dimension)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)  # `range: [true, 3]` is not [1, 3]

    batch: int = Field(default=1, ge=1, description="samples of the global batch")
    sequence: int = Field(default=1, ge=1, description="tokens of each sample")
    rows: int = Field(default=1, ge=1, description="output rows (Pr of the spatial grid)")
    cols: int = Field(default=1, ge=1, description="output columns (Pc of the spatial grid)")
    channels: int = Field(default=1, ge=1, description="output channels / features")
    heads: int = Field(default=1, ge=1, description="attention heads")
    reduction: int = Field(default=1, ge=1, description="input channels (the GEMM's K): partial sums")

    @property
    def devices(self) -> int:
        return math.prod(getattr(self, f) for f in SPLIT_FIELDS)

    def cuts(self) -> dict[str, int]:
        """The cuts above 1."""
        return {f: getattr(self, f) for f in SPLIT_FIELDS if getattr(self, f) > 1}

    def label(self) -> str:
        return "x".join(f"{f}{n}" for f, n in self.cuts().items()) or "single"


def as_split(value: Split | dict | None) -> Split:
    """A :class:`Split` from itself, a mapping such as ``{"batch": 4}``, or None (one device)."""
    if isinstance(value, Split):
        return value
    return Split.model_validate(value or {})


class LayerRule(BaseModel):
    """Layers chosen by ``match`` (fnmatch on names) or ``range`` (first, last index, inclusive)
    and the split they get (``split``; or ``devices``, shorthand for ``{batch: devices}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)  # `range: [true, 3]` is not [1, 3]

    match: str | None = Field(default=None, description="fnmatch pattern on layer names")
    range: tuple[int, int] | None = Field(default=None, description="first and last layer index, inclusive")
    split: Split | None = None
    devices: int | None = Field(default=None, ge=1, description="GPUs of the layer (burst); with split: its product")

    @model_validator(mode="after")
    def _one_selector(self) -> LayerRule:
        if (self.match is None) == (self.range is None):
            raise ValueError("give exactly one of match or range")
        if self.range is not None and not 0 <= self.range[0] <= self.range[1]:
            raise ValueError(f"range must be [first, last] with 0 <= first <= last, got {list(self.range)}")
        if self.split is None and self.devices is None:
            raise ValueError("give split or devices")
        if self.split is not None and self.devices is not None and self.split.devices != self.devices:
            raise ValueError(f"devices {self.devices} differs from the split's product {self.split.devices}")
        return self

    @property
    def resolved(self) -> Split:
        return self.split if self.split is not None else Split(batch=self.devices)


class PerLayerConfig(BaseModel):
    """``strategy: {kind: per_layer, default: {...}, layers: [...], uneven: refuse}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["per_layer"] = "per_layer"
    default: Split = Field(default_factory=Split, description="the split of every layer no rule names")
    layers: tuple[LayerRule, ...] = Field(default=(), description="rules; a later matching rule wins")
    uneven: Literal["refuse", "round_up"] = Field(
        default="refuse", description="a cut that does not divide its dimension: refuse, or round_up (the first "
                                      "device takes the ceiling and sets the pace)")
    overlap_gradient_reduction: bool | None = Field(
        default=None, description="weight-gradient all-reduces run beside the rest of the backward (DDP); "
                                  "false: one all-reduce per replica group after the backward (a flat buffer); unset: "
                                  "parallelism.overlap_grad_reduce (true unless the framework profile says otherwise)")


def strategy_block(splits: list[Split], uneven: str = "refuse") -> dict:
    """The ``strategy:`` block (a plain mapping, ready for YAML) that gives layer i ``splits[i]``:
    the most common split as the default and one ``range`` rule per run of consecutive layers
    that differ from it. What a planner writes out so that the user can simulate its plan.
    (The default's cuts that a layer cannot make fold into batch: give such layers their own
    rule, which this does whenever their split differs from the default.)"""
    if not splits:
        raise ValueError("no layers")
    counts: dict[Split, int] = {}
    for split in splits:
        counts[split] = counts.get(split, 0) + 1
    default = max(counts, key=lambda s: (counts[s], -splits.index(s)))
    rules, start = [], None
    for i, split in enumerate([*splits, None]):
        if start is not None and (split is None or split != splits[start]):
            rules.append({"range": [start, i - 1], "split": splits[start].cuts() or {"batch": 1}})
            start = None
        if split is not None and split != default and start is None:
            start = i
    return {"kind": "per_layer", "uneven": uneven, "default": default.cuts() or {"batch": 1}, "layers": rules}
