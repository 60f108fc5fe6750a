"""Search at scale: a persistent vector index of text embeddings, and corpus embedding sharded
over processes.

* :mod:`.vector_index` -- :class:`VectorIndex`: an index directory, opened for search, with
  its model's identity, texts and ids beside the vectors;
* :mod:`.build` -- the dense index's :func:`build_index` and :func:`add_to_index`: crash-safe
  writes, resumable, and exactly-once adds (``build_index`` here also takes ``kind=``, and
  ``add_to_index`` a folder of kinds);
* :mod:`.options` -- :class:`IndexOptions`: storage (float32, int8, binary), Matryoshka
  dimensions, graph or exact search;
* :mod:`.engine` -- the embedded vector library (usearch's HNSW) behind a few functions;
* :mod:`.quantize` -- truncation and sentence-transformers' int8 / binary quantization;
* :mod:`.identity` -- :class:`ModelIdentity`: who made the vectors, and the refusal of
  another model;
* :mod:`.layout`, :mod:`.texts`, :mod:`.chunks` -- the directory on disk, the texts in SQLite,
  embeddings committed chunk by chunk (what a killed run resumes from);
* :mod:`.integrity` -- the checks every file of an index passes when it is opened
  (:class:`IndexDamagedError` naming the file);
* :mod:`.hybrid` -- several kinds over one corpus (:mod:`.collection`: one texts store, a
  sub-index per kind): ``build_index(..., kind=)`` and :class:`HybridIndex`, searched per kind
  or fused (:mod:`.fusion`); :func:`add_to_kinds` (:mod:`.kinds_add`) appends texts to the
  store and every kind (:mod:`.kind_extend`), crash-safe and exactly once; the kinds:
  :mod:`.sparse_index` (an exact inverted index), :mod:`.bm25_index` (bm25s),
  :mod:`.multivector_index` (:mod:`.muvera` candidates in usearch, exact MaxSim); models
  loaded by :func:`clearformer.commands.kind_models.load_model`.

Sharded encoding (``torchrun``, Ray, Spark), which uses the chunk store, has a package of its
own: :mod:`clearformer.sharded`.

The engine (usearch) is an optional extra: ``pip install 'clearformer[index]'``. See
``docs/index.md``.
"""

from __future__ import annotations

from .bm25_index import BM25Index, BM25Options
from .collection import KindNotFoundError, KindsDisagreeError
from .fusion import Fusion
from .hybrid import HybridIndex, build_index, open_kind_index
from .identity import ModelIdentity, ModelMismatchError
from .kinds_add import KindsAdded, add_to_index, add_to_kinds
from .layout import IndexDamagedError
from .multivector_index import MultiVectorIndex, MultiVectorOptions
from .muvera import Muvera, MuveraConfig
from .options import IndexOptions
from .sparse_index import SparseIndex, SparseOptions
from .vector_index import (
    Hit,
    IndexNotFoundError,
    IndexStats,
    VectorIndex,
)

__all__ = [
    "BM25Index",
    "BM25Options",
    "Fusion",
    "Hit",
    "HybridIndex",
    "KindNotFoundError",
    "KindsAdded",
    "KindsDisagreeError",
    "MultiVectorIndex",
    "MultiVectorOptions",
    "Muvera",
    "MuveraConfig",
    "SparseIndex",
    "SparseOptions",
    "IndexDamagedError",
    "IndexNotFoundError",
    "IndexOptions",
    "IndexStats",
    "ModelIdentity",
    "ModelMismatchError",
    "VectorIndex",
    "add_to_index",
    "add_to_kinds",
    "build_index",
    "open_kind_index",
]
