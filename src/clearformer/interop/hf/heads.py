"""A checkpoint's sequence-classification head (``*ForSequenceClassification``) as a
:class:`~clearformer.heads.SequenceClassifier` on top of its encoder.

The family says where the head's tensors are (:attr:`Family.classifier`, a
:class:`~.families.HeadLayout`). The encoder loads as usual, reporting the head's tensors as
unused (they are under the family's ``unused_prefixes``); the head then takes them, and the
report lists them as loaded (``head.<parameter>``). Strictness is the encoder's: with
``strict``, a missing head tensor is an error; a tensor of the wrong shape always is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...config import EncoderConfig
from ...heads import SequenceClassifier
from .families import Family, HeadLayout
from .files import CheckpointError, CheckpointFiles, find_checkpoint
from .loading import LoadedModel, build_model, read_family
from .mapping import LoadReport
from .weights import open_tensors

log = logging.getLogger(__name__)


@dataclass
class LoadedClassifier:
    """An encoder and its classification head, loaded from one checkpoint."""

    loaded: LoadedModel  # the encoder, as load_model gives it; report covers the head too
    head: SequenceClassifier  # eval mode


def load_classifier(
    path: str | os.PathLike | None | CheckpointFiles,
    *,
    backend: str = "auto",
    strict: bool = True,
) -> LoadedClassifier:
    """Load a ``*ForSequenceClassification`` checkpoint: encoder and head.

    Raises:
        FileNotFoundError: no such directory.
        CheckpointError: the checkpoint has no classification head (a base model or a
            sentence-embedding model), its family has none in clearformer, or its tensors do not
            match config.json.
    """
    files = path if isinstance(path, CheckpointFiles) else find_checkpoint(path)
    family, config, layout = read_classifier(files, backend)
    tensors = open_tensors(files.weights)  # each tensor read when it is copied
    _check_has_head(layout, tensors, files)
    loaded = build_model(files, family, config, tensors, strict=strict)
    head = SequenceClassifier(layout.config)
    load_head(head, layout, tensors, loaded.report, strict=strict, source=str(files.weights))
    return LoadedClassifier(loaded, head.eval())


def read_classifier(
    files: CheckpointFiles, backend: str
) -> tuple[Family, EncoderConfig, HeadLayout]:
    """The family, :class:`EncoderConfig` and head layout of a ``*ForSequenceClassification``
    checkpoint, from config.json alone (before any weight is read)."""
    family, config = read_family(files, backend)
    return family, config, _layout(family, files)


def _layout(family: Family, files: CheckpointFiles) -> HeadLayout:
    source = files.path / "config.json"
    if family.classifier is None:
        raise CheckpointError(
            f"{source}: model_type={family.model_type!r} has no sequence-classification head "
            "in clearformer"
        )
    try:
        return family.classifier(files.config)
    except (CheckpointError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def _check_has_head(layout: HeadLayout, tensors: Mapping[str, Tensor], files: CheckpointFiles):
    """A checkpoint with none of the head's tensors is not a classifier at all: say so, rather
    than list every head tensor as missing."""
    keys = [key for _, sources in layout.names for key in sources]
    if any(key in tensors for key in keys):
        return
    architectures = files.config.get("architectures")
    raise CheckpointError(
        f"{files.path} has no sequence-classification head: {files.weights.name} lacks "
        f"{keys[-2]!r} (config.json 'architectures'={architectures!r}); a cross-encoder needs "
        "a *ForSequenceClassification checkpoint (load embedding models with TextEncoder)"
    )


def load_head(
    head: nn.Module,
    layout: HeadLayout,
    tensors: Mapping[str, Tensor],
    report: LoadReport,
    *,
    strict: bool,
    source: str,
    kind: str = "classification head",
) -> None:
    """Copy the head's tensors into ``head`` (a :class:`SequenceClassifier` or a
    :class:`~clearformer.heads.MaskedLMHead`) and move them from ``report.unused`` to
    ``report.loaded``. Shapes are all checked before any parameter is written; ``kind`` names
    the head in the errors."""
    params = dict(head.named_parameters())
    if {name for name, _ in layout.names} != set(params):
        raise CheckpointError(
            f"internal head table does not cover the head: "
            f"{sorted(set(params) ^ {name for name, _ in layout.names})}"
        )
    updates: list[tuple[Tensor, Tensor]] = []
    for target, (key,) in layout.names:
        if key not in tensors:
            report.missing.append(key)
            continue
        want = tuple(params[target].shape)
        if tuple(tensors[key].shape) != want:
            sizes = (
                "num_labels or id2label" if isinstance(head, SequenceClassifier) else "vocab_size"
            )
            raise CheckpointError(
                f"weight {key} in {source} has shape {tuple(tensors[key].shape)}, expected "
                f"{want} from config.json (hidden size, and {sizes})"
            )
        updates.append((params[target], tensors[key]))
        report.unused = [name for name in report.unused if name != key]
        report.loaded.append(f"head.{target}")
    if strict and report.missing:
        raise CheckpointError(
            f"{source} lacks tensors of its {kind}: {report.missing[:5]} "
            "(load with strict=False to accept it)"
        )
    with torch.no_grad():
        for param, value in updates:
            param.copy_(value.to(param.dtype))
