"""Running the reference attention path for a trace, and saying which path production takes.

Only the ``math`` backend on the padded layout computes explicit scores and weights. The fused
(``sdpa``) and packed (``varlen``) paths compute the same values without ever holding them, so
a trace of a model configured for them runs the reference path instead: same modules, same
parameters, only the attention kernel and the layout differ. The switch is made on the modules
for the duration of one forward pass and undone in ``finally``; do not run the same model in
another thread while it is being explained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..blocks import EncoderBlock
from ..encoder import Encoder

REFERENCE = "math attention on the padded layout"


@contextmanager
def reference_path(module: nn.Module) -> Iterator[None]:
    """Run every attention inside ``module`` on ``math`` over the padded layout, then restore."""
    backends: list[tuple[MultiHeadAttention, str]] = []
    configs: list[tuple[Encoder, object]] = []
    try:
        for m in module.modules():
            if isinstance(m, MultiHeadAttention):
                backends.append((m, m.backend))
                m.backend = "math"
            elif isinstance(m, Encoder):
                configs.append((m, m.config))
                # backend="math" makes Encoder.layout_for choose the padded layout.
                m.config = dataclasses.replace(m.config, backend="math")
        yield
    finally:
        for m, backend in backends:
            m.backend = backend
        for m, config in configs:
            m.config = config


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[bool]:
    """Put ``module`` in eval mode (dropout off); restore each submodule's flag after.

    Yields whether any submodule was in training mode.
    """
    flags = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        yield any(flag for _, flag in flags)
    finally:
        for m, flag in flags:
            m.training = flag


def production_path(module: nn.Module, mask: Tensor | None) -> tuple[str, bool]:
    """The path a plain forward of ``module`` takes on this mask, in words, and whether it is
    another path than the reference one."""
    encoder = next((m for m in module.modules() if isinstance(m, Encoder)), None)
    block = next((m for m in module.modules() if isinstance(m, EncoderBlock)), None)
    if block is None:
        return "no attention block", False
    packed, why = False, "a lone block"
    if encoder is not None:
        # The stack drops a mask with no padding (the unmasked kernel is faster): say so too.
        if mask is not None and bool(mask.all()):
            mask = None
        choice = encoder.layout_for(mask)
        packed, why = choice.packed, choice.reason
    try:
        backend = block.attn.backend_for(packed=packed)
    except ValueError as exc:  # a configuration production itself would reject
        return f"unavailable ({exc})", True
    switched = backend.name != "math" or packed
    layout = "packed rows" if packed else "the padded layout"
    return f"{backend.name} attention ({backend.reason}) on {layout} ({why})", switched
