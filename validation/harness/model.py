"""A small real GPT-style ``nn.Module`` built from a :class:`workloads.schema.TransformerSpec`.

The simulator is given the identical spec, so what the harness measures and what the
simulator predicts are the same shape: token embedding + learned positions, ``num_layers``
pre-LN blocks (causal self-attention + a 4h GELU MLP), a final norm, an LM head (tied to the
embedding when the spec says so) and cross-entropy.

Tensor parallelism is Megatron's: the QKV and first MLP matrices are column-parallel, the
attention output and second MLP matrices are row-parallel followed by an all-reduce
(``g`` in Megatron's notation; its backward is the identity, and ``f`` before the column
split all-reduces the input gradient), the embedding and the LM head are vocab-parallel and
the cross-entropy is computed on vocab-parallel logits. Every sharded module is built by
*slicing* the full single-process model, so all strategies start from identical weights.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from workloads.schema import TransformerSpec

# The default harness shape: one step takes tens to hundreds of ms on one CPU core.
DEFAULT_SPEC = {
    "name": "harness-gpt-4l-256h",
    "num_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "vocab_size": 4096,
    "seq_length": 128,
    "tied_embeddings": True,
    "position_embedding": "learned",
    "norm": "layernorm",
    "linear_bias": True,
    "source": "validation.harness default (small enough for a CPU step of ~0.1-0.5 s)",
}
QUICK_SPEC = {
    **DEFAULT_SPEC,
    "name": "harness-gpt-2l-128h",
    "num_layers": 2,
    "hidden_size": 128,
    "vocab_size": 1024,
    "seq_length": 64,
}


def default_spec(quick: bool = False) -> TransformerSpec:
    return TransformerSpec.model_validate(QUICK_SPEC if quick else DEFAULT_SPEC)


def check_supported(spec: TransformerSpec) -> None:
    """The harness model covers dense GPT/Llama-like shapes; say clearly what it does not."""
    if spec.moe is not None:
        raise ValueError("the harness model does not implement mixture-of-experts layers")
    if spec.position_embedding not in ("learned", "none"):
        raise ValueError(f"the harness model does not implement {spec.position_embedding} positions")


def _norm(spec: TransformerSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size)
    return nn.LayerNorm(spec.hidden_size)


# --------------------------------------------------------------------------- TP primitives
class _CopyToTP(torch.autograd.Function):
    """Megatron ``f``: identity forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x, group):
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x, group):
    return _ReduceFromTP.apply(x, group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split along the vocabulary (Megatron's), mean over tokens."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        logits = logits.float()
        vmax = logits.max(dim=-1).values
        dist.all_reduce(vmax, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - vmax.unsqueeze(-1)
        local_vocab = logits.shape[-1]
        in_range = (target >= vocab_start) & (target < vocab_start + local_vocab)
        local_target = (target - vocab_start).clamp(0, local_vocab - 1)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1) * in_range
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        # two separate all-reduces as Megatron-LM issues them (the simulator prices three per pass)
        dist.all_reduce(target_logit, group=group)
        dist.all_reduce(sum_exp, group=group)
        loss = torch.log(sum_exp) - target_logit
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local_target, in_range)
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local_target, in_range = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, local_target.unsqueeze(-1), -in_range.unsqueeze(-1).to(g.dtype))
        g = g * (grad / local_target.numel())
        return g, None, None, None


# --------------------------------------------------------------------------- modules
class Attention(nn.Module):
    def __init__(self, spec: TransformerSpec, tp: int = 1, group=None):
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.heads = spec.num_attention_heads // tp
        self.kv_heads = max(1, spec.kv_heads // tp)
        self.head_dim = d
        self.tp, self.group = tp, group
        bias = spec.linear_bias
        self.qkv = nn.Linear(h, (self.heads + 2 * self.kv_heads) * d, bias=bias)
        self.proj = nn.Linear(self.heads * d, h, bias=bias and tp == 1)
        if bias and tp > 1:
            # a row-parallel linear adds its bias once, after the all-reduce
            self.proj_bias = nn.Parameter(torch.zeros(h))
        else:
            self.proj_bias = None

    def forward(self, x):
        b, s, _ = x.shape
        if self.tp > 1:
            x = copy_to_tp(x, self.group)
        qkv = self.qkv(x)
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        y = self.proj(y)
        if self.tp > 1:
            y = reduce_from_tp(y, self.group)
            if self.proj_bias is not None:
                y = y + self.proj_bias
        return y


class MLP(nn.Module):
    def __init__(self, spec: TransformerSpec, tp: int = 1, group=None):
        super().__init__()
        h, ffn = spec.hidden_size, spec.ffn_size // tp
        bias = spec.linear_bias
        self.gated = spec.gated_mlp
        self.tp, self.group = tp, group
        self.fc1 = nn.Linear(h, ffn * (2 if self.gated else 1), bias=bias)
        self.fc2 = nn.Linear(ffn, h, bias=bias and tp == 1)
        self.fc2_bias = nn.Parameter(torch.zeros(h)) if (bias and tp > 1) else None

    def forward(self, x):
        if self.tp > 1:
            x = copy_to_tp(x, self.group)
        y = self.fc1(x)
        if self.gated:
            a, g = y.chunk(2, dim=-1)
            y = F.silu(a) * g
        else:
            y = F.gelu(y)
        y = self.fc2(y)
        if self.tp > 1:
            y = reduce_from_tp(y, self.group)
            if self.fc2_bias is not None:
                y = y + self.fc2_bias
        return y


class Block(nn.Module):
    def __init__(self, spec: TransformerSpec, tp: int = 1, group=None):
        super().__init__()
        self.ln1 = _norm(spec)
        self.attn = Attention(spec, tp, group)
        self.ln2 = _norm(spec)
        self.mlp = MLP(spec, tp, group)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The full single-process model (also the source every sharded copy is sliced from)."""

    def __init__(self, spec: TransformerSpec):
        super().__init__()
        check_supported(spec)
        self.spec = spec
        h = spec.hidden_size
        self.tok = nn.Embedding(spec.vocab_size, h)
        self.pos = nn.Embedding(spec.seq_length, h) if spec.position_embedding == "learned" else None
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.num_layers))
        self.ln_f = _norm(spec)
        self.head = None if spec.tied_embeddings else nn.Linear(h, spec.vocab_size, bias=False)
        self._init()

    def _init(self):
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                scale = std / math.sqrt(2 * self.spec.num_layers) if name.endswith(("proj.weight", "fc2.weight")) else std
                nn.init.normal_(p, 0.0, scale)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def embed(self, tokens):
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x

    def logits(self, x):
        x = self.ln_f(x)
        w = self.tok.weight if self.head is None else self.head.weight
        return x @ w.t()

    def forward(self, tokens, targets=None):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.logits(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


# --------------------------------------------------------------------------- pipeline stages
class StageModule(nn.Module):
    """Layers ``[first, last)`` of a GPT, plus the embedding on the first stage and the final
    norm + LM head on the last. With tied embeddings the last stage holds its own copy of the
    embedding matrix (Megatron does the same) and the two copies' gradients are all-reduced
    after backward (see :func:`tied_weight_params`)."""

    def __init__(self, full: GPT, first: int, last: int, is_first: bool, is_last: bool):
        super().__init__()
        self.spec = full.spec
        self.is_first, self.is_last = is_first, is_last
        self.tok = _clone(full.tok) if is_first else None
        self.pos = _clone(full.pos) if (is_first and full.pos is not None) else None
        self.blocks = nn.ModuleList(_clone(b) for b in full.blocks[first:last])
        self.ln_f = _clone(full.ln_f) if is_last else None
        if is_last:
            w = full.tok.weight if full.head is None else full.head.weight
            self.head_weight = nn.Parameter(w.detach().clone())
        else:
            self.head_weight = None

    def forward(self, x):
        if self.is_first:
            tokens = x
            x = self.tok(tokens)
            if self.pos is not None:
                x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        if self.is_last:
            x = self.ln_f(x) @ self.head_weight.t()
        return x


class AuxHead(nn.Module):
    """A local-learning group's auxiliary head (Laskin et al. 2020): a final norm and an LM head of
    its own, copied from the model's (so that step 0 starts from the same function), mapping the
    group's output to logits for a local loss."""

    def __init__(self, full: GPT):
        super().__init__()
        self.norm = _clone(full.ln_f)
        w = full.tok.weight if full.head is None else full.head.weight
        self.weight = nn.Parameter(w.detach().clone())

    def forward(self, x):
        return self.norm(x) @ self.weight.t()


def tied_weight_params(stage: StageModule) -> list[nn.Parameter]:
    """The parameters whose gradients are shared between the first and last stage."""
    if not stage.spec.tied_embeddings:
        return []
    if stage.is_first and stage.is_last:
        return []
    if stage.is_first:
        return [stage.tok.weight]
    if stage.is_last:
        return [stage.head_weight]
    return []


def _clone(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


# --------------------------------------------------------------------------- tensor parallel
class TPGPT(nn.Module):
    """One tensor-parallel rank of a GPT (Megatron layout), sliced from a full model."""

    def __init__(self, full: GPT, tp: int, rank: int, group=None):
        super().__init__()
        spec = full.spec
        if spec.vocab_size % tp:
            raise ValueError(f"vocab_size {spec.vocab_size} is not divisible by tp {tp}")
        if spec.kv_heads % tp:
            raise ValueError("the harness TP model needs kv heads divisible by tp")
        self.spec, self.tp, self.rank, self.group = spec, tp, rank, group
        h = spec.hidden_size
        self.vocab_per_rank = spec.vocab_size // tp
        self.vocab_start = rank * self.vocab_per_rank
        vs = slice(self.vocab_start, self.vocab_start + self.vocab_per_rank)
        self.tok = nn.Embedding(self.vocab_per_rank, h)
        self.tok.weight.data.copy_(full.tok.weight.data[vs])
        self.pos = _clone(full.pos) if full.pos is not None else None
        self.blocks = nn.ModuleList(Block(spec, tp, group) for _ in range(spec.num_layers))
        for mine, src in zip(self.blocks, full.blocks, strict=True):
            _slice_block(mine, src, spec, tp, rank)
        self.ln_f = _clone(full.ln_f)
        if spec.tied_embeddings:
            self.head = None
        else:
            self.head = nn.Linear(h, self.vocab_per_rank, bias=False)
            self.head.weight.data.copy_(full.head.weight.data[vs])

    def forward(self, tokens, targets=None):
        in_range = (tokens >= self.vocab_start) & (tokens < self.vocab_start + self.vocab_per_rank)
        local = (tokens - self.vocab_start).clamp(0, self.vocab_per_rank - 1)
        x = self.tok(local) * in_range.unsqueeze(-1)
        x = reduce_from_tp(x, self.group)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        x = copy_to_tp(self.ln_f(x), self.group)
        w = self.tok.weight if self.head is None else self.head.weight
        logits = x @ w.t()
        if targets is None:
            return logits
        return _VocabParallelCrossEntropy.apply(logits, targets, self.vocab_start, self.group)


def _slice_block(mine: Block, src: Block, spec: TransformerSpec, tp: int, rank: int) -> None:
    mine.ln1.load_state_dict(src.ln1.state_dict())
    mine.ln2.load_state_dict(src.ln2.state_dict())
    d = spec.head_dim
    q_all, kv_all = spec.num_attention_heads * d, spec.kv_heads * d
    q_loc, kv_loc = q_all // tp, kv_all // tp
    w, b = src.attn.qkv.weight.data, (src.attn.qkv.bias.data if src.attn.qkv.bias is not None else None)

    def qkv_rows(t):
        q, k, v = t.split([q_all, kv_all, kv_all], 0)
        return torch.cat([q[rank * q_loc:(rank + 1) * q_loc], k[rank * kv_loc:(rank + 1) * kv_loc],
                          v[rank * kv_loc:(rank + 1) * kv_loc]], 0)

    mine.attn.qkv.weight.data.copy_(qkv_rows(w))
    if b is not None:
        mine.attn.qkv.bias.data.copy_(qkv_rows(b))
    mine.attn.proj.weight.data.copy_(src.attn.proj.weight.data[:, rank * q_loc:(rank + 1) * q_loc])
    if mine.attn.proj_bias is not None:
        mine.attn.proj_bias.data.copy_(src.attn.proj.bias.data)
    ffn_loc = spec.ffn_size // tp
    fc1w = src.mlp.fc1.weight.data
    fc1b = src.mlp.fc1.bias.data if src.mlp.fc1.bias is not None else None

    def fc1_rows(t):
        if spec.gated_mlp:
            a, g = t.chunk(2, 0)
            return torch.cat([a[rank * ffn_loc:(rank + 1) * ffn_loc], g[rank * ffn_loc:(rank + 1) * ffn_loc]], 0)
        return t[rank * ffn_loc:(rank + 1) * ffn_loc]

    mine.mlp.fc1.weight.data.copy_(fc1_rows(fc1w))
    if fc1b is not None:
        mine.mlp.fc1.bias.data.copy_(fc1_rows(fc1b))
    mine.mlp.fc2.weight.data.copy_(src.mlp.fc2.weight.data[:, rank * ffn_loc:(rank + 1) * ffn_loc])
    if mine.mlp.fc2_bias is not None:
        mine.mlp.fc2_bias.data.copy_(src.mlp.fc2.bias.data)


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
