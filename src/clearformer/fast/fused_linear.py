"""Linear layers with their bias, activation or residual add fused into the matrix product
(CPU inference, float32 or bfloat16), through oneDNN's ``mkldnn::_linear_pointwise``.

In eager PyTorch a linear layer with a bias is ``addmm``, which on CPU first copies the bias
into every row of the output and then accumulates the product onto it; the activation after it
and the residual add are further passes over memory. oneDNN applies the bias, the activation
(``gelu``, ``relu``, ``swish``) or the addition of another tensor as post-operations of its
matrix-product kernel, while each output tile is still in cache: one pass instead of two or
three. The arithmetic is the same, summed in another order (tests hold it to float32 rounding
against the eager layers); what it saves is measured in docs/performance.md. A caller that
makes many calls (``encode``, ``generate``) can have the weights reordered into oneDNN's own
layout once for all of them (:mod:`clearformer.fast.packed_weights`).

The op has no autograd formula, so it serves calls without gradients only, and it skips what
the eager path records for ``clearformer explain``: :func:`fusion_decision` says when a call
may use it, and the forward plan carries that decision (``ForwardPlan.fused_linear``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from ..activations import activation_fn
from ..options import Decision
from ..tracing import is_recording
from . import avx512_linear
from .packed_weights import active_packing, packed_weight, reorder_available

# Activation name -> oneDNN post-op (attribute, algorithm).
ONEDNN_ACTIVATIONS = {
    "relu": ("relu", ""),
    "gelu": ("gelu", "none"),  # exact (erf) GELU
    "gelu_tanh": ("gelu", "tanh"),
    "silu": ("swish", ""),
}


@functools.cache
def onednn_available() -> bool:
    """This PyTorch build has oneDNN's fused linear op and it runs here."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        op = torch.ops.mkldnn._linear_pointwise
        with torch.inference_mode():
            op(torch.ones(2, 4), torch.ones(3, 4), torch.zeros(3), "gelu", [], "none")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


@functools.cache
def onednn_bf16_available() -> bool:
    """The fused op runs bfloat16 rows and weights here, with its post-operations: oneDNN
    takes bfloat16 on CPUs with AVX-512 (emulating what the CPU lacks) and AMX."""
    if not onednn_available():
        return False
    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        op = torch.ops.mkldnn._linear_pointwise
        rows, weight = (
            torch.ones(2, 4, dtype=torch.bfloat16),
            torch.ones(3, 4, dtype=torch.bfloat16),
        )
        with torch.inference_mode():
            out = op.default(rows, weight, torch.zeros(3, dtype=torch.bfloat16), "gelu", [], "none")
            added = op.binary(rows, out, weight, None, "add")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return added.dtype == torch.bfloat16 and bool((added == 4.0 + out).all())


def fusion_decision(
    device: torch.device, dtype: torch.dtype, training: bool, module: nn.Module | None = None
) -> Decision:
    """Whether a call on ``device`` in ``dtype`` by a module in ``training`` mode may run its
    linear layers fused, and why (``Decision("fused" | "eager", reason)``). ``module``: the
    stack making the call; forward hooks on any module inside it keep the eager layers."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return Decision("eager", "fused linear layers serve float32 and bfloat16 on CPU only")
    if training or torch.is_grad_enabled():
        return Decision("eager", "gradients (or dropout) need the eager layers")
    if torch.is_autocast_enabled("cpu"):
        return Decision("eager", "autocast computes in its own dtype")
    if is_recording():
        return Decision("eager", "a trace records every eager step")
    if torch.compiler.is_compiling():
        return Decision("eager", "under torch.compile the compiler fuses")
    if torch.jit.is_tracing():
        return Decision("eager", "a TorchScript trace records the eager layers")
    if module is not None and has_inner_hooks(module):
        return Decision("eager", "forward hooks inside the model see the eager layers")
    if not onednn_available():
        return Decision("eager", "this PyTorch build has no oneDNN fused linear op")
    if dtype == torch.bfloat16:
        if not onednn_bf16_available():
            return Decision("eager", "oneDNN's fused linear op does not run bfloat16 here")
        return Decision(
            "fused", "CPU inference in bfloat16: bias, activation and residual fused (oneDNN)"
        )
    return Decision("fused", "CPU inference: bias, activation and residual fused (oneDNN)")


def linear(
    x: Tensor,
    layer: nn.Module,
    *,
    fused: bool,
    activation: str | None = None,
    residual: Tensor | None = None,
    norm: nn.Module | None = None,
) -> Tensor:
    """``layer(x)``, then ``activation`` (a name from ``ONEDNN_ACTIVATIONS``), then
    ``+ residual``, then ``norm`` (a post-norm block's LayerNorm): fused into one oneDNN call
    when ``fused`` and ``layer`` is a plain ``nn.Linear`` without forward hooks, with the norm
    after it; into one call of clearformer's AVX-512 linear kernel, norm included, where that
    kernel serves the call (:mod:`clearformer.fast.avx512_linear`: an exact GELU or a
    LayerNorm, weights packed by the caller); into the epilogue of an int8 layer's compiled
    steps when ``fused`` and the layer runs them (``Int8Linear.fused_call``); other
    replacement layers, and layers with hooks, run eagerly. ``x`` is (..., in), ``residual``
    (..., out); the result (..., out)."""
    if activation is not None and residual is not None:
        raise ValueError("linear fuses an activation or a residual add, not both")
    fused_call = getattr(layer, "fused_call", None)  # an int8 layer's compiled steps
    if fused and fused_call is not None and x.numel() > 0 and not _has_hooks(layer):
        out = fused_call(x, activation=activation, residual=residual)
        if out is not None:
            return residual_then_norm(out, None, norm)
    if (
        not fused
        or type(layer) is not nn.Linear
        or x.numel() == 0
        or _has_hooks(layer)
        or _needs_grad(x, layer, residual, norm)
    ):
        out = layer(x)
        if activation is not None:
            out = activation_fn(activation)(out)
        return residual_then_norm(out, residual, norm)
    rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (M, in)
    other = None if residual is None else residual.reshape(rows.shape[0], layer.out_features)
    packing = active_packing()
    if (
        packing is not None
        and packing.has_own_copy(layer)
        and avx512_linear.serves(rows, layer, activation, other, norm)
    ):
        weight = packing.weight_for(layer, "avx512")
        out = avx512_linear.linear(
            rows, weight, layer, activation=activation, residual=other, norm=norm
        )
        return out.view(*x.shape[:-1], out.shape[-1])  # (M, out) -> (..., out)
    weight = packed_weight(layer)  # reordered once per call where the caller packed it
    out = onednn_linear(rows, weight, layer, activation=activation, residual=other)
    out = out.view(*x.shape[:-1], out.shape[-1])  # (M, out) -> (..., out)
    return residual_then_norm(out, None, norm)


def packed_product(x: Tensor, owner: nn.Module) -> Tensor:
    """``x @ owner.weight^T (+ owner.bias)`` on the active :class:`PackedWeights`' reordered
    copy of ``owner``'s weight: an output projection (an ``nn.Linear``, or an embedding table
    tied to it) called with few rows per pass, a decoding step, where oneDNN's kernel on the
    packed weight reads it faster than ``F.linear`` does. The route where
    :func:`clearformer.routes.projection_route` names it. ``x`` (..., in) -> (..., out)."""
    rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (M, in)
    weight = active_packing().weight_for(owner)
    bias = getattr(owner, "bias", None)
    out = torch.ops.mkldnn._linear_pointwise.default(rows, weight, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])  # (M, out) -> (..., out)


def packing_serves(x: Tensor, owner: nn.Module) -> str | None:
    """Why :func:`packed_product` does not serve ``x @ owner.weight^T``, or None if it does."""
    packing = active_packing()
    weight = owner.weight
    if packing is None:
        return "no packed weights for this call (only generate packs them)"
    if x.numel() == 0 or x.dtype != weight.dtype or not packing.has_own_copy(owner):
        return "rows and weight must be non-empty float32 or bfloat16 CPU tensors of one dtype"
    if not reorder_available(weight.dtype):
        return "this PyTorch build cannot reorder the weight for oneDNN"
    if _has_hooks(owner):
        return "forward hooks on the projection see the eager layer"
    # fusion_decision refuses any call with gradients enabled, so no per-tensor check here.
    decision = fusion_decision(x.device, x.dtype, owner.training)
    return None if decision.choice == "fused" else decision.reason


def onednn_linear(
    rows: Tensor,
    weight: Tensor,
    layer: nn.Linear,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """oneDNN's fused product: ``act(rows @ W^T + bias)`` or ``rows @ W^T + bias + residual``,
    ``rows`` (M, in), ``weight`` the layer's own or its reordered copy, ``residual`` (M, out);
    returns (M, out). The route :func:`linear` takes where no clearformer kernel serves."""
    # The overloads are named: called through the packet, a binary call would first be
    # matched against the unary schema, and the failed match formats every argument
    # (weights included) into an error message that is then thrown away.
    op = torch.ops.mkldnn._linear_pointwise
    if residual is not None:
        return op.binary(rows, residual, weight, layer.bias, "add")
    if activation is not None:
        attr, algorithm = ONEDNN_ACTIVATIONS[activation]
        return op.default(rows, weight, layer.bias, attr, [], algorithm)
    return op.default(rows, weight, layer.bias, "none", [], "")


def residual_then_norm(out: Tensor, residual: Tensor | None, norm: nn.Module | None) -> Tensor:
    """The eager epilogue of a branch: ``residual + out`` when given, then ``norm`` when given
    (a post-norm block's LayerNorm)."""
    if residual is not None:
        out = residual + out
    return out if norm is None else norm(out)


def has_inner_hooks(module: nn.Module) -> bool:
    """Forward hooks on a module inside ``module`` (not on ``module`` itself) or on every
    module. A fused call would run past a linear layer's hooks, and hand a feed-forward
    network's or an attention's hooks their output with the block's residual already added:
    such calls keep the eager layers, whose every module returns what it does alone."""
    inner = iter(module.modules())
    next(inner)  # the module itself: its own hooks see the same output either way
    return _global_hooks() or any(_own_hooks(m) for m in inner)


def _has_hooks(layer: nn.Module) -> bool:
    """Forward hooks on ``layer`` (or on every module) would not see a fused call: such a
    layer runs eagerly (int8 calibration, a user's probes)."""
    return _own_hooks(layer) or _global_hooks()


def _own_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _global_hooks() -> bool:
    from torch.nn.modules import module as torch_module

    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks)


def _needs_grad(
    x: Tensor, layer: nn.Module, residual: Tensor | None = None, norm: nn.Module | None = None
) -> bool:
    """The fused ops have no autograd formula: with a gradient to compute (through the input,
    the layer, the residual or the norm) they would give none, silently."""
    if not torch.is_grad_enabled():
        return False
    modules = (layer,) if norm is None else (layer, norm)
    return (
        x.requires_grad
        or (residual is not None and residual.requires_grad)
        or any(p.requires_grad for module in modules for p in module.parameters())
    )
