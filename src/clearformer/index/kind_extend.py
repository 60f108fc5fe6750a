"""One kind of a folder of kinds brought up to more rows of its texts store: the kind's next
generation, written from its committed one and the rows it lacks, whole but not yet current
(:mod:`.kinds_add` decides when each is committed).

What a kind costs: dense and multivector encode only the rows they lack (the dense segment is
added beside the others and its graph extended; the multi-vector tokens and MUVERA encodings
are appended and its graph extended); sparse encodes only the rows it lacks, then writes its
posting lists anew from all rows (a posting list is one run per term); bm25 indexes every text
again (its scores depend on the whole corpus). The encoding is committed in chunks, keyed by
the kind's committed state and the rows it lacks, so an add killed and run again reuses them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import layout
from .bm25_index import BM25Index, BM25Options, write_bm25_files
from .build import stage_add
from .chunks import ChunkDone, texts_sha256
from .collection import check_dense_holds_store
from .identity import ModelIdentity
from .kind_store import encode_in_chunks, finish, model_precision, write_generation
from .multivector_index import MultiVectorIndex, extend_multivector_files, multivector_encode
from .ragged import Ragged
from .sparse_index import SparseIndex, extend_sparse_files, sparse_encode
from .sparse_seismic import seismic_module
from .vector_index import VectorIndex

_READERS = {"sparse": SparseIndex, "multivector": MultiVectorIndex, "bm25": BM25Index}


@dataclass(frozen=True)
class KindState:
    """A kind's committed sub-index, as an add finds it (opened as a search opens it, so a
    damaged file is refused before any work)."""

    kind: str
    rows: int
    generation: str
    identity: ModelIdentity | None  # None: bm25
    meta: dict[str, Any]
    folder: Path | None  # the committed generation's folder (sparse, multivector, bm25)


@dataclass(frozen=True)
class StagedKind:
    """A kind's next generation, whole on disk; ``commit`` makes it current."""

    kind: str
    before: int  # rows it held
    after: int  # rows it holds once committed
    commit: Callable[[], None]


def read_state(root: Path, kind: str, store_rows: int) -> KindState:
    """The committed ``kind`` of ``root``. A sparse, multi-vector or BM25 kind must hold the
    texts store's first rows (its reader checks its hash against the store's states); the
    dense kind, which keeps its own texts, no more rows than the store."""
    if kind == "dense":
        index = VectorIndex.open(root / "dense")
        if index.rows > store_rows:
            meta = layout.generation_dir(root / "dense", index.generation) / layout.META
            raise layout.IndexDamagedError(
                meta, f"records {index.rows:,} rows, but {root / 'texts'} holds {store_rows:,}"
            )
        check_dense_holds_store(root, index)
        return KindState(kind, index.rows, index.generation, index.identity, index.meta, None)
    index = _READERS[kind](root)
    return KindState(kind, index.rows, index.generation, index.identity, index.meta, index.folder)


def check_add_precision(root: Path, state: KindState, model: Any) -> str:
    """The precision ``state``'s kind holds its embeddings in; ValueError naming both where
    ``model`` computes in another (one index, one precision: its vectors compare alike)."""
    if state.kind == "bm25":
        return "float32"
    if state.kind == "dense":
        from .recipe import computed_precision, index_precision

        held, precision = index_precision(state.meta), computed_precision(model, None)
    else:
        held, precision = state.meta.get("precision", "float32"), model_precision(model)
    if precision != held:
        raise ValueError(
            f"precision must be {held!r} for an add to the {state.kind} index of {root}: it "
            f"holds embeddings computed in {held} (build it again to change that), got "
            f"{precision!r}"
        )
    return held


def check_engine(state: KindState) -> None:
    """An engine the kind's next generation needs fails now, not after the encoding."""
    if state.kind == "sparse" and state.meta["options"]["engine"] == "seismic":
        seismic_module()


def stage_kind(
    root: Path,
    state: KindState,
    model: Any,
    ids: list[str],
    texts: list[str],
    content: str,
    *,
    on_chunk: ChunkDone | None = None,
    progress: Any = None,
    batch_size: int | None = None,
    dense_options: dict[str, Any] | None = None,
) -> StagedKind:
    """Write ``state.kind``'s next generation holding ``texts`` (of hash ``content``): its own
    rows, then ``texts[state.rows:]`` encoded by ``model`` (the kind's view of it, checked to
    be the kind's own model by the caller). Not current until its ``commit``; the caller holds
    the kind's writer lock."""
    first, rows = state.rows, len(texts)
    if state.kind == "dense":
        options = dict(dense_options or {})
        if progress is not None:
            options["progress"] = progress
        if batch_size is not None:
            options["batch_size"] = batch_size
        # The store's hash in the write's record ties the dense rows to the store's.
        options["source"] = {**(options.get("source") or {}), "texts_store": content}
        staged = stage_add(
            root / "dense", texts[first:], model, ids=ids[first:], on_chunk=on_chunk, **options
        )
        if staged is None:
            raise ValueError(
                f"the dense index of {root} holds {first:,} rows but already holds the texts "
                f"of rows {first:,} to {rows - 1:,}: it is not the folder's; build it again"
            )
        return StagedKind("dense", first, rows, staged.commit)
    sub = root / state.kind
    options = state.meta["options"]
    job = {
        "kind": state.kind,
        "add_to": state.meta["texts"],  # the committed state the rows are added to
        "first": first,
        "texts": texts_sha256(texts[first:]),
        "ids": texts_sha256(ids[first:]),
        "rows": rows - first,
        "model": None if state.identity is None else state.identity.revision,
        "chunk_rows": options.get("chunk_rows", rows - first),
    }
    held = check_add_precision(root, state, model)
    if held != "float32":
        job["precision"] = held
    job_key = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]
    added = None
    if state.kind != "bm25":
        width = state.identity.width
        encode = (sparse_encode if state.kind == "sparse" else multivector_encode)(
            model, width, batch_size
        )
        added = encode_in_chunks(
            sub / "staging" / job_key, job, texts[first:], encode, job["chunk_rows"], on_chunk,
            progress,
        )  # fmt: skip
    meta = {
        "kind": state.kind,
        "model": state.meta["model"],
        "options": options,
        "rows": rows,
        "texts": content,
        **({} if held == "float32" else {"precision": held}),
    }
    name = write_generation(sub, meta, _files(state, texts, added), state.generation)
    return StagedKind(state.kind, first, rows, lambda: finish(sub, name, job_key))


def _files(state: KindState, texts: list[str], added: Ragged | None) -> Callable[[Path], None]:
    """What writes the kind's next generation's files into a folder: its committed files and
    the ``added`` rows (bm25: every text indexed again)."""
    previous, meta = state.folder, state.meta
    if state.kind == "bm25":
        options = BM25Options(**meta["options"])
        return lambda folder: write_bm25_files(folder, texts, options)
    if state.kind == "sparse":
        return lambda folder: extend_sparse_files(folder, previous, meta, added)
    width = state.identity.width
    return lambda folder: extend_multivector_files(folder, previous, meta, added, width)
