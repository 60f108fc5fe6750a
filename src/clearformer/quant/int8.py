"""An int8 linear layer: per-channel weight scales, per-token dynamic activation scales.

For ``y = x W^T + b`` with x (M, K) and W (N, K), both factors are rounded to int8 with
symmetric scales, one per row of each:

    W ~ diag(s_w) Q_w     s_w[n] = max_k |W[n, k]| / 127      once, at conversion
    x ~ diag(s_x) Q_x     s_x[m] = max_k |x[m, k]| / 127      every call, per token

so ``x W^T ~ diag(s_x) (Q_x Q_w^T) diag(s_w)``: one int8 x int8 matrix product accumulated in
int32 (oneDNN's quantised linear op on CPU, :mod:`.onednn`, else ``torch._int_mm``; VNNI on x86
does four int8 products per lane per instruction, AMX a tile at a time), then
one rescale by the outer product of the scales, and the bias added in float32. A scale per
token, not per tensor, is what keeps the accuracy: one token with a large activation would
otherwise coarsen the grid of every other token in the batch (``torch.ao``'s dynamic
quantisation uses one scale per tensor; see ``docs/int8.md`` for the measured difference).

Optional smoothing (SmoothQuant, Xiao et al. 2023): a per-input-channel factor c multiplies
the activations before they are rounded and W's columns are divided by it at conversion, so
``(x diag(c)) (W diag(1/c))^T = x W^T`` exactly while the activations' outlier channels shrink
and the weights' grow, which splits the rounding error more evenly between the two factors.

Dimensions: M rows (tokens), K input width, N output width.
"""

from __future__ import annotations

import functools
import logging
import platform
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .. import switches
from ..cpu import cpu_info
from .float32_buffers import Float32Buffers
from .fused import fused_steps
from .onednn import int8_product, onednn_int8_available

log = logging.getLogger(__name__)

QMAX = 127  # symmetric int8: [-127, 127], so that -q is always representable
# CPU features that run int8 dot products natively (x86 VNNI / AMX; Arm dot product / i8mm).
INT8_CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


@dataclass(frozen=True)
class Int8Support:
    """Whether this machine runs int8 matrix products fast, and why (or why not)."""

    available: bool
    reason: str


def _cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags (:func:`clearformer.cpu.cpu_info`), or None where unread."""
    return cpu_info().flags or None


@functools.cache
def int8_support() -> Int8Support:
    """Probe once per process: does ``torch._int_mm`` run here, exactly, on int8 hardware?

    A CPU without int8 dot-product instructions still runs ``_int_mm`` (in a slow generic
    kernel), slower than float32: there int8 is refused, so the caller can fall back.
    """
    try:
        a = torch.arange(-64, 64, dtype=torch.int8).repeat(32, 1)[:, :64].contiguous()  # (32, 64)
        b = a.t().flip(0).contiguous()  # (64, 32): any values; the check is exactness
        got = torch._int_mm(a, b)
        exact = torch.equal(got, a.to(torch.int32) @ b.to(torch.int32))
    except (RuntimeError, NotImplementedError, AttributeError) as error:
        return Int8Support(False, f"torch._int_mm does not run here: {error}")
    if not exact:
        return Int8Support(False, "torch._int_mm gave a wrong result in the start-up probe")
    flags = _cpu_flags()
    if flags is None:
        return Int8Support(True, f"torch._int_mm runs ({platform.machine()}; CPU flags unread)")
    found = sorted(flags.intersection(INT8_CPU_FLAGS))
    if not found:
        return Int8Support(
            False,
            f"this CPU has no int8 dot-product instructions (none of {', '.join(INT8_CPU_FLAGS)})"
            ": int8 products would be slower than float32",
        )
    return Int8Support(True, f"torch._int_mm runs on {', '.join(found)}")


def quantize_rows(x: Tensor, leave_out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Symmetric int8 rounding with one scale per row.

    Args:
        x: (M, K) float.
        leave_out: (k_o,) int64 column indices whose values do not set the scale; they are
            clamped to +-127 in q (the caller computes them another way).

    Returns:
        q (M, K) int8 and scale (M, 1) float32 with ``x ~ scale * q`` (outside ``leave_out``);
        a row of zeros gets scale 1 (any scale rounds it to zeros).
    """
    if x.shape[1] == 0:
        return x.to(torch.int8), x.new_ones(x.shape[0], 1)
    magnitude = x.abs()  # (M, K)
    if leave_out is not None:
        magnitude.index_fill_(1, leave_out, 0.0)
    amax = magnitude.amax(dim=1, keepdim=True)  # (M, 1)
    scale = torch.where(amax > 0, amax / QMAX, 1.0)  # (M, 1)
    # One float32 temporary, rounded in place, then one cast. Without left-out columns
    # |x / scale| <= 127 up to one rounding of the division, which round() cannot push to 128,
    # so no clamp is needed.
    q = torch.div(x, scale, out=magnitude).round_()
    if leave_out is not None:
        q.clamp_(-QMAX, QMAX)
    return q.to(torch.int8), scale


def _int_mm_fits(m: int, k: int, n: int, device: torch.device) -> bool:
    """Shapes ``torch._int_mm`` takes: any on CPU; on CUDA M > 16 and K, N multiples of 8."""
    if device.type == "cuda":
        return m > 16 and k % 8 == 0 and n % 8 == 0
    return True


class Int8Linear(Float32Buffers):
    """``nn.Linear`` with int8 weights and int8 activations (inference only).

    Made with :meth:`from_linear`. Inputs and outputs stay float32; only the matrix product is
    int8. Shapes ``torch._int_mm`` does not take, and machines where it does not run, compute
    the same rounded product in float32 (exact up to float rounding): the result does not
    depend on the route.

    Buffers:
        weight_int8: (N, K) int8, rounded ``W diag(1/c)``.
        weight_scale: (N,) float32, one scale per output channel.
        smooth: (K,) float32 factor c applied to the activations, or None.
        bias: (N,) float32 or None, added after the rescale.
    """

    # The float tensors its arithmetic reads (the derived _keep and _w_o_t too).
    FLOAT32_BUFFERS = ("weight_scale", "bias", "smooth", "weight_outliers", "_keep", "_w_o_t")

    def __init__(
        self,
        weight_int8: Tensor,
        weight_scale: Tensor,
        bias: Tensor | None = None,
        smooth: Tensor | None = None,
        outliers: Tensor | None = None,
        weight_outliers: Tensor | None = None,
    ) -> None:
        super().__init__()
        if weight_int8.dtype != torch.int8 or weight_int8.dim() != 2:
            raise ValueError(
                f"weight_int8 must be a 2-D int8 tensor, got {weight_int8.dtype} with shape "
                f"{tuple(weight_int8.shape)}"
            )
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8.contiguous())
        self.register_buffer("weight_scale", weight_scale.reshape(-1).float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.register_buffer("smooth", None if smooth is None else smooth.float().contiguous())
        if (outliers is None) != (weight_outliers is None):
            raise ValueError("give outliers and weight_outliers together")
        self.register_buffer("outliers", None if outliers is None else outliers.long())
        self.register_buffer(
            "weight_outliers", None if weight_outliers is None else weight_outliers.float()
        )  # (N, k_o)
        self._use_int_mm = int8_support().available
        self._use_onednn = self._use_int_mm and onednn_int8_available()
        # Derived once for the compiled steps: a 0/1 mask of the channels that set the scale,
        # and the float weights of the others as (k_o, N) rows.
        keep = None
        if outliers is not None:
            keep = torch.ones(self.in_features).index_fill_(0, self.outliers, 0.0)
        self.register_buffer("_keep", keep, persistent=False)
        w_o_t = None if weight_outliers is None else self.weight_outliers.t().contiguous()
        self.register_buffer("_w_o_t", w_o_t, persistent=False)
        self.fused = False  # set by quantize_int8(fused=True): the compiled element-wise steps

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, smooth: Tensor | None = None, outliers: Tensor | None = None
    ) -> Int8Linear:
        """Round ``linear``'s weight per output channel.

        Args:
            linear: the float layer (not modified).
            smooth: (K,) positive factors c: the activations are multiplied by c at call time,
                the weight's columns divided by it here (see the module docstring).
            outliers: (k_o,) input channels computed in float32: their weight columns are kept
                in float and zeroed in the int8 weight, and their activations do not set the
                per-token scale (LLM.int8()'s decomposition, Dettmers et al. 2022).
        """
        weight = linear.weight.detach().float()  # (N, K)
        if smooth is not None:
            smooth = smooth.detach().float().reshape(-1)
            if smooth.shape[0] != weight.shape[1] or not bool((smooth > 0).all()):
                raise ValueError(
                    f"smooth must hold {weight.shape[1]} positive factors, got shape "
                    f"{tuple(smooth.shape)}"
                )
            weight = weight / smooth  # columns: W diag(1/c)
        weight_outliers = None
        if outliers is not None:
            outliers = torch.as_tensor(outliers, dtype=torch.long).reshape(-1)
            bad = outliers.numel() and (outliers.min() < 0 or outliers.max() >= weight.shape[1])
            if bad:
                raise ValueError(f"outliers must index the {weight.shape[1]} input channels")
            weight_outliers = weight[:, outliers].contiguous()  # (N, k_o)
            weight = weight.index_fill(1, outliers, 0.0)
        q, scale = quantize_rows(weight)
        return cls(q, scale.reshape(-1), linear.bias, smooth, outliers, weight_outliers)

    @property
    def weight(self) -> Tensor:
        """The float (N, K) weight this layer stands for: ``diag(s_w) Q_w diag(c)`` (for code
        that reads ``.weight``, e.g. a split projection; the forward never uses it)."""
        w = self.weight_int8.float() * self.weight_scale[:, None]
        if self.outliers is not None:
            w[:, self.outliers] = self.weight_outliers
        return w if self.smooth is None else w * self.smooth

    def forward(self, x: Tensor) -> Tensor:
        """(..., K) float -> (..., N) float32."""
        fused = self.fused_call(x)
        if fused is not None:
            return fused
        K = self.in_features
        rows = x.reshape(-1, K).float()  # (M, K)
        if self.smooth is not None:
            rows = rows * self.smooth
        if self.outliers is None:
            q, x_scale = quantize_rows(rows)  # (M, K) int8, (M, 1)
        else:
            # The outlier channels are left out of each row's scale (they saturate in q, where
            # their weight columns are zero) and multiply their float32 weights instead.
            q, x_scale = quantize_rows(rows, leave_out=self.outliers)
        return self._finish(q, x_scale, rows, x.shape[:-1])

    def fused_call(
        self, x: Tensor, activation: str | None = None, residual: Tensor | None = None
    ) -> Tensor | None:
        """``self(x)``, ``activation(self(x))`` or ``self(x) + residual`` through the compiled
        steps, the activation or the residual add inside the epilogue's loop
        (:func:`clearformer.fast.fused_linear.linear` calls it); None where this layer does not run
        compiled steps (not :attr:`fused`, a single row, no compiler here, every clearformer
        kernel switched off by ``CLEARFORMER_KERNELS=off``): the caller then
        runs the eager layer and applies the two itself. x (..., K), residual (..., N)."""
        if activation is not None and residual is not None:
            raise ValueError("fused_call applies an activation or a residual add, not both")
        if not self.fused or switches.kernel_setting("int8_steps").choice == "off":
            return None  # CLEARFORMER_KERNELS=off: the eager steps, even where compiled
        rows = x.reshape(-1, self.in_features).float()  # (..., K) -> (M, K)
        steps = fused_steps() if rows.shape[0] > 1 else None
        if steps is None:
            return None
        q, x_scale, x_o = steps.prologue(rows, self.smooth, self._keep, self.outliers)
        scaled = (self._product(q), x_scale, self.weight_scale, self.bias, x_o, self._w_o_t)
        if activation is not None:
            out = steps.activated_epilogue(activation, *scaled)
        elif residual is not None:
            other = residual.reshape(rows.shape[0], self.out_features)  # (..., N) -> (M, N)
            out = steps.residual_epilogue(other, *scaled)
        else:
            out = steps.epilogue(*scaled)
        return out.view(*x.shape[:-1], self.out_features)  # (M, N) -> (..., N)

    def _product(self, q: Tensor) -> Tensor:
        """(M, K) int8 -> (M, N) int32 (or the same integers in float32)."""
        M, K, N = q.shape[0], self.in_features, self.out_features
        if self._use_onednn and M > 0 and q.device.type == "cpu":
            acc = int8_product(q, self.weight_int8)  # (M, N) float32 of the int32 sums
        elif self._use_int_mm and _int_mm_fits(M, K, N, q.device):
            acc = torch._int_mm(q, self.weight_int8.t())  # (M, N) int32, exact
        else:
            # The same integers in float32: exact while K * 127^2 < 2^24 (K <= 1040), within
            # float rounding beyond.
            acc = q.float() @ self.weight_int8.float().t()
        return acc

    def _finish(self, q: Tensor, x_scale: Tensor, rows: Tensor, lead: torch.Size) -> Tensor:
        acc = self._product(q)
        out = torch.mul(acc, x_scale)  # (M, N) float32: int32 * float promotes in one pass
        if self.outliers is not None:
            # bias + x_o W_o^T, then + (s_x acc) * s_w: one product of width k_o, one pass.
            base = rows.index_select(1, self.outliers)  # (M, k_o)
            if self.bias is None:
                base = base @ self.weight_outliers.t()
            else:
                base = torch.addmm(self.bias, base, self.weight_outliers.t())  # (M, N)
            out = torch.addcmul(base, out, self.weight_scale, out=base)
        elif self.bias is None:
            out.mul_(self.weight_scale)
        else:
            torch.addcmul(self.bias, out, self.weight_scale, out=out)
        return out.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        route = "torch._int_mm" if self._use_int_mm else "float32 (no int8 products here)"
        route += ", compiled steps" if self.fused else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, smooth={self.smooth is not None}, "
            f"float_channels={0 if self.outliers is None else self.outliers.numel()}, route={route}"
        )
