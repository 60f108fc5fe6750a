"""Convert a loaded model's linear layers to :class:`~clearformer.quant.int8.Int8Linear`.

``quantize_int8`` deep-copies the model and swaps modules; the model's code is unchanged (a
block calls ``self.attn.in_proj(x)`` whatever that module is), so every path -- packed or
padded, any attention backend -- runs the int8 layers. The caller's model is never modified.
"""

from __future__ import annotations

import copy
import fnmatch
import logging
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

from .int8 import Int8Linear, int8_support

log = logging.getLogger(__name__)

DEFAULT_SKIP: tuple[str, ...] = ()
DEFAULT_ALPHA = 0.5  # SmoothQuant's migration strength: the error split evenly
# The default policy, chosen by measurement on the bundled all-MiniLM-L6-v2 (docs/int8.md):
# every linear layer in int8, with the 2 input channels of largest calibrated activation kept
# in float32 in each. BERT-family residual streams carry a few channels 10-20x larger than the
# rest (channel 99 of MiniLM reaches 30 where the median is 1.6); left in, they set every
# token's scale and coarsen its other 382 channels.
DEFAULT_FLOAT_CHANNELS = 2


def linear_names(model: nn.Module) -> list[str]:
    """Qualified names of the model's ``nn.Linear`` modules, in module order."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


@torch.inference_mode()
def calibrate(
    model: nn.Module,
    run: Callable[[nn.Module], object],
    names: Iterable[str],
    into: dict[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Per-input-channel activation maxima of the named linear layers.

    Args:
        model: the float model (not modified: the hooks are removed afterwards).
        run: calls the model on calibration data, e.g. ``lambda m: m(ids, mask)``.
        names: the linear layers to observe.
        into: the dict the maxima are written to as they are seen (None: a new one), for a
            ``run`` that reads them before it returns.

    Returns:
        name -> (K,) float32, max over every row seen of ``|x[:, k]|``.
    """
    stats: dict[str, Tensor] = {} if into is None else into
    handles = []

    def observer(name: str):
        def hook(_module: nn.Module, args: tuple) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()  # (M, K)
            if x.shape[0]:
                amax = x.abs().amax(dim=0)
                stats[name] = amax if name not in stats else torch.maximum(stats[name], amax)

        return hook

    try:
        for name in names:
            # Looked up one at a time and not kept: a ``run`` that replaces layers as it goes
            # (quantize_int8_by_block) frees each replaced layer's float weights at once.
            handles.append(model.get_submodule(name).register_forward_pre_hook(observer(name)))
        run(model)
    finally:
        for handle in handles:
            handle.remove()
    return stats


def smoothing_factors(
    activation_amax: Tensor, weight: Tensor, alpha: float = DEFAULT_ALPHA
) -> Tensor:
    """SmoothQuant's per-input-channel factor c (K,): activations are multiplied by c, the
    weight's columns divided by it, with ``1/c_k = max|x_k|^alpha / max|W_:,k|^(1 - alpha)``."""
    w_amax = weight.detach().float().abs().amax(dim=0)  # (K,)
    a = activation_amax.float().clamp_min(1e-5)
    s = a.pow(alpha) / w_amax.clamp_min(1e-5).pow(1.0 - alpha)
    return 1.0 / s.clamp_min(1e-5)


def outlier_channels(activation_amax: Tensor, count: int) -> Tensor:
    """The ``count`` input channels with the largest activation maxima, (count,) int64 sorted."""
    count = min(count, activation_amax.numel())
    return activation_amax.topk(count).indices.sort().values


def quantize_int8(
    model: nn.Module,
    *,
    skip: Iterable[str] = DEFAULT_SKIP,
    smooth: Mapping[str, Tensor] | None = None,
    alpha: float = DEFAULT_ALPHA,
    outliers: Mapping[str, Tensor] | None = None,
    fused: bool = False,
    in_place: bool = False,
    within: str | None = None,
) -> nn.Module:
    """A copy of ``model`` with its ``nn.Linear`` layers as :class:`Int8Linear`.

    Args:
        model: any module (an :class:`~clearformer.EncoderModel`, a stack, a block); it is not
            modified unless ``in_place``.
        skip: ``fnmatch`` patterns of qualified module names kept in float32
            (e.g. ``"*.attn.in_proj"``).
        smooth: name -> (K,) activation maxima from :func:`calibrate`; those layers are
            smoothed with strength ``alpha``. Others are quantised plainly.
        outliers: name -> input channels of that layer computed in float32
            (:func:`outlier_channels`).
        fused: run each layer's element-wise steps compiled (:mod:`clearformer.quant.fused`;
            the same arithmetic, in fewer passes over memory).
        in_place: convert ``model`` itself and return it: each float layer is dropped as its
            int8 layer replaces it, so a caller that keeps no other reference to the float
            layers holds one float32 model at most, never a copy of the rest (the embeddings).
            The layers are the copy's, bit for bit.
        within: convert only the layers whose qualified names start with this prefix (say
            ``"encoder.layers.3."``); None: every layer.

    Returns:
        The new model, in the caller's model's train/eval mode. Where this machine has no fast
        int8 products (:func:`~clearformer.quant.int8.int8_support`), a float32 copy (the
        model itself with ``in_place``), with a warning saying why.
    """
    skip = tuple(skip)
    smooth = dict(smooth or {})
    outliers = dict(outliers or {})
    support = int8_support()
    if not support.available:
        log.warning("int8 requested but not used, float32 instead: %s", support.reason)
        return model if in_place else copy.deepcopy(model)
    unknown = sorted((set(smooth) | set(outliers)) - set(linear_names(model)))
    if unknown:
        raise ValueError(f"smooth or outliers name layers that are not nn.Linear: {unknown}")

    def make(name: str, linear: nn.Linear) -> Int8Linear:
        factors = smoothing_factors(smooth[name], linear.weight, alpha) if name in smooth else None
        layer = Int8Linear.from_linear(linear, factors, outliers.get(name))
        layer.fused = fused
        return layer

    return replace_linears(model, make, skip=skip, in_place=in_place, within=within)


def replace_linears(
    model: nn.Module,
    make: Callable[[str, nn.Linear], nn.Module],
    *,
    skip: Iterable[str] = (),
    in_place: bool = False,
    within: str | None = None,
) -> nn.Module:
    """A copy of ``model`` (``model`` itself with ``in_place``) with each ``nn.Linear`` replaced
    by ``make(qualified name, layer)``, except those a ``skip`` pattern matches or outside the
    ``within`` prefix. The copy shares the float weights about to be replaced instead of
    copying them (:func:`_shared_float_weights`), so it never holds a second float32 model."""
    skip = tuple(skip)
    result = model if in_place else copy.deepcopy(model, _shared_float_weights(model, skip))
    for name in linear_names(result):
        if _matches(name, skip) or (within is not None and not name.startswith(within)):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = result.get_submodule(parent_name) if parent_name else result
        setattr(parent, child, make(name, getattr(parent, child)))
    return result


def _shared_float_weights(model: nn.Module, skip: tuple[str, ...]) -> dict[int, Tensor]:
    """A ``copy.deepcopy`` memo that hands the copy the very weight and bias tensors of the
    layers about to become int8, instead of copies: each is read once, by
    :meth:`Int8Linear.from_linear` (which does not change it), and the float layer holding it
    is then replaced in the copy, which keeps none of them. Copying them first would hold a
    second float32 copy of every linear weight at once: twice the model's memory at the peak,
    for a copy thrown away. Layers kept in float32 (``skip``) are copied as usual, so the copy
    shares no tensor it keeps with ``model``."""
    converted = {
        id(model.get_submodule(name)) for name in linear_names(model) if not _matches(name, skip)
    }
    # A tensor some other module also holds (a weight tied to an embedding) is copied as usual.
    elsewhere = {
        id(t)
        for module in model.modules()
        if id(module) not in converted
        for t in (*module._parameters.values(), *module._buffers.values())
        if t is not None
    }
    memo: dict[int, Tensor] = {}
    for module in model.modules():
        if id(module) in converted:
            for tensor in (module.weight, module.bias):
                if tensor is not None and id(tensor) not in elsewhere:
                    memo[id(tensor)] = tensor
    return memo


def int8_layers(model: nn.Module) -> list[str]:
    """Qualified names of the model's :class:`Int8Linear` modules."""
    return [name for name, m in model.named_modules() if isinstance(m, Int8Linear)]


def quantize_int8_calibrated(
    model: nn.Module,
    run: Callable[[nn.Module], object],
    *,
    float_channels: int = DEFAULT_FLOAT_CHANNELS,
    skip: Iterable[str] = DEFAULT_SKIP,
    fused: bool = False,
    in_place: bool = False,
) -> nn.Module:
    """The default int8 conversion: calibrate, then :func:`quantize_int8` with the
    ``float_channels`` largest input channels of every layer kept in float32.

    Args:
        model: the float model (not modified unless ``in_place``: see :func:`quantize_int8`).
        run: calls a model on a few varied inputs (its activations' maxima pick the channels).
        float_channels: channels per layer computed in float32 (0: plain int8).
        skip: layers kept entirely in float32, as in :func:`quantize_int8`.
        fused, in_place: as in :func:`quantize_int8`.
    """
    skip = tuple(skip)
    if not int8_support().available or float_channels == 0:
        return quantize_int8(model, skip=skip, fused=fused, in_place=in_place)
    names = [n for n in linear_names(model) if not _matches(n, skip)]
    stats = calibrate(model, run, names)
    missing = sorted(set(names) - set(stats))
    if missing:
        raise ValueError(f"the calibration run did not reach these linear layers: {missing}")
    outliers = {name: outlier_channels(amax, float_channels) for name, amax in stats.items()}
    return quantize_int8(model, skip=skip, outliers=outliers, fused=fused, in_place=in_place)
