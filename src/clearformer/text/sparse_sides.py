"""The two ways a :class:`~.sparse_encoder.SparseEncoder` turns a batch of texts into (B, V)
weights: a masked-LM encoder pooled by SPLADE, or a table of static weights (the query side of
an inference-free SPLADE model).

Each side tokenizes as sentence-transformers' module of that side does, and ``weights`` runs
one batch of its own encodings; :class:`~.sparse_encoder.SparseEncoder` batches, keeps the
largest weights and builds the sparse tensors.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path

import torch
from torch import Tensor, nn

from ..fast.reordered_weights import KeptReordering, use_reordered_weights
from ..heads.splade import DEFAULT_CHUNK_TOKENS, SpladeConfig, splade_pool
from ..interop.hf import CheckpointError, TextTokenizer, find_checkpoint
from ..interop.hf.masked_lm import LoadedMaskedLM, load_masked_lm
from ..interop.hf.sparse_modules import SpladeSide, StaticSide
from ..interop.hf.tokenizer import max_length_for
from ..interop.hf.weights import read_tensors
from ..routes import projection_route

log = logging.getLogger(__name__)

_UNBOUNDED = 10**6  # transformers' "no limit" model_max_length is far above this


class TiedProjection(nn.Module):
    """``x @ weight^T + bias``: a masked-LM head's vocabulary projection, whose (V, D) weight
    is the word-embedding table (or an untied decoder) and whose bias is the head's; a module
    of its own so that the projection route and the reordered weights can name it. It holds
    the tensors, it does not copy them."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.train(False)  # inference only: the fused routes serve modules in eval mode


class SpladeRunner:
    """A ``*ForMaskedLM`` checkpoint and its tokenizer, pooled by SPLADE.

    Attributes:
        loaded: the encoder and its masked-LM head (:class:`LoadedMaskedLM`).
        splade: pooling and activation.
        tokenizer: the checkpoint's, truncating at ``max_length`` (special tokens added).

    The weights (and their bfloat16 and reordered copies) live in a :class:`_SpladeModel`
    that :meth:`for_length` shares: a model whose query and document sides cut at different
    lengths holds them once.
    """

    static = False

    def __init__(
        self, model: _SpladeModel | LoadedMaskedLM, splade: SpladeConfig, tokenizer: TextTokenizer
    ):
        self.model = model if isinstance(model, _SpladeModel) else _SpladeModel(model)
        self.splade = splade
        self.tokenizer = tokenizer
        self.path: Path = self.model.loaded.loaded.files.path

    @classmethod
    def load(
        cls,
        side: SpladeSide,
        *,
        max_length: int | None,
        backend: str,
        strict: bool,
        padding_side: str | None,
    ) -> SpladeRunner:
        files = find_checkpoint(side.folder)
        # SPLADE checkpoints tie the decoder to the word embeddings, as a rule; one with a
        # decoder of its own decodes with it.
        loaded = load_masked_lm(files, backend=backend, strict=strict, untied=True)
        tokenizer = _tokenizer(loaded, side, max_length, padding_side)
        return cls(loaded, side.splade, tokenizer)

    def for_length(
        self, side: SpladeSide, *, max_length: int | None, padding_side: str | None
    ) -> SpladeRunner:
        """A runner of ``side`` (this one's checkpoint and pooling, another length) on this
        runner's weights: its own tokenizer, the same model and copies."""
        return SpladeRunner(
            self.model, self.splade, _tokenizer(self.loaded, side, max_length, padding_side)
        )

    @property
    def loaded(self) -> LoadedMaskedLM:
        return self.model.loaded

    @property
    def _reordering(self) -> KeptReordering:
        return self.model.reordering

    @property
    def vocab_size(self) -> int:
        return self.loaded.loaded.model.config.vocab_size

    @property
    def max_length(self) -> int:
        return self.tokenizer.max_length

    def encode(self, texts: list[str]) -> list:
        """``tokenizers.Encoding`` per text: special tokens added, truncated, unpadded."""
        return self.tokenizer.encode(texts)

    def weights(
        self, encodings: list, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, bf16: bool = False
    ) -> Tensor:
        """(B, V) float32 SPLADE weights of one batch.

        The batch is packed, never padded: ids of all texts one after the other with their
        boundaries (``cu_seqlens``), so the encoder and the head see real tokens only, and a
        text's weights do not depend on its batch-mates.
        """
        state = self.model
        loaded, projection = state.bf16_copy() if bf16 else (state.loaded, state.projection)
        model, head = loaded.loaded.model, loaded.head
        lengths = [len(e.ids) for e in encodings]
        ids = torch.tensor([i for e in encodings for i in e.ids], dtype=torch.long)  # (N,)
        types = torch.tensor([t for e in encodings for t in e.type_ids], dtype=torch.long)
        cu_seqlens = torch.zeros(len(encodings) + 1, dtype=torch.int32)  # (B + 1,)
        cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths), dim=0)
        packed = state.reordering.for_call(len(ids))

        def logits(chunk: Tensor) -> Tensor:  # (n, D) -> (n, V)
            h = head.transform(chunk)  # (n, D)
            route = projection_route(h, projection)
            if route.choice == "reordered":
                return route.impl(h, projection)
            return nn.functional.linear(h, projection.weight, projection.bias)

        with torch.inference_mode(), use_reordered_weights(packed):
            if ids.numel() == 0:  # only empty texts and no special tokens: nothing to pool
                return torch.zeros(len(encodings), self.vocab_size)
            rows = model(ids, None, types, cu_seqlens=cu_seqlens)  # (N, D)
            return splade_pool(
                rows, cu_seqlens, logits, self.splade, self.vocab_size, chunk_tokens=chunk_tokens
            )  # (B, V)

    def hold_bf16(self) -> None:
        """Keep the bfloat16 encoder and head alone: the float32 ones go (an encoder loaded
        with ``precision="bf16"``); every later call runs bfloat16, whatever it asks."""
        self.model.hold_bf16()


class _SpladeModel:
    """A SPLADE side's weights, shared by the runners of one checkpoint: the encoder and its
    head, their bfloat16 copy (made once, on the first bf16 call) and the reordered copy."""

    def __init__(self, loaded: LoadedMaskedLM) -> None:
        self.loaded = loaded
        self._bf16: LoadedMaskedLM | None = None
        self._bf16_lock = threading.Lock()  # server workers may ask for it at once
        # The encoder's weights and the vocabulary table in oneDNN's layout, once calls have
        # carried enough tokens to repay the copy: the table's product is the largest of a
        # SPLADE pass after the encoder's (tokens x D x V), and oneDNN's kernel reads a
        # reordered table faster than F.linear reads the plain one (docs/sparse.md).
        self.reordering = _kept_reordering(loaded)
        self.projection = TiedProjection(loaded.decoder_weight, loaded.head.bias)
        self._bf16_projection: TiedProjection | None = None  # made with the bfloat16 copy

    def hold_bf16(self) -> None:
        with self._bf16_lock:
            bf16 = self._make_bf16()
        self.loaded, self.projection = bf16, self._bf16_projection
        self.reordering = _kept_reordering(bf16)

    def bf16_copy(self) -> tuple[LoadedMaskedLM, TiedProjection]:
        """Encoder and head in bfloat16 (norms in float32), and their vocabulary projection,
        built once."""
        with self._bf16_lock:
            return self._make_bf16(), self._bf16_projection

    def _make_bf16(self) -> LoadedMaskedLM:
        if self._bf16 is None:
            from ..precision import bf16_copy

            # One copy of both, so the head's tied table stays the encoder's.
            pair = bf16_copy(torch.nn.ModuleList([self.loaded.loaded.model, self.loaded.head]))
            loaded = dataclasses.replace(self.loaded.loaded, model=pair[0])
            own = self.loaded.decoder
            decoder = None if own is None else own.to(torch.bfloat16)
            bf16 = LoadedMaskedLM(loaded, pair[1], decoder)
            self._bf16_projection = TiedProjection(bf16.decoder_weight, bf16.head.bias)
            self._bf16 = bf16
        return self._bf16


def _tokenizer(
    loaded: LoadedMaskedLM, side: SpladeSide, max_length: int | None, padding_side: str | None
) -> TextTokenizer:
    """``side``'s tokenizer: the caller's length first; then sentence-transformers' order,
    the task's own (query_length / document_length), then the checkpoint's max_seq_length."""
    files = loaded.loaded.files
    config = loaded.loaded.model.config
    length = max_length or side.max_length or max_length_for(files, config.max_length)
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    return TextTokenizer.from_files(
        files,
        min(length, config.max_length),
        pad_id,
        vocab_size=config.vocab_size,
        padding_side=padding_side,
    )


def _kept_reordering(loaded: LoadedMaskedLM) -> KeptReordering:
    """The encoder's weights and the vocabulary table in oneDNN's layout, once calls have
    carried enough tokens to repay the copy (the table counts in the copy's size)."""
    table = loaded.decoder_weight
    return KeptReordering(
        nn.ModuleList([loaded.loaded.model, loaded.head]),
        extra_bytes=table.numel() * table.element_size(),
    )


class StaticRunner:
    """sentence-transformers' ``SparseStaticEmbedding``: each token present in a text gets its
    vocabulary entry's weight, once however often it occurs; tokenized without special tokens
    and truncated at the tokenizer's ``model_max_length``, as that module does."""

    static = True

    def __init__(self, weight: Tensor, tokenizer, path: Path, max_length: int | None):
        self.weight = weight  # (V,) float32
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer
        self.path = path
        self.max_length = max_length

    @classmethod
    def load(cls, side: StaticSide, vocab_size: int) -> StaticRunner:
        from tokenizers import Tokenizer

        from ..interop.hf.files import read_json

        folder = side.folder
        weights = folder / "model.safetensors"
        if not weights.is_file():
            weights = folder / "pytorch_model.bin"
        if not weights.is_file() or not (folder / "tokenizer.json").is_file():
            raise CheckpointError(
                f"SparseStaticEmbedding {folder} is incomplete: it needs model.safetensors (or "
                "pytorch_model.bin) and tokenizer.json"
            )
        tensors = read_tensors(weights)
        weight = tensors.get("weight")
        if weight is None or weight.dim() != 1 or weight.shape[0] != vocab_size:
            got = None if weight is None else tuple(weight.shape)
            raise CheckpointError(
                f"{weights} must hold 'weight' of shape ({vocab_size},) (the vocabulary of the "
                f"document side), got {got}"
            )
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.no_padding()
        config_file = folder / "tokenizer_config.json"
        config = read_json(config_file, "tokenizer config") if config_file.is_file() else {}
        limit = config.get("model_max_length") if isinstance(config, dict) else None
        if isinstance(limit, int | float) and 0 < limit < _UNBOUNDED:
            tokenizer.enable_truncation(max_length=int(limit))
            limit = int(limit)
        else:
            tokenizer.no_truncation()
            limit = None
        return cls(weight.float(), tokenizer, folder, limit)

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def encode(self, texts: list[str]) -> list:
        return self.tokenizer.encode_batch(texts, add_special_tokens=False)

    def weights(self, encodings: list, **_) -> Tensor:
        """(B, V) float32: row b holds ``weight[t]`` for every token t of text b, else 0."""
        out = torch.zeros(len(encodings), self.vocab_size)  # (B, V)
        for row, encoding in enumerate(encodings):
            ids = torch.tensor(encoding.ids, dtype=torch.long)
            out[row, ids] = self.weight[ids]
        return out
