"""Served models whose answer is not one row per input: a multi-vector model (ColBERT: a
vector per token, ``/embed_multivector``) and bge-m3 (dense on ``/embed``, its token weights on
``/embed_sparse``, its ColBERT vectors on ``/embed_multivector``).

They share the batch batcher with the other models: a batch's answer is a ``(B, 1)`` object
array, one payload per input (a text's token vectors, or its token weights), which the batcher
hands back in input order as it does rows. Inputs are tokenized in the handler as the model
does it (each side's length for a multi-vector model, the model's length for bge-m3: these
models cut texts themselves, as ``encode_query`` / ``encode_document`` do).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..devices import check_device
from ..model_kinds import model_kind
from ..precision.names import is_int8
from .errors import ApiError
from .models import Prepared, ServedModel, _check_unicode, _copy, count_tokens, load_model
from .sparse import load_sparse

log = logging.getLogger(__name__)

WARM_UP_TEXT = "A short text that runs every layer once before the first request."
# The routes each kind answers, by the kind's name in ServerState.model_for.
SERVES = {
    "multivector": frozenset({"multivector"}),
    "bge-m3": frozenset({"embed", "sparse", "multivector"}),
}


@dataclass(frozen=True)
class TokenOptions:
    """What a batch computes: ``output`` ``"dense"``, ``"sparse"`` or ``"colbert"``; ``side``
    ``"query"`` or ``"document"`` (a multi-vector model encodes them differently)."""

    output: str
    side: str = "document"


class TokenVectorModel(ServedModel):
    """A :class:`~clearformer.MultiVectorEncoder` or :class:`~clearformer.BGEM3Encoder`
    served (``kind`` ``"multivector"`` or ``"bge-m3"``)."""

    def __init__(self, name: str, model, *, aliases: tuple[str, ...] = ()) -> None:
        self.name = name
        self.aliases = aliases
        self.kind = model.kind
        self.model = model
        self.path = model.path
        self.max_input_tokens = model.max_length
        self.precision = model.precision or "float32"  # loaded in the server's precision
        tokenizer = model.tokenizer if self.kind == "bge-m3" else model.tokenizer_for("document")
        self._full = _copy(tokenizer.tokenizer)
        self._full.no_padding()
        self._full.no_truncation()

    def serves(self, kind: str) -> bool:
        return kind in SERVES[self.kind]

    @property
    def normalize(self) -> bool:
        return True  # bge-m3's dense vectors are unit vectors

    @property
    def width(self) -> int:
        return self.model.dim

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is not None and dimensions != self.width:
            raise ValueError(f"bge-m3 dense embeddings are {self.width} wide, not cut")

    def prepare(
        self, texts, *, field, normalize, truncate=None, direction="right", prompt_name=None
    ):
        """``/embed`` on bge-m3: its dense vectors (no prompts: bge-m3 has none). They are
        unit vectors, as ``encode`` gives them: ``normalize`` false is refused (422)."""
        if prompt_name is not None:
            raise ApiError("Validation", "bge-m3 has no named prompts", param="prompt_name")
        if not normalize:
            raise ApiError(
                "Validation",
                f"normalize must be true for model {self.name!r}: bge-m3's dense vectors are "
                "unit vectors (its encode gives no others), got false",
                param="normalize",
            )
        return self.prepare_tokens(
            texts,
            output="dense",
            side="document",
            field=field,
            truncate=truncate,
            direction=direction,
        )

    def prepare_tokens(
        self,
        texts: list[str],
        *,
        output: str,
        side: str,
        field: str,
        truncate: bool | None = None,
        direction: str = "right",
    ) -> Prepared:
        """Inputs of ``/embed_multivector`` (``output="colbert"``), ``/embed_sparse`` or
        ``/embed`` (``"dense"``). Both kinds cut a too-long text at its end, as ``encode``
        does (a multi-vector model at its ``side``'s length): ``truncate`` false (sent)
        refuses it instead (413), and a cut at the start is refused (422)."""
        _check_unicode(texts, field)
        if direction != "right":
            raise ApiError(
                "Validation",
                f"truncation_direction must be 'right' for model {self.name!r}, which cuts a "
                f"too-long text at its end as its encode does, got {direction!r}",
                param="truncation_direction",
            )
        if self.kind == "bge-m3":
            rows = self.model.token_rows(texts)
        else:
            rows = self.model.token_rows(side, texts)
        if truncate is False:
            limit, prompt, marker = self._side_limit(side)
            task = side if self.kind == "multivector" else None  # its sides' limits differ
            for i, row in enumerate(rows):
                # Only a text that fills the limit may have been cut: count it whole.
                if len(row.ids) >= limit:
                    count = count_tokens(self._full, prompt + texts[i]) + marker
                    if count > limit:
                        raise self._too_long(i, count, field, limit=limit, task=task)
        return Prepared(rows, TokenOptions(output, side))

    def _side_limit(self, side: str) -> tuple[int, str, int]:
        """(tokens a text is cut to, the prompt put before it, marker tokens put in it) on
        ``side``: bge-m3 has one length and neither; a multi-vector model has its own per side
        (a query's is often far shorter than a document's)."""
        if self.kind == "bge-m3":
            return self.max_input_tokens, "", 0
        config = getattr(self.model.config, side)
        return config.max_length, config.prompt, int(config.marker_id is not None)

    def run(self, encodings: list, options: TokenOptions) -> np.ndarray:
        """One forward pass: ``(B, D)`` float32 for dense, else a ``(B, 1)`` object array of
        per-input payloads (``(tokens_i, D)`` float32 arrays, or (ids, weights) pairs)."""
        if self.kind == "multivector":
            payloads = [v.numpy() for v in self.model.embed_rows(options.side, encodings)]
        else:
            asked = {name: name == options.output for name in ("dense", "sparse", "colbert")}
            dense, sparse, colbert = self.model.embed_rows(encodings, **asked)
            if options.output == "dense":
                return dense.numpy()  # (B, D) unit rows: bge-m3's dense vectors always are
            if options.output == "sparse":
                payloads = [(ids.numpy(), w.numpy()) for ids, w in sparse]
            else:
                payloads = [v.numpy() for v in colbert]
        out = np.empty((len(payloads), 1), dtype=object)
        for i, payload in enumerate(payloads):
            out[i, 0] = payload
        return out

    def warm_up(self) -> None:
        side = "document"
        output = "dense" if self.kind == "bge-m3" else "colbert"
        prepared = self.prepare_tokens([WARM_UP_TEXT], output=output, side=side, field="warm-up")
        self.run(prepared.encodings, prepared.options)

    def info(self) -> dict:
        return {
            "model_id": self.name,
            "model_path": str(self.path),
            "model_dtype": self.precision,
            "model_type": {self.kind: {"dimensions": self.width}},
            "max_input_length": self.max_input_tokens,
            "dimensions": self.width,
        }


def load_served_model(
    spec, *, max_input_tokens: int | None, precision: str, backend: str, device: str = "cpu"
) -> ServedModel:
    """``spec`` as a served model, by its directory's kind (:func:`clearformer.model_kinds.
    model_kind`): a multi-vector or bge-m3 directory as a :class:`TokenVectorModel`
    (``max_input_tokens`` cuts its texts shorter than its own lengths), a sparse one by
    :func:`.sparse.load_sparse`, any other by :func:`.models.load_model` on ``device`` (the
    others run on the CPU alone, and another device is refused for them before any read)."""
    from ..interop.hf.files import resolve_path
    from ..text.bge_m3 import BGEM3Encoder
    from ..text.multivector_encoder import MultiVectorEncoder

    path = resolve_path(spec.path)
    kind = model_kind(path) if path.is_dir() else "dense"
    if kind != "dense" and check_device(device).type != "cpu":
        raise ValueError(
            f"device={device!r}: model {spec.name or path.name!r} is a {kind} model, which "
            f"runs on the CPU here; only embedding and reranking models run on another device"
        )
    if kind == "sparse":
        return load_sparse(
            spec, max_input_tokens=max_input_tokens, precision=precision, backend=backend
        )
    if kind not in ("multivector", "bge-m3"):
        return load_model(
            spec,
            max_input_tokens=max_input_tokens,
            precision=precision,
            backend=backend,
            device=device,
        )
    cls = BGEM3Encoder if kind == "bge-m3" else MultiVectorEncoder
    # The one precision the server runs it in, held alone (bf16: no float32 backbone kept).
    # int8 is for dense embedding models: these run float32 (warned).
    held = "float32" if is_int8(precision) else precision
    model = cls.from_pretrained(path, max_length=max_input_tokens, precision=held)
    name = spec.name or path.name
    if is_int8(precision):
        log.warning(
            "%s is a %s model: it runs in float32 (%s applies to embeddings)", name, kind, precision
        )
    return TokenVectorModel(name, model)
