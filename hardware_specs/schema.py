"""Pydantic schemas of hardware: accelerators, nodes, fabrics, and the cluster built from them.

Specs are pure values (frozen, ``extra="forbid"``): building one reads no clock and writes
no file. Every number carries its unit in its field name; every catalog entry has a
``source``; every efficiency constant says where it came from (``source``) and, when it
was fitted, on which data (``fitted_on``).

Units used throughout:
- ``*_tflops``: 10^12 floating-point operations per second (dense, non-sparse);
- ``*_gib``: 2^30 bytes; ``*_gb_per_s``: 10^9 bytes per second;
- ``*_gbit_per_s``: 10^9 bits per second (NIC line rates are quoted so);
- ``*_us``: microseconds; ``*_watts``: watts.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeFloat,
    PositiveInt,
    Tag,
    field_validator,
    model_validator,
)

from simulator.errors import no_bool_numbers

Precision = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]
# GEMM curves are kept per precision and, for FP8/FP4, per scaling recipe's kernel: fp8 (per-tensor
# scaled, torch._scaled_mm / cuBLASLt), fp8_block (1x128 / 128x128 block-scaled, DeepGEMM),
# mxfp8 (32-element blocks, Blackwell), nvfp4 (16-element blocks, Blackwell), fp8_rowwise (one scale per row,
# torchao's rowwise recipe: no curve of its own is measured, it runs on fp8's; a grouped_gemm entry may name it).
CurveKey = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "fp8_block", "fp8_rowwise", "mxfp8", "nvfp4"]


_LATENCY = ("the slowest links trained over are peers on the internet (SWARM's 20 ms) and one-way delays across the "
            "globe (~250 ms)")
_NODES = "the largest clusters trained on hold ~100,000 GPUs (~12,500 nodes of 8)"

#: Upper bounds on the figures of links, NICs and fabrics, by field name (the same name means the same unit in every
#: spec below), each 20-1000x past any hardware sold or measured (the catalog's largest figure is in each reason), so
#: none refuses a real part; they catch a typo (extra zeros) that would make the simulated times astronomical and the
#: step's figures nonsense: a latency of 10**30 us ran and printed them with exit 0 (or, on a swarm, was refused as
#: strategy.preemptions_per_hour, another field). Matrices (a wide-area fabric's) are bounded entry by entry.
#: Bandwidths have floors (:data:`LINK_FLOORS`) and no ceiling: a huge one is an ideal link whose transfers cost
#: nothing, finite figures throughout (the hand-timed tests price communication at zero so, with 1e12 GB/s).
LINK_LIMITS: dict[str, tuple[float, str]] = {
    "latency_us": (10_000_000.0, _LATENCY),
    "latency_per_step_us": (10_000_000.0, _LATENCY),
    "low_latency_per_step_us": (10_000_000.0, _LATENCY),
    "nic_latency_us": (10_000_000.0, _LATENCY),
    "nic_low_latency_us": (10_000_000.0, _LATENCY),
    "switch_latency_us": (10_000_000.0, _LATENCY),
    "delay_ms": (10_000.0, _LATENCY),
    "nics_per_node": (1_000, "the most NICs of a node in the catalog is 32 (p5.48xlarge's EFA interfaces)"),
    "gpus_per_node": (100_000, "the largest NVLink domain sold holds 576 GPUs (NVL576); a node, 16"),
    "nvlink_domain_gpus": (100_000, "the largest NVLink domain sold holds 576 GPUs (NVL576)"),
    "oversubscription": (1_000.0, "fabrics are built from 1:1 to ~10:1 (the catalog's highest, fitted: 9.3)"),
    "pod_size_nodes": (1_000_000, _NODES),
    "rail_group_nodes": (1_000_000, _NODES),
    "nodes": (1_000_000, _NODES),
    "window_bytes": (1e12, "TCP's window scaling caps a window at 1 GiB (RFC 7323 Sec. 2.3)"),
    "initial_window_bytes": (1e12, "TCP's window scaling caps a window at 1 GiB (RFC 7323 Sec. 2.3)"),
}


_SLOW_GBIT = "the slowest links trained over run at ~0.1-0.2 Gbit/s (SWARM's preemptible peers)"
_SLOW_GB = "the slowest GPU links measured run at ~0.5 GB/s (gloo between CPU ranks)"

#: Lower bounds on bandwidths, 100-500x below the slowest in the catalog and the examples (0.1 Gbit/s, 0.5 GB/s): a
#: unit slip below them made a step astronomically long, refused later in a line naming another field (the swarm
#: example's nic_bandwidth_gbit_per_s of 1e-30: ``strategy.preemptions_per_hour``) or printed with exit 0.
LINK_FLOORS: dict[str, tuple[float, str]] = {
    **{name: (0.001, _SLOW_GBIT) for name in ("nic_bandwidth_gbit_per_s", "bandwidth_gbit_per_s",
                                              "max_flow_gbit_per_s")},
    **{name: (0.001, _SLOW_GB) for name in ("bandwidth_per_gpu_gb_per_s", "bus_bandwidth_gb_per_s",
                                            "low_latency_bus_bandwidth_gb_per_s", "bandwidth_gb_per_s",
                                            "link_bandwidth_gb_per_s", "unlinked_pair_bandwidth_gb_per_s",
                                            "bus_bandwidth_by_nodes")},
}


def _numbers(value):
    """The numbers in a link figure: itself, a matrix's entries, a table's values."""
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list | tuple):
        return [x for row in value for x in (row if isinstance(row, list | tuple) else (row,))]
    return [value]


def link_bound(value, info):
    """Refuse a link, NIC or fabric figure past :data:`LINK_LIMITS` or below :data:`LINK_FLOORS` with the bound and
    why (see there)."""
    limit, why = LINK_LIMITS.get(info.field_name, (None, ""))
    for number in _numbers(value) if value is not None else ():
        if limit is not None and isinstance(number, int | float) and number > limit:
            raise ValueError(f"{number:,} is past the limit of {int(limit):,} ({why}; a larger figure is likely a typo "
                             "and would make the simulated times nonsense)")
        floor, slow = LINK_FLOORS.get(info.field_name, (None, ""))
        if floor is not None and isinstance(number, int | float) and 0 < number < floor:
            raise ValueError(f"{number:g} is below the floor of {floor:g} ({slow}; a smaller figure is likely a unit "
                             "slip and would make the simulated times nonsense)")
    return value


class Spec(BaseModel):
    """Base of every spec: immutable, unknown keys rejected; link figures bounded (:data:`LINK_LIMITS`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)
    _link_bound = field_validator(*LINK_LIMITS, *LINK_FLOORS, check_fields=False)(link_bound)


class EfficiencyPoint(Spec):
    """One point of a GEMM efficiency curve: a GEMM of ``gflop`` runs at ``efficiency`` x peak."""

    gflop: float = Field(gt=0)
    efficiency: float = Field(gt=0, le=1)


def _increasing_gflop(points: list[EfficiencyPoint]) -> list[EfficiencyPoint]:
    """A curve's points must have strictly increasing GEMM size (it is interpolated along it)."""
    sizes = [p.gflop for p in points]
    if sizes != sorted(sizes) or len(set(sizes)) != len(sizes):
        raise ValueError("points must have strictly increasing gflop")
    return points


class PrecisionCurve(Spec):
    """A GEMM efficiency curve for one precision (fp8 kernels saturate differently from bf16 ones),
    with where it came from: ``fitted_on`` names the microbenchmark file and rows; None = assumed."""

    points: list[EfficiencyPoint] = Field(min_length=1)
    source: str
    fitted_on: str | None = None

    @field_validator("points")
    @classmethod
    def _sorted(cls, points: list[EfficiencyPoint]) -> list[EfficiencyPoint]:
        return _increasing_gflop(points)


#: Head sizes each fused attention kernel is compiled for (by ``AttentionEfficiency.kernel``). A head size
#: between two of them runs the next larger one's kernel with the head dimension zero-padded: its
#: tensor-core tiles compute the padded width, so the kernel does ``padded / d`` times the FLOPs a head of
#: ``d`` counts (:func:`kernel_head_dim`). Sources, in each kernel's code (the Triton kernel read in the wheel
#: named below; flash-attn's C++ dispatch as its repository has it, not re-read offline this session):
#: - FlashAttention-2 (flash-attn 2.x, csrc/flash_attn/flash_api.cpp ``head_size_rounded =
#:   round_multiple(head_size, 32)``; csrc/flash_attn/src/static_switch.h ``HEADDIM_SWITCH``: kernels for 32,
#:   64, 96, 128, 160, 192, 224, 256; later 2.x releases run 193-256 in the 256 kernel); PyTorch SDPA's flash
#:   backend is this kernel;
#: - FlashAttention-3 (flash-attn hopper/flash_api.cpp ``round_up_headdim``: 64, 96, 128, 192, 256);
#: - Triton FlashAttention (flash-attn's flash_attn_triton.py, which llm-foundry ships as
#:   llmfoundry/models/layers/flash_attn_triton.py, read in llm-foundry 0.3.0's wheel:
#:   ``BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16)``, ``assert d <= 128``).
#: Kernels not listed (cuDNN's fused attention, FlashAttention-4) run the head size as given: their
#: compiled sizes were not read (assumed unpadded).
KERNEL_HEAD_DIMS: dict[str, tuple[int, ...]] = {
    "FlashAttention-2": (32, 64, 96, 128, 160, 192, 224, 256),
    "FlashAttention-3": (64, 96, 128, 192, 256),
    "FlashAttention Triton": (16, 32, 64, 128),
}


def kernel_head_dim(kernel: str, head_dim: int) -> int:
    """The head size ``kernel`` computes for a head of ``head_dim`` (:data:`KERNEL_HEAD_DIMS`): the smallest
    compiled size that holds it; the size itself for a kernel whose sizes are not listed, or past the largest
    (such a head does not run in that kernel at all; the caller prices it as given)."""
    for size in KERNEL_HEAD_DIMS.get(kernel, ()):
        if size >= head_dim:
            return size
    return head_dim


class AttentionEfficiency(Spec):
    """A fused attention kernel's efficiency (achieved / dense bf16 peak) by pass, sequence length,
    head size and causality (validation/calibrate_microbench.py fits it on attention_kernels.csv):

        eff(pass, s, d, causal) = level[pass] · head_dim_factor(D) · (d / D) · s / (s + half_seq_len[causal])

    the saturating form of a kernel whose per-tile prologue/epilogue and wave quantisation cost a
    fixed time per row block (Dao 2023, FlashAttention-2 Sec. 3.3; Shah et al. 2024, FlashAttention-3
    Sec. 4.1 show TFLOP/s rising with s to a plateau). ``D`` is the head size the kernel is compiled for
    (:func:`kernel_head_dim`: a head of 112 runs FlashAttention-2's 128 kernel, zero-padded, so it reaches
    112/128 of that kernel's rate on the FLOPs a head of 112 counts); ``head_dim_factor`` is interpolated
    linearly in log2(D) and clamped at its ends; a causal kernel reaches its plateau later (fewer tiles per
    row)."""

    kernel: str = Field(description="e.g. FlashAttention-2, FlashAttention-3")
    fwd_efficiency: float = Field(gt=0, le=1, description="forward, long sequences, head size 128")
    bwd_efficiency: float = Field(gt=0, le=1, description="backward, long sequences, head size 128")
    half_seq_len: float = Field(ge=0, description="non-causal: sequence length at half the plateau")
    causal_half_seq_len: float = Field(ge=0, description="causal: sequence length at half the plateau")
    head_dim_factor: dict[PositiveInt, float] = Field(
        default_factory=lambda: {128: 1.0}, description="efficiency relative to head size 128")
    source: str
    fitted_on: str | None = None
    assumed: list[str] = Field(
        default_factory=list, description="the fields above that no row measured (taken from another kernel or "
                                          "GPU, as ``source`` says): the run's provenance lists them as assumed")

    def efficiency(self, pass_: str, seq_len: float, head_dim: float, causal: bool) -> float:
        level = self.fwd_efficiency if pass_ == "fwd" else self.bwd_efficiency
        dims = sorted(self.head_dim_factor)
        compiled = kernel_head_dim(self.kernel, int(head_dim)) if float(head_dim).is_integer() else head_dim
        import numpy as np  # lazily: most runs never interpolate, and numpy costs ~60 ms to import

        factor = float(np.interp(np.log2(compiled), np.log2(dims), [self.head_dim_factor[d] for d in dims]))
        half = self.causal_half_seq_len if causal else self.half_seq_len
        return min(1.0, level * factor * (head_dim / compiled) * seq_len / (seq_len + half))


class ConvEfficiency(Spec):
    """A convolution pass's efficiency (achieved / the precision's dense peak) by its shape, for one
    precision (simulator/cost/conv.py; validation/calibrate_conv.py fits it on DeepPool's per-layer
    A100 profiles). cuDNN runs a convolution as an implicit GEMM (Chetlur et al. 2014, Sec. 3) in
    tiles of output pixels × output channels, looping over the reduction (input channels × window):

        eff = level · C / (C + half_channels) · K / (K + half_reduction) · class factors

    ``C`` is the pass's output channels (forward: C_out; data gradient: C_in; weight gradient:
    C_in·kh·kw, the weight's columns) and ``K`` its reduction per output element (forward: C_in·kh·kw;
    data gradient: C_out·kh·kw; weight gradient: N·H_out·W_out). A tile's width is fixed, so a pass
    with few output channels leaves part of every tile idle (tile quantisation: time ∝ C + a
    constant), and a short reduction pays each tile's prologue and epilogue over few steps (time ∝
    K + a constant): both saturating terms. Class factors: strided windows (the data gradient
    scatters to every stride-th input; cuDNN's strided kernels are slower), 1×1 windows (a plain GEMM,
    no im2col gather) and one-dimensional 1×k / k×1 windows (Inception-v3)."""

    level: float = Field(gt=0, le=1, description="efficiency of a wide, deep 3x3 convolution pass")
    half_channels: float = Field(ge=0, description="output channels of a pass at half the level")
    half_reduction: float = Field(ge=0, description="reduction length of a pass at half the level")
    strided_factor: float = Field(gt=0, le=2, description="a window with stride > 1")
    pointwise_factor: float = Field(gt=0, le=2, description="a 1x1 window")
    asymmetric_factor: float = Field(gt=0, le=2, description="a 1xk or kx1 window")
    source: str
    fitted_on: str | None = None

    def efficiency(self, channels: float, reduction: float, kh: int, kw: int, stride: int) -> float:
        eff = (self.level * channels / (channels + self.half_channels)
               * reduction / (reduction + self.half_reduction))
        if stride > 1:
            eff *= self.strided_factor
        if kh == kw == 1:
            eff *= self.pointwise_factor
        elif kh != kw:
            eff *= self.asymmetric_factor
        return min(1.0, eff)


class SizePoint(Spec):
    """One point of a by-size efficiency table: an op of ``size`` (the table's unit) runs at ``efficiency``."""

    size: float = Field(gt=0)
    efficiency: float = Field(gt=0, le=1)


class SizedEfficiency(Spec):
    """An efficiency that depends on the op's size, fitted per microbenchmark size where one pooled number
    is off at a given shape (the harness's attention at (b·h, s, d) = (16, 128, 64) ran 0.72-0.82 of the
    curve where the pool over its sizes read 0.97-1.00; session 14's harness14b report). Read log-linear in
    size between the points, clamped at the ends (as the GEMM curve, simulator/cost/compute.py
    ``gemm_efficiency``). The unit of ``size`` is named by the field that holds the table. Written by
    ``clustersim calibrate`` from the rows it fits; ``fitted_on`` names them."""

    points: list[SizePoint] = Field(min_length=1)
    fitted_on: str

    @field_validator("points")
    @classmethod
    def _increasing(cls, points: list[SizePoint]) -> list[SizePoint]:
        sizes = [p.size for p in points]
        if sizes != sorted(sizes) or len(set(sizes)) != len(sizes):
            raise ValueError("points must have strictly increasing size")
        return points

    def at(self, size: float) -> float:
        """The efficiency at ``size``: log-linear between the two points around it, the end point's outside."""
        pts = self.points
        if size <= pts[0].size:
            return pts[0].efficiency
        if size >= pts[-1].size:
            return pts[-1].efficiency
        for lo, hi in zip(pts, pts[1:], strict=False):
            if lo.size <= size <= hi.size:
                frac = (math.log(size) - math.log(lo.size)) / (math.log(hi.size) - math.log(lo.size))
                return lo.efficiency + frac * (hi.efficiency - lo.efficiency)
        return pts[-1].efficiency  # unreachable: the points are sorted


class MemoryKernelEfficiency(Spec):
    """Achieved / peak HBM bandwidth of the memory-bound CNN kernels that do not stream (forward +
    backward of one layer, on the bytes the layer graph counts; simulator/cost/memory_kernels.py):
    PyTorch's NCHW pooling backward kernels gather over every window that covers an input
    element, and a concatenation copies strided slices, so they reach a fraction of what an
    elementwise kernel does. Kernel classes not listed run at ``memory_bound_efficiency``.
    ``cross_entropy``: the softmax cross-entropy loss (workloads/graph.py ``head_work``, forward and
    backward), set by ``clustersim calibrate`` on an eager CPU profile from the harness's
    ``loss.csv`` (simulator/cost/calibration.py ``fit_loss_kernel``): there its exp and log per
    element make it slower than the streaming kernels."""

    by_kernel: dict[Literal["maxpool", "avgpool", "adaptive_avgpool", "concat", "cross_entropy"], float] = Field(
        description="efficiency per kernel class (0, 1]")
    by_kernel_forward_bytes: dict[Literal["cross_entropy"], SizedEfficiency] = Field(
        default_factory=dict,
        description="a kernel class's efficiency by the bytes its forward op moves (a ``.grad`` op is looked up at "
                    "its forward's bytes, half its own: workloads/graph.py _backward_of), in place of by_kernel's "
                    "one number; a class not listed runs at by_kernel's")
    source: str
    fitted_on: str | None = None

    @field_validator("by_kernel")
    @classmethod
    def _fractions(cls, by_kernel: dict[str, float]) -> dict[str, float]:
        if any(not 0 < v <= 1 for v in by_kernel.values()):
            raise ValueError("each efficiency must be in (0, 1]")
        return by_kernel


class DirectConvEfficiency(Spec):
    """Achieved / peak HBM bandwidth of a grouped or depthwise convolution pass that runs as a direct
    kernel on the CUDA cores rather than as an implicit GEMM (simulator/cost/conv.py), on the bytes the
    layer graph counts for the pass (x, w and y once). A depthwise kernel reads a k×k window per output
    and, in its weight gradient, reduces over every output pixel of the batch for each of its few
    weights: it does not stream like an elementwise kernel. No per-kernel measurement of it is in this
    project's data; validation/calibrate_direct_conv.py fits the fraction on the fit half of NVIDIA
    DeepLearningExamples' EfficientNet training rows (named in ``fitted_on``). None: such a pass runs
    at ``memory_bound_efficiency`` (the roofline: an assumption that made EfficientNet 2-3x too fast)."""

    bandwidth_efficiency: float = Field(gt=0, le=1, description="achieved / peak HBM bandwidth of one pass")
    source: str
    fitted_on: str | None = None


class CrossNodePipelineFloor(Spec):
    """A framework's host-side floor on the decoder layers of a pipeline stage whose pipeline
    neighbour sits on another node (simulator/cost/host_floor.py).

    While such a stage runs, one decoder layer's forward + backward for one micro-batch takes at
    least a fixed time, whatever the micro-batch size: the GPU's kernels overlap this time, so the
    pass takes the longer of the two. The floor depends on the tensor-parallel degree:
    ``per_layer_us_by_tp[tp]`` where that degree is listed (each fitted on its own runs), else the
    rule ``per_layer_us + per_layer_per_tp_rank_us · tp``. Observed for nanotron on AWS p5 / EFA
    (the Ultra-Scale Playbook sweep; mechanism not published), fitted there
    (validation/calibrate_frameworks.py fit_playbook_pipeline_floor)."""

    per_layer_us: float = Field(ge=0, description="the rule's constant term (tp not listed below)")
    per_layer_per_tp_rank_us: float = Field(ge=0, description="the rule's growth per tensor-parallel rank")
    per_layer_us_by_tp: dict[PositiveInt, NonNegativeFloat] = Field(
        default_factory=dict, description="floor per layer at the listed tp degrees, overriding the rule")
    source: str
    fitted_on: str | None = None

    def per_layer_s(self, tp: int) -> float:
        if tp in self.per_layer_us_by_tp:
            return self.per_layer_us_by_tp[tp] * 1e-6
        return (self.per_layer_us + self.per_layer_per_tp_rank_us * tp) * 1e-6


class GroupedGemmEfficiency(Spec):
    """A grouped GEMM kernel: one launch that runs the GEMMs of G groups (an MoE layer's local experts, each on
    its own tokens), as ``torch._grouped_mm`` / torchao's ``_scaled_grouped_mm`` do. Each group is priced as a
    dense GEMM of its own shape on the precision's curve (simulator/cost/compute.py), then

        t = G · t_dense(group) / level + G · per_group_us + launch (+ the recipe's quantisation / quantise_efficiency)

    ``level``: the grouped kernel's rate over the dense curve's at the group's shape; ``per_group_us``: the
    kernel's scheduling cost per group; ``quantise_efficiency``: for an FP8 recipe (MXFP8 measured), the rate of
    the library's quantise kernels over the memory-bound rate the recipe's bytes are priced at (its scale
    layout, column-wise casts for the weight gradient and group padding included). Kernel-library specific:
    an entry applies to the frameworks in ``frameworks`` only (``training.framework``); the others run their
    experts as dense GEMMs of the group's shape. Fitted on the fit half of a microbenchmark's grouped rows
    (validation/calibrate_microbench.py ``fit_grouped``), or carried from the recipe they were measured in on the
    same die by that module's ``GROUPED_CARRY_RULE`` (``fitted_on`` marked "(derived by rule from ...)")."""

    level: float = Field(gt=0, le=2, description="grouped kernel rate / dense curve rate at one group's shape")
    per_group_us: NonNegativeFloat = Field(default=0.0, description="scheduling cost per group")
    quantise_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="the recipe's quantise kernels' share of the memory-bound rate "
                                              "(FP8 recipes); None: at the memory-bound rate")
    kernel: str = Field(description="the kernel library measured")
    frameworks: list[str] = Field(min_length=1, description="training.framework values that run this kernel")
    source: str
    fitted_on: str | None = None


class GemmShapeRange(Spec):
    """The forward GEMM shapes (M rows x N out features x K reduction; a convolution's implicit GEMM: M = N·H·W,
    N = C_out, K = C_in·kh·kw) some evidence spans, each dimension between its least and greatest: where a rule
    chosen on that evidence is applied and no further (simulator/cost/compute.py ``linear_as_pointwise_conv``)."""

    m_min: int = Field(gt=0)
    m_max: int = Field(gt=0)
    n_min: int = Field(gt=0)
    n_max: int = Field(gt=0)
    k_min: int = Field(gt=0)
    k_max: int = Field(gt=0)
    source: str | None = None
    fitted_on: str | None = Field(default=None, description="the rows whose shapes these bounds are")

    @model_validator(mode="after")
    def _ordered(self) -> GemmShapeRange:
        for dim in "mnk":
            if getattr(self, f"{dim}_min") > getattr(self, f"{dim}_max"):
                raise ValueError(f"{dim}_min is above {dim}_max")
        return self

    def contains(self, m: int, n: int, k: int) -> bool:
        """Whether a forward GEMM of M x N x K lies inside every dimension's bounds."""
        return (self.m_min <= m <= self.m_max and self.n_min <= n <= self.n_max
                and self.k_min <= k <= self.k_max)

    def describe(self) -> str:
        return f"M {self.m_min:,}..{self.m_max:,}, N {self.n_min:,}..{self.n_max:,}, K {self.k_min:,}..{self.k_max:,}"


class ComputeEfficiency(Spec):
    """How close kernels get to the datasheet peaks.

    ``gemm_curve`` is interpolated linearly in log10(GFLOP of one GEMM) and clamped at its ends.
    ``memory_bound_efficiency`` is achieved / peak HBM bandwidth for streaming kernels.
    """

    gemm_curve: list[EfficiencyPoint] = Field(min_length=1)
    gemm_curves: dict[CurveKey, PrecisionCurve] = Field(
        default_factory=dict,
        description="kernel curves per precision, each with its provenance; a precision not listed uses "
                    "gemm_curve (whose provenance is this spec's source / fitted_on)")
    in_training_gemm_factor: float = Field(
        default=1.0, gt=0, le=1,
        description="GEMMs inside a training step reach this fraction of the microbenchmark curve (the "
                    "curve's ceiling is the best of a shape search at steady clocks; a step's shapes, "
                    "power-capped clocks and L2 traffic of neighbouring kernels give less)")
    in_training_gemm_factor_source: str | None = None
    in_training_gemm_factor_fitted_on: str | None = Field(
        default=None, description="data and rows it was fitted on for this accelerator; None = assumed "
                                  "(when the factor is 1 the fitted gemm_curve already holds it)")
    misaligned_gemm_factor: float = Field(
        default=1.0, gt=0, le=1,
        description="a GEMM with a dimension that is not a multiple of 16 bytes of its element type runs at "
                    "this fraction of the curve (tensor cores need 16-byte aligned tiles: NVIDIA, Matrix "
                    "Multiplication Background User's Guide, 'Tensor Core Requirements')")
    misaligned_gemm_factor_source: str | None = Field(
        default=None,
        description="data and rows misaligned_gemm_factor was measured on (validation/calibrate_microbench.py: the "
                    "H100 torch.bmm d_ff sweep), marked '(sibling <part>)' or '(derived by rule from <part>)' where "
                    "carried from another board of the die; None = assumed (the default 1.0: no penalty). A run "
                    "with a misaligned GEMM lists it as calibrated, derived or assumed (simulator/cost/provenance.py)")
    conv_efficiency: dict[CurveKey, ConvEfficiency] = Field(
        default_factory=dict, description="convolution passes by shape, per precision (simulator/cost/conv.py);"
                                          " a precision without one prices convolutions on its GEMM curve")
    linear_as_pointwise_conv: tuple[CurveKey, ...] = Field(
        default=(), description="precisions whose dense GEMMs (linear layers; not attention, not MoE experts) are "
                                "priced as 1x1 convolution passes on conv_efficiency[precision] instead of the GEMM "
                                "curve: a linear over T rows is the implicit GEMM of a 1x1 convolution over T pixels "
                                "(M = T, N = out features, K = in features), and where a precision's only GEMM "
                                "evidence is convolutions the shape model that predicts them serves its linears "
                                "(simulator/cost/compute.py)")
    linear_as_pointwise_conv_source: str | None = None
    linear_as_pointwise_conv_range: dict[CurveKey, GemmShapeRange] = Field(
        default_factory=dict,
        description="per precision in linear_as_pointwise_conv, the forward GEMM shapes the rule was chosen on: a "
                    "linear whose (M, N, K) lies outside is priced on the GEMM size curve (gemm_curves[precision]) "
                    "instead; a precision without a range applies the rule at every shape")
    attention: AttentionEfficiency | None = Field(
        default=None, description="the fused attention kernel frameworks run by default (training.attention: flash, "
                                  "attention_kernel: auto); None: the GEMM curve times attention_efficiency_factor")
    attention_kernels: dict[Literal["fa2", "fa3", "triton", "cudnn"], AttentionEfficiency] = Field(
        default_factory=dict,
        description="other fused attention kernels the accelerator runs, by training.attention_kernel name (fa3: "
                    "FlashAttention-3, Hopper only; triton: Triton FlashAttention); fa3 neither here nor the "
                    "default kernel's is an error")
    grouped_gemm: dict[CurveKey, GroupedGemmEfficiency] = Field(
        default_factory=dict,
        description="MoE expert GEMMs run as one grouped kernel, per GEMM curve key (bf16, mxfp8, ...), for the "
                    "frameworks that run that kernel; a key not listed prices the experts as dense GEMMs of a "
                    "group's shape")
    grouped_gemm_not_carried: dict[str, str] = Field(
        default_factory=dict,
        description="per training.framework whose grouped kernel was measured on another die and is deliberately "
                    "not carried to this one: why (its experts run as dense GEMMs of a group's shape, assumed; "
                    "clustersim simulate prints the reason beside the grouped-GEMM line: "
                    "simulator/cost/provenance.py grouped_gemm_kernels)")
    memory_bound_efficiency: float = Field(gt=0, le=1)
    memory_bound_efficiency_source: str | None = None
    memory_kernels: MemoryKernelEfficiency | None = Field(
        default=None, description="CNN pooling and concatenation kernels by class; None: all memory-bound "
                                  "kernels at memory_bound_efficiency")
    direct_conv: DirectConvEfficiency | None = Field(
        default=None, description="grouped / depthwise convolution passes run as direct kernels; None: at "
                                  "memory_bound_efficiency")
    memory_bound_efficiency_fitted_on: str | None = Field(
        default=None, description="data and rows it was fitted on; None = assumed")
    attention_efficiency_factor: float = Field(
        default=1.0, gt=0, le=1, description="attention GEMMs (QK^T, AV) relative to the curve"
    )
    attention_efficiency_by_gemm_macs: SizedEfficiency | None = Field(
        default=None,
        description="attention_efficiency_factor by the size of one attention GEMM in multiply-adds (batch·m·n·k: "
                    "b·h·s·s_kv·d for QK^T and for AV, forward and backward alike), in place of the one factor; "
                    "None: the factor at every size")
    kernel_launch_overhead_us: float = Field(ge=0)
    overlap_compute_slowdown: float = Field(
        default=0.0, ge=0, le=10,
        description="relative increase of a compute kernel's time while a communication of the same "
                    "rank runs beside it (communication kernels take SMs / CPU cores): 0.1 = 10% longer",
    )
    overlap_compute_slowdown_source: str | None = None
    overlap_comm_slowdown: float = Field(
        default=0.0, ge=0, le=50,
        description="the other direction: relative slowdown of a communication while a compute kernel of "
                    "the same rank runs (it moves at 1/(1+c) of its rate): 1 = half speed",
    )
    overlap_comm_slowdown_source: str | None = None
    sync_jitter: float = Field(
        default=0.0, ge=0, le=1,
        description="relative standard deviation of a rank's time for equal work between synchronisations: "
                    "a job of N ranks waits sigma * E[max of N normals] of each segment for its slowest "
                    "(simulator/cost/jitter.py); 0 = ranks in lockstep")
    sync_jitter_source: str | None = None
    input_us_per_sample: float = Field(
        default=0.0, ge=0,
        description="host time per sample of the framework's input pipeline on a first-stage rank (loading, "
                    "decoding, augmentation, copies): it runs beside the GPU's step (a prefetching loader), so a "
                    "step takes at least the rank's samples x this and the next step's first kernel waits for it "
                    "(simulator/strategies/spmd/plan.py); 0 = the input never bounds the step. Set by a framework "
                    "profile (hardware_specs/frameworks/) fitted on that framework's runs")
    input_source: str | None = None
    conv_sm_cycles_per_byte: float = Field(
        default=0.0, ge=0,
        description="SM clock cycles per byte of a convolution pass's operands that the framework spends beside "
                    "the convolution kernel itself, in work bound by the SMs' instruction issue (neither the tensor "
                    "cores nor HBM): a pass takes bytes x this / (sm_count x sm_clock) longer "
                    "(simulator/cost/compute.py). Counted in SM cycles, so the same framework's constant carries to "
                    "a part with more or fewer SMs at another clock. 0 = none. Set by a framework profile "
                    "(hardware_specs/frameworks/) fitted on that framework's runs")
    conv_sm_source: str | None = None
    optimizer_efficiency: float | None = Field(
        default=None, gt=0, le=1,
        description="achieved / peak HBM bandwidth of the (fused) optimizer step, which streams its states "
                    "with little arithmetic; None = memory_bound_efficiency")
    optimizer_efficiency_source: str | None = None
    cross_node_pipeline_floor: CrossNodePipelineFloor | None = Field(
        default=None,
        description="host-side floor per decoder layer and micro-batch of a stage whose pipeline neighbour "
                    "is on another node (a framework's behaviour; None = no floor)")
    host_dispatch_us_per_kernel: float | None = Field(
        default=None, ge=0, le=10_000,
        description="eager-mode host time per kernel of the layer graph (a framework issuing PyTorch eager ops "
                    "from Python): a decoder layer's passes for one micro-batch take at least their kernel and "
                    "collective count times this, the GPU running under it (simulator/cost/host_floor.py); "
                    "None = the host keeps ahead of the GPU")
    host_dispatch_source: str | None = None
    moe_layer_fixed_us: float | None = Field(
        default=None, ge=0, le=100_000,
        description="fixed time of one MoE layer's forward and backward for one micro-batch beyond its kernels' "
                    "FLOPs and bytes and its all-to-alls (the router's and token dispatcher's bookkeeping kernels, "
                    "the token-count exchange and host waits of Megatron-Core's MoE layer): the layer's passes are "
                    "stretched to their isolated time plus this (simulator/cost/host_floor.py); None = 0")
    moe_layer_fixed_source: str | None = None
    zero3_gather_host_us: float | None = Field(
        default=None, ge=0, le=100_000,
        description="host time of one ZeRO-3 / FSDP parameter all-gather beyond its collective law and the copy-in "
                    "and copy-out kernels priced beside it (the framework's Python and small kernels around the "
                    "collective: FSDP2's unshard / reshard), on the compute stream after the gather "
                    "(simulator/strategies/spmd/plan_tasks.py); set by `clustersim calibrate` from the harness's "
                    "fsdp.csv on an eager CPU/gloo host, where the host blocks in the collective; None = 0")
    zero3_reduce_host_us: float | None = Field(
        default=None, ge=0, le=100_000,
        description="host time of one ZeRO-3 / FSDP gradient reduce-scatter beyond its collective law and the "
                    "gradient copy-in priced beside it (FSDP2's post_backward / foreach_reduce), on the compute "
                    "stream before the reduce; from the same rows as zero3_gather_host_us; None = 0")
    zero3_host_source: str | None = None
    zero3_host_fitted_on: str | None = None
    source: str
    fitted_on: str | None = None

    @field_validator("gemm_curve")
    @classmethod
    def _sorted(cls, points: list[EfficiencyPoint]) -> list[EfficiencyPoint]:
        return _increasing_gflop(points)

    @model_validator(mode="after")
    def _linear_conv_model_exists(self) -> ComputeEfficiency:
        missing = [key for key in self.linear_as_pointwise_conv if key not in self.conv_efficiency]
        if missing:
            raise ValueError(f"linear_as_pointwise_conv names {missing}, which conv_efficiency does not have")
        stray = [key for key in self.linear_as_pointwise_conv_range if key not in self.linear_as_pointwise_conv]
        if stray:
            raise ValueError(f"linear_as_pointwise_conv_range names {stray}, which linear_as_pointwise_conv does not")
        return self


class SustainedClock(Spec):
    """The engine clock a long GEMM holds under the board power limit, against the clock the
    datasheet peak assumes: where the TDP caps the sustained clock, a kernel cannot reach the
    datasheet peak however well it is written (AMD, "Measuring Max-Achievable FLOPs" part 2: MI300X
    at 750 W runs its best GEMMs at a median 1.1-1.2 GHz against a 2.1 GHz peak clock).

    Informational: a GEMM curve fitted on these runs (``fitted_on``) already holds the capped clock,
    so the compute model does not apply it again; a curve assumed from another accelerator does not
    hold it, which is why it is recorded beside the spec."""

    peak_clock_mhz: float = Field(gt=0, description="the clock the datasheet peak TFLOP/s assumes")
    under_load_mhz: dict[Precision, float] = Field(
        description="median engine clock measured while the precision's best GEMM ran")
    power_limit_watts: float = Field(gt=0, description="board power limit of the measurement")
    source: str
    fitted_on: str | None = Field(default=None, description="data and rows the clocks were read from")
    notes: str | None = None

    def clock_fraction(self, precision: str) -> float | None:
        """Sustained over peak clock for ``precision`` (None where it was not measured)."""
        mhz = self.under_load_mhz.get(precision)
        return None if mhz is None else mhz / self.peak_clock_mhz


class Accelerator(Spec):
    """One GPU (or one GCD of a multi-die package)."""

    name: str
    vendor: str
    peak_tflops: dict[Precision, float] = Field(description="dense datasheet peak per precision")
    hbm_gib: float = Field(gt=0)
    hbm_bandwidth_gb_per_s: float = Field(gt=0)
    tdp_watts: float = Field(gt=0)
    idle_watts: float | None = Field(default=None, gt=0)
    efficiency: ComputeEfficiency
    block_scaled_formats: list[Literal["mxfp8", "mxfp4", "nvfp4"]] = Field(
        default_factory=list, description="block-scaled formats the tensor cores take natively (datasheet)")
    sustained_clock: SustainedClock | None = Field(
        default=None, description="measured engine clock under the power limit (None: not measured)")
    sm_count: int | None = Field(
        default=None, gt=0, description="streaming multiprocessors enabled on the part (vendor architecture "
                                        "whitepaper / datasheet); None: not recorded")
    sm_clock_mhz: float | None = Field(
        default=None, gt=0, description="the SM clock the datasheet's dense tensor peak assumes (peak = SMs x clock x "
                                        "the architecture's dense FLOP per SM per clock); None: not recorded")
    derived_from: str | None = Field(
        default=None, description="the catalog part whose efficiency block this part's was derived from by rule "
                                  "(validation/derive_parts.py): a framework profile's entry for that part corrects "
                                  "the same kernel constants here (simulator/cost/framework.py); None: its own")
    source: str
    notes: str | None = None

    @model_validator(mode="after")
    def _sm_rate_for_sm_bound_work(self) -> Accelerator:
        if self.efficiency.conv_sm_cycles_per_byte > 0 and (self.sm_count is None or self.sm_clock_mhz is None):
            raise ValueError(f"efficiency.conv_sm_cycles_per_byte is set but {self.name} records no sm_count and "
                             "sm_clock_mhz: work counted in SM cycles needs the part's SMs and clock")
        return self

    @property
    def sm_cycles_per_s(self) -> float | None:
        """SMs x clock (Hz): the rate at which the part runs work counted in SM cycles (None: not recorded)."""
        if self.sm_count is None or self.sm_clock_mhz is None:
            return None
        return self.sm_count * self.sm_clock_mhz * 1e6

    @field_validator("peak_tflops")
    @classmethod
    def _positive_peaks(cls, peaks: dict[str, float]) -> dict[str, float]:
        if not peaks:
            raise ValueError("at least one precision is needed")
        for precision, value in peaks.items():
            if value <= 0:
                raise ValueError(f"{precision} must be positive")
        return peaks


CollectiveName = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all"]


class AlphaBeta(Spec):
    """A measured cost law for one collective on one link class:
    time = latency_us + steps(n) * latency_per_step_us + bus_bytes / bus_bandwidth_gb_per_s, where
    bus_bytes is the NCCL-tests "bus" volume (2(n-1)/n*S for all-reduce, (n-1)/n*S for
    all-gather/reduce-scatter, S otherwise) and steps(n) the ring's step count over the n ranks
    (2(n-1) for all-reduce, n-1 for all-gather/reduce-scatter, 1 otherwise): a law measured at
    several group sizes whose latency grows with the ring (e.g. EFA, validation/calibrate_efa.py)."""

    latency_us: float = Field(ge=0)
    latency_per_step_us: float = Field(default=0.0, ge=0, description="latency per ring step (see above)")
    bus_bandwidth_gb_per_s: float = Field(gt=0)
    measured_points: list[tuple[float, float]] | None = Field(
        default=None,
        description="[bus_bytes, time_us] pairs measured over ``measured_world_size`` ranks, non-decreasing in "
                    "both: where given, a collective of that group size takes the time interpolated between them "
                    "(linearly in bytes; the first point's below, the law's bandwidth beyond the last), for "
                    "transports that an alpha-beta line fits badly (gloo on a CPU host)")
    measured_world_size: int | None = Field(default=None, ge=2)
    bus_bandwidth_by_nodes: dict[int, float] | None = Field(
        default=None,
        description="bus bandwidth (GB/s) measured per number of nodes the group spans, for an inter-node law: "
                    "a group over k nodes gets the bandwidth interpolated log-log between the listed counts (the "
                    "nearest listed count's outside them) instead of bus_bandwidth_gb_per_s. For fabrics whose "
                    "large-message bandwidth falls with scale (congestion, oversubscription) rather than their "
                    "latency growing with the ring; validation/calibrate_efa.py tells the two apart")
    low_latency_per_step_us: float | None = Field(
        default=None, ge=0,
        description="NCCL's low-latency protocols (LL/LL128: flags in every line, less bandwidth, shorter steps): "
                    "where given with low_latency_bus_bandwidth_gb_per_s, a collective takes the faster of this "
                    "law and the main one, as NCCL's tuner picks a protocol per size (src/graph/tuning.cc)")
    low_latency_bus_bandwidth_gb_per_s: float | None = Field(default=None, gt=0)
    arrival_wait_us: float = Field(
        default=0.0, ge=0,
        description="the mean wait for the group's last rank at a collective that follows compute (the ranks' "
                    "drift over the segment before it), kept apart from the alpha-beta line: a collective issued "
                    "right after another of its group, with no compute between, does not pay it "
                    "(simulator/cost/collectives.py). clustersim calibrate fits it on a CPU host from skew.csv's "
                    "collective_cadence rows; 0 elsewhere")
    source: str | None = None
    fitted_on: str | None = None

    @property
    def low_latency(self) -> AlphaBeta | None:
        """The low-latency protocol's law, or None."""
        if self.low_latency_per_step_us is None or self.low_latency_bus_bandwidth_gb_per_s is None:
            return None
        return AlphaBeta(latency_us=self.latency_us, latency_per_step_us=self.low_latency_per_step_us,
                         bus_bandwidth_gb_per_s=self.low_latency_bus_bandwidth_gb_per_s,
                         arrival_wait_us=self.arrival_wait_us)

    @field_validator("bus_bandwidth_by_nodes")
    @classmethod
    def _positive_table(cls, table):
        if table is None:
            return table
        if not table:
            raise ValueError("needs at least one {nodes: GB/s} entry")
        if any(k < 1 or v <= 0 for k, v in table.items()):
            raise ValueError("node counts must be >= 1 and bandwidths > 0")
        return dict(sorted(table.items()))

    def bandwidth_gb_per_s(self, num_nodes: int = 1) -> float:
        """The law's bus bandwidth for a group over ``num_nodes`` nodes (see ``bus_bandwidth_by_nodes``)."""
        if not self.bus_bandwidth_by_nodes:
            return self.bus_bandwidth_gb_per_s
        nodes = list(self.bus_bandwidth_by_nodes)
        values = [self.bus_bandwidth_by_nodes[k] for k in nodes]
        if num_nodes <= nodes[0]:
            return values[0]
        if num_nodes >= nodes[-1]:
            return values[-1]
        import numpy as np

        return float(np.exp(np.interp(np.log(num_nodes), np.log(nodes), np.log(values))))

    @field_validator("measured_points")
    @classmethod
    def _monotone(cls, points):
        if points is None:
            return points
        if len(points) < 1:
            raise ValueError("needs at least one [bus_bytes, time_us] point")
        for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False):
            if b1 <= b0 or t1 < t0:
                raise ValueError("points must grow in bus_bytes and not shrink in time_us")
        if any(b < 0 or t < 0 for b, t in points):
            raise ValueError("bus_bytes and time_us must be non-negative")
        return points

    @model_validator(mode="after")
    def _points_need_world_size(self):
        if self.measured_points is not None and self.measured_world_size is None:
            raise ValueError("measured_points needs measured_world_size (the group size they were timed on)")
        return self

    def table_time_s(self, bus_bytes: float, n: int) -> float | None:
        """The measured time of ``bus_bytes`` over ``n`` ranks, or None where no table applies."""
        if self.measured_points is None or n != self.measured_world_size:
            return None
        xs = [b for b, _ in self.measured_points]
        ts = [t for _, t in self.measured_points]
        if bus_bytes <= xs[0]:
            return ts[0] * 1e-6
        if bus_bytes >= xs[-1]:
            return ts[-1] * 1e-6 + (bus_bytes - xs[-1]) / (self.bus_bandwidth_gb_per_s * 1e9)
        import numpy as np

        return float(np.interp(bus_bytes, xs, ts)) * 1e-6


class NvlsLaw(Spec):
    """NVLink SHARP all-reduce inside an NVSwitch domain (Jeaugey, NCCL 2.17+ "NVLS"): the switch
    reduces and multicasts, so each rank sends its payload S into the switch and receives the
    reduced S back once: ``time = latency_us + S / bandwidth_gb_per_s``, whatever the group size
    (NCCL's bus bandwidth 2(n-1)/n · S / time then grows with n, as measured: H200 414 GB/s at 5
    GPUs, 473 at 8). NCCL runs it from ``min_gpus`` ranks and when it beats the ring; so does the
    simulator."""

    latency_us: float = Field(ge=0)
    bandwidth_gb_per_s: float = Field(gt=0, description="payload bytes per second per rank")
    min_gpus: int = Field(default=4, ge=2)
    source: str
    fitted_on: str | None = None


class IntraNodeFabric(Spec):
    """GPU-to-GPU links inside a node (NVLink/NVSwitch, Infinity Fabric, or PCIe).

    ``bandwidth_per_gpu_gb_per_s`` is the one-direction line rate of one GPU's ports;
    ``collective_efficiency`` is NCCL's achievable bus bandwidth over that line rate.
    """

    kind: Literal["nvswitch", "nvlink", "xgmi", "pcie", "shm"]
    bandwidth_per_gpu_gb_per_s: float = Field(gt=0)
    latency_us: float = Field(ge=0)
    collective_efficiency: float = Field(gt=0, le=1)
    collective_efficiency_fitted_on: str | None = Field(
        default=None,
        description="the microbenchmark file and row(s) collective_efficiency was read from (a row of another "
                    "node's part marked '(transferred from NODE ...)'); None: stated in source. Where the ring "
                    "collectives have fitted laws (Node.intra_node_measured) it still prices sends, all-to-alls "
                    "and a cross-node collective's NVLink phase (simulator/cost/topology.py)")
    supports_nvls: bool = False
    collectives: dict[CollectiveName, AlphaBeta] | None = Field(
        default=None, description="fitted per-collective laws (from `clustersim calibrate`); override the above"
    )
    link_counts: list[list[int]] | None = Field(
        default=None,
        description="direct GPU-to-GPU links per pair (symmetric, zero diagonal, gpus_per_node square) where not every "
                    "pair is joined alike: NVLink hybrid cube mesh (DGX-1V, AWS p3.16xlarge), NVLink bridge pairs. "
                    "A ring over a group inside the node then gets link_bandwidth_gb_per_s times the number of "
                    "edge-disjoint directed rings the links hold, or unlinked_pair_bandwidth_gb_per_s where they hold "
                    "none (simulator/cost/intra_node.py). None: every pair at bandwidth_per_gpu_gb_per_s (a switch)")
    link_bandwidth_gb_per_s: float | None = Field(default=None, gt=0, description="one direction of one link")
    unlinked_pair_bandwidth_gb_per_s: float | None = Field(
        default=None, gt=0, description="one direction between GPUs without a direct link (PCIe / host bridge)")
    source: str

    @model_validator(mode="after")
    def _links_complete(self) -> IntraNodeFabric:
        if self.link_counts is None:
            if self.link_bandwidth_gb_per_s is not None or self.unlinked_pair_bandwidth_gb_per_s is not None:
                raise ValueError("link_bandwidth_gb_per_s and unlinked_pair_bandwidth_gb_per_s need link_counts")
            return self
        if self.link_bandwidth_gb_per_s is None or self.unlinked_pair_bandwidth_gb_per_s is None:
            raise ValueError("link_counts needs link_bandwidth_gb_per_s and unlinked_pair_bandwidth_gb_per_s")
        n = len(self.link_counts)
        for i, row in enumerate(self.link_counts):
            if len(row) != n:
                raise ValueError("link_counts must be square")
            for j, count in enumerate(row):
                if count < 0 or count != self.link_counts[j][i] or (i == j and count):
                    raise ValueError("link_counts must be symmetric, non-negative, with a zero diagonal")
        return self


class Node(Spec):
    """A server: accelerators, their intra-node fabric, and NICs to the cluster fabric."""

    name: str
    accelerator: str | Accelerator = Field(description="catalog name or an inline accelerator")
    gpus_per_node: int = Field(gt=0)
    intra_node: IntraNodeFabric
    nics_per_node: int = Field(ge=0, description="NICs for compute traffic (storage NICs not counted)")
    nic_bandwidth_gbit_per_s: float = Field(gt=0, description="line rate of one NIC")
    nic_efficiency: float = Field(gt=0, le=1, description="achievable / line rate")
    nic_latency_us: float = Field(ge=0)
    nic_low_latency_efficiency: float | None = Field(
        default=None, gt=0, le=1,
        description="NCCL's low-latency protocols across nodes (LL/LL128): achievable / line rate; with "
                    "nic_low_latency_us, a cross-node collective takes the faster of this line and the main one "
                    "(validation/calibrate_collectives.py fits both on nccl-tests sweeps)")
    nic_low_latency_us: float | None = Field(default=None, ge=0, description="per-hop latency of that protocol")
    nic_fitted_on: str | None = Field(
        default=None, description="the rows nic_efficiency / nic_latency_us (and the low-latency line) were fitted "
                                  "on, where they were (validation/calibrate_collectives.py); None: stated in source")
    inter_node_collectives: dict[CollectiveName, AlphaBeta] | None = None
    nvlink_domain_gpus: int | None = Field(
        default=None, gt=0,
        description="GPUs that share one NVLink switch domain when it spans several nodes (GB200/GB300 NVL72: "
                    "18 trays of 4 GPUs = 72); collectives and sends inside it use NVLink. None: the node")
    intra_node_measured: dict[CollectiveName, AlphaBeta] | None = Field(
        default=None, description="collective laws fitted on microbenchmarks inside the NVLink domain "
                                  "(validation/calibrate_microbench.py); override intra_node.collectives")
    nvls_all_reduce: NvlsLaw | None = Field(
        default=None, description="NVLS all-reduce inside the NVLink domain (needs intra_node.supports_nvls)")
    host_memory_gib: float = Field(gt=0)
    node_overhead_watts: float = Field(default=0, ge=0, description="CPUs, NICs, fans beyond the GPUs")
    source: str
    notes: str | None = None

    @model_validator(mode="after")
    def _domain_is_whole_nodes(self) -> Node:
        if self.nvlink_domain_gpus is not None and self.nvlink_domain_gpus % self.gpus_per_node:
            raise ValueError("nvlink_domain_gpus must be a multiple of gpus_per_node")
        if self.nvls_all_reduce is not None and not self.intra_node.supports_nvls:
            raise ValueError("nvls_all_reduce needs intra_node.supports_nvls")
        links = self.intra_node.link_counts
        if links is not None and len(links) != self.gpus_per_node:
            raise ValueError(f"intra_node.link_counts is {len(links)} square, the node has {self.gpus_per_node} GPUs")
        return self

    @property
    def domain_gpus(self) -> int:
        """GPUs reachable over NVLink (the node, or the NVL72 rack)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def intra_laws(self) -> dict[str, AlphaBeta] | None:
        return self.intra_node_measured or self.intra_node.collectives


class FatTree(Spec):
    """A folded-Clos fabric. ``oversubscription`` 1 is non-blocking; above ``pod_size_nodes``
    traffic shares uplinks that have 1/oversubscription of the injection bandwidth."""

    topology: Literal["fat-tree"] = "fat-tree"
    name: str
    levels: int = Field(ge=1, le=4, description="switch tiers")
    oversubscription: float = Field(default=1.0, ge=1.0)
    pod_size_nodes: int | None = Field(default=None, gt=0, description="nodes below one non-blocking pod")
    switch_latency_us: float = Field(ge=0)
    source: str
    notes: str | None = None

    @model_validator(mode="after")
    def _pod_needed(self) -> FatTree:
        if self.oversubscription > 1 and self.pod_size_nodes is None:
            raise ValueError("pod_size_nodes is required when oversubscription > 1")
        return self


class RailOptimized(Spec):
    """A rail-optimised fabric (NVIDIA DGX SuperPOD reference architecture): NIC i of every node
    connects to leaf switch i of its scalable unit (a *rail*), so traffic between GPUs of the same
    local index inside one unit crosses one switch; spines join the units (and the rails). NCCL's
    rings and trees pair GPUs of equal local index across nodes, and PXN moves other traffic over
    NVLink to the rail's GPU first, so collectives see one switch hop inside a unit and three
    between units. Above ``rail_group_nodes`` traffic shares the spine uplinks (1/oversubscription
    of the injection bandwidth)."""

    topology: Literal["rail-optimized"] = "rail-optimized"
    name: str
    rail_group_nodes: int = Field(gt=0, description="nodes of one scalable unit (DGX SuperPOD: 32)")
    oversubscription: float = Field(default=1.0, ge=1.0, description="at the spine, between units")
    switch_latency_us: float = Field(ge=0)
    source: str
    notes: str | None = None

    @property
    def pod_size_nodes(self) -> int:
        return self.rail_group_nodes


class WanTransport(Spec):
    """What a communication library's connections get out of a wide-area link (per connection):
    the rate is ``min(link rate · bandwidth_efficiency, max_flow_gbit_per_s, window_bytes / RTT)``,
    the window bound of a TCP-like transport (Mathis et al. 1997, "The macroscopic behavior of the
    TCP congestion avoidance algorithm", throughput <= window / RTT). A connection that starts cold
    first doubles its window from ``initial_window_bytes`` once per round trip (slow start; Cardwell,
    Savage & Anderson 2000, "Modeling TCP latency", Sec. 2.1), which costs about
    ``RTT · (log2(target / initial_window) - 1)`` over the steady rate (target: the smaller of the
    bandwidth-delay product and the window). Training keeps its connections busy (warm): the
    simulator's sends pay no slow start; ``cold_start_s`` prices a lone message (a benchmark)."""

    name: str = Field(description="e.g. nccl-sockets, gloo-tcp")
    bandwidth_efficiency: float = Field(default=1.0, gt=0, le=1, description="achieved / link rate on a long transfer")
    max_flow_gbit_per_s: float | None = Field(
        default=None, gt=0, description="one connection's rate limit (e.g. a cloud's per-flow cap); None: none")
    window_bytes: float | None = Field(default=None, gt=0, description="bytes in flight per connection; None: no bound")
    initial_window_bytes: float | None = Field(
        default=None, gt=0, description="a cold connection's first window (slow start); None: no slow start")
    source: str
    fitted_on: str | None = None


class WanRegion(Spec):
    """A site of a wide-area cluster: ``nodes`` consecutive nodes (nodes fill regions in order)."""

    name: str = Field(min_length=1)  # '' was refused only as a link's "unknown region 'frankfurt' (regions: virginia, )"
    nodes: PositiveInt


class WanLink(Spec):
    """The link between two regions: one-way delay and bandwidth, ``src`` to ``dst`` (and back,
    unless ``both_directions`` is false)."""

    src: str
    dst: str
    delay_ms: float = Field(ge=0, description="one-way delay")
    bandwidth_gbit_per_s: float = Field(gt=0)
    both_directions: bool = True


class WideArea(Spec):
    """Regions (or single nodes) joined by links with a one-way delay and a bandwidth per ordered pair,
    given either as matrices (row = sender, column = receiver; the diagonal is ignored) or as a list of
    region pairs (a region model, e.g. DS3Lab's AWS region pairs). Without ``regions`` every node is its
    own region and the matrices are per node (DS3Lab's simulate_* cases). Inside a region nodes talk over
    ``intra_region`` (a catalog fabric name or an inline fat tree / rail-optimised fabric).
    simulator/cost/wan.py maps it onto ports: one directional port per region pair that every flow
    crossing it shares, and the delay as each crossing's propagation time."""

    topology: Literal["wan"]
    name: str
    regions: list[WanRegion] | None = Field(default=None, min_length=1, description="None: one region per node")
    intra_region: str | FatTree | RailOptimized = "fat-tree"
    delay_ms: list[list[float]] | None = Field(default=None, description="one-way delay, row = sender")
    bandwidth_gbit_per_s: list[list[float]] | None = Field(default=None, description="row = sender")
    links: list[WanLink] | None = Field(default=None, min_length=1, description="region pairs (instead of matrices)")
    transport: WanTransport | None = Field(default=None, description="None: flows get the links' full rate")
    source: str
    notes: str | None = None

    @field_validator("delay_ms", "bandwidth_gbit_per_s")
    @classmethod
    def _square(cls, matrix, info):
        if matrix is None:
            return matrix
        n = len(matrix)
        if n < 1 or any(len(row) != n for row in matrix):
            raise ValueError(f"must be a square matrix (got {n} rows of lengths {[len(r) for r in matrix]})")
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                if i == j:
                    continue
                if info.field_name == "delay_ms" and value < 0:
                    raise ValueError(f"delay [{i}][{j}] is negative ({value})")
                if info.field_name == "bandwidth_gbit_per_s" and value <= 0:
                    raise ValueError(f"bandwidth [{i}][{j}] must be positive ({value})")
        return matrix

    @field_validator("regions")
    @classmethod
    def _unique_names(cls, regions):
        if regions is not None:
            names = [r.name for r in regions]
            if len(set(names)) != len(names):
                raise ValueError(f"region names must be unique, got {names}")
        return regions

    @model_validator(mode="after")
    def _one_form(self) -> WideArea:
        matrices = (self.delay_ms is not None, self.bandwidth_gbit_per_s is not None)
        if self.links is not None:
            if any(matrices):
                raise ValueError("give either links or the delay_ms/bandwidth_gbit_per_s matrices, not both")
            if self.regions is None:
                raise ValueError("links name regions: regions are required with links")
            names = [r.name for r in self.regions]
            given = set()
            for i, link in enumerate(self.links):
                for side, end in (("src", link.src), ("dst", link.dst)):
                    if end not in names:  # the link's own field named, as a field validator's error would be
                        raise ValueError(f"links.{i}.{side}: unknown region {end!r} (regions: {', '.join(names)})")
                given.add((link.src, link.dst))
                if link.both_directions:
                    given.add((link.dst, link.src))
            missing = [f"{a}->{b}" for a in names for b in names if a != b and (a, b) not in given]
            if missing:
                raise ValueError(f"links: no link for {', '.join(missing[:4])}")
            return self
        if not all(matrices):
            raise ValueError("needs links, or both delay_ms and bandwidth_gbit_per_s matrices")
        if len(self.delay_ms) != len(self.bandwidth_gbit_per_s):
            raise ValueError("delay_ms and bandwidth_gbit_per_s must have the same size")
        if self.regions is not None and len(self.delay_ms) != len(self.regions):
            raise ValueError(f"delay_ms is {len(self.delay_ms)}x{len(self.delay_ms)} but there are "
                             f"{len(self.regions)} regions")
        return self

    def pair_matrices(self) -> tuple[list[list[float]], list[list[float]]]:
        """(one-way delay ms, bandwidth Gb/s) per ordered pair of regions (or nodes), row = sender."""
        if self.links is None:
            return self.delay_ms, self.bandwidth_gbit_per_s
        index = {r.name: i for i, r in enumerate(self.regions)}
        n = len(index)
        delay = [[0.0] * n for _ in range(n)]
        bandwidth = [[float("inf")] * n for _ in range(n)]
        for link in self.links:
            pairs = [(link.src, link.dst)] + ([(link.dst, link.src)] if link.both_directions else [])
            for a, b in pairs:
                delay[index[a]][index[b]] = link.delay_ms
                bandwidth[index[a]][index[b]] = link.bandwidth_gbit_per_s
        return delay, bandwidth


# simulator/cost/topology.py maps each fabric onto link classes (ports, hops).
def _fabric_kind(value) -> str:
    if isinstance(value, dict):
        kind = value.get("topology", "fat-tree")
        # a tag for any value, so that `topology: null` is answered with the topologies there are (pydantic said
        # "Unable to extract tag using discriminator _fabric_kind()" for None)
        return "null" if kind is None else kind if isinstance(kind, str) else str(kind)
    return getattr(value, "topology", "fat-tree")


Fabric = Annotated[Annotated[FatTree, Tag("fat-tree")] | Annotated[RailOptimized, Tag("rail-optimized")]
                   | Annotated[WideArea, Tag("wan")], Discriminator(_fabric_kind)]
FABRIC_TYPES = (FatTree, RailOptimized, WideArea)
