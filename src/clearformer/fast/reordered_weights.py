"""Linear weights reordered into oneDNN's blocked layout once per call, for the fused layers.

oneDNN's matrix-product kernel reads its weights in a blocked layout of its own. Handed a
plain ``(out, in)`` weight, ``mkldnn::_linear_pointwise`` first reorders it into that layout,
on every call: a pass over the whole weight whatever the number of rows, which weighs most in
calls with few rows (a decoding step, a short batch). Reordered once
(``torch.ops.mkldnn._reorder_linear_weight``), the same weight serves every call after it.

A caller that makes many forward passes holds a :class:`ReorderedWeights`: ``generate`` for the
length of its own call, ``TextEncoder`` and ``CrossEncoder`` across their calls
(:class:`KeptReordering`: made once their calls have carried :data:`REORDER_MIN_TOKENS`
tokens, below which reordering costs more than it saves), and runs its passes inside
:func:`use_reordered_weights`; there :func:`clearformer.fast.fused_linear.linear` takes a layer's
reordered copy in place of its weight, reordering it on the layer's first call, which costs
what the plain call's own reordering would have. Nothing is stored on the modules. A weight
replaced or changed in place after its copy was made (another tensor, other storage, a moved
version counter) is reordered again; a write that bypasses the version counter (through
``.data`` or a NumPy view) during the call is not seen, as for any cached computation. The
products are the same numbers from the same kernel, bit for bit from two rows up (a single row
may take another kernel, which sums in another order: float32 rounding); what this saves is
measured in docs/performance.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..machine import machine

log = logging.getLogger(__name__)

# Rows (tokens) a call's forward passes must carry in all before its caller packs the weights:
# reordering every weight of the bundled model costs about 7 ms on two threads, as much as
# two single-text forward passes, and saves a few per cent of each large product
# (docs/performance.md, "Weights reordered once per call"). Below this, plain weights are faster.
REORDER_MIN_TOKENS = 2_048
# The largest second copy a long-lived caller keeps: the copy doubles the linear weights'
# memory for as long as the caller lives, and saves a pass over each weight per forward pass,
# a share of the pass that does not grow with the model (both scale with the weights). At
# Qwen3-Embedding-0.6B's shape (1.7 GB of float32 linear weights) it saved about 1 % of an
# encode call while its copy took peak memory past sentence-transformers' (docs/performance.md,
# "Weights reordered once per call"); BERT-base's 340 MB and the bundled model's 42 MB stay under.
REORDER_MAX_BYTES = 512 * 2**20


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's ``nn.Linear`` weights: what a :class:`ReorderedWeights` copies."""
    return sum(
        m.weight.numel() * m.weight.element_size()
        for m in model.modules()
        if isinstance(m, nn.Linear)
    )


@dataclass(frozen=True)
class _Copy:
    source: Tensor  # the weight it was made from (kept alive, so its identity stays unique)
    version: int  # the weight's version counter then
    storage: int  # and its data pointer: `.data = other` keeps identity and version
    packed: Tensor

    def matches(self, weight: Tensor) -> bool:
        return (
            self.source is weight
            and self.version == weight._version
            and self.storage == weight.data_ptr()
        )


# The weight dtypes a copy in oneDNN's layout is made for (the fused route's, fused_linear).
PACKED_DTYPES = (torch.float32, torch.bfloat16)


class ReorderedWeights:
    """Reordered copies of the weights of the layers called while it is in use, made on each
    layer's first fused call, in the layout of the kernel that reads them: oneDNN's
    (``"onednn"``) or clearformer's AVX-512 linear kernel's panels (``"avx512"``,
    :mod:`clearformer.fast.avx512_linear`). They take as much memory as those weights (a
    layer whose calls take both kernels, large calls one and small ones the other, has a copy
    in each layout), for as long as the holder keeps this object. Safe to share between
    threads: two threads that reorder the same weight at once make equal copies, and either is
    kept."""

    def __init__(self) -> None:
        self._copies: dict[tuple[int, str], _Copy] = {}

    def __len__(self) -> int:
        return len(self._copies)

    def weight_for(self, layer: nn.Linear, layout: str = "onednn") -> Tensor:
        """``layer``'s weight in ``layout`` (a float32 weight on the CPU with a version
        counter, where this build can reorder it), else its own."""
        weight = layer.weight
        copy = self._copies.get((id(layer), layout))
        if copy is not None and copy.matches(weight):
            return copy.packed
        if not self.has_own_copy(layer):
            return weight
        with torch.no_grad():
            if layout == "avx512":
                from . import avx512_linear

                packed = avx512_linear.reorder(weight)
            elif weight.dtype in machine().reorder:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            else:
                return weight
        self._copies[(id(layer), layout)] = _Copy(
            weight, weight._version, weight.data_ptr(), packed
        )
        return packed

    def has_own_copy(self, layer: nn.Linear) -> bool:
        """Whether :meth:`weight_for` can give ``layer``'s weight in a layout of its own (a
        float32 or bfloat16 CPU weight with a version counter): else it hands back the weight
        itself. An inference tensor (made under inference_mode) has no version counter, so an
        in-place change of it could not be noticed: such a weight is read as it is."""
        weight = layer.weight
        return (
            weight.device.type == "cpu"
            and weight.dtype in PACKED_DTYPES
            and not weight.is_inference()
        )


# The ReorderedWeights of the calls inside use_reordered_weights. A context variable, so that a
# thread sees only the reordering it entered itself or, where new threads inherit the context
# (free-threaded Python's default), the one its parent was in.
_active: contextvars.ContextVar[ReorderedWeights | None] = contextvars.ContextVar(
    "clearformer_reordered_weights", default=None
)


class KeptReordering:
    """The :class:`ReorderedWeights` a long-lived caller (a ``TextEncoder``, a ``CrossEncoder``)
    keeps across its calls: none until its calls have carried :data:`REORDER_MIN_TOKENS` tokens
    in all, then one, made once and handed to every later call. A one-off short call thus runs
    on plain weights, while a stream of queries or batches stops paying each call's reordering
    (about 13 ms per call and worker for the bundled model); the price is a second copy of the
    linear weights for as long as the caller lives, or until :meth:`drop`. A caller whose
    model's linear weights exceed :data:`REORDER_MAX_BYTES` never keeps a copy (``model``: the
    caller's float32 model; None = no limit; ``extra_bytes``: other weights the caller's
    products read reordered, a tied vocabulary table say). Safe to share between threads."""

    def __init__(self, model: nn.Module | None = None, extra_bytes: int = 0) -> None:
        self._tokens = 0
        self._packed: ReorderedWeights | None = None
        self._lock = threading.Lock()
        self.weight_bytes = None if model is None else linear_weight_bytes(model) + extra_bytes
        self.too_large = self.weight_bytes is not None and self.weight_bytes > REORDER_MAX_BYTES
        if self.too_large:
            log.info(
                "linear weights of %.0f MiB: no packed copy is kept (limit %.0f MiB)",
                self.weight_bytes / 2**20,
                REORDER_MAX_BYTES / 2**20,
            )

    def for_call(self, tokens: int) -> ReorderedWeights | None:
        """The reordered weights a call of ``tokens`` tokens should run under (None: plain
        weights)."""
        if self.too_large:
            return None
        with self._lock:
            self._tokens += tokens
            if self._packed is None and self._tokens >= REORDER_MIN_TOKENS:
                self._packed = ReorderedWeights()
            return self._packed

    def drop(self) -> None:
        """Free the copies; counting starts again from zero."""
        with self._lock:
            self._tokens, self._packed = 0, None

    @property
    def kept(self) -> ReorderedWeights | None:
        return self._packed


@contextlib.contextmanager
def use_reordered_weights(packed: ReorderedWeights | None) -> Iterator[None]:
    """Within the block, on this thread, fused linear calls read their weights from
    ``packed`` (None: from the layers, as outside any block)."""
    token = _active.set(packed)
    try:
        yield
    finally:
        _active.reset(token)


def reordered_weight(layer: nn.Linear) -> Tensor:
    """The weight a fused call of ``layer`` reads: from the active :class:`ReorderedWeights`,
    or the layer's own outside :func:`use_reordered_weights`."""
    packed = _active.get()
    return layer.weight if packed is None else packed.weight_for(layer)


def active_reordering() -> ReorderedWeights | None:
    """The :class:`ReorderedWeights` this thread's calls run under, if any."""
    return _active.get()
