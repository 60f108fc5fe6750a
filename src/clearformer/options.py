"""The vocabulary below the configuration: every named choice a model or a call can make.

This module imports nothing from the package, so the configuration, the layers and the
converters can all name the same choices without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NORMS = ("pre", "post")  # where a block's LayerNorm sits (see clearformer.blocks)
# Feed-forward activations. The gated ones (GLU variants, Shazeer 2020) name their gate's function:
# swiglu (SiLU: Llama, Qwen3), geglu (exact GELU: ModernBERT), geglu_tanh (tanh GELU: Gemma's
# "gelu_pytorch_tanh").
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh")
GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}
# What a norm computes: LayerNorm (centre and scale, BERT) or RMSNorm (scale only: Qwen3, Gemma).
NORM_KINDS = ("layer", "rms")
# Positions: absolute embeddings added to the tokens (learned, sinusoidal), rotary positions
# applied to queries and keys in every attention layer, or none.
POSITIONS = ("learned", "sinusoidal", "rotary", "none")
# Full attention, or a window around each query (EncoderConfig.local_window says how wide).
LAYER_TYPES = ("global", "local")

# Attention kernels: ``math`` (the reference, the only one returning weights), ``sdpa``
# (PyTorch's fused kernel on padded rows), ``varlen`` (packed rows, no padding computed).
KERNEL_NAMES = ("math", "sdpa", "varlen")
# What a configuration or a call may ask for: a kernel by name, or ``auto`` (the plan decides).
BACKENDS = ("auto", *KERNEL_NAMES)
LAYOUTS = ("padded", "packed")  # (B, T, D) with a mask, or (N, D) real rows with cu_seqlens
# How the varlen kernel attends within packed sequences (see clearformer.fast.varlen).
VARLEN_METHODS = ("auto", "sequence", "padded", "threads", "flash", "avx512")
# A reranked head's order: the cross-encoder's alone, or fused with the first stage's by
# reciprocal rank fusion (clearformer.retrieval.stages.rerank_run).
RERANK_FUSIONS = ("none", "rrf")


@dataclass(frozen=True)
class Decision:
    """One choice made for a call (a layout, a kernel, a method) and why it was made."""

    choice: str
    reason: str
    # The implementation the choice names, where the layers call it without importing it
    # (a route of clearformer.fast); None where the choice is a name the layers look up.
    impl: Any = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.choice} ({self.reason})"
