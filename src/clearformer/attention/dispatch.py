"""Choosing an attention backend: one signature, chosen by name, the choice explained.

Backends:
    ``math``    the reference (explicit scores and softmax); the only one returning weights.
    ``sdpa``    ``torch.nn.functional.scaled_dot_product_attention`` (fused, linear memory).
    ``varlen``  packed rows without padding (see :mod:`clearformer.attention.varlen`): rows from
                :func:`clearformer.padding.unpad`, or an ``Encoder``, which packs at the stack's
                edge; on CPU one fused SDPA call per sequence, on CUDA ``flash_attn`` if present.
    ``auto``    the fastest backend that can serve the call, with the reason recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("math", "sdpa", "varlen")
BACKEND_NAMES = ("auto", *BACKENDS)


@dataclass(frozen=True)
class BackendChoice:
    """The backend a call runs on and why."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def check_backend_name(backend: str, name: str = "backend") -> str:
    if backend not in BACKEND_NAMES:
        raise ValueError(f"{name} must be one of {BACKEND_NAMES}, got {backend!r}")
    return backend


def select_backend(
    requested: str, *, need_weights: bool, packed: bool, key_padding_only: bool = True
) -> BackendChoice:
    """Resolve ``requested`` for one call.

    Args:
        requested: a name from ``BACKEND_NAMES``.
        need_weights: the caller wants attention weights.
        packed: the rows are already packed (``(N, D)`` with a layout).
        key_padding_only: the mask (if any) is a key-padding mask, which ``varlen`` can serve.

    Raises:
        ValueError: the requested backend cannot serve the call. Never a silent fallback.
    """
    check_backend_name(requested)
    if packed:
        if need_weights:
            raise ValueError(
                "need_weights=True on packed rows: weights need the padded layout and the "
                "'math' backend; run the stack with backend='math'"
            )
        if requested == "math":
            return BackendChoice("math", "packed rows, reference formula per sequence")
        return BackendChoice("varlen", "rows are packed; only varlen attention reads cu_seqlens")
    if need_weights:
        if requested in ("auto", "math"):
            return BackendChoice("math", "weights requested; only the math path returns them")
        raise ValueError(
            f"need_weights=True: the {requested!r} backend cannot return attention weights; "
            "use backend='math' (or 'auto', which picks 'math' when weights are requested)"
        )
    if requested == "varlen" and not key_padding_only:
        raise ValueError(
            "the 'varlen' backend serves key-padding masks (B, T) only, got a (B, Tq, Tk) or "
            "(B, H, Tq, Tk) attention mask; use backend='sdpa' or 'math'"
        )
    if requested == "auto":
        return BackendChoice("sdpa", "fused kernel, no weights requested, padded layout")
    return BackendChoice(requested, "requested by name")
