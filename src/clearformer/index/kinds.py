"""The kinds of model an index is built with, and the one place that loads them.

A dense model is a :class:`~clearformer.TextEncoder` (no ``kind`` attribute, or
``"dense"``); a sparse, multi-vector or BGE-M3 model carries ``kind`` (``"sparse"``,
``"multivector"``, ``"bge-m3"``), ``encode_query`` / ``encode_document`` and an
``identity``. BGE-M3 is all three at once: :func:`encoder_for` takes the view of the kind an
index needs. BM25 needs no model.
"""

from __future__ import annotations

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
