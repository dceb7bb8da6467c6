"""What every network spec of the catalog shares: a name, a source, and ``layer_graph(shard)``.

The contract with the simulator (issue 19): a model spec offers ``layer_graph(shard)`` for one
micro-batch (``shard.micro_batch``) at ``shard.precision``, plus ``name``, ``seq_length`` (None
for images) and ``sample`` ("image", "sequence", "sentence"). The layers of these networks are
not split by context or sequence parallelism here: a shard asking for it is refused; tensor
parallelism splits them where the layer kind allows (workloads/tensor_parallel.py).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from simulator.errors import ConfigError
from workloads.graph import ShardShape
from workloads.layer_graph import LayerGraph
from workloads.networks.builder import NetBuilder
from workloads.tensor_parallel import tensor_parallel_graph


def refuse_split(name: str, shard: ShardShape, tensor_parallel: bool = False) -> None:
    """A ConfigError when ``shard`` splits a layer (tp unless ``tensor_parallel``, cp or sequence
    parallel) of ``name``."""
    for label, value in (("tp", 1 if tensor_parallel else shard.tp), ("cp", shard.cp)):
        if value > 1:
            raise ConfigError(f"parallelism.{label}", f"{name}: its layers cannot be split by {label} "
                                                      f"(got {label} {value}); use data or pipeline parallelism")
    if shard.sequence_parallel:
        raise ConfigError("parallelism.sequence_parallel", f"{name}: its layers cannot be split by sequence "
                                                           "parallelism")


class NetworkSpec(BaseModel):
    """Base of the non-transformer catalog specs; subclasses set ``family`` and build in ``_build``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str = ""
    sample: ClassVar[str] = "image"

    @property
    def seq_length(self) -> int | None:
        return None

    @property
    def tokens_per_sample(self) -> int | None:
        """Tokens one sample is cut into, where the network works on a token sequence (for tokens/s);
        None for a network without one (a CNN's image)."""
        return self.seq_length

    def layer_graph(self, shard: ShardShape) -> LayerGraph:
        """The network's layers for ``shard.micro_batch`` samples at ``shard.precision``."""
        refuse_split(self.name, shard, tensor_parallel=True)
        builder = NetBuilder(self.name, shard.micro_batch, shard.act_bytes, self.sample, self.seq_length, shard)
        self._build(builder)
        return tensor_parallel_graph(builder.output(), shard.tp)

    def _build(self, net: NetBuilder) -> None:  # pragma: no cover - every subclass overrides
        raise NotImplementedError
