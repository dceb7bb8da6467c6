"""A small tracer that builds a :class:`~workloads.layer_graph.LayerGraph` layer by layer.

Family builders (ResNet, VGG, Inception, ViT, U-Net, LSTMs, BERT) and the PyTorch importer call
one method per layer (``conv2d``, ``batchnorm``, ``relu``, ``linear``...) on :class:`Tensor` s;
each call appends one :class:`~workloads.layer_graph.Layer` with its kernels, parameters, saved
and output bytes, and returns the output tensor.

Kernels. A convolution is an implicit GEMM (Chetlur et al. 2014, cuDNN, Sec. 3): M = N·H_out·W_out,
N = C_out/groups, K = C_in·kh·kw/groups, ``groups`` of them; FLOPs 2·M·N·K. Its backward is a
data gradient (same M·N·K) and a weight gradient (same M·N·K); the first layer has no data
gradient (its input needs none, and PyTorch skips it). Normalisations, activations, pooling,
residual adds and concatenations are memory-bound ops: bytes read plus written.

Saved bytes, as PyTorch autograd saves them (``derivatives.yaml``): a convolution and a linear
layer save their input; batch norm saves its input and two fp32 per-channel statistics; layer norm
its input and two fp32 per-row statistics; ReLU saves its output; GELU and average pooling their
input; max pooling its input and int64 indices; dropout (on a GPU) a one-byte mask; adds,
concatenations and views nothing. A tensor saved by two layers (a ReLU's output that the next
convolution saves again, ``inplace=True`` ReLUs writing over their input) is one storage: only
the first layer that saves a storage counts its bytes, so the sum over layers is the memory.
Weights saved for backward are parameters (counted as weights), not activations. Under mixed
precision the bf16/fp16 cast copies of the weights that autocast keeps are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import count

from simulator.errors import ConfigError
from workloads.graph import Op
from workloads.layer_graph import Layer, LayerGraph

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

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def conv_out(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """Output size of a convolution or pooling window (PyTorch ``Conv2d`` docs, floor mode)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class NetBuilder:
    """Appends layers for ``micro_batch`` samples with ``elem_bytes`` bytes per activation element."""

    def __init__(self, name: str, micro_batch: int, elem_bytes: int, sample: str = "image",
                 seq_length: int | None = None):
        self.name = name
        self.batch = micro_batch
        self.elem = elem_bytes
        self.sample = sample
        self.seq_length = seq_length
        self.layers: list[Layer] = []
        self._saved_storages: set[int] = set()
        self._storage_ids = count()
        self._names: set[str] = set()

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
        return self._bytes(t)

    def _layer(self, name: str, kind: str, inputs: list[Tensor], out: Tensor, forward: list[Op],
               backward: list[Op] | None = None, params: int = 0, saved: float = 0.0,
               splittable: frozenset[str] = frozenset({"batch"})) -> Tensor:
        if name in self._names:
            raise ConfigError(f"model.layers.{name}", "a second layer has this name")
        self._names.add(name)
        if backward is None:
            backward = [Op(f"{op.name}.grad", "memory", 0.0, 2 * op.bytes_moved) for op in forward]
        producers = tuple(dict.fromkeys(t.producer for t in inputs if t.producer is not None))
        self.layers.append(Layer(
            name=name, kind=kind, forward=tuple(forward), backward=tuple(backward), params=int(params),
            saved_bytes=saved, output_bytes=self._bytes(out), inputs=producers, splittable=splittable,
            input_shape=inputs[0].shape if len(inputs) == 1 else None, output_shape=out.shape))
        return out

    def _memory_op(self, name: str, elements: float, reads: float, writes: float, elem: int | None = None) -> Op:
        return Op(name, "memory", 0.0, float(elements * (self.elem if elem is None else elem) * (reads + writes)))

    def _gemm_ops(self, name: str, m: int, n: int, k: int, groups: int = 1, input_grad: bool = True,
                  weight_elems: int = 0) -> tuple[Op, list[Op]]:
        """A GEMM C[m,n] = A[m,k]·B[k,n] (``groups`` of them) and its backward (dgrad, wgrad)."""
        e = self.elem
        moved = float(e * groups * (m * k + m * n) + e * weight_elems)
        fwd = Op(name, "gemm", 2.0 * m * n * k * groups, moved, m, n, k, groups)
        bwd = []
        if input_grad:
            bwd.append(Op(f"{name}.dgrad", "gemm", 2.0 * m * n * k * groups, moved, m, k, n, groups))
        bwd.append(Op(f"{name}.wgrad", "gemm", 2.0 * m * n * k * groups, moved, k, n, m, groups))
        return fwd, bwd

    @staticmethod
    def _needs_grad(t: Tensor) -> bool:
        return t.producer is not None

    # -- layers ------------------------------------------------------------------------------------

    def conv2d(self, name: str, x: Tensor, out_channels: int, kernel: int | tuple[int, int], stride: int = 1,
               padding: int | tuple[int, int] = 0, groups: int = 1, bias: bool = False,
               kind: str = "conv2d") -> Tensor:
        """A 2-D convolution as implicit GEMM(s) (see the module docstring)."""
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
                                  c // groups * kh * kw, groups, self._needs_grad(x), weights)
        out = self._new((out_channels, ho, wo), name)
        return self._layer(name, kind, [x], out, [fwd], bwd, weights + (out_channels if bias else 0),
                           self._save(x), frozenset({"batch", "channels", "spatial"}))

    def conv_transpose2d(self, name: str, x: Tensor, out_channels: int, kernel: int, stride: int,
                         bias: bool = True) -> Tensor:
        """A transposed convolution with stride = kernel (U-Net's up-convolution): a GEMM of
        M = N·H·W, N = C_out·k·k, K = C_in (the data gradient of a convolution, run forward)."""
        c, h, w = x.shape
        weights = c * out_channels * kernel * kernel
        fwd, bwd = self._gemm_ops(f"{name}.conv", self.batch * h * w, out_channels * kernel * kernel, c,
                                  1, self._needs_grad(x), weights)
        out = self._new((out_channels, (h - 1) * stride + kernel, (w - 1) * stride + kernel), name)
        return self._layer(name, "conv_transpose2d", [x], out, [fwd], bwd,
                           weights + (out_channels if bias else 0), self._save(x),
                           frozenset({"batch", "channels", "spatial"}))

    def batchnorm(self, name: str, x: Tensor) -> Tensor:
        """Batch norm in training: statistics (one read), normalise (read, write); backward reads
        the gradient and the input twice and writes one gradient. Saves its input and the fp32
        mean and inverse deviation per channel."""
        n = self.batch * x.numel
        fwd = [self._memory_op(f"{name}.bn", n, 2, 1)]
        bwd = [self._memory_op(f"{name}.bn.grad", n, 3, 1)]
        saved = self._save(x) + 2 * x.shape[0] * FP32_BYTES
        out = self._new(x.shape, name)
        return self._layer(name, "batchnorm", [x], out, fwd, bwd, 2 * x.shape[0], saved,
                           frozenset({"batch", "spatial"}))

    def relu(self, name: str, x: Tensor, inplace: bool = True) -> Tensor:
        """ReLU (saves its output; in place it writes over its input's storage)."""
        n = self.batch * x.numel
        out = Tensor(x.shape, name, x.storage) if inplace else self._new(x.shape, name)
        return self._layer(name, "relu", [x], out, [self._memory_op(f"{name}.relu", n, 1, 1)],
                           [self._memory_op(f"{name}.relu.grad", n, 2, 1)], 0, self._save(out),
                           frozenset({"batch", "channels", "spatial"}))

    def activation(self, name: str, x: Tensor, function: str = "gelu") -> Tensor:
        """An elementwise activation that saves its input (GELU, tanh-free variants)."""
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        return self._layer(name, "activation", [x], out, [self._memory_op(f"{name}.{function}", n, 1, 1)],
                           [self._memory_op(f"{name}.{function}.grad", n, 2, 1)], 0, self._save(x),
                           frozenset({"batch", "channels", "spatial", "sequence"}))

    def maxpool(self, name: str, x: Tensor, kernel: int, stride: int, padding: int = 0,
                ceil_mode: bool = False) -> Tensor:
        """Max pooling: saves its input and int64 indices of its output."""
        c, h, w = x.shape
        ho, wo = _pool_out(h, kernel, stride, padding, ceil_mode), _pool_out(w, kernel, stride, padding, ceil_mode)
        out = self._new((c, ho, wo), name)
        n_in, n_out = self.batch * x.numel, self.batch * out.numel
        saved = self._save(x) + self._bytes(out, INDEX_BYTES)
        return self._layer(name, "maxpool", [x], out, [self._memory_op(f"{name}.maxpool", n_in + n_out, 1, 0)],
                           [self._memory_op(f"{name}.maxpool.grad", n_out + n_in, 1, 0)], 0, saved,
                           frozenset({"batch", "channels"}))

    def avgpool(self, name: str, x: Tensor, kernel: int, stride: int, padding: int = 0,
                ceil_mode: bool = False) -> Tensor:
        """Average pooling: saves its input."""
        c, h, w = x.shape
        ho, wo = _pool_out(h, kernel, stride, padding, ceil_mode), _pool_out(w, kernel, stride, padding, ceil_mode)
        out = self._new((c, ho, wo), name)
        n_in, n_out = self.batch * x.numel, self.batch * out.numel
        return self._layer(name, "avgpool", [x], out, [self._memory_op(f"{name}.avgpool", n_in + n_out, 1, 0)],
                           [self._memory_op(f"{name}.avgpool.grad", n_out + n_in, 1, 0)], 0, self._save(x),
                           frozenset({"batch", "channels"}))

    def adaptive_avgpool(self, name: str, x: Tensor, size: int = 1) -> Tensor:
        """Adaptive average pooling to size×size: saves its input, except to 1×1, which PyTorch
        runs as a mean over H and W (``adaptive_avg_pool2d`` in ATen) whose backward needs only
        the input's sizes."""
        c = x.shape[0]
        out = self._new((c, size, size), name)
        n_in, n_out = self.batch * x.numel, self.batch * out.numel
        saved = 0.0 if size == 1 else self._save(x)
        return self._layer(name, "adaptive_avgpool", [x], out,
                           [self._memory_op(f"{name}.avgpool", n_in + n_out, 1, 0)],
                           [self._memory_op(f"{name}.avgpool.grad", n_out + n_in, 1, 0)], 0, saved,
                           frozenset({"batch", "channels"}))

    def flatten(self, name: str, x: Tensor) -> Tensor:
        """A view: no kernel, nothing saved, the same storage."""
        out = Tensor((x.numel,), name, x.storage)
        return self._layer(name, "flatten", [x], out, [], [], 0, 0.0)

    def linear(self, name: str, x: Tensor, out_features: int, bias: bool = True, kind: str = "linear") -> Tensor:
        """A linear layer over the last dimension (tokens × features GEMM); saves its input."""
        *lead, k = x.shape
        rows = self.batch * math.prod(lead)
        fwd, bwd = self._gemm_ops(f"{name}.gemm", rows, out_features, k, 1, self._needs_grad(x), k * out_features)
        out = self._new((*lead, out_features), name)
        return self._layer(name, kind, [x], out, [fwd], bwd, k * out_features + (out_features if bias else 0),
                           self._save(x), frozenset({"batch", "channels", "reduction", "sequence"}))

    def dropout(self, name: str, x: Tensor, p: float) -> Tensor:
        """Dropout in training: a one-byte mask saved (CUDA ``native_dropout``); p = 0 is the identity."""
        if p == 0.0:
            return x
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        return self._layer(name, "dropout", [x], out, [self._memory_op(f"{name}.dropout", n, 1, 1)],
                           [self._memory_op(f"{name}.dropout.grad", n, 2, 1)], 0, self._bytes(x, MASK_BYTES),
                           frozenset({"batch", "channels", "spatial", "sequence"}))

    def add(self, name: str, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
        """A residual add: two reads, one write, nothing saved."""
        if a.shape != b.shape:
            raise ConfigError(f"model.layers.{name}", f"adds {list(a.shape)} to {list(b.shape)}")
        n = self.batch * a.numel
        out = Tensor(a.shape, name, a.storage) if inplace else self._new(a.shape, name)
        return self._layer(name, "add", [a, b], out, [self._memory_op(f"{name}.add", n, 2, 1)],
                           [self._memory_op(f"{name}.add.grad", n, 1, 2)], 0, 0.0,
                           frozenset({"batch", "channels", "spatial", "sequence"}))

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
                           [self._memory_op(f"{name}.concat.grad", n, 1, 1)], 0, 0.0,
                           frozenset({"batch", "spatial", "sequence"}))

    def layernorm(self, name: str, x: Tensor) -> Tensor:
        """Layer norm over the last dimension: saves its input and fp32 mean and 1/std per row."""
        rows = self.batch * math.prod(x.shape[:-1])
        n = self.batch * x.numel
        out = self._new(x.shape, name)
        saved = self._save(x) + 2 * rows * FP32_BYTES
        return self._layer(name, "layernorm", [x], out, [self._memory_op(f"{name}.ln", n, 1, 1)],
                           [self._memory_op(f"{name}.ln.grad", n, 2, 1)], 2 * x.shape[-1], saved,
                           frozenset({"batch", "sequence"}))

    def output(self) -> LayerGraph:
        """The graph built so far, checked."""
        return LayerGraph(self.name, tuple(self.layers), self.batch, self.sample, self.seq_length).check()


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
