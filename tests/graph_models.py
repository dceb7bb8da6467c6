"""A tiny hand-built graph model for the tests: a chain of linear layers (one GEMM each), the
smallest thing that is a layer graph and not a transformer. Not a catalog model. Under tp > 1 it
is split the Megatron way (workloads/tensor_parallel.py): pairs of column- then row-parallel layers."""

from __future__ import annotations

from dataclasses import dataclass

from workloads.graph import ShardShape, _backward_of, _linear
from workloads.layer_graph import Layer, LayerGraph
from workloads.tensor_parallel import tensor_parallel_graph


@dataclass(frozen=True)
class ChainSpec:
    """``len(widths)`` linear layers; layer i multiplies ``rows`` x ``widths[i]`` inputs per sample
    by a ``widths[i]`` x ``out`` weight (M = rows·micro-batch, K = widths[i], N = out)."""

    name: str = "chain"
    widths: tuple[int, ...] = (256, 256)
    rows: int = 256
    out: int = 256
    kind: str = "linear"
    seq_length: int | None = None
    sample: str = "image"

    def layer_graph(self, shard: ShardShape) -> LayerGraph:
        elem = shard.act_bytes
        m = self.rows * shard.micro_batch
        layers = []
        for i, k in enumerate(self.widths):
            forward = (_linear(f"fc{i}", m, self.out, k, elem, bias=False),)   # holds its k x out weight
            backward = tuple(_backward_of(forward[0]))
            layers.append(Layer(f"fc{i}", self.kind, forward, backward,
                                saved_bytes=float(m * k * elem), output_bytes=float(m * self.out * elem),
                                inputs=(f"fc{i - 1}",) if i else ()))
        graph = LayerGraph(self.name, tuple(layers), shard.micro_batch, sample=self.sample)
        return tensor_parallel_graph(graph, shard.tp)
