"""MPNet (Song et al., 2020): BERT's post-norm layout with a relative position bias.

What differs from BERT (checked against transformers' ``modeling_mpnet.py``):

* one learned bias per head and relative-distance bucket (``encoder.relative_attention_bias``,
  32 T5-style buckets up to distance 128), shared by every layer and added to its scores
  (:mod:`clearformer.relative_bias`);
* absolute positions as RoBERTa numbers them, from padding index + 1; transformers fixes the
  padding index at 1 whatever the config says, so a config naming another is refused;
* no token type embeddings; its own parameter names (``attention.attn.q``, ``.o``, ...);
* the classifier is RoBERTa's (``classifier.dense`` + tanh, ``classifier.out_proj``), and so
  is the masked-LM head (``lm_head``: dense, exact GELU, ``layer_norm``, tied decoder, bias).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ....config import EncoderConfig
from ....heads import ClassifierConfig
from ..files import CheckpointError
from .bert import masked_lm
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
)
from .tables import head_names, layered_names

LAYER = {
    "prefix": "encoder.layer",
    "qkv": ("attention.attn.q", "attention.attn.k", "attention.attn.v"),
    "attn.out_proj": "attention.attn.o",
    "attn_norm": "attention.LayerNorm",
    "mlp.fc_in": "intermediate.dense",
    "mlp.fc_out": "output.dense",
    "mlp_norm": "output.LayerNorm",
}
PAD = 1  # MPNetEmbeddings.padding_idx, fixed in transformers
MAX_DISTANCE = 128  # MPNetEncoder.relative_position_bucket's max_distance, fixed as well


def read_config(hf: dict[str, Any], backend: str) -> EncoderConfig:
    sizes = {
        "width": integer(hf, "hidden_size", "width"),
        "layers": integer(hf, "num_hidden_layers", "layers"),
        "mlp": integer(hf, "intermediate_size", "mlp"),
        "vocab": integer(hf, "vocab_size", "vocab"),
        "positions": integer(hf, "max_position_embeddings", "positions"),
    }
    heads = integer(hf, "num_attention_heads", "heads")
    check_heads(hf, "hidden_size", "num_attention_heads")
    check_size(**sizes, token_types=0)
    buckets = hf.get("relative_attention_num_buckets", 32)
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 4 or buckets % 2:
        raise CheckpointError(
            "config.json 'relative_attention_num_buckets' must be an even int >= 4, "
            f"got {buckets!r}"
        )
    pad = hf.get("pad_token_id", PAD)
    if pad != PAD:
        raise CheckpointError(
            f"MPNet config.json 'pad_token_id' must be {PAD} (MPNet's embeddings number "
            f"positions from padding index {PAD} + 1, whatever the config says), got {pad!r}"
        )
    if sizes["positions"] <= PAD + 1:
        raise CheckpointError(
            f"MPNet config.json 'max_position_embeddings'={sizes['positions']} leaves no "
            f"position after the padding index {PAD}"
        )
    return EncoderConfig(
        d_model=sizes["width"],
        n_heads=heads,
        n_layers=sizes["layers"],
        dim_mlp=sizes["mlp"],
        dropout=number(hf, "hidden_dropout_prob", 0.1, low=0.0, high=1.0),
        attn_dropout=number(hf, "attention_probs_dropout_prob", 0.1, low=0.0, high=1.0),
        norm="post",
        activation=activation(hf.get("hidden_act", "gelu"), "hidden_act"),
        norm_eps=number(hf, "layer_norm_eps", 1e-12, low=1e-30, high=1.0),
        final_norm=False,
        backend=backend,
        relative_attention_buckets=buckets,
        relative_attention_max_distance=MAX_DISTANCE,
        vocab_size=sizes["vocab"],
        max_positions=sizes["positions"],
        positions="learned",
        type_vocab_size=0,
        pad_token_id=PAD,
        position_offset=PAD + 1,
        embedding_norm=True,
    )


def write_config(config: EncoderConfig) -> dict[str, Any]:
    if not config.relative_attention_buckets:
        raise CheckpointError(
            "an MPNet checkpoint needs a relative position bias "
            "(EncoderConfig.relative_attention_buckets > 0), got 0"
        )
    if config.relative_attention_max_distance != MAX_DISTANCE:
        raise CheckpointError(
            f"MPNet's relative position buckets reach distance {MAX_DISTANCE} (fixed in "
            "transformers), got EncoderConfig.relative_attention_max_distance="
            f"{config.relative_attention_max_distance}"
        )
    if (config.pad_token_id, config.position_offset, config.type_vocab_size) != (PAD, PAD + 1, 0):
        raise CheckpointError(
            f"MPNet needs pad_token_id={PAD}, position_offset={PAD + 1} and type_vocab_size=0, "
            f"got {config.pad_token_id}, {config.position_offset} and {config.type_vocab_size}"
        )
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_attention_heads": config.n_heads,
        "num_hidden_layers": config.n_layers,
        "intermediate_size": config.dim_mlp,
        "hidden_act": hf_activation(config, "mpnet"),
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": attn_dropout(config),
        "max_position_embeddings": config.max_positions,
        "layer_norm_eps": config.norm_eps,
        "relative_attention_num_buckets": config.relative_attention_buckets,
        "pad_token_id": PAD,
    }


def names(n_layers: int) -> NameTable:
    table = layered_names(n_layers, LAYER, token_types=False)
    table.append(("encoder.relative_bias.weight", ("encoder.relative_attention_bias.weight",)))
    return table


def classifier(hf: dict[str, Any]) -> HeadLayout:
    """``MPNetForSequenceClassification``: RoBERTa's head (dense + tanh, then out_proj)."""
    count, label_names = labels(hf)
    config = ClassifierConfig(
        d_model=integer(hf, "hidden_size", "width"), num_labels=count, labels=label_names
    )
    return HeadLayout(config, head_names("classifier.dense", "classifier.out_proj"))


MPNET = Family(
    model_type="mpnet",
    hf_class="MPNetModel",
    base_prefix="mpnet.",
    unused_prefixes=("pooler.", "lm_head.", "classifier.", "qa_outputs."),
    ignored_keys=("embeddings.position_ids",),
    read_config=read_config,
    write_config=write_config,
    names=names,
    kept_prefixes=("pooler.",),
    classifier=classifier,
    masked_lm=partial(masked_lm, roberta=True),
)
FAMILIES = (MPNET,)
