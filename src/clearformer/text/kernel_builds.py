"""The CPU kernels a text call asks to have built: clearformer's AVX-512 attention and
products, once a call is large enough to repay the build (``TextEncoder.encode`` and
``CrossEncoder.predict`` call it before their forward passes)."""

from __future__ import annotations

import torch


def attention_work(lengths: list[int], config) -> int:
    """A call's attention, in multiply-adds of its scores: the sum of each text's squared
    length, times the model's layers, heads and head width (0 without a config)."""
    if config is None:
        return 0
    squares = sum(length * length for length in lengths)
    return squares * config.n_layers * config.n_heads * config.head_width


def attention_kernel_for(tokens: int, device: torch.device, *, attention: int = 0) -> None:
    """On a CPU that can build clearformer's AVX-512 kernels, with no switch off
    (:func:`clearformer.routes.kernels_wanted`), build them for a call that repays the build
    (at least ``BUILD_MIN_TOKENS`` tokens, or ``attention`` (:func:`attention_work`) of at
    least ``BUILD_MIN_ATTENTION``: long texts, whose attention grows with the square of
    their length), and measure them against PyTorch's routes if this CPU has no verdict yet
    (:mod:`clearformer.calibration`): the forward plan takes each kernel where it measured
    faster."""
    from ..fast import avx512
    from ..routes import kernels_wanted

    if (
        device.type == "cpu"
        and (tokens >= avx512.BUILD_MIN_TOKENS or attention >= avx512.BUILD_MIN_ATTENTION)
        and kernels_wanted()
        and avx512.load(build=True).choice == "loaded"
    ):
        from ..calibration.kernels import measure_if_missing

        measure_if_missing()
