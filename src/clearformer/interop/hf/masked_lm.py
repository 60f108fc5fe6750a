"""A checkpoint's masked-language-model head (``*ForMaskedLM``) as a
:class:`~clearformer.heads.MaskedLMHead` on top of its encoder.

The family says where the head's tensors are (:attr:`Family.masked_lm`). The encoder loads as
usual; the head then takes its tensors, and the report lists them as loaded. The decoder is
tied to the encoder's word embeddings, so :meth:`LoadedMaskedLM.logits` passes that table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from torch import Tensor

from ...heads import MaskedLMHead
from .files import CheckpointError, CheckpointFiles, find_checkpoint
from .heads import load_head
from .loading import LoadedModel, build_model, read_family
from .weights import read_tensors


@dataclass
class LoadedMaskedLM:
    """An encoder and its masked-LM head, loaded from one checkpoint."""

    loaded: LoadedModel
    head: MaskedLMHead  # eval mode

    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs) -> Tensor:
        """(B, T) ids -> (B, T, V) vocabulary logits (zeros' logits at padded positions)."""
        model = self.loaded.model
        hidden = model(input_ids, attention_mask, **kwargs)  # (B, T, D)
        return self.head(hidden, model.embeddings.word.weight)  # (B, T, V)


def load_masked_lm(
    path: str | os.PathLike | None | CheckpointFiles,
    *,
    backend: str = "auto",
    strict: bool = True,
) -> LoadedMaskedLM:
    """Load a ``*ForMaskedLM`` checkpoint: encoder and head.

    Raises:
        FileNotFoundError: no such directory.
        CheckpointError: the family has no masked-LM head in clearformer, the checkpoint has
            none, or its tensors do not match config.json.
    """
    files = path if isinstance(path, CheckpointFiles) else find_checkpoint(path)
    family, config = read_family(files, backend)
    source = files.path / "config.json"
    if family.masked_lm is None:
        raise CheckpointError(
            f"{source}: model_type={family.model_type!r} has no masked-LM head in clearformer"
        )
    try:
        layout = family.masked_lm(files.config)
    except (CheckpointError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    tensors = read_tensors(files.weights)
    keys = [key for _, sources in layout.names for key in sources]
    if not any(key in tensors for key in keys):
        raise CheckpointError(
            f"{files.path} has no masked-LM head: {files.weights.name} lacks {keys[0]!r} "
            f"(config.json 'architectures'={files.config.get('architectures')!r})"
        )
    loaded = build_model(files, family, config, tensors, strict=strict)
    head = MaskedLMHead(layout.config)
    load_head(head, layout, tensors, loaded.report, strict=strict, source=str(files.weights))
    return LoadedMaskedLM(loaded, head.eval())
