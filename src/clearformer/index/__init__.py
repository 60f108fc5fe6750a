"""Search at scale: a persistent vector index of text embeddings, and corpus embedding sharded
over processes.

* :mod:`.vector_index` -- :class:`VectorIndex`: an index directory, opened for search, with
  its model's identity, texts and ids beside the vectors;
* :mod:`.build` -- :func:`build_index`, :func:`add_to_index`: crash-safe writes, resumable,
  and exactly-once adds;
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
* :mod:`.shards` -- ``clearformer encode --output DIR`` under ``torchrun``: one shard per rank
  and a manifest; :mod:`.ray_adapter` and :mod:`.spark_adapter` for Ray Data and Spark.

The engine (usearch) is an optional extra: ``pip install 'clearformer[index]'``. See
``docs/index.md``.
"""

from __future__ import annotations

from .build import add_to_index, build_index
from .identity import ModelIdentity, ModelMismatchError
from .layout import IndexDamagedError
from .options import IndexOptions
from .vector_index import (
    Hit,
    IndexNotFoundError,
    IndexStats,
    VectorIndex,
)

__all__ = [
    "Hit",
    "IndexDamagedError",
    "IndexNotFoundError",
    "IndexOptions",
    "IndexStats",
    "ModelIdentity",
    "ModelMismatchError",
    "VectorIndex",
    "add_to_index",
    "build_index",
]
