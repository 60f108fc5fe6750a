"""bge-m3 seen as one kind of model: :class:`DenseView`, :class:`SparseView` and
:class:`MultiVectorView` give its dense, sparse and ColBERT outputs behind the interface each
kind's index, search and server take (:meth:`~.bge_m3.BGEM3Encoder.as_dense` and its twins
make them)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..checks import check_bool
from ..heads.maxsim import maxsim_scores
from ..index.identity import ModelIdentity
from ..options import Decision
from .progress import ProgressFn


class _View:
    """One of bge-m3's outputs behind the interface of its kind. bge-m3 embeds queries and
    documents alike (no prompts, no markers)."""

    kind = ""
    output = ""

    def __init__(self, model) -> None:  # a BGEM3Encoder (which imports this module)
        self.model = model
        self.path = model.path
        self.max_length = model.max_length

    def _encode(self, texts, batch_size, progress, precision):
        asked = {name: name == self.output for name in ("dense", "sparse", "colbert")}
        out = self.model.encode(
            texts, batch_size=batch_size, progress=progress, precision=precision, **asked
        )
        return getattr(out, self.output)

    def encode_query(self, texts: list[str], *, batch_size=None, progress=None, precision=None):
        """The view's output for queries; ``precision`` as :meth:`BGEM3Encoder.encode`'s."""
        return self._encode(texts, batch_size, progress, precision)

    def encode_document(self, texts: list[str], *, batch_size=None, progress=None, precision=None):
        """The view's output for documents (bge-m3 encodes both alike)."""
        return self._encode(texts, batch_size, progress, precision)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r})"


class DenseView(_View):
    """bge-m3 as a dense encoder: ``encode_query`` / ``encode_document`` give (B, D) float32
    unit rows, and :meth:`encode` the same rows as :meth:`clearformer.TextEncoder.encode`
    gives them (a numpy array), so a dense index builds and searches with it."""

    kind = "dense"
    output = "dense"

    @property
    def dim(self) -> int:
        return self.model.dim

    def encode(
        self,
        texts: list[str],
        batch_size: int | None = None,
        normalize: bool | None = None,
        progress: bool | ProgressFn | None = None,
        *,
        max_tokens: int | None = None,
        workers: int | None = None,
        precision: str | None = None,
    ) -> np.ndarray:
        """(n, D) float32 unit rows, row i for ``texts[i]``: the keywords a dense index's
        build and search pass (as :meth:`clearformer.TextEncoder.encode` takes them).
        bge-m3's dense vectors are normalised by definition, so ``normalize=False`` is
        refused rather than silently ignored."""
        check_bool(normalize, "normalize", optional=True)
        if normalize is False:
            raise ValueError(
                "normalize=False: bge-m3's dense vectors are its first token's states "
                "L2-normalised, by definition; give True or None"
            )
        out = self.model.encode(
            texts, dense=True, sparse=False, colbert=False, batch_size=batch_size,
            progress=progress, precision=precision, max_tokens=max_tokens, workers=workers,
        )  # fmt: skip
        return out.dense.numpy()

    def precision_for(self, precision: str | None = "auto") -> Decision:
        """The precision a call asking for ``precision`` runs in (the model's)."""
        return self.model.precision_for(precision)

    @property
    def identity(self) -> ModelIdentity:
        return self.model.identity_for("cls", self.model.dim, True)


class SparseView(_View):
    """bge-m3 as a sparse encoder: (B, vocab) coalesced sparse COO float32."""

    kind = "sparse"
    output = "sparse"

    @property
    def identity(self) -> ModelIdentity:
        return self.model.identity_for("sparse_linear", self.model.vocab_size, False)


class MultiVectorView(_View):
    """bge-m3 as a multi-vector encoder: (tokens_i, D) unit rows per text, MaxSim."""

    kind = "multivector"
    output = "colbert"

    @property
    def dim(self) -> int:
        return self.model.colbert_dim

    @property
    def identity(self) -> ModelIdentity:
        return self.model.identity_for("colbert", self.model.colbert_dim, True)

    def similarity(self, queries, documents) -> Tensor:
        """(Q, N) MaxSim scores over each query's token count, as FlagEmbedding's
        ``colbert_score`` (a per-query scale: the ranking is MaxSim's)."""
        scores = maxsim_scores(queries, documents)  # (Q, N)
        counts = torch.tensor([max(q.shape[0], 1) for q in queries], dtype=scores.dtype)
        return scores / counts[:, None]
