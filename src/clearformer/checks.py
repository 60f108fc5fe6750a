"""Argument checks shared across the package: one wording, one error type per kind of mistake.

Rates and epsilons (floats): a value of the wrong type raises ``TypeError``, one outside its
range ``ValueError``. Sizes and counts (:func:`check_positive_int`) raise ``ValueError`` for
anything that is not a positive int, ``True``, ``8.0`` and ``"8"`` included, as they always
have. Names from a fixed set raise ``ValueError``. Whatever the class that takes the argument,
the same bad value gets the same error and wording (``tests/test_argument_checks.py``), and every
message names the argument, what was expected and what came.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def _is_number(value: Any) -> bool:
    # bool subclasses int, but True as a size or a rate is a mistake, never an intention.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_int(value: Any, name: str, *, optional: bool = False) -> None:
    """Raise ValueError unless ``value`` is an int > 0 (or None when ``optional``)."""
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        expected = "a positive int or None" if optional else "a positive int"
        raise ValueError(f"{name} must be {expected}, got {value!r}")


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
    """Raise ValueError unless ``value`` is one of ``allowed``; return it."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return value
