"""``model_kind``: what a model directory makes of a text, read from its files alone
(:mod:`clearformer.retrieval.model_kind` names it in the retrieval wing).

Four kinds are served by four classes, and a directory loaded by the wrong one would give
numbers that mean nothing (a SPLADE model's token states mean-pooled into a "dense" vector,
say), so every loader asks first:

* ``"dense"`` -- one vector per text (:class:`~clearformer.TextEncoder`);
* ``"sparse"`` -- one weight per vocabulary entry, SPLADE (:class:`~clearformer.SparseEncoder`);
* ``"multivector"`` -- one vector per token, ColBERT (``MultiVectorEncoder``);
* ``"bge-m3"`` -- BGE-M3's three heads at once (``BGEM3Encoder``).

The evidence, strongest first: BGE-M3's head files (``sparse_linear.pt``,
``colbert_linear.pt`` or their safetensors), which sentence-transformers does not write;
``config_sentence_transformers.json``'s ``model_type`` (``"SparseEncoder"``,
``"MultiVectorEncoder"``, PyLate's ``"ColBERT"``), as sentence-transformers itself decides
which class loads a directory; then the module types in ``modules.json`` (and in a Router's
``router_config.json``), for directories written before ``model_type`` existed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MODEL_KINDS = ("dense", "sparse", "multivector", "bge-m3")
# The class that loads each kind: named in the errors of the others.
KIND_CLASSES = {
    "dense": "TextEncoder",
    "sparse": "SparseEncoder",
    "multivector": "MultiVectorEncoder",
    "bge-m3": "BGEM3Encoder",
}
_BGE_M3_FILES = (
    "sparse_linear.pt",
    "colbert_linear.pt",
    "sparse_linear.safetensors",
    "colbert_linear.safetensors",
)
# config_sentence_transformers.json model_type -> kind (absent: a SentenceTransformer).
_MODEL_TYPES = {
    "SentenceTransformer": "dense",
    "SparseEncoder": "sparse",
    "MultiVectorEncoder": "multivector",
    "ColBERT": "multivector",  # PyLate v3
}
# The last part of a module's type name -> the kind it implies.
_MODULE_KINDS = {
    "SpladePooling": "sparse",
    "MLMTransformer": "sparse",
    "SparseStaticEmbedding": "sparse",
    "SparseAutoEncoder": "sparse",
    "MultiVectorMask": "multivector",
    "TokenPooling": "multivector",
}


def model_kind(path: str | os.PathLike) -> str:
    """The kind of the model directory at ``path``: one of :data:`MODEL_KINDS`.

    Raises:
        FileNotFoundError: no such directory.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"model directory not found: {root}")
    if any((root / name).is_file() for name in _BGE_M3_FILES):
        return "bge-m3"
    declared = _read(root / "config_sentence_transformers.json").get("model_type")
    if declared in _MODEL_TYPES and declared != "SentenceTransformer":
        return _MODEL_TYPES[declared]
    modules = _read(root / "modules.json", default=[])
    if any(
        isinstance(m, dict) and str(m.get("type", "")).startswith("pylate.")
        for m in (modules if isinstance(modules, list) else [])
    ):
        return "multivector"  # PyLate before model_type: its own module classes
    for name in _module_types(root):
        if name in _MODULE_KINDS:
            return _MODULE_KINDS[name]
    if "HF_ColBERT" in (_read(root / "config.json").get("architectures") or []):
        return "multivector"  # Stanford ColBERT (which MultiVectorEncoder refuses by name)
    return "dense"


def kind_error(path: str | os.PathLike, kind: str, loader: str) -> str:
    """The one-line refusal of ``loader`` (a class name) for a directory of another ``kind``."""
    return (
        f"{path} is a {kind} model, which {loader} does not load; "
        f"use clearformer.{KIND_CLASSES[kind]}.from_pretrained"
    )


def _module_types(root: Path) -> list[str]:
    """The last part of every module type in ``modules.json``, a Router's routes included."""
    modules = _read(root / "modules.json", default=[])
    names = []
    for module in modules if isinstance(modules, list) else []:
        if not isinstance(module, dict):
            continue
        name = str(module.get("type", "")).rsplit(".", 1)[-1]
        names.append(name)
        if name in ("Router", "Asym"):
            sub = root / str(module.get("path", ""))
            router = _read(sub / "router_config.json") or _read(sub / "config.json")
            types = router.get("types", {}) if isinstance(router, dict) else {}
            names += [str(t).rsplit(".", 1)[-1] for t in types.values()]
    return names


def _read(path: Path, default=None):
    """A small JSON file's content, or ``default`` ({}) when it is absent or unreadable: the
    kind is a hint for choosing a loader, which reports a malformed file itself."""
    default = {} if default is None else default
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return default
    return value if isinstance(value, type(default)) else default
