"""A Hugging Face checkpoint directory: find it, check it is complete, read its small files.

What a directory must hold:

* ``config.json`` -- the architecture and its numerics;
* weights: ``model.safetensors`` (preferred), a sharded ``model.safetensors.index.json``,
  ``pytorch_model.bin`` or a sharded ``pytorch_model.bin.index.json`` (``.bin`` files are read
  with ``torch.load(weights_only=True)``, never unpickled freely);
* a tokenizer: ``tokenizer.json``; else a byte-level BPE ``vocab.json`` with its ``merges.txt``
  (RoBERTa); else a WordPiece ``vocab.txt`` (BERT);
* optionally the sentence-transformers files: ``modules.json``, ``sentence_bert_config.json``
  and the pooling folder's ``config.json``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bundled import bundled_model_dir

# Files besides the weights and config.json that make a directory a complete checkpoint.
CHECKPOINT_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
BPE_FILES = ("vocab.json", "merges.txt")  # a byte-level BPE tokenizer: both or neither
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (incomplete, unsupported or corrupt), or a model
    that a checkpoint family cannot express."""


@dataclass(frozen=True)
class CheckpointFiles:
    """The files of one checkpoint directory, checked to exist."""

    path: Path
    config: dict[str, Any]  # config.json, parsed
    weights: Path  # one of WEIGHT_FILES
    tokenizer: Path  # tokenizer.json, vocab.json (BPE, with ``merges``) or vocab.txt
    tokenizer_config: dict[str, Any] = field(default_factory=dict)  # tokenizer_config.json
    modules: list[dict[str, Any]] | None = None  # sentence-transformers modules.json
    sentence_config: dict[str, Any] = field(default_factory=dict)  # sentence_bert_config.json
    pooling_config: dict[str, Any] | None = None  # <pooling module path>/config.json
    pooling_path: Path | None = None  # that file (1_Pooling/config.json, usually)
    merges: Path | None = None  # merges.txt, set exactly when ``tokenizer`` is vocab.json


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{what} {path} is not valid JSON: {exc}") from None


def resolve_path(path: str | os.PathLike | None) -> Path:
    """The checkpoint directory for ``path``: None = the bundled model; a Hub id ("org/name")
    is fetched through ``huggingface_hub`` only when it is installed and no such local path
    exists."""
    if path is None:
        return bundled_model_dir()
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str, os.PathLike or None, got {type(path).__name__}")
    local = Path(path).expanduser()
    if local.exists():
        return local.resolve()
    if isinstance(path, str) and _HUB_ID.match(path):
        return _from_hub(path)
    raise FileNotFoundError(f"checkpoint directory not found: {local}")


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(
            f"checkpoint directory not found: {repo_id} (to fetch it from the Hugging Face Hub "
            "install huggingface_hub; or pass a local directory)"
        ) from None
    patterns = [
        "*.json",
        "*.safetensors",
        "vocab.txt",
        "merges.txt",
        "1_Pooling/*",
        "pytorch_model.bin",
        "pytorch_model-*-of-*.bin",
        "*/pytorch_model.bin",  # an older sentence-transformers Dense module's weights
        "sparse_linear.pt",  # bge-m3's heads
        "colbert_linear.pt",
    ]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:  # the hub library raises many kinds; one clear message for all
        raise FileNotFoundError(
            f"checkpoint directory not found: {repo_id}, and the Hugging Face Hub could not "
            f"provide it ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


def find_checkpoint(path: str | os.PathLike | None) -> CheckpointFiles:
    """Locate and check a checkpoint directory, before any weight is read.

    Raises:
        FileNotFoundError: no such directory.
        CheckpointError: the directory lacks a required file, or a JSON file is malformed.
    """
    root = resolve_path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint path must be a directory, got a file: {root}")
    missing = []
    if not (root / "config.json").is_file():
        missing.append("config.json")
    weights = next((root / n for n in WEIGHT_FILES if (root / n).is_file()), None)
    if weights is None:
        missing.append(" or ".join(WEIGHT_FILES))
    tokenizer, merges = _tokenizer_files(root)
    if tokenizer is None:
        missing.append(" or ".join(TOKENIZER_FILES) + " (or vocab.json with merges.txt)")
    if missing:
        raise CheckpointError(f"checkpoint {root} is incomplete: missing {'; '.join(missing)}")
    config = read_json(root / "config.json", "config")
    if not isinstance(config, dict):
        raise CheckpointError(f"config {root / 'config.json'} must hold a JSON object")
    tokenizer_config = {}
    if (root / "tokenizer_config.json").is_file():
        tokenizer_config = read_json(root / "tokenizer_config.json", "tokenizer config")
    modules, pooling_config, pooling_path = _sentence_modules(root)
    sentence_config = {}
    if (root / "sentence_bert_config.json").is_file():
        sentence_config = read_json(root / "sentence_bert_config.json", "sentence-transformers")
    return CheckpointFiles(
        path=root,
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        tokenizer_config=tokenizer_config if isinstance(tokenizer_config, dict) else {},
        modules=modules,
        sentence_config=sentence_config if isinstance(sentence_config, dict) else {},
        pooling_config=pooling_config,
        pooling_path=pooling_path,
        merges=merges,
    )


def _tokenizer_files(root: Path) -> tuple[Path | None, Path | None]:
    """The tokenizer file and, for byte-level BPE, its merges file.

    ``tokenizer.json`` describes the whole pipeline, so it wins. Without it, a ``vocab.json``
    or ``merges.txt`` means a BPE tokenizer, which needs both: one without the other is an
    error rather than a fall back to ``vocab.txt``, which would tokenize differently.
    """
    if (root / "tokenizer.json").is_file():
        return root / "tokenizer.json", None
    present = [name for name in BPE_FILES if (root / name).is_file()]
    if len(present) == len(BPE_FILES):
        return root / "vocab.json", root / "merges.txt"
    if present:
        absent = next(name for name in BPE_FILES if name not in present)
        raise CheckpointError(
            f"checkpoint {root} is incomplete: a byte-level BPE tokenizer needs both "
            f"{' and '.join(BPE_FILES)}, found {present[0]} but {absent} is missing"
        )
    if (root / "vocab.txt").is_file():
        return root / "vocab.txt", None
    return None, None


def _sentence_modules(root: Path) -> tuple[list[dict] | None, dict | None, Path | None]:
    """sentence-transformers' ``modules.json``, its pooling module's config and that config's
    path, if any."""
    if not (root / "modules.json").is_file():
        return None, None, None
    modules = read_json(root / "modules.json", "sentence-transformers modules")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{root / 'modules.json'} must hold a JSON list of objects")
    pooling = pooling_path = None
    for module in modules:
        if str(module.get("type", "")).endswith(".Pooling"):
            file = root / str(module.get("path", "")) / "config.json"
            if not file.is_file():
                raise CheckpointError(
                    f"checkpoint {root} is incomplete: modules.json lists a pooling module "
                    f"but {file} is missing"
                )
            pooling, pooling_path = read_json(file, "pooling config"), file
    return modules, pooling, pooling_path
