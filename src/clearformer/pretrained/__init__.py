"""The names ``clearformer.pretrained`` has always offered, re-exported from where they live.

* :class:`TextEncoder` -- :mod:`clearformer.text` (texts in, sentence embeddings out);
* :func:`load_model`, :func:`save_model`, :class:`LoadReport`, :class:`CheckpointError`, the
  tokenizer and the checkpoint families -- :mod:`clearformer.interop.hf`;
* :func:`pool`, ``POOLING_MODES`` -- :mod:`clearformer.heads`.

New code imports from those modules; this package holds no code of its own.
"""

from ..heads import POOLING_MODES, pool
from ..interop.hf import (
    FAMILIES,
    CheckpointError,
    CheckpointFiles,
    Family,
    LoadedModel,
    LoadReport,
    TextTokenizer,
    TokenBatch,
    bundled_model_dir,
    family_for,
    find_checkpoint,
    load_model,
    save_model,
)
from ..text import TextEncoder

# The names these had before checkpoint families became plug-ins.
ARCHITECTURES = FAMILIES
Architecture = Family
architecture_for = family_for

__all__ = [
    "ARCHITECTURES",
    "POOLING_MODES",
    "Architecture",
    "CheckpointError",
    "CheckpointFiles",
    "LoadReport",
    "LoadedModel",
    "TextEncoder",
    "TextTokenizer",
    "TokenBatch",
    "architecture_for",
    "bundled_model_dir",
    "find_checkpoint",
    "load_model",
    "pool",
    "save_model",
]
