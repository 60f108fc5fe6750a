"""``torch.nn.TransformerEncoderLayer`` / ``TransformerEncoder`` <-> clearformer, same numerics.

Name mapping (torch.nn -> clearformer): ``self_attn.in_proj_*`` -> ``attn.in_proj`` (same row
order: queries, keys, values), ``self_attn.out_proj`` -> ``attn.out_proj``, ``linear1`` /
``linear2`` -> ``mlp.fc_in`` / ``mlp.fc_out``, ``norm1`` -> ``attn_norm``, ``norm2`` ->
``mlp_norm``. torch.nn applies dropout inside the feed-forward network too; clearformer does
not, so the two agree exactly in eval mode (and in training with dropout 0).

One caveat: torch.nn's fused inference fast path runs every ``nn.GELU`` module as the exact
GELU, even ``nn.GELU(approximate="tanh")``; such a layer maps to ``gelu_tanh`` here, which
matches torch.nn's regular path. ``to_torch(block)`` therefore passes the tanh GELU as a
function, which keeps torch.nn off that fast path.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import EncoderBlock
from ..config import EncoderConfig
from ..encoder import Encoder
from .torch_activations import activation_name as _activation_name


def _layer_hparams(layer: nn.TransformerEncoderLayer) -> dict:
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise TypeError(
            f"layer must be a torch.nn.TransformerEncoderLayer, got {type(layer).__name__}"
        )
    attn = layer.self_attn
    if not attn._qkv_same_embed_dim:
        raise ValueError("torch.nn layers with separate q/k/v projection weights are not supported")
    return dict(
        d_model=attn.embed_dim,
        n_heads=attn.num_heads,
        dim_mlp=layer.linear1.out_features,
        dropout=layer.dropout1.p,
        attn_dropout=attn.dropout,
        norm="pre" if layer.norm_first else "post",
        activation=_activation_name(layer.activation),
        norm_eps=layer.norm1.eps,
        bias=layer.linear1.bias is not None,
    )


@torch.no_grad()
def _copy_layer(src: nn.TransformerEncoderLayer, dst: EncoderBlock, to_torch: bool) -> None:
    pairs = [
        (src.self_attn.in_proj_weight, dst.attn.in_proj.weight),
        (src.self_attn.in_proj_bias, dst.attn.in_proj.bias),
        (src.self_attn.out_proj.weight, dst.attn.out_proj.weight),
        (src.self_attn.out_proj.bias, dst.attn.out_proj.bias),
        (src.linear1.weight, dst.mlp.fc_in.weight),
        (src.linear1.bias, dst.mlp.fc_in.bias),
        (src.linear2.weight, dst.mlp.fc_out.weight),
        (src.linear2.bias, dst.mlp.fc_out.bias),
        (src.norm1.weight, dst.attn_norm.weight),
        (src.norm1.bias, dst.attn_norm.bias),
        (src.norm2.weight, dst.mlp_norm.weight),
        (src.norm2.bias, dst.mlp_norm.bias),
    ]
    for theirs, ours in pairs:
        if theirs is None or ours is None:
            if (theirs is None) != (ours is None):
                raise ValueError("bias presence differs between the torch.nn layer and the block")
            continue
        if theirs.shape != ours.shape:
            raise ValueError(
                f"shape mismatch: torch.nn {tuple(theirs.shape)} vs {tuple(ours.shape)}"
            )
        (theirs if to_torch else ours).copy_(ours if to_torch else theirs)


def block_from_torch(layer: nn.TransformerEncoderLayer, backend: str = "auto") -> EncoderBlock:
    hp = _layer_hparams(layer)
    ref = layer.self_attn.in_proj_weight
    block = EncoderBlock(
        hp.pop("d_model"),
        hp.pop("n_heads"),
        hp.pop("dim_mlp"),
        hp.pop("dropout"),
        backend=backend,
        **hp,
    ).to(device=ref.device, dtype=ref.dtype)
    _copy_layer(layer, block, to_torch=False)
    block.train(layer.training)
    return block


def _torch_lacks(block: EncoderBlock) -> str | None:
    """What of ``block`` a ``torch.nn.TransformerEncoderLayer`` cannot hold, or None."""
    attn = block.attn
    if attn.kv_heads != attn.n_heads:
        return f"grouped-query attention (n_kv_heads={attn.kv_heads}, n_heads={attn.n_heads})"
    if attn.qk_dim != block.d_model or attn.scale is not None:
        return f"a head width or score scale of its own (head_dim={block.head_dim})"
    if attn.q_norm is not None:
        return "per-head query and key norms (qk_norm)"
    if block.branch_norm:
        return "norms on the branches' outputs (branch_norm)"
    if not isinstance(block.mlp_norm, nn.LayerNorm):
        return f"a {type(block.mlp_norm).__name__} (torch.nn's layers use LayerNorm)"
    return None


def block_to_torch(block: EncoderBlock) -> nn.TransformerEncoderLayer:
    lacks = _torch_lacks(block)
    if lacks is not None:
        raise ValueError(f"torch.nn.TransformerEncoderLayer has no equivalent of {lacks}")
    if block.mlp.gated:
        raise ValueError(
            f"activation {block.mlp.activation!r} is gated (GLU); torch.nn.TransformerEncoderLayer "
            "has no gated feed-forward network"
        )
    # Not nn.GELU("tanh"): torch.nn's fused fast path treats every nn.GELU as the exact GELU.
    tanh_gelu = functools.partial(F.gelu, approximate="tanh")
    activation = {"relu": "relu", "gelu": "gelu", "gelu_tanh": tanh_gelu}[block.mlp.activation]
    ref = block.attn.in_proj.weight
    layer = nn.TransformerEncoderLayer(
        block.d_model,
        block.attn.n_heads,
        block.mlp.fc_in.out_features,
        dropout=block.attn_residual_dropout.p,
        activation=activation,
        layer_norm_eps=block.attn_norm.eps,
        batch_first=True,
        norm_first=block.norm == "pre",
        bias=block.attn.in_proj.bias is not None,
        device=ref.device,
        dtype=ref.dtype,
    )
    layer.self_attn.dropout = block.attn.attn_dropout
    _copy_layer(layer, block, to_torch=True)
    layer.train(block.training)
    return layer


def encoder_from_torch(stack: nn.TransformerEncoder, backend: str = "auto") -> Encoder:
    if not isinstance(stack, nn.TransformerEncoder):
        raise TypeError(f"stack must be a torch.nn.TransformerEncoder, got {type(stack).__name__}")
    hps = [_layer_hparams(layer) for layer in stack.layers]
    if any(hp != hps[0] for hp in hps[1:]):
        raise ValueError("all layers of the torch.nn stack must share their hyper-parameters")
    if stack.norm is not None and not isinstance(stack.norm, nn.LayerNorm):
        raise ValueError(f"final norm must be a LayerNorm, got {type(stack.norm).__name__}")
    if stack.norm is not None and tuple(stack.norm.normalized_shape) != (hps[0]["d_model"],):
        raise ValueError(
            f"final norm must normalise shape ({hps[0]['d_model']},) like the layers, got "
            f"{tuple(stack.norm.normalized_shape)}"
        )
    config = EncoderConfig(
        n_layers=len(stack.layers),
        final_norm=stack.norm is not None,
        backend=backend,
        **hps[0],
    )
    ref = stack.layers[0].self_attn.in_proj_weight
    encoder = Encoder(config).to(device=ref.device, dtype=ref.dtype)
    for theirs, ours in zip(stack.layers, encoder.layers, strict=True):
        _copy_layer(theirs, ours, to_torch=False)
    if stack.norm is not None:
        # A copy keeps the norm as built: its eps, and its own choice of weight and bias,
        # which need not match the layers' (a bias-free stack often ends in a default LayerNorm).
        encoder.final_norm = copy.deepcopy(stack.norm)
    encoder.train(stack.training)
    return encoder


def from_torch(module: nn.Module, backend: str = "auto"):
    """The clearformer twin of a ``torch.nn`` layer or stack, with the same numerics.

    ``TransformerEncoderLayer`` -> :class:`EncoderBlock`; ``TransformerEncoder`` ->
    :class:`Encoder`; ``TransformerDecoderLayer`` -> :class:`~clearformer.DecoderBlock`;
    ``TransformerDecoder`` -> :class:`~clearformer.Decoder` (see :mod:`.torch_nn_decoder`).
    """
    if isinstance(module, (nn.TransformerDecoderLayer, nn.TransformerDecoder)):
        from .torch_nn_decoder import decoder_block_from_torch, decoder_from_torch

        if isinstance(module, nn.TransformerDecoder):
            return decoder_from_torch(module, backend=backend)
        return decoder_block_from_torch(module, backend=backend)
    if isinstance(module, nn.TransformerEncoderLayer):
        return block_from_torch(module, backend=backend)
    if isinstance(module, nn.TransformerEncoder):
        return encoder_from_torch(module, backend=backend)
    raise TypeError(
        "module must be a torch.nn.TransformerEncoderLayer, TransformerEncoder, "
        "TransformerDecoderLayer or TransformerDecoder, got "
        f"{type(module).__name__}"
    )


def encoder_to_torch(encoder: Encoder) -> nn.TransformerEncoder:
    """A ``torch.nn.TransformerEncoder`` (batch first) with the stack's numerics."""
    if encoder.config.causal:
        raise ValueError(
            "EncoderConfig.causal=True: a torch.nn.TransformerEncoder attends both ways unless "
            "each call passes a causal mask, so it would not have this stack's numerics"
        )
    layers = [block_to_torch(block) for block in encoder.layers]
    final = encoder.final_norm
    norm = copy.deepcopy(final) if isinstance(final, nn.LayerNorm) else None
    # The constructor deep-copies one layer n times; the converted layers replace the copies.
    stack = nn.TransformerEncoder(layers[0], len(layers), norm=norm, enable_nested_tensor=False)
    stack.layers = nn.ModuleList(layers)
    stack.train(encoder.training)
    return stack


def to_torch(module: EncoderBlock | Encoder) -> nn.TransformerEncoderLayer | nn.TransformerEncoder:
    """The ``torch.nn`` twin (batch first) of an :class:`EncoderBlock` or :class:`Encoder`."""
    if isinstance(module, EncoderBlock):
        return block_to_torch(module)
    if isinstance(module, Encoder):
        return encoder_to_torch(module)
    raise TypeError(
        f"module must be a clearformer EncoderBlock or Encoder, got {type(module).__name__}"
    )
