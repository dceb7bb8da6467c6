"""The transformer's layer graph: embedding -> blocks -> LM head, for one micro-batch on one rank.

``transformer_layer_graph(model, shard)`` (also ``TransformerSpec.layer_graph(shard)``) turns the
ops of :mod:`workloads.graph` into a :class:`~workloads.layer_graph.LayerGraph`, and states here,
once, what each layer keeps:

- parameters per rank are not stated here: each layer's are its ops' (the weight shapes of its GEMMs,
  their biases, its norms' and embedding tables, ``workloads.graph.Op.params``; at tp = ep = 1 the
  model's own count: workloads/counting.py sums them for ``total_params`` and the rest;
  validation/closed_forms.py states them a second way, as a test oracle). The ops are split the
  Megatron way (Shoeybi 2019): Q/O and FFN matrices ÷tp, K/V ÷tp (one KV head per rank, replicated,
  when tp > kv heads), column-parallel biases ÷tp, row-parallel biases and norms replicated, MLA
  down-projections replicated, routed experts ÷ep and each one's FFN ÷etp (expert tensor parallel),
  router replicated; the word embedding vocab-parallel (÷tp, the vocabulary padded as Megatron pads
  it: ``TransformerSpec.make_vocab_size_divisible_by``), learned positions replicated; the LM
  head ÷tp (none of its own with tied embeddings: its GEMM's weight is the embedding's table, and the
  copy a pipeline's last stage keeps of it, ``tied_copy_params``, is that GEMM's k x n);
- the activation tensors each layer saves for its backward (:func:`block_saved_tensors`), and
  which recompute drops them: selective recompute drops the attention core (Korthikanti et al.
  2022, arXiv:2205.05198 Sec. 4) and for MLA also the norms' outputs and the up-projections
  (DeepSeek-V3, arXiv:2412.19437 Sec. 3.2.3); full recompute keeps the layer input only;
  FlashAttention never stores the s x s core; torchtitan's per-op selective checkpointing
  (``recompute: selective_op``) keeps the shares :func:`block_saved_tensors` states. Korthikanti's closed forms
  (``validation.closed_form_activations.activation_bytes_per_layer``) are the test oracle;
- the first stage's embedding-dropout mask and the last stage's norm/head inputs and logits;
- how MFU counts its FLOPs: 3 x the forward ops' (``model_flops_rule = "three_forward"``, Korthikanti
  2022 Eq. 7: the attention core at its full s x s, FlashAttention's re-computed scores not model
  FLOPs), summed over the ops by ``LayerGraph.step_flops``.

The embedding is the graph's ``prologue`` and the head its ``epilogue``: a pipeline splits the
blocks and pins those two to the first and last chunk (Megatron-LM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache

from workloads.graph import LayerWork, ShardShape, embedding_work, head_work, layer_work, vocab_rows
from workloads.layer_graph import Layer, LayerGraph
from workloads.layer_kinds import layer_kind_keys
from workloads.lora import adapter_saved_elements
from workloads.schema import TransformerSpec

#: Bytes per dropout-mask element (Korthikanti 2022 Sec. 4.1 counts masks as 1 byte).
DROPOUT_MASK_BYTES = 1
#: Bytes per logit element on the last stage at the loss: the 16-bit logits (2 B) and the fp32
#: softmax/cross-entropy copy (4 B) that Megatron's vocab-parallel cross-entropy makes
#: (``vocab_parallel_logits.float()``, exp kept for the backward); both are alive while the
#: loss is computed. Korthikanti 2022 Sec. 4.3 counts 4 B per logit instead.
LOGITS_BYTES_PER_ELEMENT = 6
#: ... with a fused cross-entropy kernel (``TrainingSpec.fused_cross_entropy``: flash-attn's Triton
#: ``flash_attn.losses.cross_entropy.CrossEntropyLoss``, llm-foundry's default ``loss_fn:
#: fused_crossentropy``): the kernel reads the 16-bit logits and keeps them with one fp32 log-sum-exp
#: per token for its backward, no fp32 copy: 2 B per logit.
FUSED_LOGITS_BYTES_PER_ELEMENT = 2

#: Layer kinds whose ops carry their own tensor-parallel split (a graph of other kinds runs at tp 1).
TENSOR_PARALLEL_KINDS = frozenset({"embedding", "transformer_block", "lm_head"})


#: The tensors of a transformer block (:func:`block_saved_tensors`) that only a weight gradient reads, by the
#: GEMM whose weight gradient reads them: the inputs of its QKV (or MLA's down-projections: the norm output) and
#: FC1 (the norms' outputs), MLA's normalised latents (the up-projections' input) and FC2's input. A block whose
#: weights are frozen does not keep them: PyTorch saves a linear layer's input only when its weight needs a
#: gradient (measured, torch 2.13 with saved_tensors_hooks: a GPT block with frozen weights saves 12.0 elements
#: per token and hidden unit instead of 18.0, the QKV, FC1 and FC2 inputs; a frozen nn.Conv2d still saves its
#: input and weight, so a CNN block keeps all). The attention output stays: FlashAttention's backward reads it.
#: Read by subnetwork data parallelism's frozen blocks (simulator/strategies/subnetwork_dp.py) and by LoRA's
#: frozen base, where an adapter on the GEMM keeps its input (workloads/lora.py).
WEIGHT_GRADIENT_ONLY_TENSORS_BY_GEMM = {"qkv": frozenset({"qkv_input", "ln1_output", "latents_normed"}),
                                        "fc1": frozenset({"fc1_input", "ln2_output"}),
                                        "fc2": frozenset({"fc2_input"})}
WEIGHT_GRADIENT_ONLY_TENSORS = frozenset().union(*WEIGHT_GRADIENT_ONLY_TENSORS_BY_GEMM.values())


@dataclass(frozen=True)
class SavedTensor:
    """One activation a layer keeps for its backward: its bytes per micro-batch on one rank,
    whether selective recompute drops it (re-creating it in the backward) and the share of it
    that per-op selective checkpointing keeps (``recompute: selective_op``)."""

    name: str
    nbytes: float
    selective_drops: bool = False
    op_sac_kept: float = 1.0   # share kept under torchtitan's per-op selective checkpointing (selective_op)
    # Megatron-Core recompute modules that drop it, each with the share it drops (recompute_modules: see
    # :func:`_module_drops`); the shares of modules that are parts of one another (moe holds moe_act) overlap
    drops: tuple[tuple[str, float], ...] = ()


def kv_heads_per_rank(model: TransformerSpec, tp: int) -> int:
    """KV heads held by one tensor-parallel rank: kv/tp, or 1 when tp > kv (Megatron replicates them)."""
    kv = model.kv_heads
    return kv // tp if kv % tp == 0 else 1


def moe_ffn_width(model: TransformerSpec) -> int:
    """FFN width whose activations a MoE layer stores per token: top-k routed experts (times the
    capacity factor if one is set: padded slots are stored too) plus shared experts. Assumes the
    tokens spread evenly over the expert-parallel ranks."""
    if model.moe is None:
        return model.ffn_size
    expert_ffn = model.moe.expert_ffn_hidden_size or model.ffn_size
    routed = model.moe.top_k * expert_ffn * (model.moe.capacity_factor or 1.0)
    return int(math.ceil(routed + model.moe.num_shared_experts * expert_ffn))


def block_saved_tensors(model: TransformerSpec, shard: ShardShape, moe_layer: bool,
                        dropout: bool = True) -> tuple[SavedTensor, ...]:
    """The tensors one block keeps for its backward (:func:`_base_saved_tensors`), under LoRA
    (``shard.lora``, workloads/lora.py) less the inputs only a frozen GEMM's weight gradient would read
    (:data:`WEIGHT_GRADIENT_ONLY_TENSORS_BY_GEMM`, kept where an adapter sits on the GEMM) and with each
    adapter's x·A (b·s·r elements, whole on every tp rank)."""
    tensors = _module_drops(model, moe_layer, _base_saved_tensors(model, shard, moe_layer, dropout))
    lora = shard.lora
    if lora is None:
        return tensors
    dropped = frozenset().union(*(names for gemm, names in WEIGHT_GRADIENT_ONLY_TENSORS_BY_GEMM.items()
                                  if gemm not in lora.targets))
    tokens = shard.micro_batch * shard.seq_length // shard.cp
    adapters = SavedTensor("lora_adapter_inputs", shard.act_bytes * adapter_saved_elements(model, lora, tokens))
    return tuple(x for x in tensors if x.name not in dropped) + (adapters,)


def _base_saved_tensors(model: TransformerSpec, shard: ShardShape, moe_layer: bool,
                        dropout: bool = True) -> tuple[SavedTensor, ...]:
    """The tensors one block keeps for its backward without recompute, per micro-batch on one
    rank (e bytes per element, m = 1-byte dropout masks, s = seq/cp local tokens, b micro-batch,
    h hidden, t = tp, f the FFN width — top-k experts' widths for a MoE block):

    - MHA/GQA (Korthikanti 2022 Sec. 4.1, per tensor): LN1 input, QKV input, attention-output
      mask, LN2 input, FC1 input, MLP mask, (4e + 2m)·sbh, ÷t with sequence parallel; Q e·sbh/t,
      K and V 2e·sb·d·g (g KV heads per rank), the output projection's input e·sbh/t; FC1 output
      e·sbf/t (2f wide when gated: Megatron's fused ``bias_swiglu`` keeps its input and recomputes
      the SiLU) and FC2 input e·sbf/t (a MoE block whose experts clamp their GLU inputs,
      ``moe.activation_clamp``, keeps the clamped halves' concatenation too, 2e·sb per routed width);
      the attention core (softmax output, mask, dropout output,
      (2e + m)·a·s²b/t; absent with FlashAttention) is what selective recompute drops.
    - MLA (DeepSeek-V2/V3): LN inputs and masks as above, the LN outputs (dropped by DeepSeek-V3's
      selective recompute, like the latents after their RMSNorms and Q, K, V of the up-projections),
      the latents before their norms and the RoPE key (÷t with SP), the output projection's
      input, the MLP as for MHA, the core unless FlashAttention.
    """
    e = float(shard.act_bytes)
    m = float(DROPOUT_MASK_BYTES if dropout else 0)
    t = shard.tp
    s = shard.seq_length / shard.cp
    sb = s * shard.micro_batch
    h = model.hidden_size
    sp_div = t if shard.sequence_parallel else 1
    f = moe_ffn_width(model) if moe_layer else model.ffn_size
    heads_rank = model.num_attention_heads / t
    # FP8 linear layers keep their inputs quantized (``ShardShape.fp8_saved_inputs``): q8 bytes per element
    q8 = shard.fp8_saved_element_bytes
    mlp_fp8 = ("experts" if moe_layer else "mlp") in shard.fp8_saved_inputs
    proj_fp8 = "attention_proj" in shard.fp8_saved_inputs
    mlp = [SavedTensor("fc1_output", (2 * e if model.gated_mlp else e) * sb * f / t),
           SavedTensor("fc2_input", (q8 if mlp_fp8 else e) * sb * f / t)]
    if moe_layer and model.moe is not None and model.moe.activation_clamp is not None:
        # Megatron-Core's clamped GLU (workloads/graph.py _expert_bias_and_clamp): the clamps keep their input
        # (FC1's output, counted) and the fused kernel keeps its own input, the clamped halves' concatenation
        # (fused_bias_geglu.py ctx.save_for_backward): 2e per routed expert width beside FC1's output
        routed = model.moe.top_k * (model.moe.expert_ffn_hidden_size or model.ffn_size) * (
            model.moe.capacity_factor or 1.0)
        mlp.append(SavedTensor("expert_act_clamped_input", 2 * e * sb * routed / t, op_sac_kept=0.0))
    if moe_layer and model.moe is not None:
        # The routed experts' input: Megatron-Core 0.16.1 transformer/moe/experts.py TEGroupedMLP.forward runs
        # linear_fc1 (Transformer Engine GroupedLinear, which saves its input for the weight gradient, quantized
        # under FP8) on permuted_local_hidden_states, the tokens dispatched to the rank's experts
        # (token_dispatcher.py MoEAlltoAllTokenDispatcher: permute, all-to-all, sort_chunks_by_idxs; with
        # etp > 1 all-gathered over the etp ranks): top_k copies of each of the rank's routed tokens (its
        # sequence-parallel share), times the capacity factor (padded to capacity, as this model reads it
        # throughout: moe_pad_expert_input_to_capacity), h wide. Not a second count of ``fc1_input``: that is
        # the norm output, one copy per token, which the router's gating GEMM keeps (moe_utils.py
        # RouterGatingLinearFunction.forward saves inp; the shared experts' FC1 keeps the same storage). The
        # flex dispatcher (DeepEP / HybridEP, token_dispatcher.py MoEFlexTokenDispatcher) gives the same count:
        # its fused dispatch saves a handle only (fused_a2a.py) and the local permute builds the top_k copies.
        # The permutes, all-to-alls, etp all-gather and unpermute (called without probs) save only index maps
        # or split sizes; the probabilities the weighted activation saves (top_k fp32 per token) and the
        # router's scores (num_experts per token) are not counted.
        routed_tokens = model.moe.top_k * (model.moe.capacity_factor or 1.0) * sb / sp_div * shard.etp
        mlp.append(SavedTensor("expert_fc1_input", (q8 if mlp_fp8 else e) * routed_tokens * h, op_sac_kept=0.0))
    core_bytes = (e + m + (e if dropout else 0.0)) * heads_rank * s * s * shard.micro_batch
    masks = [SavedTensor("attn_dropout_mask", m * sb * h / sp_div), SavedTensor("mlp_dropout_mask", m * sb * h / sp_div)]
    if model.mla is None:
        # per-op selective checkpointing (workloads.graph.op_sac_recompute) keeps the block input, the
        # residual sum after attention (as the saved reduce-scatter output it is recomputed from), q and
        # v (mm 1 and 3: half of k_v under GQA's equal K and V), the attention output, w1's half of a
        # gated FC1 output (a plain FC1's whole output, mm 5), the masks; the norm outputs (QKV and FC1
        # inputs), K, w3's half, the FC2 input and a materialised core are recomputed
        d, g = model.head_dim, kv_heads_per_rank(model, t)
        # Under FP8 (Transformer Engine): LayerNormLinear's fused norm + cast keeps the QKV / FC1 input
        # (the norm output) in FP8 and no 16-bit copy (a MoE block's FC1 input is also the bf16 router's
        # input: kept in 16 bits); the attention projection (Linear) keeps an FP8 copy of its input
        # beside the 16-bit attention output that a fused attention kernel keeps for its own backward
        # (transformer_engine/pytorch/module/{layernorm_linear,linear,layernorm_mlp}.py, ctx.save_for_backward)
        qkv_bytes = q8 if proj_fp8 else e
        fc1_bytes = q8 if mlp_fp8 and not moe_layer else e
        out_bytes = (e + q8 if shard.flash_attention else q8) if proj_fp8 else e
        tensors = [SavedTensor(name, nbytes * sb * h / sp_div, op_sac_kept=kept)
                   for name, nbytes, kept in (("ln1_input", e, 1.0), ("qkv_input", qkv_bytes, 0.0),
                                              ("ln2_input", e, 1.0), ("fc1_input", fc1_bytes, 0.0))]
        tensors += masks
        width = model.attention_width  # heads x head_dim (= h unless the head width is decoupled)
        tensors += [SavedTensor("q", e * sb * width / t), SavedTensor("k_v", 2 * e * sb * d * g, op_sac_kept=0.5),
                    SavedTensor("attn_out_input", out_bytes * sb * width / t)]
        if model.qk_norm:  # the q and k norms keep their inputs too (Qwen3; Megatron qk_layernorm)
            tensors.append(SavedTensor("qk_norm_input", e * sb * (width / t + d * g),
                                       op_sac_kept=(width / t) / (width / t + d * g)))
        tensors += [SavedTensor("fc1_output", mlp[0].nbytes, op_sac_kept=0.5 if model.gated_mlp else 1.0),
                    SavedTensor("fc2_input", mlp[1].nbytes, op_sac_kept=0.0), *mlp[2:]]
        if not shard.flash_attention:
            tensors.append(SavedTensor("attention_core", core_bytes, selective_drops=True, op_sac_kept=0.0))
        return tuple(tensors)
    mla = model.mla
    latents = (mla.q_lora_rank or 0) + mla.kv_lora_rank
    tensors = [SavedTensor("ln1_input", e * sb * h / sp_div), SavedTensor("ln2_input", e * sb * h / sp_div),
               SavedTensor("ln1_output", e * sb * h / sp_div, selective_drops=True),
               SavedTensor("ln2_output", e * sb * h / sp_div, selective_drops=True)]
    tensors += masks
    tensors += [SavedTensor("latents", e * sb * latents / sp_div),
                SavedTensor("latents_normed", e * sb * latents / sp_div, selective_drops=True),
                SavedTensor("rope_key", e * sb * mla.qk_rope_head_dim / sp_div),
                SavedTensor("q_k_v", e * sb * heads_rank * (2 * mla.qk_head_dim + mla.v_head_dim), selective_drops=True),
                SavedTensor("attn_out_input", e * sb * heads_rank * mla.v_head_dim)]
    tensors += mlp
    if not shard.flash_attention:
        tensors.append(SavedTensor("attention_core", core_bytes, selective_drops=True))
    return tuple(tensors)


def _module_drops(model: TransformerSpec, moe_layer: bool, tensors: tuple[SavedTensor, ...]) -> tuple[SavedTensor, ...]:
    """``tensors`` with the Megatron-Core recompute modules that drop each (``recompute_granularity:
    selective`` with ``recompute_modules``; the ops each re-runs: workloads/graph.py ``MODULE_OP_STEMS``).
    A module run under ``tensor_parallel.checkpoint`` (core_attn, mlp, moe, shared_experts) keeps its inputs
    and drops what its ops save inside it; one run under ``CheckpointWithoutOutput`` (layernorm, moe_act,
    mla_up_proj; megatron-core 0.16.1 ``tensor_parallel/random.py``) keeps its inputs and frees its output's
    storage after the next module's forward, dropping the copy that module saved for its backward:

    - core_attn: the materialised core (:func:`_base_saved_tensors`' ``attention_core``; nothing with a
      fused kernel: q, k, v are its inputs and its output is the output projection's saved input);
    - layernorm: the norm output the next GEMM saved: ``ln2``'s in a MoE block (``fc1_input``, the router's
      input; MLA: ``ln2_output``) and with MLA ``ln1``'s (``ln1_output``, the down-projections' input); the
      GQA/MHA input norm and a dense block's pre-MLP norm are fused into their GEMMs (no module to recompute);
    - mlp (dense blocks): the norm output (``fc1_input`` / ``ln2_output``: the norm runs inside the fused
      fc1), FC1's output and FC2's input; its input, the residual, stays as ``ln2_input``;
    - moe (MoE blocks): everything the experts and shared experts save (``fc1_output``, ``fc2_input``, the
      clamped GLU input, the routed experts' permuted input ``expert_fc1_input``); its input, the norm output,
      stays;
    - moe_act: the activation's output, the routed part of ``fc2_input`` (share routed / (routed + shared
      widths)), and the clamped GLU input the fused kernel saved; FC1's output, its input, stays;
    - shared_experts: the shared part of ``fc1_output`` and ``fc2_input`` (share shared / (routed + shared));
    - mla_up_proj: the normalised latents and Q, K, V (``latents_normed``, ``q_k_v``); the latents before
      their norms and the RoPE key, its inputs, stay.

    Not counted (as without recompute): the norms' fp32 statistics."""
    shared_share = 0.0
    if moe_layer and model.moe is not None and model.moe.num_shared_experts:
        shared_share = (model.moe.num_shared_experts * (model.moe.expert_ffn_hidden_size or model.ffn_size)
                        / moe_ffn_width(model))
    norm2 = "moe" if moe_layer else "mlp"
    rules: dict[str, tuple[tuple[str, float], ...]] = {
        "attention_core": (("core_attn", 1.0),),
        "fc1_input": (("layernorm", 1.0),) if moe_layer else (("mlp", 1.0),),
        "ln2_output": (("layernorm", 1.0),) if moe_layer else (("mlp", 1.0),),
        "ln1_output": (("layernorm", 1.0),),
        "latents_normed": (("mla_up_proj", 1.0),),
        "q_k_v": (("mla_up_proj", 1.0),),
        "fc1_output": ((norm2, 1.0),) + ((("shared_experts", shared_share),) if shared_share else ()),
        "fc2_input": ((norm2, 1.0),) + ((("moe_act", 1.0 - shared_share), ("shared_experts", shared_share))
                                        if moe_layer else ()),
        "expert_act_clamped_input": (("moe", 1.0), ("moe_act", 1.0)),
        "expert_fc1_input": (("moe", 1.0),),
    }
    return tuple(replace(x, drops=rules[x.name]) if x.name in rules else x for x in tensors)


def _layer(name: str, kind: str, work: LayerWork, saved: tuple[SavedTensor, ...],
           checkpoint: float | None, output_bytes: float, inputs: tuple[str, ...], splittable: frozenset[str],
           ) -> Layer:
    total = sum(x.nbytes for x in saved)
    op_sac = sum(x.nbytes * x.op_sac_kept for x in saved) if kind == "transformer_block" else None
    return Layer(name, kind, work.forward, work.backward, saved_bytes=total,
                 saved_bytes_selective=total - sum(x.nbytes for x in saved if x.selective_drops),
                 saved_bytes_selective_op=op_sac,
                 module_drops=tuple((x.nbytes, x.drops) for x in saved if x.drops),
                 checkpoint_bytes=checkpoint, output_bytes=output_bytes, inputs=inputs, splittable=splittable)


@cache
def transformer_layer_graph(model: TransformerSpec, shard: ShardShape) -> LayerGraph:
    """The model as embedding -> num_layers blocks -> head for one micro-batch on one rank after
    ``shard`` (cached; blocks of one kind, dense or MoE, share their op tuples)."""
    e, h = float(shard.act_bytes), model.hidden_size
    sb = shard.seq_length / shard.cp * shard.micro_batch
    sp_div = shard.tp if shard.sequence_parallel else 1
    hidden_out = e * sb * h  # what a block (and the embedding) hands on, before any TP split
    splits = frozenset({"batch", "heads", "sequence"})
    embed_mask = (SavedTensor("embedding_dropout_mask", DROPOUT_MASK_BYTES * sb * h / sp_div * model.dropout),)
    # The embedding's output is the first block's input, counted there; it keeps its mask whatever
    # the recompute (Korthikanti 2022 Sec. 4.3).
    layers = [_layer("embedding", "embedding", embedding_work(model, shard), embed_mask, embed_mask[0].nbytes,
                     hidden_out, (), splits)]
    kinds = layer_kind_keys(model)  # dense / MoE (and windowed / full under a sliding window)
    per_kind: dict[object, tuple] = {}
    for i, kind in enumerate(kinds):
        if kind not in per_kind:
            first = kinds.index(kind)
            # a windowed block keeps the same tensors: FlashAttention stores no core, and a materialised
            # core is the whole s x s matrix, masked
            per_kind[kind] = (layer_work(model, shard, first),
                              block_saved_tensors(model, shard, model.is_moe_layer(first), model.dropout))
        work, saved = per_kind[kind]
        layers.append(_layer(f"block{i}", "transformer_block", work, saved,
                             e * sb * h / sp_div, hidden_out, (layers[-1].name,), splits))
    # Final-norm and LM-head inputs (÷t with SP) and the logits (÷t, vocab-parallel), whatever the
    # recompute (Korthikanti 2022 Sec. 4.3: 4·sbh/t·(1 + V/h) with SP and 4 B per logit).
    # (a frozen head, LoRA: its input is read by no weight gradient, only the final norm's input is kept)
    head_saved = (SavedTensor("norm_and_head_inputs", (1 if shard.lora else 2) * e * sb * h / sp_div),
                  SavedTensor("logits", (FUSED_LOGITS_BYTES_PER_ELEMENT if shard.fused_cross_entropy
                                          else LOGITS_BYTES_PER_ELEMENT) * sb * vocab_rows(model, shard)))
    head = head_work(model, shard)
    layers.append(_layer("head", "lm_head", head, head_saved, sum(x.nbytes for x in head_saved), 0.0,
                         (layers[-1].name,), splits))
    return LayerGraph(model.name, tuple(layers), shard.micro_batch, sample="sequence",
                      seq_length=shard.seq_length, prologue=1, epilogue=1, model_flops_rule="three_forward",
                      tied_copy_params=tied_copy_params(layers[0], head))


def tied_copy_params(embedding: Layer, head: LayerWork) -> float:
    """The copy of the word embedding a pipeline's last stage keeps for its LM head (Megatron-LM,
    pp > 1) when the head's GEMM holds no weight of its own (tied embeddings,
    ``workloads.graph.head_work``): the embedding lookup's word table (its first), per rank; 0 where
    the head holds its own weight."""
    gemm = next(op for op in head.forward if op.name == "lm_head")
    if gemm.weights:
        return 0.0
    lookup = next(op for op in embedding.forward if op.tables)
    return float(math.prod(lookup.tables[0]))
