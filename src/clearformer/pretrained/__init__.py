"""Pretrained BERT-family encoders: Hugging Face checkpoints on clearformer.

* :class:`TextEncoder` -- texts in, sentence embeddings out (tokenizer, model, pooling);
* :func:`load_model` / :func:`save_model` -- a checkpoint directory <-> ``EncoderModel``;
* :class:`LoadReport` -- what a load did; :class:`CheckpointError` -- why it could not.
"""

from ..heads import POOLING_MODES, pool
from .architectures import ARCHITECTURES, Architecture, architecture_for
from .bundled import bundled_model_dir
from .checkpoint import CheckpointError, CheckpointFiles, find_checkpoint
from .hf_mapping import LoadReport
from .loading import LoadedModel, load_model, save_model
from .text_encoder import TextEncoder
from .tokenizer import TextTokenizer, TokenBatch

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
