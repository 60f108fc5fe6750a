"""Dropout, as ``torch.nn.Dropout`` computes it, with its masks drawn by a counter-based
generator inside :func:`counter_masks`.

In training, each call zeroes an element with probability ``p`` and scales the rest by
``1 / (1 - p)`` (the value PyTorch's dropout multiplies by, in the input's dtype). Only which
elements are dropped depends on the generator:

* inside ``counter_masks()`` (:mod:`clearformer.runtime`; ``clearformer.train`` enters it
  for a CPU run where :func:`clearformer.routes.dropout_masks_route` takes the kernel), on
  float32 or bfloat16 CPU tensors with clearformer's AVX-512 library loaded: one 64-bit seed
  is drawn from PyTorch's generator (so ``torch.manual_seed``, a checkpoint's saved generator
  state and activation checkpointing's replay decide it, as they decide PyTorch's dropout),
  then element i is dropped where its Philox4x32-10 word (:func:`clearformer.philox.mask_words`)
  is below ``round(p * 2**32)``: a drop probability within 2**-33 of ``p``. The mask is the
  same on any thread count, and backward redraws it from the seed instead of keeping it.
* otherwise: ``torch.nn.functional.dropout``.

On a CPU, PyTorch draws each element's Bernoulli sample from one Mersenne Twister, in order,
on one thread: at the sizes of a training step's attention probabilities that costs more than
the attention's products. The generator is chosen for a whole run, not per call, and recorded
with it: a run's masks depend on it, so that a run resumed with the other one continues from
the same weights with other masks. Both routes are in :mod:`clearformer.fast.counter_dropout`,
reached through the kernels' seam (:mod:`clearformer.kernels`).
"""

from __future__ import annotations

from torch import Tensor, nn

from .checks import check_probability
from .kernels import dropout
from .runtime import counter_masks, counter_masks_enabled

__all__ = ["Dropout", "counter_masks", "counter_masks_enabled", "dropout"]


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
