"""Philox4x32-10, the counter-based random generator behind clearformer's dropout masks, in
PyTorch's integer ops: the definition that the AVX-512 dropout kernel
(``fast/avx512_dropout.cpp``) reproduces bit for bit.

A counter-based generator computes the n-th random word from (key, n) alone, with no state
carried from one word to the next (Salmon et al., "Parallel random numbers: as easy as 1, 2,
3", SC 2011). So any thread can draw any slice of a mask, in any order, and the mask depends
on neither the thread count nor the schedule; backward redraws the mask from its key instead
of storing it. PyTorch's CPU generator (Mersenne Twister) draws one word after another on one
thread.

The words of a mask of ``count`` elements under a 64-bit ``seed`` (the key's two words, low
first): element ``i`` takes word ``(i % 64) // 16`` of the block whose counter is
``((i // 64) * 16 + i % 16, 0, 0)`` as a 64-bit number in the first two counter words (low
first). That order lets a 16-lane vector unit compute 16 blocks at once and store each output
word as 16 consecutive elements.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["philox4x32", "mask_words"]

_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
_ROUNDS = 10
_LOW = 0xFFFFFFFF


def _mulhilo(a: Tensor, multiplier: int) -> tuple[Tensor, Tensor]:
    """(high, low) 32-bit words of a * multiplier for uint32 words held in int64 tensors,
    by 16-bit halves so that no product leaves int64."""
    a_high, a_low = a >> 16, a & 0xFFFF
    m_high, m_low = multiplier >> 16, multiplier & 0xFFFF
    middle = a_high * m_low + a_low * m_high  # < 2**33
    low_sum = a_low * m_low + ((middle & 0xFFFF) << 16)  # < 2**33
    high = a_high * m_high + (middle >> 16) + (low_sum >> 32)
    return high & _LOW, low_sum & _LOW


def philox4x32(counter: tuple[Tensor, ...], key: tuple[int, int]) -> tuple[Tensor, ...]:
    """The four output words of Philox4x32-10 for counter words ``counter`` (four int64
    tensors of uint32 values, broadcastable) under the key ``key`` (two uint32 words)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_ in range(_ROUNDS):
        if round_:
            k0, k1 = (k0 + _KEY_STEPS[0]) & _LOW, (k1 + _KEY_STEPS[1]) & _LOW
        high0, low0 = _mulhilo(c0, _MULTIPLIERS[0])
        high1, low1 = _mulhilo(c2, _MULTIPLIERS[1])
        c0, c1, c2, c3 = high1 ^ c1 ^ k0, low1, high0 ^ c3 ^ k1, low0
    return c0, c1, c2, c3


def mask_words(seed: int, count: int) -> Tensor:
    """The ``count`` uint32 words (as int64) a mask under ``seed`` draws, in element order."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    groups = -(-count // 64)
    block = torch.arange(groups * 16, dtype=torch.int64)  # (G * 16,): block g * 16 + lane
    zero = torch.zeros_like(block)
    words = philox4x32((block & _LOW, block >> 32, zero, zero), (seed & _LOW, seed >> 32))
    # 4 x (G * 16,) -> (G, 4, 16): group g's word w fills its elements 16 w ... 16 w + 15
    stacked = torch.stack([w.view(groups, 16) for w in words], dim=1)
    return stacked.reshape(-1)[:count]
