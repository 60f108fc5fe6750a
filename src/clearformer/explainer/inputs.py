"""Checking what :func:`clearformer.explain` is given, before any work is done.

Each kind of model takes its own kind of input; :func:`prepare` checks it and returns a
:class:`Prepared`: the one call that runs the model, the (B, T) token mask and the labels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..blocks import EncoderBlock
from ..encoder import Encoder
from ..masks import from_attention_mask, validate_key_padding_mask
from ..model import EncoderModel, check_token_ids

PAD_LABEL = "[pad]"


@dataclass
class Prepared:
    """A checked input, ready to run.

    Attributes:
        kind: "TextEncoder", "EncoderModel", "Encoder" or "EncoderBlock".
        module: the nn.Module whose forward pass is traced.
        forward: runs that module on the input, ``forward(backend=None)`` (a backend for that
            call only); returns (B, T, D) hidden states.
        token_mask: (B, T) bool, True = real token.
        layout_mask: the mask production sees (None when the caller gave none).
        tokens: (B, T) labels; padding positions are ``PAD_LABEL``.
        texts, truncated: for text encoders.
        text_encoder: the text encoder itself (pooling), when given one.
    """

    kind: str
    module: nn.Module
    forward: Callable[..., Tensor]
    token_mask: Tensor
    layout_mask: Tensor | None
    tokens: list[list[str]]
    texts: list[str] | None = None
    truncated: list[bool] = field(default_factory=list)
    text_encoder: Any = None


def is_text_encoder(model: Any) -> bool:
    """A text encoder: ``tokenize(texts)`` and an :class:`EncoderModel` as ``.model``."""
    return callable(getattr(model, "tokenize", None)) and isinstance(
        getattr(model, "model", None), EncoderModel
    )


def prepare(model: Any, inputs: Any, mask: Tensor | None, tokens: Any) -> Prepared:
    if is_text_encoder(model):
        if mask is not None:
            raise ValueError("mask must be None for a text encoder: the tokenizer makes it")
        return _texts(model, inputs)
    if isinstance(model, EncoderModel):
        return _token_ids(model, inputs, mask, tokens)
    if isinstance(model, (Encoder, EncoderBlock)):
        return _vectors(model, inputs, mask, tokens)
    raise TypeError(
        "model must be a TextEncoder, EncoderModel, Encoder or EncoderBlock, got "
        f"{type(model).__name__}"
    )


def _texts(encoder: Any, inputs: Any) -> Prepared:
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, Sequence) or not texts:
        raise ValueError(f"inputs must be a text or a non-empty list of texts, got {inputs!r}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"inputs[{i}] must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"inputs[{i}] is empty: give a text with at least one word")
    texts = list(texts)
    batch = encoder.tokenize(texts)
    ids, attention = batch.input_ids, batch.attention_mask.bool()
    type_ids = getattr(batch, "token_type_ids", None)
    model = encoder.model
    labels = _pad_labels(batch.tokens, attention)
    return Prepared(
        kind=type(encoder).__name__,
        module=model,
        forward=lambda backend=None: model(ids, attention, type_ids, backend=backend),
        token_mask=attention,
        layout_mask=attention,
        tokens=labels,
        texts=texts,
        truncated=[bool(t) for t in batch.truncated],
        text_encoder=encoder,
    )


def _token_ids(model: EncoderModel, inputs: Any, mask: Any, tokens: Any) -> Prepared:
    ids = inputs if isinstance(inputs, Tensor) else torch.as_tensor(inputs)
    if ids.dim() == 1:
        ids = ids[None]
    check_token_ids(ids, model.config, name="inputs")
    B, T = ids.shape
    _check_size(B, T)
    ids = ids.to(_device(model)).long()
    if mask is not None:
        if not isinstance(mask, Tensor) or tuple(mask.shape) != (B, T):
            shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"mask must be a (B, T) = ({B}, {T}) tensor, got {shape}")
        mask = from_attention_mask(mask).to(ids.device)
    token_mask = _token_mask(mask, B, T, ids.device)
    labels = _labels(tokens, [[str(i) for i in row] for row in ids.tolist()], token_mask)
    forward = lambda backend=None: model(ids, mask, backend=backend)  # noqa: E731
    return Prepared("EncoderModel", model, forward, token_mask, mask, labels)


def _vectors(model: Encoder | EncoderBlock, inputs: Any, mask: Any, tokens: Any) -> Prepared:
    d_model = model.config.d_model if isinstance(model, Encoder) else model.d_model
    kind = type(model).__name__ if isinstance(model, Encoder) else "EncoderBlock"
    if not isinstance(inputs, Tensor) or not inputs.is_floating_point():
        got = f"dtype {inputs.dtype}" if isinstance(inputs, Tensor) else type(inputs).__name__
        raise TypeError(f"inputs must be a float tensor (B, T, D) for an {kind}, got {got}")
    x = inputs[None] if inputs.dim() == 2 else inputs
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(
            f"inputs must have shape (B, T, D={d_model}) or (T, D={d_model}), "
            f"got {tuple(inputs.shape)}"
        )
    B, T, _ = x.shape
    _check_size(B, T)
    if isinstance(mask, Tensor) and mask.dtype != torch.bool and not mask.is_floating_point():
        mask = from_attention_mask(mask)  # 0/1, as for token ids; production takes bool only
    mask = validate_key_padding_mask(mask, B, T, x.device, name="mask")
    token_mask = _token_mask(mask, B, T, x.device)
    labels = _labels(tokens, [[f"t{t}" for t in range(T)] for _ in range(B)], token_mask)
    forward = lambda backend=None: model(x, mask, backend=backend)  # noqa: E731
    return Prepared(kind, model, forward, token_mask, mask, labels)


def _check_size(B: int, T: int) -> None:
    if B < 1 or T < 1:
        raise ValueError(f"inputs must hold at least one token, got B={B}, T={T}")


def _token_mask(mask: Tensor | None, B: int, T: int, device: torch.device) -> Tensor:
    if mask is None:
        return torch.ones(B, T, dtype=torch.bool, device=device)
    return mask.bool()


def _labels(tokens: Any, default: list[list[str]], token_mask: Tensor) -> list[list[str]]:
    """Per-position labels: the caller's ``tokens`` (B lists of T strings) or ``default``."""
    B, T = token_mask.shape
    if tokens is None:
        labels = default
    else:
        rows = [tokens] if tokens and isinstance(tokens[0], str) else tokens
        if len(rows) != B or any(len(r) != T for r in rows):
            got = [len(r) for r in rows]
            raise ValueError(
                f"tokens must be {B} list(s) of {T} labels, one per position, got {len(rows)} "
                f"list(s) of {got} labels"
            )
        labels = [[str(t) for t in row] for row in rows]
    return [
        [lab if keep else PAD_LABEL for lab, keep in zip(row, keeps, strict=True)]
        for row, keeps in zip(labels, token_mask.tolist(), strict=True)
    ]


def _pad_labels(pieces: list[list[str]], attention: Tensor) -> list[list[str]]:
    """Word pieces of the real tokens, laid out on the (B, T) grid with padding labelled."""
    out = []
    for row, keeps in zip(pieces, attention.tolist(), strict=True):
        it = iter(row)
        out.append([next(it, "?") if keep else PAD_LABEL for keep in keeps])
    return out


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
