"""bfloat16 inference: a copy of a model with bfloat16 weights, and what the CPU offers for it.

bfloat16 keeps float32's exponent (8 bits) and 8 bits of its 24-bit significand: values keep
their range and lose precision, about 3 significant digits. A model's matrix products lose
little to it (each sum of products is accumulated in float32 by oneDNN and PyTorch's CPU
kernels) and run several times faster on CPUs with bfloat16 dot-product instructions, on half
the memory traffic. :func:`bf16_copy` makes the copy the ``"bf16"`` precision runs:

* linear layers, embeddings and the rows between layers in bfloat16;
* LayerNorm parameters stay in float32 (a LayerNorm on bfloat16 rows computes its mean,
  variance and affine in float32 and rounds only its output); RMSNorm weights (Qwen3, Gemma3)
  become bfloat16, as transformers runs those models in bfloat16: the norm is computed in
  float32 and the weight scales its output rounded to bfloat16 (Gemma's ``1 + weight`` scales
  in float32, before the rounding), so the rows stay bfloat16 for the next linear layer;
* the attention softmax runs in float32 in every kernel (the reference's and SDPA's CPU
  kernels accumulate in float32);
  pooling and the final normalisation run in float32 (``TextEncoder``); logits leave in
  float32 (``CrossEncoder``, ``generate``).

The caller's model is never changed: the copy has tensors of its own (ties between tensors,
such as a tied output projection, are kept within the copy).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ..cpu import CpuInfo, cpu_info

# Modules whose parameters stay float32 in the copy: they normalise, and their scale and
# shift are read in float32 by PyTorch's kernels on bfloat16 rows.
FLOAT32_MODULES = (nn.LayerNorm,)


@dataclass(frozen=True)
class Bf16Support:
    """What a CPU offers bfloat16 products, and how auto reads it.

    Attributes:
        tiles: AMX-BF16 tile instructions (Intel Sapphire Rapids and later): bfloat16 products
            several times faster than float32 (measured 2.7-3.0x for F.linear at MiniLM's
            shapes), which settles ``auto``.
        native: bfloat16 dot-product instructions of any kind (AMX-BF16, AVX512-BF16, ARM's
            BF16); without them bfloat16 products are emulated, slower than float32.
        reason: the flags behind it, in words.
    """

    tiles: bool
    native: bool
    reason: str


def bf16_support(cpu: CpuInfo | None = None) -> Bf16Support:
    """:class:`Bf16Support` of ``cpu`` (default this machine's), from its flags alone."""
    cpu = cpu_info() if cpu is None else cpu
    flags = cpu.flags
    if "amx_bf16" in flags:
        return Bf16Support(True, True, "AMX-BF16 tiles")
    if "avx512_bf16" in flags:
        return Bf16Support(False, True, "AVX512-BF16 without AMX")
    if "bf16" in flags:  # ARM (ARMv8.6 BFDOT / BFMMLA), as /proc/cpuinfo spells it
        return Bf16Support(False, True, "ARM BF16 dot products")
    if not flags:
        return Bf16Support(False, False, "the CPU's flags could not be read")
    return Bf16Support(False, False, "no bfloat16 instructions (no AMX-BF16 nor AVX512-BF16)")


def bf16_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` for bfloat16 inference, in eval mode, without gradients.

    Floating-point parameters become bfloat16, except those of :data:`FLOAT32_MODULES`
    (LayerNorm), which are copied in their dtype (float32); buffers are copied as they are.
    ``model`` is not changed and shares no tensor with the copy. The copy is built tensor by
    tensor, so memory peaks at the float32 model plus its bfloat16 copy.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    memo: dict[int, torch.Tensor] = {}
    for module in model.modules():
        keep = isinstance(module, FLOAT32_MODULES)
        for tensor in module._parameters.values():
            if tensor is None or id(tensor) in memo:
                continue  # a tensor shared by two modules is converted once: the tie stays
            data = tensor.detach().to(dtype=bf16_dtype(tensor, keep), copy=True)
            memo[id(tensor)] = nn.Parameter(data, requires_grad=False)
        for tensor in module._buffers.values():
            # Buffers (a sinusoidal position table) keep their dtype: the layers that read
            # them cast what they take, so a float32 table rounds once, at its use.
            if tensor is not None and id(tensor) not in memo:
                memo[id(tensor)] = tensor.detach().clone()
    # deepcopy finds every tensor in the memo (only the modules themselves are copied).
    result = copy.deepcopy(model, memo)
    return result.eval()


def bf16_dtype(tensor: torch.Tensor, in_float32_module: bool) -> torch.dtype:
    """The dtype a parameter has in the bfloat16 model: bfloat16, except in LayerNorms
    (:data:`FLOAT32_MODULES`) and for integer tensors, which keep theirs."""
    if in_float32_module or not tensor.is_floating_point():
        return tensor.dtype
    return torch.bfloat16


def empty_bf16(model: nn.Module) -> nn.Module:
    """``model``, built on the meta device, given empty CPU parameters in the dtypes
    :func:`bf16_copy` gives them, for a checkpoint load to fill: the bfloat16 model without
    ever holding the float32 one (a load in ``precision="bf16"``).

    Ties between parameters are kept. Buffers a module computes (a sinusoidal position table)
    are made again on the CPU by its ``computed_buffers()``; any other buffer must already be
    real. Returned in eval mode, without gradients, as :func:`bf16_copy`'s copy is.

    Raises:
        ValueError: a meta buffer that no ``computed_buffers()`` makes.
    """
    empty_parameters(
        model.modules(),
        lambda tensor, module: bf16_dtype(tensor, isinstance(module, FLOAT32_MODULES)),
        requires_grad=False,
    )
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:  # made under a meta context, say: nothing may run on it
        raise ValueError(f"empty_bf16 left {left[:3]} on the meta device")
    return model.eval()


def empty_parameters(
    modules: Iterable[nn.Module],
    dtype_of: Callable[[torch.Tensor, nn.Module], torch.dtype],
    *,
    requires_grad: bool,
) -> None:
    """Give every meta parameter of ``modules`` an empty CPU tensor of ``dtype_of(tensor,
    module)`` (a parameter two of them share is made once: the tie stays), and every meta
    buffer the value its module's ``computed_buffers()`` makes, for a checkpoint load to fill.

    Raises:
        ValueError: a meta buffer that no ``computed_buffers()`` makes.
    """
    # Ties are kept within one call: a parameter shared between modules given in two calls
    # (none of the supported families has one across an encoder layer's edge) would untie.
    made: dict[int, nn.Parameter] = {}
    for module in modules:
        for name, tensor in module._parameters.items():
            if tensor is None or not tensor.is_meta:
                continue
            if id(tensor) not in made:
                empty = torch.empty(tensor.shape, dtype=dtype_of(tensor, module), device="cpu")
                made[id(tensor)] = nn.Parameter(empty, requires_grad=requires_grad)
            module._parameters[name] = made[id(tensor)]
        computed = None
        for name, tensor in module._buffers.items():
            if tensor is None or not tensor.is_meta:
                continue
            if computed is None:
                computed = module.computed_buffers() if hasattr(module, "computed_buffers") else {}
            if name not in computed:
                raise ValueError(
                    f"buffer {name!r} of {type(module).__name__} is on the meta device and "
                    f"nothing computes it: the model cannot be built empty"
                )
            module._buffers[name] = computed[name]


def is_bf16(model: nn.Module) -> bool:
    """``model``'s matrix products run in bfloat16: its first floating-point parameter outside
    the norms is bfloat16 (a :func:`bf16_copy`, or a model converted with ``.to``)."""
    for module in model.modules():
        if isinstance(module, FLOAT32_MODULES):
            continue
        for tensor in module._parameters.values():
            if tensor is not None and tensor.is_floating_point():
                return tensor.dtype == torch.bfloat16
    return False
