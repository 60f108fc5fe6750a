"""What a trained model's directory records beside its weights (the length its texts were cut
to, its prompts), so that every library that loads it treats texts as the training did."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ...io import atomic_write

log = logging.getLogger(__name__)


def update_json(path: Path, changes: dict[str, Any]) -> None:
    """``path``'s JSON object with ``changes`` set (a new object where there is no file),
    written atomically: a kill leaves the old file or the new one, never half of one."""
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config.update(changes)
    with atomic_write(path) as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def record_max_length(out: Path, max_length: int) -> None:
    """The texts were cut to ``max_length`` tokens in training: ``tokenizer_config.json``'s
    ``model_max_length`` says so (sentence-transformers 6 reads its length there), and
    ``sentence_bert_config.json``'s ``max_seq_length`` where the file sets one (it wins in the
    libraries that read it)."""
    update_json(out / "tokenizer_config.json", {"model_max_length": max_length})
    sentence_config = out / "sentence_bert_config.json"
    if sentence_config.is_file():
        settings = json.loads(sentence_config.read_text(encoding="utf-8"))
        if isinstance(settings, dict) and "max_seq_length" in settings:
            update_json(sentence_config, {"max_seq_length": max_length})


def training_length(asked: int, positions: int) -> int:
    """The tokens kept per text in a fine-tuning run: ``max_length`` as asked, up to what the
    model's position table covers. Not capped by the length the checkpoint's files record
    (``model_max_length``, ``max_seq_length``): that is the length the model was last used or
    trained at, which a run may change (sentence-transformers' ``max_seq_length`` too may be
    set above it), and a run cut silently to it would train on other texts than asked."""
    if asked > positions:
        log.info("max_length %d is above the model's %d positions: texts cut to %d", asked,
                 positions, positions)  # fmt: skip
    return min(asked, positions)
