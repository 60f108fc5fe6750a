"""Cutting a list of tokenized texts into forward passes.

Texts are sorted by length, longest first, so that each batch holds texts of similar length
and pads little. A batch is then bounded either by a number of texts (``batch_size``, the
sentence-transformers convention) or, by default, by its padded size in tokens
(``max_tokens``): a token budget keeps every forward pass about equally large, so short texts
travel in large batches (large matrix products run closer to the machine's peak) and long
texts in small ones (the memory peak stays bounded whatever the lengths).

When several forward passes run side by side (``encode``'s workers), :func:`balance_batches`
cuts the same longest-first order again into a multiple of the worker count of batches of about
equal estimated cost, so the workers finish together instead of one idling while the other
runs the call's last batch.

The plan changes only which texts share a forward pass. A text's embedding does not depend on
its batch-mates, to the bit at a given thread count (the forward plan packs every padded
batch: ``rows_alone``, :func:`clearformer.routes.stack_layout`), so the plan changes speed and
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


# The most cuts balance_batches tries before it keeps the budget-bound plan.
BALANCE_TRIES = 8


def text_cost(length: int, d_model: int) -> float:
    """The estimated cost of one text of ``length`` tokens in a packed forward pass, in units
    of one token's linear layers.

    Per layer a token costs about ``24 * D**2`` FLOPs of weight products and ``4 * L * D`` of
    attention (scores and weighted values over its ``L`` keys), and attention at narrow heads
    runs at roughly half the products' rate, hence ``L * (1 + L / (3 * D))``. Packed passes
    compute real tokens only, so padding costs nothing here.
    """
    return length * (1.0 + length / (3.0 * d_model))


def balance_batches(
    lengths: Sequence[int],
    batches: list[list[int]],
    workers: int,
    d_model: int,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> list[list[int]]:
    """``batches`` (from :func:`plan_batches`, longest first) cut again for ``workers`` forward
    passes side by side: the same order, in a multiple of ``workers`` batches of about equal
    :func:`text_cost` where the budget allows, none over ``max_tokens`` padded tokens (a single
    longer text still gets a batch alone).

    A budget-bound plan fills every batch but the last, so with two workers a call of three
    batches runs its third on one worker while the other waits, and batches of long, unequal
    texts carry fewer real tokens than batches of short ones. Equal costs let the workers
    finish together. Returns ``batches`` unchanged when ``workers`` is 1, when there are fewer
    texts than ``workers``, or when none of the cuts tried (:data:`BALANCE_TRIES` of them, one
    more batch per worker each time, up to a quarter more than ``batches``) fits the budget.
    """
    check_positive_int(workers, "workers")
    check_positive_int(d_model, "d_model")
    check_positive_int(max_tokens, "max_tokens")
    order = [index for batch in batches for index in batch]
    if workers == 1 or len(order) < workers:
        return batches
    prefix = [0.0]  # prefix[k]: the cost of order[:k]
    for index in order:
        prefix.append(prefix[-1] + text_cost(lengths[index], d_model))
    count = -(-len(batches) // workers) * workers  # the next multiple of workers
    # At most a quarter more batches than the budget needs: smaller batches run their products
    # slower (budgets of 2,048 against 4,096: 0.94-0.97x in docs/performance.md), which would
    # cost more than the balance gains. Each try is a pass over the texts, so there are at most
    # BALANCE_TRIES of them: a call whose cuts keep missing the budget stays linear in its
    # texts, and one of many batches loses little to its last round anyway.
    most = min(max(count, 5 * len(batches) // 4), len(order))
    for _ in range(BALANCE_TRIES):
        if count > most:
            break
        cut = _equal_cost_cut(order, lengths, prefix, count, max_tokens)
        if cut is not None:
            return cut
        count += workers
    return batches


def _equal_cost_cut(
    order: list[int], lengths: Sequence[int], prefix: list[float], count: int, max_tokens: int
) -> list[list[int]] | None:
    """``order`` in ``count`` non-empty contiguous runs within ``max_tokens``, each ending where
    its cost is nearest to an equal share of what is left; None when the last run does not fit.

    A run the budget stops early (long texts: ``max_tokens`` // its first length of them) costs
    less than its share, and the runs after it share the rest equally. Cutting at equal shares
    of the whole instead would need as many runs everywhere as the long texts need."""
    bounds = [0]
    for part in range(1, count):
        start = bounds[-1]
        target = prefix[start] + (prefix[-1] - prefix[start]) / (count - part + 1)
        # Sorted longest first: the run's first text sets its padded length.
        most_texts = max(1, max_tokens // max(lengths[order[start]], 1))
        # At most the budget's texts, and at least one left for each run after this one.
        limit = min(start + most_texts, len(order) - (count - part))
        end = start + 1
        while end < limit and prefix[end + 1] <= target:
            end += 1
        # Step one further when that lands nearer the target.
        if end < limit and prefix[end + 1] - target < target - prefix[end]:
            end += 1
        bounds.append(end)
    bounds.append(len(order))
    runs = [order[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return runs if _fits(runs[-1], lengths, max_tokens) else None


def _fits(batch: list[int], lengths: Sequence[int], max_tokens: int) -> bool:
    longest = max(lengths[i] for i in batch)
    return len(batch) == 1 or len(batch) * max(longest, 1) <= max_tokens
