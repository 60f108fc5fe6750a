"""``each_row``: a function of pooled vectors applied to one row at a time, so that a row's
result does not depend on the rows beside it.

A matrix product's rounding may depend on how many rows it has: a single row takes a
matrix-vector kernel, several a matrix-matrix one, which sum the same products in another
order (1e-7 apart in float32). The heads' products after pooling (a classifier's dense and
output layers, sentence-transformers' Dense modules, an LLM reranker's two logits) are small
next to the encoder's, so each row runs alone: a text scored or embedded alone gets the bits
it gets in any batch, which ``clearformer serve`` promises whatever shares a request's batch.
The encoder's own products need no such care: every token row of one text meets the same
kernel, and a batch with padding is packed (``rows_alone``,
:func:`clearformer.routes.stack_layout`).

Only without gradients (inference, where results are served): a training step has no use for
it. While a graph is traced, compiled or exported the function is applied to the whole batch:
a loop over rows would fix the graph's batch size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..runtime import capturing_graph


def each_row(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``fn`` over (B, ...) ``x`` one row at a time, the rows stacked again: (B, ...)."""
    # Tracing first: reading the batch size under export would add a guard on it.
    if capturing_graph() or torch.is_grad_enabled() or x.shape[0] <= 1:
        return fn(x)
    return torch.cat([fn(row) for row in x.split(1)])  # (B, ...)
