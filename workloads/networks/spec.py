"""What every network spec of the catalog shares: a name, a source, and ``layer_graph(shard)``.

The contract with the simulator (issue 19): a model spec offers ``layer_graph(shard)`` for one
micro-batch (``shard.micro_batch``) at ``shard.precision``, plus ``name``, ``seq_length`` (None
for images) and ``sample`` ("image", "sequence", "sentence"). The layers of these networks are
not split by context or sequence parallelism here: a shard asking for it is refused; tensor
parallelism splits them where the layer kind allows (workloads/tensor_parallel.py).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

from simulator.errors import ConfigError, no_bool_numbers
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


_WIDTH = "the widest layers trained have ~25,000 features (Megatron-1T's hidden 25,600; BigLSTM's 8,192; ResNets' 2,048 channels)"
_FFN = "the widest MLPs trained have ~100,000 features (Megatron-1T: 102,400)"
_DEPTH = "the deepest networks trained have ~1,000 layers (DeepNet's 1,000-layer transformer; ResNet-1001)"
_SEQUENCE = "the longest sequences trained are 10 M tokens (Llama 4 Scout)"
_VOCAB = "the largest vocabularies trained hold ~260,000 tokens (Gemma: 256,000; BigLSTM: 793,471 words)"
_IMAGE = "the largest images trained whole are a few thousand pixels a side (SAM: 1,024; EfficientNet-B7: 600)"
_HEADS = "the most attention heads trained is 160 (Megatron-1T)"

#: Upper bounds on the sizes of a network other than a decoder transformer (workloads/schema.py MODEL_SIZE_LIMITS is
#: the transformer's), by field name, each 20-1000x past any network trained, so none refuses a real network; they
#: catch a typo (extra zeros) that would make the simulator's per-layer work run for minutes (ResNet ``blocks`` of
#: 10**5: past a minute; each layer costs ~0.1-2 ms of Python) or its figures overflow into nonsense (an image of
#: 10**30 pixels printed a step of 10**54 s and 10**56 GiB of activations, exit 0).
NETWORK_SIZE_LIMITS: dict[str, tuple[float, str]] = {
    "image_size": (100_000, _IMAGE),
    "patch_size": (100_000, _IMAGE),
    "in_channels": (1_000_000, "the most input channels trained on are a few hundred (hyperspectral images: ~200)"),
    "base_channels": (1_000_000, _WIDTH),
    "width_per_group": (1_000_000, _WIDTH),
    "groups": (1_000_000, _WIDTH),
    "se_reduction": (1_000_000, _WIDTH),
    "hidden_dim": (1_000_000, _WIDTH),
    "hidden_size": (1_000_000, _WIDTH),
    "hidden": (1_000_000, _WIDTH),
    "projection": (1_000_000, _WIDTH),
    "embedding_dim": (1_000_000, _WIDTH),
    "mlp_dim": (10_000_000, _FFN),
    "intermediate_size": (10_000_000, _FFN),
    "num_heads": (100_000, _HEADS),
    "num_attention_heads": (100_000, _HEADS),
    "num_classes": (1_000_000_000, "the largest classifiers trained have ~10 M classes (face identities: Partial FC, "
                                   "An et al. 2021)"),
    "num_layers": (20_000, _DEPTH),
    "layers": (20_000, _DEPTH),
    # all stages together: each block is ~10 layers of the graph, and the per-layer work grows faster than the count
    # (2,500 blocks: ~7 CPU-s; 10,000: ~60)
    "blocks": (2_500, "the deepest ResNet trained, ResNet-1001, has 333 blocks (111 per stage; He et al. 2016, "
                      "arXiv:1603.05027)"),
    "depth": (100, "each U-Net level halves the image: 17 levels take 100,000 pixels to 1"),
    "width_mult": (100.0, "EfficientNet-L2, the largest trained, scales B0's widths by 4.3"),
    "depth_mult": (100.0, "EfficientNet-L2, the largest trained, scales B0's depths by 5.3"),
    "vocab_size": (10_000_000, _VOCAB),
    "type_vocab_size": (10_000_000, _VOCAB),
    "num_sampled": (10_000_000, _VOCAB),
    "sequence_length": (100_000_000, _SEQUENCE),
    "max_position_embeddings": (100_000_000, _SEQUENCE),
    "source_length": (100_000_000, _SEQUENCE),
    "target_length": (100_000_000, _SEQUENCE),
    "steps": (100_000_000, _SEQUENCE),
    # each dimension of a traced model's sample: channels, pixels or tokens
    "input_shape": (100_000_000, "a traced model's sample is at most a 10 M-token sequence (Llama 4 Scout) or an "
                                 "image of a few thousand pixels a side"),
    "profile_batch": (100_000_000, "the largest batches trained hold ~100,000 samples (LARS/LAMB: 64-128 K images)"),
}


def network_size_bound(cls, value, info):
    """Refuse a network size past :data:`NETWORK_SIZE_LIMITS` with the bound and why (``blocks``: their sum over the
    stages; another list: each item)."""
    bound = NETWORK_SIZE_LIMITS.get(info.field_name)
    if bound is None or value is None:
        return value
    limit, why = bound
    summed = info.field_name == "blocks"
    for item in (sum(value),) if summed else value if isinstance(value, tuple | list) else (value,):
        if isinstance(item, int | float) and item > limit:
            raise ValueError(f"{item:,}{' in all' if summed else ''} is past the limit of {limit:,} ({why}; a larger figure is likely a typo and "
                             "would make the simulation run for minutes or its figures overflow)")
    return value


class NetworkSpec(BaseModel):
    """Base of the non-transformer catalog specs; subclasses set ``family`` and build in ``_build``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # `image_size: true` is an error, not 1 (named fields: a before-validator on "*" would reach the family tag)
    _no_bool_numbers = field_validator(*NETWORK_SIZE_LIMITS, "dropout", mode="before", check_fields=False)(
        no_bool_numbers)
    _size_bound = field_validator(*NETWORK_SIZE_LIMITS, check_fields=False)(network_size_bound)

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
