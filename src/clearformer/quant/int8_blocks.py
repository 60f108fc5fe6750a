"""An int8 linear layer with a weight scale per block of 32 inputs, and 16-bit activations.

For ``y = x W^T + b`` with x (M, K) and W (N, K), the weight is rounded to int8 with one
symmetric scale per output channel and block of 32 inputs (the blocks of GGUF's Q8_0), and
each row of x to int16 with one scale per row, at every call:

    W[n, k] ~ s_w[n, b] Q_w[n, k]    s_w[n, b] = max_{k in b} |W[n, k]| / 127,  b = k // 32
    x[m, k] ~ s_x[m] Q_x[m, k]       s_x[m] = max_k |x[m, k]| / 32767

so ``y[m, n] ~ s_x[m] sum_b s_w[n, b] sum_{k in b} Q_x[m, k] Q_w[n, k] + b[n]``. Each block's
sum is exact in int32; the blocks are then added in float32.

Why this scheme beside :class:`~clearformer.quant.int8.Int8Linear` (one scale per output
channel, int8 activations with one scale per row): on large models of random weights the two
roundings contribute about equally to the loss, and one scale per 1,024-3,072 weights rounds
each weight to a coarser grid than one per 32. Blocks of 32 for the weights and 15 bits for the
activations keep the weights as one byte each (plus one float32 scale per 32) and lose about a
quarter of what per-channel int8 loses (``docs/int8.md``), at the price of products that run
at half the int8 rate (two int16 x int16 products per instruction instead of four int8 ones).

The products run in clearformer's AVX512-VNNI kernel (``fast/avx512_int8_blocks.cpp``) where
the CPU has VNNI and the kernel library is built (decided when the layer is made); elsewhere in
float32 on the dequantised weight: the same integers and scales, the sums within float32
rounding of the kernel's.

Dimensions: M rows (tokens), K input width (Kp: K padded to a multiple of 32), N output width,
P = ceil(N / 32) panels of 32 output columns.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from ..cpu import cpu_info
from ..options import Decision
from .float32_buffers import Float32Buffers

BLOCK = 32  # inputs per weight scale
PANEL = 32  # output columns per packed panel (two 16-lane vectors)
WEIGHT_MAX = 127  # symmetric int8
ACTIVATION_MAX = 32767  # symmetric int16
# A block's or a row's largest magnitude below this rounds it to zeros: 32767 / peak would
# overflow float32 near 1e-34, and such values are far below float32's resolution beside the
# layer's other terms. The kernel uses the same bound (avx512_int8_blocks.cpp).
MIN_PEAK = 1e-30


def quantize_blocks(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(N, K) float -> Q (N, Kp) int8 and s (N, Kp / 32) float32, with ``W ~ s[:, k // 32] Q``;
    the padded inputs hold zero weights, and a block whose largest value is below
    :data:`MIN_PEAK` (zeros, or values no float32 scale can resolve) gets scale 0."""
    N, K = weight.shape
    Kp = -(-K // BLOCK) * BLOCK
    padded = torch.zeros(N, Kp, dtype=torch.float32)
    padded[:, :K] = weight.detach().float()  # (N, K) -> (N, Kp), zero weights past K
    blocks = padded.view(N, Kp // BLOCK, BLOCK)  # (N, K) -> (N, Kp/32, 32)
    amax = blocks.abs().amax(dim=2, keepdim=True)  # (N, Kp/32, 1)
    used = amax >= MIN_PEAK
    scale = torch.where(used, amax / WEIGHT_MAX, 0.0)
    q = torch.where(used, blocks / torch.where(used, scale, 1.0), 0.0).round_()
    q.clamp_(-WEIGHT_MAX, WEIGHT_MAX)  # |W / s| <= 127 up to one rounding of the division
    return q.to(torch.int8).view(N, Kp), scale.view(N, Kp // BLOCK)


def pack_weights(q: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's layout: Q (N, Kp) int8 -> (P, Kp/2, 32, 2), s (N, Kp/32) -> (P, Kp/32, 32),
    the last panel padded with zero columns."""
    N, Kp = q.shape
    P = -(-N // PANEL)
    qp = torch.zeros(P * PANEL, Kp, dtype=torch.int8)
    qp[:N] = q
    sp = torch.zeros(P * PANEL, Kp // BLOCK, dtype=torch.float32)
    sp[:N] = scale
    # (P*32, Kp) -> (P, 32, Kp/2, 2) -> (P, Kp/2, 32, 2): a pair of inputs for 32 columns.
    packed = qp.view(P, PANEL, Kp // 2, 2).permute(0, 2, 1, 3).contiguous()
    # (P*32, Kp/32) -> (P, 32, Kp/32) -> (P, Kp/32, 32)
    packed_scale = sp.view(P, PANEL, Kp // BLOCK).permute(0, 2, 1).contiguous()
    return packed, packed_scale


def quantize_activations(rows: Tensor) -> tuple[Tensor, Tensor]:
    """(M, K) float32 -> Q (M, K) int16 values (held in float32) and s (M, 1), rounded as the
    kernel rounds: ``round(x * (32767 / amax))`` with ``32767 / amax`` one float32 division,
    half to even. A row whose largest value is below :data:`MIN_PEAK` (zeros) gets scale 1 and
    zeros; a row holding NaN or an infinity gets scale NaN and zeros, so its outputs are NaN."""
    amax = rows.abs().amax(dim=1, keepdim=True)  # (M, 1); NaN where the row holds a NaN
    finite = torch.isfinite(rows).all(dim=1, keepdim=True)  # (M, 1)
    used = finite & (amax >= MIN_PEAK)
    safe = torch.where(used, amax, 1.0)
    # One division, as the kernel's 32767.0f / peak (a Python number over a tensor would
    # multiply by the reciprocal: two roundings).
    inverse = torch.where(used, torch.full_like(safe, ACTIVATION_MAX) / safe, 0.0)
    q = torch.where(used, rows * inverse, 0.0).round_()
    scale = torch.where(used, amax / ACTIVATION_MAX, 1.0)
    return q, torch.where(finite, scale, torch.nan)


def vnni_here() -> bool:
    """This CPU runs AVX512-VNNI (the kernel's vpdpwssd) and AVX512-BW (its vpmovsxbw)."""
    flags = cpu_info().flags
    return "avx512_vnni" in flags and "avx512bw" in flags


def block_kernel_support() -> Decision:
    """``Decision("available" | "unavailable", reason)``: whether the AVX512-VNNI kernel runs
    here. Builds clearformer's kernel library on first need (half a minute, once per machine:
    :func:`clearformer.fast.avx512.load`); ``CLEARFORMER_KERNELS=off`` turns it off."""
    from .. import switches

    off = switches.all_off()
    if off is not None:
        return Decision("unavailable", f"every clearformer kernel is off ({off.reason})")
    return _built_kernel()


@functools.cache
def _built_kernel() -> Decision:
    if not vnni_here():
        return Decision("unavailable", f"this CPU has no AVX512-VNNI: {cpu_info().summary()}")
    from .. import progress
    from ..fast import avx512

    loaded = avx512.load(build=False)
    if loaded.choice == "not built":
        # A compile of half a minute on two cores, not to be waited through in silence.
        progress.phase("building clearformer's AVX-512 kernels (once per machine)")
        loaded = avx512.load(build=True)
    if loaded.choice != "loaded":
        return Decision("unavailable", f"the kernel library is {loaded.choice}: {loaded.reason}")
    if not hasattr(torch.ops.clearformer_avx512, "int8_block_linear"):
        return Decision("unavailable", "the loaded kernel library has no int8_block_linear")
    return Decision("available", "AVX512-VNNI int8 x int16 products")


def _kernel_op():
    """The built kernel's op, or None where it cannot run here."""
    if block_kernel_support().choice != "available":
        return None
    return torch.ops.clearformer_avx512.int8_block_linear


class Int8BlockLinear(Float32Buffers):
    """``nn.Linear`` with int8 weights in blocks of 32 and int16 activations (inference only).

    Made with :meth:`from_linear`. Inputs may be any float dtype; outputs are float32.

    Buffers:
        weight_packed: (P, Kp/2, 32, 2) int8, :func:`pack_weights`' layout.
        scale_packed: (P, Kp/32, 32) float32.
        bias: (N,) float32 or None.
    """

    FLOAT32_BUFFERS = ("scale_packed", "bias")  # what the kernel reads besides the int8s

    def __init__(
        self, weight_packed: Tensor, scale_packed: Tensor, bias: Tensor | None, shape: tuple
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = shape
        self.register_buffer("weight_packed", weight_packed)
        self.register_buffer("scale_packed", scale_packed)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        # Whether the kernel runs is decided here, once; the op itself is looked up per call
        # (a module holding it could not be pickled).
        self._kernel = _kernel_op() is not None

    @property
    def _op(self):
        return _kernel_op() if self._kernel else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8BlockLinear:
        """Round ``linear``'s weight in blocks (``linear`` is not modified)."""
        if linear.in_features == 0:
            raise ValueError(f"linear.in_features must be at least 1, got {linear.in_features}")
        # Checked as float32, which the rounding reads: a float64 weight beyond float32's range
        # would become infinite there.
        bad = int((~torch.isfinite(linear.weight.detach().float())).sum())
        if bad:
            raise ValueError(
                f"linear.weight must be finite to be rounded to int8, got {bad} NaN or "
                f"infinite values of {linear.weight.numel()}"
            )
        q, scale = quantize_blocks(linear.weight)
        packed, packed_scale = pack_weights(q, scale)
        return cls(packed, packed_scale, linear.bias, tuple(linear.weight.shape))

    def dequantized(self) -> Tensor:
        """The (N, K) float32 weight this layer multiplies by: ``s[n, k // 32] Q[n, k]``."""
        P, half, _, _ = self.weight_packed.shape
        Kp = half * 2
        # (P, Kp/2, 32, 2) -> (P, 32, Kp/2, 2) -> (P*32, Kp)
        q = self.weight_packed.permute(0, 2, 1, 3).reshape(P * PANEL, Kp).float()
        # (P, Kp/32, 32) -> (P, 32, Kp/32) -> (P*32, Kp/32)
        scale = self.scale_packed.permute(0, 2, 1).reshape(P * PANEL, Kp // BLOCK)
        w = q.view(P * PANEL, Kp // BLOCK, BLOCK) * scale[:, :, None]  # (P*32, Kp/32, 32)
        return w.view(P * PANEL, Kp)[: self.out_features, : self.in_features]

    @property
    def weight(self) -> Tensor:
        """The float (N, K) weight this layer stands for (for code that reads ``.weight``)."""
        return self.dequantized()

    def forward(self, x: Tensor) -> Tensor:
        """(..., K) float -> (..., N) float32."""
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"x's last dimension must be in_features={self.in_features}, got shape "
                f"{tuple(x.shape)}"
            )
        rows = x.reshape(-1, self.in_features).float().contiguous()  # (..., K) -> (M, K)
        if self._op is not None and rows.device.type == "cpu":
            packed = (self.weight_packed, self.scale_packed)
            out = self._op(rows, *packed, self.bias, self.out_features)  # (M, N)
        else:
            out = block_linear_reference(rows, self.dequantized(), self.bias)
        return out.view(*x.shape[:-1], self.out_features)  # (M, N) -> (..., N)

    def extra_repr(self) -> str:
        route = "AVX512-VNNI kernel" if self._op is not None else "float32 (no kernel here)"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, weight blocks={BLOCK}, route={route}"
        )


def block_linear_reference(rows: Tensor, dequantized: Tensor, bias: Tensor | None) -> Tensor:
    """The layer's arithmetic in float32: rows (M, K) rounded to int16 per row, times the
    dequantised (N, K) weight, rescaled, plus the bias."""
    q, scale = quantize_activations(rows)
    out = (q @ dequantized.t()).mul_(scale)  # (M, N)
    return out if bias is None else out.add_(bias)


def quantize_int8_blocks(
    model: nn.Module, *, skip: Iterable[str] = (), in_place: bool = False
) -> nn.Module:
    """A copy of ``model`` (or ``model`` itself, ``in_place``) with its ``nn.Linear`` layers as
    :class:`Int8BlockLinear`, except those whose qualified names match a ``skip`` pattern."""
    from .quantize import replace_linears

    def make(_name: str, linear: nn.Linear) -> Int8BlockLinear:
        return Int8BlockLinear.from_linear(linear)

    return replace_linears(model, make, skip=skip, in_place=in_place)
