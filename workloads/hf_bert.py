"""A Hugging Face BERT ``config.json`` (``model_type: bert``) as the BERT encoder network
(workloads/networks/bert.py, the catalog's ``bert-large`` family).

The keys map one to one: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``intermediate_size``, ``vocab_size``, ``max_position_embeddings``, ``type_vocab_size`` and
``hidden_dropout_prob``; the sequence length is ``max_position_embeddings`` (said in the run's
output; ``training.seq_length`` does not apply to an encoder network). The heads follow the
config's ``architectures``: ``BertForPreTraining`` (masked LM + next sentence; also when the key
is absent, as the catalog's bert-large), ``BertForMaskedLM`` (masked LM, no pooler) or
``BertModel`` (the encoder and pooler). Parameter counts equal transformers' for each
(tests/test_hf_config.py). What the network does not describe is refused by name: other heads
(sequence classification, question answering, ...), a decoder (``is_decoder``, cross-attention),
relative position embeddings, activations other than GELU, and attention dropout that is on
while the hidden dropout is off (or the reverse: the builder has one dropout switch).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from simulator.errors import ConfigError, from_pydantic
from workloads.networks.bert import BertSpec

#: architectures -> (pretraining_heads, pooler) of :class:`BertSpec`.
HEADS = {"BertForPreTraining": (True, True), "BertForMaskedLM": (True, False), "BertModel": (False, True)}
_GELU = ("gelu", "gelu_new", "gelu_python", "gelu_pytorch_tanh")
#: transformers.BertConfig's defaults for keys a file may leave out.
DEFAULTS = {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072,
            "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "position_embedding_type": "absolute"}


def bert_from_hf_config(config: dict[str, Any], name: str, field: str = "model") -> BertSpec:
    """The BERT network of a ``model_type: bert`` config; what it cannot describe is a ConfigError."""
    config = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    architectures = config.get("architectures") or ["BertForPreTraining"]
    if not isinstance(architectures, list) or len(architectures) != 1 or architectures[0] not in HEADS:
        raise ConfigError(f"{field}.architectures", f"{architectures!r}: a BERT is simulated as one of "
                                                    f"{', '.join(HEADS)} (other heads are not described)")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ConfigError(f"{field}.is_decoder", "a BERT decoder (causal, cross-attention) is not the encoder network")
    if config["position_embedding_type"] != "absolute":
        raise ConfigError(f"{field}.position_embedding_type",
                          f"{config['position_embedding_type']!r}: only absolute position embeddings are described")
    if config["hidden_act"] not in _GELU:
        raise ConfigError(f"{field}.hidden_act", f"{config['hidden_act']!r}: the network's MLP is a GELU")
    hidden_p, attention_p = config["hidden_dropout_prob"], config["attention_probs_dropout_prob"]
    if (hidden_p > 0) != (attention_p > 0):
        raise ConfigError(f"{field}.attention_probs_dropout_prob", f"{attention_p} with hidden_dropout_prob "
                                                                   f"{hidden_p}: the network has one dropout switch")
    heads, pooler = HEADS[architectures[0]]
    seq = config["max_position_embeddings"]
    data = {"name": config.get("_name_or_path") or name, "family": "bert",
            "num_layers": config["num_hidden_layers"], "hidden_size": config["hidden_size"],
            "num_attention_heads": config["num_attention_heads"], "intermediate_size": config["intermediate_size"],
            "vocab_size": config["vocab_size"], "max_position_embeddings": seq,
            "type_vocab_size": config["type_vocab_size"], "sequence_length": seq, "dropout": hidden_p,
            "pretraining_heads": heads, "pooler": pooler,
            "source": f"Hugging Face config.json ({architectures[0]})",
            "notes": f"sequence length {seq} from config.json's max_position_embeddings"}
    try:
        return BertSpec.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, field) from None
