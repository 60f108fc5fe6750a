"""Conversions between clearformer and other libraries' layers and checkpoints.

Converters depend on the core, never the reverse: ``torch_nn`` (torch.nn layers and stacks),
``seeds`` (the two seed layers), ``hf`` (Hugging Face checkpoints).
"""

from .torch_nn import from_torch, to_torch

__all__ = ["from_torch", "to_torch"]
