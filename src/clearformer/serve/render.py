"""Answers as bytes: embeddings written as JSON numbers fast, and exactly.

An embedding row is most of an answer's bytes and, through ``json.dumps``, most of the event
loop's time: Python writes each float32 widened to float64 with up to 17 digits. Nine
significant digits are enough to give back every float32 exactly (a reader that rounds the
number to float32 gets the same bits), and one ``%`` format over a whole row writes them about
four times as fast, in two thirds of the bytes. This is how ``clearformer encode`` writes JSONL.
"""

from __future__ import annotations

import base64
import json
import threading
import time

import numpy as np

from .errors import ApiError

_ROW_FORMATS: dict[int, str] = {}  # width -> "[%.9g,%.9g,...]"
# Tokens written per json.dumps call in a /tokenize answer. json.dumps holds the GIL for the
# whole of a call (half a second for the 27 MB answer to a body near the size limit), and the
# event loop runs only between calls.
TOKENS_PER_PIECE = 4096


def json_body(payload) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def float_rows(rows: np.ndarray) -> list[str]:
    """Each row of an (n, D) float32 array as a JSON list of numbers, exact to float32.

    Raises:
        ApiError: a row holds NaN or infinity, which JSON cannot write (the checkpoint's
            weights may be damaged).
    """
    check_finite(rows)
    width = rows.shape[1]
    fmt = _ROW_FORMATS.get(width)
    if fmt is None:
        fmt = _ROW_FORMATS.setdefault(width, "[" + ",".join(["%.9g"] * width) + "]")
    # "%g" writes -0.0 as "-0", which JSON readers take for the integer 0: such a row (rare)
    # goes through json, which writes "-0.0".
    negative_zero = ((rows == 0) & np.signbit(rows)).any(axis=1).tolist()
    return [
        json.dumps(row) if odd else fmt % tuple(row)
        for row, odd in zip(rows.tolist(), negative_zero, strict=True)
    ]


def base64_rows(rows: np.ndarray) -> list[str]:
    """Each row as base64 of its little-endian float32 bytes, as OpenAI's base64 embeddings."""
    check_finite(rows)
    return [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in rows]


def embed_body(rows: np.ndarray) -> bytes:
    """TEI's ``/embed`` answer: a JSON list of rows."""
    return ("[" + ",".join(float_rows(rows)) + "]").encode()


def openai_embeddings_body(rows: np.ndarray, encoding: str, model: str, tokens: int) -> bytes:
    """OpenAI's ``/v1/embeddings`` answer, rows as numbers or as base64 strings."""
    if encoding == "base64":
        values = [json.dumps(value) for value in base64_rows(rows)]
    else:
        values = float_rows(rows)
    data = ",".join(
        f'{{"object":"embedding","index":{i},"embedding":{value}}}'
        for i, value in enumerate(values)
    )
    usage = f'{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}'
    name = json.dumps(model, ensure_ascii=False)
    return f'{{"object":"list","data":[{data}],"model":{name},"usage":{usage}}}'.encode()


def tokens_body(
    texts: list[str],
    encodings: list,
    deadline: float | None = None,
    abandoned: threading.Event | None = None,
) -> bytes:
    """TEI's ``/tokenize`` answer for ``texts`` and their ``tokenizers.Encoding`` s: per text,
    its tokens as ``{id, text, special, start, stop}`` (a special token: its own string and
    null offsets).

    Raises:
        TimeoutError: ``deadline`` (``time.monotonic()``) passed, or ``abandoned`` was set,
            before the answer was written.
    """
    answers = []
    for text, encoding in zip(texts, encodings, strict=True):
        # Each of an Encoding's attributes is a new list on every read: read once.
        ids, tokens, special = encoding.ids, encoding.tokens, encoding.special_tokens_mask
        offsets = encoding.offsets
        pieces = []
        for first in range(0, len(ids), TOKENS_PER_PIECE):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("the /tokenize answer was not written by its deadline")
            if abandoned is not None and abandoned.is_set():
                raise TimeoutError("the /tokenize answer was abandoned: its client has gone")
            piece = []
            for j in range(first, min(first + TOKENS_PER_PIECE, len(ids))):
                if special[j]:
                    piece.append(
                        {
                            "id": ids[j],
                            "text": tokens[j],
                            "special": True,
                            "start": None,
                            "stop": None,
                        }
                    )
                else:
                    start, stop = offsets[j]
                    piece.append(
                        {
                            "id": ids[j],
                            "text": text[start:stop],
                            "special": False,
                            "start": start,
                            "stop": stop,
                        }
                    )
            pieces.append(json.dumps(piece, ensure_ascii=False, separators=(",", ":"))[1:-1])
        answers.append("[" + ",".join(pieces) + "]")
    return ("[" + ",".join(answers) + "]").encode()


def check_finite(rows: np.ndarray) -> None:
    bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
    if len(bad):
        raise ApiError(
            "Backend",
            f"the results of {len(bad)} of {len(rows)} inputs are not finite (NaN or "
            f"infinity; the checkpoint's weights may be damaged), first at input {int(bad[0])}",
        )
