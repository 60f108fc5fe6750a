"""Quantised layers keep their scales in float32 whatever the model is converted to.

``model.half()`` or ``model.to(torch.bfloat16)`` converts every floating parameter and buffer.
A quantised layer's int8 weights are not floating and stay as they are; its scales, bias and
the other float tensors its arithmetic reads would be rounded, and the layer would then either
compute other rows (a scale rounded to float16) or be refused by its kernel (which reads
float32). Device moves apply as usual.
"""

from __future__ import annotations

import torch
from torch import nn


class Float32Buffers(nn.Module):
    """A module whose buffers named in :attr:`FLOAT32_BUFFERS` stay float32 through dtype
    conversions (their values unrounded: the float32 tensor is moved, not converted back)."""

    FLOAT32_BUFFERS: tuple[str, ...] = ()

    def _apply(self, fn, recurse: bool = True):
        kept = {name: getattr(self, name) for name in self.FLOAT32_BUFFERS}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = getattr(self, name)
            if before is not None and after is not None and after.dtype != torch.float32:
                setattr(self, name, before.to(after.device))
        return self
