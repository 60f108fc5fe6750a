"""What every opened sparse, multi-vector or BM25 sub-index shares: its committed generation,
the model that made it (refusing another), the collection's texts, and results as hits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from . import layout
from .collection import holds_state, open_texts
from .identity import ModelIdentity
from .kind_store import open_kind
from .kinds import encoder_for, identity_of
from .vector_index import Hit, hits_wanted

# The flag that names a kind's query model on the command line (`clearformer search`).
MODEL_FLAGS = {"sparse": "--sparse-model", "multivector": "--multivector-model", "bm25": "--model"}

T = TypeVar("T")
# A recorded identity's fields and their types (width and max_length: positive integers);
# "path", a hint never compared, may be absent (ModelIdentity's default).
_IDENTITY_FIELDS = {
    "name": str, "revision": str, "pooling": str, "normalize": bool, "width": int,
    "max_length": int, "path": str,
}  # fmt: skip


class KindIndex:
    """A committed sub-index of kind :attr:`kind` in the collection at ``root``."""

    kind = ""
    needs_model = True  # bm25: False (its meta.json records "model": null)

    def __init__(self, root: Path, encoder: Any = None) -> None:
        self.root = root
        self.folder, self.meta = open_kind(root, self.kind)
        self.generation: str = self.meta["generation"]
        self.rows: int = self.meta["rows"]
        self.texts, record = open_texts(root)
        # The store's current rows, or the first rows of it (a kind an add has not reached
        # yet reads its rows, unchanged, from the store the add extended).
        if not holds_state(record, self.rows, self.meta.get("texts")):
            raise layout.IndexDamagedError(
                self.folder / layout.META,
                f"records texts {str(self.meta.get('texts'))[:12]} of {self.rows} rows, but "
                f"{root / 'texts'} holds {record['content'][:12]} of {record['rows']} rows",
            )
        self.identity = self._recorded_identity()
        self.encoder = None
        if encoder is not None:
            self.with_encoder(encoder)

    @classmethod
    def open(cls, path: str | Path, encoder: Any = None):
        return cls(Path(path), encoder)

    def from_meta(self, what: str, make: Callable[[], T]) -> T:
        """``make()``, which reads ``what`` of this generation's ``meta.json`` (its options,
        say); IndexDamagedError naming the file where the recorded values are not such
        (a key lost or unknown, a value of another type or out of range)."""
        try:
            return make()
        except (TypeError, ValueError, KeyError) as exc:
            raise layout.IndexDamagedError(
                self.folder / layout.META, f"has {what} this {self.kind} index cannot use ({exc})"
            ) from None

    def _recorded_identity(self) -> ModelIdentity | None:
        """The model ``meta.json`` records, its fields checked (None: bm25, which has none)."""
        model, meta = self.meta["model"], self.folder / layout.META
        if not self.needs_model:
            if model is not None:
                raise layout.IndexDamagedError(
                    meta, f"records a model; a {self.kind} index uses none"
                )
            return None
        if model is None:
            raise layout.IndexDamagedError(meta, f"records no model; a {self.kind} index needs one")
        for name, kind in _IDENTITY_FIELDS.items():
            value = model.get(name)
            if name == "path" and value is None:
                continue
            whole = isinstance(value, kind) and (kind is not int or not isinstance(value, bool))
            if not whole or (kind is int and value <= 0):
                raise layout.IndexDamagedError(
                    meta, f"has 'model' {name} {value!r:.60}, not a model identity's {name}"
                )
        return ModelIdentity.from_dict(model)

    def with_encoder(self, encoder: Any):
        """This index with ``encoder`` for text queries, after checking it is the index's
        model (:class:`~.identity.ModelMismatchError` if not)."""
        view = encoder_for(self.kind, encoder, f"{self.kind} index {self.root}")
        where, flag = f"{self.kind} index {self.root / self.kind}", MODEL_FLAGS.get(self.kind)
        self.identity.check_same(identity_of(view), where, flag=flag or "--model")
        self.encoder = view
        return self

    def _require_encoder(self) -> Any:
        if self.encoder is None:
            raise ValueError(
                f"this {self.kind} index was opened without an encoder: open it with its "
                "model to search by text"
            )
        return self.encoder

    def search(
        self, queries: str | Sequence[str], k: int = 10, **how: Any
    ) -> list[Hit] | list[list[Hit]]:
        """The ``k`` best texts for each query, best first (a list of hits for one string).
        ``how``: the kind's per-call search settings (``candidates``, ``exact``: see its
        ``search_vectors``)."""
        single = isinstance(queries, str)
        batch = [queries] if single else list(queries)
        rows, scores = self.search_texts(batch, hits_wanted(k, self.rows), **how)
        hits = self.hits(rows, scores)
        return hits[0] if single else hits

    def search_texts(self, queries: list[str], k: int, **how: Any) -> tuple[np.ndarray, np.ndarray]:
        """(Q, k) int64 rows (-1 where fewer) and (Q, k) float32 scores, best first."""
        raise NotImplementedError

    def hits(self, rows: np.ndarray, scores: np.ndarray) -> list[list[Hit]]:
        wanted = sorted({int(r) for r in np.asarray(rows).ravel() if r >= 0})
        found = self.texts.get(wanted)
        missing = [row for row in wanted if row not in found]
        if missing:
            raise layout.IndexDamagedError(self.texts.path, f"holds no row {missing[0]}")
        return [
            [
                Hit(float(score), *found[int(row)], int(row))
                for row, score in zip(query_rows, query_scores, strict=True)
                if row >= 0
            ]
            for query_rows, query_scores in zip(rows, scores, strict=True)
        ]

    def __repr__(self) -> str:
        model = None if self.identity is None else self.identity.name
        return (
            f"{type(self).__name__}({str(self.root)!r}, generation={self.generation!r}, "
            f"rows={self.rows}, model={model!r})"
        )


def top_k(scores: np.ndarray, k: int, positive_only: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of one query's (n,) scores: (k,) int64 rows (-1 past the found ones)
    and (k,) float32 scores, by score then row; rows scoring 0 or less share nothing with the
    query and are left out when ``positive_only``."""
    rows = np.full(k, -1, dtype=np.int64)
    values = np.full(k, np.nan, dtype=np.float32)
    candidates = np.flatnonzero(scores > 0) if positive_only else np.arange(len(scores))
    if len(candidates) > k:
        # the k-th best score, then every row at least as good (ties kept, ordered below)
        kth = np.partition(scores[candidates], len(candidates) - k)[len(candidates) - k]
        candidates = candidates[scores[candidates] >= kth]
    order = np.lexsort((candidates, -scores[candidates]))[:k]
    rows[: len(order)] = candidates[order]
    values[: len(order)] = scores[candidates[order]]
    return rows, values
