"""Which kernel a padded ``sdpa`` layer's attention takes, and the key runs it reads.

clearformer's AVX-512 kernel reads each sequence's keys as one run (first key, count) of the
(B, T) key-padding mask; a mask that is not one run per row (holes, a row without a key) keeps
PyTorch's kernel. The stack's planner (:mod:`clearformer.plan`) and the lone layer's
(:mod:`clearformer.plan_lone`) both ask here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import routes
from .options import Decision
from .routes import VarlenCall


def padded_route(
    call: VarlenCall, *, square: bool, unmasked: bool, keys: Tensor | None
) -> tuple[Decision, tuple[Tensor, Tensor] | None]:
    """Whether a padded ``sdpa`` layer's attention takes clearformer's AVX-512 kernel, and the
    (first key, key count) per sequence it then reads from the (B, T) key-padding mask ``keys``
    (None: the mask is no key-padding mask, or there is none)."""
    route = routes.padded_attention_route(
        call, square=square, unmasked=unmasked, key_runs=keys is not None
    )
    runs = None
    if route.choice == "avx512" and not unmasked:
        runs = key_runs(keys)
        if runs is None:
            route = Decision("torch", "keys are not one run per sequence: PyTorch's kernel")
    return route, runs


def key_runs(token_mask: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """(first real key, count) per row of a (B, T) key-padding mask whose real keys are one
    run per row (right or left padding), every row with a key; None otherwise."""
    if token_mask is None:
        return None
    count = token_mask.sum(-1)  # (B,)
    first = token_mask.to(torch.uint8).argmax(-1)  # (B,) first real key
    steps = torch.arange(token_mask.shape[1], device=token_mask.device)
    run = (steps >= first[:, None]) & (steps < (first + count)[:, None])  # (B, T)
    if not bool((count > 0).all()) or not torch.equal(run, token_mask):
        return None
    return first, count
