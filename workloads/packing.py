"""Packed sequences (``training.packing``): several documents in one sequence, attention run per document.

Fine-tuning recipes pack short examples into sequences of the training length to keep the GEMMs full
(NeMo's and Megatron-Bridge's SFT and LoRA recipes pack SQuAD to the sequence length). The documents of
a packed sequence do not attend to one another: the attention kernel is given their boundaries
(``cu_seqlens``; FlashAttention's varlen kernels, Transformer Engine's fused attention in the ``thd``
layout) and runs one causal attention per document. Sources: NeMo 2.0.0rc1 (the 24.07 container)
``MegatronGPTModel.get_forward_output_and_loss_func`` passes ``PackedSeqParams(cu_seqlens_q=cu_seqlens,
..., qkv_format='thd')`` for a batch of ``GPTSFTPackedDataset``; Megatron-Bridge 0.6.2
``training/gpt_step.py`` builds the same from the packed batch's ``cu_seqlens``.

What changes (workloads/graph.py ``layer_work``), per micro-batch of ``b`` sequences of ``s`` tokens:

- **the attention core** runs over each document: a sequence of ``s`` tokens holds documents of ``d``
  tokens (``document_tokens``), ``s // d`` of them and one of the remaining ``s mod d`` tokens
  (:func:`document_lengths`). Counted FLOPs (model FLOPs, MFU) 4·b·heads·head_dim·Σ d_i², each document
  at its full d_i x d_i as an unpacked layer is counted at s x s (Korthikanti et al. 2022 Eq. 7; the
  same Σ d_i² Megatron-Bridge 0.6.2's ``training/utils/flop_utils.py`` counts for ``thd`` batches,
  ``accumulate_flops_metadata`` and ``num_floating_point_operations``' ``core_attn_seq_factor``).
  Executed: FlashAttention's causal tiles of each document, n_i(n_i + 1)/2 tiles of 128 x 128 of the
  n_i² (n_i = ceil(d_i / 128)), i.e. the share Σ (1/2 + 1/(2 n_i)) d_i² / Σ d_i² (:func:`causal_fraction`,
  the rule of an unpacked layer, workloads/graph.py ``ShardShape.causal_fraction``, applied per
  document). Its efficiency is the fused kernel's at a sequence of ``d`` tokens (the kernel's key
  length: simulator/cost/compute.py prices the op at its ``n``). HBM traffic: q, k, v and o of the
  ``s`` tokens once, as unpacked;
- a sliding-window layer attends within its window inside each document (pairs and tiles summed over
  the documents: workloads/graph.py ``_window_core``);
- **nothing else**: the linear layers, norms, the loss and every collective run over all ``s`` tokens,
  and the activations kept for the backward are per token, as unpacked (the fused kernel keeps one
  log-sum-exp per query whatever the document). Padding at the end of a pack (recipes pad a pack to
  ``s``) is priced as tokens: the GEMMs run over it.

Equal documents are a choice: Σ d_i² of documents of unequal lengths with mean d is d·s·(1 + cv²) (cv:
their coefficient of variation), so ``document_tokens`` is best given as the length-weighted mean
Σ d_i² / Σ d_i where the lengths vary.

Priced with ``training.attention: flash`` only (an unfused softmax would compute the whole s x s scores
under a block-diagonal mask; Megatron-Core's ``thd`` layout needs Transformer Engine's fused attention),
on decoder transformers without latent attention (MLA's core is not split per document here), and
without context parallelism (its ``thd`` split pads every document to 2·cp chunks): each refused naming
``training.packing`` (:func:`check`).
"""

from __future__ import annotations

from simulator.errors import ConfigError

FIELD = "training.packing"
TILE = 128  # FlashAttention-2's query/key block (workloads/graph.py FLASH_TILE)


def document_lengths(seq: int, document_tokens: int) -> tuple[int, ...]:
    """Tokens of each document of one packed sequence: ``seq // document_tokens`` documents of
    ``document_tokens`` and one of the remainder (none when it divides)."""
    whole, rest = divmod(seq, document_tokens)
    return (document_tokens,) * whole + ((rest,) if rest else ())


def squared_tokens(seq: int, document_tokens: int) -> int:
    """Σ d_i² over the documents of one packed sequence: the (query, key) pairs of their full d_i x d_i
    attention, the count the attention core's model FLOPs scale with."""
    return sum(d * d for d in document_lengths(seq, document_tokens))


def causal_fraction(seq: int, document_tokens: int, tile: int = TILE) -> float:
    """Share of the counted Σ d_i² pairs a causal fused kernel runs: per document n(n + 1)/2 of its n²
    tiles (n = ceil(d / tile)), each computed whole, i.e. (1/2 + 1/(2n))·d² per document."""
    run = 0.0
    for d in document_lengths(seq, document_tokens):
        n = max(1, -(-d // tile))
        run += (0.5 + 0.5 / n) * d * d
    return run / squared_tokens(seq, document_tokens)


def check(document_tokens: int, seq_length: int | None, model, attention: str, cp: int) -> None:
    """Refuse what packed-sequence attention is not priced for (module docstring), naming the field."""
    from workloads.schema import TransformerSpec

    if not isinstance(model, TransformerSpec):
        raise ConfigError(FIELD, f"packed sequences are priced for decoder transformers; {getattr(model, 'name', model)!r} "
                                 "has no token sequence")
    if document_tokens > (seq_length or 0):
        raise ConfigError(f"{FIELD}.document_tokens", f"{document_tokens} tokens per document do not fit a sequence of "
                                                      f"{seq_length} tokens (the run's seq_length): at most {seq_length}")
    if model.mla is not None:
        raise ConfigError(FIELD, f"per-document attention of {model.name}'s latent attention (MLA) is not priced")
    if attention != "flash":
        raise ConfigError(FIELD, "per-document attention is a fused varlen kernel (FlashAttention / Transformer "
                                 f"Engine's thd layout): it needs training.attention: flash (the run uses {attention})")
    if cp > 1:
        raise ConfigError(FIELD, f"packed sequences under context parallelism (cp {cp}) are not priced (the thd split "
                                 "pads every document to 2·cp chunks); use cp 1")
