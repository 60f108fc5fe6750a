"""The dtype a call computes in, and the check of a call's input rows: their dtype (the
model's), shape and device (:func:`check_rows`).

Both look at autocast: under it the layers cast their inputs themselves, and attention sees
autocast's dtype rather than the rows' own (which decides the kernel the plan may choose).

A model's dtype is that of its matrix products' parameters (:func:`rows_dtype`): a bfloat16
copy (:func:`clearformer.precision.bf16_copy`) keeps its norms' parameters in float32, and
its rows are bfloat16 all the same.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .padding import PackedLayout


def _autocast_on(device: torch.device) -> bool:
    try:
        return torch.is_autocast_enabled(device.type)
    except RuntimeError:  # a device type autocast does not know (meta): no autocast there
        return False


def compute_dtype(device: torch.device, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype attention will see: autocast's when it is on, else the rows' own."""
    if _autocast_on(device):
        return torch.get_autocast_dtype(device.type)
    return torch.float32 if dtype is None else dtype


# Modules whose parameters may be kept in float32 while the rows are in a narrower dtype:
# PyTorch's LayerNorm reads float32 parameters on bfloat16 or float16 rows.
NORM_MODULES = (nn.LayerNorm,)


def rows_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype rows entering ``module`` must have: its first floating-point parameter's
    outside the norms (None: it has none, an int8 model's layers say nothing)."""
    fallback = None
    for sub in module.modules():
        for tensor in sub._parameters.values():
            if tensor is None or not tensor.is_floating_point():
                continue
            if not isinstance(sub, NORM_MODULES):
                return tensor.dtype
            fallback = tensor.dtype if fallback is None else fallback
    return fallback  # a module of norms only: theirs


def check_rows_dtype(rows: Tensor, name: str, module: torch.nn.Module) -> None:
    """Raise TypeError unless ``rows`` are floating point in the dtype of ``module``'s floating
    parameters, before any work: otherwise the first matrix product or norm fails deep inside
    with a message that names neither the argument nor the fix. Under autocast the layers cast
    their inputs themselves, and a module without floating parameters (int8) is not checked."""
    if not rows.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {rows.dtype}")
    want = rows_dtype(module)
    if want is None or rows.dtype == want or _autocast_on(rows.device):
        return
    raise TypeError(
        f"{name} must have the dtype of the model's parameters, {want}, got {rows.dtype}; "
        f"convert the input ({name}.to({want})) or the model (.to({rows.dtype}))"
    )


def check_rows(
    rows: Tensor, name: str, module: nn.Module, width: int, packing: PackedLayout | None
) -> torch.dtype:
    """Raise unless ``rows`` are (B, T, ``width``) rows (or (N, ``width``) rows of ``packing``)
    in ``module``'s dtype; return the dtype attention computes in."""
    if not isinstance(rows, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(rows).__name__}")
    check_rows_dtype(rows, name, module)
    if packing is None and (rows.dim() != 3 or rows.shape[-1] != width):
        raise ValueError(f"{name} must have shape (B, T, d_model={width}), got {tuple(rows.shape)}")
    if packing is not None:
        if rows.dim() != 2 or rows.shape[-1] != width:
            raise ValueError(
                f"{name} must have shape (N, d_model={width}) with cu_seqlens, got "
                f"{tuple(rows.shape)}"
            )
        if rows.shape[0] != packing.num_tokens:
            raise ValueError(
                f"{name} has N={rows.shape[0]} rows but cu_seqlens ends at {packing.num_tokens}"
            )
        if rows.device != packing.cu_seqlens.device:
            raise ValueError(
                f"{name} must be on cu_seqlens' device {packing.cu_seqlens.device}, got "
                f"{rows.device}"
            )
    return compute_dtype(rows.device, rows.dtype)
