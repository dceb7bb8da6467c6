"""Time of one kernel on one accelerator: a roofline with calibrated efficiencies.

    t(op) = max(flops / (peak · eff_gemm(size)), bytes / (hbm_bw · eff_mem)) + launch overhead

``eff_gemm`` is the accelerator's GEMM efficiency curve for the precision the GEMM runs in
(efficiency vs GFLOP of one GEMM, interpolated in log10 size; ``gemm_curves[precision]`` where
the spec has one, else ``gemm_curve``), times ``in_training_gemm_factor`` (a step's GEMMs against
the microbenchmark's best shapes) and ``misaligned_gemm_factor`` when a dimension is not a
multiple of 16 bytes. A fused attention kernel (FlashAttention) uses the spec's
``attention`` efficiency by pass, sequence length, head size and causality where the spec has
one; otherwise (and for the materialised QK^T / AV GEMMs) the GEMM curve at the size of one
GEMM times ``attention_efficiency_factor`` (or, where a calibrated profile fitted it per size,
``attention_efficiency_by_gemm_macs`` at the op's batch·m·n·k: hardware_specs.schema.SizedEfficiency). Where the constants come from is recorded in the
spec (``source`` / ``fitted_on`` per curve; see simulator/cost/provenance.py). Each distinct op
shape is priced once (memoized). A convolution pass (``op.conv``) is priced by the spec's
``conv_efficiency`` for the precision where it has one (simulator/cost/conv.py: efficiency by
output channels, reduction length and window class), else as a GEMM on the curve. A pooling or
concatenation kernel runs at the spec's ``memory_kernels`` efficiency for its class where it has one
(simulator/cost/memory_kernels.py; by the forward op's bytes where ``by_kernel_forward_bytes`` has the class); a broadcast elementwise kernel is priced by its elements, at the
bytes they take in fp32 (``element_bound_bytes``: PyTorch's non-vectorized broadcast loop).
A convolution pass also takes ``bytes_moved x conv_sm_cycles_per_byte / (sm_count x sm_clock)`` where a framework
profile sets that constant: work its framework runs beside the convolution kernel at the SMs' instruction rate,
neither tensor-core- nor HBM-bound (Lambda's fp16 ResNet-50: the time per image beyond the catalog's kernels is
the same count of SM cycles on V100, A100 and H100 fit rows; validation/modern/cnn.py).
A dense GEMM (a linear layer) in a precision the spec lists in ``linear_as_pointwise_conv`` is priced as the
1x1 convolution pass it is (M rows x N out features x K in features: the implicit GEMM of a 1x1 convolution
over M pixels; Chetlur et al. 2014, Sec. 3) on that precision's ``conv_efficiency``: the A100's TF32, whose
only GEMM evidence is DeepPool's convolution layers (module docstring of validation/deeppool_vit.py says why
the shape model, not the size curve fitted on the same rows, is the one a linear reads), and only where the
layer's forward (M, N, K) lies in ``linear_as_pointwise_conv_range`` (the shapes of the rows the rule was chosen
on, each dimension between its least and greatest): outside it, the precision's GEMM size curve (assumed there).
An op's ``executed_fraction`` scales the FLOPs its kernel runs (a causal fused attention kernel
skips the masked tiles) while the counted FLOPs stay as they are. Likewise a fused attention kernel
runs the head size it is compiled for (hardware_specs.schema.KERNEL_HEAD_DIMS: a head of 112 runs
FlashAttention-2's or Triton's 128 kernel, zero-padded): 128/112 of the counted FLOPs at that kernel's
rate; the GEMM-curve estimate takes FlashAttention-2's sizes (``FALLBACK_ATTENTION_KERNEL``, assumed).
An MoE layer's expert GEMMs (``batch`` = the local experts, each on its own tokens) are priced as one GEMM of
a group's shape on the curve, times the groups; where the spec has a ``grouped_gemm`` entry for the GEMM's
precision (the grouped kernel a framework runs: ``torch._grouped_mm``, torchao's MXFP8 grouped GEMM) that
time is over the entry's ``level``, plus its ``per_group_us`` per group, and a block-scaled recipe's
quantisation runs at its ``quantise_efficiency`` (hardware_specs.schema.GroupedGemmEfficiency).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from hardware_specs.schema import Accelerator, kernel_head_dim
from simulator.cost.conv import conv_efficiency, grouped_conv_time_s, is_grouped
from simulator.cost.memory_kernels import element_bound_bytes, memory_kernel_class
from workloads.graph import BYTES_PER_ELEMENT, Op, gemm_class, is_fused_attention

#: The kernel whose compiled head sizes a fused attention priced by the GEMM curve (no measured kernel on the
#: part) is taken to run: FlashAttention-2, what PyTorch SDPA and most frameworks call (assumed).
FALLBACK_ATTENTION_KERNEL = "FlashAttention-2"
ALIGNMENT_BYTES = 16  # tensor-core tiles need 16-byte aligned leading dimensions (cuBLAS / hipBLASLt)
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5, "fp64": 8, "fp8_block": 1,
                 "mxfp8": 1, "nvfp4": 0.5}


def curve_points(accelerator: Accelerator, precision: str | None = None):
    """The GEMM curve of ``precision`` (the precision's own where the spec has one)."""
    eff = accelerator.efficiency
    if precision is not None and precision in eff.gemm_curves:
        return eff.gemm_curves[precision].points
    return eff.gemm_curve


def gemm_efficiency(accelerator: Accelerator, gflop: float, precision: str | None = None) -> float:
    """Efficiency of one GEMM of ``gflop`` GFLOP, log-linear between the curve's points."""
    points = curve_points(accelerator, precision)
    if gflop <= points[0].gflop:
        return points[0].efficiency
    if gflop >= points[-1].gflop:
        return points[-1].efficiency
    for lo, hi in zip(points, points[1:], strict=False):
        if lo.gflop <= gflop <= hi.gflop:
            frac = (math.log10(gflop) - math.log10(lo.gflop)) / (math.log10(hi.gflop) - math.log10(lo.gflop))
            return lo.efficiency + frac * (hi.efficiency - lo.efficiency)
    return points[-1].efficiency  # unreachable: the curve is sorted


def is_aligned(m: int, n: int, k: int, precision: str, weight_grad: bool = False) -> bool:
    """Whether the GEMM's row strides are multiples of 16 bytes of the element type (the tensor cores'
    TMA loads need 16-byte aligned strides: NVIDIA, Matrix Multiplication Background User's Guide,
    'Tensor Core Requirements'; CUDA Programming Guide, cuTensorMapEncodeTiled).

    The strides are the dimensions a stored row-major operand is laid out along, not the row count:
    C[m,n] = A[m,k]·B[k,n] (torch.bmm, the H100 d_ff sweep the factor is fitted on: K and N), a linear
    layer's forward and input gradient (rows = the tokens: n and k), a weight gradient dW = X^T·dY
    (``weight_grad``: both inputs stored token-major, so the tokens are its k and its strides m and n).
    A token count (an MoE expert's, say) is never a stride: any count runs aligned."""
    step = max(1, int(ALIGNMENT_BYTES / ELEMENT_BYTES.get(precision, 2)))
    strides = (m, n) if weight_grad else (n, k)
    return all(d % step == 0 for d in strides)


def kernel_gemm_efficiency(accelerator: Accelerator, m: int, n: int, k: int, precision: str,
                           weight_grad: bool = False) -> float:
    """A GEMM kernel's efficiency as a microbenchmark times it: curve x alignment (no in-step factor)."""
    eff = gemm_efficiency(accelerator, 2.0 * m * n * k / 1e9, precision)
    if not is_aligned(m, n, k, precision, weight_grad):
        eff *= accelerator.efficiency.misaligned_gemm_factor
    return eff


def attention_pass(op_name: str) -> str:
    """"fwd" for a forward attention kernel, "bwd" for its gradient (named ``*.grad``)."""
    return "bwd" if op_name.endswith(".grad") else "fwd"


# Bytes of HBM traffic per element to quantise one GEMM input, by FP8 recipe: read bf16 (2 B),
# write the low-precision copy (1 B fp8, 0.5 B fp4) and its scales; current scaling reads the
# tensor once more for its amax before the cast (Transformer Engine Float8CurrentScaling);
# delayed scaling takes its amax in the cast itself (Micikevicius et al. 2022, arXiv:2209.05433
# Sec. 4.3); rowwise scaling (torchao) likewise. Scales: fp32 per 1x128 block (DeepSeek-V3 Sec. 3.3.1), E8M0 per 32 (OCP MX v1.0),
# E4M3 per 16 (NVFP4). NVFP4's second level, one fp32 scale per tensor (NVIDIA, "Pretraining Large Language
# Models with NVFP4", arXiv:2509.25149), is set from the tensor's amax: Transformer Engine's NVFP4
# quantiser reads the tensor once for it before the cast, as current scaling does (2 B more, a second kernel);
# its random Hadamard transform of the weight-gradient inputs (16x16, same paper) runs inside those
# kernels (no bytes of its own: assumed).
QUANTISE_BYTES_PER_ELEMENT = {"delayed": 3.0, "current": 5.0, "rowwise": 5.0, "blockwise": 3.0 + 4 / 128,
                              "mxfp8": 3.0 + 1 / 32, "nvfp4": 4.5 + 1 / 16}
QUANTISE_KERNELS = {"delayed": 1, "current": 2, "rowwise": 2, "blockwise": 1, "mxfp8": 1, "nvfp4": 2}
# rowwise (torchao): an amax pass and a cast like current scaling (a per-row fp32 scale, 4/K B per element,
# left out); its GEMM (CUTLASS / hipBLASLt row-scaled FP8) was not measured: no spec holds an fp8_rowwise curve
RECIPE_CURVE = {"delayed": "fp8", "current": "fp8", "rowwise": "fp8_rowwise", "blockwise": "fp8_block",
                "mxfp8": "mxfp8", "nvfp4": "nvfp4"}


#: Block-scaled recipes whose GEMM, where the spec has no curve of its own, runs at the part's datasheet peak of
#: its element type times the fraction of peak the part's per-tensor fp8 curve reaches at the same shape (a rule:
#: the same tensor-core pipeline and tile shapes at the narrower type; simulator/cost/provenance.py marks it
#: derived): MXFP8 on the fp8 peak, NVFP4 on the fp4 peak.
BLOCK_SCALED_PEAK = {"mxfp8": "fp8", "nvfp4": "fp4"}


def fp8_curve_key(accelerator: Accelerator, recipe: str) -> str:
    """The GEMM curve an FP8 recipe's GEMMs run on: the recipe's own where the spec has one, else fp8."""
    key = RECIPE_CURVE[recipe]
    return key if key in accelerator.efficiency.gemm_curves else "fp8"


def as_pointwise_pass(op: Op) -> Op:
    """A dense GEMM op (``C[m,n] = A[m,k]·B[k,n]``) tagged as the 1x1 convolution pass it is: a linear
    layer's forward (m rows, n out features, k in features), its data gradient (``*.dgrad``: n = in
    features, k = out features) and its weight gradient (``*.wgrad``: m = in features, k = rows) are the
    forward, data- and weight-gradient implicit GEMMs of a 1x1, stride-1 convolution over m pixels
    (workloads/networks/builder.py ``_gemm_ops``; simulator/cost/conv.py reads them the same way)."""
    pass_ = "dgrad" if op.name.endswith(".dgrad") else "wgrad" if op.name.endswith(".wgrad") else "fwd"
    return replace(op, conv=(pass_, 1, 1, 1))


def forward_shape(op: Op) -> tuple[int, int, int]:
    """(M rows, N out features, K in features) of the linear layer a dense GEMM op belongs to, whichever pass it
    is: a data gradient runs (m, n, k) = (M, K, N), a weight gradient (K, N, M) (workloads/graph.py
    ``backward_gemms``; workloads/networks/builder.py ``_gemm_ops``), so all three passes of one layer fall on
    the same side of a :class:`~hardware_specs.schema.GemmShapeRange`."""
    if op.name.endswith(".dgrad"):
        return op.m, op.k, op.n
    if op.name.endswith(".wgrad"):
        return op.k, op.n, op.m
    return op.m, op.n, op.k


class ComputeModel:
    """Prices ops for one accelerator and one precision (fp8 GEMMs use the fp8 peak, or the fp4 peak
    under the nvfp4 recipe, and pay their inputs' quantisation as memory-bound work). ``tf32``: an fp32
    run whose GEMMs and convolutions use the TF32 tensor cores (``TrainingSpec.tf32``): the tf32 peak
    and the tf32 GEMM curve where the spec has one (else the accelerator's default curve, as a fraction
    of that peak: an assumption the provenance line names)."""

    def __init__(self, accelerator: Accelerator, precision: str, fp8_gemms=("attention_proj", "mlp", "experts"),
                 fp8_recipe: str = "delayed", tf32: bool = False):
        self.accelerator = accelerator
        self.precision = precision
        self.fp8_recipe = fp8_recipe
        low = BLOCK_SCALED_PEAK.get(fp8_recipe, precision) if precision == "fp8" else precision
        if tf32 and precision == "fp32":
            low = "tf32"
        self.peak_flops = accelerator.peak_tflops[low] * 1e12
        self.gemm_key = fp8_curve_key(accelerator, fp8_recipe) if precision == "fp8" else low
        # FP8 (Micikevicius et al. 2022; Transformer Engine): the GEMMs of the classes in
        # ``fp8_gemms`` run at the fp8 peak and cast their two inputs to fp8 (read 2 B, write 1 B
        # per element, plus the amax reduction folded into the same pass) as extra memory-bound
        # work; attention and the other GEMMs (LM head, router by default) stay in bf16.
        self.fp8 = precision == "fp8"
        self.fp8_gemms = frozenset(fp8_gemms)
        self.bf16_peak_flops = (accelerator.peak_tflops.get("bf16", accelerator.peak_tflops[precision]) * 1e12
                                     if self.fp8 else self.peak_flops)
        eff = accelerator.efficiency
        self.high_precision = "bf16" if self.fp8 else low
        self.in_training = eff.in_training_gemm_factor
        self.attention = eff.attention
        self.mem_bw = accelerator.hbm_bandwidth_gb_per_s * 1e9 * eff.memory_bound_efficiency
        self.hbm_bw = accelerator.hbm_bandwidth_gb_per_s * 1e9
        self.memory_kernels = eff.memory_kernels.by_kernel if eff.memory_kernels is not None else {}
        # ... by the forward op's bytes where a calibrated profile fitted them per size (SizedEfficiency)
        self.memory_kernels_by_size = (eff.memory_kernels.by_kernel_forward_bytes if eff.memory_kernels is not None
                                       else {})
        # attention_efficiency_factor by one attention GEMM's multiply-adds, where fitted per size
        self.attention_by_size = eff.attention_efficiency_by_gemm_macs
        self.optimizer_bw = accelerator.hbm_bandwidth_gb_per_s * 1e9 * (
            eff.optimizer_efficiency if eff.optimizer_efficiency is not None else eff.memory_bound_efficiency)
        self.launch_s = eff.kernel_launch_overhead_us * 1e-6
        # ZeRO-3 / FSDP host work per parameter gather and per gradient reduce beyond the priced collective and
        # copies (an eager CPU/gloo profile fitted by `clustersim calibrate`; hardware_specs.schema); 0 elsewhere
        self.zero3_gather_host_s = (eff.zero3_gather_host_us or 0.0) * 1e-6
        self.zero3_reduce_host_s = (eff.zero3_reduce_host_us or 0.0) * 1e-6
        # expert GEMMs as one grouped kernel, per the curve key of the recipe they run in (mxfp8, not the fp8
        # curve it is priced on): hardware_specs.schema.GroupedGemmEfficiency
        self.grouped = eff.grouped_gemm
        self.grouped_key = RECIPE_CURVE[fp8_recipe] if self.fp8 else self.gemm_key
        self.activation_bytes = BYTES_PER_ELEMENT.get(precision, 2)  # activations stay 16-bit under fp8 GEMMs
        self._time = lru_cache(maxsize=None)(self._time_uncached)
        # convolutions by shape where the spec has a model for this precision (simulator/cost/conv.py)
        self.conv_model = None if self.fp8 else eff.conv_efficiency.get(self.gemm_key)
        # dense GEMMs (linear layers) as 1x1 convolution passes where the spec says so (linear_as_pointwise_conv)
        self.linear_conv_model = (self.conv_model if self.conv_model is not None
                                  and self.gemm_key in eff.linear_as_pointwise_conv else None)
        # ... only within the forward shapes the rule was chosen on, where the spec bounds it; outside, the size curve
        self.linear_conv_range = eff.linear_as_pointwise_conv_range.get(self.gemm_key)
        self._conv_time = lru_cache(maxsize=None)(self._conv_time_uncached)
        # a direct (grouped / depthwise) convolution on the CUDA cores: the fp32 non-tensor peak (assumed)
        self.cuda_core_flops = accelerator.peak_tflops.get("fp32", accelerator.peak_tflops[precision]) * 1e12
        # ... at the direct kernels' own bandwidth where the spec has one (hardware_specs.schema.DirectConvEfficiency)
        self.direct_conv_bw = (self.hbm_bw * eff.direct_conv.bandwidth_efficiency if eff.direct_conv is not None
                               else self.mem_bw)
        # SM-bound work beside each convolution pass (a framework profile's conv_sm_cycles_per_byte), in seconds
        # per byte of the pass's operands on this part's SMs and clock
        self.conv_sm_s_per_byte = (eff.conv_sm_cycles_per_byte / accelerator.sm_cycles_per_s
                                   if eff.conv_sm_cycles_per_byte > 0 else 0.0)

    def time_s(self, op: Op) -> float:
        """Seconds for one op (collectives are priced by the network, not here); an op of a measured
        per-layer profile (``op.measured_s``) takes its measured time."""
        if op.kind == "collective":
            raise ValueError(f"{op.name} is a collective: the network model prices it")
        if op.measured_s is not None:
            return op.measured_s
        if self.conv_sm_s_per_byte and op.conv is not None:
            return self._kernel_time_s(op) + op.bytes_moved * self.conv_sm_s_per_byte
        if op.kernels > 1:  # a loop's launches (Op.kernels): the bytes once, the launch overhead each time
            return self._kernel_time_s(op) + (op.kernels - 1) * self.launch_s
        return self._kernel_time_s(op)

    def prices_linear_as_pointwise(self, op: Op) -> bool:
        """Whether a dense GEMM op (a linear layer's pass; not attention, not MoE experts) is priced as a 1x1
        convolution pass (``linear_as_pointwise_conv``): only where its layer's forward (M, N, K) lies in the
        spec's ``linear_as_pointwise_conv_range`` for this precision, when it has one; else on the GEMM curve."""
        if op.conv is not None or op.kind != "gemm" or self.linear_conv_model is None or gemm_class(op) == "experts":
            return False
        return self.linear_conv_range is None or self.linear_conv_range.contains(*forward_shape(op))

    def _kernel_time_s(self, op: Op) -> float:
        """:meth:`time_s` of the op's kernel alone."""
        if is_grouped(op):  # grouped / depthwise: not one dense implicit GEMM (simulator/cost/conv.py)
            dense_s = self._conv_time(op) if self.conv_model is not None else self._time(
                "gemm", op.flops, op.bytes_moved, op.m, op.n, op.k, op.batch)
            return grouped_conv_time_s(op, dense_s, self.cuda_core_flops, self.direct_conv_bw, self.launch_s,
                                       on_cuda_cores=self.gemm_key == "fp32")
        if op.conv is not None and op.kind == "gemm" and self.conv_model is not None:
            return self._conv_time(op)
        if self.prices_linear_as_pointwise(op):
            return self._conv_time(as_pointwise_pass(op))
        if op.kind == "memory":
            moved = element_bound_bytes(op.name, op.bytes_moved, self.activation_bytes)
            kernel_class = memory_kernel_class(op.name)
            sized = self.memory_kernels_by_size.get(kernel_class)
            if sized is not None:  # at the forward's bytes: a .grad op moves twice them (graph._backward_of)
                eff = sized.at(op.bytes_moved / 2 if op.name.endswith(".grad") else op.bytes_moved)
            else:
                eff = self.memory_kernels.get(kernel_class)
            if eff is not None:  # a pooling / concatenation kernel at its own measured efficiency
                return moved / (self.hbm_bw * eff) + self.launch_s
            if moved != op.bytes_moved:  # a broadcast kernel: element-bound (simulator/cost/memory_kernels.py)
                return moved / self.mem_bw + self.launch_s
        kind = op.kind
        if kind == "gemm" and self.fp8 and gemm_class(op) not in self.fp8_gemms:
            kind = "gemm_bf16"  # a GEMM kept in higher precision in an fp8 run
        flops, k = op.flops * op.executed_fraction, op.k
        if kind == "attention" and is_fused_attention(op):
            if self.attention is not None:
                kind = "flash_" + attention_pass(op.name) + ("_causal" if op.executed_fraction < 1 else "")
            else:  # the GEMM-curve estimate of a fused kernel: FlashAttention-2's compiled head sizes (assumed)
                k = kernel_head_dim(FALLBACK_ATTENTION_KERNEL, op.k)
                flops *= k / op.k
        grouped = kind.startswith("gemm") and bool(self.grouped) and gemm_class(op) == "experts"
        return self._time(kind, flops, op.bytes_moved, op.m, op.n, k, op.batch, op.name.endswith(".wgrad"), grouped)

    def misaligned_gemm(self, op: Op) -> bool:
        """Whether pricing ``op`` multiplies its efficiency by the spec's ``misaligned_gemm_factor``: the op reaches
        :func:`kernel_gemm_efficiency` (:meth:`_kernel_time_s`'s routes, read here without pricing: not a measured,
        collective or memory op, not a convolution on the spec's convolution model, not a linear priced as a 1x1
        convolution, not a fused attention on the attention kernel model) with a row stride :func:`is_aligned`
        refuses in the precision the kernel runs in. simulator/cost/provenance.py lists the factor's provenance for
        a run that has such a GEMM (tests/test_misaligned_provenance.py checks this against the priced times)."""
        if op.kind not in ("gemm", "attention") or op.measured_s is not None:
            return False
        k = op.k
        if is_grouped(op):
            if self.conv_model is not None:
                return False
            return not is_aligned(op.m, op.n, k, self.gemm_key)  # _time("gemm", ...) with weight_grad unset
        if (op.conv is not None and op.kind == "gemm" and self.conv_model is not None) \
                or self.prices_linear_as_pointwise(op):
            return False
        kind = op.kind
        if kind == "gemm" and self.fp8 and gemm_class(op) not in self.fp8_gemms:
            kind = "gemm_bf16"
        if kind == "attention" and is_fused_attention(op):
            if self.attention is not None:
                return False
            k = kernel_head_dim(FALLBACK_ATTENTION_KERNEL, op.k)
        precision = self.gemm_key if kind == "gemm" else self.high_precision
        return not is_aligned(op.m, op.n, k, precision, op.name.endswith(".wgrad"))

    def _time_uncached(self, kind: str, flops: float, bytes_moved: float, m: int, n: int, k: int, batch: int,
                       weight_grad: bool = False, grouped: bool = False) -> float:
        memory_s = bytes_moved / self.mem_bw
        if kind == "memory":
            return memory_s + self.launch_s
        if kind.startswith("flash_"):
            # the fused kernel: n is the key length, k the head size (workloads/graph.py)
            eff = self.attention.efficiency(kind.split("_")[1], n, k, kind.endswith("_causal"))
            return max(flops / (self.bf16_peak_flops * eff), memory_s) + self.launch_s
        gemm_precision = self.gemm_key if kind == "gemm" else self.high_precision
        eff = kernel_gemm_efficiency(self.accelerator, m, n, k, gemm_precision, weight_grad) * self.in_training
        if kind == "attention":
            eff *= (self.attention_by_size.at(batch * m * n * k) if self.attention_by_size is not None
                    else self.accelerator.efficiency.attention_efficiency_factor)
            return max(flops / (self.bf16_peak_flops * eff), memory_s) + self.launch_s
        entry = self.grouped.get(self.grouped_key if kind == "gemm" else self.high_precision) if grouped else None
        scheduling_s = 0.0
        if entry is not None:  # one grouped kernel over the batch's groups (GroupedGemmEfficiency)
            eff *= entry.level
            scheduling_s = batch * entry.per_group_us * 1e-6
        if kind == "gemm_bf16":
            return max(flops / (self.bf16_peak_flops * eff), memory_s) + self.launch_s + scheduling_s
        gemm_s = max(flops / (self.peak_flops * eff), memory_s) + self.launch_s + scheduling_s
        if self.fp8:
            recipe = self.fp8_recipe
            quantise_bw = self.mem_bw * (entry.quantise_efficiency if entry and entry.quantise_efficiency else 1.0)
            gemm_s += (batch * (m * k + k * n) * QUANTISE_BYTES_PER_ELEMENT[recipe] / quantise_bw
                       + QUANTISE_KERNELS[recipe] * self.launch_s)
        return gemm_s

    def _conv_time_uncached(self, op: Op) -> float:
        """A convolution pass at the spec's shape efficiency (``conv_efficiency[precision]``, fitted as
        convolution layers in training: no in-training or alignment factor on top)."""
        eff = conv_efficiency(self.conv_model, op)
        return max(op.flops / (self.peak_flops * eff), op.bytes_moved / self.mem_bw) + self.launch_s

    def ops_time_s(self, ops) -> float:
        return sum(self.time_s(op) for op in ops if op.kind != "collective")

    def layer_time_s(self, layer, phase: str) -> float:
        """Seconds of one layer-graph layer's ``phase`` ("forward" or "backward"): its measured time
        when the graph came from a per-layer profile (``Layer.measured_forward_s``/``_backward_s``,
        ``workloads.networks.profiles``), else its ops priced by :meth:`ops_time_s`."""
        measured = layer.measured_forward_s if phase == "forward" else layer.measured_backward_s
        if measured is not None:
            return measured
        return self.ops_time_s(layer.forward if phase == "forward" else layer.backward)

    def copy_s(self, nbytes: float) -> float:
        """A device copy of ``nbytes``: read and write once."""
        return 2 * nbytes / self.mem_bw + self.launch_s if nbytes > 0 else 0.0

    def add_into_s(self, nbytes: float) -> float:
        """``x += y`` over ``nbytes`` of x: read both, write x (a memory-bound kernel)."""
        return 3 * nbytes / self.mem_bw + self.launch_s if nbytes > 0 else 0.0

    def optimizer_step_s(self, local_params: float, bytes_per_param_touched: float) -> float:
        """Optimizer step as a streaming kernel over the local (possibly sharded) parameters, at
        the optimizer's own achieved bandwidth (``optimizer_efficiency``; measured by the harness's
        fused-Adam row, where a streaming step over four states runs faster than the mean of the
        activation kernels ``memory_bound_efficiency`` describes)."""
        return local_params * bytes_per_param_touched / self.optimizer_bw + self.launch_s
