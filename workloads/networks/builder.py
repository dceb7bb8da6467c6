"""A small tracer that builds a :class:`~workloads.layer_graph.LayerGraph` layer by layer.

Family builders (ResNet, VGG, Inception, ViT, U-Net, LSTMs, BERT) and the PyTorch importer call
one method per layer (``conv2d``, ``batchnorm``, ``relu``, ``linear``...) on :class:`Tensor` s;
each call appends one :class:`~workloads.layer_graph.Layer` with its kernels, saved and output
bytes, and returns the output tensor. Its parameters are its kernels' (issue 19: one statement): a
GEMM or convolution op holds its k x n weight(s) and bias, a norm's op its γ and β, an embedding's
gather its table (:attr:`workloads.graph.Op.params`).

Kernels. A convolution is an implicit GEMM (Chetlur et al. 2014, cuDNN, Sec. 3): M = N·H_out·W_out,
N = C_out/groups, K = C_in·kh·kw/groups, ``groups`` of them; FLOPs 2·M·N·K. Its backward is a
data gradient (same M·N·K) and a weight gradient (same M·N·K); the first layer has no data
gradient (its input needs none, and PyTorch skips it). Normalisations, activations, pooling,
residual adds and concatenations are memory-bound ops: bytes read plus written.

Saved bytes, as PyTorch autograd saves them (``derivatives.yaml``): a convolution and a linear
layer save their input; batch norm saves its input and two fp32 per-channel statistics; layer norm
its input and two fp32 per-row statistics; ReLU saves its output; GELU and average pooling their
input; max pooling its input and int64 indices; dropout (on a GPU) a one-byte mask; adds,
concatenations and views nothing. A tensor read by several layers gets autograd's gradient
sums in its producer's backward when the graph is taken (:meth:`NetBuilder.output`). A tensor saved by two layers (a ReLU's output that the next
convolution saves again, ``inplace=True`` ReLUs writing over their input) is one storage: only
the first layer that saves a storage counts its bytes, so the sum over layers is the memory.
Weights saved for backward are parameters (counted as weights), not activations. Under mixed
precision the bf16/fp16 cast copies of the weights that autocast keeps are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import count

from simulator.errors import ConfigError
from workloads.graph import Op, ShardShape
from workloads.layer_graph import GRADIENT_SUM, Layer, LayerGraph, with_gradient_sums

FP32_BYTES = 4
INDEX_BYTES = 8   # max-pool indices are int64
MASK_BYTES = 1    # CUDA dropout keeps a bool mask


@dataclass(frozen=True)
class Tensor:
    """An activation of one sample: ``shape`` per sample, made by layer ``producer`` (None for the
    graph's input), held in storage ``storage`` (in-place layers keep their input's)."""

    shape: tuple[int, ...]
    producer: str | None
    storage: int
    storage_numel: int = 0   # elements of the storage when this tensor is a smaller view of it

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def conv_out(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """Output size of a convolution or pooling window (PyTorch ``Conv2d`` docs, floor mode)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class NetBuilder:
    """Appends layers for ``micro_batch`` samples with ``elem_bytes`` bytes per activation element.

    ``shard``: the run's shard (simulator/scenario.py ``Scenario.shard``), whose training settings a layer
    honours where the model's code has the choice: the attention kernel of a self-attention that asks for
    :attr:`attention_kernel` (``training.attention``: ``shard.flash_attention``), the loss's saved logits
    (``training.fused_cross_entropy``). None (a builder of a profile or a validation script): the fused
    attention kernel and PyTorch's cross-entropy."""

    def __init__(self, name: str, micro_batch: int, elem_bytes: int, sample: str = "image",
                 seq_length: int | None = None, shard: ShardShape | None = None):
        self.name = name
        self.batch = micro_batch
        self.elem = elem_bytes
        self.sample = sample
        self.seq_length = seq_length
        self.shard = shard
        self.layers: list[Layer] = []
        self._saved_storages: set[int] = set()
        self._storage_ids = count()
        self._names: set[str] = set()

    @property
    def attention_kernel(self) -> str:
        """The self-attention kernel the run asks for: "flash" (a fused scaled-dot-product kernel) under
        ``training.attention: flash`` or without a shard, "eager" (scores materialised) under standard."""
        return "flash" if self.shard is None or self.shard.flash_attention else "eager"

    # -- bookkeeping -------------------------------------------------------------------------------

    def input(self, *shape: int) -> Tensor:
        """The network's input (per sample)."""
        return Tensor(tuple(shape), None, next(self._storage_ids))

    def _new(self, shape: tuple[int, ...], producer: str) -> Tensor:
        return Tensor(tuple(shape), producer, next(self._storage_ids))

    def _bytes(self, t: Tensor, elem: int | None = None) -> float:
        return float(self.batch * t.numel * (self.elem if elem is None else elem))

    def _save(self, t: Tensor) -> float:
        """Bytes of ``t`` if no earlier layer saved its storage (see the module docstring)."""
        if t.storage in self._saved_storages:
            return 0.0
        self._saved_storages.add(t.storage)
        return float(self.batch * max(t.numel, t.storage_numel) * self.elem)

    def _save_input(self, t: Tensor, op_class: str | None) -> float:
        """Bytes a linear layer of GEMM class ``op_class`` keeps of its input ``t`` for its backward: under
        FP8 with ``training.fp8_saved_inputs`` (the shard's ``fp8_saved_inputs`` names the class) a quantized
        copy of its own, ``fp8_saved_element_bytes`` per element (FP8 and the recipe's scales; Transformer
        Engine's ``Linear`` saves the quantized input, ctx.save_for_backward), a tensor apart from the 16-bit
        storage (which another layer may keep); else ``t``'s storage (:meth:`_save`). As the decoder
        transformer's saved tensors count them (workloads/transformer_graph.py ``block_saved_tensors``)."""
        if op_class is not None and self.shard is not None and op_class in self.shard.fp8_saved_inputs:
            return float(self.batch * t.numel * self.shard.fp8_saved_element_bytes)
        return self._save(t)

    def mark_saved(self, t: Tensor) -> None:
        """Count ``t`` as saved by a layer outside this builder (a profile's block built on a builder
        of its own whose input the line before already saved)."""
        self._saved_storages.add(t.storage)

    def _layer(self, name: str, kind: str, inputs: list[Tensor], out: Tensor, forward: list[Op],
               backward: list[Op] | None = None, saved: float = 0.0,
               splittable: frozenset[str] = frozenset({"batch"}),
               window: tuple[int, int, int, int, int, int] | None = None, saved_input: float = 0.0) -> Tensor:
        if name in self._names:
            raise ConfigError(f"model.layers.{name}", "a second layer has this name")
        self._names.add(name)
        if backward is None:
            backward = [Op(f"{op.name}.grad", "memory", 0.0, 2 * op.bytes_moved) for op in forward]
        producers = tuple(dict.fromkeys(t.producer for t in inputs if t.producer is not None))
        self.layers.append(Layer(
            name=name, kind=kind, forward=tuple(forward), backward=tuple(backward),
            saved_bytes=saved, output_bytes=self._bytes(out), inputs=producers, splittable=splittable,
            input_shape=inputs[0].shape if len(inputs) == 1 else None, output_shape=out.shape, window=window,
            saved_input_bytes=saved_input))
        return out

    def _memory_op(self, name: str, elements: float, reads: float, writes: float, elem: int | None = None,
                   tables: tuple[tuple[int, ...], ...] = ()) -> Op:
        """A memory-bound kernel; ``tables``: the shapes of the learned tensors it holds (a norm's γ and β)."""
        return Op(name, "memory", 0.0, float(elements * (self.elem if elem is None else elem) * (reads + writes)),
                  tables=tables)

    def _gemm_ops(self, name: str, m: int, n: int, k: int, groups: int = 1, input_grad: bool = True,
                  weight_elems: int = 0, weights: int = 0, bias: int = 0,
                  op_class: str | None = None) -> tuple[Op, list[Op]]:
        """A GEMM C[m,n] = A[m,k]·B[k,n] (``groups`` of them) and its backward (dgrad, wgrad); the
        forward op holds ``weights`` learned k x n matrices and ``bias`` bias elements (Op.params). The
        three carry ``op_class`` (workloads/graph.py ``gemm_class``: which of them ``training.fp8_gemms``
        runs in FP8, priced with their inputs' quantisation by simulator/cost/compute.py as a decoder
        transformer's)."""
        e = self.elem
        moved = float(e * groups * (m * k + m * n) + e * weight_elems)
        fwd = Op(name, "gemm", 2.0 * m * n * k * groups, moved, m, n, k, groups, weights=weights, bias=bias,
                 op_class=op_class)
        bwd = []
        if input_grad:
            bwd.append(Op(f"{name}.dgrad", "gemm", 2.0 * m * n * k * groups, moved, m, k, n, groups,
                          op_class=op_class))
        bwd.append(Op(f"{name}.wgrad", "gemm", 2.0 * m * n * k * groups, moved, k, n, m, groups, op_class=op_class))
        return fwd, bwd

    @staticmethod
    def _needs_grad(t: Tensor) -> bool:
        return t.producer is not None

    # -- layers ------------------------------------------------------------------------------------

    def conv2d(self, name: str, x: Tensor, out_channels: int, kernel: int | tuple[int, int], stride: int = 1,
               padding: int | tuple[int, int] = 0, groups: int = 1, bias: bool = False,
               kind: str = "conv2d") -> Tensor:
        """A 2-D convolution as implicit GEMM(s) (see the module docstring); with a bias, its gradient is one
        more kernel, the output gradient summed over batch and pixels."""
        c, h, w = x.shape
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        ph, pw = (padding, padding) if isinstance(padding, int) else padding
        if c % groups or out_channels % groups:
            raise ConfigError(f"model.layers.{name}", f"channels {c}->{out_channels} not divisible by groups {groups}")
        ho, wo = conv_out(h, kh, stride, ph), conv_out(w, kw, stride, pw)
        if ho < 1 or wo < 1:
            raise ConfigError(f"model.layers.{name}", f"input {list(x.shape)} is smaller than the kernel")
        weights = out_channels * (c // groups) * kh * kw
        fwd, bwd = self._gemm_ops(f"{name}.conv", self.batch * ho * wo, out_channels // groups,
                                  c // groups * kh * kw, groups, self._needs_grad(x), weights,
                                  weights=groups, bias=out_channels if bias else 0)
        out = self._new((out_channels, ho, wo), name)
        # implicit GEMM: each pass reads and writes the tensors themselves, not the im2col matrix
        fwd, bwd = _conv_passes(fwd, bwd, kh, kw, stride, self._bytes(x) + self._bytes(out) + self.elem * weights)
        if bias:
            bwd.append(self._memory_op(f"{name}.bias_grad", self.batch * out.numel, 1, 0))
        return self._layer(name, kind, [x], out, [fwd], bwd,
                           self._save(x), frozenset({"batch", "channels", "reduction", "spatial"}),
                           (kh, kw, stride, stride, ph, pw))

    def conv_transpose2d(self, name: str, x: Tensor, out_channels: int, kernel: int, stride: int,
                         bias: bool = True) -> Tensor:
        """A transposed convolution with stride = kernel (U-Net's up-convolution): a GEMM of
        M = N·H·W, N = C_out·k·k, K = C_in (the data gradient of a convolution, run forward)."""
        c, h, w = x.shape
        weights = c * out_channels * kernel * kernel
        fwd, bwd = self._gemm_ops(f"{name}.conv", self.batch * h * w, out_channels * kernel * kernel, c,
                                  1, self._needs_grad(x), weights, weights=1, bias=out_channels if bias else 0)
        out = self._new((out_channels, (h - 1) * stride + kernel, (w - 1) * stride + kernel), name)
        if bias:
            bwd.append(self._memory_op(f"{name}.bias_grad", self.batch * out.numel, 1, 0))
        return self._layer(name, "conv_transpose2d", [x], out, [fwd], bwd, self._save(x),
                           frozenset({"batch", "channels", "reduction", "spatial"}),
                           (kernel, kernel, stride, stride, 0, 0))

    def batchnorm(self, name: str, x: Tensor) -> Tensor:
        """Batch norm in training: statistics (one read), normalise (read, write); backward reads
        the gradient and the input twice and writes one gradient. Saves its input and the fp32
        mean and inverse deviation per channel."""
        n = self.batch * x.numel
        fwd = [self._memory_op(f"{name}.bn", n, 2, 1, tables=((x.shape[0],), (x.shape[0],)))]  # γ, β
        bwd = [self._memory_op(f"{name}.bn.grad", n, 3, 1)]
        saved = self._save(x) + 2 * x.shape[0] * FP32_BYTES
        out = self._new(x.shape, name)
        return self._layer(name, "batchnorm", [x], out, fwd, bwd, saved,
                           frozenset({"batch", "channels", "spatial"}))

    def relu(self, name: str, x: Tensor, inplace: bool = True) -> Tensor:
        """ReLU (saves its output; in place it writes over its input's storage)."""
        n = self.batch * x.numel
        out = Tensor(x.shape, name, x.storage, x.storage_numel) if inplace else self._new(x.shape, name)
        return self._layer(name, "relu", [x], out, [self._memory_op(f"{name}.relu", n, 1, 1)],
                           [self._memory_op(f"{name}.relu.grad", n, 2, 1)], self._save(out),
                           frozenset({"batch", "channels", "spatial"}))

    def activation(self, name: str, x: Tensor, function: str = "gelu") -> Tensor:
        """An elementwise activation: GELU saves its input, tanh and sigmoid their output."""
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        saved = self._save(out) if function in ("tanh", "sigmoid") else self._save(x)
        return self._layer(name, "activation", [x], out, [self._memory_op(f"{name}.{function}", n, 1, 1)],
                           [self._memory_op(f"{name}.{function}.grad", n, 2, 1)], saved,
                           frozenset({"batch", "channels", "spatial", "sequence"}))

    def maxpool(self, name: str, x: Tensor, kernel: int, stride: int, padding: int = 0,
                ceil_mode: bool = False) -> Tensor:
        """Max pooling: saves its input and int64 indices of its output. Forward reads x and writes
        y and the indices; backward reads dy and the indices and writes dx (PyTorch's
        ``max_pool2d_with_indices`` and its backward)."""
        c, h, w = x.shape
        ho, wo = _pool_out(h, kernel, stride, padding, ceil_mode), _pool_out(w, kernel, stride, padding, ceil_mode)
        out = self._new((c, ho, wo), name)
        n_in, n_out = self.batch * x.numel, self.batch * out.numel
        saved = self._save(x) + self._bytes(out, INDEX_BYTES)
        moved = float(self.elem * (n_in + n_out) + INDEX_BYTES * n_out)
        return self._layer(name, "maxpool", [x], out, [Op(f"{name}.maxpool", "memory", 0.0, moved)],
                           [Op(f"{name}.maxpool.grad", "memory", 0.0, moved)], saved,
                           frozenset({"batch", "channels", "spatial"}), (kernel, kernel, stride, stride, padding, padding))

    def avgpool(self, name: str, x: Tensor, kernel: int, stride: int, padding: int = 0,
                ceil_mode: bool = False) -> Tensor:
        """Average pooling: saves its input."""
        c, h, w = x.shape
        ho, wo = _pool_out(h, kernel, stride, padding, ceil_mode), _pool_out(w, kernel, stride, padding, ceil_mode)
        out = self._new((c, ho, wo), name)
        n_in, n_out = self.batch * x.numel, self.batch * out.numel
        return self._layer(name, "avgpool", [x], out, [self._memory_op(f"{name}.avgpool", n_in + n_out, 1, 0)],
                           [self._memory_op(f"{name}.avgpool.grad", n_out + n_in, 1, 0)], self._save(x),
                           frozenset({"batch", "channels", "spatial"}), (kernel, kernel, stride, stride, padding, padding))

    def adaptive_avgpool(self, name: str, x: Tensor, size: int = 1) -> Tensor:
        """Adaptive average pooling to size×size: saves its input, except to 1×1, which PyTorch
        runs as a mean over H and W (``adaptive_avg_pool2d`` in ATen) whose backward needs only
        the input's sizes."""
        c = x.shape[0]
        out = self._new((c, size, size), name)
        n_in, n_out = self.batch * x.numel, self.batch * out.numel
        saved = 0.0 if size == 1 else self._save(x)
        return self._layer(name, "adaptive_avgpool", [x], out,
                           [self._memory_op(f"{name}.adaptive_avgpool", n_in + n_out, 1, 0)],
                           [self._memory_op(f"{name}.adaptive_avgpool.grad", n_out + n_in, 1, 0)], saved,
                           frozenset({"batch", "channels"}))

    def flatten(self, name: str, x: Tensor) -> Tensor:
        """A view: no kernel, nothing saved, the same storage."""
        out = Tensor((x.numel,), name, x.storage, x.storage_numel)
        return self._layer(name, "flatten", [x], out, [], [], 0.0)

    def linear(self, name: str, x: Tensor, out_features: int, bias: bool = True, kind: str = "linear",
               tied_weights: bool = False, op_class: str | None = None) -> Tensor:
        """A linear layer over the last dimension (tokens × features GEMM); saves its input.
        ``tied_weights``: the weight is another layer's (an embedding's), only the bias is new.
        ``op_class``: its GEMM class ("mlp", "lm_head": what ``training.fp8_gemms`` selects). With a
        bias, the backward also sums the output's gradient over the rows into the bias's (one
        reduction kernel: ``derivatives.yaml`` ``addmm``, the bias's ``sum_to_size``), as a
        convolution's bias gradient sums over batch and pixels."""
        *lead, k = x.shape
        rows = self.batch * math.prod(lead)
        fwd, bwd = self._gemm_ops(f"{name}.gemm", rows, out_features, k, 1, self._needs_grad(x), k * out_features,
                                  weights=0 if tied_weights else 1, bias=out_features if bias else 0,
                                  op_class=op_class)
        if bias:
            bwd.append(self._memory_op(f"{name}.bias_grad", rows * out_features, 1, 0))
        out = self._new((*lead, out_features), name)
        return self._layer(name, kind, [x], out, [fwd], bwd, self._save_input(x, op_class),
                           frozenset({"batch", "channels", "reduction", "sequence"}))

    def dropout(self, name: str, x: Tensor, p: float) -> Tensor:
        """Dropout in training: a one-byte mask saved (CUDA ``native_dropout``); p = 0 is the identity."""
        if p == 0.0:
            return x
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        return self._layer(name, "dropout", [x], out, [self._memory_op(f"{name}.dropout", n, 1, 1)],
                           [self._memory_op(f"{name}.dropout.grad", n, 2, 1)], self._bytes(x, MASK_BYTES),
                           frozenset({"batch", "channels", "spatial", "sequence"}))

    def add(self, name: str, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
        """A residual add: two reads, one write, nothing saved. Its backward runs no kernel: autograd
        hands the output's gradient to both inputs as it is (``derivatives.yaml`` ``add.Tensor``,
        alpha 1, same shapes); the kernel a residual block's backward does run is the sum of its
        input's two gradients, at the fork (the graph's gradient sum, workloads/layer_graph.py)."""
        if a.shape != b.shape:
            raise ConfigError(f"model.layers.{name}", f"adds {list(a.shape)} to {list(b.shape)}")
        n = self.batch * a.numel
        out = Tensor(a.shape, name, a.storage) if inplace else self._new(a.shape, name)
        return self._layer(name, "add", [a, b], out, [self._memory_op(f"{name}.add", n, 2, 1)], [], 0.0,
                           frozenset({"batch", "channels", "spatial", "sequence"}))

    def scale(self, name: str, x: Tensor, gate: Tensor) -> Tensor:
        """``x * gate`` with a per-channel gate of shape (C, 1, 1) broadcast over H×W (the excitation
        of a squeeze-and-excitation block, Hu et al. 2018, Eq. 4): reads both, writes one. Backward as
        autograd runs it (``derivatives.yaml`` ``mul.Tensor``, then ``sum_to_size`` for the broadcast
        operand): dx = dy·gate (reads dy and the gate, writes dx), dy·x at full size (reads two,
        writes one), its sum over H×W into the gate's gradient (reads one, writes the gate): 6
        full-size passes and 2 of the gate. The sum of x's two gradients (this one and the squeeze
        pool's: x feeds both) is the graph's gradient sum at x's producer, a plain contiguous add
        (workloads/layer_graph.py ``with_gradient_sums``).
        Saves both operands (autograd's ``mul`` saves self and other). A broadcast kernel: priced by its
        elements, not its bytes (simulator/cost/memory_kernels.py ``BROADCAST_KERNELS``)."""
        if gate.shape != (x.shape[0], 1, 1):
            raise ConfigError(f"model.layers.{name}", f"scales {list(x.shape)} by {list(gate.shape)}")
        n, g = self.batch * x.numel, self.batch * gate.numel
        out = self._new(x.shape, name)
        return self._layer(name, "other", [x, gate], out, [self._memory_op(f"{name}.broadcast_mul", 2 * n + g, 1, 0)],
                           [self._memory_op(f"{name}.broadcast_mul.grad", 6 * n + 2 * g, 1, 0)],
                           self._save(x) + self._save(gate), frozenset({"batch", "channels", "spatial"}))

    def scale_parameter(self, name: str, x: Tensor, params: int) -> Tensor:
        """``gamma * x`` with a learned tensor broadcast over the sample (ConvNeXt's layer scale,
        Liu et al. 2022 Sec. 2.6; Touvron et al. 2021 Sec. 3): reads both, writes one; backward
        dx = dy·gamma and dgamma = sum(dy·x). Autograd's ``mul`` saves the other operand of each
        input that needs a gradient: x (gamma itself is a parameter, not an activation). A broadcast
        kernel where gamma is (C, 1, 1) (simulator/cost/memory_kernels.py ``BROADCAST_KERNELS``)."""
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        return self._layer(name, "other", [x], out,  # the op holds gamma (``params`` elements)
                           [self._memory_op(f"{name}.broadcast_mul", n, 1, 1, tables=((params,),) if params else ())],
                           [self._memory_op(f"{name}.broadcast_mul.grad", n, 3, 1)], self._save(x),
                           frozenset({"batch", "channels", "spatial", "sequence"}))

    def mean(self, name: str, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """A mean over some dimensions of the sample (``x.mean([2, 3])``: a global average pool):
        reads the input, writes the smaller output; backward expands the gradient back (reads the
        small, writes the full). Saves nothing: ``mean``'s backward needs only the input's sizes
        (``derivatives.yaml`` ``mean.dim``)."""
        n_in, n_out = self.batch * x.numel, self.batch * math.prod(shape)
        out = self._new(shape, name)
        return self._layer(name, "adaptive_avgpool", [x], out, [self._memory_op(f"{name}.mean", n_in + n_out, 1, 0)],
                           [self._memory_op(f"{name}.mean.grad", n_out + n_in, 1, 0)], 0.0,
                           frozenset({"batch", "channels"}))

    def copy(self, name: str, x: Tensor, shape: tuple[int, ...], piece_of: str | None = None) -> Tensor:
        """A copy into a new storage of a strided view (``.contiguous()`` or ``.reshape`` of a
        transposed tensor, e.g. ShuffleNet's channel shuffle, Zhang et al. 2018 Sec. 3.1): one read,
        one write each way; saves nothing. ``piece_of``: ``x`` is one piece of a split (``unbind``,
        ``chunk``) whose pieces are copied each (workloads/layer_graph.py ``Layer.piece_of``)."""
        n = self.batch * x.numel
        out = self._new(shape, name)
        out = self._layer(name, "other", [x], out, [self._memory_op(f"{name}.copy", n, 1, 1)],
                          [self._memory_op(f"{name}.copy.grad", n, 1, 1)], 0.0,
                          frozenset({"batch", "channels", "spatial", "sequence"}))
        if piece_of:
            self.layers[-1] = replace(self.layers[-1], piece_of=piece_of)
        return out

    def patch_merging(self, name: str, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """Swin's patch merging gather (torchvision ``_patch_merging_pad``): a (H, W, C) map padded to
        even H and W, its four 2x2-strided slices concatenated along channels into (H/2, W/2, 4C):
        forward one copy (the pad, when H or W is odd, a second). Backward as autograd runs it: the
        concatenation's gradient splits into views, each slice's backward fills a zero tensor of the
        padded size and copies its quarter in (``slice_backward``), and the four gradients of the
        padded tensor are summed, three adds (``<name>.slices.gradient_sum``; PyTorch
        ``torch/csrc/autograd/input_buffer.cpp``), then the pad's backward slices the map back out."""
        h, w, c = x.shape
        padded = self.batch * (h + h % 2) * (w + w % 2) * c
        n = self.batch * x.numel
        out = self._new(shape, name)
        pad = [self._memory_op(f"{name}.pad", n + padded, 1, 0)] if padded != n else []
        forward = [*pad, self._memory_op(f"{name}.gather", padded, 1, 1)]
        backward = [op for part in range(4) for op in (
            self._memory_op(f"{name}.slice{part}.slice_backward_zeros", padded, 0, 1),
            self._memory_op(f"{name}.slice{part}.slice_backward_copy", padded / 4, 1, 1))]
        backward += [self._memory_op(f"{name}.slices.{GRADIENT_SUM}", padded, 2, 1) for _ in range(3)]
        if pad:
            backward.append(self._memory_op(f"{name}.pad.grad", n + padded, 1, 0))
        return self._layer(name, "other", [x], out, forward, backward, 0.0,
                           frozenset({"batch", "channels", "spatial"}))

    def scale_constant(self, name: str, x: Tensor) -> Tensor:
        """``x * c`` by a Python number: one read, one write each way; saves nothing (``mul.Scalar``)."""
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        return self._layer(name, "other", [x], out, [self._memory_op(f"{name}.mul", n, 1, 1)],
                           [self._memory_op(f"{name}.mul.grad", n, 1, 1)], 0.0,
                           frozenset({"batch", "channels", "spatial", "sequence"}))

    def softmax(self, name: str, x: Tensor) -> Tensor:
        """Softmax over the last dimension: saves its output (``derivatives.yaml`` ``_softmax``)."""
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        return self._layer(name, "softmax", [x], out, [self._memory_op(f"{name}.softmax", n, 1, 1)],
                           [self._memory_op(f"{name}.softmax.grad", n, 2, 1)], self._save(out),
                           frozenset({"batch", "heads", "sequence"}))

    def batched_matmul(self, name: str, a: Tensor, b: Tensor, m: int, n: int, k: int, batch: int,
                       saved_a: Tensor, saved_b: Tensor, shape: tuple[int, ...]) -> Tensor:
        """``batch`` GEMMs of m×k by k×n per sample (an einsum or matmul of two activations, as
        attention's scores and weighted sum): backward the two operand gradients; saves the two
        operands as the batched GEMM reads them (``saved_a``, ``saved_b``: copies where they were
        not laid out for it)."""
        total = self.batch * batch
        moved = float(self.elem * total * (m * k + k * n + m * n))
        fwd = Op(f"{name}.bmm", "attention", 2.0 * total * m * n * k, moved, m, n, k, total)
        bwd = [Op(f"{name}.bmm.grad_a", "attention", fwd.flops, moved, m, k, n, total),
               Op(f"{name}.bmm.grad_b", "attention", fwd.flops, moved, k, n, m, total)]
        out = self._new(shape, name)
        return self._layer(name, "attention", [a, b], out, [fwd], bwd, self._save(saved_a) + self._save(saved_b),
                           frozenset({"batch", "heads"}))

    def concat(self, name: str, parts: list[Tensor], dim: int = 0) -> Tensor:
        """Concatenation along ``dim`` of the per-sample shape: copies, saves nothing."""
        first = parts[0].shape
        for p in parts[1:]:
            if len(p.shape) != len(first) or any(a != b for i, (a, b) in enumerate(zip(p.shape, first, strict=True)) if i != dim):
                raise ConfigError(f"model.layers.{name}", f"cannot concatenate {list(p.shape)} with {list(first)}")
        shape = list(first)
        shape[dim] = sum(p.shape[dim] for p in parts)
        out = self._new(tuple(shape), name)
        n = self.batch * out.numel
        return self._layer(name, "concat", parts, out, [self._memory_op(f"{name}.concat", n, 1, 1)],
                           [self._memory_op(f"{name}.concat.grad", n, 1, 1)], 0.0,
                           frozenset({"batch", "spatial", "sequence"}))

    def layernorm(self, name: str, x: Tensor) -> Tensor:
        """Layer norm over the last dimension: saves its input and fp32 mean and 1/std per row.
        Backward: two kernels, the input gradient (reads dy and x, writes dx) and the weight and bias
        gradients (reads dy and x again, writes 2 x C): ATen's CUDA layer-norm backward
        (``native/cuda/layer_norm_kernel.cu``) runs ``GammaBetaBackward`` apart from the input's."""
        rows = self.batch * math.prod(x.shape[:-1])
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        saved = self._save(x) + 2 * rows * FP32_BYTES
        width = x.shape[-1]
        return self._layer(name, "layernorm", [x], out,
                           [self._memory_op(f"{name}.ln", n, 1, 1, tables=((width,), (width,)))],  # γ, β
                           [self._memory_op(f"{name}.ln.grad", n, 2, 1),
                            self._memory_op(f"{name}.ln.grad_weight", n, 2, 0)], saved,
                           frozenset({"batch", "sequence"}))

    # -- sequence layers -----------------------------------------------------------------------------

    def tokens(self, name: str, x: Tensor) -> Tensor:
        """Feature map (C, H, W) as H·W tokens of C features: a view (flatten + permute)."""
        c, h, w = x.shape
        out = Tensor((h * w, c), name, x.storage, x.storage_numel)
        return self._layer(name, "flatten", [x], out, [], [], 0.0)

    def crop(self, x: Tensor, height: int, width: int) -> Tensor:
        """The centre height×width of a feature map: a view of the same storage, no layer."""
        return Tensor((x.shape[0], height, width), x.producer, x.storage, x.storage_numel or x.numel)

    def select_token(self, name: str, x: Tensor, index: int = 0) -> Tensor:
        """One token of each sample (``x[:, 0]``): a view; who saves it keeps the whole storage. Its
        backward fills a zero gradient of the whole sequence and copies the token's in
        (``select_backward``, ``derivatives.yaml``): two kernels."""
        out = Tensor(x.shape[1:], name, x.storage, x.storage_numel or x.numel)
        n, token = self.batch * x.numel, self.batch * out.numel
        return self._layer(name, "flatten", [x], out, [], [self._memory_op(f"{name}.select_backward_zeros", n, 0, 1),
                                                          self._memory_op(f"{name}.select_backward_copy", token, 1, 1)],
                           0.0)

    def prepend_token(self, name: str, x: Tensor) -> Tensor:
        """A learned token put before the sequence (ViT's class token): a copy, nothing saved."""
        s, e = x.shape
        out = self._new((s + 1, e), name)
        n = self.batch * out.numel
        return self._layer(name, "concat", [x], out, [self._memory_op(f"{name}.cat", n, 1, 1, tables=((e,),))],
                           [self._memory_op(f"{name}.cat.grad", n, 1, 1)], 0.0,
                           frozenset({"batch", "sequence"}))

    def add_parameter(self, name: str, x: Tensor, kind: str = "add", params: int | None = None) -> Tensor:
        """Add a learned tensor of the sample's shape (position embeddings; ``params`` when it is
        broadcast from a smaller one): nothing saved. Backward: x's gradient is the output's as it
        is (no kernel, as a residual add's); the parameter's is its sum over the batch, one reduction
        reading the output's gradient and writing the parameter's."""
        n = self.batch * x.numel
        p = x.numel if params is None else params
        out = self._new(x.shape, name)
        table = x.shape if params is None else (p,)
        return self._layer(name, kind, [x], out, [self._memory_op(f"{name}.add", n, 2, 1, tables=(table,))],
                           [self._memory_op(f"{name}.add.parameter_grad", n + p, 1, 0)],
                           0.0, frozenset({"batch", "sequence"}))

    def embedding(self, name: str, tokens: int, vocab: int, dim: int, source: Tensor | None = None) -> Tensor:
        """An embedding lookup of ``tokens`` ids per sample: a gather of rows, saves the int64 ids."""
        n = self.batch * tokens * dim
        out = self._new((tokens, dim), name)
        ids = self.input(tokens) if source is None else source
        return self._layer(name, "embedding", [ids], out,
                           [self._memory_op(f"{name}.gather", n, 1, 1, tables=((vocab, dim),))],
                           [self._memory_op(f"{name}.scatter_add", n, 2, 1)],
                           float(self.batch * tokens * INDEX_BYTES), frozenset({"batch", "sequence", "channels"}))

    def self_attention(self, name: str, x: Tensor, heads: int, kernel: str | None = None, dropout: float = 0.0,
                       packed_qkv: bool = True, proj_class: str | None = None) -> Tensor:
        """Multi-head self-attention (Vaswani et al. 2017): Q, K, V projections with bias, the
        attention core, the output projection with bias, as one layer. ``kernel`` None: the run's
        (:attr:`attention_kernel`); ``proj_class``: the GEMM class of the four projections
        ("attention_proj": in FP8 under ``training.fp8_gemms``' default, as a decoder transformer's).

        ``kernel="flash"``: a fused kernel (FlashAttention, Dao 2022; PyTorch's
        ``scaled_dot_product_attention``) with 2 matmuls forward and 2.5× backward; saves q, k, v
        (one packed storage when ``packed_qkv``, as ``nn.MultiheadAttention``), its output and
        the fp32 log-sum-exp per head and query; its output is laid out token-major already, so
        the output projection saves that same storage. ``kernel="eager"``: scores, softmax, dropout and the weighted sum as
        separate kernels (Hugging Face BERT): saves the input, copies of q and k for the scores
        matmul, the softmax output (and, with dropout, the mask and the dropped probabilities),
        a copy of v, and the context copy that the output projection saves."""
        s, e = x.shape
        if e % heads:
            raise ConfigError(f"model.layers.{name}", f"hidden size {e} not divisible by {heads} heads")
        kernel = kernel or self.attention_kernel
        d, b, el = e // heads, self.batch, self.elem
        rows, tokens_bytes = b * s, float(b * s * e * el)
        qkv, qkv_b = self._gemm_ops(f"{name}.qkv", rows, 3 * e, e, 1, self._needs_grad(x), 3 * e * e,
                                    weights=1, bias=3 * e, op_class=proj_class)
        proj, proj_b = self._gemm_ops(f"{name}.out_proj", rows, e, e, 1, True, e * e, weights=1, bias=e,
                                      op_class=proj_class)
        saved = saved_input = self._save_input(x, proj_class)
        # the output projection's input: the core's output (token-major), kept 16-bit by a fused kernel for its
        # own backward; under FP8 saved inputs the projection keeps a quantized copy beside it (flash) or
        # instead of the 16-bit context copy (eager)
        fp8_out = (proj_class is not None and self.shard is not None and proj_class in self.shard.fp8_saved_inputs)
        out_copy = rows * e * self.shard.fp8_saved_element_bytes if fp8_out else 0.0
        if kernel == "flash":
            core = Op(f"{name}.flash_attention", "attention", 4.0 * b * heads * s * s * d, 4 * tokens_bytes,
                      s, s, d, b * heads, backward_flops_factor=2.5)
            core_f = [core]
            core_b = [Op(f"{name}.flash_attention.grad", "attention", 2.5 * core.flops, 2 * core.bytes_moved,
                         s, s, d, b * heads)]
            saved += 3 * tokens_bytes + tokens_bytes + b * heads * s * FP32_BYTES + out_copy
        else:
            probs = b * heads * s * s
            scores = Op(f"{name}.scores", "attention", 2.0 * b * heads * s * s * d, el * (2 * rows * e + probs),
                        s, s, d, b * heads)
            values = Op(f"{name}.values", "attention", 2.0 * b * heads * s * s * d, el * (2 * rows * e + probs),
                        s, d, s, b * heads)
            soft = self._memory_op(f"{name}.softmax", probs, 1, 1 + (1 if dropout else 0))
            core_f = [scores, soft, values]
            core_b = [Op(f"{name}.values.grad", "attention", 2 * values.flops, 2 * values.bytes_moved, s, d, s,
                         b * heads), self._memory_op(f"{name}.softmax.grad", probs, 3, 1),
                      Op(f"{name}.scores.grad", "attention", 2 * scores.flops, 2 * scores.bytes_moved, s, s, d,
                         b * heads)]
            saved += 3 * tokens_bytes + probs * el + (out_copy if fp8_out else tokens_bytes)
            if dropout:
                saved += probs * (MASK_BYTES + el)
        out = self._new((s, e), name)
        forward = [qkv, *core_f, proj]
        backward = [*proj_b, *core_b, *self._qkv_gradient_ops(name, rows * e, packed_qkv, self._needs_grad(x)), *qkv_b]
        if not packed_qkv:
            forward[0] = Op(f"{name}.q_k_v", "gemm", qkv.flops, qkv.bytes_moved, rows, e, e, 3, weights=3, bias=3 * e,
                            op_class=proj_class)
        return self._layer(name, "attention", [x], out, forward, backward, saved,
                           frozenset({"batch", "heads", "sequence"}), saved_input=saved_input)

    def _qkv_gradient_ops(self, name: str, elements: int, packed: bool, input_grad: bool = True) -> list[Op]:
        """What autograd runs between an attention core's backward and its Q/K/V projection's, where
        q, k and v are read out of one tensor or one tensor feeds three projections (PyTorch
        ``derivatives.yaml``, ``torch/csrc/autograd/input_buffer.cpp``); ``elements``: one of q, k, v.

        - ``packed``: q, k, v are ``proj[0]``, ``proj[1]``, ``proj[2]`` of the packed projection
          (``nn.MultiheadAttention``'s ``_in_projection_packed``; torchvision's Swin). Each select's
          backward fills a zero tensor of the packed size and copies its slice in
          (``select_backward``), and the three gradients of the packed tensor are summed: two adds of
          3x the elements (``<name>.qkv.gradient_sum``, the gradient-sum kernel class).
        - three projections of one input (Hugging Face BERT's query, key, value): the three input
          gradients are summed, two adds of the input's size (when the input needs a gradient)."""
        if packed:
            selects = [op for part in ("q", "k", "v") for op in (
                self._memory_op(f"{name}.{part}.select_backward_zeros", 3 * elements, 0, 1),
                self._memory_op(f"{name}.{part}.select_backward_copy", elements, 1, 1))]
            return selects + [self._memory_op(f"{name}.qkv.{GRADIENT_SUM}", 3 * elements, 2, 1) for _ in range(2)]
        if not input_grad:
            return []
        return [self._memory_op(f"{name}.input.{GRADIENT_SUM}", elements, 2, 1) for _ in range(2)]

    def window_attention(self, name: str, x: Tensor, heads: int, window: tuple[int, int], shift: tuple[int, int],
                         qkv_bias: bool, proj_bias: bool, bias_table: int) -> Tensor:
        """Swin's (shifted) window attention (Liu et al. 2021, Sec. 3.2, Eq. 4), as torchvision's
        ``shifted_window_attention`` runs it on a (H, W, C) map: pad H and W to multiples of the
        window, roll by -shift (when the window is smaller than the padded map), partition into
        windows of L = wh·ww tokens (a copy), the qkv projection, q scaled, scores q·kᵀ per window
        and head, plus the relative position bias and (shifted) the window mask, softmax, the
        weighted sum with v, heads merged (a copy), the output projection, windows merged (a copy),
        rolled back and cropped. Saves (autograd, every matmul in eager kernels): the partitioned
        input of the qkv projection, q scaled and kᵀ as the scores' batched GEMM copies them,
        the softmax output, v as copied for the second batched GEMM and the merged heads that the
        output projection reads: 5·T·C + B·nW·heads·L² elements (T = B·Hp·Wp tokens); when a
        single window holds a whole sample of one (B·nW = 1), kᵀ and v are views of the qkv
        output, saved once (6·T·C in all). Parameters: the qkv and output projections' weights (and
        biases, ``qkv_bias`` / ``proj_bias``) and the relative position bias table (``bias_table``
        elements, held by the bias-and-softmax kernel that reads it)."""
        h, w, c = x.shape
        if c % heads:
            raise ConfigError(f"model.layers.{name}", f"channels {c} not divisible by {heads} heads")
        wh, ww = window
        hp, wp = -(-h // wh) * wh, -(-w // ww) * ww
        shifted = (shift[0] if wh < hp else 0) + (shift[1] if ww < wp else 0) > 0
        d, b, el, length = c // heads, self.batch, self.elem, wh * ww
        windows = (hp // wh) * (wp // ww)
        rows, groups = b * hp * wp, b * windows * heads
        probs = groups * length * length
        qkv, qkv_b = self._gemm_ops(f"{name}.qkv", rows, 3 * c, c, 1, self._needs_grad(x), 3 * c * c,
                                    weights=1, bias=3 * c if qkv_bias else 0)
        proj, proj_b = self._gemm_ops(f"{name}.proj", rows, c, c, 1, True, c * c, weights=1, bias=c if proj_bias else 0)
        scores = Op(f"{name}.scores", "attention", 2.0 * probs * d, el * (2 * rows * c + probs), length, length, d,
                    groups)
        values = Op(f"{name}.values", "attention", 2.0 * probs * d, el * (2 * rows * c + probs), length, d, length,
                    groups)
        # pad and crop (when padded), two rolls (when shifted), partition, q scaled, k, v, heads and windows merged
        copies = (2 if hp * wp != h * w else 0) + (2 if shifted else 0) + 6
        layout = self._memory_op(f"{name}.pad_roll_partition_copies", rows * c, copies, copies)
        bias = self._memory_op(f"{name}.bias_mask_softmax", probs, 2 + (1 if shifted else 0), 2 + (1 if shifted else 0),
                               tables=((bias_table,),) if bias_table else ())
        forward = [layout, qkv, scores, bias, values, proj]
        backward = [*proj_b, Op(f"{name}.values.grad", "attention", 2 * values.flops, 2 * values.bytes_moved, length,
                                d, length, groups),
                    self._memory_op(f"{name}.softmax_bias.grad", probs, 3 + 1, 1 + 1),
                    Op(f"{name}.scores.grad", "attention", 2 * scores.flops, 2 * scores.bytes_moved, length, length,
                       d, groups), *self._qkv_gradient_ops(name, rows * c, packed=True), *qkv_b,
                    self._memory_op(f"{name}.pad_roll_partition_copies.grad", rows * c, copies, copies)]
        tokens = rows * c
        # partitioned input, q, k, v, merged heads: 5 copies of T·C, or q, the whole qkv output (k and v
        # are views of it) and the two others: 6·T·C
        saved = float(el * ((6 if b * windows == 1 else 5) * tokens + probs))
        out = self._new(x.shape, name)
        return self._layer(name, "attention", [x], out, forward, backward, saved,
                           frozenset({"batch", "heads"}), saved_input=float(el * tokens))  # the partitioned input

    def lstm(self, name: str, x: Tensor, hidden: int, projection: int | None = None,
             bidirectional: bool = False) -> Tensor:
        """One LSTM layer over the sequence (Hochreiter & Schmidhuber 1997; with a projection,
        Sak et al. 2014, as ``torch.nn.LSTM(proj_size=...)``), per direction:

        - the input projection of all time steps at once: a GEMM (B·T) × 4H × in;
        - per time step the recurrent GEMM B × 4H × r (r = projection or H), ``T`` of them one
          after another (``batch`` = T on the op; they cannot run together);
        - the gate nonlinearities and cell update (memory-bound), and with a projection the
          per-step B × P × H GEMM.

        Backward: each GEMM's data and weight gradients. Saved bytes are an estimate of cuDNN's
        reserve space: per step the four gates, the cell state and the hidden output, plus the
        input (the reserve-space layout is not documented)."""
        t, n_in = x.shape
        dirs = 2 if bidirectional else 1
        r = projection or hidden
        b = self.batch
        forward: list[Op] = []
        backward: list[Op] = []
        for direction in range(dirs):
            tag = f"{name}.{'reverse' if direction else 'forward'}"
            # W_ih with b_ih; W_hh (one weight for the T steps) with b_hh (torch.nn.LSTM's parameters)
            inp, inp_b = self._gemm_ops(f"{tag}.input_gemm", b * t, 4 * hidden, n_in, 1, self._needs_grad(x),
                                        4 * hidden * n_in, weights=1, bias=4 * hidden)
            rec = Op(f"{tag}.recurrent_gemm", "gemm", 2.0 * b * 4 * hidden * r * t,
                     float(self.elem * t * (b * r + b * 4 * hidden + 4 * hidden * r)), b, 4 * hidden, r, t,
                     weights=1, bias=4 * hidden)
            gates = self._memory_op(f"{tag}.gates", b * t * hidden, 6, 2)
            forward += [inp, rec, gates]
            step_b = [Op(f"{tag}.recurrent_gemm.dgrad", "gemm", rec.flops, rec.bytes_moved, b, r, 4 * hidden, t),
                      Op(f"{tag}.recurrent_gemm.wgrad", "gemm", rec.flops, rec.bytes_moved, 4 * hidden, r, b, t),
                      self._memory_op(f"{tag}.gates.grad", b * t * hidden, 8, 5)]
            if projection:
                pr = Op(f"{tag}.projection", "gemm", 2.0 * b * projection * hidden * t,
                        float(self.elem * t * (b * hidden + b * projection + hidden * projection)),
                        b, projection, hidden, t, weights=1)   # W_hr, one for the T steps
                forward.append(pr)
                step_b += [Op(f"{tag}.projection.dgrad", "gemm", pr.flops, pr.bytes_moved, b, hidden, projection, t),
                           Op(f"{tag}.projection.wgrad", "gemm", pr.flops, pr.bytes_moved, hidden, projection, b, t)]
            backward += step_b + inp_b
        out = self._new((t, dirs * r), name)
        saved = self._save(x) + dirs * float(b * t * (4 * hidden + hidden + r) * self.elem)
        return self._layer(name, "lstm", [x], out, forward, backward, saved,
                           frozenset({"batch", "channels"}))

    def additive_attention(self, name: str, query: Tensor, keys: Tensor) -> Tensor:
        """Additive (Bahdanau) attention as in GNMT's PyTorch reference that PipeDream profiled
        (``BahdanauAttention``): linear maps of the queries and keys (no bias), for every query–key
        pair tanh(q_i + k_j) weighted by v (memory-bound over Tq·Tk·H),
        softmax over the keys, and the context as a batched GEMM of the probabilities with the
        keys. Saves the two linear inputs, the tanh output (Tq·Tk·H per sample), the softmax
        output and the keys again for the context GEMM. Parameters (its ops'): W_q H x H, W_k Hk x H
        and v (H), 2·H² + H where Hk = H (PipeDream's profile of GNMT-16 has exactly these)."""
        tq, h = query.shape
        tk, hk = keys.shape
        b, el = self.batch, self.elem
        q, q_b = self._gemm_ops(f"{name}.linear_q", b * tq, h, h, 1, True, h * h, weights=1)
        k, k_b = self._gemm_ops(f"{name}.linear_k", b * tk, h, hk, 1, True, h * hk, weights=1)
        pairs = b * tq * tk * h
        score = self._memory_op(f"{name}.tanh_v", pairs, 1, 1, tables=((h,),))   # v
        soft = self._memory_op(f"{name}.softmax", b * tq * tk, 1, 1)
        context = Op(f"{name}.context", "gemm", 2.0 * b * tq * tk * hk, el * b * (tq * tk + tk * hk + tq * hk),
                     tq, hk, tk, b)
        context_b = [Op(f"{name}.context.dgrad", "gemm", context.flops, context.bytes_moved, tq, tk, hk, b),
                     Op(f"{name}.context.wgrad", "gemm", context.flops, context.bytes_moved, tk, hk, tq, b)]
        saved = self._save(query) + self._save(keys) + float(el * (pairs + 2 * b * tq * tk))
        out = self._new((tq, hk), name)
        return self._layer(name, "attention", [query, keys], out, [q, k, score, soft, context],
                           [*context_b, self._memory_op(f"{name}.softmax.grad", b * tq * tk, 3, 1),
                            self._memory_op(f"{name}.tanh_v.grad", pairs, 3, 1), *k_b, *q_b],
                           saved, frozenset({"batch"}))

    def sampled_softmax(self, name: str, x: Tensor, vocab: int, num_sampled: int) -> Tensor:
        """Sampled softmax loss (Jean et al. 2015; Jozefowicz et al. 2016 Sec. 3.1): the rows of the
        output embedding (vocab × d, plus a bias) for ``num_sampled`` sampled classes are gathered and
        the logits of every position against them and its own target are one GEMM; backward scatters
        the gradient into those rows. Saves the input and the fp32 log-softmax output."""
        *lead, d = x.shape
        rows = self.batch * math.prod(lead)
        gather = self._memory_op(f"{name}.gather", num_sampled * d + rows * d, 1, 1,
                                 tables=((vocab, d), (vocab,)))   # the output embedding and its bias
        logits, logits_b = self._gemm_ops(f"{name}.logits", rows, num_sampled + 1, d, 1, True, 0)
        loss = self._memory_op(f"{name}.log_softmax", rows * (num_sampled + 1), 1, 1, FP32_BYTES)
        out = self._new((1,), name)
        saved = self._save(x) + float(rows * (num_sampled + 1) * FP32_BYTES)
        return self._layer(name, "loss", [x], out, [gather, logits, loss],
                           [self._memory_op(f"{name}.log_softmax.grad", rows * (num_sampled + 1), 2, 1, FP32_BYTES),
                            *logits_b, self._memory_op(f"{name}.scatter_add", num_sampled * d, 2, 1)],
                           saved, frozenset({"batch", "sequence"}))

    def cross_entropy(self, name: str, logits: Tensor) -> Tensor:
        """Softmax cross-entropy over the last dimension (the loss): log-softmax in fp32 (autocast
        runs it in fp32), saves its fp32 output. Splittable over the classes too (``reduction``):
        the vocabulary-parallel cross-entropy of Megatron-LM (Shoeybi et al. 2019 Sec. 3), each
        device on its slice of the logits, per-token statistics all-reduced (priced by the
        per-layer kind: simulator/strategies/per_layer/cost.py).

        Under ``training.fused_cross_entropy`` (the shard's) the loss is one fused kernel that keeps the
        16-bit logits and one fp32 log-sum-exp per row for its backward instead of the fp32 log-softmax
        (flash-attn's Triton ``CrossEntropyLoss``; the decoder transformer's head counts the same 2 B per
        logit, workloads/transformer_graph.py ``FUSED_LOGITS_BYTES_PER_ELEMENT``); its kernels' traffic is
        left as it is (the field is memory only, as on decoder transformers)."""
        n = self.batch * logits.numel
        out = self._new((1,), name)
        if self.shard is not None and self.shard.fused_cross_entropy:
            saved = self._save(logits) + float(n // logits.shape[-1] * FP32_BYTES)
        else:
            saved = float(n * FP32_BYTES)
        return self._layer(name, "loss", [logits], out, [self._memory_op(f"{name}.log_softmax", n, 1, 1, FP32_BYTES)],
                           [self._memory_op(f"{name}.log_softmax.grad", n, 2, 1, FP32_BYTES)],
                           saved, frozenset({"batch", "sequence", "reduction"}))

    def output(self) -> LayerGraph:
        """The graph built so far, checked, with autograd's gradient sums at its fan-outs
        (workloads/layer_graph.py ``with_gradient_sums``)."""
        graph = LayerGraph(self.name, tuple(self.layers), self.batch, self.sample, self.seq_length).check()
        return with_gradient_sums(graph)


def _pool_out(size: int, kernel: int, stride: int, padding: int, ceil_mode: bool) -> int:
    """Pooling output size (PyTorch ``MaxPool2d`` docs): ceil mode rounds up unless the last window
    would start in the right padding."""
    span = size + 2 * padding - kernel
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _conv_passes(fwd: Op, bwd: list[Op], kh: int, kw: int, stride: int,
                 moved_bytes: float) -> tuple[Op, list[Op]]:
    """Tag a convolution's implicit GEMMs with their pass and window, which the compute model's
    convolution efficiency reads (simulator/cost/conv.py), and give each pass the traffic of an
    implicit GEMM (Chetlur et al. 2014, Sec. 3: the lowered matrix is built tile by tile in shared
    memory, never in HBM): forward reads x and w and writes y, the data gradient reads dy and w
    and writes dx, the weight gradient reads x and dy and writes dw."""
    def tag(op: Op) -> Op:
        pass_ = "dgrad" if op.name.endswith(".dgrad") else "wgrad" if op.name.endswith(".wgrad") else "fwd"
        return replace(op, conv=(pass_, kh, kw, stride), bytes_moved=moved_bytes)
    return tag(fwd), [tag(op) for op in bwd]
