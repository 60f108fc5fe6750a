"""A staged chunk of a sparse or multi-vector build damaged (cut short, bytes changed) before
the build resumes: the chunk is removed and encoded again, and the build ends as an
uninterrupted one does."""

from __future__ import annotations

import numpy as np
import pytest

from clearformer.index import SparseOptions, build_index
from clearformer.index.ragged import Ragged, RaggedChunkStore

from .hybrid_helpers import FakeSparseEncoder, word_corpus

CHUNK_ROWS = 16
TEXTS = word_corpus(64, seed=5)  # 4 chunks


def cut_short(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def bytes_changed(path):
    data = bytearray(path.read_bytes())
    data[100:110] = b"x" * 10  # inside the first array: its CRC no longer holds
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [cut_short, bytes_changed])
def test_a_damaged_chunk_is_removed_to_be_encoded_again(tmp_path, damage):
    store = RaggedChunkStore(tmp_path / "job", {"rows": 10, "chunk_rows": 10})
    rows = Ragged(
        np.arange(11, dtype=np.int64), np.ones(10, np.float32), np.arange(10, dtype=np.int32)
    )
    store.write(0, rows)
    assert store.done(0)
    damage(store.path(0))
    assert not store.done(0)
    assert not store.path(0).exists()


class Stopped(Exception):
    pass


class StoppingEncoder(FakeSparseEncoder):
    """Stops the build on its ``stop``th chunk (the chunks before it are committed)."""

    def __init__(self, stop: int) -> None:
        super().__init__()
        self.stop = stop

    def encode_document(self, texts, **options):
        if self.calls + 1 == self.stop:
            raise Stopped
        return super().encode_document(texts, **options)


def postings(index):
    return [np.asarray(index._indptr), np.asarray(index._rows), np.asarray(index._weights)]


@pytest.mark.parametrize("damage", [cut_short, bytes_changed])
def test_a_resumed_build_encodes_a_damaged_chunk_again(tmp_path, damage):
    options = SparseOptions(chunk_rows=CHUNK_ROWS)
    whole = build_index(tmp_path / "whole", TEXTS, FakeSparseEncoder(), kind="sparse",
                        options=options)  # fmt: skip
    out = tmp_path / "idx"
    with pytest.raises(Stopped):
        build_index(out, TEXTS, StoppingEncoder(stop=4), kind="sparse", options=options)
    staged = sorted((out / "sparse" / "staging").glob("*/chunk-*.npz"))
    assert len(staged) == 3
    damage(staged[1])
    encoder = FakeSparseEncoder()
    index = build_index(out, TEXTS, encoder, kind="sparse", options=options)
    assert encoder.calls == 2  # the damaged chunk and the one never encoded
    for a, b in zip(postings(index), postings(whole), strict=True):
        np.testing.assert_array_equal(a, b)
