"""Quantised inference: int8 linear layers and the conversion of a loaded model.

* :mod:`.int8` -- :class:`Int8Linear` and the start-up probe :func:`int8_support`;
* :mod:`.quantize` -- :func:`quantize_int8` (a converted copy of a model) and the calibrated
  default policy :func:`quantize_int8_calibrated`;
* :mod:`.smoothing_texts` -- the texts the default policy calibrates its smoothing on.

Names are imported on first use. The precisions ``encode`` accepts (``float32``, ``bf16``,
``int8``, ``auto``) are named in :mod:`clearformer.precision`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "Int8Linear": ".int8",
    "Int8Support": ".int8",
    "int8_support": ".int8",
    "quantize_rows": ".int8",
    "calibrate": ".quantize",
    "int8_layers": ".quantize",
    "linear_names": ".quantize",
    "outlier_channels": ".quantize",
    "quantize_int8": ".quantize",
    "quantize_int8_calibrated": ".quantize",
    "smoothing_factors": ".quantize",
}

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from .int8 import Int8Linear, Int8Support, int8_support, quantize_rows
    from .quantize import (
        calibrate,
        int8_layers,
        linear_names,
        outlier_channels,
        quantize_int8,
        quantize_int8_calibrated,
        smoothing_factors,
    )


__all__ = [
    "Int8Linear",
    "Int8Support",
    "calibrate",
    "int8_layers",
    "int8_support",
    "linear_names",
    "outlier_channels",
    "quantize_int8",
    "quantize_int8_calibrated",
    "quantize_rows",
    "smoothing_factors",
]
