"""How an index's vectors were computed, as its segments record it and as an encoder would
compute them now: the precision (float32, bf16, int8, ...) and the prompt put before each text.
Builds, adds, ``eval --index`` and mining compare the two before they reuse an index: vectors
of another precision or prompt are other vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def index_prompt(meta: dict) -> str | None:
    """The prompt put before each text of a committed index (None: none; its segments record
    it where there was one), or "mixed"."""
    found = {s.get("prompt") for s in meta["segments"]}
    return found.pop() if len(found) == 1 else "mixed"


def computed_prompt(encoder, encode_options: dict[str, Any]) -> str | None:
    """The prompt ``encoder.encode(**encode_options)`` puts before every text (an encoder
    without prompts: None)."""
    resolve = getattr(encoder, "resolve_prompt", None)
    if resolve is None:
        return None
    return resolve(encode_options.get("prompt"), encode_options.get("prompt_name"))[0]


def index_precision(meta: dict) -> str:
    """The precision a committed index's embeddings were computed in (its segments record it;
    an index written before they did is float32)."""
    found = {s.get("precision", "float32") for s in meta["segments"]}
    return found.pop() if len(found) == 1 else "mixed"


def computed_precision(encoder, asked: str | None) -> str:
    """The precision ``encoder.encode(precision=asked)`` computes in (float32 for encoders
    that offer no choice)."""
    decide = getattr(encoder, "precision_for", None)
    return "float32" if decide is None else decide(asked).choice


def check_adds_alike(root: Path, base, identity, precision: str, prompt: str | None) -> None:
    """An add's vectors must compare with those of ``base`` (the committed
    :class:`~.vector_index.VectorIndex`): the same model, the same precision, the same prompt
    before each text. ValueError naming the one that differs."""
    base.identity.check_same(identity, f"index {root}", purpose="add")
    held = index_precision(base.meta)
    if held != precision:  # one index, one precision: its vectors compare alike
        raise ValueError(
            f"precision must be {held!r} for an add to index {root}: it holds embeddings "
            f"computed in {held} (build it again to change that), got {precision!r}"
        )
    held_prompt = index_prompt(base.meta)
    if held_prompt != prompt:
        raise ValueError(
            f"the prompt must be {held_prompt!r} for an add to index {root}: its texts were "
            f"embedded with it (build it again to change that), got {prompt!r}"
        )
