"""Where a text application's model runs: the ``device=`` of ``TextEncoder.from_pretrained``
and ``CrossEncoder.from_pretrained``, checked before any weight is read.

The applications tokenize on the CPU and hand each padded batch to the model's device; the
embeddings and scores come back as NumPy arrays, so a caller never handles device tensors.
"""

from __future__ import annotations

import torch

# The kinds of device a model may be placed on. Others (meta, xla, a private backend) hold no
# real weights here or have never been tried: refused by name rather than failing mid-call.
DEVICE_TYPES = ("cpu", "cuda", "mps")


def check_device(device: object, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` that this machine has (None: the CPU), or an error that
    names the argument, what it may be and what it was.

    ``"cuda"`` without an index is the current CUDA device, so that every later check (and a
    model's ``next(parameters()).device``) compares equal to it.

    Raises:
        TypeError: neither None, a str nor a ``torch.device``.
        ValueError: not a device name, a kind outside :data:`DEVICE_TYPES`, or one this machine
            (or this PyTorch build) does not have.
    """
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"{name} must be None, a str such as 'cpu' or 'cuda:0', or a torch.device, got "
            f"{type(device).__name__}"
        )
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(
            f"{name} must be a device such as 'cpu', 'cuda' or 'cuda:1', got {device!r}"
        ) from None
    if parsed.type not in DEVICE_TYPES:
        raise ValueError(f"{name} must be one of {', '.join(DEVICE_TYPES)}, got {device!r}")
    if parsed.type == "cpu":
        return torch.device("cpu")
    if parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(
                f"{name}={device!r} needs Apple's Metal (MPS) backend, which this PyTorch "
                f"({torch.__version__}) does not have here; use 'cpu'"
            )
        return parsed
    if not torch.cuda.is_available():
        raise ValueError(
            f"{name}={device!r} needs a CUDA GPU, and this PyTorch ({torch.__version__}) sees "
            f"none; use 'cpu'"
        )
    count = torch.cuda.device_count()
    if parsed.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if parsed.index >= count:
        raise ValueError(
            f"{name}={device!r}: this machine has {count} CUDA device(s), numbered 0 to {count - 1}"
        )
    return parsed


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter: where an application's batches go."""
    return next(model.parameters()).device


__all__ = ["DEVICE_TYPES", "check_device", "model_device"]
