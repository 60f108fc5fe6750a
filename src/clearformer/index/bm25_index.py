"""A BM25 index: ``bm25s`` (Lucene's BM25) over the collection's texts, saved and memory-mapped
by bm25s itself.

The tokenisation is bm25s's own (``bm25s.tokenize``: lower case, its word pattern, English
stop words, no stemmer) with k1 = 1.5, b = 0.75: the settings of the BM25 row of
docs/retrieval.md (``benchmarks/retrieval_bbc.py``), so the index scores BBC News as that row
does. No model: a text's terms are its words.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import layout
from .kind_index import KindIndex, top_k
from .kind_store import write_kind


@dataclass(frozen=True)
class BM25Options:
    """BM25's parameters and tokenisation (bm25s's defaults for Lucene's BM25)."""

    k1: float = 1.5  # term-frequency saturation
    b: float = 0.75  # length normalisation
    method: str = "lucene"  # bm25s's variant: lucene | robertson | atire | bm25l | bm25+
    stopwords: str | None = "en"  # bm25s's English stop words; None keeps every word

    def __post_init__(self) -> None:
        for name in ("k1", "b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {value!r:.40}")
        if not self.k1 >= 0 or not 0 <= self.b <= 1:
            raise ValueError(f"k1 must be >= 0 and b in [0, 1], got k1={self.k1}, b={self.b}")
        methods = ("lucene", "robertson", "atire", "bm25l", "bm25+")
        if self.method not in methods:
            raise ValueError(f"method must be one of {methods}, got {self.method!r}")
        words = self.stopwords
        if not (words is None or isinstance(words, str) or _strings(words)):
            raise TypeError(
                f"stopwords must be a language, a list of words or None, got {words!r:.40}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _strings(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(word, str) for word in value)


def _bm25s():
    try:
        import bm25s
    except ImportError:
        raise ImportError("a bm25 index needs bm25s: pip install 'clearformer[hybrid]'") from None
    # bm25s sets its logger to DEBUG when imported, so its debug lines reach any handler of
    # the root logger (the CLI's phase lines); NOTSET gives it the level every logger has.
    logging.getLogger("bm25s").setLevel(logging.NOTSET)
    return bm25s


def tokenize(texts: list[str], options: BM25Options):
    return _bm25s().tokenize(texts, stopwords=options.stopwords, show_progress=False)


def query_terms(queries: list[str], options: BM25Options) -> list[list[str]]:
    """Each query's words as bm25s scores them (stop words and a text of no word: none)."""
    tokens = tokenize(queries, options)
    words = {index: word for word, index in tokens.vocab.items()}
    return [[words[t] for t in ids if words[t]] for ids in tokens.ids]  # "" marks no word


def build_bm25(root: Path, texts: list[str], ids: list[str], options: BM25Options) -> BM25Index:
    _bm25s()  # a missing bm25s fails now, before the texts store is written
    tokens = tokenize(texts, options)
    check_words(tokens, options)  # before the texts store is written
    write_kind(
        root,
        "bm25",
        texts,
        ids,
        model=None,
        options=options.to_dict(),
        write_files=lambda folder, _rows: write_bm25_files(folder, texts, options, tokens),
        reader=BM25Index,
        encode=None,
        chunk_rows=max(len(texts), 1),
    )
    return BM25Index.open(root)


def check_words(tokens: Any, options: BM25Options) -> None:
    """ValueError unless some text holds a word BM25 indexes: bm25s cannot index a corpus of
    none (its scores divide by the mean length, 0), and such an index would find nothing."""
    if not any(tokens.vocab):  # "" marks a text of no word
        kept = "punctuation" if options.stopwords is None else "stop words or punctuation"
        raise ValueError(
            f"none of the {len(tokens.ids):,} texts holds a word BM25 indexes (each is only "
            f"{kept}, or empty): a bm25 index of them would find nothing"
        )


def write_bm25_files(
    folder: Path, texts: list[str], options: BM25Options, tokens: Any = None
) -> None:
    """bm25s's files for ``texts``, every one of them (``tokens``: theirs, when the caller
    has them already). An add indexes all the texts again: a BM25 score depends on the
    corpus (each term's document frequency, the mean length), and bm25s has no append, so
    only an index of them all scores as a build of them all does."""
    retriever = _bm25s().BM25(k1=options.k1, b=options.b, method=options.method)
    retriever.index(tokenize(texts, options) if tokens is None else tokens, show_progress=False)
    retriever.save(str(folder))


class BM25Index(KindIndex):
    """A committed BM25 index (bm25s, memory-mapped)."""

    kind = "bm25"
    needs_model = False

    def __init__(self, root: Path, encoder: Any = None) -> None:
        if encoder is not None:
            raise ValueError("a bm25 index uses no model: open it without an encoder")
        super().__init__(root)
        self.options = self.from_meta("'options'", lambda: BM25Options(**self.meta["options"]))
        try:
            self._retriever = _bm25s().BM25.load(str(self.folder), mmap=True)
        except (OSError, ValueError, KeyError) as exc:
            raise layout.IndexDamagedError(
                self.folder, f"cannot be loaded by bm25s ({type(exc).__name__}: {exc})"
            ) from None

    def with_encoder(self, encoder: Any):
        raise ValueError("a bm25 index uses no model: search it by text alone")

    def search_texts(self, queries: list[str], k: int, **how: Any) -> tuple[np.ndarray, np.ndarray]:
        """(Q, k) rows and BM25 scores, best first; documents sharing no word are left out.
        BM25 is exact: it takes no per-call settings."""
        if how:
            raise TypeError(f"a bm25 search takes no {', '.join(sorted(how))}")
        out_rows = np.full((len(queries), k), -1, dtype=np.int64)
        out_scores = np.full((len(queries), k), np.nan, dtype=np.float32)
        for i, terms in enumerate(query_terms(queries, self.options)):
            if not terms:
                continue  # only stop words (or nothing): no document shares a term
            scores = self._retriever.get_scores(terms)  # (n,)
            out_rows[i], out_scores[i] = top_k(np.asarray(scores), k)
        return out_rows, out_scores
