"""The texts (and ids) a write to an index is given, checked before any work: every kind's
build and add takes them the same way."""

from __future__ import annotations

from collections.abc import Sequence


def check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a list of str, got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty: an index needs at least one text")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
    return texts


def check_ids(ids: Sequence[str], texts: list[str]) -> list[str]:
    ids = [str(i) for i in ids]
    if len(ids) != len(texts):
        raise ValueError(f"ids must be one per text: got {len(ids)} ids for {len(texts)} texts")
    return ids
