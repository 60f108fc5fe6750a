"""The Hugging Face checkpoint directory format <-> :class:`clearformer.EncoderModel`.

* :mod:`.files` -- find a checkpoint directory and check it is complete (:class:`CheckpointFiles`);
* :mod:`.weights` -- read and write its tensors (safetensors, ``.bin``, sharded);
* :mod:`.safetensors_file` -- a safetensors file's header, then one tensor at a time;
* :mod:`.families` -- one plug-in per ``model_type`` (BERT, RoBERTa, DistilBERT): config
  translation and the name table;
* :mod:`.mapping` -- a state dict into a model and back, strictly (:class:`LoadReport`);
* :mod:`.loading` -- :func:`load_model` / :func:`save_model`, the whole directory;
* :mod:`.tokenizer` -- the checkpoint's tokenizer files as a :class:`TextTokenizer`;
* :mod:`.sentence_transformers` -- the pooling and normalisation its sentence-transformers
  files ask for;
* :mod:`.bundled` -- where the default checkpoint (all-MiniLM-L6-v2) is installed.

The text-embedding application on top of these is :mod:`clearformer.text`.
"""

from .bundled import bundled_model_dir
from .families import FAMILIES, Family, family_for, family_named, register
from .files import CheckpointError, CheckpointFiles, find_checkpoint
from .loading import LoadedModel, load_model, save_model
from .mapping import LoadReport
from .sentence_transformers import (
    PoolingConfig,
    normalize_from_modules,
    pooling_from_config,
    pooling_mode_from_config,
)
from .tokenizer import TextTokenizer, TokenBatch

__all__ = [
    "FAMILIES",
    "CheckpointError",
    "CheckpointFiles",
    "Family",
    "LoadReport",
    "LoadedModel",
    "PoolingConfig",
    "TextTokenizer",
    "TokenBatch",
    "bundled_model_dir",
    "family_for",
    "family_named",
    "find_checkpoint",
    "load_model",
    "normalize_from_modules",
    "pooling_from_config",
    "pooling_mode_from_config",
    "register",
    "save_model",
]
