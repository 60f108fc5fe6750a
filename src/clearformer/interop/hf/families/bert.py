"""BERT and RoBERTa: one layout, two families.

RoBERTa differs from BERT in its names (``roberta.`` prefix, ``lm_head`` task head), its pad
token (1, not 0) and its positions, which it numbers from ``pad_token_id + 1``: rows up to the
pad index of the position table are never used.

Numerics come from the checkpoint's own config: LayerNorm epsilon, the GELU variant, the
post-norm placement of every BERT-family block, and the LayerNorm on the embeddings.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ....config import EncoderConfig
from ..files import CheckpointError
from .family import Family, NameTable
from .fields import activation, attn_dropout, hf_activation, require
from .tables import layered_names

# Where each part of a block lives in a Hugging Face layer, relative to the layer's prefix.
LAYER = {
    "prefix": "encoder.layer",
    "qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "attn.out_proj": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "mlp.fc_in": "intermediate.dense",
    "mlp.fc_out": "output.dense",
    "mlp_norm": "output.LayerNorm",
}


def read_config(hf: dict[str, Any], backend: str, *, roberta: bool) -> EncoderConfig:
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise CheckpointError(
            f"unsupported position_embedding_type={position_type!r} in config.json; "
            "only 'absolute' (learned) positions are supported"
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise CheckpointError("config.json describes a decoder; only encoders are supported")
    pad = hf.get("pad_token_id", 1 if roberta else 0)
    if roberta and not isinstance(pad, int):
        raise CheckpointError(f"RoBERTa config.json needs an int pad_token_id, got {pad!r}")
    return EncoderConfig(
        d_model=require(hf, "hidden_size"),
        n_heads=require(hf, "num_attention_heads"),
        n_layers=require(hf, "num_hidden_layers"),
        dim_mlp=require(hf, "intermediate_size"),
        dropout=float(hf.get("hidden_dropout_prob", 0.1)),
        attn_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)),
        norm="post",
        activation=activation(hf.get("hidden_act", "gelu"), "hidden_act"),
        norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        final_norm=False,
        backend=backend,
        vocab_size=require(hf, "vocab_size"),
        max_positions=require(hf, "max_position_embeddings"),
        positions="learned",
        type_vocab_size=int(hf.get("type_vocab_size", 2)),
        pad_token_id=pad,
        # RoBERTa numbers positions from pad_token_id + 1 (rows up to the pad index are unused).
        position_offset=pad + 1 if roberta else 0,
        embedding_norm=True,
    )


def write_config(config: EncoderConfig, *, family: str) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_attention_heads": config.n_heads,
        "num_hidden_layers": config.n_layers,
        "intermediate_size": config.dim_mlp,
        "hidden_act": hf_activation(config, family),
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": attn_dropout(config),
        "max_position_embeddings": config.max_positions,
        "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.norm_eps,
        "pad_token_id": config.pad_token_id,
    }


def names(n_layers: int) -> NameTable:
    return layered_names(n_layers, LAYER, token_types=True)


_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_DEFAULTS = {"position_embedding_type": "absolute"}

BERT = Family(
    model_type="bert",
    hf_class="BertModel",
    base_prefix="bert.",
    unused_prefixes=("pooler.", "cls.", "classifier.", "qa_outputs."),
    ignored_keys=_BUFFERS,
    read_config=partial(read_config, roberta=False),
    write_config=partial(write_config, family="bert"),
    names=names,
    config_defaults=_DEFAULTS,
    kept_prefixes=("pooler.",),
)
ROBERTA = Family(
    model_type="roberta",
    hf_class="RobertaModel",
    base_prefix="roberta.",
    unused_prefixes=("pooler.", "lm_head.", "classifier.", "qa_outputs."),
    ignored_keys=_BUFFERS,
    read_config=partial(read_config, roberta=True),
    write_config=partial(write_config, family="roberta"),
    names=names,
    config_defaults=_DEFAULTS,
    kept_prefixes=("pooler.",),
)
FAMILIES = (BERT, ROBERTA)
