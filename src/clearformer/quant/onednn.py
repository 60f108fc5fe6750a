"""The int8 matrix product through oneDNN's matmul primitive, the weight packed once.

On CPU ``torch._int_mm`` calls oneDNN's older GEMM interface (``gemm_s8s8s32``, "gemm_api" in
``ONEDNN_VERBOSE``), which reorders its operands on every call and, at the widths of an
encoder layer with K = 384, runs several times below the rate of oneDNN's matmul primitive on
the same integers (docs/int8.md, "The product", has the table). The quantised-linear op that
PyTorch's own int8 compiler path uses, ``onednn::qlinear_pointwise``, runs that primitive on
AMX tiles, on a weight reordered once into its blocked layout (``onednn::qlinear_prepack``). It
is taken only on CPUs with AMX: without them it computes signed int8 activations in oneDNN's
reference code, thousands of times slower than ``torch._int_mm``
(:func:`onednn_int8_available`).

It is asked for the plain integer product: activation scale 1 and zero point 0, weight scales
1, output float32. oneDNN accumulates the int8 products in int32 and converts the sums to
float32 (exact up to 2^24, rounded to nearest beyond, as ``int32.to(float32)`` does), and the
per-token and per-channel scales stay in the layer's own epilogue, where the bias, activation
and residual join them. The packed copy is derived from the layer's int8 weight and kept beside
it, not on the module (an opaque oneDNN tensor cannot be copied or saved): made on the first
call, made again when the weight is replaced or changed in place (and on every call for an
inference tensor, whose in-place changes leave no trace).
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Packed:
    version: int  # the int8 weight's version counter when it was packed
    storage: int  # and its data pointer (``.data = other`` keeps identity and version)
    packed: Tensor  # oneDNN's blocked copy
    ones: Tensor  # (N,) weight scales of 1
    zero_points: Tensor  # (N,) int64 zeros

    def matches(self, weight: Tensor) -> bool:
        return self.version == weight._version and self.storage == weight.data_ptr()


_lock = threading.Lock()
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()  # int8 weight -> _Packed


def has_amx() -> bool:
    """This CPU has AMX tiles (Intel Xeon from Sapphire Rapids on), as PyTorch detects them."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:
        return False


@functools.cache
def onednn_int8_available() -> bool:
    """Probe once per process: is this a CPU where ``onednn::qlinear_pointwise`` is fast (one
    with AMX, :func:`has_amx`), and does this build's op run here and give the exact integer
    product (against an int32 product of the same integers)?

    Without AMX the op gives the exact product of signed int8 activations, but through
    oneDNN's reference code: on an AMD EPYC with AVX-512 VNNI (Zen 4), 4.9 s for a
    512 x 384 x 1,152 product that ``torch._int_mm`` computes in 1.1 ms (docs/int8.md).
    There ``torch._int_mm`` runs the products."""
    if not has_amx():
        log.info("int8: no AMX on this CPU, so the products run through torch._int_mm")
        return False
    try:
        q = (torch.arange(-96, 96, dtype=torch.int16) % 255 - 127).to(torch.int8)
        q = q.reshape(6, 32)  # (M, K)
        weight = q.flip(0).repeat(2, 1)[:, :32].contiguous()  # (N, K) = (12, 32): any values
        with torch.inference_mode():
            got = int8_product(q, weight)
        want = (q.to(torch.int32) @ weight.to(torch.int32).t()).float()
        exact = torch.equal(got, want)
    except (AttributeError, RuntimeError, NotImplementedError) as error:
        log.info("int8: oneDNN's quantised linear op does not run here: %s", error)
        return False
    if not exact:
        log.warning("int8: oneDNN's quantised linear op gave a wrong product; using _int_mm")
    return exact


def accumulator_dtype() -> torch.dtype:
    """The dtype of the int8 layers' integer sums on CPU in this process: float32 from oneDNN's
    op where it runs (:func:`onednn_int8_available`), else int32 from ``torch._int_mm``. One
    dtype per process, so that the compiled epilogue is compiled for one kind of input."""
    return torch.float32 if onednn_int8_available() else torch.int32


def int8_product(q: Tensor, weight: Tensor) -> Tensor:
    """``q @ weight^T`` of int8 (M, K) and (N, K), summed in int32, as (M, N) float32."""
    copy = _packed_copy(weight)
    return torch.ops.onednn.qlinear_pointwise.default(
        q, 1.0, 0, copy.packed, copy.ones, copy.zero_points, None, 1.0, 0, torch.float32,
        "none", [], "",
    )  # fmt: skip


def _packed_copy(weight: Tensor) -> _Packed:
    if weight.is_inference():
        # An inference tensor (made under inference_mode) has no version counter, so an
        # in-place change of it could not be noticed: its copy is made for this call only, as
        # clearformer.fast.reordered_weights reads such a float weight as it is.
        return _pack(weight, version=-1)
    copy = _packed.get(weight)
    if copy is not None and copy.matches(weight):
        return copy
    with _lock:
        copy = _packed.get(weight)
        if copy is None or not copy.matches(weight):
            copy = _pack(weight, version=weight._version)
            _packed[weight] = copy
    return copy


def _pack(weight: Tensor, version: int) -> _Packed:
    N = weight.shape[0]
    return _Packed(
        version=version,
        storage=weight.data_ptr(),
        packed=torch.ops.onednn.qlinear_prepack(weight, None),
        ones=torch.ones(N),
        zero_points=torch.zeros(N, dtype=torch.int64),
    )
