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
