"""The parallel layout (strategy) and its validation against a model and a GPU count.

Rank order, innermost first, is Megatron-LM's default ``tp-cp-ep-dp-pp``: tensor-parallel
groups are consecutive ranks (inside a node) and pipeline stages are the outermost split
(across nodes). ``dp: auto`` infers dp from
the GPU count (torchtitan's ``-1``).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from simulator.errors import ConfigError, no_bool_numbers
from workloads.graph import RECOMPUTE_MODULES, ShardShape, modules_mode, partial_full_mode
from workloads.schema import TransformerSpec
from workloads.tensor_parallel import tensor_parallel_graph
from workloads.transformer_graph import TENSOR_PARALLEL_KINDS

Schedule = Literal["gpipe", "1f1b", "interleaved", "zb-h1"]
Recompute = Literal["none", "selective", "selective_op", "full"]
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
assert get_args(RecomputeModule) == RECOMPUTE_MODULES  # one list (workloads/graph.py), spelled for the schema


class Parallelism(BaseModel):
    """How the job is split. ``dp`` may be ``"auto"`` until :func:`resolve_layout` fixes it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)

    tp: int = Field(default=1, gt=0, description="tensor-parallel degree (Megatron column/row split)")
    pp: int = Field(default=1, gt=0, description="pipeline stages")
    dp: int | Literal["auto"] = Field(default="auto", description="data-parallel replicas")
    cp: int = Field(default=1, gt=0, description="context-parallel degree")
    ep: int = Field(default=1, gt=0, description="expert-parallel degree (carved out of dp; with etp > 1 or an ep "
                                                 "that does not divide dp, out of the stage's tp*cp*dp ranks)")
    etp: int | None = Field(
        default=None, gt=0,
        description="expert tensor-parallel degree (Megatron-Core expert_tensor_parallel_size): each routed expert's "
                    "FFN split over etp ranks (fc1 by columns, fc2 by rows), its tokens all-gathered over them after "
                    "the dispatch and reduce-scattered before the combine. Given (1 or more), the expert groups fold "
                    "over a pipeline stage's tp*cp*dp ranks in Megatron-Core's order (etp innermost, then ep, then the "
                    "expert-data-parallel replicas: MoE parallel folding). Unset: experts whole, and the groups lie "
                    "inside data parallelism (ep dp-ranks at equal tp/cp coordinates) where ep divides dp, folded "
                    "with etp 1 where it does not")
    virtual_stages: int = Field(default=1, gt=0, description="model chunks per pipeline rank")
    first_stage_layers: int | None = Field(
        default=None, ge=0,
        description="layers on the first pipeline rank (Megatron-LM --decoder-first-pipeline-num-layers); "
                    "the rest split evenly over the other stages; with virtual stages, over its chunks")
    last_stage_layers: int | None = Field(
        default=None, ge=0,
        description="layers on the last pipeline rank (Megatron-LM --decoder-last-pipeline-num-layers)")
    schedule: Schedule = "1f1b"
    pp_split: Literal["even", "balanced"] = Field(
        default="even",
        description="how pipeline chunks are cut: even (the same number of layers each, Megatron-LM) or "
                    "balanced (contiguous layers cut to minimise the schedule's step estimate over the passes and the "
                    "sends at the cuts; the even cut unless another is 0.5% faster by it; for uneven graphs)")
    sequence_parallel: bool = False
    zero_stage: Literal[0, 1, 2, 3] = 0
    zero_shard_size: int | None = Field(
        default=None, gt=0,
        description="hybrid sharding (FSDP HYBRID_SHARD / HSDP): ZeRO shards over groups of this many dp "
                    "ranks and replicates across groups; default: shard over all of dp")
    recompute: Recompute = Field(
        default="none",
        description="selective: the attention core (Korthikanti 2022); for MLA models also the RMSNorms "
                    "and MLA up-projections (DeepSeek-V3 Sec. 3.2.3); selective_op: torchtitan's per-op "
                    "selective checkpointing (saves the mm outputs but every second, the attention and the "
                    "TP reduce-scatters; re-runs the norms, wk, w3 and the TP all-gathers; dense blocks); "
                    "full: the whole layer")
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        default=None,
        description="with recompute: selective, Megatron-Core's recompute_modules (--recompute-modules): the "
                    "modules re-run in the backward, in place of the default: core_attn (the attention core), "
                    "layernorm (the norms that are modules of their own: a MoE block's pre-MLP norm, MLA's input "
                    "norm), mlp (a dense block's MLP), moe (a MoE block's experts, router and dispatch), moe_act "
                    "(the routed experts' activation), shared_experts, mla_up_proj (MLA's up-projections); each "
                    "keeps its input and drops what it saved (workloads/transformer_graph.py _module_drops). "
                    "Unset: selective as described under recompute")
    recompute_method: Literal["uniform", "block"] | None = Field(
        default=None,
        description="with recompute: full, Megatron-Core's recompute_method (--recompute-method) with "
                    "recompute_num_layers N, per model chunk (a pipeline stage, or each virtual stage of one): "
                    "block = the chunk's first N layers are re-run and keep only their inputs, the rest keep "
                    "their activations; uniform = the chunk's layers in units of N, each keeping only its first "
                    "layer's input and re-running its N forwards before its backward (N must divide the chunk). "
                    "Unset: every layer re-run, keeping its input (uniform 1)")
    recompute_num_layers: int | None = Field(
        default=None, gt=0,
        description="with recompute_method, Megatron-Core's recompute_num_layers (--recompute-num-layers): the "
                    "layers re-run per chunk (block) or per checkpoint unit (uniform)")
    micro_batch_size: int = Field(default=1, gt=0, description="sequences per micro-batch per replica")
    global_batch_size: int = Field(default=512, gt=0, description="sequences per optimizer step")
    moe_load_imbalance: float = Field(default=1.0, ge=1.0, description="tokens of the busiest expert / mean")
    gradient_bucket_mb: float = Field(default=25.0, gt=0, description="DDP all-reduce bucket size (MB)")
    overlap_grad_reduce: bool = True
    overlap_cp_comm: bool = Field(default=True, description="ring-attention K/V passes overlapped with attention")
    cp_comm: Literal["ring", "all_gather"] = Field(
        default="ring",
        description="context parallel K/V exchange: ring (ring attention, Megatron-LM p2p) or all_gather "
                    "(gather K/V before attention, reduce-scatter dK/dV after: Llama 3, arXiv:2407.21783 Sec. 3.3.2)")
    cp_load_balance: bool = Field(
        default=True,
        description="causal load balancing under cp: the sequence in 2*cp chunks, rank i holding chunks i and "
                    "2cp-1-i, so every rank does the same causal attention work (otherwise the last rank does most)")
    overlap_tp_grad_comm: bool = Field(
        default=True,
        description="TP input-gradient all-reduce/reduce-scatter overlapped with the weight-gradient GEMM "
                    "(Megatron-LM's asynchronous TP communication, on by default since late 2021)",
    )
    overlap_param_gather: bool = Field(
        default=True,
        description="parameter all-gathers hidden behind compute: ZeRO-1/2 gather each chunk's updated weights at "
                    "the step's start (Megatron --overlap-param-gather), ZeRO-3 prefetches the next layer's "
                    "weights during the current one (FSDP/DeepSpeed prefetch); off: ZeRO-1/2 gather after the "
                    "optimizer step, ZeRO-3 gathers each layer only once the one before has finished and the "
                    "compute waits (PyTorch FSDP2 over gloo, whose collectives block the host)")
    zero3_backward_prefetch: Literal["pre", "post"] = Field(
        default="pre",
        description="ZeRO-3 backward prefetch (with overlap_param_gather): pre = the next layer's all-gather is "
                    "issued when the current layer's backward starts (PyTorch FSDP BACKWARD_PRE, FSDP2's implicit "
                    "prefetch, Megatron-FSDP), so it runs beside that layer's kernels; post = issued when the "
                    "current layer's backward ends, ahead of its gradient reduce-scatter (FSDP BACKWARD_POST, "
                    "MosaicML Composer's default): the next layer waits for its gather")
    zero3_reduce_overlap: bool = Field(
        default=True,
        description="ZeRO-3 gradient reduce-scatters run beside the next layers' backward (FSDP2/FSDP1 on their "
                    "reduce-scatter stream, DeepSpeed); off: each one blocks the compute until it is done, the "
                    "next layer's backward waiting for it (PyTorch FSDP2 over gloo on a CPU: foreach_reduce calls "
                    "the collective with async_op false on the autograd thread and a CPU stream does nothing)")
    ddp_bucket_copies: bool | Literal["bucket_view"] = Field(
        default=False,
        description="ZeRO-0 gradient buckets as PyTorch DDP's C++ reducer fills them. true (DDP's default, "
                    "gradient_as_bucket_view false): each gradient copied into its flat bucket while divided by the "
                    "world size (reducer::mul_out) before the bucket's all-reduce, and the bucket copied back into "
                    "the gradients after it (copy_bucket_to_grad): two memory-bound passes (read + write) over the "
                    "gradients. bucket_view (gradient_as_bucket_view true): the gradients are views of the buckets, "
                    "divided in place (one pass). false (the default): the reduction runs on the gradients where "
                    "they are, scaled inside the collective (Megatron-Core's contiguous grad buffer)")
    zero_buffer_copies: bool | Literal["fsdp1"] = Field(
        default=True,
        description="ZeRO-2/3 copy kernels. true: as PyTorch FSDP2 runs them (torch 2.13 _fsdp_collectives.py): "
                    "before each all-gather the rank's shard is copied into the gather input (all_gather_copy_in, "
                    "P/n), after it the whole gathered buffer is copied out into the layer's parameters "
                    "(split_with_sizes_copy, P) and each gradient bucket is copied into the reduce-scatter "
                    "input (chunk_cat, P); DeepSpeed's partition and ipg buckets priced alike. fsdp1: as PyTorch "
                    "FSDP1's FlatParameter runs them (torch fsdp/_flat_param.py, _runtime_utils.py): the "
                    "low-precision cast of the shard before the gather (_use_low_precision_shard, P/n), no "
                    "copy-out (the layer's parameters are views of the gathered flat parameter), and in the "
                    "backward the views' gradients concatenated into the flat gradient (split's backward, P, "
                    "compute stream), then on the reduce stream its cast to the reduce dtype where that "
                    "differs and the pre-division by the gradient predivide factor (_div_if_needed, P) "
                    "before the reduce-scatter (MosaicML Composer, IBM fms-fsdp). false: parameters and "
                    "gradients are views of persistent communication buffers and nothing is copied "
                    "(Megatron-FSDP's parameter/gradient buffers)")
    overlap_p2p_comm: bool = Field(
        default=True,
        description="pipeline sends run beside the sender's next kernels (Megatron-LM --overlap-p2p-communication); "
                    "off: the sender waits for each send before its next pass (blocking send/recv)")
    overlap_moe_comm: bool = Field(
        default=False,
        description="expert all-to-alls hidden behind another micro-batch's computation (DeepSeek-V3 DualPipe, "
                    "Megatron-core EP overlap); exposed only where longer than the pass's kernels")
    moe_dispatch: Literal["all_to_all", "deepep"] = Field(
        default="all_to_all",
        description="expert-parallel token dispatch and combine across nodes: all_to_all (one copy per routed "
                    "expert: NCCL all-to-all, Megatron's alltoall dispatcher) or deepep (each token crosses a node's "
                    "InfiniBand once, then NVLink to its experts there: DeepSeek-V3 Sec. 3.2.2, the DeepEP library, "
                    "Megatron's flex dispatcher)")
    tp_comm_overlap: bool = Field(
        default=False,
        description="userbuffers-style TP overlap (Transformer Engine --tp-comm-overlap; needs sequence_parallel): "
                    "the all-gather before a column-parallel GEMM and the reduce-scatter after a row-parallel one "
                    "are split into chunks pipelined with that GEMM, forward and backward")
    tp_overlap: Literal["userbuffers", "async_tp"] = Field(
        default="userbuffers",
        description="how tp_comm_overlap pipelines (workloads/graph.py _tp_overlap): userbuffers (Transformer "
                    "Engine: the collective beside the whole GEMM) or async_tp (PyTorch AsyncTP, torchtitan: the "
                    "GEMM in tp chunks of m/tp rows, one chunk exposed, the reduce-scatter's partial chunks summed "
                    "by a kernel)")

    @field_validator("recompute_modules", mode="before")
    @classmethod
    def _a_list(cls, value):
        if isinstance(value, str):
            raise ValueError(f"a list of module names (e.g. [layernorm, moe_act]), got the string {value!r}")
        return value

    @model_serializer(mode="wrap")
    def _without_unset_modules(self, handler):
        """Dumps (``--json``, search rows, sweeps) leave ``recompute_modules`` out when it is unset: a run that
        does not set it dumps as before the field existed; so do ``recompute_method`` / ``recompute_num_layers``,
        and ``zero3_reduce_overlap`` where it is on (its default: every run but a CPU FSDP2-over-gloo one)."""
        data = handler(self)
        if isinstance(data, dict):
            for name in ("recompute_modules", "recompute_method", "recompute_num_layers"):
                if getattr(self, name) is None:
                    data.pop(name, None)
            if self.zero3_reduce_overlap:
                data.pop("zero3_reduce_overlap", None)
        return data

    @property
    def recompute_mode(self) -> str:
        """The recompute mode the layer graph reads: ``recompute``, or with ``recompute_modules`` the module
        list's mode string (workloads/graph.py ``modules_mode``: "selective:layernorm,moe_act"), or with
        ``recompute_method`` the partial full recompute's (``partial_full_mode``: "full:block:5")."""
        if self.recompute_method is not None and self.recompute_num_layers is not None:
            return partial_full_mode(self.recompute_method, self.recompute_num_layers)
        if self.recompute_modules is None:
            return self.recompute
        return modules_mode(self.recompute_modules)

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

    @property
    def etp_degree(self) -> int:
        """Expert tensor-parallel degree (1 when ``etp`` is unset)."""
        return self.etp or 1

    @property
    def experts_folded(self) -> bool:
        """Whether expert groups fold over the stage's tp*cp*dp ranks (Megatron-Core MoE parallel
        folding) rather than lie inside data parallelism: with ``etp`` given (and experts split at
        all), or an ep that dp cannot hold."""
        if self.etp is not None and (self.ep > 1 or self.etp > 1):
            return True
        return self.ep > 1 and self.dp_degree % self.ep != 0

    @property
    def expert_data_parallel_size(self) -> int:
        """Ranks holding the same routed-expert shard (its gradients are reduced and its ZeRO state is
        sharded over them): dp*cp/ep inside data parallelism, tp*cp*dp/(etp*ep) when folded."""
        if self.experts_folded:
            return self.tp * self.cp * self.dp_degree // (self.etp_degree * self.ep)
        return self.dp_degree * self.cp // self.ep


MAX_MICRO_BATCHES = 16_384
"""Most micro-batches per replica one simulated step may have. The simulation's work grows with
them (a task per micro-batch per stage per layer chunk): 10^12 sequences per step took 24 GB and
was killed by the kernel. Published runs use at most a few thousand (GPT-3 175B on 1024 A100s:
1536 / dp 16 = 96)."""


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
    if isinstance(model, TransformerSpec):
        if model.num_attention_heads % par.tp:
            raise ConfigError("parallelism.tp", f"{par.tp} does not divide attention heads ({model.num_attention_heads})")
        if model.kv_heads % par.tp and par.tp % model.kv_heads:
            raise ConfigError("parallelism.tp", f"{par.tp} and kv heads ({model.kv_heads}) do not divide one another")
        if model.ffn_size % par.tp:
            raise ConfigError("parallelism.tp", f"{par.tp} does not divide the FFN size ({model.ffn_size})")
        num_layers = model.num_layers
    else:
        num_layers = _check_graph_layout(par, model)
    chunks = par.pp * par.virtual_stages
    if chunks > num_layers:
        raise ConfigError(
            "parallelism.pp",
            f"pp*virtual_stages = {chunks} exceeds the model's {num_layers} layers",
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
    if par.ep > 1 and not getattr(model, "is_moe", False):
        raise ConfigError("parallelism.ep", "expert parallelism needs a mixture-of-experts model")
    if par.etp_degree > 1 and not getattr(model, "is_moe", False):
        raise ConfigError("parallelism.etp", "expert tensor parallelism needs a mixture-of-experts model")
    _check_expert_layout(par.model_copy(update={"dp": dp}), model, dp)
    if getattr(model, "moe", None) is not None:
        if model.moe.num_experts % par.ep:
            raise ConfigError("parallelism.ep", f"{par.ep} does not divide the {model.moe.num_experts} experts")
    if par.sequence_parallel and par.tp == 1:
        raise ConfigError("parallelism.sequence_parallel", "needs tp > 1")
    if par.tp_comm_overlap and not par.sequence_parallel:
        raise ConfigError("parallelism.tp_comm_overlap",
                          "needs sequence_parallel: true (it pipelines the all-gather / reduce-scatter pair)")
    _check_recompute_modules(par, model)
    if par.recompute == "selective_op" and (not isinstance(model, TransformerSpec) or model.mla is not None
                                            or model.moe is not None):
        raise ConfigError("parallelism.recompute", "selective_op (torchtitan's per-op policy) is modelled for "
                                                   "dense transformer blocks (MHA/GQA, no MoE, no MLA) only")
    if getattr(model, "mla", None) is not None and par.cp > 1:
        raise ConfigError("parallelism.cp", "multi-head latent attention with context parallelism is not simulated yet")
    if getattr(model, "sliding_window_tokens", None) is not None and par.cp > 1:
        raise ConfigError("parallelism.cp", "sliding-window attention with context parallelism is not simulated "
                                            "(a rank's window reaches only its neighbour's chunk); use cp 1")
    if par.pp_split == "balanced" and (par.first_stage_layers is not None or par.last_stage_layers is not None):
        raise ConfigError("parallelism.pp_split", "balanced sets the layers per stage itself: leave "
                                                  "first_stage_layers / last_stage_layers unset")
    counts = chunk_layer_counts(par, num_layers)  # checks first_stage_layers / last_stage_layers
    _check_partial_full(par, model, counts)
    replica_batch = dp * par.micro_batch_size
    if par.dp == "auto" and replica_batch > par.global_batch_size:
        # dp came from cluster.num_gpus: more replicas than the batch has micro-batches is a cluster too
        # large (or a num_gpus typed with extra zeros), not a batch that dp does not divide
        raise ConfigError(
            "cluster.num_gpus",
            f"{num_gpus:,} GPUs give dp = num_gpus/(tp*cp*pp) = {dp:,} replicas, more than the global batch of "
            f"{par.global_batch_size} samples feeds at micro_batch_size {par.micro_batch_size} (at most "
            f"{par.global_batch_size // par.micro_batch_size * mp:,} GPUs at tp*cp*pp = {mp}); use fewer GPUs or a "
            "larger parallelism.global_batch_size",
        )
    if par.global_batch_size % replica_batch:
        raise ConfigError(
            "parallelism.global_batch_size",
            f"{par.global_batch_size} is not divisible by dp*micro_batch_size = {dp}*{par.micro_batch_size}",
        )
    micro_batches = par.global_batch_size // replica_batch
    if micro_batches > MAX_MICRO_BATCHES:
        raise ConfigError(
            "parallelism.global_batch_size",
            f"{par.global_batch_size} gives {micro_batches:,} micro-batches per replica per step; at most "
            f"{MAX_MICRO_BATCHES:,} are simulated (raise micro_batch_size or lower the batch)",
        )
    if par.schedule == "interleaved" and micro_batches % par.pp:
        raise ConfigError(
            "parallelism.global_batch_size",
            f"interleaved schedule needs micro-batches per replica ({micro_batches}) divisible by pp ({par.pp})",
        )
    return par.model_copy(update={"dp": dp})


def _check_recompute_modules(par: Parallelism, model) -> None:
    """Refuse a ``recompute_modules`` list that Megatron-Core refuses or that names a module the model lacks
    (megatron-core 0.16.1 ``transformer/transformer_config.py`` ``__post_init__``: mla_up_proj needs
    multi-latent attention, moe_act needs grouped-GEMM experts; a module the model has none of would re-run
    nothing: the same run as without it under another name)."""
    modules = par.recompute_modules
    if modules is None:
        return
    field = "parallelism.recompute_modules"
    if par.recompute != "selective":
        raise ConfigError(field, f"is read with recompute: selective (Megatron-Core recompute_granularity "
                                 f"selective), got recompute: {par.recompute}")
    if not modules:
        raise ConfigError(field, "an empty list re-runs nothing: use recompute: none")
    if len(set(modules)) != len(modules):
        raise ConfigError(field, f"lists a module twice: {list(modules)}")
    if not isinstance(model, TransformerSpec):
        raise ConfigError(field, f"names Megatron-Core transformer modules; {model.name} is not a decoder transformer")
    moe, mla = model.moe, model.mla
    dense_layers = moe is None or any(not model.is_moe_layer(i) for i in range(model.num_layers))
    missing = {
        "mla_up_proj": None if mla is not None else "has no multi-latent attention (Megatron-Core: mla_up_proj "
                                                     "needs multi_latent_attention)",
        "moe_act": None if moe is not None else "has no mixture-of-experts layer (Megatron-Core: moe_act needs "
                                                "moe_grouped_gemm)",
        "moe": None if moe is not None else "has no mixture-of-experts layer",
        "shared_experts": None if moe is not None and moe.num_shared_experts else "has no shared experts",
        "mlp": None if dense_layers else "has no dense MLP layer (every layer is MoE: list moe or moe_act)",
        "layernorm": None if moe is not None or mla is not None else
        "fuses both norms into its GEMMs (Megatron-Core's Transformer Engine spec: the input norm into linear_qkv, "
        "a dense layer's pre-MLP norm into linear_fc1), so no norm is recomputed: list mlp",
    }
    for module in modules:
        if missing.get(module):
            raise ConfigError(field, f"{module}: {model.name} {missing[module]}")


def _check_partial_full(par: Parallelism, model, counts: list[int]) -> None:
    """Refuse ``recompute_method`` / ``recompute_num_layers`` as Megatron-Core 0.16.1 does, or where it would fail
    or the simulator does not price them (``transformer/transformer_config.py`` ``__post_init__``: the number is
    needed with full granularity and refused with selective; ``transformer/transformer_block.py``
    ``_checkpointed_forward``: uniform indexes the chunk's layers up to i + N). ``counts``: layers per chunk."""
    method, n = par.recompute_method, par.recompute_num_layers
    if method is None and n is None:
        return
    if method is None:
        raise ConfigError("parallelism.recompute_num_layers", "is read with recompute_method (uniform or block)")
    if n is None:
        raise ConfigError("parallelism.recompute_num_layers", f"is needed with recompute_method: {method} "
                                                              "(Megatron-Core: the layers re-run per chunk or unit)")
    field = "parallelism.recompute_method"
    if par.recompute != "full":
        raise ConfigError(field, f"is read with recompute: full (Megatron-Core recompute_granularity full), got "
                                 f"recompute: {par.recompute}")
    if not isinstance(model, TransformerSpec):
        raise ConfigError(field, f"counts Megatron-Core transformer layers; {model.name} is not a decoder transformer")
    if par.pp_split == "balanced":
        raise ConfigError(field, "with pp_split: balanced is not priced (the balanced cut prices every layer "
                                 "as re-run); use even")
    largest = max(counts)
    if n > largest:
        raise ConfigError("parallelism.recompute_num_layers", f"{n} exceeds the {largest} layers of the largest "
                                                              f"model chunk (layers per pipeline stage / virtual stage)")
    if method == "uniform":
        uneven = sorted({c for c in counts if c % n})
        if uneven:
            raise ConfigError("parallelism.recompute_num_layers",
                              f"uniform units of {n} layers do not divide a chunk of {uneven[0]} layers "
                              f"(Megatron-Core's _checkpointed_forward would index past the chunk)")


def _check_expert_layout(par: Parallelism, model, dp: int) -> None:
    """Expert groups inside data parallelism (ep divides dp, etp unset: the layout before etp) or folded over a
    stage's tp*cp*dp ranks (Megatron-Core MoE parallel folding, arXiv:2504.14960 Sec. 3): etp*ep must then
    divide them; each expert's FFN width must split over etp; the tokens a rank routes are its own
    sequence-parallel share, so tp > 1 needs sequence parallelism (Megatron-Core asserts it for MoE)."""
    if not par.experts_folded:
        return
    etp = par.etp_degree
    stage = par.tp * par.cp * dp
    if stage % (etp * par.ep):
        raise ConfigError("parallelism.ep", f"etp*ep = {etp}*{par.ep} does not divide the {stage} ranks of a "
                                            f"pipeline stage (tp*cp*dp = {par.tp}*{par.cp}*{dp}) that hold the experts")
    moe = getattr(model, "moe", None)
    if moe is not None and etp > 1:
        width = moe.expert_ffn_hidden_size or model.ffn_size
        if width % etp:
            raise ConfigError("parallelism.etp", f"{etp} does not divide the expert FFN width ({width})")
    if par.tp > 1 and not par.sequence_parallel:
        raise ConfigError("parallelism.sequence_parallel", "expert groups folded over tp ranks (etp > 1, or ep not "
                                                           "dividing dp) need sequence_parallel: true with tp > 1")
    if par.zero_shard_size is not None:
        raise ConfigError("parallelism.zero_shard_size", "hybrid sharding with expert groups folded over tp ranks "
                                                         "(etp > 1, or ep not dividing dp) is not simulated")


def _check_graph_layout(par: Parallelism, model) -> int:
    """Layout rules for a model given as a layer graph (not a transformer spec): tensor
    parallelism only where every layer's kind carries its own TP split (transformer blocks) or
    the Megatron split of workloads/tensor_parallel.py applies (a ConfigError names the first
    layer where it does not), context parallelism only for models with
    a sequence. Returns the number of layers a pipeline splits."""
    graph = model.layer_graph(ShardShape(micro_batch=1, seq_length=getattr(model, "seq_length", None) or 1)).check()
    if par.tp > 1 and any(layer.kind not in TENSOR_PARALLEL_KINDS for layer in graph.layers):
        tensor_parallel_graph(graph, par.tp)  # the Megatron split layer by layer, or a ConfigError naming the layer
        split = model.layer_graph(ShardShape(micro_batch=1, seq_length=getattr(model, "seq_length", None) or 1,
                                             tp=par.tp))
        if split.tensor_parallel != par.tp:
            raise ConfigError("parallelism.tp", f"{model.name}: its graph builder does not split layers by "
                                                "tensor parallelism; use tp: 1")
    if par.cp > 1 and graph.seq_length is None:
        raise ConfigError("parallelism.cp", f"context parallelism needs a sequence; {model.name} has none")
    return len(graph.pipelined)


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


def chunk_layer_counts(par: Parallelism, num_layers: int) -> list[int]:
    """Layers per global model chunk (chunk c of pipeline rank i is c·pp + i).

    Without ``first_stage_layers`` / ``last_stage_layers``: :func:`split_layers`. With them
    (Megatron-LM ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``,
    ``get_transformer_layer_offset``): the first (last) pipeline rank holds that many layers,
    split evenly over its ``virtual_stages`` chunks, and the remaining layers are split evenly
    over the other ranks' chunks; anything that does not divide is a ConfigError naming the
    field. The end ranks may hold 0 layers (only the embedding or the loss) without virtual
    stages; every other chunk holds at least one."""
    pp, v = par.pp, par.virtual_stages
    first, last = par.first_stage_layers, par.last_stage_layers
    if first is None and last is None:
        return split_layers(num_layers, pp * v)
    field = "parallelism.first_stage_layers" if first is not None else "parallelism.last_stage_layers"
    if pp == 1:
        raise ConfigError(field, "needs pp > 1")
    for name, value in (("first_stage_layers", first), ("last_stage_layers", last)):
        if value is None:
            continue
        if value < 0:
            raise ConfigError(f"parallelism.{name}", f"must be >= 0, got {value}")
        if value % v or (v > 1 and value == 0):
            raise ConfigError(f"parallelism.{name}",
                              f"{value} layers do not split over the rank's {v} virtual stages (need a positive multiple)")
    rest = num_layers - (first or 0) - (last or 0)
    middle_ranks = pp - (first is not None) - (last is not None)
    if rest < 0:
        raise ConfigError(field, f"first/last stage layers ({first}, {last}) exceed the model's {num_layers} layers")
    if middle_ranks == 0:
        if rest:
            raise ConfigError(field, f"with pp = 2, first_stage_layers + last_stage_layers must equal the "
                                     f"model's {num_layers} layers, got {first} + {last}")
        per_middle = 0
    else:
        if rest % (middle_ranks * v) or rest == 0:
            raise ConfigError(field, f"the remaining {rest} layers do not split evenly (and at least one each) "
                                     f"over {middle_ranks} other stages x {v} virtual stages")
        per_middle = rest // (middle_ranks * v)
    counts = []
    for _chunk in range(v):
        for stage in range(pp):
            if stage == 0 and first is not None:
                counts.append(first // v)
            elif stage == pp - 1 and last is not None:
                counts.append(last // v)
            else:
                counts.append(per_middle)
    return counts


def data_parallel_groups_per_node(par: Parallelism, gpus_per_node: int) -> int:
    """How many members of one dp group share a node (consecutive tp*cp ranks fill a node first)."""
    inner = par.tp * par.cp
    if inner >= gpus_per_node:
        return 1
    return max(1, min(par.dp_degree, gpus_per_node // inner))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)

