"""Halo exchange of a spatially split sliding-window layer (domain parallelism).

A convolution or pooling window of kernel k, stride s and padding p whose output rows are cut
into Pr blocks needs, for output rows [a, b), input rows [a·s - p, (b-1)·s - p + k): beyond its own
input rows [a·s, b·s) that is ``p`` rows above and ``k - s - p`` rows below (for a 3×3, stride 1,
padding 1 convolution: one row each side, ⌊k/2⌋ as in Gholami et al. 2018, Sec. 3.3). Columns
likewise over Pc.

The exchange is DistDL's (Hewett & Grady 2020, Sec. 4.2): first along the rows of the Pr × Pc
grid (each device swaps its edge rows with its two row neighbours on the row sub-communicator),
then along the columns with slabs that already include the received rows, which fills the
corners without diagonal messages. An interior device (the busiest) receives

    rows phase:    (top + bottom) · W_b · C_b · N_b
    columns phase: (left + right) · (H_b + top + bottom) · C_b · N_b        (elements)

where H_b × W_b is its block of the input, C_b its input channels and N_b its samples; it sends
as much. A block on the edge of the grid has one neighbour along that axis (with Pr = 2 no block
is interior): the busiest block over first, interior and last positions is taken. The backward is the adjoint (halo accumulate): the gradients of those halo elements go
back to their owners and are added, the same bytes in the other direction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.strategies.per_layer.config import Split
from workloads.layer_graph import Layer


@dataclass(frozen=True)
class HaloPhase:
    """One phase of the exchange: ``axis`` ("rows" | "cols"), the bytes the busiest device
    receives (and sends), and the split field whose sub-communicator carries it."""

    axis: str
    bytes: float


def halo_widths(window: tuple[int, int, int, int, int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) rows/columns a block needs beyond its own (module docstring)."""
    kh, kw, sh, sw, ph, pw = window
    return ph, max(0, kh - sh - ph), pw, max(0, kw - sw - pw)


def halo_phases(layer: Layer, split: Split, batch: int, channels_cut: int, elem_bytes: float) -> tuple[HaloPhase, ...]:
    """The exchange phases of ``layer`` under ``split`` (none without a window or spatial cut).
    ``channels_cut``: how the layer's input channels are cut (its reduction cut for a convolution,
    its channel cut for a pooling layer)."""
    if layer.window is None or (split.rows == 1 and split.cols == 1) or not layer.input_shape:
        return ()
    c, h, w = layer.input_shape
    top, bottom, left, right = halo_widths(layer.window)
    hb, wb = math.ceil(h / split.rows), math.ceil(w / split.cols)
    per_row = math.ceil(c / channels_cut) * math.ceil(batch / split.batch) * elem_bytes
    best: tuple[float, float] = (0.0, 0.0)
    for i in _positions(split.rows):      # first, an interior and the last block of the grid
        for j in _positions(split.cols):
            rows = (top if i > 0 else 0) + (bottom if i < split.rows - 1 else 0)
            cols = (left if j > 0 else 0) + (right if j < split.cols - 1 else 0)
            phase_rows, phase_cols = rows * wb * per_row, cols * (hb + rows) * per_row
            if phase_rows + phase_cols > sum(best):
                best = (phase_rows, phase_cols)
    return tuple(HaloPhase(axis, b) for axis, b in zip(("rows", "cols"), best, strict=True) if b > 0)


def _positions(parts: int) -> tuple[int, ...]:
    """Block indices that stand for every kind of block along an axis of ``parts`` blocks: the
    first, one interior (when there is one) and the last."""
    return tuple(sorted({0, min(1, parts - 1), parts - 1}))
