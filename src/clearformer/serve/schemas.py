"""Request bodies, parsed and checked: one dataclass per endpoint, one error per mistake.

Fields follow the APIs they copy: OpenAI's ``POST /v1/embeddings`` and text-embeddings-
inference's ``POST /embed``, ``/rerank`` and ``/tokenize``. Fields these parsers do not know
are ignored, as both servers do (clients send ``user`` and the like). A field of the wrong type
or value is a 422 naming the field, what it must be and what came.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ApiError

ENCODING_FORMATS = ("float", "base64")
SHOWN = 40  # characters of a wrong string or number a message repeats; a longer one is described
DIRECTIONS = ("right", "left")  # which end of a too-long input truncation cuts


@dataclass(frozen=True)
class EmbedRequest:
    """``POST /embed`` (TEI) and ``POST /v1/embeddings`` (OpenAI) alike."""

    inputs: list[str]
    model: str | None = None
    normalize: bool | None = None  # None: as the checkpoint's pipeline says (OpenAI route)
    # None: not sent. A too-long input is then refused as for false, but by a model that
    # always cuts its texts (bge-m3) cut; a false sent is held to.
    truncate: bool | None = None
    direction: str = "right"
    prompt_name: str | None = None
    # Keep the first this many (Matryoshka), normalised after the cut where the model
    # normalises, as encode(dimensions=...) does.
    dimensions: int | None = None
    encoding_format: str = "float"


@dataclass(frozen=True)
class RerankRequest:
    """``POST /rerank`` (TEI)."""

    query: str
    texts: list[str]
    model: str | None = None
    truncate: bool = False
    direction: str = "right"
    raw_scores: bool = False  # the logits, without the checkpoint's activation
    return_text: bool = False


@dataclass(frozen=True)
class TokenizeRequest:
    """``POST /tokenize`` (TEI)."""

    inputs: list[str]
    model: str | None = None
    add_special_tokens: bool = True
    prompt_name: str | None = None


def parse_embed(body: Any) -> EmbedRequest:
    """A TEI ``/embed`` body: ``inputs`` (a string or a list), ``normalize`` (default true),
    ``truncate``, ``truncation_direction``, ``prompt_name``, ``dimensions``."""
    body = _object(body)
    return EmbedRequest(
        inputs=_texts(body, "inputs"),
        model=_optional(body, "model", str, "a string"),
        normalize=_flag(body, "normalize", True),
        truncate=_flag(body, "truncate", None),
        direction=_direction(body),
        prompt_name=_optional(body, "prompt_name", str, "a string"),
        dimensions=_dimensions(body),
    )


def parse_openai_embeddings(body: Any) -> EmbedRequest:
    """An OpenAI ``/v1/embeddings`` body: ``input`` (a string or a list of strings),
    ``model``, ``dimensions``, ``encoding_format`` (``float`` or ``base64``); and, beyond
    OpenAI's, ``truncate`` and ``prompt_name`` as on ``/embed``."""
    body = _object(body)
    # A boolean is an int to Python, but no token id: _texts names it as a wrong item.
    if isinstance(body.get("input"), list) and any(
        isinstance(item, int | list) and not isinstance(item, bool) for item in body["input"]
    ):
        raise ApiError(
            "Validation",
            "input must be a string or a list of strings; token-id arrays are not accepted "
            "(send the text: the server tokenizes it with the model's own tokenizer)",
            param="input",
        )
    encoding = _optional(body, "encoding_format", str, "a string") or "float"
    if encoding not in ENCODING_FORMATS:
        raise ApiError(
            "Validation",
            f"encoding_format must be one of {list(ENCODING_FORMATS)}, got {_shown(encoding)}",
            param="encoding_format",
        )
    return EmbedRequest(
        inputs=_texts(body, "input"),
        model=_optional(body, "model", str, "a string"),
        normalize=None,
        truncate=_flag(body, "truncate", None),
        prompt_name=_optional(body, "prompt_name", str, "a string"),
        dimensions=_dimensions(body),
        encoding_format=encoding,
    )


def parse_rerank(body: Any) -> RerankRequest:
    """A TEI ``/rerank`` body: ``query``, ``texts``, ``raw_scores``, ``return_text``,
    ``truncate``, ``truncation_direction``."""
    body = _object(body)
    query = body.get("query")
    if not isinstance(query, str):
        raise ApiError("Validation", f"query must be a string, got {_kind(query)}", param="query")
    texts = body.get("texts")
    if not isinstance(texts, list):
        raise ApiError(
            "Validation", f"texts must be a list of strings, got {_kind(texts)}", param="texts"
        )
    return RerankRequest(
        query=query,
        texts=_texts(body, "texts"),
        model=_optional(body, "model", str, "a string"),
        truncate=_flag(body, "truncate", False),
        direction=_direction(body),
        raw_scores=_flag(body, "raw_scores", False),
        return_text=_flag(body, "return_text", False),
    )


def parse_tokenize(body: Any) -> TokenizeRequest:
    """A TEI ``/tokenize`` body: ``inputs``, ``add_special_tokens`` (default true),
    ``prompt_name``."""
    body = _object(body)
    return TokenizeRequest(
        inputs=_texts(body, "inputs"),
        model=_optional(body, "model", str, "a string"),
        add_special_tokens=_flag(body, "add_special_tokens", True),
        prompt_name=_optional(body, "prompt_name", str, "a string"),
    )


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError("Validation", f"the body must be a JSON object, got {_kind(body)}")
    return body


def _texts(body: dict, name: str) -> list[str]:
    """A string or a non-empty list of strings, as a list."""
    value = body.get(name)
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ApiError(
            "Validation",
            f"{name} must be a string or a list of strings, got {_kind(value)}",
            param=name,
        )
    if not value:
        raise ApiError("Empty", f"{name} must not be empty", param=name)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ApiError(
                "Validation", f"{name}[{i}] must be a string, got {_kind(item)}", param=name
            )
    return value


def _flag(body: dict, name: str, default: bool | None) -> bool | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(
            "Validation", f"{name} must be true or false, got {_shown(value)}", param=name
        )
    return value


def _optional(body: dict, name: str, kind: type, expected: str):
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise ApiError("Validation", f"{name} must be {expected}, got {_kind(value)}", param=name)
    return value


def _direction(body: dict) -> str:
    value = body.get("truncation_direction")
    if value is None:
        return "right"
    # TEI spells them Right and Left; its documentation right and left: take either.
    if not isinstance(value, str) or value.lower() not in DIRECTIONS:
        raise ApiError(
            "Validation",
            f"truncation_direction must be 'right' or 'left', got {_shown(value)}",
            param="truncation_direction",
        )
    return value.lower()


def _dimensions(body: dict) -> int | None:
    value = body.get("dimensions")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ApiError(
            "Validation",
            f"dimensions must be a positive integer, got {_shown(value)}",
            param="dimensions",
        )
    return value


def _shown(value: Any) -> str:
    """A wrong value as a message shows it: a string or a number itself, anything else by its
    kind (a list or an object may be nested a thousand deep, or megabytes long)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= SHOWN else f"a string of {len(value):,} characters"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(value)
    return _kind(value)


def _number(value: int | float) -> str:
    """A number as a message shows it: itself, or how long it is where it is too long to
    repeat (JSON integers of thousands of digits parse)."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"an integer of {len(text.lstrip('-')):,} digits"


def _kind(value: Any) -> str:
    """A JSON value's kind, as a message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        shown = _number(value)
        return f"a number ({shown})" if shown == repr(value) else shown
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
