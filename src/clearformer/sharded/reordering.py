"""The weights a sharded run's chunks take: as one ``encode`` call of the whole corpus would
take them, so that every chunk, on any rank, runs the same products as a one-process
``clearformer encode --output FILE.npy`` (:mod:`.shards`)."""

from __future__ import annotations

from collections.abc import Sequence


def reorder_as_one_call(encoder, texts: Sequence[str], precision: str) -> None:
    """Reorder the weights for every chunk as one ``encode`` call of the whole corpus does
    (``clearformer encode --output FILE.npy``): that call packs them when it carries
    ``REORDER_MIN_TOKENS`` tokens, and runs plain weights when it does not. Reordered and plain
    weights may round otherwise (clearformer's AVX-512 linear kernel, where loaded), and a
    one-process run's chunks would otherwise pack part-way, once they had carried that many."""
    from ..fast.reordered_weights import REORDER_MIN_TOKENS
    from ..precision.names import is_int8

    if is_int8(precision):
        return  # int8 products read no reordered weights
    if _carries(encoder, texts, REORDER_MIN_TOKENS):
        encoder.keep_weights_reordered()
    else:
        # A copy this encoder's earlier calls made would pack these chunks; they carry too
        # few tokens in all to make one again.
        encoder.drop_reordered_weights()


def _carries(encoder, texts: Sequence[str], tokens: int, step: int = 256) -> bool:
    """Whether ``texts`` hold ``tokens`` tokens or more, as ``encode`` counts them (tokenized
    ``step`` texts at a time, and no further than the count needs)."""
    counted = 0
    for start in range(0, len(texts), step):
        encodings = encoder.tokenizer.encode(list(texts[start : start + step]))
        counted += sum(len(e.ids) for e in encodings)
        if counted >= tokens:
            return True
    return False
