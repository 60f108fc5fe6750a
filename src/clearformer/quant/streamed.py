"""The calibrated int8 conversion a block at a time, as the calibration run reaches each block:
the float32 model is never whole in memory.

:func:`~.quantize.quantize_int8_calibrated` (in place) runs the float model once on a few
texts, takes each linear layer's activation maxima, and converts every layer. Here the same run
converts each block as soon as its forward has returned, and ``before(index)`` is called as a
block starts (a loader reads that block's float32 weights then:
:class:`clearformer.interop.hf.deferred.DeferredLayers`). The statistics are the float model's,
to the bit: every block's output is computed by its float layers before they are converted,
so the next block receives what the float model would give it. The result equals
``quantize_int8_calibrated(model, run, in_place=True)`` on the whole float model, bit for bit
(tests/test_int8_streamed.py), and holds one block's float32 weights at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from .int8 import int8_support
from .quantize import (
    DEFAULT_FLOAT_CHANNELS,
    calibrate,
    linear_names,
    outlier_channels,
    quantize_int8,
    quantize_int8_calibrated,
)


def quantize_int8_by_block(
    model: nn.Module,
    run: Callable[[nn.Module], object],
    blocks: Sequence[tuple[str, nn.Module]],
    before: Callable[[int], None],
    *,
    float_channels: int = DEFAULT_FLOAT_CHANNELS,
) -> nn.Module:
    """Convert ``model`` in place as :func:`~.quantize.quantize_int8_calibrated` does, one
    block at a time.

    Args:
        model: the float model; its ``blocks`` may still be unread (meta) until ``before``.
        run: calls the model on the calibration inputs; it must run every block, in order,
            through the block module's ``__call__`` (its hooks).
        blocks: (qualified name, module) of each block, in the order ``run`` calls them.
        before: called with a block's index as that block starts, before its first layer.
        float_channels: input channels per layer kept in float32, as for the whole model.

    Returns:
        ``model``. Where this machine has no int8 products, or ``float_channels`` is 0, every
        block is read first and the whole-model conversion runs (its float32 fallback
        included).

    Raises:
        RuntimeError: ``run`` did not call every block, in order, through its hooks.
    """
    if not int8_support().available or float_channels == 0:
        for index in range(len(blocks)):
            before(index)
        return quantize_int8_calibrated(model, run, float_channels=float_channels, in_place=True)
    names = linear_names(model)  # the modules exist before their weights are read
    stats: dict[str, Tensor] = {}
    converted: list[int] = []

    def starting(index: int):
        return lambda _module, _args, _kwargs: before(index)

    def finished(index: int, prefix: str):
        def hook(_module, _args, _kwargs, _output) -> None:
            layers = [n for n in names if n.startswith(prefix)]
            missing = [n for n in layers if n not in stats]
            if missing:
                raise ValueError(
                    f"the calibration run did not reach these linear layers: {missing}"
                )
            outliers = {n: outlier_channels(stats[n], float_channels) for n in layers}
            # Outside any inference mode the run is in: the int8 tensors keep version
            # counters, as the whole-model conversion's do.
            with torch.inference_mode(False):
                quantize_int8(model, outliers=outliers, in_place=True, within=prefix)
            converted.append(index)

        return hook

    def run_converting(model: nn.Module) -> None:
        handles = []
        try:
            for index, (name, block) in enumerate(blocks):
                handles += [
                    block.register_forward_pre_hook(starting(index), with_kwargs=True),
                    block.register_forward_hook(finished(index, f"{name}."), with_kwargs=True),
                ]
            run(model)
        finally:
            for handle in handles:
                handle.remove()

    calibrate(model, run_converting, names, into=stats)
    if converted != list(range(len(blocks))):
        raise RuntimeError(
            f"the calibration run converted blocks {converted}, expected each of the "
            f"{len(blocks)} in order"
        )
    rest = linear_names(model)  # the layers outside the blocks, still float
    missing = sorted(set(rest) - set(stats))
    if missing:
        raise ValueError(f"the calibration run did not reach these linear layers: {missing}")
    outliers = {n: outlier_channels(stats[n], float_channels) for n in rest}
    return quantize_int8(model, outliers=outliers, in_place=True)


__all__ = ["quantize_int8_by_block"]
