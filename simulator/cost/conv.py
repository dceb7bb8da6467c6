"""Efficiency of one convolution pass by its shape (issue 19: cuDNN's per-shape behaviour).

A convolution op carries its pass and window (``Op.conv``: fwd | dgrad | wgrad, kh, kw, stride;
workloads/networks/builder.py) on top of the implicit GEMM's dimensions (Chetlur et al. 2014, Sec. 3):
forward M = N·H_out·W_out, N = C_out, K = C_in·kh·kw; data gradient M, N = C_in·kh·kw, K = C_out;
weight gradient M = C_in·kh·kw, N = C_out, K = N·H_out·W_out (per group). The spec's
:class:`~hardware_specs.schema.ConvEfficiency` reads a pass by the channels its output tile spans and
its reduction length; this module maps the op's dimensions onto them.
"""

from __future__ import annotations

from hardware_specs.schema import ConvEfficiency
from workloads.graph import Op


def conv_channels_reduction(op: Op) -> tuple[float, float]:
    """(output channels, reduction length) of a convolution pass as the efficiency reads them:
    forward (C_out, C_in·kh·kw); data gradient (C_in, C_out·kh·kw), the input-channel tile that
    gathers over the output channels and the window; weight gradient (C_in·kh·kw, N·H_out·W_out)."""
    pass_, kh, kw, _ = op.conv
    window = kh * kw
    if pass_ == "dgrad":
        return op.n / window, op.k * window
    if pass_ == "wgrad":
        return op.m, op.k
    return op.n, op.k


def conv_efficiency(model: ConvEfficiency, op: Op) -> float:
    """The pass's efficiency (achieved / the precision's peak)."""
    channels, reduction = conv_channels_reduction(op)
    _, kh, kw, stride = op.conv
    return model.efficiency(channels, reduction, kh, kw, stride)
