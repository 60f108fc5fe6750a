"""DistilBERT: BERT's blocks under other names, without token types.

Its config.json names fields differently (``dim``, ``n_heads``, ``hidden_dim``, ...) and does
not hold the LayerNorm epsilon, which DistilBERT's code fixes at 1e-12.
"""

from __future__ import annotations

from typing import Any

from ....config import EncoderConfig
from ....heads import ClassifierConfig, MaskedLMConfig
from .bert import MaskedLMLayout, head_activation
from .family import Family, HeadLayout, NameTable
from .fields import (
    activation,
    attn_dropout,
    check_heads,
    check_size,
    hf_activation,
    integer,
    labels,
    number,
    token_id,
)
from .tables import head_names, layered_names, linear

# Where each part of a block lives in a Hugging Face layer, relative to the layer's prefix.
LAYER = {
    "prefix": "transformer.layer",
    "qkv": ("attention.q_lin", "attention.k_lin", "attention.v_lin"),
    "attn.out_proj": "attention.out_lin",
    "attn_norm": "sa_layer_norm",
    "mlp.fc_in": "ffn.lin1",
    "mlp.fc_out": "ffn.lin2",
    "mlp_norm": "output_layer_norm",
}


def read_config(hf: dict[str, Any], backend: str) -> EncoderConfig:
    # Every sizing or numeric field is checked (type and range) before EncoderConfig is built.
    sizes = {
        "width": integer(hf, "dim", "width"),
        "layers": integer(hf, "n_layers", "layers"),
        "mlp": integer(hf, "hidden_dim", "mlp"),
        "vocab": integer(hf, "vocab_size", "vocab"),
        "positions": integer(hf, "max_position_embeddings", "positions"),
        "token_types": 0,
    }
    heads = integer(hf, "n_heads", "heads")
    check_heads(hf, "dim", "n_heads")
    check_size(**sizes)
    return EncoderConfig(
        d_model=sizes["width"],
        n_heads=heads,
        n_layers=sizes["layers"],
        dim_mlp=sizes["mlp"],
        dropout=number(hf, "dropout", 0.1, low=0.0, high=1.0),
        attn_dropout=number(hf, "attention_dropout", 0.1, low=0.0, high=1.0),
        norm="post",
        activation=activation(hf.get("activation", "gelu"), "activation"),
        norm_eps=1e-12,  # fixed in DistilBERT's code, not in its config
        final_norm=False,
        backend=backend,
        vocab_size=sizes["vocab"],
        # Sinusoidal DistilBERT tables are stored as ordinary weights, so "learned" loads both.
        max_positions=sizes["positions"],
        positions="learned",
        type_vocab_size=0,
        pad_token_id=token_id(hf, "pad_token_id", 0, sizes["vocab"]),
        position_offset=0,
        embedding_norm=True,
    )


def write_config(config: EncoderConfig) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size,
        "dim": config.d_model,
        "n_heads": config.n_heads,
        "n_layers": config.n_layers,
        "hidden_dim": config.dim_mlp,
        "max_position_embeddings": config.max_positions,
        "activation": hf_activation(config, "distilbert"),
        "dropout": config.dropout,
        "attention_dropout": attn_dropout(config),
        "pad_token_id": config.pad_token_id,
    }


def names(n_layers: int) -> NameTable:
    return layered_names(n_layers, LAYER, token_types=False)


def classifier(hf: dict[str, Any]) -> HeadLayout:
    """``DistilBertForSequenceClassification``: ``pre_classifier`` + ReLU on the first token,
    then ``classifier``."""
    count, names = labels(hf)
    config = ClassifierConfig(
        d_model=integer(hf, "dim", "width"), num_labels=count, activation="relu", labels=names
    )
    return HeadLayout(config, head_names("pre_classifier", "classifier"))


def masked_lm(hf: dict[str, Any]) -> MaskedLMLayout:
    """``DistilBertForMaskedLM``: ``vocab_transform`` -> ``activation`` -> ``vocab_layer_norm``
    (epsilon 1e-12, fixed in DistilBERT's code), then ``vocab_projector``, whose weight is tied
    to the word embeddings and whose bias is the head's own."""
    config = MaskedLMConfig(
        d_model=integer(hf, "dim", "width"),
        vocab_size=integer(hf, "vocab_size", "vocab"),
        activation=head_activation(hf, "activation", "gelu"),
        norm_eps=1e-12,
    )
    names = linear("dense", "vocab_transform") + linear("norm", "vocab_layer_norm")
    names.append(("bias", ("vocab_projector.bias",)))
    return MaskedLMLayout(config, names, tied=(("vocab_projector.weight", "embedding"),))


DISTILBERT = Family(
    model_type="distilbert",
    hf_class="DistilBertModel",
    base_prefix="distilbert.",
    unused_prefixes=(
        "vocab_transform.",
        "vocab_layer_norm.",
        "vocab_projector.",
        "pre_classifier.",
        "classifier.",
        "qa_outputs.",
    ),
    ignored_keys=("embeddings.position_ids",),
    read_config=read_config,
    write_config=write_config,
    names=names,
    config_defaults={"sinusoidal_pos_embds": False},
    classifier=classifier,
    masked_lm=masked_lm,
)
FAMILIES = (DISTILBERT,)
