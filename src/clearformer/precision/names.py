"""The precision names and their one check (no torch: the command line reads them)."""

from __future__ import annotations

from typing import Any

# The canonical names. "int8-blocks": int8 weights with a scale per block of 32 inputs and
# 16-bit activations (clearformer.quant.int8_blocks), closer to float32 than "int8", slower
# on batches.
PRECISIONS = ("float32", "bf16", "int8", "int8-blocks", "auto")
INT8_PRECISIONS = ("int8", "int8-blocks")  # the CPU-only ones, whose layers hold int8 weights
# What a cross-encoder scores in: int8's per-row activations lost too much of a reranker's
# logit margins (docs/int8.md), so it keeps rerankers in float32 and is not offered here.
CROSS_ENCODER_PRECISIONS = ("float32", "bf16", "int8-blocks")
ALIASES = {"bfloat16": "bf16"}  # PyTorch's name for the dtype is accepted too
PRECISION_NAMES = (*PRECISIONS, *ALIASES)  # every spelling a caller may pass (CLI choices)


def is_int8(precision: str | None) -> bool:
    """``precision`` (any spelling) is one of :data:`INT8_PRECISIONS`: CPU-only, no float
    weights left in the model's linear layers."""
    return ALIASES.get(precision, precision) in INT8_PRECISIONS


def check_precision(
    value: Any, name: str = "precision", offered: tuple[str, ...] = PRECISIONS
) -> str:
    """``value`` as its canonical name (``"bfloat16"`` -> ``"bf16"``), or TypeError (not a
    str) / ValueError (not one of ``offered``, or an alias of one), naming ``name``, what it
    takes and what came. Callers run it before any work."""
    spelled = (*offered, *(a for a, c in ALIASES.items() if c in offered))
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {spelled}, got {value!r}")
    canonical = ALIASES.get(value, value)
    if canonical not in offered:
        raise ValueError(f"{name} must be one of {spelled}, got {value!r}")
    return canonical
