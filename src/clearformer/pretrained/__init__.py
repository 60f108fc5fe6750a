"""Pretrained BERT-family encoders: Hugging Face checkpoints on clearformer.

* :class:`TextEncoder` -- texts in, sentence embeddings out (tokenizer, model, pooling);
* :func:`load_model` / :func:`save_model` -- a checkpoint directory <-> ``EncoderModel``;
* :class:`LoadReport` -- what a load did; :class:`CheckpointError` -- why it could not.
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
from .text_encoder import TextEncoder

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
