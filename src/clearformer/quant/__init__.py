"""Quantised inference: int8 linear layers and the conversion of a loaded model."""

from .int8 import Int8Linear, Int8Support, int8_support, quantize_rows
from .quantize import (
    calibrate,
    int8_layers,
    linear_names,
    outlier_channels,
    quantize_int8,
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
    "quantize_rows",
    "smoothing_factors",
]
