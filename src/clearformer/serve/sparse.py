"""Sparse (SPLADE) models in the server: text-embeddings-inference's ``POST /embed_sparse``.

A directory that :func:`clearformer.retrieval.model_kind` calls ``"sparse"`` is served by a
:class:`SparseServedModel` around a :class:`~clearformer.SparseEncoder`, on the same batching
batcher as the embedding models: inputs are tokenized (and refused past the limit) in the
request's handler, batched with other requests' inputs of the same task, and each batch runs
the encoder's own ``weights`` (packed rows, chunked pooling), so a row is ``encode_document``'s
(or ``encode_query``'s) row for the same text.

The body is TEI's: ``{"inputs": "text" | ["text", ...], "truncate": false,
"truncation_direction": "right", "model": ...}``, and beyond TEI's, ``"task": "query"`` for
the query side of an inference-free model (default ``"document"``: the SPLADE side, TEI's only
one). The task picks the prompt: TEI's ``prompt_name`` is refused (422). The answer: per
input, its non-zero weights as ``[{"index": i, "value": v}, ...]`` in index order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..interop.hf.tokenizer import check_room_for_specials
from .errors import ApiError
from .models import Prepared, ServedModel, _check_unicode, _copy, count_tokens
from .prompt_cut import input_head, keep_prompts, prompt_tokens
from .render import check_finite, json_body
from .schemas import DIRECTIONS, _direction, _flag, _object, _optional, _shown, _texts

log = logging.getLogger(__name__)

TASKS = ("query", "document")


@dataclass(frozen=True)
class SparseOptions:
    """What a batch of sparse inputs runs with (requests share a batch only when equal)."""

    task: str = "document"


@dataclass(frozen=True)
class EmbedSparseRequest:
    """``POST /embed_sparse`` (TEI)."""

    inputs: list[str]
    model: str | None = None
    truncate: bool | None = None  # None: not sent (as EmbedRequest.truncate)
    direction: str = "right"
    task: str = "document"


def parse_embed_sparse(body) -> EmbedSparseRequest:
    body = _object(body)
    if body.get("prompt_name") is not None:
        # TEI's body has it; here the task picks a sparse model's prompt, and a name taken
        # without being applied would give other weights than the client asked for.
        raise ApiError(
            "Validation",
            "prompt_name must be left out on /embed_sparse, where task ('query' or "
            f"'document') picks the model's prompt, got {_shown(body['prompt_name'])}",
            param="prompt_name",
        )
    task = _optional(body, "task", str, "a string")
    task = "document" if task is None else task  # an empty string is not a task
    if task not in TASKS:
        raise ApiError(
            "Validation", f"task must be one of {list(TASKS)}, got {_shown(task)}", param="task"
        )
    return EmbedSparseRequest(
        inputs=_texts(body, "inputs"),
        model=_optional(body, "model", str, "a string"),
        truncate=_flag(body, "truncate", None),
        direction=_direction(body),
        task=task,
    )


class SparseServedModel(ServedModel):
    """A :class:`~clearformer.SparseEncoder` with its served name and input limit.

    ``kind`` is ``"sparse"``; ``width`` the vocabulary size; ``precision`` ``"float32"`` or
    ``"bf16"`` (``"int8"`` runs float32: the sparse encoder offers no int8; :func:`load_sparse`
    decides ``"auto"`` among the two).
    """

    def __init__(
        self,
        name: str,
        model,
        *,
        max_input_tokens: int,
        precision: str = "float32",
        aliases: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.aliases = aliases
        self.kind = "sparse"
        self.model = model
        self.path = model.path
        self.max_input_tokens = max_input_tokens
        self.precision = "bf16" if precision == "bf16" else "float32"
        if precision not in ("float32", "bf16"):
            log.warning("%s is a sparse model: it runs in float32 (not %s)", name, precision)
        # Per task and direction, a copy of that side's tokenizer truncating at the task's
        # limit; and untruncated ones, to count a refused input (and for /tokenize: the
        # document side). A side may cut shorter than the server's limit (a SPLADE model's
        # query_length, an inference-free table's model_max_length): encode_query cuts there.
        self._tokenizers, self._untruncated, self._specials, self._limits = {}, {}, {}, {}
        for task in TASKS:
            side = model.sides[task]
            base = side.tokenizer if side.static else side.tokenizer.tokenizer
            self._specials[task] = not side.static  # a static table runs without them
            own = side.max_length
            limit = max_input_tokens if own is None else min(own, max_input_tokens)
            if not side.static:
                check_room_for_specials(base, limit, pair=False, name="max_input_tokens")
            self._limits[task] = limit
            for direction in DIRECTIONS:
                tokenizer = _copy(base)
                tokenizer.no_padding()
                tokenizer.enable_truncation(max_length=limit, direction=direction)
                self._tokenizers[task, direction] = tokenizer
            full = _copy(base)
            full.no_padding()
            full.no_truncation()
            self._untruncated[task] = full
        self._full = self._untruncated["document"]

    @property
    def width(self) -> int:
        return self.model.vocab_size

    def prepare_sparse(
        self, texts: list[str], *, task: str, truncate: bool = False, direction: str = "right"
    ) -> Prepared:
        """Tokenize texts for ``task`` with its prompt, as ``encode`` does; an input over the
        task's limit (:attr:`max_input_tokens`, or its side's own if shorter) is cut when
        ``truncate``, else a 413 naming it."""
        _check_unicode(texts, "inputs")
        prompt = self.model.prompt_for(task)
        if prompt:
            texts = [prompt + text for text in texts]
        specials = self._specials[task]
        encodings = self._tokenizers[task, direction].encode_batch(
            texts, add_special_tokens=specials
        )
        full = self._untruncated[task]
        if not truncate:
            self._refuse_long(
                encodings,
                lambda i: count_tokens(full, texts[i], add_special_tokens=specials),
                "inputs",
                limit=self._limits[task],
                task=task,
            )
        elif prompt and direction == "left":
            encodings = keep_prompts(
                encodings,
                lambda i: full.encode(input_head(prompt, texts[i]), add_special_tokens=specials),
                prompt_tokens(full, prompt, add_special_tokens=specials),
            )
        return Prepared(encodings, SparseOptions(task))

    def run(self, encodings: list, options: SparseOptions) -> np.ndarray:
        """One batch: (B, V) float32 weights, the model's ``max_active_dims`` applied."""
        from ..text.sparse_encoder import keep_largest

        side = self.model.sides[options.task]
        weights = side.weights(encodings, bf16=self.precision == "bf16")  # (B, V)
        return keep_largest(weights, self.model.max_active_dims).numpy()

    def warm_up(self) -> None:
        from .models import WARM_UP_TEXT

        for task in TASKS:
            prepared = self.prepare_sparse([WARM_UP_TEXT], task=task, truncate=True)
            self.run(prepared.encodings, prepared.options)

    def info(self) -> dict:
        return {
            "model_id": self.name,
            "model_path": str(self.path),
            "model_dtype": self.precision,
            "model_type": {"embedding": {"pooling": self.model.pooling}},
            "max_input_length": self.max_input_tokens,
            "dimensions": self.width,
        }


def load_sparse(spec, *, max_input_tokens: int | None, precision: str, backend: str):
    """A :class:`SparseServedModel` of the SparseEncoder directory ``spec.path``."""
    from ..text.sparse_encoder import SparseEncoder

    # The one precision the server runs it in, held alone (bf16: no float32 weights kept);
    # auto decided by the encoder among the two it has, as encode decides it.
    held = precision if precision in ("bf16", "auto") else "float32"
    model = SparseEncoder.from_pretrained(spec.path, backend=backend, precision=held)
    precision = model.precision if precision == "auto" else precision
    name = spec.name or model.path.name
    limit = model.max_length
    if max_input_tokens is not None:
        if max_input_tokens > model.max_length:
            raise ValueError(
                f"max_input_tokens must be at most {model.max_length}, the limit of model "
                f"{name!r}, got {max_input_tokens}"
            )
        limit = max_input_tokens
    return SparseServedModel(name, model, max_input_tokens=limit, precision=precision)


def sparse_rows_body(rows: np.ndarray) -> bytes:
    """TEI's ``/embed_sparse`` answer: per row, its non-zero entries in index order.

    Raises:
        ApiError: a weight is NaN or infinity, which JSON cannot write (500).
    """
    check_finite(rows)
    out = []
    for row in rows:
        (indices,) = np.nonzero(row)
        out.append([{"index": int(i), "value": float(row[i])} for i in indices])
    return json_body(out)
