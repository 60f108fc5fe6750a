"""Several kinds of index over one corpus, built one kind at a time and searched one kind at a
time or fused (``mode="hybrid"``).

* :func:`build_index` -- a dense index as before, or with ``kind``,
  :func:`build_kind_index`: a dense, sparse, multi-vector or
  BM25 sub-index in a collection folder (:mod:`.collection`), the model checked to be of that
  kind, the texts checked against the folder's texts store, all before any encoding;
* :class:`HybridIndex` -- the folder opened with its models; :meth:`HybridIndex.search` with
  ``mode`` a kind, or ``"hybrid"`` with a :class:`~.fusion.Fusion` (RRF or weighted).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import layout
from .bm25_index import BM25Index, BM25Options, build_bm25
from .build import build_index as build_dense_index
from .collection import (
    KINDS,
    KindNotFoundError,
    KindsDisagreeError,
    check_dense_holds_store,
    ensure_texts,
    is_collection,
    kinds_present,
    open_texts,
    require_kind,
)
from .fusion import Fusion
from .inputs import check_ids, check_texts
from .kinds import encoder_for, model_kind_of
from .multivector_index import MultiVectorIndex, MultiVectorOptions, build_multivector
from .options import IndexOptions
from .sparse_index import SparseIndex, SparseOptions, build_sparse
from .vector_index import Hit, VectorIndex, hits_wanted

log = logging.getLogger(__name__)

MODES = (*KINDS, "hybrid")


def build_index(
    path: str | os.PathLike, texts: Sequence[str], encoder: Any = None, *, kind: str | None = None,
    **keywords: Any,
):  # fmt: skip
    """Build the index at ``path`` from ``texts`` with ``encoder``.

    Without ``kind``: a dense index at ``path`` (:func:`.build.build_index`, whose keywords it
    takes). With ``kind`` (dense, sparse, multivector or bm25): that kind's sub-index of the
    folder of kinds at ``path`` (:func:`build_kind_index`).
    """
    if kind is None:
        if encoder is None:
            raise TypeError("build_index needs an encoder (the model that embeds the texts)")
        return build_dense_index(path, texts, encoder, **keywords)
    return build_kind_index(path, texts, encoder, kind=kind, **keywords)


def build_kind_index(
    path: str | os.PathLike,
    texts: Sequence[str],
    encoder: Any = None,
    *,
    kind: str,
    ids: Sequence[str] | None = None,
    options: Any = None,
    on_chunk=None,
    progress: Any = None,
    batch_size: int | None = None,
    **dense_options: Any,
):
    """Build the ``kind`` sub-index of the collection folder ``path`` from ``texts``.

    Args:
        kind: dense | sparse | multivector | bm25.
        encoder: the model (a BGE-M3 model serves dense, sparse and multivector; bm25 takes
            none).
        options: :class:`~.options.IndexOptions` (dense), :class:`~.sparse_index.SparseOptions`,
            :class:`~.multivector_index.MultiVectorOptions` or :class:`~.bm25_index.BM25Options`.
        ids: one string id per text (default: row numbers); the same texts and ids as the
            folder's other kinds, or ValueError before any work.
        dense_options: the dense build's own keywords (``source``, ``graph_progress``,
            ``encode`` keywords).

    Returns the opened sub-index. Killed, it resumes as the dense build does.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    root = Path(path)
    texts = check_texts(texts)
    ids = [str(i) for i in range(len(texts))] if ids is None else check_ids(ids, texts)
    wanted = {
        "dense": IndexOptions,
        "sparse": SparseOptions,
        "multivector": MultiVectorOptions,
        "bm25": BM25Options,
    }[kind]
    options = wanted() if options is None else options
    if not isinstance(options, wanted):
        raise TypeError(
            f"options of a {kind} index must be {wanted.__name__}, got {type(options).__name__}"
        )
    if kind == "bm25":
        if encoder is not None:
            raise ValueError(f"a bm25 index uses no model, got a {model_kind_of(encoder)} model")
        return build_bm25(root, texts, ids, options)
    if encoder is None:
        raise ValueError(f"a {kind} index needs a model: give encoder")
    view = encoder_for(kind, encoder, "encoder")  # a model of another kind is refused here
    if kind == "dense":
        content = ensure_texts(root, texts, ids)
        # The store's hash in the write's record ties the dense rows to the store's.
        dense_options["source"] = {**(dense_options.get("source") or {}), "texts_store": content}
        if progress is not None:
            dense_options["progress"] = progress
        if batch_size is not None:
            dense_options["batch_size"] = batch_size
        return build_dense_index(
            root / "dense",
            texts,
            view,
            ids=ids,
            options=options,
            on_chunk=on_chunk,
            **dense_options,
        )
    if dense_options:
        raise TypeError(f"a {kind} build takes no {', '.join(sorted(dense_options))}")
    build = build_sparse if kind == "sparse" else build_multivector
    return build(
        root, texts, ids, view, options, on_chunk=on_chunk, progress=progress, batch_size=batch_size
    )


def open_kind_index(path: str | os.PathLike, kind: str, encoder: Any = None):
    """The ``kind`` sub-index of ``path`` (a plain dense index counts as ``dense``), with
    ``encoder`` checked to be its model; KindNotFoundError naming the kinds present."""
    root = Path(path)
    require_kind(root, kind, "mode")
    if kind == "dense":
        collection = is_collection(root)
        index = VectorIndex.open(
            root / "dense" if collection else root,
            None if encoder is None else encoder_for("dense", encoder),
        )
        if collection:
            check_dense_holds_store(root, index)
        return index
    reader = {"sparse": SparseIndex, "multivector": MultiVectorIndex, "bm25": BM25Index}[kind]
    return reader.open(root, encoder)


# How long an open waits for an add's commits to reach every kind.
COMMITS_WAIT_SECONDS = 3.0


class HybridIndex:
    """An index folder's kinds, opened for search by text.

    Open with :meth:`open`; ``models`` are assigned to the kinds by their own ``kind`` (a
    BGE-M3 model serves dense, sparse and multivector). A kind without a model (other than
    bm25) is opened but cannot be searched by text.
    """

    def __init__(self, root: Path, indexes: Mapping[str, Any]) -> None:
        self.root = root
        self.indexes = dict(indexes)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        models: Sequence[Any] | Mapping[str, Any] = (),
        *,
        kinds: Sequence[str] | None = None,
    ) -> HybridIndex:
        root = Path(path)
        present = kinds_present(root)
        if not present:
            raise FileNotFoundError(
                f"no index at {root}: build one with `clearformer index build --kind KIND`"
            )
        _check_kinds_given(kinds)
        for kind in kinds or ():
            require_kind(root, kind, "kinds")
        by_kind = dict(models) if isinstance(models, Mapping) else _assign(models, present)
        # An add commits the kinds one after another: opened between two commits, they hold
        # different rows for a moment. Open them again until they agree; kinds that still
        # disagree after the wait are what an add stopped part-way leaves.
        deadline = time.monotonic() + COMMITS_WAIT_SECONDS
        while True:
            indexes = {
                kind: open_kind_index(root, kind, by_kind.get(kind)) for kind in (kinds or present)
            }
            if len({index.rows for index in indexes.values()}) <= 1:
                return cls(root, indexes)
            if time.monotonic() >= deadline:
                _check_same_rows(root, indexes)
            time.sleep(0.05)

    @property
    def kinds(self) -> list[str]:
        return list(self.indexes)

    @property
    def rows(self) -> int:
        """The texts every kind holds (one count: ``open`` checks they agree)."""
        return next(iter(self.indexes.values())).rows

    def search(
        self,
        queries: str | Sequence[str],
        k: int = 10,
        *,
        mode: str = "hybrid",
        kinds: Sequence[str] | None = None,
        fusion: Fusion | None = None,
        depth: int = 100,
        settings: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[Hit] | list[list[Hit]]:
        """The ``k`` best texts per query, best first.

        Args:
            k: a positive integer, in every mode (ValueError before any kind searches).
            mode: a kind (its own scores), or ``hybrid``: each of ``kinds`` (default: every
                kind opened) retrieves ``max(depth, k)`` texts and ``fusion`` (default RRF,
                k = 60) merges them; a hit's score is then the fused score.
            settings: per kind, that kind's search settings for this call, e.g.
                ``{"multivector": {"candidates": 500}}`` (dense: ``expansion_search``,
                ``rescore_multiplier``; sparse: ``candidates``, ``exact``).
        """
        settings = dict(settings or {})
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        k = hits_wanted(k, self.rows)  # as each kind checks it, before any kind searches
        if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        depth = min(depth, max(self.rows, 1))
        if mode != "hybrid" and (kinds is not None or fusion is not None):
            given = "kinds" if kinds is not None else "fusion"
            raise ValueError(
                f"{given} applies to mode='hybrid', not this search: mode={mode!r} searches "
                "one kind"
            )
        single = isinstance(queries, str)
        batch = [queries] if single else list(queries)
        if mode != "hybrid":
            hits = self._kind(mode).search(batch, k, **settings.get(mode, {}))
            return hits[0] if single else hits
        fusion = Fusion() if fusion is None else fusion
        _check_kinds_given(kinds)
        kinds = list(kinds or self.kinds)
        for kind in kinds:
            self._kind(kind, "kinds")
        unknown = sorted(set(fusion.weights) - set(kinds))
        if unknown:
            raise ValueError(
                f"weights name {', '.join(unknown)}, which the hybrid search does not fuse "
                f"(it fuses {', '.join(kinds)})"
            )
        per_kind = {
            kind: self._kind(kind).search(batch, max(depth, k), **settings.get(kind, {}))
            for kind in kinds
        }
        fused = []
        for i in range(len(batch)):
            rankings = {
                kind: [(h.row, h.score) for h in found[i]] for kind, found in per_kind.items()
            }
            texts = {h.row: h for found in per_kind.values() for h in found[i]}
            fused.append(
                [
                    Hit(score, texts[row].id, texts[row].text, row)
                    for row, score in fusion.fuse(rankings, k)
                ]
            )
        return fused[0] if single else fused

    def _kind(self, kind: str, asked_by: str = "mode"):
        if kind not in self.indexes:
            holds = ", ".join(self.indexes)
            raise KindNotFoundError(
                f"{asked_by}: index {self.root} holds no {kind} index (it holds {holds})"
            )
        return self.indexes[kind]


def _check_same_rows(root: Path, indexes: Mapping[str, Any]) -> None:
    """KindsDisagreeError (one line, each kind's rows) unless the kinds hold the same rows:
    fused, a text one kind lacks would only rank lower, so results would be silently wrong.
    Only an add stopped between two kinds' commits leaves a folder so (:mod:`.kinds_add`)."""
    rows = {kind: index.rows for kind, index in indexes.items()}
    if len(set(rows.values())) <= 1:
        return
    held = ", ".join(f"{kind} {count:,}" for kind, count in rows.items())
    store = f"; its texts store {open_texts(root)[1]['rows']:,}" if is_collection(root) else ""
    raise KindsDisagreeError(
        f"{root}: its kinds hold different rows ({held}{store}): an add stopped part-way; "
        "run the same `clearformer index add` again to finish it"
    )


def _assign(models: Sequence[Any], present: Sequence[str]) -> dict[str, Any]:
    """Kind -> model: each model serves its own kind; BGE-M3 serves every model kind that no
    model of that kind was given for, whatever the models' order (a SPLADE model given after
    a bge-m3 one still serves the sparse kind it built)."""
    by_kind: dict[str, Any] = {}
    kinds = [(model, model_kind_of(model)) for model in models]
    for model, found in kinds:
        if found != "bge-m3" and found in present:
            by_kind.setdefault(found, model)
    for model, found in kinds:
        if found == "bge-m3":
            for kind in ("dense", "sparse", "multivector"):
                if kind in present:
                    by_kind.setdefault(kind, model)
    return by_kind


def kinds_of(path: str | os.PathLike) -> list[str]:
    """The kinds an index folder holds (``layout`` errors for a damaged pointer aside)."""
    try:
        return kinds_present(Path(path))
    except layout.IndexDamagedError:
        return []


def _check_kinds_given(kinds: Sequence[str] | None) -> None:
    """None means every kind; an empty list names none, which is no search to run; a string
    would be read as its letters."""
    if isinstance(kinds, str):
        raise ValueError(f"kinds must be a list of kinds, got the string {kinds!r}")
    if kinds is not None and not list(kinds):
        raise ValueError("kinds must name at least one kind (None: every kind), got none")
