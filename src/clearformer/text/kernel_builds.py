"""The CPU kernels a text call asks to have built: clearformer's AVX-512 attention and
products, once a call is large enough to repay the build (``TextEncoder.encode`` and
``CrossEncoder.predict`` call it before their forward passes)."""

from __future__ import annotations

import torch


def attention_kernel_for(tokens: int, device: torch.device) -> None:
    """On a CPU that can build clearformer's AVX-512 kernels, with no switch off
    (:func:`clearformer.routes.kernels_wanted`), build them for a call of at least
    ``BUILD_MIN_TOKENS`` tokens, which repays the build, and measure them against PyTorch's
    routes if this CPU has no verdict yet (:mod:`clearformer.calibration`): the forward plan
    takes each kernel where it measured faster."""
    from ..fast import avx512
    from ..routes import kernels_wanted

    if (
        device.type == "cpu"
        and tokens >= avx512.BUILD_MIN_TOKENS
        and kernels_wanted()
        and avx512.load(build=True).choice == "loaded"
    ):
        from ..calibration.kernels import measure_if_missing

        measure_if_missing()
