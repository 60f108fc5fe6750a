"""The models a server holds: each a ``TextEncoder`` (embeddings) or a ``CrossEncoder``
(rerank), or a ``SparseEncoder`` (:mod:`.sparse`, on ``/embed_sparse``), with the tokenizers
that enforce the server's input limit.

A checkpoint whose ``config.json`` names a ``*ForSequenceClassification`` architecture is
served as a cross-encoder on ``/rerank``; any other as an embedding model on ``/embed`` and
``/v1/embeddings``. Inputs are tokenized here, in the request's handler, so that a request is
checked against the limits (and refused) before it takes a place in the queue; the batch
workers then run :meth:`ServedModel.run` on the tokens, which is ``TextEncoder.embed_batch``
or ``CrossEncoder.score_batch``: the same code as ``encode`` and ``predict``.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..interop.hf import TextTokenizer, find_checkpoint
from ..interop.hf.bundled import BUNDLED_NAME
from ..interop.hf.tokenizer import check_room_for_specials, check_texts
from ..text.prompts import choose_prompt
from .errors import ApiError
from .prompt_cut import input_head, keep_prompts, prompt_tokens
from .render import tokens_body
from .schemas import DIRECTIONS, _shown

log = logging.getLogger(__name__)

KINDS = ("embed", "rerank", "sparse")
WARM_UP_TEXT = "A short text that runs every layer once before the first request."


@dataclass(frozen=True)
class ModelSpec:
    """A model to serve: a checkpoint directory (None: the bundled all-MiniLM-L6-v2) and the
    name requests select it by (None: the directory's name)."""

    path: str | None = None
    name: str | None = None

    @classmethod
    def parse(cls, value: str) -> ModelSpec:
        """``DIR`` or ``NAME=DIR`` (a directory whose own name holds ``=`` needs the second)."""
        name, sep, path = value.partition("=")
        if sep and name and path and not os.path.exists(value):
            return cls(path=path, name=name)
        return cls(path=value)


@dataclass(frozen=True)
class Prepared:
    """A request's inputs, tokenized and checked: what the batch workers run."""

    encodings: list  # tokenizers.Encoding per input, special tokens included, truncated
    options: Any  # what the batch runs with (ServedModel.run); requests share a batch only
    # when their options are equal

    @property
    def tokens(self) -> int:
        return sum(len(e.ids) for e in self.encodings)


@dataclass(frozen=True)
class EmbedOptions:
    normalize: bool
    skip: int = 0  # prompt tokens the pooling leaves out


class ServedModel:
    """One loaded model with its served name and input limit.

    Attributes:
        name: what requests select it by (``model``); ``aliases`` are accepted too.
        kind: ``"embed"`` or ``"rerank"``.
        model: the :class:`~clearformer.text.TextEncoder` or
            :class:`~clearformer.text.CrossEncoder`.
        max_input_tokens: tokens per input (per pair for rerank), special tokens included.
        precision: what its batches run in (``"float32"``, ``"bf16"``, or ``"int8"`` and
            ``"int8-blocks"`` for embedding models), decided once at load from the server's
            ``precision`` (``"auto"``: the model's :meth:`precision_for`, logged).
    """

    def __init__(
        self,
        name: str,
        model,
        kind: str,
        *,
        max_input_tokens: int,
        precision: str = "float32",
        aliases: tuple[str, ...] = (),
    ) -> None:
        if getattr(model.tokenizer, "template", None) is not None:
            # The server's own tokenizers truncate at its limit but know no chat template.
            raise ValueError(
                f"{model.path} is an LLM reranker laid out by a chat template, which clearformer "
                "serve does not run yet; use CrossEncoder.predict or clearformer rerank"
            )
        self.name = name
        self.aliases = aliases
        self.kind = kind
        self.model = model
        self.path: Path = model.path
        self.max_input_tokens = max_input_tokens
        if kind == "rerank" and precision == "int8":
            precision = "float32"  # int8 is for embeddings; load_model warned
        self.precision = model.precision_for(precision).choice
        base = model.tokenizer.tokenizer
        pad_id = model.tokenizer.pad_id
        pair = kind == "rerank"
        check_room_for_specials(base, max_input_tokens, pair=pair, name="max_input_tokens")
        # Copies of the checkpoint's tokenizer, truncating at the server's limit from either
        # end, and one that does not truncate (to count a refused input, and for /tokenize).
        self._tokenizers = {}
        for direction in DIRECTIONS:
            tokenizer = TextTokenizer(_copy(base), max_input_tokens, pad_id)
            tokenizer.tokenizer.enable_truncation(max_length=max_input_tokens, direction=direction)
            self._tokenizers[direction] = tokenizer
        self._full = _copy(base)
        self._full.no_padding()
        self._full.no_truncation()

    def serves(self, kind: str) -> bool:
        """Whether this model answers the routes of ``kind`` (``"embed"``, ``"rerank"``, ...)."""
        return kind == self.kind

    @property
    def normalize(self) -> bool:
        """Whether its embeddings are normalised by default (the checkpoint's pipeline)."""
        return self.model.normalize

    def check_dimensions(self, dimensions: int | None) -> None:
        """Refuse a Matryoshka cut the model does not offer (ValueError)."""
        self.model.head.check_dimensions(dimensions)

    @property
    def width(self) -> int:
        """Values per input in a result row: the embedding width, or the labels."""
        return self.model.dim if self.kind == "embed" else self.model.num_labels

    def prepare(
        self,
        texts: list[str],
        *,
        field: str,
        normalize: bool,
        truncate: bool = False,
        direction: str = "right",
        prompt_name: str | None = None,
    ) -> Prepared:
        """Tokenize texts to embed, with the checkpoint's prompt (``prompt_name``, or its
        default one) as ``encode`` applies it. An input over :attr:`max_input_tokens` is cut
        when ``truncate``, else a 413 naming it and the limit."""
        _check_unicode(texts, field)
        try:
            prompt, skip = self.model.resolve_prompt(None, prompt_name)
        except (TypeError, ValueError) as exc:
            raise ApiError("Validation", str(exc), param="prompt_name") from None
        if prompt is not None:
            texts = [prompt + text for text in texts]
        encodings = self._tokenizers[direction].encode(texts)
        if not truncate:
            self._refuse_long(encodings, lambda i: count_tokens(self._full, texts[i]), field)
        elif prompt is not None and direction == "left":
            encodings = keep_prompts(
                encodings,
                lambda i: self._full.encode(input_head(prompt, texts[i])),
                prompt_tokens(self._full, prompt),
            )
        return Prepared(encodings, EmbedOptions(normalize=normalize, skip=skip))

    def prepare_pairs(
        self,
        query: str,
        texts: list[str],
        *,
        activation: str,
        truncate: bool = False,
        direction: str = "right",
    ) -> Prepared:
        """Tokenize (query, text) pairs with the checkpoint's pair template and its default
        prompt before the query, as ``predict`` does; a pair over :attr:`max_input_tokens` is
        cut when ``truncate`` (the longer side first; the prompt kept), else a 413."""
        _check_unicode([query], "query")
        _check_unicode(texts, "texts")
        prompt = choose_prompt(self.model.prompts, None, None)
        first = query if prompt is None else prompt + query
        pairs = [(first, text) for text in texts]
        encodings = self._tokenizers[direction].encode_pairs(pairs)
        if not truncate:
            self._refuse_long_pair(encodings, pairs, prompt is not None)
        elif prompt is not None and direction == "left":
            encodings = keep_prompts(
                encodings,
                lambda i: self._full.encode(
                    input_head(prompt, pairs[i][0]), input_head("", pairs[i][1])
                ),
                prompt_tokens(self._full, prompt),
            )
        return Prepared(encodings, activation)

    def run(self, encodings: list, options: Any) -> np.ndarray:
        """One forward pass: (B, width) float32. Called by the batch workers."""
        if self.kind == "embed":
            return self.model.embed_batch(
                encodings,
                normalize=options.normalize,
                skip=options.skip,
                precision=self.precision,
            )
        return self.model.score_batch(encodings, activation=options, precision=self.precision)

    def warm_up(self) -> None:
        """Run one short input through the model (and build the int8 or bfloat16 one, if
        asked), so the first request pays no one-time cost. Float32 and bfloat16 weights are
        packed for oneDNN from here on, so every request takes the same products, the first
        as the thousandth."""
        if self.precision in ("float32", "bf16"):
            self.model.keep_weights_reordered()
        # Cut to the limit: a small model's may be shorter than the warm-up text.
        if self.kind == "embed":
            prepared = self.prepare([WARM_UP_TEXT], field="warm-up", normalize=True, truncate=True)
        else:
            prepared = self.prepare_pairs(
                WARM_UP_TEXT, [WARM_UP_TEXT], activation=self.model.activation, truncate=True
            )
        self.run(prepared.encodings, prepared.options)

    def tokenize(
        self,
        texts: list[str],
        *,
        add_special_tokens: bool,
        prompt_name: str | None,
        deadline: float | None = None,
        abandoned: threading.Event | None = None,
    ) -> bytes:
        """TEI's ``/tokenize`` answer, as JSON: per text, its tokens as ``{id, text, special,
        start, stop}``, untruncated; ``start``/``stop`` are character offsets into the text
        (with the prompt, if any), ``text`` the characters a token covers (a special token's
        own string, with null offsets). ``prompt_name`` is an embedding model's alone: any
        other model refuses it (422).

        Raises:
            TimeoutError: ``deadline`` (``time.monotonic()``) passed, or ``abandoned`` was
                set (the client has gone): nobody waits for the answer any more, and the
                work stops.
        """
        _check_unicode(texts, "inputs")
        if self.kind == "embed":
            try:
                prompt, _ = self.model.resolve_prompt(None, prompt_name)
            except (TypeError, ValueError) as exc:
                raise ApiError("Validation", str(exc), param="prompt_name") from None
            if prompt is not None:
                texts = [prompt + text for text in texts]
        elif prompt_name is not None:
            raise ApiError(
                "Validation",
                f"prompt_name must be left out for model {self.name!r}, a {self.kind} model: "
                f"it names an embedding model's prompt, got {_shown(prompt_name)}",
                param="prompt_name",
            )
        encodings = self._full.encode_batch(texts, add_special_tokens=add_special_tokens)
        return tokens_body(texts, encodings, deadline, abandoned)

    def info(self) -> dict:
        """What ``/info`` says of this model (TEI's ``model_type`` shape)."""
        if self.kind == "embed":
            model_type = {"embedding": {"pooling": self.model.pooling}}
        else:
            labels = list(self.model.labels) or [f"LABEL_{i}" for i in range(self.width)]
            classifier = {
                "id2label": {str(i): label for i, label in enumerate(labels)},
                "label2id": {label: i for i, label in enumerate(labels)},
            }
            model_type = {"reranker" if self.width == 1 else "classifier": classifier}
        return {
            "model_id": self.name,
            "model_path": str(self.path),
            "model_dtype": self.precision,
            "model_type": model_type,
            "max_input_length": self.max_input_tokens,
            "dimensions": self.width if self.kind == "embed" else None,
        }

    def _refuse_long(
        self,
        encodings: list,
        count,
        field: str,
        *,
        limit: int | None = None,
        task: str | None = None,
    ) -> None:
        """A 413 for the first input cut short, with its whole length (``count(i)``);
        ``limit`` and ``task`` as :meth:`_too_long`'s (a side's own limit, where it is shorter
        than the model's)."""
        for i, enc in enumerate(encodings):
            if enc.overflowing:
                raise self._too_long(i, count(i), field, limit=limit, task=task)

    def _refuse_long_pair(self, encodings: list, pairs: list, prompted: bool) -> None:
        """A 413 for the first pair cut short, naming the query where it alone is over the
        limit (no text would fit beside it), else the pair."""
        for i, enc in enumerate(encodings):
            if not enc.overflowing:
                continue
            limit = self.max_input_tokens
            send = f'send "truncate": true to cut the pair to {limit}'
            query = count_tokens(self._full, pairs[i][0])
            if query > limit:
                prompt = " with the model's prompt" if prompted else ""
                raise ApiError(
                    "TooLarge",
                    f"query has {query} tokens{prompt}, over the limit of {limit} tokens per "
                    f"(query, text) pair of model {self.name!r}, whatever the text; {send}",
                    param="query",
                )
            count = count_tokens(self._full, pairs[i])
            raise ApiError(
                "TooLarge",
                f"the pair (query, texts[{i}]) has {count} tokens, over the limit of {limit} "
                f"tokens per (query, text) pair of model {self.name!r}; {send}",
                param="texts",
            )

    def _too_long(
        self, i: int, count: int, field: str, *, limit: int | None = None, task: str | None = None
    ) -> ApiError:
        limit = self.max_input_tokens if limit is None else limit
        side = "" if task is None else f" for {task} inputs"
        return ApiError(
            "TooLarge",
            f"{field}[{i}] has {count} tokens, over the limit of {limit} tokens per input"
            f"{side} of model {self.name!r}; send "
            f'"truncate": true to cut it to {limit}',
            param=field,
        )


def load_model(
    spec: ModelSpec,
    *,
    max_input_tokens: int | None,
    precision: str,
    backend: str,
    device: str = "cpu",
):
    """Load ``spec`` as a :class:`ServedModel` (embedding or cross-encoder by its config), on
    ``device``.

    Raises:
        FileNotFoundError, CheckpointError: as ``TextEncoder.from_pretrained`` does.
        ValueError: ``max_input_tokens`` over what the model can take.
    """
    from ..text import CrossEncoder, TextEncoder

    files = find_checkpoint(spec.path)
    architectures = [str(a) for a in files.config.get("architectures") or []]
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        # int8 is for embeddings: a cross-encoder runs float32 (warned below), held alone too.
        held = "float32" if precision == "int8" else precision
        model = CrossEncoder.from_pretrained(
            files.path, backend=backend, precision=held, device=device
        )
        kind = "rerank"
    else:
        # The one precision the server runs it in, loaded alone: no float32 model beside it.
        model = TextEncoder.from_pretrained(
            files.path, backend=backend, precision=precision, device=device
        )
        kind = "embed"
    name = spec.name or (BUNDLED_NAME if spec.path is None else files.path.name)
    aliases = (f"sentence-transformers/{BUNDLED_NAME}",) if spec.path is None else ()
    limit = model.max_length
    if max_input_tokens is not None:
        if max_input_tokens > model.max_length:
            raise ValueError(
                f"max_input_tokens must be at most {model.max_length}, the limit of model "
                f"{name!r}, got {max_input_tokens}"
            )
        limit = max_input_tokens
    if kind == "rerank" and precision == "int8":
        log.warning("%s is a cross-encoder: it runs in float32 (int8 applies to embeddings)", name)
    return ServedModel(
        name, model, kind, max_input_tokens=limit, precision=precision, aliases=aliases
    )


def count_tokens(tokenizer, item, *, add_special_tokens: bool = True) -> int:
    """Tokens of one input (a text, or a (first, second) pair), untruncated by ``tokenizer``
    (a ``tokenizers.Tokenizer``). Through a batch call: tokenizers' single-input ``encode``
    holds the GIL for the whole text, about a second for a body near the size limit, which
    would stop every other request and ``/health`` meanwhile; its batch calls release it."""
    batch = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    (encoding,) = batch([item], add_special_tokens=add_special_tokens)
    return len(encoding.ids)


def _copy(tokenizer):
    """A copy of a ``tokenizers.Tokenizer``, to reconfigure: changing the model's own would
    change what ``encode`` does."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer.to_str())


def _check_unicode(texts: list[str], field: str) -> None:
    try:
        check_texts(texts, field)
    except (TypeError, ValueError) as exc:
        raise ApiError("Validation", str(exc), param=field) from None
