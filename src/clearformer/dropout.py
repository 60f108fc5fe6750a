"""Dropout, as ``torch.nn.Dropout`` computes it, with its masks drawn by a counter-based
generator inside :func:`counter_masks`.

In training, each call zeroes an element with probability ``p`` and scales the rest by
``1 / (1 - p)`` (the value PyTorch's dropout multiplies by, in the input's dtype). Only which
elements are dropped depends on the generator:

* inside ``counter_masks()`` (which ``clearformer.train`` enters for a CPU run where
  :func:`clearformer.routes.dropout_masks_route` takes the kernel), on float32 or bfloat16 CPU
  tensors with clearformer's AVX-512 library loaded: one 64-bit seed is drawn from PyTorch's
  generator (so ``torch.manual_seed``, a checkpoint's saved generator state and activation
  checkpointing's replay decide it, as they decide PyTorch's dropout), then element i is dropped
  where its Philox4x32-10 word (:func:`clearformer.philox.mask_words`) is below
  ``round(p * 2**32)``: a drop probability within 2**-33 of ``p``. The mask is the same on any
  thread count, and backward redraws it from the seed instead of keeping it.
* otherwise: ``torch.nn.functional.dropout``.

On a CPU, PyTorch draws each element's Bernoulli sample from one Mersenne Twister, in order,
on one thread: at the sizes of a training step's attention probabilities that costs more than
the attention's products. The generator is chosen for a whole run, not per call, and recorded
with it: a run's masks depend on it, so that a run resumed with the other one continues from
the same weights with other masks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_probability

__all__ = ["Dropout", "counter_masks", "counter_masks_enabled", "dropout"]

_COUNTER_MASKS: ContextVar[bool] = ContextVar("clearformer_counter_masks", default=False)


@contextmanager
def counter_masks(enabled: bool = True) -> Iterator[None]:
    """Dropout inside this block draws its masks from the counter-based generator where the
    kernel can take the tensor (``enabled=False``: PyTorch's, as outside)."""
    token = _COUNTER_MASKS.set(enabled)
    try:
        yield
    finally:
        _COUNTER_MASKS.reset(token)


def counter_masks_enabled() -> bool:
    """Whether the calling context asked for counter-based masks (:func:`counter_masks`)."""
    return _COUNTER_MASKS.get()


def counter_masks_serve(x: Tensor) -> bool:
    """Counter-based masks asked for, and the kernel loaded and able to take ``x``."""
    from .fast import avx512

    return _COUNTER_MASKS.get() and avx512.dropout_serves(x)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``torch.nn.functional.dropout(x, p, training)``, the mask drawn as the module
    docstring says."""
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
        from .fast import avx512

        ctx.mask = (seed, threshold, scale)
        return avx512.counter_dropout(x, seed, threshold, scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        from .fast import avx512

        seed, threshold, scale = ctx.mask
        if grad.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"dropout's gradient must be float32 or bfloat16, got {grad.dtype}")
        return avx512.counter_dropout(grad, seed, threshold, scale), None, None, None


class Dropout(nn.Module):
    """``torch.nn.Dropout(p)`` with clearformer's masks (:func:`dropout`)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        check_probability(p, "p")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
