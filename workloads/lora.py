"""LoRA fine-tuning (Hu et al. 2021, arXiv:2106.09685) of a decoder transformer: a frozen base with
low-rank adapters, as ops of the layer graph (``training.finetune``, :class:`LoraShape` on the shard).

What LoRA changes in one block, per micro-batch on one rank (``with_adapters`` on the block's forward
ops; the backward follows from them in :func:`workloads.graph._backward_of`):

- **every learned tensor of the base is frozen** (``Op.frozen``): its GEMMs run the forward and the
  input-gradient GEMM (dgrad: the gradient still flows through them to the adapters below) but no
  weight-gradient GEMM; frozen norms, embedding tables and the LM head hold no gradient and no
  optimizer state (simulator/memory/analytic.py: frozen weights in 16 bits only, no fp32 master,
  no gradient buffer), and the data-parallel gradient reduction carries the adapters' gradients
  alone (simulator/strategies/spmd/plan.py reads ``Layer.trained_params``). The embedding's
  backward (the scatter-add into its table) does not run;
- **each targeted linear layer W (k x n) gets an adapter** ``h = x·W + (alpha/r)·(x·A)·B`` with
  A (k x r) and B (r x n) trained: forward two GEMMs ``lora_a.<name>`` (m x r x k) and
  ``lora_b.<name>`` (m x n x r), and their dgrad and wgrad in the backward (2 + 4 GEMMs' worth
  of their forward FLOPs). The alpha/r scale is folded into B's epilogue (no kernel). Adapters run
  in 16 bits under FP8 training (class ``adapter``, not in ``training.fp8_gemms``: NeMo's and
  PEFT's adapters are plain linear layers, not Transformer Engine FP8 modules);
- **tensor parallelism** (Megatron's split of an adapter, NeMo ``ParallelLinearAdapter``): for a
  column-parallel base (QKV, FC1) A is whole on every rank and B split by columns like W; B's input
  (x·A, the same on every rank) then has its gradient all-reduced over tp (Megatron's "f", b·s·r
  elements). For a row-parallel base (the attention output projection, FC2) A is split by rows like
  W and its partial output x·A is all-reduced over tp (Megatron's "g", b·s·r elements), B whole;
- **activations**: a frozen linear layer does not keep its input unless an adapter reads it (only
  a weight gradient reads it: the same rule, and the same tensors, as subnetwork data parallelism's
  frozen blocks, :data:`workloads.transformer_graph.WEIGHT_GRADIENT_ONLY_TENSORS_BY_GEMM`); each
  adapter keeps x·A (b·s·r elements) for B's weight gradient; the LM head's input is not kept.

Model FLOPs (MFU's numerator, ``LayerGraph.step_flops``): 3 x the forward less the weight-gradient
GEMMs the frozen base does not run (NeMo's performance summary counts a LoRA step the same way: its
LLAMA2-7B LoRA row's 663 TFLOP/s at 24,824 tokens/s is ~4 x parameters per token plus attention,
not 6 x).

Dense decoder transformers only (multi-head or grouped-query attention, a dense MLP): a model with
latent attention (MLA) or routed experts is refused naming ``training.finetune`` (their projections
and expert GEMMs are not adapter targets here). QLoRA (a 4-bit base dequantised per GEMM) is not priced.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.errors import ConfigError

#: ``training.finetune.target_modules`` names (NeMo / Megatron-Bridge's LoRA ``target_modules``) ->
#: the block's GEMM op names (workloads/graph.py ``layer_work``).
TARGET_OPS = {"linear_qkv": "qkv", "linear_proj": "attn_out", "linear_fc1": "fc1", "linear_fc2": "fc2"}
#: Row-parallel bases (their input split over tp): A split like W, its partial output all-reduced.
ROW_PARALLEL = frozenset({"attn_out", "fc2"})
ADAPTER_A, ADAPTER_B = "lora_a", "lora_b"   # op-name prefixes of the adapter GEMMs (GEMM class "adapter")


@dataclass(frozen=True)
class LoraShape:
    """What the layer graph needs of ``training.finetune``: the adapters' rank and the op names they sit on."""

    rank: int
    targets: frozenset[str]   # op names (TARGET_OPS values)


def check_model(model) -> None:
    """Refuse a model LoRA is not priced for (module docstring), naming the field."""
    from workloads.schema import TransformerSpec

    if not isinstance(model, TransformerSpec):
        raise ConfigError("training.finetune", f"LoRA is priced for decoder transformers from the catalog or a "
                                               f"config; {getattr(model, 'name', model)!r} is not one")
    if model.mla is not None:
        raise ConfigError("training.finetune", f"LoRA on {model.name}'s latent attention (MLA) is not priced: its "
                                               f"projections are not linear_qkv / linear_proj")
    if model.moe is not None:
        raise ConfigError("training.finetune", f"LoRA on {model.name}'s routed experts is not priced (dense MLP "
                                               f"models only)")


def with_adapters(fwd: list, lora: LoraShape, tp: int, elem: int) -> list:
    """A block's forward ops under LoRA (module docstring): every op holding learned tensors frozen,
    each targeted GEMM joined by its adapter's two GEMMs (a column-parallel base's after it, a
    row-parallel base's before it, so the base stays next to the TP collective it is paired with
    under TP overlap), with the adapter's TP collective where tp > 1."""
    from workloads.graph import Op, _gemm

    out: list = []
    for op in fwd:
        base = replace(op, frozen=True) if op.params else op
        name = op.name
        if op.kind != "gemm" or name not in lora.targets:
            out.append(base)
            continue
        m, n, k, r = op.m, op.n, op.k, lora.rank
        # A is k x r and B r x n on this rank, k and n the base's own (already ÷tp where W is split): a
        # row-parallel base splits A like W (k ÷ tp) and keeps B whole; a column-parallel one keeps A whole
        # and splits B like W (n ÷ tp)
        a = replace(_gemm(f"{ADAPTER_A}.{name}", m, r, k, elem), weights=1.0)
        b = replace(_gemm(f"{ADAPTER_B}.{name}", m, n, r, elem), weights=1.0)
        if name in ROW_PARALLEL:
            gather = ([Op(f"{ADAPTER_A}.{name}.all_reduce", "collective", collective="all_reduce", group="tp",
                          comm_bytes=float(m * r * elem))] if tp > 1 else [])
            out += [a, *gather, b, base]
        else:
            if tp > 1:  # B column-parallel over a replicated input: its input gradient summed over tp
                b = replace(b, input_grad_collective="all_reduce", input_grad_bytes=float(m * r * elem))
            out += [base, a, b]
    return out


def adapter_saved_elements(model, lora: LoraShape, tokens: int) -> float:
    """Elements of the adapters' own saved tensors per block and micro-batch: x·A (``tokens`` x r, whole on every
    tp rank) of each adapter, for B's weight gradient."""
    return float(len(lora.targets) * tokens * lora.rank)
