"""BERT encoders (Devlin et al. 2019, arXiv:1810.04805, Sec. 3; BERT-large: 24 layers, hidden
1024, 16 heads, 340M parameters) as Hugging Face's ``BertForPreTraining`` builds them: word,
position and token-type embeddings summed, layer norm and dropout; ``num_layers`` post-norm
encoder layers (self-attention with Q, K, V and output projections and the attention core as
``training.attention`` asks: under ``standard`` the eager kernels ``BertSelfAttention`` runs, scores,
softmax, attention-probability dropout and the weighted sum with the scores materialised; under
``flash`` the fused scaled-dot-product kernel that ``BertSdpaSelfAttention`` calls (transformers'
default ``attn_implementation`` where PyTorch has SDPA); then dropout, residual add and layer norm; a
GELU MLP of 4× the hidden size, dropout, residual add and layer norm); with ``pretraining_heads`` the masked-LM head (dense,
GELU, layer norm, a decoder to the vocabulary tied to the word embeddings, over every position)
with its cross-entropy, and the next-sentence classifier on the pooler's output (a tanh dense
layer on the first token, part of ``BertModel``). ``pooler: false`` is ``BertForMaskedLM``'s layout
(``BertModel(add_pooling_layer=False)``: no pooler, no next-sentence head, the masked LM only).
Parameter counts equal transformers' (bert-base: BertForPreTraining 110,106,428, BertForMaskedLM
109,514,298, BertModel 109,482,240; tests/test_hf_config.py).

Under ``precision: fp8`` the GEMM classes of ``training.fp8_gemms`` run in FP8 as a decoder
transformer's do (workloads/graph.py ``Op.op_class``; simulator/cost/compute.py prices the FP8 peak and
the inputs' cast and amax traffic): the Q, K, V and output projections are ``attention_proj``, the
intermediate and output dense layers ``mlp``, the masked-LM decoder ``lm_head`` (bf16 by default, as a
decoder's LM head); the pooler, the prediction transform and the next-sentence classifier are of no class
and stay in bf16, as do the attention core and the embeddings."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from workloads.networks.builder import NetBuilder
from workloads.networks.spec import NetworkSpec


class BertSpec(NetworkSpec):
    """A BERT encoder; ``seq_length`` tokens per sequence (512 in pre-training phase 2)."""

    family: Literal["bert"] = "bert"
    sample: ClassVar[str] = "sequence"
    num_layers: int = Field(default=24, gt=0)
    hidden_size: int = Field(default=1024, gt=0)
    num_attention_heads: int = Field(default=16, gt=0)
    intermediate_size: int = Field(default=4096, gt=0)
    vocab_size: int = Field(default=30_522, gt=0)
    max_position_embeddings: int = Field(default=512, gt=0)
    type_vocab_size: int = Field(default=2, gt=0)
    sequence_length: int = Field(default=512, gt=0)
    dropout: float = Field(default=0.1, ge=0, lt=1)
    pretraining_heads: bool = True
    pooler: bool = True
    notes: str = ""  # e.g. where an imported config's sequence length came from

    @model_validator(mode="after")
    def _shapes(self) -> BertSpec:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.sequence_length > self.max_position_embeddings:
            raise ValueError("sequence_length exceeds max_position_embeddings")
        return self

    @property
    def seq_length(self) -> int:
        return self.sequence_length

    def _build(self, net: NetBuilder) -> None:
        s, h, p = self.sequence_length, self.hidden_size, self.dropout
        x = net.embedding("embeddings.word_embeddings", s, self.vocab_size, h)
        x = net.add("embeddings.add_position", x, net.embedding("embeddings.position_embeddings", s,
                                                                self.max_position_embeddings, h))
        x = net.add("embeddings.add_token_type", x, net.embedding("embeddings.token_type_embeddings", s,
                                                                  self.type_vocab_size, h))
        x = net.dropout("embeddings.dropout", net.layernorm("embeddings.LayerNorm", x), p)
        for i in range(self.num_layers):
            name = f"encoder.layer.{i}"
            y = net.self_attention(f"{name}.attention", x, self.num_attention_heads, dropout=p, packed_qkv=False,
                                   proj_class="attention_proj")
            x = net.layernorm(f"{name}.attention.LayerNorm",
                              net.add(f"{name}.attention.residual", net.dropout(f"{name}.attention.dropout", y, p), x))
            y = net.activation(f"{name}.intermediate.gelu", net.linear(f"{name}.intermediate.dense", x,
                                                                       self.intermediate_size, op_class="mlp"))
            y = net.dropout(f"{name}.output.dropout", net.linear(f"{name}.output.dense", y, h, op_class="mlp"), p)
            x = net.layernorm(f"{name}.output.LayerNorm", net.add(f"{name}.output.residual", y, x))
        if self.pooler:
            pooled = net.select_token("pooler.first_token", x)
            pooled = net.activation("pooler.tanh", net.linear("pooler.dense", pooled, h), "tanh")
        if not self.pretraining_heads:
            return
        y = net.activation("cls.predictions.transform.gelu", net.linear("cls.predictions.transform.dense", x, h))
        y = net.layernorm("cls.predictions.transform.LayerNorm", y)
        logits = net.linear("cls.predictions.decoder", y, self.vocab_size, tied_weights=True, op_class="lm_head")
        net.cross_entropy("cls.predictions.loss", logits)
        if self.pooler:
            net.linear("cls.seq_relationship", pooled, 2)
