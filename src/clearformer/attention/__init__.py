"""Attention: the multi-head module; its kernels live in :mod:`clearformer.kernels`, and
attention on packed rows by a method's name in :mod:`clearformer.packed_attention`."""

from ..kernels import math_attention, sdpa_attention
from ..options import BACKENDS
from .mha import MultiHeadAttention

__all__ = ["BACKENDS", "MultiHeadAttention", "math_attention", "sdpa_attention"]
