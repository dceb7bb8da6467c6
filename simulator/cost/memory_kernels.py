"""Which class a memory-bound kernel belongs to, for the spec's per-class efficiencies.

The layer-graph builder names a layer's memory-bound ops ``<layer>.<kernel>`` and their backward
``<layer>.<kernel>.grad`` (workloads/networks/builder.py: ``maxpool``, ``avgpool``,
``adaptive_avgpool``, ``concat``, ``bn``, ``relu``, ``add``...). Pooling backward and
concatenation run far below streaming bandwidth in PyTorch's NCHW kernels; DeepPool's A100
profiles measure them (validation/deeppool_model.py fits ``memory_kernels``).

**Broadcast elementwise kernels** (``broadcast_mul``: a squeeze-and-excitation gate (C, 1, 1) or a
layer-scale parameter times a feature map, and its gradients). PyTorch's CUDA elementwise loops load
several elements per instruction (``launch_vectorized_kernel``, 4-16 bytes a thread) only when every
operand is contiguous; a broadcast operand (stride 0 over H×W) sends the kernel down the unrolled,
one-element-per-load path with an offset calculator per element (ATen ``native/cuda/Loops.cuh``,
``CUDALoops.cuh``: ``can_vectorize_up_to`` / ``unrolled_elementwise_kernel``). Such a kernel is bound
by the elements it moves, not their bytes: :func:`element_bound_bytes` prices it at the bytes its
elements would take in fp32 (4 B), so an fp16 pass costs what the fp32 one does (*assumed*: the
fp32 pass streams at the memory-bound bandwidth). DLE's measured SE-ResNeXt-101 minus ResNeXt-101
time per image is the same under AMP as in FP32/TF32 (validation/modern/cnn.py says which rows).
"""

from __future__ import annotations


def memory_kernel_class(op_name: str) -> str:
    """``"stem.pool.maxpool.grad"`` -> ``"maxpool"``: the kernel token of a builder op's name."""
    name = op_name[:-len(".grad")] if op_name.endswith(".grad") else op_name
    return name.rsplit(".", 1)[-1]


#: Kernel classes that take a broadcast operand: element-bound, not byte-bound (module docstring).
BROADCAST_KERNELS = frozenset({"broadcast_mul"})
FP32_ELEMENT_BYTES = 4


def element_bound_bytes(op_name: str, bytes_moved: float, element_bytes: float) -> float:
    """The bytes a memory-bound op is priced at: ``bytes_moved``, or for a broadcast kernel of
    ``element_bytes``-byte elements (fewer than 4) the bytes of the same elements in fp32."""
    if element_bytes < FP32_ELEMENT_BYTES and memory_kernel_class(op_name) in BROADCAST_KERNELS:
        return bytes_moved * FP32_ELEMENT_BYTES / element_bytes
    return bytes_moved
