"""Numeric precision of a run: fp32, bf16 autocast (CPU or GPU), fp16 autocast with a
grad scaler (GPU only)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when present, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' needs a CUDA GPU, and torch sees none; use device='cpu'")
    return torch.device(name)


@dataclass(frozen=True)
class Precision:
    name: str  # fp32 | bf16 | fp16
    device: torch.device

    def __post_init__(self) -> None:
        if self.name == "fp16" and self.device.type != "cuda":
            raise ValueError(
                "precision='fp16' needs a CUDA GPU (its grad scaler and fp16 kernels are "
                f"GPU-only), got device={self.device.type!r}; on CPU use precision='bf16' "
                "or 'fp32'"
            )

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward pass's autocast region (nothing for fp32)."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.name == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """fp16 gradients underflow without loss scaling; bf16 has fp32's range, needs none."""
        return torch.amp.GradScaler("cuda") if self.name == "fp16" else None
