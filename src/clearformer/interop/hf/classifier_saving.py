"""A cross-encoder written as a ``*ForSequenceClassification`` checkpoint, and a fresh one-label
head for an encoder that had none (an embedding model turned into a reranker).

The file holds the task model's keys: the encoder under the family's base prefix
(``bert.embeddings...``) and the head under its own names (``bert.pooler.dense``,
``classifier``), so ``transformers``' ``AutoModelForSequenceClassification``,
sentence-transformers' ``CrossEncoder`` and clearformer's all load it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...heads import SequenceClassifier
from ...model import EncoderModel
from .families import Family
from .files import CheckpointError
from .loading import save_with_head
from .masked_lm import copy_tokenizer_files


def classifier_config(base: dict[str, Any], family: Family, num_labels: int = 1) -> dict:
    """``base`` (an encoder's config.json) as its family's sequence classifier's config."""
    config = copy.deepcopy(base)
    name = family.hf_class.replace("Model", "ForSequenceClassification")
    config["architectures"] = [name]
    config["num_labels"] = num_labels
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
    config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    return config


def new_head(
    family: Family, config: dict, kept: dict[str, Tensor], seed: int = 0
) -> SequenceClassifier:
    """A head for ``config``: the pooler the encoder's checkpoint kept, where the head has one
    (BERT's dense + tanh on the first token), and a new output layer drawn as transformers
    draws it (normal, std ``initializer_range``; zero bias)."""
    if family.classifier is None:
        raise CheckpointError(
            f"model_type={family.model_type!r} has no sequence-classification head in clearformer"
        )
    layout = family.classifier(config)
    head = SequenceClassifier(layout.config)
    generator = torch.Generator().manual_seed(seed)
    std = float(config.get("initializer_range", 0.02))
    params = dict(head.named_parameters())
    with torch.no_grad():
        for target, (key,) in layout.names:
            bare = key.removeprefix(family.base_prefix)
            if bare in kept:
                params[target].copy_(kept[bare])
            elif target.endswith("bias"):
                params[target].zero_()
            else:
                params[target].copy_(torch.randn(params[target].shape, generator=generator) * std)
    return head


def save_classifier(
    model: EncoderModel,
    head: SequenceClassifier,
    directory: str | Path,
    family: Family,
    config: dict,
    source: Path,
) -> Path:
    """Write the cross-encoder to ``directory`` with ``source``'s tokenizer files."""
    hf_config = family.hf_config(model.config, config)
    for key in ("architectures", "num_labels", "id2label", "label2id"):
        if key in config:
            hf_config[key] = config[key]  # the classifier's, not the base model's
    out = save_with_head(model, head, family.classifier(hf_config), family, hf_config, directory)
    # The tokenizer's files only: an embedding model's sentence-transformers files would make
    # the cross-encoder read as one.
    copy_tokenizer_files(source, out)
    return out
