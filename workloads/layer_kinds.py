"""Which of a transformer's layers are dense and which MoE, in order (structure, not counts).

A model's layers differ in their feed-forward block (``TransformerSpec.is_moe_layer``: MoE
every k-th layer, dense first layers) and, with a sliding window, in their attention
(``TransformerSpec.is_window_layer``: :func:`layer_kind_key`). The builder (workloads/transformer_graph.py) and the planner
(simulator/strategies/spmd/plan.py) price each kind once and walk the layers as runs of one kind.
"""

from __future__ import annotations

from workloads.schema import TransformerSpec


def is_moe_layer(model: TransformerSpec, layer_index: int) -> bool:
    """Whether layer ``layer_index`` (0-based) has a MoE feed-forward block
    (see :meth:`TransformerSpec.is_moe_layer`)."""
    return model.is_moe_layer(layer_index)


def layer_kinds(model: TransformerSpec) -> tuple[bool, ...]:
    """The kind of every layer, in order: True for a MoE layer, False for a dense one."""
    return tuple(model.is_moe_layer(i) for i in range(model.num_layers))


def layer_kind_key(model: TransformerSpec, layer_index: int):
    """What distinguishes layer ``layer_index``'s work from another's (the key the builder and the planner
    price a kind under): its MoE flag, and with a sliding window (``TransformerSpec.sliding_window_tokens``)
    the pair (MoE flag, windowed flag); a model without a window keeps the plain flag."""
    moe = model.is_moe_layer(layer_index)
    if model.sliding_window_tokens is None:
        return moe
    return (moe, model.is_window_layer(layer_index))


def layer_kind_keys(model: TransformerSpec) -> tuple:
    """:func:`layer_kind_key` of every layer, in order."""
    return tuple(layer_kind_key(model, i) for i in range(model.num_layers))


def layer_kind_runs(kinds: tuple, start: int, count: int) -> tuple[tuple[object, int], ...]:
    """Layers ``start .. start+count-1`` as runs of equal kind, in order: ((kind, n), ...).
    A dense-only (or every-layer MoE) chunk of n layers is ((kind, n),)."""
    runs: list[tuple[object, int]] = []
    for kind in kinds[start:start + count]:
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + 1)
        else:
            runs.append((kind, 1))
    return tuple(runs)


def layer_kind_counts(model: TransformerSpec) -> dict[bool, int]:
    """How many layers of each kind (False dense, True MoE); kinds absent are left out."""
    counts: dict[bool, int] = {}
    for kind in layer_kinds(model):
        counts[kind] = counts.get(kind, 0) + 1
    return counts
