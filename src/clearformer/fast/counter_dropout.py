"""Dropout's two routes, as :mod:`clearformer.dropout` describes them: inside
:func:`clearformer.runtime.counter_masks`, where the AVX-512 library is loaded and takes the
tensor, masks from Philox4x32-10 (``avx512_dropout.cpp``, one seed drawn from PyTorch's
generator per call, backward redrawing the mask); otherwise ``torch.nn.functional.dropout``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..runtime import counter_masks_enabled
from . import avx512


def counter_masks_serve(x: Tensor) -> bool:
    """Counter-based masks asked for, and the kernel loaded and able to take ``x``."""
    return counter_masks_enabled() and avx512.dropout_serves(x)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``torch.nn.functional.dropout(x, p, training)``, the mask drawn by the route above."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if p == 1.0 or not counter_masks_serve(x):
        return F.dropout(x, p, True)
    # One draw from PyTorch's generator: below 2**63, as random_() draws for int64.
    seed = int(torch.empty((), dtype=torch.int64).random_())
    threshold = min(round(p * 2**32), 2**32 - 1)
    # PyTorch's factor: 1 / (1 - p) computed in the input's dtype (its noise tensor's).
    scale = float(torch.ones((), dtype=x.dtype).div_(1.0 - p))
    return _CounterDropout.apply(x, seed, threshold, scale)


class _CounterDropout(torch.autograd.Function):
    """x -> x * keep * scale; the gradient is the same product of the output gradient, its mask
    redrawn from the seed."""

    @staticmethod
    def forward(ctx, x: Tensor, seed: int, threshold: int, scale: float) -> Tensor:
        ctx.mask = (seed, threshold, scale)
        return avx512.counter_dropout(x, seed, threshold, scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        seed, threshold, scale = ctx.mask
        if grad.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"dropout's gradient must be float32 or bfloat16, got {grad.dtype}")
        return avx512.counter_dropout(grad, seed, threshold, scale), None, None, None
