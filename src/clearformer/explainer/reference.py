"""Which path production takes, and the one the trace runs instead when they differ.

Only the ``math`` kernel on the padded layout computes explicit scores and weights. The fused
(``sdpa``) and packed (``varlen``) paths compute the same values without ever holding them, so
a trace of a model that runs them asks its one recorded call for the reference kernel
(``backend="math"``): same modules, same parameters, only the kernel and the layout of that
call differ. Nothing is assigned to any module, so the model can serve other threads meanwhile.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from ..blocks import EncoderBlock
from ..encoder import Encoder
from ..plan_lone import plan_layer

REFERENCE = "math attention on the padded layout"
REFERENCE_BACKEND = "math"

# One lock per model being explained: two explains of one model in training mode must not
# interleave their switch to eval mode and back (the second would see the first's eval mode,
# take it for the model's own and run on while the first restores training). Explains of one
# model therefore take turns; forward passes outside explain never wait for it.
_EXPLAIN_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[bool]:
    """Put ``module`` in eval mode (dropout off); restore each submodule's flag after.

    A module already in eval mode is left untouched (no flag is written), so explaining a
    serving model changes nothing another thread could see. Yields whether any submodule was
    in training mode.
    """
    with _LOCKS_GUARD:
        lock = _EXPLAIN_LOCKS.setdefault(module, threading.Lock())
    with lock:
        # Read under the lock: no other explain of this model is between its switch and its
        # restore, so these are the model's own flags.
        flags = [(m, m.training) for m in module.modules()]
        was_training = any(flag for _, flag in flags)
        if not was_training:
            yield False
            return
        try:
            module.eval()
            yield True
        finally:
            for m, flag in flags:
                m.training = flag


def production_path(
    module: nn.Module, token_mask: Tensor, mask: Tensor | None
) -> tuple[str, str, bool]:
    """The path a plain forward of ``module`` takes on this (B, T) batch, in words; why (the
    plan's reasons, kept apart so that a note never nests them inside its own parentheses);
    and whether it is another path than the reference one."""
    encoder = next((m for m in module.modules() if isinstance(m, Encoder)), None)
    block = next((m for m in module.modules() if isinstance(m, EncoderBlock)), None)
    if block is None:
        return "no attention block", "", False
    B, T = token_mask.shape
    try:
        if encoder is not None:
            plan = encoder.plan_for(mask, shape=(B, T), device=token_mask.device)
        else:
            plan = plan_layer(
                mask,
                batch=B,
                heads=block.attn.n_heads,
                tq=T,
                tk=T,
                device=token_mask.device,
                backend=block.backend,
            )
    except ValueError as exc:  # a configuration production itself would reject
        return "an unavailable path", str(exc), True
    switched = plan.kernel.choice != REFERENCE_BACKEND or plan.packed
    layout = "packed rows" if plan.packed else "the padded layout"
    layout_reason = plan.layout.reason if encoder is not None else "a lone block"
    described = f"{plan.kernel.choice} attention on {layout}"
    why = f"{plan.kernel.choice} attention: {plan.kernel.reason}; {layout}: {layout_reason}"
    if plan.method is not None:  # packed rows: how varlen attends them
        described += f" by the {plan.method.choice} method"
        why += f"; the {plan.method.choice} method: {plan.method.reason}"
    return described, why, switched
