"""Efficiency of one convolution pass by its shape (issue 19: cuDNN's per-shape behaviour).

A convolution op carries its pass and window (``Op.conv``: fwd | dgrad | wgrad, kh, kw, stride;
workloads/networks/builder.py) on top of the implicit GEMM's dimensions (Chetlur et al. 2014, Sec. 3):
forward M = N·H_out·W_out, N = C_out, K = C_in·kh·kw; data gradient M, N = C_in·kh·kw, K = C_out;
weight gradient M = C_in·kh·kw, N = C_out, K = N·H_out·W_out (per group). The spec's
:class:`~hardware_specs.schema.ConvEfficiency` reads a pass by the channels its output tile spans and
its reduction length; this module maps the op's dimensions onto them.

Grouped and depthwise convolutions (ResNeXt's cardinality, EfficientNet's MBConv) are not one dense
implicit GEMM: the op carries ``groups`` (``Op.batch``) GEMMs of the per-group shape (N = C_out/groups,
K = C_in/groups·kh·kw). cuDNN runs them either as a grouped implicit GEMM on the tensor cores (each
group's tile spans only its own C_out/groups channels: the shape efficiency above at the per-group
shape) or, for few channels per group (depthwise: one), as a direct convolution on the CUDA cores,
which is memory-bound (Sandler et al. 2018, Sec. 5.1 / Table 3 count depthwise MACs as negligible,
their cost is the feature-map traffic). :func:`grouped_conv_time_s` takes the faster of the two, as
cuDNN's algorithm search (``cudnn.benchmark``, on in DLE's ConvNets) would; a depthwise pass (one
input channel per group) always runs the direct kernel. The direct kernel reaches the fp32 CUDA-core
peak (*assumed*) and the spec's ``direct_conv`` bandwidth (fitted on DLE's EfficientNet fit rows by
validation/calibrate_direct_conv.py; no depthwise microbenchmark is in this project), or the
elementwise kernels' ``memory_bound_efficiency`` where the spec has none.
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


def is_grouped(op: Op) -> bool:
    """A convolution pass of more than one group (grouped or depthwise)."""
    return op.conv is not None and op.kind == "gemm" and op.batch > 1


def input_channels_per_group(op: Op) -> float:
    """C_in / groups of a convolution pass, read from its GEMM dimensions (module docstring: forward
    K = C_in/groups·kh·kw; data gradient N = C_in/groups·kh·kw; weight gradient M = C_in/groups·kh·kw)."""
    pass_, kh, kw, _ = op.conv
    per_group = op.n if pass_ == "dgrad" else op.m if pass_ == "wgrad" else op.k
    return per_group / (kh * kw)


def is_depthwise(op: Op) -> bool:
    """A grouped pass with one input channel per group (MobileNet's and EfficientNet's depthwise
    convolutions). cuDNN has no tensor-core implicit GEMM worth the name for it (an output tile of
    one channel per group): it runs the direct kernel, whatever the tile model would say."""
    return is_grouped(op) and input_channels_per_group(op) == 1


def direct_conv_time_s(op: Op, cuda_core_flops_per_s: float, memory_bytes_per_s: float, launch_s: float) -> float:
    """A grouped convolution pass as a direct (non-GEMM) kernel on the CUDA cores: the slower of its
    FLOPs at the CUDA-core peak and its tensor traffic (``op.bytes_moved``: x, w and y once, as an
    implicit GEMM reads them) at the memory-bound bandwidth."""
    return max(op.flops / cuda_core_flops_per_s, op.bytes_moved / memory_bytes_per_s) + launch_s


def grouped_conv_time_s(op: Op, tensor_core_s: float, cuda_core_flops_per_s: float, memory_bytes_per_s: float,
                        launch_s: float, on_cuda_cores: bool = False) -> float:
    """The faster of the grouped implicit GEMM (``tensor_core_s``, priced at the per-group shape) and
    the direct CUDA-core kernel (see the module docstring); a depthwise pass always runs the direct
    kernel (:func:`is_depthwise`). ``on_cuda_cores`` (fp32 without TF32: no tensor cores): the grouped
    GEMM is a loop of small per-group GEMMs that moves the tensors no faster than the direct kernel,
    so the pass takes at least its traffic at the direct kernel's bandwidth. PipeDream's fp32
    per-layer profiles of ResNeXt-50/101 32x4d show it (validation/data/pipedream_resnext_convs.csv,
    tests/test_cnn_sets.py): their grouped 3x3 layers take 2.3-4.7x the per-group GEMM price where
    the same profiles' dense convolutions take 1.2-1.6x; with the traffic floor, 1.1-1.5x."""
    direct_s = direct_conv_time_s(op, cuda_core_flops_per_s, memory_bytes_per_s, launch_s)
    if is_depthwise(op):
        return direct_s
    if on_cuda_cores:
        return max(min(tensor_core_s, direct_s), op.bytes_moved / memory_bytes_per_s + launch_s)
    return min(tensor_core_s, direct_s)
