"""The parallel layout (strategy) and its validation against a model and a GPU count.

Rank order, innermost first, is Megatron-LM's default ``tp-cp-ep-dp-pp``: tensor-parallel
groups are consecutive ranks (inside a node) and pipeline stages are the outermost split
(across nodes). ``dp: auto`` infers dp from
the GPU count (torchtitan's ``-1``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.errors import ConfigError
from workloads.schema import TransformerSpec

Schedule = Literal["gpipe", "1f1b", "interleaved", "zb-h1"]
Recompute = Literal["none", "selective", "full"]


class Parallelism(BaseModel):
    """How the job is split. ``dp`` may be ``"auto"`` until :func:`resolve_layout` fixes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = Field(default=1, gt=0, description="tensor-parallel degree (Megatron column/row split)")
    pp: int = Field(default=1, gt=0, description="pipeline stages")
    dp: int | Literal["auto"] = Field(default="auto", description="data-parallel replicas")
    cp: int = Field(default=1, gt=0, description="context-parallel degree")
    ep: int = Field(default=1, gt=0, description="expert-parallel degree (carved out of dp)")
    virtual_stages: int = Field(default=1, gt=0, description="model chunks per pipeline rank")
    schedule: Schedule = "1f1b"
    sequence_parallel: bool = False
    zero_stage: Literal[0, 1, 2, 3] = 0
    zero_shard_size: int | None = Field(
        default=None, gt=0,
        description="hybrid sharding (FSDP HYBRID_SHARD / HSDP): ZeRO shards over groups of this many dp "
                    "ranks and replicates across groups; default: shard over all of dp")
    recompute: Recompute = "none"
    micro_batch_size: int = Field(default=1, gt=0, description="sequences per micro-batch per replica")
    global_batch_size: int = Field(default=512, gt=0, description="sequences per optimizer step")
    moe_load_imbalance: float = Field(default=1.0, ge=1.0, description="tokens of the busiest expert / mean")
    gradient_bucket_mb: float = Field(default=25.0, gt=0, description="DDP all-reduce bucket size (MB)")
    overlap_grad_reduce: bool = True
    overlap_cp_comm: bool = Field(default=True, description="ring-attention K/V passes overlapped with attention")
    overlap_tp_grad_comm: bool = Field(
        default=True,
        description="TP input-gradient all-reduce/reduce-scatter overlapped with the weight-gradient GEMM "
                    "(Megatron-LM's asynchronous TP communication, on by default since late 2021)",
    )
    overlap_param_gather: bool = True

    @property
    def dp_degree(self) -> int:
        if self.dp == "auto":
            raise ConfigError("parallelism.dp", "not resolved yet (call resolve_layout)")
        return int(self.dp)

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per replica per step."""
        return self.global_batch_size // (self.dp_degree * self.micro_batch_size)

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.cp * self.pp


def resolve_layout(par: Parallelism, model: TransformerSpec, num_gpus: int) -> Parallelism:
    """Infer ``dp`` and check every divisibility rule; raise ConfigError naming the field."""
    mp = par.tp * par.cp * par.pp
    if par.dp == "auto":
        if num_gpus % mp:
            raise ConfigError("parallelism", f"tp*cp*pp = {mp} does not divide num_gpus = {num_gpus}")
        dp = num_gpus // mp
    else:
        dp = int(par.dp)
        if dp <= 0:
            raise ConfigError("parallelism.dp", "must be a positive integer or 'auto'")
        if dp * mp != num_gpus:
            raise ConfigError(
                "parallelism",
                f"tp*cp*pp*dp = {par.tp}*{par.cp}*{par.pp}*{dp} = {dp * mp} does not equal num_gpus = {num_gpus}",
            )
    if model.num_attention_heads % par.tp:
        raise ConfigError("parallelism.tp", f"{par.tp} does not divide attention heads ({model.num_attention_heads})")
    if model.kv_heads % par.tp and par.tp % model.kv_heads:
        raise ConfigError("parallelism.tp", f"{par.tp} and kv heads ({model.kv_heads}) do not divide one another")
    if model.ffn_size % par.tp:
        raise ConfigError("parallelism.tp", f"{par.tp} does not divide the FFN size ({model.ffn_size})")
    chunks = par.pp * par.virtual_stages
    if chunks > model.num_layers:
        raise ConfigError(
            "parallelism.pp",
            f"pp*virtual_stages = {chunks} exceeds the model's {model.num_layers} layers",
        )
    if par.virtual_stages > 1 and par.schedule != "interleaved":
        raise ConfigError("parallelism.virtual_stages", "more than 1 needs schedule: interleaved")
    if par.zero_shard_size is not None:
        if par.zero_stage == 0:
            raise ConfigError("parallelism.zero_shard_size", "needs zero_stage >= 1")
        if par.cp > 1:
            raise ConfigError("parallelism.zero_shard_size", "hybrid sharding with cp > 1 is not simulated yet")
        if dp % par.zero_shard_size:
            raise ConfigError("parallelism.zero_shard_size", f"{par.zero_shard_size} does not divide dp = {dp}")
    if par.schedule == "zb-h1" and par.zero_stage == 3:
        raise ConfigError("parallelism.schedule", "zb-h1 with ZeRO-3 is not simulated yet")
    if par.schedule == "interleaved" and par.pp == 1:
        raise ConfigError("parallelism.schedule", "interleaved needs pp > 1")
    if par.ep > 1 and not model.is_moe:
        raise ConfigError("parallelism.ep", "expert parallelism needs a mixture-of-experts model")
    if par.ep > 1 and dp % par.ep:
        raise ConfigError("parallelism.ep", f"{par.ep} does not divide dp = {dp}")
    if model.moe is not None:
        if model.moe.num_experts % par.ep:
            raise ConfigError("parallelism.ep", f"{par.ep} does not divide the {model.moe.num_experts} experts")
        if model.moe.moe_layer_frequency != 1:
            raise ConfigError("model.moe.moe_layer_frequency", "only every-layer MoE is simulated so far")
    if par.sequence_parallel and par.tp == 1:
        raise ConfigError("parallelism.sequence_parallel", "needs tp > 1")
    replica_batch = dp * par.micro_batch_size
    if par.global_batch_size % replica_batch:
        raise ConfigError(
            "parallelism.global_batch_size",
            f"{par.global_batch_size} is not divisible by dp*micro_batch_size = {dp}*{par.micro_batch_size}",
        )
    micro_batches = par.global_batch_size // replica_batch
    if par.schedule == "interleaved" and micro_batches % par.pp:
        raise ConfigError(
            "parallelism.global_batch_size",
            f"interleaved schedule needs micro-batches per replica ({micro_batches}) divisible by pp ({par.pp})",
        )
    return par.model_copy(update={"dp": dp})


def split_layers(num_layers: int, num_chunks: int) -> list[int]:
    """Layers per model chunk, as even as possible; when uneven, the first and last chunks
    take fewer (they also carry the embedding and the loss), e.g. 126 layers on 16 -> 7,8,...,8,7."""
    if num_chunks <= 0 or num_chunks > num_layers:
        raise ConfigError("parallelism.pp", f"cannot split {num_layers} layers into {num_chunks} chunks")
    base, extra = divmod(num_layers, num_chunks)
    if extra == 0:
        return [base] * num_chunks
    # Give every chunk base+1, then take the surplus away from the two ends alternately.
    counts = [base + 1] * num_chunks
    surplus = num_chunks - extra
    order = []
    lo, hi = 0, num_chunks - 1
    while len(order) < num_chunks:
        order.append(lo)
        if hi != lo:
            order.append(hi)
        lo, hi = lo + 1, hi - 1
    for idx in order[:surplus]:
        counts[idx] -= 1
    return counts


def data_parallel_groups_per_node(par: Parallelism, gpus_per_node: int) -> int:
    """How many members of one dp group share a node (consecutive tp*cp ranks fill a node first)."""
    inner = par.tp * par.cp
    if inner >= gpus_per_node:
        return 1
    return max(1, min(par.dp_degree, gpus_per_node // inner))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)

