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
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache
from typing import Literal

from workloads.counting import is_moe_layer, layer_params
from workloads.schema import TransformerSpec

OpKind = Literal["gemm", "attention", "memory", "collective"]
Phase = Literal["forward", "backward"]

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}  # activations stay 16-bit under fp8 GEMMs


@dataclass(frozen=True)
class Op:
    """One kernel (or one collective) of a layer for one micro-batch on one rank.

    ``m, n, k``: GEMM dims (C[m,n] = A[m,k]·B[k,n]), ``batch`` independent GEMMs of that
    shape (attention heads). ``bytes_moved``: HBM traffic. For collectives, ``comm_bytes``
    is the payload per rank and ``group`` names the communicator ("tp", "cp", "ep").
    ``recompute_class`` marks what selective recompute re-runs ("attention_core").
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
    moe_load_imbalance: float = 1.0

    @property
    def act_bytes(self) -> int:
        return BYTES_PER_ELEMENT[self.precision]

    @property
    def local_seq(self) -> int:
        return self.seq_length // self.cp


@dataclass(frozen=True)
class LayerWork:
    """Forward and backward ops of one layer, in execution order."""

    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    params: int = 0

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
        """Ops re-run before the backward: all of forward (full), the attention core (selective)."""
        if recompute == "full":
            return self.forward
        if recompute == "selective":
            return tuple(op for op in self.forward if op.recompute_class == "attention_core")
        return ()


def _gemm(name: str, m: int, n: int, k: int, elem: int, batch: int = 1, kind: OpKind = "gemm",
          recompute_class: str | None = None) -> Op:
    flops = 2.0 * m * n * k * batch
    bytes_moved = float(elem * batch * (m * k + k * n + m * n))
    return Op(name, kind, flops, bytes_moved, m, n, k, batch, recompute_class=recompute_class)


def _memory(name: str, elements: float, reads: float, writes: float, elem: int,
            recompute_class: str | None = None) -> Op:
    return Op(name, "memory", flops=0.0, bytes_moved=elements * elem * (reads + writes),
              recompute_class=recompute_class)


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
        dgrad = replace(_gemm(f"{op.name}.dgrad", op.m, op.k, op.n, 1, op.batch), bytes_moved=op.bytes_moved)
        wgrad = replace(_gemm(f"{op.name}.wgrad", op.k, op.n, op.m, 1, op.batch), bytes_moved=op.bytes_moved)
        if op.input_grad_collective:
            comm = Op(f"{op.name}.input_grad.{op.input_grad_collective}", "collective",
                      collective=op.input_grad_collective, group="tp", comm_bytes=op.input_grad_bytes,
                      overlaps_next=True)
            return [dgrad, comm, wgrad]
        return [dgrad, wgrad]
    if op.kind == "attention":
        return [Op(f"{op.name}.grad", "attention", op.backward_flops_factor * op.flops, 2 * op.bytes_moved,
                   op.m, op.n, op.k, op.batch)]
    if op.kind == "memory":
        return [Op(f"{op.name}.grad", "memory", 0.0, 2 * op.bytes_moved)]
    if op.collective == "all_to_all":  # the gradients go back the way the tokens came
        return [replace(op, name=f"{op.name}.grad")]
    if op.collective == "ring_pass":  # K/V are passed again and dK/dV travel back: 2x the bytes
        return [replace(op, name=f"{op.name}.grad", comm_bytes=2 * op.comm_bytes)]
    if op.collective == "reduce_scatter":  # g with sequence parallelism: all-gather the output gradient
        return [Op(f"{op.name}.grad", "collective", collective="all_gather", group=op.group,
                   comm_bytes=op.comm_bytes)]
    return []  # g's all-reduce and f's all-gather: handled at the column-parallel GEMM


@cache
def layer_work(model: TransformerSpec, shard: ShardShape, layer_index: int = 0) -> LayerWork:
    """Ops of one transformer layer for one micro-batch on one rank."""
    moe_layer = is_moe_layer(model, layer_index)
    b, s, t = shard.micro_batch, shard.local_seq, shard.tp
    h, hd, elem = model.hidden_size, model.head_dim, shard.act_bytes
    heads, kv = model.num_attention_heads // t, max(1, model.kv_heads // t)
    tokens = b * s
    norm_tokens = tokens // t if shard.sequence_parallel else tokens
    full_seq = shard.seq_length  # keys/values span the whole sequence (ring/all-gather under cp)
    ffn = model.ffn_size // t
    ffn_out = 2 * ffn if model.gated_mlp else ffn
    act_payload = float(tokens * h * elem)

    def tp_boundary(name: str) -> list[Op]:
        if t == 1:
            return []
        if shard.sequence_parallel:
            return [_tp_comm(f"{name}.reduce_scatter", "reduce_scatter", act_payload)]
        return [_tp_comm(f"{name}.all_reduce", "all_reduce", act_payload)]

    def tp_gather(name: str) -> list[Op]:
        if t > 1 and shard.sequence_parallel:
            return [_tp_comm(f"{name}.all_gather", "all_gather", act_payload)]
        return []

    def column_parallel(op: Op) -> Op:
        if t == 1:
            return op
        return replace(op, input_grad_collective="reduce_scatter" if shard.sequence_parallel else "all_reduce",
                       input_grad_bytes=act_payload)

    fwd: list[Op] = []
    fwd.append(_memory("ln1", norm_tokens * h, 1, 1, elem))
    fwd += tp_gather("attn_in")
    fwd.append(column_parallel(_gemm("qkv", tokens, (heads + 2 * kv) * hd, h, elem)))
    if shard.cp > 1:
        # Ring attention (Liu et al. 2023; Megatron-LM context parallelism): each rank's K/V chunk
        # travels cp-1 hops around the cp ring while the attention of the chunk in hand runs.
        kv_bytes = float(2 * b * s * kv * hd * elem)
        fwd.append(Op("cp_ring_kv", "collective", collective="ring_pass", group="cp", comm_bytes=kv_bytes,
                      overlaps_next=True))
    if shard.flash_attention:
        # FlashAttention (Dao et al. 2022): QK^T, softmax and AV fused in SRAM; HBM traffic is
        # q, k, v, o only; the backward recomputes the scores: 5 matmuls vs 2 forward (2.5x).
        flash = _gemm("flash_attention", s, full_seq, hd, elem, batch=b * heads, kind="attention",
                      recompute_class="attention_core")
        fwd.append(replace(flash, flops=2 * flash.flops, backward_flops_factor=2.5,
                           bytes_moved=float(elem * b * (2 * s * heads * hd + 2 * full_seq * kv * hd))))
    else:
        fwd.append(_gemm("attn_scores", s, full_seq, hd, elem, batch=b * heads, kind="attention",
                         recompute_class="attention_core"))
        fwd.append(_memory("softmax_dropout", b * heads * s * full_seq, 1, 2, elem, recompute_class="attention_core"))
        fwd.append(_gemm("attn_values", s, hd, full_seq, elem, batch=b * heads, kind="attention",
                         recompute_class="attention_core"))
    fwd.append(_gemm("attn_out", tokens, h, heads * hd, elem))
    fwd += tp_boundary("attn_out")
    fwd.append(_memory("dropout_residual1", norm_tokens * h, 2, 1, elem))
    fwd.append(_memory("ln2", norm_tokens * h, 1, 1, elem))
    if moe_layer:
        fwd += _moe_block(model, shard, norm_tokens)
    else:
        fwd += tp_gather("mlp_in")
        fwd.append(column_parallel(_gemm("fc1", tokens, ffn_out, h, elem)))
        fwd.append(_memory("swiglu" if model.gated_mlp else "gelu", tokens * ffn, 2 if model.gated_mlp else 1, 1,
                           elem))
        fwd.append(_gemm("fc2", tokens, h, ffn, elem))
        fwd += tp_boundary("mlp_out")
    fwd.append(_memory("dropout_residual2", norm_tokens * h, 2, 1, elem))

    bwd: list[Op] = []
    for op in reversed(fwd):
        bwd += _backward_of(op)
    if shard.cp > 1:
        bwd = _ring_before_attention(bwd)
    return LayerWork(tuple(fwd), tuple(bwd), params=layer_params(model, moe_layer).total)


def _moe_block(model: TransformerSpec, shard: ShardShape, routed_tokens: int) -> list[Op]:
    """A mixture-of-experts FFN (GShard/Switch; Megatron-LM MoE with expert parallelism):
    router GEMM, all-to-all dispatch over the ep group, the local experts' GEMMs, all-to-all
    combine, plus shared experts. Experts are not tensor-split (expert tensor parallel 1); with
    tp > 1 each tp rank routes its sequence-parallel share of tokens (without SP, all tokens).
    Tokens per local expert: routed·top_k·ep/E, times ``moe_load_imbalance`` (busiest expert /
    mean), times the capacity factor when one is set (Fedus et al. 2021)."""
    moe = model.moe
    h, elem, ep = model.hidden_size, shard.act_bytes, shard.ep
    experts_local = moe.num_experts // ep
    ffn_e = moe.expert_ffn_hidden_size or model.ffn_size
    width = 2 * ffn_e if model.gated_mlp else ffn_e
    capacity = moe.capacity_factor or 1.0
    copies = routed_tokens * moe.top_k * capacity
    per_expert = max(1, round(copies * ep / moe.num_experts * shard.moe_load_imbalance))
    payload = float(copies * h * elem)
    ops: list[Op] = [_gemm("router", routed_tokens, moe.num_experts, h, elem),
                     _memory("router_topk_permute", routed_tokens * h, 1, 1, elem)]
    if ep > 1:
        ops.append(Op("moe_dispatch.all_to_all", "collective", collective="all_to_all", group="ep", comm_bytes=payload))
    ops.append(_gemm("expert_fc1", per_expert, width, h, elem, batch=experts_local))
    ops.append(_memory("expert_act", per_expert * experts_local * ffn_e, 2 if model.gated_mlp else 1, 1, elem))
    ops.append(_gemm("expert_fc2", per_expert, h, ffn_e, elem, batch=experts_local))
    if ep > 1:
        ops.append(Op("moe_combine.all_to_all", "collective", collective="all_to_all", group="ep", comm_bytes=payload))
    ops.append(_memory("unpermute_weighted_sum", routed_tokens * moe.top_k * h, 1, 1, elem))
    if moe.num_shared_experts:
        shared = moe.num_shared_experts * ffn_e
        ops.append(_gemm("shared_fc1", routed_tokens, 2 * shared if model.gated_mlp else shared, h, elem))
        ops.append(_gemm("shared_fc2", routed_tokens, h, shared, elem))
    return ops


def _ring_before_attention(bwd: list[Op]) -> list[Op]:
    """Put the backward ring pass (K/V again plus dK/dV: twice the bytes) right before the
    attention-gradient kernels it overlaps, instead of after them as plain reversal would."""
    ring = next(op for op in bwd if op.collective == "ring_pass")
    rest = [op for op in bwd if op is not ring]
    first_attention = next(i for i, op in enumerate(rest) if op.kind == "attention")
    return rest[:first_attention] + [ring] + rest[first_attention:]


@cache
def embedding_work(model: TransformerSpec, shard: ShardShape) -> LayerWork:
    """Token (+ position) embedding on the first stage: a gather, and with a vocab-parallel
    embedding under TP an all-reduce (reduce-scatter with SP) of its output."""
    tokens, h, elem = shard.micro_batch * shard.local_seq, model.hidden_size, shard.act_bytes
    fwd: list[Op] = [_memory("embedding_lookup", tokens * h, 1, 1, elem)]
    if shard.tp > 1:
        name = "reduce_scatter" if shard.sequence_parallel else "all_reduce"
        fwd.append(_tp_comm(f"embedding.{name}", name, float(tokens * h * elem)))
    bwd = [_memory("embedding_grad", tokens * h, 2, 1, elem)]
    if shard.tp > 1 and shard.sequence_parallel:  # the reduce-scatter's conjugate
        bwd.insert(0, _tp_comm("embedding.grad.all_gather", "all_gather", float(tokens * h * elem)))
    return LayerWork(tuple(fwd), tuple(bwd))


@cache
def head_work(model: TransformerSpec, shard: ShardShape) -> LayerWork:
    """Final norm, LM head GEMM (vocab-parallel under TP) and cross-entropy on the last stage.
    The logits are b·s·V/t; softmax cross-entropy reads them in fp32 (Megatron upcasts)."""
    b, s, t = shard.micro_batch, shard.local_seq, shard.tp
    h, elem, vocab = model.hidden_size, shard.act_bytes, model.vocab_size // t
    tokens = b * s
    norm_tokens = tokens // t if shard.sequence_parallel else tokens
    fwd: list[Op] = [_memory("final_ln", norm_tokens * h, 1, 1, elem)]
    if t > 1 and shard.sequence_parallel:
        fwd.append(_tp_comm("head_in.all_gather", "all_gather", float(tokens * h * elem)))
    head = _gemm("lm_head", tokens, vocab, h, elem)
    if t > 1:  # vocab-parallel head: its input gradient is summed (scattered with SP) over tp ranks
        head = replace(head, input_grad_collective="reduce_scatter" if shard.sequence_parallel else "all_reduce",
                       input_grad_bytes=float(tokens * h * elem))
    fwd.append(head)
    fwd.append(_memory("cross_entropy", tokens * vocab, 2, 1, 4))
    bwd: list[Op] = []
    for op in reversed(fwd):
        bwd += _backward_of(op)
    return LayerWork(tuple(fwd), tuple(bwd))


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per step counted from the ops: model FLOPs (fwd + bwd, no recompute) and
    hardware FLOPs (with the recomputed forward work)."""

    model_flops: float
    hardware_flops: float
    per_layer_forward: float = field(default=0.0)


def step_flops(model: TransformerSpec, seq_length: int, global_batch: int, recompute: str,
               flash_attention: bool = False) -> ModelFlops:
    """Whole-model FLOPs per optimizer step, counted per op on an unsharded layer.

    Model FLOPs: 3 x forward (the backward of a matmul costs twice its forward). Hardware
    FLOPs: what the kernels execute — forward, backward (FlashAttention's backward recomputes
    the scores) and the recomputed forward work."""
    shard = ShardShape(micro_batch=1, seq_length=seq_length, flash_attention=flash_attention)
    layer = layer_work(model, shard)
    head = head_work(model, shard)

    def flops(ops) -> float:
        return sum(op.flops for op in ops if op.kind in ("gemm", "attention"))

    fwd_layer = flops(layer.forward)
    model_flops = 3 * (model.num_layers * fwd_layer + flops(head.forward)) * global_batch
    hardware_layer = fwd_layer + flops(layer.backward) + flops(layer.recompute_ops(recompute))
    hardware = (model.num_layers * hardware_layer + flops(head.forward) + flops(head.backward)) * global_batch
    return ModelFlops(model_flops, hardware, fwd_layer)
