"""DistilBERT: BERT's blocks under other names, without token types.

Its config.json names fields differently (``dim``, ``n_heads``, ``hidden_dim``, ...) and does
not hold the LayerNorm epsilon, which DistilBERT's code fixes at 1e-12.
"""

from __future__ import annotations

from typing import Any

from ....config import EncoderConfig
from .family import Family, NameTable
from .fields import activation, attn_dropout, hf_activation, require
from .tables import layered_names

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
    return EncoderConfig(
        d_model=require(hf, "dim"),
        n_heads=require(hf, "n_heads"),
        n_layers=require(hf, "n_layers"),
        dim_mlp=require(hf, "hidden_dim"),
        dropout=float(hf.get("dropout", 0.1)),
        attn_dropout=float(hf.get("attention_dropout", 0.1)),
        norm="post",
        activation=activation(hf.get("activation", "gelu"), "activation"),
        norm_eps=1e-12,  # fixed in DistilBERT's code, not in its config
        final_norm=False,
        backend=backend,
        vocab_size=require(hf, "vocab_size"),
        # Sinusoidal DistilBERT tables are stored as ordinary weights, so "learned" loads both.
        max_positions=require(hf, "max_position_embeddings"),
        positions="learned",
        type_vocab_size=0,
        pad_token_id=hf.get("pad_token_id", 0),
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
)
FAMILIES = (DISTILBERT,)
