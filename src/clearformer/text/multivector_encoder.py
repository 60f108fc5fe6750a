"""``MultiVectorEncoder``: texts in, one vector per token out (ColBERT), scored by MaxSim.

A ColBERT model keeps a vector for every token of a text, projected to a small width and
normalised; a query scores a document by the best match of each query token
(:mod:`clearformer.retrieval.maxsim`). Queries and documents are encoded differently: each side
has its marker ([Q] / [D]) and length; queries are padded with [MASK] tokens to a fixed length
(query expansion, which lets the model add soft terms); documents drop their punctuation's
vectors (the skiplist). The directory formats are :mod:`.multivector_files`.

The pipeline: tokenize each side with its own length; sort by length into batches; run the
backbone on packed rows (:mod:`.token_states`); keep each text's scored tokens; project,
cut, normalise; put the texts back in input order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_int
from ..fast.reordered_weights import KeptReordering, use_reordered_weights
from ..heads.maxsim import maxsim_scores
from ..heads.sentence import Dense
from ..index.identity import ModelIdentity, checkpoint_revision
from ..interop.hf import LoadedModel, TextTokenizer, find_checkpoint
from ..interop.hf.files import resolve_path
from ..interop.hf.loading import read_family
from ..interop.hf.tokenizer import check_texts, max_length_for
from ..model_kinds import model_kind
from ..options import Decision
from .backbone_precision import BackbonePrecision, load_backbone
from .batching import check_batch_limits, default_max_tokens, plan_batches
from .multivector_files import (
    MultiVectorConfig,
    SideConfig,
    kind_error,
    read_multivector_config,
)
from .progress import ProgressFn, check_progress, progress_reporter
from .token_states import TokenRow, pad_rows, token_states
from .workers import auto_workers, map_in_workers

log = logging.getLogger(__name__)

SIDES = ("query", "document")


class MultiVectorEncoder:
    """A ColBERT-style model: a backbone, a projection of every token, MaxSim.

    Attributes:
        kind: ``"multivector"``.
        config: the directory's :class:`~.multivector_files.MultiVectorConfig` (each side's
            prompt or marker, length, expansion and skiplist; the projection; normalisation).
        model: the backbone :class:`~clearformer.EncoderModel`, in eval mode (bfloat16 when
            loaded with ``precision="bf16"``).
        precision: the precision it was loaded in (None: float32, bf16 on request).
        projection: the Dense layers on every token's state (``nn.ModuleList``).
        path: the directory.
    """

    kind = "multivector"

    def __init__(
        self,
        loaded: LoadedModel,
        tokenizers: dict[str, TextTokenizer],
        config: MultiVectorConfig,
        projection: nn.ModuleList,
        held: Decision | None = None,
        held_as: str | None = None,
    ) -> None:
        self._loaded = loaded
        self.model = loaded.model
        self._backbone = BackbonePrecision(self.model, held, held_as)
        self.precision = self._backbone.held
        self.config = config
        self.projection = projection.eval()
        self._tokenizers = tokenizers
        self.path: Path = loaded.files.path
        self._reordering = KeptReordering(self.model)

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, max_length: int | None = None, precision: str | None = None
    ) -> MultiVectorEncoder:
        """Load a sentence-transformers MultiVectorEncoder or PyLate ColBERT directory.

        Args:
            max_length: cut documents (and queries without a fixed expansion) to this many
                tokens; None = the directory's ``document_length`` / ``query_length``, else
                the model's limit.
            precision: None = the float32 backbone, and a call may ask for bf16 (a bfloat16
                copy is then built and kept beside it); ``"float32"``, ``"bf16"`` or
                ``"auto"`` (decided now): that precision's backbone alone (bf16 read from the
                file into bfloat16: no float32 copy is ever made), every call runs it, and a
                call asking for the other is refused. The projection runs in float32 either
                way (:mod:`.backbone_precision`).

        Raises:
            FileNotFoundError: no such directory.
            CheckpointError: a directory of another kind (naming the class that loads it), or
                an incomplete, unsupported or corrupt one.
        """
        check_int(max_length, "max_length", low=2, optional=True)
        if precision is not None:  # a bad name before any file is read
            BackbonePrecision.check_name(precision)
        root = resolve_path(path)
        kind = model_kind(root) if root.is_dir() else "multivector"
        if kind != "multivector":
            raise kind_error(root, kind, "MultiVectorEncoder")
        files = find_checkpoint(root)
        _, backbone = read_family(files, "auto")  # the width, before any weight
        model_max = max_length_for(files, backbone.max_length)
        probe = TextTokenizer.from_files(files, model_max, 0)
        # PyLate saves max_seq_length one under its document length (the marker's place), so
        # a side's own length is checked against the positions the model has, not against it.
        config, tensors = read_multivector_config(
            files,
            probe.tokenizer.token_to_id,
            backbone.d_model,
            (model_max, backbone.max_length),
            max_length,
        )
        projection = nn.ModuleList(Dense(step) for step in config.projection)
        projection.load_state_dict(tensors, strict=True)  # names and shapes checked on reading
        loaded, held, held_as = load_backbone(files, precision)
        pad_id = loaded.model.config.pad_token_id or 0
        tokenizers = {}
        for name in SIDES:
            side: SideConfig = getattr(config, name)
            # A marker is inserted after tokenizing: the text itself gets one token less.
            length = side.max_length - (side.marker_id is not None)
            tokenizers[name] = TextTokenizer.from_files(
                files, length, pad_id, vocab_size=loaded.model.config.vocab_size
            )
        log.info("loaded %s (%s layout, width %d)", root, config.layout, config.width)
        return cls(loaded, tokenizers, config, projection, held, held_as)

    def tokenizer_for(self, side: str) -> TextTokenizer:
        """The tokenizer of ``side`` (``"query"`` or ``"document"``), cutting at its length."""
        return self._tokenizers[side]

    @property
    def dim(self) -> int:
        """Width of the token vectors."""
        return self.config.width

    @property
    def max_length(self) -> int:
        """Tokens a document is cut to."""
        return self.config.document.max_length

    @property
    def identity(self) -> ModelIdentity:
        """Who makes these vectors (:class:`~clearformer.index.identity.ModelIdentity`; the
        projection's weights are part of the revision)."""
        return ModelIdentity(
            name=self.path.name,
            revision=checkpoint_revision(self.path, extra=_module_weights(self.path)),
            pooling="colbert",
            normalize=self.config.normalize,
            width=self.dim,
            max_length=self.max_length,
            path=str(self.path.resolve()),
        )

    def encode_query(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        progress: bool | ProgressFn | None = None,
        precision: str | None = None,
    ) -> list[Tensor]:
        """Token vectors of queries: the query prompt or marker, expansion, no skiplist.

        ``precision``: the backbone's, ``"float32"``, ``"bf16"`` (``"bfloat16"``) or
        ``"auto"``; None = the one it was loaded in, else float32.

        Returns:
            one float32 ``(tokens_i, dim)`` tensor per text, in input order.
        """
        return self._encode("query", texts, batch_size, progress, precision)

    def encode_document(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        progress: bool | ProgressFn | None = None,
        precision: str | None = None,
    ) -> list[Tensor]:
        """Token vectors of documents: the document prompt or marker, the skiplist's tokens
        dropped. One float32 ``(tokens_i, dim)`` tensor per text, in input order;
        ``precision`` as for :meth:`encode_query`."""
        return self._encode("document", texts, batch_size, progress, precision)

    def precision_for(self, precision: str | None = "auto") -> Decision:
        """The precision a call asking for ``precision`` runs in here, and why."""
        return self._backbone.decide(precision)

    def similarity(self, queries: Sequence[Tensor], documents: Sequence[Tensor]) -> Tensor:
        """(Q, N) MaxSim scores of every query against every document (divided by each
        query's token count for a ``meanmaxsim`` model)."""
        scores = maxsim_scores(queries, documents)  # (Q, N)
        if self.config.similarity == "meanmaxsim":
            counts = torch.tensor([max(q.shape[0], 1) for q in queries], dtype=scores.dtype)
            scores = scores / counts[:, None]
        return scores

    def _encode(
        self,
        side: str,
        texts: list[str],
        batch_size: int | None,
        progress: bool | ProgressFn | None,
        precision: str | None,
    ) -> list[Tensor]:
        texts = check_texts(texts)
        precision = self._backbone.check(precision)  # before any work
        check_progress(progress)
        max_tokens = default_max_tokens("float32")
        check_batch_limits(batch_size, max_tokens)
        rows = self.token_rows(side, texts)
        out: list[Tensor | None] = [None] * len(rows)
        if not rows:
            return []
        tokens = sum(len(r) for r in rows)
        model = self._backbone.model_for(precision)
        log.info("encode_%s: %d texts, %d tokens", side, len(rows), tokens)
        batches = plan_batches([len(r) for r in rows], batch_size, max_tokens)
        workers = auto_workers(len(batches), next(self.model.parameters()).device)
        packed = self._reordering.for_call(tokens)
        report = progress_reporter(progress, len(rows))

        def embed(indices: list[int]) -> tuple[list[int], list[Tensor]]:
            return indices, self._embed(side, [rows[i] for i in indices], model, packed)

        done = 0
        for indices, vectors in map_in_workers(embed, batches, workers):
            for i, v in zip(indices, vectors, strict=True):
                out[i] = v
            done += len(indices)
            report(done, len(rows))
        return out  # type: ignore[return-value]

    def token_rows(self, side: str, texts: list[str]) -> list[TokenRow]:
        """Each text as the model reads it on ``side``: prompt, tokens, marker, expansion."""
        config: SideConfig = getattr(self.config, side)
        if config.prompt:
            texts = [config.prompt + text for text in texts]
        rows = []
        for encoding in self._tokenizers[side].encode(texts):
            ids, types = list(encoding.ids), list(encoding.type_ids)
            if config.marker_id is not None:
                # PyLate's marker goes right after the first token ([CLS]).
                ids.insert(1, config.marker_id)
                types.insert(1, 0)
            expansion = config.expansion
            extra = max(0, expansion.length - len(ids)) if expansion is not None else 0
            rows.append(TokenRow(ids, types, extra, expansion is None or expansion.attend))
        return rows

    def embed_rows(
        self, side: str, rows: list[TokenRow], packed=None, *, precision: str | None = None
    ) -> list[Tensor]:
        """One forward pass over ``rows`` (:meth:`token_rows`): the kept tokens' vectors,
        projected, cut and normalised, one ``(tokens_i, dim)`` tensor per row, the backbone
        in ``precision`` (as for :meth:`encode_query`)."""
        model = self._backbone.model_for(precision)
        return self._embed(side, rows, model, packed)

    def _embed(self, side: str, rows: list[TokenRow], model, packed) -> list[Tensor]:
        config: SideConfig = getattr(self.config, side)
        expansion_id = config.expansion.token_id if config.expansion is not None else 0
        batch = pad_rows(rows, self._tokenizers[side].pad_id, expansion_id)
        keep = batch.tokens if config.score_expansion else batch.texts  # (B, T)
        if config.skiplist:
            skip = torch.tensor(sorted(config.skiplist), dtype=torch.int64)
            keep = keep & ~torch.isin(batch.input_ids, skip)
        with torch.inference_mode(), use_reordered_weights(packed):
            hidden = token_states(model, batch)  # (B, T, D)
            vectors = hidden[keep].float()  # (N kept, D)
            for dense in self.projection:
                vectors = dense(vectors)  # (N kept, width)
            if self.config.truncate_dim is not None:
                vectors = F.normalize(vectors[:, : self.config.truncate_dim], p=2.0, dim=-1)
            elif self.config.normalize:
                vectors = F.normalize(vectors, p=2.0, dim=-1)
        counts = keep.sum(dim=1).tolist()
        return [v.clone() for v in vectors.split(counts)]

    def __repr__(self) -> str:
        return (
            f"MultiVectorEncoder(path={str(self.path)!r}, layout={self.config.layout!r}, "
            f"dim={self.dim}, query_length={self.config.query.max_length}, "
            f"document_length={self.config.document.max_length})"
        )


def _module_weights(root: Path) -> list[str]:
    """The weight files of a directory's sentence-transformers modules (``1_Dense/...``)."""
    names = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        for weights in ("model.safetensors", "pytorch_model.bin"):
            if (folder / weights).is_file():
                names.append(f"{folder.name}/{weights}")
    return names
