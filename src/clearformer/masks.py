"""The one mask convention of clearformer, and the helper that enforces it.

Convention: a mask is a ``torch.bool`` tensor and **True means "takes part"**
(the key may be attended to). This is the seeds' convention and SDPA's.

Accepted shapes (B batch, H heads, Tq queries, Tk keys):

* ``(B, Tk)``         key-padding mask: padded keys are False;
* ``(B, Tq, Tk)``     attention mask shared by all heads;
* ``(B, H, Tq, Tk)``  attention mask per head.

``is_causal=True`` adds a causal constraint aligned to the bottom-right corner:
query ``i`` may attend key ``j`` when ``j <= i + (Tk - Tq)``. For self-attention
(Tq == Tk) that is the usual lower triangle; with a key/value cache it lets the
newest query see every cached key.

Conversions from other conventions happen at the edges only:
``from_key_padding_mask`` (torch.nn: True = ignore) and ``from_attention_mask``
(Hugging Face: 1 = keep, 0 = pad).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "prepare_attention_mask",
    "validate_key_padding_mask",
    "causal_mask",
    "fold_causal",
    "band_mask",
    "rows_with_key",
    "keys_in_use",
    "layer_masks",
    "from_key_padding_mask",
    "from_attention_mask",
]


def _reject_non_bool(mask: Tensor, name: str) -> None:
    if mask.dtype == torch.bool:
        return
    if mask.is_floating_point():
        hint = (
            f"an additive float mask cannot be converted safely; build a bool mask, "
            f"e.g. `{name} = additive_mask == 0`"
        )
    else:
        hint = (
            f"for a 0/1 (Hugging Face style) mask use `{name}.bool()` or "
            "`clearformer.masks.from_attention_mask(...)`; for torch.nn's key_padding_mask "
            "(True = ignore) use `clearformer.masks.from_key_padding_mask(...)`"
        )
    raise TypeError(
        f"{name} must be a torch.bool tensor (True = takes part), got dtype {mask.dtype}; {hint}"
    )


def validate_key_padding_mask(
    mask: Tensor | None, batch: int, length: int, device: torch.device, name: str = "mask"
) -> Tensor | None:
    """Check a ``(B, T)`` bool key-padding mask and return it unchanged.

    Raises:
        TypeError: the mask is not a bool tensor.
        ValueError: wrong shape or device.
    """
    prepare_attention_mask(
        mask,
        batch=batch,
        heads=1,
        tq=length,
        tk=length,
        device=device,
        name=name,
        key_padding_only=True,
    )
    return mask


def causal_mask(tq: int, tk: int, device: torch.device | None = None) -> Tensor:
    """Bottom-right aligned causal mask of shape ``(Tq, Tk)``: True where query i may see key j."""
    rows = torch.arange(tq, device=device).unsqueeze(1)  # (Tq, 1)
    cols = torch.arange(tk, device=device).unsqueeze(0)  # (1, Tk)
    return cols <= rows + (tk - tq)


def band_mask(tq: int, window: int, device: torch.device | None = None) -> Tensor:
    """(1, 1, T, T) bool: query i may see key j when |i - j| <= ``window`` (a local, symmetric,
    inclusive window of 2 * window + 1 keys)."""
    steps = torch.arange(tq, device=device)
    return ((steps[:, None] - steps[None, :]).abs() <= window)[None, None]


def fold_causal(mask: Tensor | None, tq: int, tk: int, device: torch.device) -> Tensor:
    """``mask`` (4-D bool, or None) with the bottom-right aligned causal constraint folded in."""
    causal = causal_mask(tq, tk, device)[None, None]  # (1, 1, Tq, Tk)
    return causal if mask is None else mask & causal


def prepare_attention_mask(
    mask: Tensor | None,
    *,
    batch: int,
    heads: int,
    tq: int,
    tk: int,
    device: torch.device,
    is_causal: bool = False,
    name: str = "mask",
    key_padding_only: bool = False,
) -> Tensor | None:
    """Validate ``mask`` and normalise it to a 4-D bool tensor that broadcasts to (B, H, Tq, Tk).

    This is the one place a mask is checked: a forward plan calls it once per call, and every
    layer below trusts the result.

    Args:
        key_padding_only: accept only the ``(B, Tk)`` form (what a stack can pack).

    Returns:
        ``None`` when nothing is masked (no mask, not causal); otherwise a bool tensor of shape
        ``(B, 1, 1, Tk)`` (key padding), ``(B, 1, Tq, Tk)``, ``(B, H, Tq, Tk)`` or
        ``(1, 1, Tq, Tk)`` (causal only). A causal constraint is folded in with ``&``.
    """
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
        _reject_non_bool(mask, name)
        shape = tuple(mask.shape)
        if key_padding_only and shape != (batch, tk):
            raise ValueError(f"{name} must have shape (B, T) = ({batch}, {tk}), got {shape}")
        if mask.device != device:
            raise ValueError(f"{name} must be on device {device} like the input, got {mask.device}")
        if shape == (batch, tk):
            mask = mask[:, None, None, :]  # (B, 1, 1, Tk)
        elif shape == (batch, tq, tk):
            mask = mask[:, None, :, :]  # (B, 1, Tq, Tk)
        elif shape == (batch, heads, tq, tk):
            pass
        else:
            raise ValueError(
                f"{name} must have shape (B, Tk) = ({batch}, {tk}), (B, Tq, Tk) = "
                f"({batch}, {tq}, {tk}) or (B, H, Tq, Tk) = ({batch}, {heads}, {tq}, {tk}), "
                f"got {shape}"
            )
    if is_causal:
        mask = fold_causal(mask, tq, tk, device)
    return mask


def rows_with_key(mask: Tensor | None, device: torch.device) -> Tensor | None:
    """Which query rows have a key, or None when all of them do (checked on CPU only).

    A row with no key to attend must give zeros: the kernels open such rows to every key (finite
    values) and zero them after. Reading the answer on CPU is free; on an accelerator it would
    wait for the device and under torch.compile break the graph, so there the rows stay marked.
    """
    if mask is None:
        return None
    has_key = mask.any(dim=-1, keepdim=True)  # (B, H|1, Tq|1, 1)
    if device.type == "cpu" and not torch.compiler.is_compiling() and bool(has_key.all()):
        return None
    return has_key


def keys_in_use(mask: Tensor | None, device: torch.device) -> Tensor | None:
    """(B, H|1, Tk, 1) bool: whether any query may attend each key; None when every key is
    used or no mask is given (checked on CPU only; elsewhere the tensor is always returned)."""
    if mask is None:
        return None
    used = mask.any(dim=-2).unsqueeze(-1)  # (B, H|1, Tk, 1)
    if device.type == "cpu" and not torch.compiler.is_compiling() and bool(used.all()):
        return None
    return used


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """torch.nn's ``key_padding_mask`` (True = ignore) -> clearformer's (True = takes part)."""
    if key_padding_mask.dtype == torch.bool:
        return ~key_padding_mask
    # Additive float masks (0 = keep, -inf = ignore) and 0/1 integer masks (1 = ignore).
    return key_padding_mask == 0


def from_attention_mask(attention_mask: Tensor, name: str = "attention_mask") -> Tensor:
    """Hugging Face's ``attention_mask`` (1 = keep, 0 = pad; any integer or bool dtype) -> bool.
    ``name``: the caller's argument, for the errors."""
    if not isinstance(attention_mask, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of 0/1 or bools, got {type(attention_mask).__name__}"
        )
    if attention_mask.dtype == torch.bool:
        return attention_mask
    if attention_mask.is_floating_point():
        raise TypeError(
            f"{name} must hold 0/1 integers or bools (1 = keep, 0 = pad), got a float "
            f"tensor of dtype {attention_mask.dtype}"
        )
    values = torch.unique(attention_mask)
    if not bool(((values == 0) | (values == 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1, got values {values.tolist()[:8]}")
    return attention_mask.bool()


def layer_masks(
    token_mask: Tensor | None,
    length: int,
    device: torch.device,
    is_causal: bool,
    window: int | None,
    slab: bool,
    padded: bool,
) -> dict:
    """What one kind of layer's attention reads of a stack call's (B, T) key-padding mask
    (``token_mask``, None: no padding), as :class:`~clearformer.forward_plan.LayerPlan` fields:
    on packed rows nothing (each sequence attends to itself; the kernel applies the causal flag
    and the ``window``); on padded rows the key-padding, causal and band constraints folded
    into one mask, once for all layers of the kind, and which queries have a key. ``slab``: a
    long local layer the kernel runs slab by slab (it reads the key mask alone)."""
    if not padded:
        return dict(is_causal=is_causal)
    keys = None if token_mask is None else token_mask[:, None, None, :]  # (B, 1, 1, T)
    if slab:
        # Long rows: the kernel goes slab by slab, so no (T, T) band is ever built here. It
        # reads the key-padding mask alone and applies the causal flag itself.
        return dict(mask=keys, is_causal=is_causal)
    # An unmasked causal global layer keeps the flag instead: sdpa has a fast causal path.
    mask, band_in_mask = keys, False
    if is_causal and (keys is not None or window is not None):
        mask, is_causal = fold_causal(keys, length, length, device), False
    if window is not None:
        # A padded query farther than the window from every real key has no key: its row is
        # zeroed by the kernel.
        band = band_mask(length, window, device)  # (1, 1, T, T)
        mask, band_in_mask = (band if mask is None else mask & band), True
    return dict(
        mask=mask,
        query_has_key=rows_with_key(mask, device),
        is_causal=is_causal,
        band_in_mask=band_in_mask,
    )
