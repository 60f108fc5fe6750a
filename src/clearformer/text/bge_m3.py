"""``BGEM3Encoder``: bge-m3's three embeddings of a text from one forward pass.

bge-m3 (FlagEmbedding) is an XLM-R backbone with two small heads saved beside it, and reads
its last hidden states three ways (FlagEmbedding's ``BGEM3FlagModel``):

* dense: the first token's state ([CLS], ``<s>``), L2-normalised: ``(B, D)``;
* sparse: ``relu(sparse_linear(h_t))`` for every token t (``sparse_linear``: D -> 1); a token
  id's weight is the largest over that id's occurrences in the text; the special tokens (cls,
  eos, pad, unk) weigh nothing: ``(B, vocab)``, only the non-zero weights stored;
* ColBERT: ``colbert_linear(h_t)`` (D -> D, or another width FlagEmbedding's ``colbert_dim``
  chose) for every real token after the first, each
  L2-normalised: ``(tokens_i, D)`` per text.

The heads are ``sparse_linear.pt`` and ``colbert_linear.pt`` (a state dict ``weight``,
``bias``), read with ``torch.load(weights_only=True)``, which refuses a pickle that would run
code; ``.safetensors`` files of the same names are read first where present.

:meth:`BGEM3Encoder.as_dense`, :meth:`~BGEM3Encoder.as_sparse` and
:meth:`~BGEM3Encoder.as_multivector` are the same model seen as one kind, so an index or a
server can take a bge-m3 directory for any of the three.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_int
from ..fast.reordered_weights import KeptReordering, use_reordered_weights
from ..index.identity import ModelIdentity, checkpoint_revision
from ..interop.hf import TextTokenizer, find_checkpoint
from ..interop.hf.files import CheckpointError, resolve_path
from ..interop.hf.tokenizer import check_texts, max_length_for
from ..interop.hf.vocab_files import token_text
from ..interop.hf.weights import read_tensors
from ..model_kinds import model_kind
from ..options import Decision
from .backbone_precision import BackbonePrecision, load_backbone
from .batching import check_batch_limits, default_max_tokens, plan_batches
from .bge_m3_views import DenseView, MultiVectorView, SparseView
from .multivector_files import BGE_M3_HEADS, kind_error
from .progress import ProgressFn, check_progress, progress_reporter
from .token_states import TokenRow, pad_rows, token_states
from .workers import auto_workers, check_workers, map_in_workers

log = logging.getLogger(__name__)

# The tokens FlagEmbedding gives no sparse weight: tokenizer_config.json key -> XLM-R's text.
_UNUSED_TOKENS = {
    "cls_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
}


@dataclass
class BGEM3Output:
    """The embeddings one :meth:`BGEM3Encoder.encode` call asked for (None: not asked).

    Attributes:
        dense: (B, D) float32, unit rows.
        sparse: coalesced ``torch.sparse_coo_tensor`` (B, vocab_size) float32, the non-zero
            weights only.
        colbert: B float32 tensors (tokens_i, colbert_dim), unit rows.
    """

    dense: Tensor | None
    sparse: Tensor | None
    colbert: list[Tensor] | None


def load_head(root: Path, name: str) -> dict[str, Tensor]:
    """``name``'s state dict: ``name.safetensors`` if present, else ``name.pt`` through
    ``torch.load(weights_only=True)``.

    Raises:
        CheckpointError: a missing file, or a ``.pt`` file that is not plain tensors (a pickle
            that would build other objects or run code), in one line naming the file.
    """
    safetensors = root / f"{name}.safetensors"
    if safetensors.is_file():
        return read_tensors(safetensors)
    file = root / f"{name}.pt"
    if not file.is_file():
        raise CheckpointError(f"bge-m3 directory {root} lacks its head file {name}.pt")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        # torch's message is long and ends in advice to load with weights_only=False: keep
        # only its reason (the global it refused, say).
        # "Unsupported global: GLOBAL io.open was not an allowed global", or for a blocked
        # module's global "unsupported GLOBAL posix.system whose module posix is blocked".
        found = re.search(r"unsupported global[^\n]*", str(exc), re.IGNORECASE)
        reason = found.group(0).split(" was not")[0] if found else type(exc).__name__
        raise CheckpointError(
            f"{file} is not a plain tensor file: torch.load(weights_only=True) refused it "
            f"({reason[:200]}); clearformer does not run code from checkpoint files"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(
            f"{file} must hold a state dict of tensors, got {type(state).__name__}"
        )
    return state


def _linear(root: Path, name: str, d_model: int, out_features: int | None) -> nn.Linear:
    """The head ``name`` as an ``nn.Linear`` from width ``d_model`` (to ``out_features``, or
    whatever its weight says when None), its tensors' names and shapes checked."""
    state = load_head(root, name)
    weight = state.get("weight")
    width = (
        out_features
        if out_features is not None
        else (weight.shape[0] if isinstance(weight, Tensor) and weight.dim() == 2 else -1)
    )
    expected = {"weight": (width, d_model), "bias": (width,)}
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    if shapes != expected:
        raise CheckpointError(
            f"{root / name}: the head must hold weight {expected['weight']} and bias "
            f"{expected['bias']} (hidden width {d_model}), got {shapes}"
        )
    layer = nn.Linear(d_model, width)
    layer.load_state_dict({k: v.float() for k, v in state.items()})
    return layer.eval()


class BGEM3Encoder:
    """bge-m3: dense, sparse and ColBERT embeddings from one pass of its backbone.

    Attributes:
        kind: ``"bge-m3"``.
        model: the backbone :class:`~clearformer.EncoderModel`, in eval mode (bfloat16 when
            loaded with ``precision="bf16"``; the heads stay float32).
        precision: the precision it was loaded in (None: float32, bf16 on request).
        sparse_linear: the D -> 1 head of the token weights.
        colbert_linear: the head of the token vectors (D -> D in bge-m3).
        unused_ids: the token ids with no sparse weight (cls, eos, pad, unk).
        max_length: texts are cut to this many tokens, special tokens included.
        path: the directory.
    """

    kind = "bge-m3"

    def __init__(
        self,
        loaded,
        tokenizer: TextTokenizer,
        sparse_linear,
        colbert_linear,
        unused,
        held: Decision | None = None,
        held_as: str | None = None,
    ):
        self._loaded = loaded
        self.model = loaded.model
        self._backbone = BackbonePrecision(self.model, held, held_as)
        self.precision = self._backbone.held
        self.tokenizer = tokenizer
        self.sparse_linear = sparse_linear
        self.colbert_linear = colbert_linear
        self.unused_ids = frozenset(unused)
        self.max_length = tokenizer.max_length
        self.path: Path = loaded.files.path
        self._reordering = KeptReordering(self.model)

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, max_length: int | None = None, precision: str | None = None
    ):
        """Load a bge-m3 directory (the backbone, its tokenizer, ``sparse_linear.pt`` and
        ``colbert_linear.pt``).

        Args:
            max_length: cut texts to this many tokens; None = the directory's (its
                sentence-transformers ``max_seq_length`` or the tokenizer's limit).
            precision: None = the float32 backbone, and a call may ask for bf16 (a bfloat16
                copy is then built and kept); ``"float32"``, ``"bf16"`` or ``"auto"``
                (decided now): that precision's backbone alone, read from the file in it, and a
                call asking for the other is refused. The heads run in float32 either way
                (:mod:`.backbone_precision`).

        Raises:
            FileNotFoundError: no such directory.
            CheckpointError: a directory of another kind (naming the class that loads it), a
                head file that is not plain tensors or does not fit the backbone.
        """
        check_int(max_length, "max_length", low=2, optional=True)
        if precision is not None:  # a bad name before any file is read
            BackbonePrecision.check_name(precision)
        root = resolve_path(path)
        kind = model_kind(root) if root.is_dir() else "bge-m3"
        if kind != "bge-m3":
            raise kind_error(root, kind, "BGEM3Encoder")
        files = find_checkpoint(root)
        loaded, held, held_as = load_backbone(files, precision)
        config = loaded.model.config
        sparse_linear = _linear(root, "sparse_linear", config.d_model, 1)
        colbert_linear = _linear(root, "colbert_linear", config.d_model, None)
        limit = max_length_for(files, config.max_length)
        if max_length is not None:
            limit = min(limit, max_length)
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        tokenizer = TextTokenizer.from_files(files, limit, pad_id, vocab_size=config.vocab_size)
        unused = set()
        for key, default in _UNUSED_TOKENS.items():
            found = tokenizer.tokenizer.token_to_id(
                token_text(files.tokenizer_config.get(key), default)
            )
            if found is not None:
                unused.add(found)
        unused.add(pad_id)
        log.info(
            "loaded bge-m3 %s (width %d, vocabulary %d)", root, config.d_model, config.vocab_size
        )
        return cls(loaded, tokenizer, sparse_linear, colbert_linear, unused, held, held_as)

    @property
    def dim(self) -> int:
        """Width D of the dense and ColBERT vectors."""
        return self.model.config.d_model

    @property
    def colbert_dim(self) -> int:
        """Width of the ColBERT token vectors: ``colbert_linear``'s outputs (D in bge-m3;
        FlagEmbedding's ``colbert_dim`` may choose another)."""
        return self.colbert_linear.out_features

    @property
    def vocab_size(self) -> int:
        """Width of the sparse vectors."""
        return self.model.config.vocab_size

    def identity_for(self, pooling: str, width: int, normalize: bool) -> ModelIdentity:
        """The :class:`~clearformer.index.identity.ModelIdentity` of one of the three outputs
        (the head files are part of the revision)."""
        heads = [
            f"{head}{ext}"
            for head in BGE_M3_HEADS
            for ext in (".safetensors", ".pt")
            if (self.path / f"{head}{ext}").is_file()
        ]
        return ModelIdentity(
            name=self.path.name,
            revision=checkpoint_revision(self.path, extra=heads),
            pooling=pooling,
            normalize=normalize,
            width=width,
            max_length=self.max_length,
            path=str(self.path.resolve()),
        )

    @property
    def identity(self) -> ModelIdentity:
        """The model's identity as a whole (``pooling="bge-m3"``, width D)."""
        return self.identity_for("bge-m3", self.dim, True)

    def encode(
        self,
        texts: list[str],
        *,
        dense: bool = True,
        sparse: bool = True,
        colbert: bool = True,
        batch_size: int | None = None,
        progress: bool | ProgressFn | None = None,
        precision: str | None = None,
        max_tokens: int | None = None,
        workers: int | None = None,
    ) -> BGEM3Output:
        """The embeddings asked for, from one forward pass per batch (see the module
        docstring for each). A text's embeddings do not depend on its batch-mates.
        ``precision``: the backbone's, ``"float32"``, ``"bf16"`` (``"bfloat16"``) or
        ``"auto"``; None = the one it was loaded in, else float32. ``max_tokens`` and
        ``workers``: as :meth:`clearformer.TextEncoder.encode` takes them (speed and memory,
        never the result)."""
        texts = check_texts(texts)
        precision = self._backbone.check(precision)  # before any work
        for flag, name in ((dense, "dense"), (sparse, "sparse"), (colbert, "colbert")):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        check_progress(progress)
        check_workers(workers)
        max_tokens = default_max_tokens("float32") if max_tokens is None else max_tokens
        check_batch_limits(batch_size, max_tokens)
        n = len(texts)
        rows = self.token_rows(texts)
        dense_out = torch.zeros(n, self.dim) if dense else None
        weights: list[tuple[Tensor, Tensor]] = [None] * n  # type: ignore[list-item]
        vectors: list[Tensor] = [None] * n  # type: ignore[list-item]
        if n:
            tokens = sum(len(r) for r in rows)
            log.info("bge-m3 encode: %d texts, %d tokens", n, tokens)
            batches = plan_batches([len(r) for r in rows], batch_size, max_tokens)
            if workers is None:
                workers = auto_workers(len(batches), next(self.model.parameters()).device)
            packed = self._reordering.for_call(tokens)
            report = progress_reporter(progress, n)
            model = self._backbone.model_for(precision)

            def run(indices: list[int]):
                picked = [rows[i] for i in indices]
                return indices, self._embed(picked, dense, sparse, colbert, model, packed)

            done = 0
            for indices, (d, s, c) in map_in_workers(run, batches, workers):
                for j, i in enumerate(indices):
                    if dense:
                        dense_out[i] = d[j]
                    if sparse:
                        weights[i] = s[j]
                    if colbert:
                        vectors[i] = c[j]
                done += len(indices)
                report(done, n)
        return BGEM3Output(
            dense=dense_out,
            sparse=self._sparse_matrix(weights) if sparse else None,
            colbert=vectors if colbert else None,
        )

    def token_rows(self, texts: list[str]) -> list[TokenRow]:
        """Each text's tokens, cut to :attr:`max_length`."""
        return [TokenRow(e.ids, e.type_ids) for e in self.tokenizer.encode(texts)]

    def embed_rows(
        self,
        rows: list[TokenRow],
        dense: bool,
        sparse: bool,
        colbert: bool,
        *,
        packed=None,
        precision: str | None = None,
    ):
        """One forward pass over ``rows`` (:meth:`token_rows`), as :meth:`encode` runs each
        batch: (dense (B, D) | None, per row (token ids, weights) | None, per row (tokens_i, D)
        | None), the backbone in ``precision`` (as for :meth:`encode`). For callers that form
        their own batches (``clearformer serve``)."""
        model = self._backbone.model_for(precision)
        return self._embed(rows, dense, sparse, colbert, model, packed)

    def precision_for(self, precision: str | None = "auto") -> Decision:
        """The precision a call asking for ``precision`` runs in here, and why."""
        return self._backbone.decide(precision)

    def _embed(self, rows: list[TokenRow], dense, sparse, colbert, model, packed):
        batch = pad_rows(rows, self.tokenizer.pad_id)
        with torch.inference_mode(), use_reordered_weights(packed):
            hidden = token_states(model, batch).float()  # (B, T, D)
            d = F.normalize(hidden[:, 0], p=2.0, dim=-1) if dense else None  # (B, D)
            s = self._token_weights(hidden, batch) if sparse else None
            c = self._colbert(hidden, batch.tokens) if colbert else None
        return (
            None if d is None else d.clone(),
            None if s is None else [(ids.clone(), w.clone()) for ids, w in s],
            None if c is None else [v.clone() for v in c],
        )

    def _token_weights(self, hidden: Tensor, batch) -> list[tuple[Tensor, Tensor]]:
        """Per row: (ids, weights) of its distinct token ids with a positive weight."""
        weights = torch.relu(self.sparse_linear(hidden)).squeeze(-1)  # (B, T)
        unused = torch.tensor(sorted(self.unused_ids), dtype=torch.int64)
        keep = batch.tokens & ~torch.isin(batch.input_ids, unused)  # (B, T)
        out = []
        for b in range(hidden.shape[0]):
            ids = batch.input_ids[b][keep[b]]  # (n,)
            distinct, where = torch.unique(ids, return_inverse=True)  # (u,), (n,)
            # An id that occurs several times weighs its largest occurrence (FlagEmbedding).
            best = torch.zeros(distinct.shape[0]).scatter_reduce(
                0, where, weights[b][keep[b]], reduce="amax", include_self=False
            )  # (u,)
            positive = best > 0
            out.append((distinct[positive], best[positive]))
        return out

    def _colbert(self, hidden: Tensor, tokens: Tensor) -> list[Tensor]:
        """Per row: its real tokens after the first, projected and normalised."""
        keep = tokens.clone()
        keep[:, 0] = False  # [CLS] is the dense vector's, not a ColBERT one
        vectors = F.normalize(self.colbert_linear(hidden[keep]), p=2.0, dim=-1)  # (N, D)
        return list(vectors.split(keep.sum(dim=1).tolist()))

    def _sparse_matrix(self, rows: list[tuple[Tensor, Tensor]]) -> Tensor:
        """(B, vocab) coalesced COO of each row's (ids, weights)."""
        row_index = torch.cat(
            [torch.full((ids.shape[0],), b, dtype=torch.int64) for b, (ids, _) in enumerate(rows)]
            or [torch.zeros(0, dtype=torch.int64)]
        )
        columns = torch.cat([ids for ids, _ in rows] or [torch.zeros(0, dtype=torch.int64)])
        values = torch.cat([w for _, w in rows] or [torch.zeros(0)])
        indices = torch.stack([row_index, columns])  # (2, nnz)
        shape = (len(rows), self.vocab_size)
        return torch.sparse_coo_tensor(
            indices, values.float(), shape, check_invariants=False
        ).coalesce()

    def as_dense(self) -> DenseView:
        """This model as a dense encoder (CLS, normalised)."""
        return DenseView(self)

    def as_sparse(self) -> SparseView:
        """This model as a sparse encoder (its token weights)."""
        return SparseView(self)

    def as_multivector(self) -> MultiVectorView:
        """This model as a multi-vector encoder (its ColBERT vectors, MaxSim)."""
        return MultiVectorView(self)

    def __repr__(self) -> str:
        return (
            f"BGEM3Encoder(path={str(self.path)!r}, dim={self.dim}, max_length={self.max_length})"
        )
