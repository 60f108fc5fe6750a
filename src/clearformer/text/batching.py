"""Cutting a list of tokenized texts into forward passes.

Texts are sorted by length, longest first, so that each batch holds texts of similar length
and pads little. A batch is then bounded either by a number of texts (``batch_size``, the
sentence-transformers convention) or, by default, by its padded size in tokens
(``max_tokens``): a token budget keeps every forward pass about equally large, so short texts
travel in large batches (large matrix products run closer to the machine's peak) and long
texts in small ones (the memory peak stays bounded whatever the lengths).

The plan changes only which texts share a forward pass. A text's embedding does not depend on
its batch-mates (equal within float rounding, tested to 1e-6), so the plan changes speed and
memory, not results.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..checks import check_positive_int

# Padded tokens per forward pass when no batch size is given: as fast as larger budgets and
# 32-text batches in the measurements (docs/performance.md, "Encoding texts"), and small in
# memory: 4096 rows of width 1536 are 24 MiB of activations per batch.
DEFAULT_MAX_TOKENS = 4096
# The budget of int8 calls whose products run through torch._int_mm (where oneDNN's quantised
# linear op does not run, :func:`clearformer.quant.onednn.onednn_int8_available`): _int_mm and
# its int32 results ran faster on smaller batches on an Intel Xeon with AMX, 1.12x on sentences
# and 1.02x on mixed text against 4096 (docs/int8.md). Through oneDNN's op int8 was fastest at
# 4096 there, as float32 is (1.05x / 1.03x against 2048).
INT_MM_MAX_TOKENS = 2048


def default_max_tokens(precision: str) -> int:
    """The token budget a call of ``precision`` takes when it names none."""
    from ..quant.onednn import onednn_int8_available  # here: the CLI's parser imports no torch

    if precision == "int8" and not onednn_int8_available():
        return INT_MM_MAX_TOKENS
    return DEFAULT_MAX_TOKENS


def check_batch_limits(batch_size: int | None, max_tokens: int) -> None:
    """Raise ValueError naming the argument when a limit is not a positive int."""
    check_positive_int(batch_size, "batch_size", optional=True)
    check_positive_int(max_tokens, "max_tokens")


def plan_batches(
    lengths: Sequence[int], batch_size: int | None = None, max_tokens: int = DEFAULT_MAX_TOKENS
) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches, longest texts first.

    Args:
        lengths: tokens per text (special tokens included).
        batch_size: at most this many texts per batch; None = bounded by ``max_tokens`` only.
        max_tokens: at most this many padded tokens (texts x longest length) per batch when
            ``batch_size`` is None. A single text longer than the budget gets a batch alone.

    Returns:
        Batches of indices into ``lengths``; every index appears exactly once.
    """
    check_batch_limits(batch_size, max_tokens)
    # Stable sort: equally long texts keep their input order.
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if batch_size is not None:
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # Sorted longest first: the batch's first text sets its padded length.
        longest = lengths[current[0]] if current else lengths[index]
        if current and (len(current) + 1) * max(longest, 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches
