"""The kinds of model an index is built with, and the one place that loads them.

A dense model is a :class:`~clearformer.TextEncoder` (no ``kind`` attribute, or
``"dense"``); a sparse, multi-vector or BGE-M3 model carries ``kind`` (``"sparse"``,
``"multivector"``, ``"bge-m3"``), ``encode_query`` / ``encode_document`` and an
``identity``. BGE-M3 is all three at once: :func:`encoder_for` takes the view of the kind an
index needs. BM25 needs no model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .identity import ModelIdentity

MODEL_KINDS = ("dense", "sparse", "multivector", "bge-m3")


def model_kind_of(encoder: Any) -> str:
    """The kind of a loaded model."""
    return getattr(encoder, "kind", "dense")


def encoder_for(kind: str, encoder: Any, asked_by: str = "encoder") -> Any:
    """``encoder`` as the ``kind`` index uses it (a BGE-M3 model's view of that kind);
    ValueError naming both kinds when it cannot serve."""
    if kind == "bm25":
        raise ValueError(f"{asked_by}: a bm25 index uses no model, got a {model_kind_of(encoder)}")
    found = model_kind_of(encoder)
    if found == "bge-m3":
        return getattr(encoder, f"as_{kind}")()
    if found != kind:
        raise ValueError(
            f"{asked_by}: a {kind} index needs a {kind} model, got a {found} model"
            + (f" ({encoder.path})" if hasattr(encoder, "path") else "")
        )
    return encoder


def identity_of(encoder: Any) -> ModelIdentity:
    """Who makes a model's vectors: a dense TextEncoder's identity, or the ``identity`` a
    sparse / multi-vector encoder carries."""
    if model_kind_of(encoder) == "dense" and not hasattr(encoder, "identity"):
        return ModelIdentity.of(encoder)
    return encoder.identity


def checkpoint_kind(path: str | Path) -> str | None:
    """The kind of model a checkpoint directory holds (None where that cannot be told here:
    ``clearformer.retrieval.model_kind`` is not installed)."""
    try:
        from ..retrieval.model_kind import model_kind
    except ImportError:
        return None
    return model_kind(path)


def check_model_kind(kind: str, path: str | Path, flag: str = "model") -> None:
    """ValueError naming both kinds unless the checkpoint at ``path`` can serve a ``kind``
    index (a BGE-M3 checkpoint serves dense, sparse and multivector)."""
    found = checkpoint_kind(path)
    if found is None or found == kind or found == "bge-m3":
        return
    raise ValueError(f"{flag} {path} is a {found} model; a {kind} index needs a {kind} model")


def load_model(kind: str, path: str | Path | None, **options: Any) -> Any:
    """The model for a ``kind`` index from ``path`` (a dense model may be the bundled one,
    ``path`` None). The classes are imported here, on use, so the index package imports
    without the sparse and multi-vector encoders' dependencies."""
    if kind == "dense":
        from ..text import TextEncoder

        return TextEncoder.from_pretrained(path, **options)
    if path is None:
        raise ValueError(f"a {kind} index needs --model: no {kind} model ships with clearformer")
    found = checkpoint_kind(path) or kind
    if found == "bge-m3":
        from ..text.bge_m3 import BGEM3Encoder

        return BGEM3Encoder.from_pretrained(path)
    if found != kind:
        raise ValueError(f"--model {path} is a {found} model; a {kind} index needs a {kind} model")
    if kind == "sparse":
        from ..text.sparse_encoder import SparseEncoder

        return SparseEncoder.from_pretrained(path)
    if kind == "multivector":
        from ..text.multivector_encoder import MultiVectorEncoder

        return MultiVectorEncoder.from_pretrained(path)
    raise ValueError(f"unknown kind {kind!r}; expected one of dense, sparse, multivector, bm25")
