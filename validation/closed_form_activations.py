"""Korthikanti et al. 2022's closed forms for activation memory: test oracles, not the runtime.

A layer's activation bytes are stated once, by its layer graph (workloads/transformer_graph.py
``block_saved_tensors`` for a transformer; each network builder for its layers), and summed by
simulator/memory (rank_memory, the vectorised search path, every strategy kind). The formulas here
are "Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198) Sec. 4 and
Table 2 (validation/data/korthikanti2022_activation_memory_formulas.csv), extended as the graph is
(GQA, decoupled head widths, gated MLPs, context parallelism, MLA of DeepSeek-V2/V3, 6 B logits):
tests check the graph against them; nothing under simulator/ or workloads/ imports this module
(tests/test_counting_from_graph.py).
"""

from __future__ import annotations

from simulator.errors import ConfigError
from simulator.memory.analytic import ACTIVATION_ELEMENT_BYTES_16BIT
from workloads.schema import MLASpec
from workloads.transformer_graph import DROPOUT_MASK_BYTES, LOGITS_BYTES_PER_ELEMENT

_RECOMPUTE = ("none", "selective", "full")


def _kv_heads_per_rank(heads: int, kv_heads: int, tp: int) -> int:
    """KV heads held by one tensor-parallel rank: kv/tp, or 1 when tp > kv (Megatron replicates them)."""
    if heads % kv_heads:
        raise ConfigError("model.num_kv_heads", f"{kv_heads} does not divide attention heads ({heads})")
    if kv_heads % tp == 0:
        return kv_heads // tp
    if tp % kv_heads == 0:
        return 1
    raise ConfigError("parallelism.tp", f"{tp} and kv heads ({kv_heads}) do not divide one another")


def activation_bytes_per_layer(
    seq: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    ffn: int | None = None,
    kv_heads: int | None = None,
    gated: bool = False,
    cp: int = 1,
    dropout: bool = True,
    element_bytes: int = ACTIVATION_ELEMENT_BYTES_16BIT,
    head_dim: int | None = None,
) -> float:
    """Activation bytes one transformer layer keeps for its backward, per micro-batch, on one rank.

    Korthikanti et al. 2022 Sec. 4 (GPT layer: 4h FFN, multi-head attention, dropout,
    16-bit activations, 1-byte dropout masks):

    ================================  ===========================
    no parallelism                    s·b·h·(34 + 5·a·s/h)
    tensor parallel (t)               s·b·h·(10 + 24/t + 5·a·s/(h·t))
    tensor + sequence parallel        s·b·h/t·(34 + 5·a·s/h)
    TP + selective recompute          s·b·h·(10 + 24/t)
    TP + SP + selective recompute     34·s·b·h/t
    full recompute                    2·s·b·h  (÷t with SP: the layer input only)
    ================================  ===========================

    Generalisation, counted per stored tensor (e = ``element_bytes``, 2 for 16-bit; m = 1-byte
    dropout mask, 0 without dropout; d = ``head_dim``, h/a by default; w = a·d the width of the
    concatenated heads, = h unless the head width is decoupled; g KV heads; f FFN width):

    - kept whole on every TP rank unless sequence parallel (then ÷t):
      LN1 input e·sbh, QKV-GEMM input e·sbh, attention-output dropout mask m·sbh,
      LN2 input e·sbh, FC1 input e·sbh, MLP dropout mask m·sbh  → (4e + 2m)·sbh = 10·sbh for GPT;
    - split by TP: Q e·sbw/t, K and V 2·e·sb·d·g_rank (g_rank = g/t, or 1 when t > g as Megatron
      replicates KV heads), attention-projection input e·sbw/t (Korthikanti's h in these two
      terms is the attention width a·d); MLP plain (GeLU): activation
      input e·sbf/t + FC2 input e·sbf/t = 2e·sbf/t; gated (SwiGLU, Megatron's fused
      ``bias_swiglu`` keeps its 2f-wide input and recomputes the SiLU) 2e·sbf/t + FC2 input
      e·sbf/t = 3e·sbf/t. For GPT (g = a, f = 4h, e = 2): 8·sbh/t + 16·sbh/t = 24·sbh/t;
    - attention core, split by TP: softmax output e·as²b/t, dropout mask m·as²b/t, dropout
      output e·as²b/t (absent without dropout: the AV GEMM then reads the softmax output)
      → 5·as²b/t for GPT. Selective recompute drops exactly this term.
    - full recompute keeps the layer input e·sbh (÷t with SP).

    Context parallelism ``cp`` divides the sequence: s is replaced by s/cp everywhere, including
    the s² of the attention core (brief's rule; with ring/flash attention the core is not
    materialised at all, which is what ``recompute="selective"`` models).
    """
    for name, value in (("seq", seq), ("micro_batch", micro_batch), ("hidden", hidden), ("heads", heads), ("tp", tp), ("cp", cp)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(name, f"must be a positive integer, got {value!r}")
    if recompute not in _RECOMPUTE:
        raise ConfigError("parallelism.recompute", f"unknown recompute {recompute!r} (known: {', '.join(_RECOMPUTE)})")
    if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 1):
        raise ConfigError("model.head_dim", f"must be a positive integer, got {head_dim!r}")
    if head_dim is None and hidden % heads:
        raise ConfigError("model.hidden_size", f"{hidden} is not divisible by heads ({heads})")
    if heads % tp:
        raise ConfigError("parallelism.tp", f"{tp} does not divide attention heads ({heads})")
    if seq % cp:
        raise ConfigError("parallelism.cp", f"{cp} does not divide the sequence length ({seq})")
    if sequence_parallel and tp == 1:
        raise ConfigError("parallelism.sequence_parallel", "needs tp > 1")
    f = hidden * 4 if ffn is None else ffn
    if f < 1:
        raise ConfigError("model.ffn_hidden_size", f"must be positive, got {f}")
    if element_bytes <= 0:
        raise ConfigError("element_bytes", f"must be positive, got {element_bytes}")
    g_rank = _kv_heads_per_rank(heads, kv_heads or heads, tp)

    s = seq / cp
    sb = s * micro_batch
    e, m = float(element_bytes), float(DROPOUT_MASK_BYTES if dropout else 0)
    t = tp
    head_dim = hidden / heads if head_dim is None else head_dim
    width = heads * head_dim  # the concatenated heads: q and the output projection's input

    if recompute == "full":
        return e * sb * hidden / (t if sequence_parallel else 1)

    replicated = (4 * e + 2 * m) * sb * hidden
    if sequence_parallel:
        replicated /= t
    attn_split = e * sb * width / t + 2 * e * sb * head_dim * g_rank + e * sb * width / t
    mlp_split = (3 * e if gated else 2 * e) * sb * f / t
    total = replicated + attn_split + mlp_split
    if recompute == "none":
        core_per_element = e + m + (e if dropout else 0.0)
        total += core_per_element * (heads / t) * s * s * micro_batch
    return total


def mla_activation_bytes_per_layer(
    seq: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    mla: MLASpec,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    ffn: int | None = None,
    gated: bool = False,
    cp: int = 1,
    dropout: bool = True,
    element_bytes: int = ACTIVATION_ELEMENT_BYTES_16BIT,
    flash_attention: bool = False,
) -> float:
    """Activation bytes of one layer with multi-head latent attention (DeepSeek-V2/V3), per
    micro-batch on one rank: :func:`activation_bytes_per_layer`'s accounting with the attention
    block's tensors replaced (e bytes per element, a heads, t = tp, d_qk = nope + rope,
    d_v = ``v_head_dim``, r_q / r_kv the latent ranks, r_q = h without a query latent):

    - ``recompute="none"``: LN inputs/outputs, dropout masks as for MHA (4e + 2m)·sbh; the
      latents before and after their RMSNorms 2e·sb·(r_q + r_kv) plus the RoPE key e·sb·rope
      (without a query latent W_Q reads the LN output, already counted); Q and K
      2e·sb·a·d_qk/t, V e·sb·a·d_v/t, the output projection's input e·sb·a·d_v/t; the
      softmax/dropout core 5·a·s²·b/t unless FlashAttention;
    - ``"selective"``: DeepSeek-V3's recompute (arXiv:2412.19437 Sec. 3.2.3: all RMSNorms and
      the MLA up-projections are recomputed in the backward) plus the attention core: kept are
      the LN inputs and masks (2e + 2m)·sbh, the latents before their norms and the RoPE key
      e·sb·(r_q + r_kv + rope) — the compressed latents stand in for the K/V inputs — and the
      output projection's input e·sb·a·d_v/t (the attention output FlashAttention's backward
      needs);
    - ``"full"``: the layer input e·sbh (÷t with SP).

    MLP terms as for MHA. Approximations: the latents are counted ÷t with SP (as the
    sequence-parallel tensors they are computed as); Megatron's FP8 activation caching of
    DeepSeek-V3 (Sec. 3.3.3) is not modelled (16-bit activations)."""
    if recompute not in _RECOMPUTE:
        raise ConfigError("parallelism.recompute", f"unknown recompute {recompute!r} (known: {', '.join(_RECOMPUTE)})")
    if heads % tp:
        raise ConfigError("parallelism.tp", f"{tp} does not divide attention heads ({heads})")
    if seq % cp:
        raise ConfigError("parallelism.cp", f"{cp} does not divide the sequence length ({seq})")
    f = hidden * 4 if ffn is None else ffn
    s = seq / cp
    sb = s * micro_batch
    e, m, t = float(element_bytes), float(DROPOUT_MASK_BYTES if dropout else 0), tp
    sp_div = t if sequence_parallel else 1
    if recompute == "full":
        return e * sb * hidden / sp_div
    latents = (mla.q_lora_rank or 0) + mla.kv_lora_rank
    heads_rank = heads / t
    out_in = e * sb * heads_rank * mla.v_head_dim
    mlp = (3 * e if gated else 2 * e) * sb * f / t
    if recompute == "selective":
        replicated = (2 * e + 2 * m) * sb * hidden / sp_div
        latent_bytes = e * sb * (latents + mla.qk_rope_head_dim) / sp_div
        return replicated + latent_bytes + out_in + mlp
    replicated = (4 * e + 2 * m) * sb * hidden / sp_div
    latent_bytes = (2 * e * sb * latents + e * sb * mla.qk_rope_head_dim) / sp_div
    qkv = e * sb * heads_rank * (2 * mla.qk_head_dim + mla.v_head_dim)
    total = replicated + latent_bytes + qkv + out_in + mlp
    if not flash_attention:
        total += (e + m + (e if dropout else 0.0)) * heads_rank * s * s * micro_batch
    return total


def embedding_activation_bytes(seq: int, micro_batch: int, hidden: int, tp: int = 1, sequence_parallel: bool = False, cp: int = 1) -> float:
    """Per micro-batch on the first stage: the embedding-dropout mask, 1 byte per element, s·b·h
    (÷t with SP). Korthikanti 2022 Sec. 4.3: "sbhp/t" for p micro-batches in flight; the
    embedding output itself is the first layer's input and is counted there."""
    return DROPOUT_MASK_BYTES * (seq / cp) * micro_batch * hidden / (tp if sequence_parallel else 1)


def output_layer_activation_bytes(
    seq: int,
    micro_batch: int,
    hidden: int,
    vocab: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    cp: int = 1,
    logits_bytes_per_element: float = LOGITS_BYTES_PER_ELEMENT,
    element_bytes: int = ACTIVATION_ELEMENT_BYTES_16BIT,
) -> float:
    """Per micro-batch on the last stage: final-norm input and LM-head input (2·e·sbh, ÷t with
    SP) plus the logits s·b·V/t × ``logits_bytes_per_element`` (vocab-parallel head).
    With SP, e = 2 and 4 B per logit this is Korthikanti 2022 Sec. 4.3's 4·sbh/t·(1 + V/h)."""
    s = seq / cp
    norm_and_head_inputs = 2 * element_bytes * s * micro_batch * hidden / (tp if sequence_parallel else 1)
    logits = logits_bytes_per_element * s * micro_batch * vocab / tp
    return norm_and_head_inputs + logits


def pipeline_output_tensor_bytes(seq: int, micro_batch: int, hidden: int, micro_batches_in_flight: float, element_bytes: int = 2) -> float:
    """Bytes of the stage-output tensors kept if they are not deallocated after being sent:
    e·s·b·h per micro-batch in flight. Megatron frees them (``deallocate_output_tensor``), so
    :func:`rank_memory` does not count them; Korthikanti 2022 App. B quotes the saving for the
    530B first stage as "sbhp = 2.73 GB" (= 2·s·b·h·p bytes in units of 2^30)."""
    return element_bytes * seq * micro_batch * hidden * micro_batches_in_flight
