"""The precision a call computes in: its names, their check, and where each is decided.

* ``"float32"``: the model as loaded;
* ``"bf16"`` (alias ``"bfloat16"``): a copy of the model with bfloat16 weights, its matrix
  products in bfloat16 and float32 where accuracy needs it (:mod:`.bf16`);
* ``"int8"``: int8 matrix products (:mod:`clearformer.quant`; ``TextEncoder.encode`` only);
* ``"int8-blocks"``: int8 weights with a scale per block of 32 inputs, 16-bit activations
  (:mod:`clearformer.quant.int8_blocks`): closer to float32 than ``"int8"``, slower on batches;
* ``"auto"``: the fastest of them whose accuracy floor holds on this CPU, decided from the
  CPU's instruction sets and, where they do not settle it, a short measurement cached per CPU
  model and PyTorch version (:mod:`.auto`, :mod:`.speedup`).

Names are imported on first use, so that the command line can read :data:`PRECISIONS` without
importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports as _lazy_exports
from .names import (
    ALIASES,
    INT8_PRECISIONS,
    PRECISION_NAMES,
    PRECISIONS,
    check_precision,
    is_int8,
)

_EXPORTS = {
    "Bf16Support": ".bf16",
    "bf16_support": ".bf16",
    "bf16_copy": ".bf16",
    "empty_bf16": ".bf16",
    "is_bf16": ".bf16",
    "choose_precision": ".auto",
    "auto_precision": ".auto",
    "SPEEDUP_VARIABLE": ".speedup",
    "bf16_speedup": ".speedup",
}

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from .auto import auto_precision, choose_precision
    from .bf16 import Bf16Support, bf16_copy, bf16_support, empty_bf16, is_bf16
    from .speedup import SPEEDUP_VARIABLE, bf16_speedup


__all__ = [
    "ALIASES",
    "INT8_PRECISIONS",
    "PRECISIONS",
    "PRECISION_NAMES",
    "Bf16Support",
    "SPEEDUP_VARIABLE",
    "auto_precision",
    "bf16_copy",
    "bf16_speedup",
    "bf16_support",
    "check_precision",
    "choose_precision",
    "empty_bf16",
    "is_bf16",
    "is_int8",
]
