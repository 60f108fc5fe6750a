"""Hard negatives for (anchor, positive) pairs, mined through a persistent index.

A hard negative is a text the model already ranks close to an anchor that is not one of its
positives: training against it teaches what the easy in-batch negatives cannot. The corpus (the
positives, and any other texts given) is embedded once into an index
(:func:`~clearformer.index.build_index`; a rerun with the same texts reuses it, and a killed
build resumes); the anchors are then embedded and searched a block at a time, so memory is
bounded by the index and one block of results, never by anchors x corpus.

For each anchor, the candidates are its ``range_max`` nearest texts, without its own positives
(an anchor with several rows has several), without the anchor's own text where the corpus
holds it (as sentence-transformers leaves the query out: a text is no negative of itself, and
``train`` refuses a row whose anchor is among its negatives) and the first ``range_min`` ranks
(texts are compared stripped, as ``train`` compares them, and the negatives are the corpus's
stripped texts, each once); then, as sentence-transformers' ``mine_hard_negatives`` does:

* ``absolute_margin``: keep a candidate only if its score is at least this much below the
  positive's (``score <= positive - margin``), and ``relative_margin``: at most
  ``positive - abs(positive) * margin`` (sentence-transformers' form since its fix #3819:
  ``positive * (1 - margin)`` would be *above* a negative positive score, a cross-encoder's
  logit say): a candidate nearly as close as the positive is likely a false negative (a
  relevant text nobody labelled);
* ``max_score`` / ``min_score``: bounds on a candidate's own score;
* with a cross-encoder, the candidates and the positive are scored by it instead, which judges
  relevance better than the embeddings (the usual guard against false negatives);
* ``sampling``: the ``negatives`` best-ranked survivors (``top``), or that many drawn at random
  from them (``random``, seeded).

Anchors with no surviving candidate keep their row with no negatives (and are counted).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

QUERY_BLOCK = 1024  # anchors embedded and searched at a time
RESCORE_CHUNK = 4096  # cross-encoder pairs scored per call (progress between calls)


@dataclass(frozen=True)
class MiningSettings:
    negatives: int = 3
    range_min: int = 0  # ranks skipped before taking candidates (the very nearest)
    range_max: int = 50  # candidates looked at per anchor
    absolute_margin: float | None = None
    relative_margin: float | None = None
    max_score: float | None = None
    min_score: float | None = None
    sampling: str = "top"  # top | random
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("negatives", "range_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.range_min, int) or self.range_min < 0:
            raise ValueError(f"range_min must be an integer >= 0, got {self.range_min!r}")
        if self.range_min >= self.range_max:
            raise ValueError(
                f"range_min must be below range_max={self.range_max}, got {self.range_min}"
            )
        # The ranks range_min .. range_max are all the candidates an anchor has: more
        # negatives than that could never be found (sentence-transformers refuses it too).
        if self.negatives > self.range_max - self.range_min:
            raise ValueError(
                f"negatives must be at most range_max - range_min = "
                f"{self.range_max - self.range_min}, got {self.negatives}"
            )
        if self.sampling not in ("top", "random"):
            raise ValueError(f"sampling must be 'top' or 'random', got {self.sampling!r}")
        for name in ("absolute_margin", "relative_margin"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        for name in ("max_score", "min_score"):
            value = getattr(self, name)
            # A NaN bound compares false with every score: it would keep every candidate.
            if value is not None and math.isnan(value):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if (
            self.max_score is not None
            and self.min_score is not None
            and self.min_score > self.max_score
        ):
            raise ValueError(
                f"min_score must be at most max_score={self.max_score}, got {self.min_score} "
                "(no score could lie between them)"
            )


@dataclass
class MiningReport:
    anchors: int = 0
    rows: int = 0
    negatives: int = 0
    without_negatives: int = 0
    corpus: int = 0
    dropped: dict[str, int] = field(
        default_factory=lambda: {
            "positive": 0,
            "anchor": 0,
            "range": 0,
            "margin": 0,
            "score": 0,
        }
    )


def mine_hard_negatives(
    pairs: Sequence[tuple[str, str]],
    encoder,
    index_path: str | Path,
    *,
    corpus: Sequence[str] = (),
    settings: MiningSettings | None = None,
    cross_encoder=None,
    precision: str | None = None,
    cross_encoder_precision: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    encode_options: dict | None = None,
) -> tuple[list[dict], MiningReport]:
    """Rows ``{"anchor", "positive", "negative": [...]}``, one per pair, in the pairs' order.

    Args:
        pairs: (anchor, positive) texts.
        encoder: a :class:`~clearformer.TextEncoder`.
        index_path: the index of the corpus: built there (or reused when it holds these texts
            with this model already).
        corpus: texts besides the positives that negatives may be drawn from.
        cross_encoder: a :class:`~clearformer.CrossEncoder` that rescores the candidates.
        precision: what the corpus and the anchors are embedded in (as ``encoder.encode``
            takes it; None: the encoder's own). The index records it: an index built in
            another precision is built again, never mixed.
        cross_encoder_precision: what ``cross_encoder`` scores in (as its ``predict`` takes
            it; None: the precision it was loaded in).
    """
    from ..index import build_index
    from ..index.quantize import truncate

    settings = MiningSettings() if settings is None else settings
    # Both names are checked before the corpus is read or embedded.
    if precision is not None:
        encoder.precision_for(precision)
    if cross_encoder is not None and cross_encoder.num_labels != 1:
        raise ValueError(
            f"cross_encoder must give one score per pair to rescore candidates with, got "
            f"num_labels={cross_encoder.num_labels} ({cross_encoder.path})"
        )
    if cross_encoder_precision is not None:
        if cross_encoder is None:
            raise ValueError("cross_encoder_precision applies with a cross_encoder")
        cross_encoder.precision_for(cross_encoder_precision)
    if precision is not None:
        encode_options = {**(encode_options or {}), "precision": precision}
    report_progress = progress or (lambda phase, done, total: None)
    encode_options = dict(encode_options or {})
    texts = corpus_texts(pairs, corpus)
    row_of = {text: row for row, text in enumerate(texts)}
    positives: dict[str, set[int]] = {}  # by the anchor's stripped text, as texts are keyed
    for anchor, positive in pairs:
        positives.setdefault(anchor.strip(), set()).add(row_of[positive.strip()])
    anchors = list(positives)
    report = MiningReport(anchors=len(anchors), corpus=len(texts))
    report_progress("corpus", 0, len(texts))
    index = build_index(
        index_path,
        texts,
        encoder,
        ids=[str(i) for i in range(len(texts))],
        progress=lambda done, total: report_progress("corpus", done, total),
        **encode_options,
    ).with_encoder(encoder)
    # Deep enough for range_max candidates once the positives and the anchor's own text are out.
    depth = min(settings.range_max + max(len(r) for r in positives.values()) + 1, index.rows)
    chosen: dict[str, list[str]] = {}
    rng = random.Random(settings.seed)
    report_progress("anchors", 0, len(anchors))
    for start in range(0, len(anchors), QUERY_BLOCK):
        block = anchors[start : start + QUERY_BLOCK]
        vectors = truncate(  # (b, d) unit rows, cut as the index's were
            encoder.encode(block, normalize=True, progress=False, **encode_options),
            index.dimensions,
        )
        rows, scores = index.search_vectors(vectors, depth)  # (b, depth) each, best first
        looked_at: list[tuple[list[tuple[int, float]], float]] = []
        for i, anchor in enumerate(block):
            own = positives[anchor]
            positive_vectors = index.vectors(np.array(sorted(own), dtype=np.int64))
            positive_score = float((positive_vectors @ vectors[i]).min())
            found = [(int(r), float(s)) for r, s in zip(rows[i], scores[i], strict=True) if r >= 0]
            candidates = [(r, s) for r, s in found if r not in own]
            report.dropped["positive"] += len(found) - len(candidates)
            itself = row_of.get(anchor)  # the anchor's own text, where the corpus holds it
            others = [(r, s) for r, s in candidates if r != itself]
            report.dropped["anchor"] += len(candidates) - len(others)
            candidates = others
            kept = candidates[settings.range_min : settings.range_max]
            report.dropped["range"] += len(candidates) - len(kept)
            looked_at.append((kept, positive_score))
        if cross_encoder is not None:

            def rescoring(done: int, total: int, start: int = start, size: int = len(block)):
                # The block's anchors counted as done in proportion to its pairs scored.
                report_progress("anchors", start + size * done // total, len(anchors))

            looked_at = _rescored(
                block,
                looked_at,
                positives,
                texts,
                cross_encoder,
                cross_encoder_precision,
                rescoring,
            )
        for anchor, (kept, positive_score) in zip(block, looked_at, strict=True):
            chosen[anchor] = _filter(kept, positive_score, texts, settings, rng, report)
        report_progress("anchors", min(start + QUERY_BLOCK, len(anchors)), len(anchors))
    rows_out = []
    for anchor, positive in pairs:
        negatives = chosen[anchor.strip()]
        rows_out.append({"anchor": anchor, "positive": positive, "negative": negatives})
        report.negatives += len(negatives)
        report.without_negatives += not negatives
    report.rows = len(rows_out)
    return rows_out, report


def corpus_texts(pairs: Sequence[tuple[str, str]], corpus: Sequence[str] = ()) -> list[str]:
    """The texts the index of :func:`mine_hard_negatives` holds, row by row: the positives,
    then the corpus, each once and stripped. ``train`` compares texts stripped (leading and
    trailing spaces make no other text to a tokenizer): keyed on the raw text, a positive or
    an anchor with a trailing space would miss its stripped copy in the corpus and come back
    as its own hard negative."""
    stripped = [*(p.strip() for _, p in pairs), *(t.strip() for t in corpus)]
    return list(dict.fromkeys(t for t in stripped if t))  # a blank text is no negative


def check_index_holds(index_path: str | Path, texts: Sequence[str]) -> None:
    """Refuse a committed index at ``index_path`` that holds other rows than ``texts`` (as
    :func:`corpus_texts` gives them, ids their row numbers): building there would replace
    an index made for something else. One of these texts with another model or precision
    passes (it is built again, as :func:`mine_hard_negatives` says). No index there passes."""
    from ..index import IndexNotFoundError, VectorIndex

    try:
        index = VectorIndex.open(index_path)
    except IndexNotFoundError:
        return
    held = index.rows == len(texts)
    if held:
        found = index.hits(np.arange(index.rows)[None, :], np.zeros((1, index.rows)))[0]
        held = [(h.id, h.text) for h in found] == [(str(i), t) for i, t in enumerate(texts)]
    if not held:
        raise ValueError(
            f"{index_path}: holds an index of {index.rows:,} other texts (model "
            f"{index.identity.name}), not the {len(texts):,} these pairs are mined from; "
            "building there would replace it: give another folder (or remove this one)"
        )


def _rescored(block, looked_at, positives, texts, cross_encoder, precision, progress):
    """Each anchor's candidates and its lowest positive scored by ``cross_encoder`` instead of
    the embeddings, candidates in the cross-encoder's order. The block's pairs go to
    ``predict`` together, ``RESCORE_CHUNK`` at a time (``progress(done, total)`` after each):
    its batching sorts them by length across anchors, and a pair's score does not depend on
    the pairs beside it."""
    pairs: list[tuple[str, str]] = []
    for anchor, (kept, _) in zip(block, looked_at, strict=True):
        if kept:
            own = sorted(positives[anchor])
            pairs += [(anchor, texts[r]) for r, _ in kept] + [(anchor, texts[r]) for r in own]
    scores: list[float] = []
    for at in range(0, len(pairs), RESCORE_CHUNK):
        chunk = pairs[at : at + RESCORE_CHUNK]
        scores += cross_encoder.predict(chunk, precision=precision).tolist()
        progress(len(scores), len(pairs))
    out, at = [], 0
    for anchor, (kept, positive_score) in zip(block, looked_at, strict=True):
        if kept:
            count, own = len(kept), len(positives[anchor])
            kept = [(r, s) for (r, _), s in zip(kept, scores[at : at + count], strict=True)]
            positive_score = min(scores[at + count : at + count + own])
            at += count + own
            kept.sort(key=lambda item: -item[1])
        out.append((kept, positive_score))
    return out


def _filter(kept, positive_score, texts, settings, rng, report):
    survivors = []
    for row, score in kept:
        if (
            settings.absolute_margin is not None
            and score > positive_score - settings.absolute_margin
        ) or (
            settings.relative_margin is not None
            and score > _relative_ceiling(positive_score, settings.relative_margin)
        ):
            report.dropped["margin"] += 1
        elif (settings.max_score is not None and score > settings.max_score) or (
            settings.min_score is not None and score < settings.min_score
        ):
            report.dropped["score"] += 1
        else:
            survivors.append(row)
    if settings.sampling == "random" and len(survivors) > settings.negatives:
        survivors = rng.sample(survivors, settings.negatives)
    return [texts[r] for r in survivors[: settings.negatives]]


def _relative_ceiling(positive_score: float, margin: float) -> float:
    """The highest score a candidate may have under ``relative_margin``: ``margin`` of the
    positive's magnitude below it. ``positive * (1 - margin)`` is that only for a positive
    score; for a negative one (a cross-encoder's logit) it lies above the positive."""
    return positive_score - abs(positive_score) * margin
