"""Which class a memory-bound kernel belongs to, for the spec's per-class efficiencies.

The layer-graph builder names a layer's memory-bound ops ``<layer>.<kernel>`` and their backward
``<layer>.<kernel>.grad`` (workloads/networks/builder.py: ``maxpool``, ``avgpool``,
``adaptive_avgpool``, ``concat``, ``bn``, ``relu``, ``add``...). Pooling backward and
concatenation run far below streaming bandwidth in PyTorch's NCHW kernels; DeepPool's A100
profiles measure them (validation/deeppool_model.py fits ``memory_kernels``).
"""

from __future__ import annotations


def memory_kernel_class(op_name: str) -> str:
    """``"stem.pool.maxpool.grad"`` -> ``"maxpool"``: the kernel token of a builder op's name."""
    name = op_name[:-len(".grad")] if op_name.endswith(".grad") else op_name
    return name.rsplit(".", 1)[-1]
