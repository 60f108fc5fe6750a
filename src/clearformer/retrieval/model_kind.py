"""``model_kind``: dense, sparse, multi-vector or BGE-M3, from a directory's files alone.

The decision lives in :mod:`clearformer.model_kinds`, below every loader (the text
applications ask it before they read a weight, and importing this package from there would
be a cycle); the retrieval wing names it here.
"""

from __future__ import annotations

from ..model_kinds import KIND_CLASSES, MODEL_KINDS, kind_error, model_kind

__all__ = ["KIND_CLASSES", "MODEL_KINDS", "kind_error", "model_kind"]
