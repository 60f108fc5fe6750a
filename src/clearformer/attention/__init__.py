"""Attention: the multi-head module and its interchangeable backends."""

from .dispatch import BACKEND_NAMES, BACKENDS, BackendChoice, select_backend
from .math import math_attention
from .mha import MultiHeadAttention
from .sdpa import sdpa_attention
from .varlen import varlen_attention

__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "BackendChoice",
    "MultiHeadAttention",
    "math_attention",
    "sdpa_attention",
    "select_backend",
    "varlen_attention",
]
