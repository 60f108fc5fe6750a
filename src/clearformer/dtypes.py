"""The dtype a call computes in, and the check that input rows are in the model's dtype.

Both look at autocast: under it the layers cast their inputs themselves, and attention sees
autocast's dtype rather than the rows' own (which decides the kernel the plan may choose).
"""

from __future__ import annotations

import torch
from torch import Tensor


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


def check_rows_dtype(rows: Tensor, name: str, module: torch.nn.Module) -> None:
    """Raise TypeError unless ``rows`` are floating point in the dtype of ``module``'s floating
    parameters, before any work: otherwise the first matrix product or norm fails deep inside
    with a message that names neither the argument nor the fix. Under autocast the layers cast
    their inputs themselves, and a module without floating parameters (int8) is not checked."""
    if not rows.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {rows.dtype}")
    want = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    if want is None or rows.dtype == want or _autocast_on(rows.device):
        return
    raise TypeError(
        f"{name} must have the dtype of the model's parameters, {want}, got {rows.dtype}; "
        f"convert the input ({name}.to({want})) or the model (.to({rows.dtype}))"
    )
