"""Linear weights reordered into oneDNN's blocked layout once per call, for the fused layers.

oneDNN's matrix-product kernel reads its weights in a blocked layout of its own. Handed a
plain ``(out, in)`` weight, ``mkldnn::_linear_pointwise`` first reorders it into that layout,
on every call: a pass over the whole weight whatever the number of rows, which is most of the
cost of a call with few rows (a decoding step, a short batch) and a few per cent of a large
one. Reordered once (``torch.ops.mkldnn._reorder_linear_weight``), the same weight serves
every call after it.

A caller that makes many forward passes (``encode``, ``generate``) holds a
:class:`PackedWeights` for the length of its own call and runs its passes inside
:func:`use_packed_weights`; there :func:`clearformer.fused_linear.linear` takes a layer's
reordered copy in place of its weight, reordering it on the layer's first call, which costs
what the plain call's own reordering would have. Nothing is stored on the modules. A weight
changed after its copy was made (an in-place update, a new tensor) is noticed by its version
counter and identity and reordered again. The products are the same numbers from the same
kernel, bit for bit from two rows up (a single row may take another kernel, which sums in
another order: float32 rounding); what this saves is measured in docs/performance.md.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class _Copy:
    source: Tensor  # the weight it was made from (kept alive, so its identity stays unique)
    version: int  # the weight's version counter then
    packed: Tensor


class PackedWeights:
    """Reordered copies of the weights of the layers called while it is in use, made on each
    layer's first fused call. They take as much memory as those weights, for as long as the
    holder keeps this object. Safe to share between threads: two threads that reorder the same
    weight at once make equal copies, and either is kept."""

    def __init__(self) -> None:
        self._copies: dict[int, _Copy] = {}

    def __len__(self) -> int:
        return len(self._copies)

    def weight_for(self, layer: nn.Linear) -> Tensor:
        """``layer``'s weight in oneDNN's layout (a float32 weight on the CPU with a version
        counter), else its own."""
        weight = layer.weight
        copy = self._copies.get(id(layer))
        if copy is not None and copy.source is weight and copy.version == weight._version:
            return copy.packed
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.is_inference():
            # An inference tensor (made under inference_mode) has no version counter, so an
            # in-place change of it could not be noticed: such a weight is read as it is.
            return weight
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self._copies[id(layer)] = _Copy(weight, weight._version, packed)
        return packed


# The PackedWeights of the calls inside use_packed_weights. A context variable, so that each
# thread (each encode worker) sees only what it entered itself.
_active: contextvars.ContextVar[PackedWeights | None] = contextvars.ContextVar(
    "clearformer_packed_weights", default=None
)


@contextlib.contextmanager
def use_packed_weights(packed: PackedWeights | None) -> Iterator[None]:
    """Within the block, on this thread, fused linear calls read their weights from
    ``packed`` (None: from the layers, as outside any block)."""
    token = _active.set(packed)
    try:
        yield
    finally:
        _active.reset(token)


def packed_weight(layer: nn.Linear) -> Tensor:
    """The weight a fused call of ``layer`` reads: from the active :class:`PackedWeights`,
    or the layer's own outside :func:`use_packed_weights`."""
    packed = _active.get()
    return layer.weight if packed is None else packed.weight_for(layer)
