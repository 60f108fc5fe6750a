"""Argument checks shared across the package: one wording, one error type per kind of mistake.

A value of the wrong type raises ``TypeError``; a value of the right type outside its range or
set raises ``ValueError``. Every message names the argument, what was expected and what came.

An int of the wrong type (``d_model=8.0``, ``True``) raised ``ValueError`` in earlier versions;
it now raises :class:`ArgumentTypeError`, a ``TypeError`` that is also a ``ValueError``, so code
written against either keeps catching it.

Whatever the class that takes an argument, the same bad value gets the same error and wording
(``tests/test_argument_checks.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any


class ArgumentTypeError(TypeError, ValueError):
    """A wrong type for an int argument (``except TypeError`` and ``except ValueError`` both
    catch it; see the module docstring)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    # bool subclasses int, but True as a size or a rate is a mistake, never an intention.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_int(value: Any, name: str, *, optional: bool = False) -> None:
    """Raise ValueError unless ``value`` is an int > 0 (or None when ``optional``)."""
    if optional and value is None:
        return
    expected = "a positive int or None" if optional else "a positive int"
    if not _is_int(value):
        raise ArgumentTypeError(f"{name} must be {expected}, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def check_int(
    value: Any,
    name: str,
    *,
    low: int = 0,
    high: int | None = None,
    optional: bool = False,
    high_name: str | None = None,
) -> None:
    """An int in ``[low, high)`` (``high`` None: no upper bound), or None when ``optional``.

    ``high_name`` names where the bound comes from (``vocab_size``), for the message.
    """
    if optional and value is None:
        return
    expected = f"an int >= {low}" if high is None else f"an int in [{low}, {high})"
    expected += f" ({high_name})" if high is not None and high_name else ""
    expected += " or None" if optional else ""
    if not _is_int(value):
        raise ArgumentTypeError(f"{name} must be {expected}, got {value!r}")
    if value < low or (high is not None and value >= high):
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def check_bool(value: Any, name: str, *, optional: bool = False) -> None:
    """A real bool (or None when ``optional``): ``"no"`` or ``1`` would be read as a truth
    value and silently mean something the caller may not have meant."""
    if optional and value is None:
        return
    if not isinstance(value, bool):
        expected = "a bool (True or False) or None" if optional else "a bool (True or False)"
        raise TypeError(f"{name} must be {expected}, got {value!r}")


def check_divisible(value: int, divisor: int, name: str, divisor_name: str) -> None:
    """Raise ValueError unless ``value`` splits evenly into ``divisor`` parts (heads)."""
    if value % divisor != 0:
        raise ValueError(
            f"{name} must be divisible by {divisor_name}: {name}={value}, "
            f"{divisor_name}={divisor} leaves a remainder of {value % divisor}"
        )


def check_probability(value: Any, name: str, *, optional: bool = False) -> None:
    """A dropout rate: a float in [0, 1). TypeError for a non-number, ValueError out of range."""
    if optional and value is None:
        return
    if not _is_number(value):
        raise TypeError(f"{name} must be a float in [0, 1), got {value!r}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")


def check_positive_float(value: Any, name: str) -> None:
    """A strictly positive float (a norm epsilon). TypeError for a non-number."""
    if not _is_number(value):
        raise TypeError(f"{name} must be a float > 0, got {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be a float > 0, got {value!r}")


def check_choice(value: Any, allowed: Collection[str], name: str) -> str:
    """Raise ValueError unless ``value`` is one of ``allowed``; return it (TypeError for a
    non-str among str choices)."""
    if all(isinstance(a, str) for a in allowed) and not isinstance(value, str):
        raise TypeError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return value


def check_unicode(text: str, name: str) -> None:
    """Raise ValueError unless ``text`` is valid Unicode (encodable as UTF-8).

    A Python str can hold a lone surrogate: a JSON escape like ``"\\ud800"`` decodes to one,
    and a command-line byte that is not UTF-8 arrives as one (U+DC80-U+DCFF, Python's
    ``surrogateescape``). Tokenizers refuse such text with a type error that names neither the
    text nor the reason; this names both.
    """
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        why = (
            f"byte 0x{code - 0xDC00:02x} that is not UTF-8"
            if 0xDC80 <= code <= 0xDCFF
            else f"a lone surrogate U+{code:04X} (half of a UTF-16 pair, e.g. a broken \\u escape)"
        )
        raise ValueError(
            f"{name} is not valid Unicode text: {why} at character {exc.start}; fix or drop it"
        ) from None


NAMED_TEXTS = 5  # texts listed by name in an error; the count says how many more


def check_finite_rows(
    embeddings: Any,
    texts: Sequence[str],
    *,
    start: int = 0,
    total: int | None = None,
    consequence: str = "nothing was written",
) -> None:
    """Raise ValueError naming the texts whose embedding row holds a NaN or an infinity
    (which JSON cannot express and no similarity survives). ``texts`` are the rows' texts, the
    part of a corpus of ``total`` texts (None: the whole) from row ``start``; ``consequence``
    says what the caller left undone."""
    import numpy as np

    bad = np.flatnonzero(~np.isfinite(embeddings).all(axis=1))
    if not len(bad):
        return
    named = ", ".join(f"{start + int(i)} ({shortened(texts[int(i)])!r})" for i in bad[:NAMED_TEXTS])
    more = f" and {len(bad) - NAMED_TEXTS} more" if len(bad) > NAMED_TEXTS else ""
    part = total is not None and len(texts) != total
    where = f" in rows {start}-{start + len(texts)}" if part else ""
    raise ValueError(
        f"the embeddings of {len(bad)} of {len(texts)} texts{where} are not finite (NaN or "
        f"infinity; the checkpoint's weights may be damaged): texts {named}{more}; "
        f"{consequence}"
    )


def shortened(text: str, width: int = 40) -> str:
    """``text`` cut to ``width`` characters, "..." marking a cut: a message repeats a value
    that may be megabytes long by its start."""
    return text if len(text) <= width else text[: width - 3] + "..."
