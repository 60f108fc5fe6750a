"""BERT and RoBERTa: one layout, two families.

RoBERTa differs from BERT in its names (``roberta.`` prefix, ``lm_head`` task head), its pad
token (1, not 0) and its positions, which it numbers from ``pad_token_id + 1``: rows up to the
pad index of the position table are never used.

Numerics come from the checkpoint's own config: LayerNorm epsilon, the GELU variant, the
post-norm placement of every BERT-family block, and the LayerNorm on the embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from ....config import EncoderConfig
from ....heads import CLASSIFIER_ACTIVATIONS, ClassifierConfig, MaskedLMConfig
from ..files import CheckpointError
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
    for key in ("lora_adaptations", "lora_rank"):  # jina-embeddings-v3's task adapters
        if hf.get(key):
            raise CheckpointError(
                f"config.json {key!r}={hf[key]!r}: LoRA adapters (jina-embeddings-v3) are not "
                "supported; only plain BERT-family weights"
            )
    # Every sizing or numeric field is checked (type and range) before EncoderConfig is built.
    sizes = {
        "width": integer(hf, "hidden_size", "width"),
        "layers": integer(hf, "num_hidden_layers", "layers"),
        "mlp": integer(hf, "intermediate_size", "mlp"),
        "vocab": integer(hf, "vocab_size", "vocab"),
        "positions": integer(hf, "max_position_embeddings", "positions"),
        "token_types": integer(hf, "type_vocab_size", "token_types", default=2),
    }
    heads = integer(hf, "num_attention_heads", "heads")
    check_heads(hf, "hidden_size", "num_attention_heads")
    check_size(**sizes)
    pad = token_id(hf, "pad_token_id", 1 if roberta else 0, sizes["vocab"])
    if roberta and pad is None:
        raise CheckpointError(f"RoBERTa config.json needs an int pad_token_id, got {pad!r}")
    if roberta and pad + 1 >= sizes["positions"]:
        raise CheckpointError(
            f"RoBERTa config.json 'max_position_embeddings'={sizes['positions']} leaves no "
            f"position after 'pad_token_id'={pad} (positions count from pad_token_id + 1)"
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
        vocab_size=sizes["vocab"],
        max_positions=sizes["positions"],
        positions="learned",
        type_vocab_size=sizes["token_types"],
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


def classifier(hf: dict[str, Any], *, roberta: bool) -> HeadLayout:
    """``BertForSequenceClassification``: the pooler's dense + tanh on the first token, then
    ``classifier``. ``RobertaForSequenceClassification`` (and XLM-R's) has no pooler: its
    ``classifier`` holds the dense + tanh and ``out_proj``."""
    count, names = labels(hf)
    config = ClassifierConfig(
        d_model=integer(hf, "hidden_size", "width"), num_labels=count, labels=names
    )
    if roberta:
        return HeadLayout(config, head_names("classifier.dense", "classifier.out_proj"))
    return HeadLayout(config, head_names("bert.pooler.dense", "classifier"))


@dataclass(frozen=True)
class MaskedLMLayout(HeadLayout):
    """A masked-LM head's layout, with the checkpoint keys that are copies of other tensors.

    transformers ties the decoder to the word embeddings (and BERT's decoder bias to
    ``cls.predictions.bias``) and leaves the copies out of the files it writes now; older files
    store them. ``tied`` lists them as (checkpoint key, ``"embedding"`` or ``"bias"``): a load
    checks each copy it finds equals what clearformer decodes with, and a save leaves them out.
    """

    tied: tuple[tuple[str, str], ...] = ()


def head_activation(hf: dict[str, Any], key: str, default: str) -> str:
    """The activation of a masked-LM head, read from config.json ``key``."""
    act = hf.get(key, default)
    if not isinstance(act, str) or act not in CLASSIFIER_ACTIVATIONS:
        raise CheckpointError(
            f"unsupported config.json {key!r}={act!r} for the masked-LM head; supported: "
            f"{', '.join(CLASSIFIER_ACTIVATIONS)}"
        )
    return act


def masked_lm(hf: dict[str, Any], *, roberta: bool) -> MaskedLMLayout:
    """``BertForMaskedLM``: ``cls.predictions.transform`` (dense -> ``hidden_act`` ->
    LayerNorm), the decoder tied to the word embeddings, ``cls.predictions.bias``.
    ``RobertaForMaskedLM`` (and XLM-R's): ``lm_head`` (dense -> exact GELU whatever
    ``hidden_act`` says -> ``layer_norm``), tied ``decoder``, ``lm_head.bias``. Both take the
    LayerNorm epsilon from ``layer_norm_eps``."""
    config = MaskedLMConfig(
        d_model=integer(hf, "hidden_size", "width"),
        vocab_size=integer(hf, "vocab_size", "vocab"),
        # RobertaLMHead calls gelu() directly; BertPredictionHeadTransform uses hidden_act.
        activation="gelu" if roberta else head_activation(hf, "hidden_act", "gelu"),
        norm_eps=number(hf, "layer_norm_eps", 1e-12, low=1e-30, high=1.0),
    )
    if roberta:
        dense, norm, bias, decoder = (
            f"lm_head.{n}" for n in ("dense", "layer_norm", "bias", "decoder")
        )
    else:
        dense, norm = "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm"
        bias, decoder = "cls.predictions.bias", "cls.predictions.decoder"
    names = linear("dense", dense) + linear("norm", norm) + [("bias", (bias,))]
    tied = ((f"{decoder}.weight", "embedding"), (f"{decoder}.bias", "bias"))
    return MaskedLMLayout(config, names, tied)


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
    classifier=partial(classifier, roberta=False),
    masked_lm=partial(masked_lm, roberta=False),
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
    classifier=partial(classifier, roberta=True),
    masked_lm=partial(masked_lm, roberta=True),
)
FAMILIES = (BERT, ROBERTA)
