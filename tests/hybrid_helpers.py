"""Small stand-ins for the sparse and multi-vector encoders (the contract: ``kind``,
``identity``, ``encode_query`` / ``encode_document``), and synthetic corpora for the index
kinds' tests. Words are ``w0`` .. ``wN``: a word's term id is its number."""

from __future__ import annotations

import numpy as np
import torch

from clearformer.index.identity import ModelIdentity

VOCAB = 64


def word_ids(text: str) -> list[int]:
    return [int(word[1:]) for word in text.split() if word.startswith("w")]


class FakeSparseEncoder:
    """A SPLADE stand-in: each word's term gets a fixed positive weight (queries: another)."""

    kind = "sparse"

    def __init__(self, vocab: int = VOCAB, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.document_weights = rng.uniform(0.2, 2.0, vocab).astype(np.float32)
        self.query_weights = rng.uniform(0.2, 2.0, vocab).astype(np.float32)
        self.seed = seed
        self.calls = 0

    @property
    def identity(self) -> ModelIdentity:
        return ModelIdentity(
            name="fake-splade", revision=f"sparse-{self.seed}", pooling="splade-max",
            normalize=False, width=self.vocab, max_length=64, path="",
        )  # fmt: skip

    def _encode(self, texts, weights) -> torch.Tensor:
        self.calls += 1
        rows, cols, values = [], [], []
        for i, text in enumerate(texts):
            for term in sorted(set(word_ids(text))):
                rows.append(i)
                cols.append(term)
                values.append(weights[term] * word_ids(text).count(term))
        indices = torch.tensor([rows, cols], dtype=torch.int64).reshape(2, -1)
        values = torch.tensor(values, dtype=torch.float32)
        return torch.sparse_coo_tensor(
            indices, values, (len(texts), self.vocab), check_invariants=True
        ).coalesce()

    def encode_document(self, texts, *, batch_size=None, progress=None):
        return self._encode(texts, self.document_weights)

    def encode_query(self, texts, *, batch_size=None, progress=None):
        return self._encode(texts, self.query_weights)

    def dense_vectors(self, texts, query: bool) -> np.ndarray:
        """(n, vocab) the same vectors, dense: the brute-force reference."""
        encoded = self.encode_query(texts) if query else self.encode_document(texts)
        return encoded.to_dense().numpy()


class FakeMultiVectorEncoder:
    """A ColBERT stand-in: each word is a fixed unit vector; a text, its words' vectors."""

    kind = "multivector"

    def __init__(self, dim: int = 16, vocab: int = VOCAB, seed: int = 0) -> None:
        rng = np.random.default_rng(seed + 100)
        table = rng.standard_normal((vocab, dim)).astype(np.float32)
        self.table = table / np.linalg.norm(table, axis=1, keepdims=True)
        self.dim, self.vocab, self.seed = dim, vocab, seed

    @property
    def identity(self) -> ModelIdentity:
        return ModelIdentity(
            name="fake-colbert", revision=f"multi-{self.seed}", pooling="colbert",
            normalize=True, width=self.dim, max_length=64, path="",
        )  # fmt: skip

    def encode_document(self, texts, *, batch_size=None, progress=None):
        return [torch.from_numpy(self.table[word_ids(t)].copy()) for t in texts]

    encode_query = encode_document


def word_corpus(
    n: int, seed: int = 0, vocab: int = VOCAB, low: int = 3, high: int = 12
) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        " ".join(f"w{w}" for w in rng.integers(0, vocab, rng.integers(low, high))) for _ in range(n)
    ]


def clustered_tokens(n: int, dim: int = 32, topics: int = 64, seed: int = 0):
    """n documents of 20-40 unit token vectors near a few topic centres each (a synthetic
    ColBERT corpus), and 40 queries of 6 tokens taken near one document's tokens."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((topics, dim)).astype(np.float32)

    def unit(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    documents = []
    for _ in range(n):
        own = rng.choice(topics, 4, replace=False)
        count = int(rng.integers(20, 41))
        picks = centres[rng.choice(own, count)]
        documents.append(unit(picks + 0.6 * rng.standard_normal((count, dim))))
    queries = []
    for _ in range(40):
        source = documents[int(rng.integers(n))]
        picks = source[rng.choice(len(source), 6)]
        queries.append(unit(picks + 0.5 * rng.standard_normal(picks.shape)))
    return documents, queries
