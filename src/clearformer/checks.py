"""Argument checks shared across the package, with errors that name the argument and value."""

from __future__ import annotations

from typing import Any


def check_positive_int(value: Any, name: str, *, optional: bool = False) -> None:
    """Raise ValueError unless ``value`` is an int > 0 (or None when ``optional``).

    ``bool`` is refused although it subclasses ``int``: ``True`` as a size is a mistake.
    """
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        expected = "a positive int or None" if optional else "a positive int"
        raise ValueError(f"{name} must be {expected}, got {value!r}")
