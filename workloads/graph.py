"""The workload graph: the ops of one transformer layer (and of the embedding and the loss)
for one micro-batch on one rank, with FLOPs and bytes, after the layout's shard.

Ops follow Megatron-LM's GPT layer (Shoeybi 2019; Korthikanti 2022 Fig. 4/5):
LN -> QKV (column-parallel) -> QK^T -> softmax/dropout -> AV -> output (row-parallel) -> [TP comm]
-> dropout+residual -> LN -> FC1 (column) -> GeLU/SwiGLU -> FC2 (row) -> [TP comm] -> dropout+residual.

Without sequence parallelism each [TP comm] is an all-reduce of the b·s·h activation; with
it, the two are a reduce-scatter after the row-parallel GEMM and an all-gather before the
next column-parallel GEMM, and norms/dropouts run on s/t tokens. Backward mirrors forward:
each GEMM becomes two (input-gradient and weight-gradient, 2x the FLOPs), memory-bound ops
move twice the bytes, attention-core GEMMs double, and the TP collectives repeat (the f/g
conjugates of Megatron). FLOPs count 2 per multiply-add.

Multi-head latent attention (``model.mla``, DeepSeek-V2/V3) replaces LN -> QKV by the latent
projections of :func:`_mla_projections` and the attention core by :func:`_mla_core`; see there
for what is approximated. LoRA fine-tuning (``shard.lora``) freezes every learned op and adds
the adapters' GEMMs (workloads/lora.py); a frozen GEMM's backward is its input gradient alone.
Layers of one model may differ (dense or MoE FFN): ``layer_work(model, shard, layer_index)``
builds the layer at that index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from typing import Literal

from workloads.layer_kinds import is_moe_layer
from workloads.lora import LoraShape, with_adapters
from workloads.packing import causal_fraction as packed_causal_fraction
from workloads.packing import document_lengths, squared_tokens
from workloads.schema import TransformerSpec

OpKind = Literal["gemm", "attention", "memory", "collective"]
Phase = Literal["forward", "backward"]

# GEMM classes (for a precision per op class, e.g. which GEMMs run in FP8), by op-name prefix
GEMM_CLASS = {
    "qkv": "attention_proj", "attn_out": "attention_proj", "q_down": "attention_proj", "kv_down": "attention_proj",
    "q_up": "attention_proj", "kv_up": "attention_proj",
    "fc1": "mlp", "fc2": "mlp", "shared_fc1": "mlp", "shared_fc2": "mlp",
    "expert_fc1": "experts", "expert_fc2": "experts",
    "router": "router", "lm_head": "lm_head",
    "lora_a": "adapter", "lora_b": "adapter",   # LoRA adapters (workloads/lora.py): 16-bit under FP8 training
}


def gemm_class(op: Op | str) -> str | None:
    """The class of a GEMM op: its ``op_class`` where the builder set one (a layer-graph network's linears,
    workloads/networks/builder.py), else read off a decoder-transformer op's name ("fc1.dgrad" -> "mlp");
    None for attention-core and other ops. A bare name is read by its prefix alone."""
    if isinstance(op, Op):
        return op.op_class or GEMM_CLASS.get(op.name.split(".", 1)[0])
    return GEMM_CLASS.get(op.split(".", 1)[0])


#: The name (one dot-separated part of an op's name) of a fused attention kernel's op: the decoder builder's
#: ``flash_attention`` and a network's ``<layer>.flash_attention`` (workloads/networks/builder.py), each with
#: its ``.grad``; simulator/cost/compute.py prices them on the FlashAttention kernel model.
FUSED_ATTENTION = "flash_attention"


def is_fused_attention(op: Op) -> bool:
    """Whether ``op`` is a fused (FlashAttention / SDPA) attention kernel, forward or backward."""
    return op.kind == "attention" and FUSED_ATTENTION in op.name.split(".")


FLASH_TILE = 128  # FlashAttention-2's query/key block (Dao 2023), for the causal-skip share

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}  # activations stay 16-bit under fp8 GEMMs


@dataclass(frozen=True)
class Op:
    """One kernel (or one collective) of a layer for one micro-batch on one rank.

    ``m, n, k``: GEMM dims (C[m,n] = A[m,k]·B[k,n]), ``batch`` independent GEMMs of that
    shape (attention heads). ``bytes_moved``: HBM traffic. For collectives, ``comm_bytes``
    is the payload per rank and ``group`` names the communicator ("tp", "cp", "ep", "etp").
    ``recompute_class`` marks what selective recompute re-runs: "attention_core" (Korthikanti
    2022), and for MLA models also "selective" (the norms and MLA up-projections that
    DeepSeek-V3 recomputes, arXiv:2412.19437 Sec. 3.2.3). ``op_sac_share``: the share of the op
    that per-operation selective checkpointing re-runs (``recompute: selective_op``, torchtitan's
    policy; :func:`op_sac_recompute`): 1 for the whole op, a fraction for a fused GEMM of which
    only some projections are recomputed, 0 (default) for an op whose output is saved or unused.

    Parameters (issue 19: a layer's are the sum of its forward ops', :attr:`params`; nothing states
    them beside the ops): ``weights`` is how many k x n weight matrices the op holds — 1 for a linear
    layer or a convolution as implicit GEMM, ``batch`` for a grouped GEMM whose groups have their own
    (routed experts, convolution groups, three separate Q/K/V projections), 1 for a GEMM run ``batch``
    times over one weight (an LSTM's per-step recurrent GEMM), 0 where B is an activation or another
    op's weight (the attention core, a tied LM head, the later chunks of a pipelined TP GEMM), and a
    fraction where the rank's GEMM is larger than the share it holds (a general graph's split of a
    dimension that does not divide by tp, workloads/tensor_parallel.py); ``bias`` the bias elements
    it adds; ``tables`` the
    shapes of the learned tensors an op of another kind holds: a norm's γ (and β), an embedding's
    V x h table, a learned position table or class token.

    ``op_class``: the GEMM class (``GEMM_CLASS``'s values: what ``training.fp8_gemms`` selects) of a GEMM
    whose name does not carry it, set once where the layer is described: a layer-graph network's attention
    projections, MLP linears and vocabulary decoder (workloads/networks/builder.py); None for a decoder
    transformer's ops (their names say it) and for GEMMs of no class.

    ``kernels``: how many launches a memory-bound op stands for, its bytes spread over them (a framework's
    Python loop over experts issues one small kernel per expert: Megatron-Core's weighted expert bias,
    :func:`_expert_bias_and_clamp`); each launch pays the kernel launch overhead. ``backward_bytes`` /
    ``backward_kernels``: a memory op's backward traffic and launches where they are not the default (one
    kernel reading the output gradient and the saved input and writing the input gradient: 2 x the forward's
    bytes). The eager host-issue floor (simulator/strategies/framework_terms.py) counts such an op as one issue.
    """

    name: str
    kind: OpKind
    flops: float = 0.0
    bytes_moved: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    collective: str | None = None
    group: str | None = None
    comm_bytes: float = 0.0
    recompute_class: str | None = None
    input_grad_collective: str | None = None   # column-parallel GEMM: TP collective of its input grad
    input_grad_bytes: float = 0.0
    overlaps_next: bool = False                # collective that may run alongside the next kernel
    backward_flops_factor: float = 2.0         # backward FLOPs / forward FLOPs (attention ops)
    executed_fraction: float = 1.0             # share of ``flops`` the kernel runs (causal skipping)
    overlap_knob: str = ""                     # which switch turns ``overlaps_next`` on ("tp_comm"; else by group)
    measured_s: float | None = None            # a profiled time that replaces the roofline (per-layer profiles)
    conv: tuple[str, int, int, int] | None = None  # a convolution pass: (fwd|dgrad|wgrad, kh, kw, stride)
    op_sac_share: float = 0.0                  # share re-run under recompute: selective_op (see above)
    weights: float = 0.0                       # learned k x n weights (B of C = A·B) the op holds (see above)
    bias: float = 0.0                          # learned bias elements it adds
    tables: tuple[tuple[int, ...], ...] = ()   # learned tensors of another op kind, by shape (see above)
    op_class: str | None = None                # GEMM class where the name does not say it (see gemm_class)
    frozen: bool = False                       # its learned tensors are frozen (LoRA's base, workloads/lora.py):
                                               # no weight gradient, no gradient or optimizer state
    kernels: int = 1                           # memory op: launches it stands for (a Python loop's kernels)
    backward_bytes: float | None = None        # memory op: its backward's HBM traffic (None: 2 x bytes_moved)
    backward_kernels: int | None = None        # memory op: its backward's launches (None: as ``kernels``)

    @property
    def params(self) -> float:
        """The learned parameters this op holds (one rank's): ``weights`` k x n matrices, the bias, the tables."""
        held = self.weights * self.k * self.n + self.bias
        for shape in self.tables:
            held += math.prod(shape)
        return held

    @property
    def gflop_per_gemm(self) -> float:
        return 2.0 * self.m * self.n * self.k / 1e9 if self.kind in ("gemm", "attention") else 0.0


@dataclass(frozen=True)
class ShardShape:
    """What one rank computes: the layout's split of one micro-batch."""

    micro_batch: int
    seq_length: int
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    precision: str = "bf16"
    flash_attention: bool = False
    ep: int = 1
    etp: int = 1                   # expert tensor parallel: each routed expert's FFN split over etp ranks
    moe_load_imbalance: float = 1.0
    cp_comm: str = "ring"          # "ring" | "all_gather"
    cp_load_balance: bool = True
    tp_comm_overlap: bool = False  # userbuffers-style TP all-gather / reduce-scatter pipelined with GEMMs
    tp_overlap: str = "userbuffers"  # how: "userbuffers" (beside the whole GEMM) | "async_tp" (tp chunks)
    unfused_eager_kernels: bool = False  # bias gradients as separate reductions (TrainingSpec)
    eager_elementwise: bool = False  # norms, SwiGLU, RoPE as PyTorch eager composite ops (TrainingSpec)
    fp8_saved_inputs: frozenset[str] = frozenset()  # GEMM classes whose inputs the backward keeps quantized
    fp8_saved_element_bytes: float = 1.0  # bytes per element of such a kept input (FP8 + its block scales)
    fused_cross_entropy: bool = False  # the loss keeps the 16-bit logits only (TrainingSpec.fused_cross_entropy)
    lora: LoraShape | None = None  # LoRA fine-tuning (TrainingSpec.finetune): frozen base + adapters, workloads/lora.py
    # packed sequences (TrainingSpec.packing): documents of this many tokens, attention per document
    # (workloads/packing.py); None: one document per sequence
    document_tokens: int | None = None
    # the tp the vocabulary is padded for (TransformerSpec.padded_vocab_size): None = this shard's tp; 0 = not
    # padded (the model's own count); the unsplit graph of a run at tp t takes t (its FLOPs and held parameters)
    vocab_padding_tp: int | None = None

    @property
    def act_bytes(self) -> int:
        return BYTES_PER_ELEMENT[self.precision]

    @property
    def local_seq(self) -> int:
        return self.seq_length // self.cp

    @property
    def causal_fraction(self) -> float:
        """Share of the counted (non-causal) attention-core FLOPs that a causal fused kernel runs
        on the busiest rank. FlashAttention skips tiles above the diagonal and computes the
        diagonal tiles whole (tile 128, FlashAttention-2's block size): of n x n tiles it runs
        n(n+1)/2, i.e. 1/2 + 1/(2n). Under cp with load balancing (2cp chunks, rank i holding
        i and 2cp-1-i; Megatron-LM, Llama 3) every rank runs that share of its s/cp x s block;
        without it the last rank attends to all cp-1 earlier chunks plus its own diagonal one:
        (cp - 1 + 1/2 + 1/(2 n_local)) / cp. The FLOPs reported (model FLOPs, MFU) stay the
        non-causal count, as in Megatron-LM and Narayanan et al. 2021; this scales time only.
        Packed sequences (``document_tokens``, cp 1): the same rule per document (workloads/packing.py)."""
        tile = FLASH_TILE
        if self.document_tokens is not None:
            return packed_causal_fraction(self.seq_length, self.document_tokens, tile)
        if self.cp == 1 or self.cp_load_balance:
            n = max(1, -(-self.seq_length // tile))
            return 0.5 + 0.5 / n
        n_local = max(1, -(-self.local_seq // tile))
        return (self.cp - 0.5 + 0.5 / n_local) / self.cp


@dataclass(frozen=True)
class LayerWork:
    """Forward and backward ops of one layer, in execution order."""

    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    params: float = 0  # the planner copies its graph layer's (the sum of the layer's forward ops' params)

    @property
    def forward_flops(self) -> float:
        return sum(op.flops for op in self.forward)

    @property
    def backward_flops(self) -> float:
        return sum(op.flops for op in self.backward)

    def input_grad_ops(self) -> tuple[Op, ...]:
        """Backward without the weight-gradient GEMMs (zero-bubble "B" pass, Qi et al. 2023)."""
        return tuple(op for op in self.backward if not op.name.endswith(".wgrad"))

    def weight_grad_ops(self) -> tuple[Op, ...]:
        """The weight-gradient GEMMs alone (zero-bubble "W" pass)."""
        return tuple(op for op in self.backward if op.name.endswith(".wgrad"))

    def recompute_ops(self, recompute: str) -> tuple[Op, ...]:
        """Ops re-run before the backward: all of forward (full), the attention core (selective;
        with MLA also the norms and up-projections), torchtitan's per-op policy (selective_op)."""
        return recompute_ops_of(self.forward, recompute)


def recompute_ops_of(forward: tuple[Op, ...], recompute: str) -> tuple[Op, ...]:
    """The ops of ``forward`` re-run before the backward under ``recompute`` (see
    :meth:`LayerWork.recompute_ops`)."""
    if recompute == "full" or recompute.startswith(PARTIAL_FULL_PREFIX):  # a layer that is re-run at all
        return forward
    if recompute == "selective":
        return tuple(op for op in forward if op.recompute_class in ("attention_core", "selective"))
    if recompute == "selective_op":
        return op_sac_recompute(forward)
    if recompute.startswith(MODULES_PREFIX):
        return module_recompute_ops(forward, modules_of_mode(recompute))
    return ()


#: Megatron-Core's ``recompute_modules`` (``transformer/transformer_config.py``, ``TransformerConfig``; with
#: ``recompute_granularity: selective``), in the order its docstring lists them.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
#: The recompute mode string of a module list (``Parallelism.recompute_mode``): ``selective:`` and the modules in
#: :data:`RECOMPUTE_MODULES` order, comma-separated. The layer graph reads it (``recompute_ops_of``,
#: ``workloads.layer_graph.Layer.kept_bytes``) where the other modes are their plain names.
MODULES_PREFIX = "selective:"


#: Megatron-Core's partial full recompute (``recompute_granularity: full`` with ``recompute_method`` and
#: ``recompute_num_layers``, megatron-core 0.16.1 ``transformer/transformer_config.py``): the mode string
#: ``full:<method>:<N>`` (``Parallelism.recompute_mode``). Per layer it reads as ``full`` (a layer that is re-run
#: re-runs its whole forward and keeps its input); which layers of a chunk are re-run and which inputs are kept is
#: :func:`full_units`'.
PARTIAL_FULL_PREFIX = "full:"


def partial_full_mode(method: str, num_layers: int) -> str:
    """The recompute mode string of ``recompute_method`` / ``recompute_num_layers`` (:data:`PARTIAL_FULL_PREFIX`)."""
    return f"{PARTIAL_FULL_PREFIX}{method}:{num_layers}"


def partial_full_of(recompute: str) -> tuple[str, int] | None:
    """(method, num_layers) of a :func:`partial_full_mode` string; None for the other modes."""
    if not recompute.startswith(PARTIAL_FULL_PREFIX):
        return None
    method, num_layers = recompute[len(PARTIAL_FULL_PREFIX):].split(":")
    return method, int(num_layers)


def full_units(recompute: str, count: int) -> tuple[tuple[int, int], ...]:
    """The checkpoint units ((first, end) positions, end exclusive) of a model chunk of ``count`` layers under
    a full recompute mode; a position in no unit is run plainly and keeps what it saves. Megatron-Core 0.16.1
    ``transformer/transformer_block.py`` ``TransformerBlock._checkpointed_forward``, over the block's own
    layers (``num_layers_per_pipeline_rank = len(self.layers)``: one virtual-pipeline chunk's with interleaving):

    - ``uniform`` N: ``checkpoint_handler(custom(i, i + N))`` for i = 0, N, 2N, ...: units of N consecutive
      layers, each keeping only its first layer's input and re-running all N forwards before the backward of
      its last (N must divide the chunk's layers: ``custom`` indexes ``self.layers`` up to i + N);
    - ``block`` N: ``checkpoint_handler(custom(i, i + 1))`` for the chunk's first N layers (``layer_idx <
      recompute_num_layers``), the rest run plainly (all of them where the chunk has fewer);
    - ``full`` (every layer its own unit): ``uniform`` 1, what the simulator priced before the fields existed.

    Not modelled: under FP8 ``block`` skips a layer whose input needs no gradient
    (``recompute_skip_num_layers``); a block's input always does (``make_viewless_tensor(requires_grad=True)``
    in ``TransformerBlock.forward``)."""
    spec = partial_full_of(recompute)
    if spec is None:
        return tuple((i, i + 1) for i in range(count)) if recompute == "full" else ()
    method, n = spec
    if method == "block":
        return tuple((i, i + 1) for i in range(min(n, count)))
    return tuple((i, min(i + n, count)) for i in range(0, count, n))


def modules_mode(modules) -> str:
    """The recompute mode string of the module list ``modules`` (:data:`MODULES_PREFIX`)."""
    listed = set(modules)
    return MODULES_PREFIX + ",".join(m for m in RECOMPUTE_MODULES if m in listed)


def modules_of_mode(recompute: str) -> frozenset[str]:
    """The modules a :func:`modules_mode` string names (empty for the other modes)."""
    if not recompute.startswith(MODULES_PREFIX):
        return frozenset()
    return frozenset(recompute[len(MODULES_PREFIX):].split(","))


#: By op-name stem (the op name's first dot-separated part: ``fc1.tp_chunk`` is ``fc1``'s), the ops of a block
#: each Megatron-Core module re-runs. Where each is honoured (megatron-core 0.16.1):
#:
#: - ``mlp``: ``transformer/transformer_layer.py`` ``TransformerLayer._forward_mlp`` checkpoints ``self.mlp`` of a
#:   dense layer (``recompute_mlp`` is set only ``if not self.is_moe_layer``). Under the Transformer Engine layer
#:   spec a dense layer's pre-MLP norm is fused into ``linear_fc1`` (``models/gpt/gpt_layer_specs.py``
#:   ``get_gpt_layer_with_transformer_engine_spec``: ``pre_mlp_layernorm=IdentityOp`` without experts;
#:   ``TELayerNormColumnParallelLinear``), so the checkpointed MLP runs ln2, the sequence-parallel all-gather
#:   inside fc1, fc1, the activation, fc2 and its TP reduction;
#: - ``moe``: ``transformer/moe/moe_layer.py`` ``MoELayer.forward`` checkpoints ``custom_forward``: the shared
#:   experts, the router, the permutation, the dispatch and combine all-to-alls, the experts (their bias and clamp
#:   kernels too) and the unpermute: everything of the MoE block after its norm;
#: - ``moe_act``: ``transformer/moe/experts.py`` ``TEGroupedMLP.forward`` runs ``bias_act_func`` (the clamps and
#:   the fused weighted GLU) under ``CheckpointWithoutOutput``;
#: - ``shared_experts``: ``MoELayer.shared_experts_compute`` checkpoints ``self.shared_experts``;
#: - ``mla_up_proj``: ``transformer/multi_latent_attention.py`` ``MLASelfAttention.get_query_key_value_tensors``
#:   runs ``qkv_up_proj_and_rope_apply`` (the latents' norms fused into the up-projections, the up-projections,
#:   RoPE) under ``CheckpointWithoutOutput``;
#: - ``core_attn`` (:func:`module_recompute_ops`: the ops marked ``attention_core`` and the context-parallel K/V
#:   exchange inside the fused attention) and ``layernorm`` (by the layer's kind) are not stems alone.
MODULE_OP_STEMS = {
    "mlp": frozenset({"ln2", "mlp_in", "fc1", "swiglu", "gelu", "fc2", "mlp_out"}),
    "moe": frozenset({"router", "router_topk_permute", "moe_dispatch", "moe_etp", "expert_fc1", "expert_act_clamp",
                      "expert_act", "expert_fc2", "expert_fc2_bias", "moe_combine", "unpermute_weighted_sum",
                      "shared_in", "shared_fc1", "shared_act", "shared_fc2", "shared_out"}),
    "moe_act": frozenset({"expert_act_clamp", "expert_act"}),
    "shared_experts": frozenset({"shared_in", "shared_fc1", "shared_act", "shared_fc2", "shared_out"}),
    "mla_up_proj": frozenset({"q_norm", "kv_norm", "q_up", "q_proj", "kv_up", "rope"}),
}


def module_recompute_ops(forward: tuple[Op, ...], modules: frozenset[str]) -> tuple[Op, ...]:
    """The ops of one block's ``forward`` that Megatron-Core re-runs before the block's backward under
    ``recompute_granularity: selective`` with ``recompute_modules`` = ``modules`` (:data:`MODULE_OP_STEMS` says
    where each is honoured), each op once however many listed modules hold it (``moe`` holds ``moe_act``'s and
    ``shared_experts``' ops; Megatron would re-run a nested ``moe_act`` a second time inside a recomputed ``moe``:
    not priced). In forward order.

    - ``core_attn`` (``transformer/attention.py`` ``Attention._checkpointed_attention_forward``): the attention
      core (the ops marked ``attention_core``: the fused kernel, or the scores, softmax/dropout and values) and,
      under context parallelism, its K/V exchange (Transformer Engine's attention runs the ring inside);
    - ``layernorm`` (``transformer/transformer_layer.py``: ``input_layernorm`` and ``pre_mlp_layernorm`` under
      ``CheckpointWithoutOutput`` where they are not ``IdentityOp``): under the Transformer Engine spec the input
      norm is a module of its own only with MLA (GQA/MHA fuse it into ``linear_qkv``) and the pre-MLP norm only in
      a MoE layer (a dense layer fuses it into ``linear_fc1``), so ``ln1`` re-runs in an MLA block and ``ln2`` in a
      MoE block. A block is MoE when it has a ``router`` op, MLA when it has ``kv_down``."""
    if not modules:
        return ()
    names = {op.name.split(".", 1)[0] for op in forward}
    moe_layer, mla = "router" in names, "kv_down" in names
    stems: set[str] = set()
    for module in modules:
        stems |= MODULE_OP_STEMS.get(module, frozenset())
    if "mlp" in modules and moe_layer:   # a MoE layer's MLP is the moe module (recompute_mlp: not is_moe_layer)
        stems -= MODULE_OP_STEMS["mlp"]
    if "layernorm" in modules:
        stems |= {"ln1"} if mla else set()
        stems |= {"ln2"} if moe_layer else set()
    core = "core_attn" in modules
    return tuple(op for op in forward
                 if op.name.split(".", 1)[0] in stems
                 or (core and (op.recompute_class == "attention_core" or (op.kind == "collective" and op.group == "cp"))))


def op_sac_recompute(forward: tuple[Op, ...]) -> tuple[Op, ...]:
    """What torchtitan's per-operation selective activation checkpointing re-runs before a block's
    backward (``recompute: selective_op``; torchtitan ``activation_checkpoint.mode = "selective"``,
    ``selective_ac_option = "op"``, torchtitan/distributed/activation_checkpoint.py).

    The policy saves the outputs of the ops in its save list — ``aten.mm``, SDPA's flash and
    memory-efficient attention, the TP ``reduce_scatter`` and ``aten.max`` (the float8 amax) —
    except every second ``mm`` of the block (counted in forward order), and marks everything else
    for recompute. torch.compile's partitioner then re-runs only what the backward needs (the rows
    this mode was made for are compiled). For a Llama block (separate wq, wk, wv, wo, w1, w3, w2:
    mm 1..7) that is: the norms and the residual add before the second norm; both TP all-gathers
    (not in the save list: re-run under TP); wk (mm 2, K feeds the attention backward) and w3
    (mm 6, its output feeds the SwiGLU backward) and the SwiGLU product; not wo (mm 4) nor w2 (its
    outputs only feed a residual sum and a reduce-scatter, which the backward does not need).
    The attention (saved), q, v, w1 and the reduce-scatters' outputs are kept
    (workloads/transformer_graph.py counts their bytes). The simulator fuses wq/wk/wv into one
    ``qkv`` GEMM and w1/w3 into ``fc1``: their recomputed part is the same GEMM with ``n`` cut to
    the share (``Op.op_sac_share``)."""
    out: list[Op] = []
    for op in forward:
        share = op.op_sac_share
        if share <= 0:
            continue
        if share < 1 and op.kind == "gemm":
            n = max(1, round(op.n * share))
            per_element = op.bytes_moved / (op.m * op.k + op.k * op.n + op.m * op.n)  # bytes x batch
            op = replace(op, name=f"{op.name}.op_sac", n=n, flops=op.flops * n / op.n,
                         bytes_moved=float(per_element * (op.m * op.k + op.k * n + op.m * n)))
        out.append(op)
    return tuple(out)


def _gemm(name: str, m: int, n: int, k: int, elem: int, batch: int = 1, kind: OpKind = "gemm",
          recompute_class: str | None = None) -> Op:
    """A GEMM that holds no weights: of two activations (the attention core), or a backward pass (dgrad, wgrad)."""
    flops = 2.0 * m * n * k * batch
    bytes_moved = float(elem * batch * (m * k + k * n + m * n))
    return Op(name, kind, flops, bytes_moved, m, n, k, batch, recompute_class=recompute_class)


def _linear(name: str, m: int, n: int, k: int, elem: int, bias: bool, batch: int = 1, weights: float | None = None,
            recompute_class: str | None = None) -> Op:
    """A linear layer's GEMM: ``batch`` of them, each with its own k x n weight (``weights`` otherwise)
    and, with ``bias``, its own n biases (Op's parameter fields)."""
    held = batch if weights is None else weights
    return Op(name, "gemm", 2.0 * m * n * k * batch, float(elem * batch * (m * k + k * n + m * n)), m, n, k, batch,
              recompute_class=recompute_class, weights=held, bias=held * n if bias else 0.0)


def _memory(name: str, elements: float, reads: float, writes: float, elem: int,
            recompute_class: str | None = None, tables: tuple[tuple[int, ...], ...] = ()) -> Op:
    return Op(name, "memory", flops=0.0, bytes_moved=elements * elem * (reads + writes),
              recompute_class=recompute_class, tables=tables)


def norm_tables(model: TransformerSpec, width: int) -> tuple[tuple[int, ...], ...]:
    """A norm's learned tensors over ``width`` features: γ, and β for a LayerNorm (RMSNorm has none)."""
    return ((width,), (width,)) if model.norm == "layernorm" else ((width,),)


def _tp_comm(name: str, collective: str, payload_bytes: float) -> Op:
    return Op(name, "collective", collective=collective, group="tp", comm_bytes=payload_bytes)


def _backward_of(op: Op) -> list[Op]:
    """The backward kernels of a forward op (see module docstring).

    Megatron's conjugate TP operators: the forward all-reduce after a row-parallel GEMM ("g")
    is the identity in backward, and the identity before a column-parallel GEMM ("f") is an
    all-reduce of its input gradient in backward; with sequence parallelism the pair is
    reduce-scatter/all-gather and swaps the same way. That backward collective is issued right
    after the column-parallel GEMM's input-gradient kernel and may overlap its weight-gradient
    kernel (``overlaps_next``), as Megatron-LM's asynchronous TP gradient communication does.
    """
    if op.kind == "gemm":
        # dX = dY·W^T  (m x k = m x n · n x k) and dW = X^T·dY (k x n = k x m · m x n)
        # A frozen weight (LoRA's base) has no weight gradient: dgrad alone, and the TP collective of its
        # input gradient has no wgrad kernel to hide behind.
        dgrad = replace(_gemm(f"{op.name}.dgrad", op.m, op.k, op.n, 1, op.batch), bytes_moved=op.bytes_moved)
        wgrad = [] if op.frozen else [replace(_gemm(f"{op.name}.wgrad", op.k, op.n, op.m, 1, op.batch),
                                              bytes_moved=op.bytes_moved)]
        if op.input_grad_collective:
            comm = Op(f"{op.name}.input_grad.{op.input_grad_collective}", "collective",
                      collective=op.input_grad_collective, group="tp", comm_bytes=op.input_grad_bytes,
                      overlaps_next=not op.frozen)
            return [dgrad, comm, *wgrad]
        return [dgrad, *wgrad]
    if op.kind == "attention":
        return [Op(f"{op.name}.grad", "attention", op.backward_flops_factor * op.flops, 2 * op.bytes_moved,
                   op.m, op.n, op.k, op.batch, executed_fraction=op.executed_fraction)]
    if op.collective == "all_gather" and op.group == "cp":
        # all-gather CP: K/V are gathered again for the backward (only the local chunk is kept)
        # and the dK/dV of the whole sequence are reduce-scattered back to their owners.
        return [replace(op, name=f"{op.name}.regather"),
                replace(op, name=f"{op.name}.grad_reduce_scatter", collective="reduce_scatter")]
    if op.kind == "memory":
        moved = 2 * op.bytes_moved if op.backward_bytes is None else op.backward_bytes
        return [Op(f"{op.name}.grad", "memory", 0.0, moved, kernels=op.backward_kernels or op.kernels)]
    if op.collective == "all_gather" and op.group == "etp":
        # expert tensor parallel: the gathered tokens' gradients are reduce-scattered back (Megatron's f/g)
        return [replace(op, name=f"{op.name}.grad_reduce_scatter", collective="reduce_scatter")]
    if op.collective == "all_to_all":  # the gradients go back the way the tokens came
        return [replace(op, name=f"{op.name}.grad")]
    if op.collective == "ring_pass":  # K/V are passed again and dK/dV travel back: 2x the bytes
        return [replace(op, name=f"{op.name}.grad", comm_bytes=2 * op.comm_bytes)]
    if op.collective == "reduce_scatter":  # g with sequence parallelism: all-gather the output gradient
        return [Op(f"{op.name}.grad", "collective", collective="all_gather", group=op.group,
                   comm_bytes=op.comm_bytes)]
    return []  # g's all-reduce and f's all-gather: handled at the column-parallel GEMM


def _act_payload(shard: ShardShape, hidden: int) -> float:
    """Bytes of the b·s·h activation a TP collective of a block carries (the local sequence under cp)."""
    return float(shard.micro_batch * shard.local_seq * hidden * shard.act_bytes)


def _tp_boundary(name: str, shard: ShardShape, hidden: int) -> list[Op]:
    """Megatron's "g" after a row-parallel GEMM: an all-reduce of the output over tp, a reduce-scatter
    with sequence parallelism (none at tp 1)."""
    if shard.tp == 1:
        return []
    if shard.sequence_parallel:
        return [_tp_comm(f"{name}.reduce_scatter", "reduce_scatter", _act_payload(shard, hidden))]
    return [_tp_comm(f"{name}.all_reduce", "all_reduce", _act_payload(shard, hidden))]


def _tp_gather(name: str, shard: ShardShape, hidden: int) -> list[Op]:
    """The all-gather of the sequence-parallel input before a column-parallel GEMM (none without SP)."""
    if shard.tp > 1 and shard.sequence_parallel:
        return [_tp_comm(f"{name}.all_gather", "all_gather", _act_payload(shard, hidden))]
    return []


def _column_parallel(op: Op, shard: ShardShape, hidden: int) -> Op:
    """A column-parallel GEMM: Megatron's "f", its input gradient all-reduced (reduce-scattered with SP)."""
    if shard.tp == 1:
        return op
    return replace(op, input_grad_collective="reduce_scatter" if shard.sequence_parallel else "all_reduce",
                   input_grad_bytes=_act_payload(shard, hidden))


@cache
def layer_work(model: TransformerSpec, shard: ShardShape, layer_index: int = 0) -> LayerWork:
    """Ops of one transformer layer (the one at ``layer_index``: dense or MoE) for one
    micro-batch on one rank."""
    moe_layer = is_moe_layer(model, layer_index)
    b, s, t = shard.micro_batch, shard.local_seq, shard.tp
    h, hd, elem = model.hidden_size, model.head_dim, shard.act_bytes
    heads, kv = model.num_attention_heads // t, max(1, model.kv_heads // t)  # KV heads replicated when tp > kv
    tokens = b * s
    norm_tokens = tokens // t if shard.sequence_parallel else tokens
    full_seq = shard.seq_length  # keys/values span the whole sequence (ring/all-gather under cp)
    ffn = model.ffn_size // t
    ffn_out = 2 * ffn if model.gated_mlp else ffn

    def tp_boundary(name: str) -> list[Op]:
        return _tp_boundary(name, shard, h)

    def tp_gather(name: str) -> list[Op]:
        return _tp_gather(name, shard, h)

    def column_parallel(op: Op) -> Op:
        return _column_parallel(op, shard, h)

    norm_rc = "selective" if model.mla is not None else None  # DeepSeek-V3 recomputes its RMSNorms
    fwd: list[Op] = []
    bias = model.linear_bias
    fwd.append(_memory("ln1", norm_tokens * h, 1, 1, elem, recompute_class=norm_rc, tables=norm_tables(model, h)))
    if model.mla is not None:
        fwd += _mla_projections(model, shard, norm_tokens)
    else:
        fwd += tp_gather("attn_in")
        fwd.append(column_parallel(_linear("qkv", tokens, (heads + 2 * kv) * hd, h, elem, model.has_qkv_bias)))
        if model.qk_norm:  # per-head norm of q and k (Qwen3): read and write q and k once; one γ (β) each
            fwd.append(_memory("qk_norm", tokens * (heads + kv) * hd, 1, 1, elem,
                               tables=norm_tables(model, hd) * 2))
    if shard.cp > 1:
        kv_bytes = float(2 * b * s * kv * hd * elem)
        if shard.cp_comm == "all_gather":
            # All-gather CP (Llama 3, arXiv:2407.21783 Sec. 3.3.2): gather the whole sequence's K/V
            # (S = cp x the local K/V, the all-gather convention), then attend; not overlapped.
            fwd.append(Op("cp_allgather_kv", "collective", collective="all_gather", group="cp",
                          comm_bytes=kv_bytes * shard.cp))
        else:
            # Ring attention (Liu et al. 2023; Megatron-LM context parallelism): each rank's K/V chunk
            # travels cp-1 hops around the cp ring while the attention of the chunk in hand runs.
            fwd.append(Op("cp_ring_kv", "collective", collective="ring_pass", group="cp", comm_bytes=kv_bytes,
                          overlaps_next=True))
    window = model.sliding_window_tokens if model.is_window_layer(layer_index) else None
    sinks = ((heads,),) if model.attention_sinks else ()  # one learned logit per head of the rank
    if model.mla is not None:
        fwd += _mla_core(model, shard)
    elif window is not None:
        fwd += _window_core(model, shard, window, heads, kv, sinks)
    elif shard.flash_attention:
        # FlashAttention (Dao et al. 2022): QK^T, softmax and AV fused in SRAM; HBM traffic is
        # q, k, v, o only; the backward recomputes the scores: 5 matmuls vs 2 forward (2.5x).
        flash = _gemm("flash_attention", s, full_seq, hd, elem, batch=b * heads, kind="attention",
                      recompute_class="attention_core")
        if shard.document_tokens is not None:  # packed: one causal attention per document (workloads/packing.py)
            d = shard.document_tokens
            flash = replace(flash, m=d, n=d, batch=b * heads * len(document_lengths(s, d)),
                            flops=2.0 * b * heads * hd * squared_tokens(s, d))
        fwd.append(replace(flash, flops=2 * flash.flops, backward_flops_factor=2.5,
                           bytes_moved=float(elem * b * (2 * s * heads * hd + 2 * full_seq * kv * hd)), tables=sinks))
    else:
        fwd.append(_gemm("attn_scores", s, full_seq, hd, elem, batch=b * heads, kind="attention",
                         recompute_class="attention_core"))
        fwd.append(replace(_memory("softmax_dropout", b * heads * s * full_seq, 1, 2, elem,
                                   recompute_class="attention_core"), tables=sinks))
        fwd.append(_gemm("attn_values", s, hd, full_seq, elem, batch=b * heads, kind="attention",
                         recompute_class="attention_core"))
    attn_width = heads * (model.mla.v_head_dim if model.mla is not None else hd)
    fwd.append(_linear("attn_out", tokens, h, attn_width, elem, bias))  # row-parallel: its bias replicated
    fwd += tp_boundary("attn_out")
    fwd.append(_memory("dropout_residual1", norm_tokens * h, 2, 1, elem))
    fwd.append(_memory("ln2", norm_tokens * h, 1, 1, elem, recompute_class=norm_rc, tables=norm_tables(model, h)))
    if moe_layer:
        fwd += _moe_block(model, shard, norm_tokens)
    else:
        fwd += tp_gather("mlp_in")
        fwd.append(column_parallel(_linear("fc1", tokens, ffn_out, h, elem, bias)))
        fwd.append(_memory("swiglu" if model.gated_mlp else "gelu", tokens * ffn, 2 if model.gated_mlp else 1, 1,
                           elem))
        fwd.append(_linear("fc2", tokens, h, ffn, elem, bias))
        fwd += tp_boundary("mlp_out")
    fwd.append(_memory("dropout_residual2", norm_tokens * h, 2, 1, elem))

    if shard.flash_attention and window is None:  # a window's core carries its own executed share
        fwd = [replace(op, executed_fraction=shard.causal_fraction) if op.kind == "attention" else op for op in fwd]
    if shard.eager_elementwise:
        if model.mla is not None:  # RoPE on each head's rope part of q and on the one shared rope key k_R
            fwd = _eager_elementwise(fwd, model, tokens * (heads + 1) * model.mla.qk_rope_head_dim, elem, "kv_up")
        else:
            fwd = _eager_elementwise(fwd, model, tokens * (heads + kv) * hd, elem,
                                     "qk_norm" if model.qk_norm else "qkv")
    if model.mla is None and not moe_layer:
        fwd = _mark_op_sac(fwd, heads, kv, model.gated_mlp)
    if shard.lora is not None:  # frozen base, low-rank adapters on the targeted GEMMs (workloads/lora.py)
        fwd = with_adapters(fwd, shard.lora, t, elem)
    bwd: list[Op] = []
    for op in reversed(fwd):
        bwd += _backward_of(op)
    if shard.unfused_eager_kernels and model.linear_bias:
        bwd = _with_bias_grads(bwd, elem, BIASED_LINEARS)
    if shard.cp > 1:
        bwd = _cp_comm_before_attention(bwd)
    if shard.tp_comm_overlap and t > 1 and shard.sequence_parallel:
        pipelined = shard.tp_overlap == "async_tp"
        fwd, bwd = _tp_overlap(fwd, t, pipelined), _tp_overlap(bwd, t, pipelined)
    return LayerWork(tuple(fwd), tuple(bwd))


def window_pairs(seq: int, window: int) -> int:
    """(query, key) pairs of causal sliding-window attention over one sequence of ``seq`` tokens: query i
    (0-based) attends keys max(0, i - w + 1) .. i, min(i + 1, w) of them. Summed: 1 + 2 + ... + w for the
    first w queries and w for each of the s - w others, w(w + 1)/2 + (s - w)·w = s·w - w(w - 1)/2 (s >= w);
    the causal triangle s(s + 1)/2 when s <= w (the same formula with w = s)."""
    w = min(window, seq)
    return seq * w - w * (w - 1) // 2


def window_tiles(seq: int, window: int, tile: int = FLASH_TILE) -> tuple[int, int]:
    """(tiles run, most key tiles one query tile visits) of a FlashAttention kernel with a causal window
    (FlashAttention-2's ``window_size`` (w - 1, 0), Dao 2023; the tile ``FLASH_TILE``): query tile q
    (rows qT .. qT + T - 1) visits key tiles floor(max(0, qT - w + 1) / T) .. q, the tiles that hold any
    pair of the band, each computed whole (masked inside), as the causal kernel does its diagonal tiles.
    For w = T and s = nT: 1 tile for the first query tile and 2 for each other, 2n - 1."""
    n = max(1, -(-seq // tile))
    counts = [q - max(0, q * tile - window + 1) // tile + 1 for q in range(n)]
    return sum(counts), max(counts)


def _window_core(model: TransformerSpec, shard: ShardShape, window: int, heads: int, kv: int,
                 sinks: tuple[tuple[int, ...], ...]) -> list[Op]:
    """The attention core of a sliding-window layer (``TransformerSpec.sliding_window_tokens``) per rank.

    Counted FLOPs (model FLOPs, MFU): the pairs the window holds, exactly (:func:`window_pairs`), 2·d FLOPs
    each for Q·K^T and 2·d for P·V, b·heads times: 4·b·a·d·pairs. A window is causal by construction, so
    unlike a full layer (counted at s x s, Korthikanti 2022) nothing uncausal is counted. (Megatron-Bridge
    0.3.1's ``flop_utils`` counts GPT-OSS's every layer as full causal attention: its TFLOP/s are not this
    count; the validation compares tokens per second.)

    FlashAttention (Dao 2023; Transformer Engine's fused attention with ``window_size``): one kernel over
    the tiles of the band (:func:`window_tiles`), each computed whole: executed share = tiles x T² / pairs
    (about 2 for w = T = 128). Priced as the non-causal kernel over the keys a query tile visits (its
    ``n``: the efficiency curve's key length is the inner loop the kernel amortises its per-tile-row work
    over; assumed, no windowed kernel is in attention_kernels.csv). HBM traffic q, k, v, o once, as the
    full kernel (the band's K/V tiles are re-read from L2 by the next query tile). Backward 2.5x forward.

    Without a fused kernel (eager / Megatron's unfused softmax) the whole s x s score matrix is computed
    and the window applied as a mask: the three ops of a full layer, executed share s² / pairs.

    Attention sinks (``sinks``: one learned logit per head, ``TransformerSpec.attention_sinks``) are held
    by the core op; their exp-and-add per query and head is not counted (negligible, see the field).
    Context parallelism with a window is refused (simulator/strategies/spmd/layout.py).

    Packed sequences (``shard.document_tokens``, workloads/packing.py): the window within each document,
    pairs and tiles summed over the documents, the kernel's key span the widest of theirs."""
    b, s, hd, elem = shard.micro_batch, shard.local_seq, model.head_dim, shard.act_bytes
    documents = (s,) if shard.document_tokens is None else document_lengths(s, shard.document_tokens)
    pairs = sum(window_pairs(d, window) for d in documents)
    counted = 4.0 * b * heads * hd * pairs
    if shard.flash_attention:
        per_document = [window_tiles(d, window) for d in documents]
        tiles = sum(t for t, _ in per_document)
        span = max(min(d, widest * FLASH_TILE) for d, (_, widest) in zip(documents, per_document, strict=True))
        return [Op("flash_attention", "attention", counted, float(elem * b * (2 * s * heads * hd + 2 * s * kv * hd)),
                   documents[0], span, hd, b * heads * len(documents), recompute_class="attention_core",
                   backward_flops_factor=2.5, executed_fraction=tiles * FLASH_TILE ** 2 / pairs, tables=sinks)]
    full = s * s / pairs
    scores = _gemm("attn_scores", s, s, hd, elem, batch=b * heads, kind="attention", recompute_class="attention_core")
    values = _gemm("attn_values", s, hd, s, elem, batch=b * heads, kind="attention", recompute_class="attention_core")
    return [replace(scores, flops=counted / 2, executed_fraction=full),
            replace(_memory("softmax_dropout", b * heads * s * s, 1, 2, elem, recompute_class="attention_core"),
                    tables=sinks),
            replace(values, flops=counted / 2, executed_fraction=full)]


BIASED_LINEARS = ("qkv", "attn_out", "fc1", "fc2")  # a layer's linears that carry a bias with linear_bias

def eager_bytes_per_element(kernel: str, elem: int) -> float:
    """HBM bytes per element of PyTorch eager's composite ops (``training.elementwise_kernels: eager``),
    each aten kernel reading and writing the whole tensor (e = ``elem`` bytes, fp32 = 4), as torchtitan's
    Llama writes them (torchtitan/models/llama3/model.py; torch.compile fuses each into one kernel of
    2e, or 3e for SwiGLU's two inputs):

    - ``rmsnorm``: ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight``:
      upcast e + 4, square 4 + 4, mean 4, multiply 4 + 4, downcast 4 + e, weight e + e: 4e + 28;
    - ``swiglu``: ``silu(x1) * x3``: SiLU e + e, multiply 2e + e: 5e;
    - ``rope`` (per element of q and k): upcast e + 4, complex multiply 4 + 4 (the frequencies are
      small), downcast 4 + e: 2e + 16.

    Backward passes move twice the forward's bytes (the simulator's rule for memory-bound ops)."""
    return {"rmsnorm": 4 * elem + 28, "swiglu": 5 * elem, "rope": 2 * elem + 16}[kernel]


#: A block's RMSNorm ops: the two per block, Qwen3's per-head q/k norm and MLA's norms of its two latents
#: (DeepSeek-V2 Sec. 2.1.2; torchtitan's DeepSeek-V3 writes all four as the same RMSNorm module as its Llama's).
_RMSNORM_OPS = ("ln1", "ln2", "qk_norm", "q_norm", "kv_norm")


def _eager_elementwise(fwd: list[Op], model: TransformerSpec, rope_elements: int, elem: int,
                       rope_after: str) -> list[Op]:
    """A block's memory-bound ops as PyTorch eager runs them (:func:`eager_bytes_per_element`): the
    RMSNorms (:data:`_RMSNORM_OPS`; a LayerNorm is one native kernel either way) and SwiGLU (a dense block's,
    the routed experts' ``expert_act`` and the shared experts' ``shared_act``: torchtitan's GroupedExperts and
    its shared FeedForward write ``silu(x @ w1) * (x @ w3)`` as its Llama FFN does) at their eager bytes, and
    RoPE as its own op of ``rope_elements`` after the op ``rope_after`` (the Q/K projection; MLA's last
    up-projection, for its rope part of q and the shared rope key: fused into a kernel under torch.compile it
    moves 2e per element, which the fused graph leaves out)."""
    out: list[Op] = []
    for op in fwd:
        if op.name in _RMSNORM_OPS and model.norm == "rmsnorm":
            op = replace(op, bytes_moved=op.bytes_moved / (2 * elem) * eager_bytes_per_element("rmsnorm", elem))
        elif op.name == "swiglu" or (op.name in ("expert_act", "shared_act") and model.gated_mlp):
            op = replace(op, bytes_moved=op.bytes_moved / (3 * elem) * eager_bytes_per_element("swiglu", elem))
        out.append(op)
        if model.position_embedding == "rope" and op.name == rope_after:
            out.append(Op("rope", "memory", 0.0, rope_elements * eager_bytes_per_element("rope", elem)))
    return out


#: Ops of a dense block that torchtitan's per-op selective checkpointing re-runs whole (its policy and
#: what the backward needs: :func:`op_sac_recompute`): the norms, the residual add that feeds the second
#: norm, the activation, the per-head q/k norms, eager RoPE, the materialised attention core (SDPA's math path is
#: not in the save list), the TP all-gathers.
_OP_SAC_WHOLE = frozenset({"ln1", "ln2", "dropout_residual1", "swiglu", "gelu", "qk_norm", "rope",
                           "attn_scores", "softmax_dropout", "attn_values",
                           "attn_in.all_gather", "mlp_in.all_gather"})


def _mark_op_sac(fwd: list[Op], heads: int, kv: int, gated: bool) -> list[Op]:
    """Mark what ``recompute: selective_op`` re-runs in a dense (GQA/MHA) block: the ops of
    :data:`_OP_SAC_WHOLE`, the K projection of the fused ``qkv`` GEMM (wk, the policy's second mm:
    kv of heads + 2·kv output heads) and, with a gated MLP, w3's half of ``fc1`` (the sixth mm; a
    plain MLP's fc1 is the fifth and is saved)."""
    out: list[Op] = []
    for op in fwd:
        share = 0.0
        if op.name in _OP_SAC_WHOLE:
            share = 1.0
        elif op.name == "qkv":
            share = kv / (heads + 2 * kv)
        elif op.name == "fc1" and gated:
            share = 0.5
        out.append(replace(op, op_sac_share=share) if share else op)
    return out


def _with_bias_grads(bwd: list[Op], elem: int, biased: tuple[str, ...]) -> list[Op]:
    """A bias gradient after each biased linear's weight gradient: the sum of the output
    gradient over the tokens, a read of tokens x out elements (PyTorch eager's ``aten::sum`` in
    ``AddmmBackward0``). The wgrad op is X^T·dY with k = tokens and n = out features."""
    out: list[Op] = []
    for op in bwd:
        out.append(op)
        base = op.name.removesuffix(".wgrad")
        if op.kind == "gemm" and base != op.name and base in biased:
            out.append(_memory(f"{base}.bias_grad", op.k * op.n, 1, 0, elem))
    return out


def _mla_projections(model: TransformerSpec, shard: ShardShape, norm_tokens: int) -> list[Op]:
    """MLA's projections up to the attention core (DeepSeek-V2 Sec. 2.1.2-2.1.3; Megatron-LM
    ``MLASelfAttention``), in training's non-absorbed form: the down-projections W_DQ and
    W_DKV (with the shared RoPE key) are replicated over tp and run on the rank's tokens
    (its sequence-parallel share with SP), their RMSNorms likewise; with SP the latents are
    all-gathered; the up-projections W_UQ and W_UK/W_UV are column-parallel (heads ÷ tp), so
    their input gradients are all-reduced (reduce-scattered with SP) over tp, counted with
    the RoPE key's gradient. Approximations: the all-gathers of the three latents are one
    collective; the TP all-reduce of the replicated down-projections' weight gradients under
    SP (once per step) is not modelled. Selective recompute re-runs the norms and the
    up-projections (DeepSeek-V3 Sec. 3.2.3)."""
    mla, h, elem, t = model.mla, model.hidden_size, shard.act_bytes, shard.tp
    heads, tokens = model.num_attention_heads // t, shard.micro_batch * shard.local_seq
    q_in = mla.q_lora_rank or h
    ops: list[Op] = []
    if mla.q_lora_rank:
        ops.append(_linear("q_down", norm_tokens, mla.q_lora_rank, h, elem, False))
        ops.append(_memory("q_norm", norm_tokens * mla.q_lora_rank, 1, 1, elem, recompute_class="selective",
                           tables=norm_tables(model, mla.q_lora_rank)))
    ops.append(_linear("kv_down", norm_tokens, mla.kv_lora_rank + mla.qk_rope_head_dim, h, elem, False))
    ops.append(_memory("kv_norm", norm_tokens * mla.kv_lora_rank, 1, 1, elem, recompute_class="selective",
                       tables=norm_tables(model, mla.kv_lora_rank)))
    latent_width = q_in + mla.kv_lora_rank + mla.qk_rope_head_dim
    if t > 1 and shard.sequence_parallel:
        ops.append(_tp_comm("mla_latents.all_gather", "all_gather", float(tokens * latent_width * elem)))
    q_up = _linear("q_up" if mla.q_lora_rank else "q_proj", tokens, heads * mla.qk_head_dim, q_in, elem, False,
                   recompute_class="selective")
    kv_up = _linear("kv_up", tokens, heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank, elem, False,
                    recompute_class="selective")
    if t > 1:
        grad_comm = "reduce_scatter" if shard.sequence_parallel else "all_reduce"
        q_up = replace(q_up, input_grad_collective=grad_comm, input_grad_bytes=float(tokens * q_in * elem))
        kv_up = replace(kv_up, input_grad_collective=grad_comm,
                        input_grad_bytes=float(tokens * (mla.kv_lora_rank + mla.qk_rope_head_dim) * elem))
    return ops + [q_up, kv_up]


def _mla_core(model: TransformerSpec, shard: ShardShape) -> list[Op]:
    """MLA's attention core per rank (heads ÷ tp): scores Q·K^T with head size nope + rope,
    values P·V with ``v_head_dim`` (DeepSeek-V2 Eq. 17-19), every head its own K and V.
    FlashAttention: one fused kernel of 2·b·a·s²·(d_qk + d_v) FLOPs whose backward runs
    (3·d_qk + 2·d_v)/(d_qk + d_v) times that (recomputed Q·K^T, dQ, dK with d_qk; dV, dP with
    d_v); HBM traffic q, k, v, o."""
    mla, elem = model.mla, shard.act_bytes
    b, s, full_seq = shard.micro_batch, shard.local_seq, shard.seq_length
    heads = model.num_attention_heads // shard.tp
    dqk, dv = mla.qk_head_dim, mla.v_head_dim
    if shard.flash_attention:
        flash = _gemm("flash_attention", s, full_seq, dqk, elem, batch=b * heads, kind="attention",
                      recompute_class="attention_core")
        return [replace(flash, flops=2.0 * b * heads * s * full_seq * (dqk + dv),
                        backward_flops_factor=(3 * dqk + 2 * dv) / (dqk + dv),
                        bytes_moved=float(elem * b * heads * (s + full_seq) * (dqk + dv)))]
    return [_gemm("attn_scores", s, full_seq, dqk, elem, batch=b * heads, kind="attention",
                  recompute_class="attention_core"),
            _memory("softmax_dropout", b * heads * s * full_seq, 1, 2, elem, recompute_class="attention_core"),
            _gemm("attn_values", s, dv, full_seq, elem, batch=b * heads, kind="attention",
                  recompute_class="attention_core")]


def _moe_block(model: TransformerSpec, shard: ShardShape, routed_tokens: int) -> list[Op]:
    """A mixture-of-experts FFN (GShard/Switch; Megatron-LM MoE with expert parallelism):
    router GEMM, all-to-all dispatch over the ep group, the local experts' GEMMs, all-to-all
    combine, plus shared experts. With tp > 1 each tp rank routes its sequence-parallel share of
    tokens (without SP, all tokens). Expert tensor parallelism (``shard.etp``, Megatron-Core
    ``expert_tensor_parallel_size``): after the dispatch the etp ranks of an expert shard all-gather
    the tokens they received and each runs every one of them through its 1/etp of the expert's FFN
    (fc1 by columns, fc2 by rows); the partial outputs are reduce-scattered before the combine
    (Megatron-Core ``MoEAlltoAllTokenDispatcher`` with tp > 1 for experts). Tokens per local expert:
    routed·top_k·ep·etp/E, times ``moe_load_imbalance`` (busiest expert / mean), times the capacity
    factor when one is set (Fedus et al. 2021). Shared experts after the combine: a tensor-parallel
    MLP (:func:`_shared_experts`)."""
    moe = model.moe
    h, elem, ep, etp = model.hidden_size, shard.act_bytes, shard.ep, shard.etp
    experts_local = moe.num_experts // ep
    ffn_e = moe.expert_ffn_hidden_size or model.ffn_size
    ffn_rank = ffn_e // etp
    width = 2 * ffn_rank if model.gated_mlp else ffn_rank
    capacity = moe.capacity_factor or 1.0
    copies = routed_tokens * moe.top_k * capacity
    per_expert = max(1, round(copies * ep * etp / moe.num_experts * shard.moe_load_imbalance))
    payload = float(copies * h * elem)
    ops: list[Op] = [_linear("router", routed_tokens, moe.num_experts, h, elem, moe.router_bias),
                     _memory("router_topk_permute", routed_tokens * h, 1, 1, elem)]
    if ep > 1:
        ops.append(Op("moe_dispatch.all_to_all", "collective", collective="all_to_all", group="ep", comm_bytes=payload))
    if etp > 1:  # the etp ranks' received tokens, gathered (payload: the gathered size, as every all-gather here)
        ops.append(Op("moe_etp.all_gather", "collective", collective="all_gather", group="etp",
                      comm_bytes=payload * etp))
    clamp, fc2_bias = _expert_bias_and_clamp(model, per_expert * experts_local, ffn_rank, experts_local, elem)
    ops.append(_linear("expert_fc1", per_expert, width, h, elem, model.linear_bias, batch=experts_local))
    ops += clamp
    ops.append(_memory("expert_act", per_expert * experts_local * ffn_rank, 2 if model.gated_mlp else 1, 1, elem))
    ops.append(_linear("expert_fc2", per_expert, h, ffn_rank, elem, model.linear_bias, batch=experts_local))
    ops += fc2_bias
    if etp > 1:
        ops.append(Op("moe_etp.reduce_scatter", "collective", collective="reduce_scatter", group="etp",
                      comm_bytes=payload * etp))
    if ep > 1:
        ops.append(Op("moe_combine.all_to_all", "collective", collective="all_to_all", group="ep", comm_bytes=payload))
    ops.append(_memory("unpermute_weighted_sum", routed_tokens * moe.top_k * h, 1, 1, elem))
    if moe.num_shared_experts:
        ops += _shared_experts(model, shard)
    return ops


#: Bytes per element of the routing probabilities the experts weigh their outputs with: fp32 (Megatron-Core's
#: flex dispatcher: "DeepEP only supports float32 probs", token_dispatcher.py; taken for every dispatcher).
PROB_BYTES = 4


def _expert_bias_and_clamp(model: TransformerSpec, rows: int, ffn: int, experts: int,
                           elem: int) -> tuple[list[Op], list[Op]]:
    """The memory-bound kernels Megatron-Core's ``TEGroupedMLP`` adds for clamped GLU inputs and for biased
    experts (megatron-core 0.16.1 and 0.19.2, the same code: ``transformer/moe/experts.py``,
    ``fusions/fused_bias_geglu.py``), beside the grouped GEMMs and the fused activation (``expert_act``), over
    the ``rows`` token copies a rank's ``experts`` local experts receive, ``ffn`` their FFN width on this rank.

    Clamp (``moe.activation_clamp``; GPT-OSS ``swiglu_limit``, Megatron ``activation_func_clamp_value``):
    ``weighted_bias_quick_geglu_impl`` clamps the gate half (above) and the linear half (both sides) as two
    eager kernels and concatenates them (``torch.cat``) before its fused kernel: 3 launches reading and writing
    2·rows·ffn elements each way, 8·rows·ffn·e bytes. Backward: each clamp's gradient (read the gradient and the
    saved input, write: 3·rows·ffn·e each; the cat's backward is two views) and ``chunk``'s backward, which
    concatenates the halves' gradients into fc1's output gradient (4·rows·ffn·e): 10·rows·ffn·e in 3 launches.

    Expert biases (``linear_bias`` on an MoE model): fc1's bias is added inside its grouped GEMM (TE
    ``GroupedLinear``, no kernel of its own); fc2's, returned apart (``skip_bias_add``), must be weighted by each
    token's routing probability, and ``_apply_bias`` does it in a Python loop over the local experts:
    ``t + b * p`` per expert (``b * p`` an fp32 rows_e x h tensor since the probabilities are fp32
    (:data:`PROB_BYTES`); the sum fp32), ``torch.cat`` of the experts' fp32 pieces and ``.to`` the activation
    type. Forward, with h the hidden width: per expert write 4·h, read e·h + 4·h, write 4·h per row; the cat
    8·h; the cast (4 + e)·h: (24 + 2e)·rows·h bytes in 2·experts + 2 launches. Backward (autograd of the
    same): the cast's gradient to fp32 (4 + e), per expert the sum's gradient cast to the activation type
    (4 + e), the bias gradient (g·p: 8, its column sum: 4) and the probability gradient (g·b: 8, its row sum:
    4), and the split's gradient, a cat of the experts' pieces (2e): (32 + 4e)·rows·h bytes in 5·experts + 2
    launches. Megatron-Core's router, attention and norms are unchanged by either. Other frameworks' expert
    bias and clamp code is priced the same (assumed). Not priced: the host synchronisation of
    ``torch.tensor(linear_offset, device=...)`` in the same function (one per forward)."""
    h = model.hidden_size
    clamp: list[Op] = []
    if model.moe.activation_clamp is not None:
        clamp.append(Op("expert_act_clamp", "memory", 0.0, 8.0 * rows * ffn * elem, kernels=3,
                        backward_bytes=10.0 * rows * ffn * elem, backward_kernels=3))
    bias: list[Op] = []
    if model.linear_bias:
        bias.append(Op("expert_fc2_bias", "memory", 0.0, (6 * PROB_BYTES + 2 * elem) * rows * h,
                       kernels=2 * experts + 2, backward_bytes=(8 * PROB_BYTES + 4 * elem) * rows * h,
                       backward_kernels=5 * experts + 2))
    return clamp, bias


def _shared_experts(model: TransformerSpec, shard: ShardShape) -> list[Op]:
    """The shared experts of a MoE block on one rank, as Megatron-Core runs them: one tensor-parallel
    MLP of ``num_shared_experts`` x the expert FFN width (``SharedExpertMLP`` is an ``MLP`` built on the
    tp group with ``ffn_hidden_size = moe_shared_expert_intermediate_size``: megatron-core 0.16.1
    ``transformer/moe/shared_experts.py``). Like the dense MLP: under sequence parallelism the rank's
    s/t tokens are all-gathered, FC1 (column-parallel) and the activation run every token of the
    micro-batch through the rank's 1/tp of the width, FC2 (row-parallel) and a reduce-scatter; without
    it an all-reduce after FC2 and one of FC1's input gradient (Megatron's f/g). Parameters: FC1 and
    its bias ÷tp, FC2 ÷tp with each shared expert's bias replicated (Megatron-Core refuses biases on
    shared experts: ``add_bias_linear`` must be false; kept for a biased model's count). The gate of
    ``moe_shared_expert_gate`` (Qwen2-MoE) and ``moe_shared_expert_overlap`` (the experts on a side
    stream beside the dispatch) are not modelled."""
    moe, h, elem, t = model.moe, model.hidden_size, shard.act_bytes, shard.tp
    tokens = shard.micro_batch * shard.local_seq
    width = moe.num_shared_experts * (moe.expert_ffn_hidden_size or model.ffn_size) // t
    ops = _tp_gather("shared_in", shard, h)
    ops.append(_column_parallel(_linear("shared_fc1", tokens, 2 * width if model.gated_mlp else width, h, elem,
                                        model.linear_bias), shard, h))
    ops.append(_memory("shared_act", tokens * width, 2 if model.gated_mlp else 1, 1, elem))
    fc2 = _linear("shared_fc2", tokens, h, width, elem, False)
    ops.append(replace(fc2, bias=moe.num_shared_experts * h if model.linear_bias else 0.0))
    return ops + _tp_boundary("shared_out", shard, h)


def _tp_overlap(ops: list[Op], tp: int, pipelined: bool) -> list[Op]:
    """TP overlap (``tp_comm_overlap``, with sequence parallelism): a TP all-gather feeding a GEMM
    and a TP reduce-scatter of a GEMM's output run beside that GEMM (``overlaps_next``; a
    reduce-scatter is moved ahead of the GEMM whose output it reduces).

    ``tp_overlap: userbuffers`` (Transformer Engine's ``--tp-comm-overlap``: split pipelined / ring
    exchange with its own chunk counts and SM-based reduction): the collective beside the whole
    GEMM, the pair taking max(t_comm, t_gemm) plus the overlapped kernel's slowdown.
    Approximation: the chunk that cannot overlap is not counted.

    ``tp_overlap: async_tp`` (PyTorch AsyncTP, torchtitan ``enable_async_tensor_parallel``:
    ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` of
    torch.distributed._symmetric_memory, ``_pipelined_all_gather_and_consume`` and
    ``_pipelined_produce_and_all2all``, copy-engine transfers): the GEMM is decomposed into ``tp``
    chunks, one per rank's shard of the tokens, each chunk's GEMM running as its shard arrives
    (all-gather) or before its partial result leaves (reduce-scatter):

    - the GEMM becomes ``tp`` GEMMs of m/tp rows (``batch`` x tp: smaller GEMMs sit lower on the
      efficiency curve);
    - all-gather: the local shard's chunk runs first, then the other tp - 1 chunks, each as its
      shard lands: ``[all-gather ‖ tp-1 chunks] -> last chunk``, i.e. max(t_comm + g, tp·g) for
      chunk time g (the last shard's GEMM cannot overlap);
    - reduce-scatter: the chunks for the other ranks first, each pushed as it is done, the local
      chunk last: ``first chunk -> [reduce-scatter ‖ tp-1 chunks]``, i.e. max(g + t_comm, tp·g)
      (the first chunk has nothing to hide behind), then the sum of the tp partial chunks that
      landed (a memory-bound kernel reading the GEMM's whole output and writing its 1/tp share:
      the reduce-scatter's arithmetic, done by a kernel after the all-to-all).
    A GEMM whose rows do not split into tp chunks keeps the plain pairing."""
    out: list[Op] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        tp_comm = op.kind == "collective" and op.group == "tp" and not op.overlaps_next
        paired = replace(op, overlaps_next=True, overlap_knob="tp_comm")
        if tp_comm and op.collective == "all_gather" and nxt is not None and nxt.kind == "gemm":
            chunks = _tp_chunks(nxt, tp) if pipelined else None
            out += [paired, chunks[1], chunks[0]] if chunks else [paired, nxt]
            i += 2
            continue
        if tp_comm and op.collective == "reduce_scatter" and out and out[-1].kind == "gemm":
            producer = out.pop()
            chunks = _tp_chunks(producer, tp) if pipelined else None
            if chunks:
                out += [chunks[0], paired, chunks[1], _partial_sum(producer, tp)]
            else:
                out += [paired, producer]
            i += 1
            continue
        out.append(op)
        i += 1
    return out


def _tp_chunks(gemm: Op, tp: int) -> tuple[Op, Op] | None:
    """(one chunk, the other tp - 1 chunks) of a GEMM split by rows into tp chunks; None when its
    rows do not split evenly. The byte count is split in the same shares (each chunk reads the
    whole weight: counted once, an approximation)."""
    if tp < 2 or gemm.m % tp:
        return None
    m = gemm.m // tp
    one = replace(gemm, name=f"{gemm.name}.tp_chunk", m=m, flops=gemm.flops / tp, bytes_moved=gemm.bytes_moved / tp)
    rest = replace(gemm, name=f"{gemm.name}.tp_chunks", m=m, batch=gemm.batch * (tp - 1),
                   flops=gemm.flops * (tp - 1) / tp, bytes_moved=gemm.bytes_moved * (tp - 1) / tp,
                   weights=0.0, bias=0.0)   # the same weight as the first chunk's, held there
    return one, rest


def _partial_sum(gemm: Op, tp: int) -> Op:
    """The sum of the tp partial output chunks a pipelined reduce-scatter leaves on each rank:
    reads the GEMM's m x n output (tp chunks of m/tp rows), writes one chunk."""
    out_bytes = gemm.bytes_moved / (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n) * gemm.m * gemm.n
    return Op(f"{gemm.name}.tp_partial_sum", "memory", 0.0, out_bytes * (1 + 1 / tp))


def _cp_comm_before_attention(bwd: list[Op]) -> list[Op]:
    """Put the backward ring pass (K/V again plus dK/dV: twice the bytes), or the all-gather
    CP's re-gather of K/V, right before the attention-gradient kernels (plain reversal would put
    it after them); the all-gather CP's dK/dV reduce-scatter stays after them."""
    early = next(op for op in bwd if op.collective == "ring_pass" or op.name.endswith(".regather"))
    rest = [op for op in bwd if op is not early]
    first_attention = next(i for i, op in enumerate(rest) if op.kind == "attention")
    return rest[:first_attention] + [early] + rest[first_attention:]


def vocab_rows(model: TransformerSpec, shard: ShardShape) -> int:
    """Rows of the word embedding, LM head and logits one rank holds: the vocabulary padded as
    Megatron pads it (:meth:`TransformerSpec.padded_vocab_size` for ``shard.vocab_padding_tp``, by
    default the shard's tp) ÷tp; unpadded (``vocab_padding_tp`` 0) the busiest rank's ceil(V/tp)."""
    pad_tp = shard.tp if shard.vocab_padding_tp is None else shard.vocab_padding_tp
    vocab = model.padded_vocab_size(pad_tp) if pad_tp else model.vocab_size
    return -(-vocab // shard.tp)


@cache
def embedding_work(model: TransformerSpec, shard: ShardShape) -> LayerWork:
    """Token (+ position) embedding on the first stage: a gather, and with a vocab-parallel
    embedding under TP an all-reduce (reduce-scatter with SP) of its output."""
    tokens, h, elem = shard.micro_batch * shard.local_seq, model.hidden_size, shard.act_bytes
    # the word table vocab-parallel (padded V/tp rows on a rank), a learned position table replicated (Megatron-LM)
    tables = ((vocab_rows(model, shard), h),)
    if model.position_embedding == "learned":
        tables += ((model.seq_length, h),)
    fwd: list[Op] = [_memory("embedding_lookup", tokens * h, 1, 1, elem, tables=tables)]
    if shard.tp > 1:
        name = "reduce_scatter" if shard.sequence_parallel else "all_reduce"
        fwd.append(_tp_comm(f"embedding.{name}", name, float(tokens * h * elem)))
    bwd = [_memory("embedding_grad", tokens * h, 2, 1, elem)]
    if shard.tp > 1 and shard.sequence_parallel:  # the reduce-scatter's conjugate
        bwd.insert(0, _tp_comm("embedding.grad.all_gather", "all_gather", float(tokens * h * elem)))
    if shard.lora is not None:  # a frozen table: no gradient reaches it (workloads/lora.py)
        return LayerWork(tuple(replace(op, frozen=True) if op.params else op for op in fwd), ())
    return LayerWork(tuple(fwd), tuple(bwd))


#: The harness's hand-written vocab-parallel cross-entropy (validation/harness/model.py
#: ``_VocabParallelCrossEntropy``) as PyTorch eager runs it: one kernel per tensor op over the b·s·V/t fp32 logits.
#: Forward: max (read), logits - max (read, write), exp (read, write), sum (read), exp / sum (read, write): 5 kernels,
#: 5 reads and 3 writes; the gather of the target logits, log and mean touch b·s values only. Backward: softmax.clone()
#: (read, write) and the multiply by grad / tokens (read, write): 2 kernels, 4 passes; the scatter_add_ of -1 at the
#: targets touches b·s values only. A fused loss (Megatron-LM's, the default) is priced as 3 passes forward, 6 back.
EAGER_VOCAB_CE_PASSES = {"forward_reads": 5, "forward_writes": 3, "forward_kernels": 5,
                         "backward_passes": 4, "backward_kernels": 2}


def eager_vocab_parallel_cross_entropy(elements: float) -> Op:
    """The harness's eager vocab-parallel cross-entropy over ``elements`` fp32 logits on a rank
    (:data:`EAGER_VOCAB_CE_PASSES`, counted from validation/harness/model.py): under TP with
    ``training.unfused_eager_kernels`` (PyTorch eager ops, the harness), where the fused loss's
    3 + 6 passes in 2 kernels would under-count its 8 + 4 passes in 7 kernels."""
    c = EAGER_VOCAB_CE_PASSES
    # its own name: a calibrated ``cross_entropy`` kernel rate (F.cross_entropy's) is not this code's
    op = _memory("vocab_parallel_cross_entropy", elements, c["forward_reads"], c["forward_writes"], 4)
    return replace(op, kernels=c["forward_kernels"], backward_bytes=c["backward_passes"] * elements * 4,
                   backward_kernels=c["backward_kernels"])


@cache
def head_work(model: TransformerSpec, shard: ShardShape) -> LayerWork:
    """Final norm, LM head GEMM (vocab-parallel under TP) and cross-entropy on the last stage.
    The logits are b·s·V/t; softmax cross-entropy reads them in fp32 (Megatron upcasts). Under
    TP the vocab-parallel cross-entropy all-reduces three fp32 values per token over tp: the
    logit maximum, the target logit and the sum of exponentials (Megatron-LM
    ``_VocabParallelCrossEntropy``); its backward needs no communication. The vocabulary is padded as
    Megatron pads it (:func:`vocab_rows`). With tied embeddings the
    head GEMM's weight is the word embedding's (held by ``embedding_work``'s table, not by this op)."""
    b, s, t = shard.micro_batch, shard.local_seq, shard.tp
    h, elem, vocab = model.hidden_size, shard.act_bytes, vocab_rows(model, shard)
    tokens = b * s
    norm_tokens = tokens // t if shard.sequence_parallel else tokens
    fwd: list[Op] = [_memory("final_ln", norm_tokens * h, 1, 1, elem, tables=norm_tables(model, h))]
    if t > 1 and shard.sequence_parallel:
        fwd.append(_tp_comm("head_in.all_gather", "all_gather", float(tokens * h * elem)))
    head = _linear("lm_head", tokens, vocab, h, elem, False, weights=0 if model.tied_embeddings else 1)
    if t > 1:  # vocab-parallel head: its input gradient is summed (scattered with SP) over tp ranks
        head = replace(head, input_grad_collective="reduce_scatter" if shard.sequence_parallel else "all_reduce",
                       input_grad_bytes=float(tokens * h * elem))
    fwd.append(head)
    if t > 1 and shard.unfused_eager_kernels:
        fwd.append(eager_vocab_parallel_cross_entropy(tokens * vocab))
    else:
        fwd.append(_memory("cross_entropy", tokens * vocab, 2, 1, 4))
    if t > 1:
        fwd += [_tp_comm(f"cross_entropy.{what}.all_reduce", "all_reduce", float(tokens * 4))
                for what in ("logits_max", "target_logit", "sum_exp")]
    if shard.lora is not None:  # a frozen final norm and head: input gradients only (workloads/lora.py)
        fwd = [replace(op, frozen=True) if op.params else op for op in fwd]
    bwd: list[Op] = []
    for op in reversed(fwd):
        bwd += _backward_of(op)
    return LayerWork(tuple(fwd), tuple(bwd))


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per step counted from the ops (:meth:`workloads.layer_graph.LayerGraph.step_flops`):
    model FLOPs (forward + backward, no recompute; the graph's ``model_flops_rule`` says how the
    backward is counted) and hardware FLOPs (what the kernels run, with the recomputed forward work)."""

    model_flops: float
    hardware_flops: float
    # layers whose FLOPs are counted, and all layers (None: every layer counted); fewer counted than
    # all: the others count 0 and the run says so in a NOTE (workloads/networks/profiles.py)
    layers_counted: int | None = None
    layers_total: int | None = None
