"""Position information: a learned table or fixed sinusoids (Vaswani et al., 2017)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """(n_positions, d_model): sin on even, cos on odd features, wavelengths 2π … 10000·2π.

    Each pair of features rotates at its own frequency, so a fixed offset between positions is
    a linear map of their encodings, which attention can learn to use.
    """
    position = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
    )  # (ceil(D / 2),)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: d_model // 2])
    return table.float()


def rotary_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Rotary position tables (Su et al., 2021), rotate-half layout, in float32.

    Feature pairs (i, i + Dh/2) of a query and a key are rotated by the angle ``position *
    theta ** (-2i / Dh)``: the dot product of a rotated query and key then depends only on the
    distance between their positions. Computed in float32 whatever the model's dtype: at
    positions in the thousands, half precision loses the angle.

    Args:
        positions: integer positions of any shape P (e.g. (N,) packed or (B, T) padded).
        head_dim: Dh, even.
        theta: the base of the frequencies (10,000 in the paper; ModernBERT's global layers
            use 160,000).

    Returns:
        cos, sin: float32 of shape P + (Dh,).
    """
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    )  # (Dh / 2,)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # P + (Dh / 2,)
    angles = torch.cat([angles, angles], dim=-1)  # P + (Dh,): the same angle for both halves
    return angles.cos(), angles.sin()


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` (..., Dh) by the tables (broadcastable to it), in float32, back to x's dtype:
    ``x * cos + rotate_half(x) * sin``."""
    if torch.is_grad_enabled() and x.requires_grad:
        wide = x.float()  # one copy in half precision, none in float32
        return (wide * cos + rotate_half(wide) * sin).to(x.dtype)
    # The same products and sum, bit for bit, in two buffers written in place: at long inputs
    # a new tensor per step (five of them, as large as the queries) cost more than the
    # arithmetic, each allocation's pages touched anew.
    wide = x.to(torch.float32, copy=True)  # (..., Dh)
    half = x.shape[-1] // 2
    turned = torch.empty_like(wide)  # rotate_half(wide): (x1, x2) -> (-x2, x1)
    turned[..., :half] = wide[..., half:]
    turned[..., :half].neg_()
    turned[..., half:] = wide[..., :half]
    turned.mul_(sin)
    return wide.mul_(cos).add_(turned).to(x.dtype)


def sequence_positions(
    packing, token_mask: Tensor | None, batch: int, length: int, device: torch.device
) -> Tensor:
    """Each row's position within its own sequence, counted over real tokens: (N,) for packed
    rows (``packing``), (B, T) for padded ones, so that a padded row and the same row packed
    get the same position (with right padding, as tokenizers pad, simply 0, 1, 2, ...)."""
    if packing is not None:
        return packing.positions
    if token_mask is None:
        return torch.arange(length, device=device)[None].expand(batch, length)
    return padded_positions(token_mask)


def padded_positions(token_mask: Tensor) -> Tensor:
    """(B, T) bool mask, True = real token -> (B, T) int64: each token's index among its row's
    real tokens (a padded position takes its real neighbour's; its row is zeroed anyway)."""
    return (token_mask.cumsum(dim=1) - 1).clamp(min=0)  # (B, T)


def head_rotary(
    positions: Tensor, head_dim: int, theta: float, *, packed: bool
) -> tuple[Tensor, Tensor]:
    """Rotary tables for ``positions``, shaped to broadcast over the heads of split queries
    and keys: packed (N, Dh) -> (N, 1, Dh); padded (B, T, Dh) -> (B, 1, T, Dh)."""
    cos, sin = rotary_tables(positions, head_dim, theta)  # P + (Dh,)
    axis = -2 if packed else 1
    return cos.unsqueeze(axis), sin.unsqueeze(axis)


def past_pad_ids(
    input_ids: Tensor,
    positions: Tensor | None,
    pad_id: int,
    *,
    real: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
) -> Tensor | None:
    """RoBERTa's learned positions (transformers' ``create_position_ids_from_input_ids``): a
    token counts only the tokens before it that are not the pad id, and a pad id among a
    text's tokens (the text held a literal ``<pad>``) takes the padding position, -1 here
    (``pad_token_id`` once the offset ``pad_token_id + 1`` is added).

    ``positions`` is what the model computed, each token's index among its sequence's real
    tokens: padded (B, T) (None: 0 .. T-1 in every row) with ``real`` (B, T) True at real
    tokens (None: all), or packed (N,) with ``cu_seqlens`` (B + 1,). Returned as it came (the
    same object) where no real token is the pad id, which is every text without a ``<pad>``.
    """
    pads = input_ids == pad_id  # (B, T) or (N,)
    if real is not None:
        pads = pads & real  # the batch's own padding is not counted: it has no position
    if not bool(pads.any()):
        return positions
    if cu_seqlens is None:
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device)  # (T,)
        return padded_past_pads(positions, pads)
    # Packed: the counts restart at each sequence.
    counted = pads.long()
    exclusive = counted.cumsum(dim=0) - counted  # (N,) pad ids before each token, overall
    lengths = cu_seqlens.diff().long()  # (B,)
    starts = cu_seqlens[:-1].long().clamp(max=max(len(counted) - 1, 0))  # (B,)
    numbers = torch.arange(len(lengths), device=lengths.device)  # (B,)
    sequence = torch.repeat_interleave(numbers, lengths)  # (N,) each token's sequence
    before = exclusive - exclusive[starts][sequence]  # (N,) within each token's sequence
    shifted = positions - before
    return torch.where(pads, torch.full_like(shifted, -1), shifted)


def padded_past_pads(positions: Tensor, pads: Tensor) -> Tensor:
    """:func:`past_pad_ids` on a padded batch, computed whatever ``pads`` holds (no branch on
    the values, so that an exported graph keeps it): ``positions`` (B, T) or (T,), ``pads``
    (B, T) True at a real token that is the pad id."""
    counted = pads.long()
    before = counted.cumsum(dim=-1) - counted  # (B, T) pad ids before each token in its row
    shifted = positions - before
    return torch.where(pads, torch.full_like(shifted, -1), shifted)
