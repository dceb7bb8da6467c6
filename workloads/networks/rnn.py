"""Recurrent networks: GNMT (Wu et al. 2016, arXiv:1609.08144) and BIG LSTM (Jozefowicz et al.
2016, arXiv:1602.02410).

GNMT (Sec. 3 and Fig. 1 of the paper; layer wiring as the MLPerf/NVIDIA PyTorch reference that
PipeDream profiled, ``seq2seq/models/{encoder,decoder}.py``): word-piece embeddings (32k shared
vocabulary, Sec. 4; 32,320 in that reference); an encoder of ``layers`` LSTMs of ``hidden`` units, the bottom one
bidirectional, residual connections from the third layer up; a decoder whose bottom LSTM feeds a
normalised additive attention over the top encoder outputs, whose context is concatenated to the
input of every other decoder layer (residuals from the third up); a softmax classifier over the
vocabulary and the cross-entropy loss. ``gnmt-16`` is 8 + 8 layers of 1024 (the paper's model).

BIG LSTM (Table 1 "2-layer LSTM-8192-1024"; Sec. 3.1, 4.2): word embeddings of 1024, two LSTM
layers of 8192 cells projected to 1024 (Sak et al. 2014), a sampled softmax over the 793,471-word
One Billion Word vocabulary with 8192 samples, 20 unrolled steps (the lm_1b training setup)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from workloads.networks.builder import NetBuilder
from workloads.networks.spec import NetworkSpec


class GNMTSpec(NetworkSpec):
    """GNMT with ``layers`` encoder and ``layers`` decoder LSTMs of ``hidden`` units; a sample is
    a sentence pair of ``source_length`` and ``target_length`` tokens."""

    family: Literal["gnmt"] = "gnmt"
    sample: ClassVar[str] = "sentence"
    layers: int = Field(default=8, ge=3)
    hidden: int = Field(default=1024, gt=0)
    vocab_size: int = Field(default=32_320, gt=0)
    source_length: int = Field(default=50, gt=0)
    target_length: int = Field(default=50, gt=0)
    dropout: float = Field(default=0.2, ge=0, lt=1)

    @property
    def seq_length(self) -> int:
        return self.source_length

    def _build(self, net: NetBuilder) -> None:
        h, p = self.hidden, self.dropout
        x = net.embedding("encoder.embedder", self.source_length, self.vocab_size, h)
        x = net.lstm("encoder.rnn0", net.dropout("encoder.dropout0", x, p), h, bidirectional=True)
        x = net.lstm("encoder.rnn1", net.dropout("encoder.dropout1", x, p), h)
        for i in range(2, self.layers):
            y = net.lstm(f"encoder.rnn{i}", net.dropout(f"encoder.dropout{i}", x, p), h)
            x = net.add(f"encoder.residual{i}", y, x)
        encoded = x
        x = net.embedding("decoder.embedder", self.target_length, self.vocab_size, h)
        x = net.lstm("decoder.att_rnn", net.dropout("decoder.dropout0", x, p), h)
        context = net.additive_attention("decoder.attn", x, encoded)
        for i in range(1, self.layers):
            y = net.concat(f"decoder.cat{i}", [net.dropout(f"decoder.dropout{i}", x, p), context], dim=1)
            y = net.lstm(f"decoder.rnn{i}", y, h)
            x = net.add(f"decoder.residual{i}", y, x) if i >= 2 else y
        logits = net.linear("decoder.classifier", x, self.vocab_size)
        net.cross_entropy("loss", logits)


class BigLSTMSpec(NetworkSpec):
    """A word-level LSTM language model with projected LSTM layers and a sampled softmax."""

    family: Literal["biglstm"] = "biglstm"
    sample: ClassVar[str] = "sequence"
    layers: int = Field(default=2, gt=0)
    hidden: int = Field(default=8192, gt=0)
    projection: int = Field(default=1024, gt=0)
    embedding_dim: int = Field(default=1024, gt=0)
    vocab_size: int = Field(default=793_471, gt=0)
    num_sampled: int = Field(default=8192, gt=0)
    steps: int = Field(default=20, gt=0)

    @property
    def seq_length(self) -> int:
        return self.steps

    def _build(self, net: NetBuilder) -> None:
        x = net.embedding("embedding", self.steps, self.vocab_size, self.embedding_dim)
        for i in range(self.layers):
            x = net.lstm(f"lstm{i}", x, self.hidden, projection=self.projection)
        net.sampled_softmax("softmax", x, self.vocab_size, self.num_sampled)
