"""``torch.nn.TransformerDecoderLayer`` / ``TransformerDecoder`` -> clearformer, same numerics.

Name mapping (torch.nn -> clearformer): ``self_attn.in_proj_*`` -> ``self_attn.in_proj``;
``multihead_attn.in_proj_*`` (rows: queries, keys, values) -> ``cross_attn.q_proj`` (the query
rows) and ``cross_attn.kv_proj`` (the key and value rows); ``*.out_proj`` as they are;
``linear1`` / ``linear2`` -> ``mlp.fc_in`` / ``mlp.fc_out``; ``norm1``, ``norm2``, ``norm3`` ->
``self_attn_norm``, ``cross_attn_norm``, ``mlp_norm``.

clearformer's decoder self-attention is always causal: it equals a torch.nn layer called with
the square causal mask (``tgt_is_causal=True``). Both take batch-first rows here; a torch.nn
layer built with ``batch_first=False`` converts the same (weights do not depend on it).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..decoder import Decoder, DecoderConfig
from ..decoder_block import DecoderBlock
from .torch_activations import activation_name as _activation_name


def _hparams(layer: nn.TransformerDecoderLayer) -> dict:
    if not isinstance(layer, nn.TransformerDecoderLayer):
        raise TypeError(
            f"layer must be a torch.nn.TransformerDecoderLayer, got {type(layer).__name__}"
        )
    for attn in (layer.self_attn, layer.multihead_attn):
        if not attn._qkv_same_embed_dim:
            raise ValueError(
                "torch.nn layers with separate q/k/v projection weights are not supported"
            )
    return dict(
        d_model=layer.self_attn.embed_dim,
        n_heads=layer.self_attn.num_heads,
        dim_mlp=layer.linear1.out_features,
        dropout=layer.dropout1.p,
        attn_dropout=layer.self_attn.dropout,
        norm="pre" if layer.norm_first else "post",
        activation=_activation_name(layer.activation),
        norm_eps=layer.norm1.eps,
        bias=layer.linear1.bias is not None,
    )


@torch.no_grad()
def _copy(src: nn.TransformerDecoderLayer, dst: DecoderBlock) -> None:
    d = dst.d_model
    cross_w = src.multihead_attn.in_proj_weight  # (3D, D): q; k; v rows
    cross_b = src.multihead_attn.in_proj_bias
    pairs = [
        (src.self_attn.in_proj_weight, dst.self_attn.in_proj.weight),
        (src.self_attn.in_proj_bias, dst.self_attn.in_proj.bias),
        (src.self_attn.out_proj.weight, dst.self_attn.out_proj.weight),
        (src.self_attn.out_proj.bias, dst.self_attn.out_proj.bias),
        (cross_w[:d], dst.cross_attn.q_proj.weight),
        (cross_w[d:], dst.cross_attn.kv_proj.weight),
        (None if cross_b is None else cross_b[:d], dst.cross_attn.q_proj.bias),
        (None if cross_b is None else cross_b[d:], dst.cross_attn.kv_proj.bias),
        (src.multihead_attn.out_proj.weight, dst.cross_attn.out_proj.weight),
        (src.multihead_attn.out_proj.bias, dst.cross_attn.out_proj.bias),
        (src.linear1.weight, dst.mlp.fc_in.weight),
        (src.linear1.bias, dst.mlp.fc_in.bias),
        (src.linear2.weight, dst.mlp.fc_out.weight),
        (src.linear2.bias, dst.mlp.fc_out.bias),
        (src.norm1.weight, dst.self_attn_norm.weight),
        (src.norm1.bias, dst.self_attn_norm.bias),
        (src.norm2.weight, dst.cross_attn_norm.weight),
        (src.norm2.bias, dst.cross_attn_norm.bias),
        (src.norm3.weight, dst.mlp_norm.weight),
        (src.norm3.bias, dst.mlp_norm.bias),
    ]
    for theirs, ours in pairs:
        if (theirs is None) != (ours is None):
            raise ValueError("bias presence differs between the torch.nn layer and the block")
        if theirs is not None:
            ours.copy_(theirs)


def decoder_block_from_torch(
    layer: nn.TransformerDecoderLayer, backend: str = "auto"
) -> DecoderBlock:
    hp = _hparams(layer)
    ref = layer.self_attn.in_proj_weight
    block = DecoderBlock(
        hp.pop("d_model"),
        hp.pop("n_heads"),
        hp.pop("dim_mlp"),
        hp.pop("dropout"),
        backend=backend,
        **hp,
    ).to(device=ref.device, dtype=ref.dtype)
    _copy(layer, block)
    block.train(layer.training)
    return block


def decoder_from_torch(stack: nn.TransformerDecoder, backend: str = "auto") -> Decoder:
    if not isinstance(stack, nn.TransformerDecoder):
        raise TypeError(f"stack must be a torch.nn.TransformerDecoder, got {type(stack).__name__}")
    hps = [_hparams(layer) for layer in stack.layers]
    if any(hp != hps[0] for hp in hps[1:]):
        raise ValueError("all layers of the torch.nn stack must share their hyper-parameters")
    if stack.norm is not None and not isinstance(stack.norm, nn.LayerNorm):
        raise ValueError(f"final norm must be a LayerNorm, got {type(stack.norm).__name__}")
    config = DecoderConfig(
        n_layers=len(stack.layers), final_norm=stack.norm is not None, backend=backend, **hps[0]
    )
    ref = stack.layers[0].self_attn.in_proj_weight
    decoder = Decoder(config).to(device=ref.device, dtype=ref.dtype)
    for theirs, ours in zip(stack.layers, decoder.layers, strict=True):
        _copy(theirs, ours)
    if stack.norm is not None:
        decoder.final_norm = copy.deepcopy(stack.norm)  # its own eps and affine choice
    decoder.train(stack.training)
    return decoder
