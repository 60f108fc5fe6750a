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
layout once for all of them (:mod:`clearformer.fast.reordered_weights`).

The op has no autograd formula, so it serves calls without gradients only, and it skips what
the eager path records for ``clearformer explain``: :func:`clearformer.routes.fusion_decision`
says when a call may use it, and the forward plan carries that decision (``plan.linear``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..activations import activation_fn
from ..ran import note
from . import avx512_linear
from .reordered_weights import active_reordering, reordered_weight

# Activation name -> oneDNN post-op (attribute, algorithm).
ONEDNN_ACTIVATIONS = {
    "relu": ("relu", ""),
    "gelu": ("gelu", "none"),  # exact (erf) GELU
    "gelu_tanh": ("gelu", "tanh"),
    "silu": ("swish", ""),
}


def linear(
    x: Tensor,
    layer: nn.Module,
    *,
    avx512: bool = False,
    activation: str | None = None,
    residual: Tensor | None = None,
    norm: nn.Module | None = None,
) -> Tensor:
    """``layer(x)``, then ``activation`` (a name from ``ONEDNN_ACTIVATIONS``), then
    ``+ residual``, then ``norm`` (a post-norm block's LayerNorm), on the route a fused plan
    names: one oneDNN call for a plain ``nn.Linear``, with the norm after it; one call of
    clearformer's AVX-512 linear kernel, norm included, where the plan takes it (``avx512``)
    and the kernel can tile the call (:func:`clearformer.fast.avx512_linear.serves`: an exact
    GELU or a LayerNorm, weights reordered by the caller); the epilogue of an int8 layer's
    compiled steps where the layer runs them (``Int8Linear.fused_call``). Other replacement
    layers, layers with forward hooks and calls with a gradient to compute run the eager layer
    (the fused ops would skip the hooks, and have no autograd formula). ``x`` is (..., in),
    ``residual`` (..., out); the result (..., out)."""
    if activation is not None and residual is not None:
        raise ValueError("linear fuses an activation or a residual add, not both")
    fused_call = getattr(layer, "fused_call", None)  # an int8 layer's compiled steps
    if fused_call is not None and x.numel() > 0 and not has_hooks(layer):
        out = fused_call(x, activation=activation, residual=residual)
        if out is not None:
            note("linear", "int8")
            return residual_then_norm(out, None, norm)
    if (
        type(layer) is not nn.Linear
        or x.numel() == 0
        or has_hooks(layer)
        or _needs_grad(x, layer, residual, norm)
    ):
        note("linear", "eager")
        out = layer(x)
        if activation is not None:
            out = activation_fn(activation)(out)
        return residual_then_norm(out, residual, norm)
    rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (M, in)
    other = None if residual is None else residual.reshape(rows.shape[0], layer.out_features)
    copies = active_reordering()
    if (
        avx512
        and copies is not None
        and copies.has_own_copy(layer)
        and avx512_linear.serves(rows, layer, activation, other, norm)
    ):
        note("linear", "avx512")
        weight = copies.weight_for(layer, "avx512")
        out = avx512_linear.linear(
            rows, weight, layer, activation=activation, residual=other, norm=norm
        )
        return out.view(*x.shape[:-1], out.shape[-1])  # (M, out) -> (..., out)
    note("linear", "onednn")
    weight = reordered_weight(layer)  # reordered once per call where the caller packed it
    out = onednn_linear(rows, weight, layer, activation=activation, residual=other)
    out = out.view(*x.shape[:-1], out.shape[-1])  # (M, out) -> (..., out)
    return residual_then_norm(out, None, norm)


def reordered_product(x: Tensor, owner: nn.Module) -> Tensor:
    """``x @ owner.weight^T (+ owner.bias)`` on the active :class:`ReorderedWeights`' reordered
    copy of ``owner``'s weight: an output projection (an ``nn.Linear``, or an embedding table
    tied to it) called with few rows per pass, a decoding step, where oneDNN's kernel on the
    packed weight reads it faster than ``F.linear`` does. The route where
    :func:`clearformer.routes.projection_route` names it. ``x`` (..., in) -> (..., out)."""
    note("linear", "packed projection")
    rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (M, in)
    weight = active_reordering().weight_for(owner)
    bias = getattr(owner, "bias", None)
    out = torch.ops.mkldnn._linear_pointwise.default(rows, weight, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])  # (M, out) -> (..., out)


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


def has_hooks(layer: nn.Module) -> bool:
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
