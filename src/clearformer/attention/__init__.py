"""Attention: the multi-head module; its kernels live in :mod:`clearformer.kernels`."""

from ..kernels import math_attention, sdpa_attention, varlen_attention
from ..options import BACKENDS
from .mha import MultiHeadAttention

__all__ = [
    "BACKENDS",
    "MultiHeadAttention",
    "math_attention",
    "sdpa_attention",
    "varlen_attention",
]
