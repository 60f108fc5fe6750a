"""GTE (Alibaba's gte-multilingual-base, gte-*-en-v1.5) as transformers 5 writes it
(``model_type`` "gte", ``GteModel``): the shared rotary-BERT layout of :mod:`.rotary_bert`
with biases on q, k, v, o and ``down_proj``, none on ``gate_proj`` and ``up_proj``; GeGLU
(``hidden_act`` "gelu"); rotary base 160,000 by default; a token type table of
``type_vocab_size`` rows (gte-base-en-v1.5 has none).

Refused, naming the field: scaled rotary positions (gte-base-en-v1.5's NTK ``rope_scaling``),
a ``head_dim`` of its own, activations other than gelu or silu.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ....config import EncoderConfig
from ....heads import ClassifierConfig
from .family import Family, HeadLayout, NameTable
from .fields import integer, labels
from .rotary_bert import names, read_config, write_config
from .tables import head_names


def _names(n_layers: int) -> NameTable:
    return names(n_layers, token_types=True, gte=True)


def _config_names(config: EncoderConfig) -> NameTable:
    return names(config.n_layers, token_types=config.type_vocab_size > 0, gte=True)


def classifier(hf: dict[str, Any]) -> HeadLayout:
    """``GteForSequenceClassification``: BERT's head, the pooler's dense + tanh on the first
    token, then ``classifier``."""
    count, names = labels(hf)
    config = ClassifierConfig(
        d_model=integer(hf, "hidden_size", "width"), num_labels=count, labels=names
    )
    return HeadLayout(config, head_names("gte.pooler.dense", "classifier"))


GTE = Family(
    model_type="gte",
    hf_class="GteModel",
    base_prefix="gte.",
    unused_prefixes=("pooler.", "lm_head.", "classifier."),
    ignored_keys=(),
    read_config=partial(
        read_config, theta=160_000.0, act="gelu", pad=1, token_types=1, dropout=0.1
    ),
    write_config=partial(write_config, family="gte"),
    names=_names,
    kept_prefixes=("pooler.",),
    classifier=classifier,
    config_names=_config_names,
)
FAMILIES = (GTE,)
