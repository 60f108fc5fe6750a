"""``SparseEncoder``: texts in, one weight per vocabulary entry out (SPLADE), on a
sentence-transformers ``SparseEncoder`` directory.

A query and a document are each a sparse vector over the tokenizer's vocabulary (V = 30,522
for BERT's), most of it zero; their dot product scores the pair, and an inverted index serves
it. The weights come from a masked-LM head pooled by SPLADE (:mod:`clearformer.heads.splade`,
computed chunk by chunk on packed rows), or, for the queries of an inference-free model, from a
table looked up per token (:mod:`.sparse_sides`). Outputs match sentence-transformers'
``SparseEncoder.encode_query`` / ``encode_document(..., convert_to_sparse_tensor=True)``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch
from torch import Tensor

from ..checks import check_choice
from ..heads.splade import DEFAULT_CHUNK_TOKENS
from ..interop.hf import CheckpointError
from ..interop.hf.files import resolve_path
from ..interop.hf.sparse_modules import SparseLayout, SpladeSide, read_sparse_layout
from ..interop.hf.tokenizer import check_texts
from ..model_kinds import kind_error, model_kind
from .batching import DEFAULT_MAX_TOKENS, check_batch_limits, plan_batches
from .progress import ProgressFn, check_progress, progress_reporter
from .sparse_sides import SpladeRunner, StaticRunner
from .workers import auto_workers, check_workers, map_in_workers

log = logging.getLogger(__name__)

TASKS = ("query", "document")
PRECISIONS = ("float32", "bf16")


def _canonical(precision: object) -> str:
    """``precision`` checked against :data:`PRECISIONS` (``"bfloat16"`` is ``"bf16"``), and
    ``"auto"`` decided among them as for a dense model on this CPU (no int8 route here)."""
    precision = "bf16" if precision == "bfloat16" else precision  # PyTorch's name too
    check_choice(precision, (*PRECISIONS, "auto"), "precision")
    if precision == "auto":
        from ..precision.auto import choose_precision

        decision = choose_precision("auto", offered=PRECISIONS)
        log.info("precision auto: %s (%s)", decision.choice, decision.reason)
        return decision.choice
    return precision


class SparseEncoder:
    """A SPLADE model (or an inference-free one) with its tokenizer(s).

    Attributes:
        kind: ``"sparse"``.
        layout: what the directory asks for (:class:`~clearformer.interop.hf.sparse_modules.
            SparseLayout`): each task's side, ``max_active_dims``, prompts.
        sides: ``"query"`` and ``"document"`` -> the runner of that task (the same object
            when both take the same path).
        max_active_dims: the weights kept per text by default (None: all non-zero ones).
        path: the directory.
    """

    kind = "sparse"

    def __init__(
        self,
        layout: SparseLayout,
        sides: dict[str, SpladeRunner | StaticRunner],
        precision: str | None = None,
    ):
        self.layout = layout
        self.precision = precision  # the one it was loaded in (None: either, per call)
        self.sides = sides
        self.path: Path = layout.root
        self.max_active_dims = layout.max_active_dims
        self.prompts = layout.prompts
        self.vocab_size = sides["document"].vocab_size
        self._vocabulary: list[str] | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        max_length: int | None = None,
        backend: str = "auto",
        strict: bool = True,
        padding_side: str | None = None,
        precision: str | None = None,
    ) -> SparseEncoder:
        """Load a sentence-transformers SparseEncoder directory (SPLADE, or inference-free
        SPLADE behind a Router).

        Args:
            max_length: truncate texts to this many pieces on the masked-LM side (None: the
                task's ``query_length``/``document_length``, else the checkpoint's
                ``max_seq_length``); a static query side truncates at its tokenizer's
                ``model_max_length``, as sentence-transformers' does.
            padding_side: the tokenizer's padding side (weights do not depend on it: batches
                are packed).
            precision: None = float32 weights, and a call may ask for bf16 (a bfloat16 copy
                is then built and kept beside them); ``"float32"`` or ``"bf16"``: that
                precision's encoder and head alone (bf16: the float32 ones let go once the
                copy is made), every call runs it, and a call asking for the other is refused.

        Raises:
            FileNotFoundError: no such directory.
            CheckpointError: a directory of another kind (naming the class to use), modules
                clearformer does not run, or an incomplete or mismatched checkpoint.
        """
        if precision is not None:  # before any work
            precision = _canonical(precision)
        root = resolve_path(path)
        kind = model_kind(root)
        if kind != "sparse":
            raise CheckpointError(kind_error(root, kind, "SparseEncoder"))
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0
        ):
            raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
        layout = read_sparse_layout(root)
        if not isinstance(layout.sides["document"], SpladeSide):
            raise CheckpointError(
                f"{root} encodes documents with a static table; clearformer's SparseEncoder "
                "needs a masked-LM document side (it gives the vocabulary and the weights)"
            )
        # One runner per side; sides on one checkpoint with one pooling share its weights
        # (a query_length other than the document_length gives the query side its own
        # tokenizer, not a second copy of the model).
        runners: dict[object, SpladeRunner] = {}
        models: dict[tuple, SpladeRunner] = {}
        for side in layout.sides.values():
            if not isinstance(side, SpladeSide) or side in runners:
                continue
            twin = models.get((side.folder, side.splade))
            if twin is not None:
                runners[side] = twin.for_length(
                    side, max_length=max_length, padding_side=padding_side
                )
                continue
            runners[side] = models[side.folder, side.splade] = SpladeRunner.load(
                side,
                max_length=max_length,
                backend=backend,
                strict=strict,
                padding_side=padding_side,
            )
        vocab_size = runners[layout.sides["document"]].vocab_size
        sides = {
            task: runners[side] if side in runners else StaticRunner.load(side, vocab_size)
            for task, side in layout.sides.items()
        }
        if precision == "bf16":
            for runner in models.values():
                runner.hold_bf16()
        log.info("loaded sparse encoder %s (query: %s)", root, type(sides["query"]).__name__)
        return cls(layout, sides, precision)

    def _check_precision(self, precision: object) -> str:
        """A call's precision, canonical (None: the loaded one, else float32), or the error."""
        if precision is None or (precision == "auto" and self.precision is not None):
            return self.precision or "float32"
        precision = _canonical(precision)
        if self.precision is not None and precision != self.precision:
            raise ValueError(
                f"precision must be {self.precision!r}: this sparse encoder was loaded with "
                f"precision={self.precision!r} and holds that model alone; load it without "
                f"precision= to choose per call, got {precision!r}"
            )
        return precision

    @property
    def max_length(self) -> int:
        """Pieces a document is truncated to (the masked-LM side's limit)."""
        return self.sides["document"].max_length

    @property
    def pooling(self) -> str:
        """The head's name: ``"splade-max"``, ``"splade-sum"`` (``-log1p_relu`` for the double
        logarithm), prefixed ``"inference-free-"`` when queries are looked up in a table."""
        splade = self.sides["document"].splade
        name = f"splade-{splade.pooling}"
        if splade.activation != "relu":
            name += f"-{splade.activation}"
        return ("inference-free-" if self.sides["query"].static else "") + name

    @property
    def vocabulary(self) -> list[str]:
        """Token strings indexed by id (V of them; an id the tokenizer lacks is ``""``)."""
        if self._vocabulary is None:
            tokenizer = self.sides["document"].tokenizer.tokenizer
            words = [""] * self.vocab_size
            for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
                if 0 <= index < self.vocab_size:
                    words[index] = token
            self._vocabulary = words
        return self._vocabulary

    @property
    def identity(self):
        """The :class:`~clearformer.index.identity.ModelIdentity` of this model: the revision
        hashes every file that decides a weight, the Router's folders included."""
        from ..index.identity import ModelIdentity, checkpoint_revision

        revision = checkpoint_revision(self.path)  # a plain SPLADE directory: as a dense one's
        folders = sorted({runner.path for runner in self.sides.values()} - {self.path})
        if folders:  # a Router's: its folders' files too, each with its name
            digest = hashlib.sha256(revision.encode("ascii"))
            for folder in folders:
                digest.update(folder.relative_to(self.path).as_posix().encode("utf-8") + b"\0")
                digest.update(_folder_revision(folder).encode("ascii"))
            revision = digest.hexdigest()
        return ModelIdentity(
            name=self.path.name,
            revision=revision,
            pooling=self.pooling,
            normalize=False,
            width=int(self.vocab_size),
            max_length=int(self.max_length),
            path=str(self.path),
        )

    def encode_query(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        progress: bool | ProgressFn | None = None,
        max_active_dims: int | None = None,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        precision: str | None = None,
        workers: int | None = None,
    ) -> Tensor:
        """Queries -> (n, V) sparse weights; see :meth:`encode`."""
        return self.encode(
            texts,
            task="query",
            batch_size=batch_size,
            progress=progress,
            max_active_dims=max_active_dims,
            chunk_tokens=chunk_tokens,
            precision=precision,
            workers=workers,
        )

    def encode_document(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        progress: bool | ProgressFn | None = None,
        max_active_dims: int | None = None,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        precision: str | None = None,
        workers: int | None = None,
    ) -> Tensor:
        """Documents -> (n, V) sparse weights; see :meth:`encode`."""
        return self.encode(
            texts,
            task="document",
            batch_size=batch_size,
            progress=progress,
            max_active_dims=max_active_dims,
            chunk_tokens=chunk_tokens,
            precision=precision,
            workers=workers,
        )

    def encode(
        self,
        texts: list[str],
        *,
        task: str = "document",
        batch_size: int | None = None,
        progress: bool | ProgressFn | None = None,
        max_active_dims: int | None = None,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        precision: str | None = None,
        workers: int | None = None,
    ) -> Tensor:
        """Texts -> their SPLADE weights.

        Args:
            texts: the texts (a list of str).
            task: ``"query"`` or ``"document"``: the side that encodes them (an inference-free
                model looks queries up in its table) and the prompt put before them
                (sentence-transformers 6's rule: the ``"query"`` prompt for queries, the
                ``"document"`` prompt for documents, none where the model has no such prompt).
            batch_size: texts per forward pass; None = up to 4,096 tokens (padded count) per pass.
            progress: as :meth:`~clearformer.TextEncoder.encode`'s.
            max_active_dims: keep this many largest weights per text (None: the model's
                ``max_active_dims``, else every non-zero one); at least 1.
            chunk_tokens: tokens whose (chunk, V) logits exist at once: the memory peak of
                the pooling (:func:`clearformer.heads.splade.splade_pool`).
            precision: ``"float32"``, or ``"bf16"`` (``"bfloat16"``): the encoder and head in
                bfloat16 (norms, activation and pooling in float32); ``"auto"``: bf16 where
                this CPU's bfloat16 products pay (as for a dense model), else float32 (the
                loaded precision, if one was loaded); None = the precision
                the encoder was loaded in, else float32.
            workers: forward passes run side by side, each on a share of the CPU's threads
                (as :meth:`~clearformer.TextEncoder.encode`'s; None: two on a CPU with two
                threads or more and two batches or more). Speed only: a text's weights do not
                depend on its batch-mates.

        Returns:
            A coalesced ``torch.sparse_coo_tensor`` of shape (n, V), float32, only non-zero
            weights stored; row i for ``texts[i]``, whatever its batch-mates.
        """
        texts = check_texts(texts)
        check_choice(task, TASKS, "task")
        check_progress(progress)
        precision = self._check_precision(precision)
        k = self._check_max_active_dims(max_active_dims)
        check_batch_limits(batch_size, DEFAULT_MAX_TOKENS)
        check_workers(workers)
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")
        n = len(texts)
        prompt = self.prompt_for(task)
        if prompt:
            texts = [prompt + text for text in texts]
        runner = self.sides[task]
        encodings = runner.encode(texts)
        report = progress_reporter(progress, n)
        batches = plan_batches([len(e.ids) for e in encodings], batch_size)
        if workers is None:
            workers = auto_workers(len(batches), torch.device("cpu"))

        def entries(batch: list[int]) -> tuple[Tensor, Tensor, Tensor]:
            weights = runner.weights(
                [encodings[i] for i in batch], chunk_tokens=chunk_tokens, bf16=precision == "bf16"
            )  # (b, V)
            weights = keep_largest(weights, k)
            row, column = weights.nonzero(as_tuple=True)  # row-major: sorted per row
            return torch.tensor(batch, dtype=torch.long)[row], column, weights[row, column]

        rows, columns, values = [], [], []
        done = 0
        for batch, (row, column, value) in zip(
            batches, map_in_workers(entries, batches, workers), strict=True
        ):
            rows.append(row)
            columns.append(column)
            values.append(value)
            done += len(batch)
            report(done, n)
        if not rows:  # no texts
            rows = columns = [torch.zeros(0, dtype=torch.long)]
            values = [torch.zeros(0)]
        row, column, value = in_text_order(torch.cat(rows), torch.cat(columns), torch.cat(values))
        indices = torch.stack([row, column])  # (2, non-zero entries)
        # Valid and coalesced by construction (rows < n, columns < V, each row's columns
        # ascending and unique, rows ascending): the checks and the sort are skipped.
        shape = (n, self.vocab_size)
        return torch.sparse_coo_tensor(
            indices, value, shape, check_invariants=False, is_coalesced=True
        )

    def prompt_for(self, task: str) -> str | None:
        """The prompt sentence-transformers 6 puts before a ``task``'s texts (None: none).

        Its sparse encoder always holds a ``"query"`` and a ``"document"`` prompt (empty where
        the model's config names none), so ``encode_query`` takes the ``"query"`` one and
        ``encode_document`` the ``"document"`` one, never ``"passage"``, ``"corpus"`` or the
        default prompt (an empty prompt stops the fallback to the default)."""
        return self.prompts.prompts.get(task) or None

    def decode(
        self, vector: Tensor, top_k: int | None = None
    ) -> list[tuple[str, float]] | list[list[tuple[str, float]]]:
        """A vector's non-zero weights as (token, weight) pairs, largest first (the ``top_k``
        largest; None: all); for a (n, V) input, one such list per row.

        Raises:
            TypeError: ``vector`` is not a tensor. ValueError: not (V,) or (n, V), weights
            that are NaN or infinite, or a ``top_k`` that is not a positive int.
        """
        if not isinstance(vector, Tensor):
            raise TypeError(f"vector must be a torch.Tensor, got {type(vector).__name__}")
        if vector.dim() not in (1, 2) or vector.shape[-1] != self.vocab_size:
            raise ValueError(
                f"vector must have shape (V,) or (n, V) with V={self.vocab_size}, "
                f"got {tuple(vector.shape)}"
            )
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0
        ):
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
        # Any sparse layout (COO, as encode returns it; CSR, CSC, ...) reads as its dense rows.
        dense = vector if vector.layout == torch.strided else vector.to_dense()
        if not bool(torch.isfinite(dense).all()):
            raise ValueError("vector must hold finite weights, got NaN or infinity")
        words = self.vocabulary
        lists = []
        for row in dense.reshape(-1, self.vocab_size).float():  # (V,) each
            (ids,) = row.nonzero(as_tuple=True)
            weights = row[ids]
            order = torch.argsort(weights, descending=True, stable=True)[:top_k]
            pairs = zip(ids[order].tolist(), weights[order].tolist(), strict=True)
            lists.append([(words[i], w) for i, w in pairs])
        return lists[0] if vector.dim() == 1 else lists

    def _check_max_active_dims(self, value: int | None) -> int | None:
        if value is None:
            return self.max_active_dims
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"max_active_dims must be a positive int or None, got {value!r}")
        return value

    def __repr__(self) -> str:
        return (
            f"SparseEncoder(path={str(self.path)!r}, pooling={self.pooling!r}, "
            f"vocab_size={self.vocab_size}, max_active_dims={self.max_active_dims})"
        )


def in_text_order(row: Tensor, column: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The entries of the batches, which come in batch order (texts sorted by length), moved
    into text order: each text's entries are one run with ascending columns (``nonzero`` of
    its batch), so moving whole runs sorts them, without the sort of all entries that
    ``coalesce`` would make. ``row`` (M,) must hold each text's entries contiguously."""
    if row.numel() == 0:
        return row, column, value
    # Runs: where the row changes. run_row[r] is run r's text, run_start[r] its first entry.
    change = torch.ones(row.numel(), dtype=torch.bool)  # (M,)
    change[1:] = row[1:] != row[:-1]
    run_start = change.nonzero().squeeze(1)  # (R,)
    run_row = row[run_start]  # (R,)
    run_length = torch.diff(run_start, append=torch.tensor([row.numel()]))  # (R,)
    order = torch.argsort(run_row)  # (R,): the runs in text order (one run per text)
    length = run_length[order]
    # Entry j of the output is entry (its run's start + its place in the run) of the input.
    first = torch.cumsum(length, 0) - length  # (R,) where each run starts in the output
    offset = torch.repeat_interleave(run_start[order] - first, length)  # (M,)
    take = torch.arange(row.numel()) + offset  # (M,)
    return row[take], column[take], value[take]


def keep_largest(weights: Tensor, k: int | None) -> Tensor:
    """(B, V) -> the same with all but each row's ``k`` largest weights (by magnitude) zeroed,
    as sentence-transformers' ``select_max_active_dims``; None keeps all."""
    if k is None or k >= weights.shape[-1]:
        return weights
    _, top = torch.topk(weights.abs(), k, dim=-1)  # (B, k)
    kept = torch.zeros_like(weights)
    return kept.scatter_(-1, top, weights.gather(-1, top))


def _folder_revision(folder: Path) -> str:
    """SHA-256 over a Router folder's files (each with its name), as for a checkpoint."""
    from ..index.identity import file_sha256

    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(file.relative_to(folder).as_posix().encode("utf-8") + b"\0")
        digest.update(file_sha256(file).encode("ascii") + b"\n")
    return digest.hexdigest()
