"""The implementations the suite compares, each built at a given size and run on one batch.

Every implementation receives the same ``(B, T, D)`` input vectors and ``(B, T)`` bool mask
(True = real token), or no mask when the batch has no padding, and returns ``(B, T, D)``.
Stacks are BERT-style (post-norm, exact GELU, no dropout) unless the name says pre-norm.
``transformers`` and ``x_transformers`` are imported only when their rows are built.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from ..config import EncoderConfig
from ..encoder import Encoder
from .workloads import ModelSize

Run = Callable[[nn.Module, Tensor, "Tensor | None"], Tensor]


@dataclass(frozen=True)
class Peer:
    """One implementation: how to build it and how to call it."""

    name: str
    family: str  # "clearformer", "torch.nn", "hf", "x-transformers", "sdpa"
    build: Callable[[ModelSize, int], nn.Module]  # (size, n_layers) -> module
    run: Run
    note: str = ""


# -- clearformer -----------------------------------------------------------------------------
def _clearformer(backend: str) -> Callable[[ModelSize, int], nn.Module]:
    def build(size: ModelSize, n_layers: int) -> nn.Module:
        config = EncoderConfig(
            d_model=size.d_model,
            n_heads=size.n_heads,
            n_layers=n_layers,
            dim_mlp=size.dim_mlp,
            norm="post",
            activation="gelu",
            backend=backend,
        )
        return Encoder(config)

    return build


def _run_clearformer(model: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    return model(x, mask)


# -- torch.nn --------------------------------------------------------------------------------
def _torch_nn(norm_first: bool) -> Callable[[ModelSize, int], nn.Module]:
    def build(size: ModelSize, n_layers: int) -> nn.Module:
        layer = nn.TransformerEncoderLayer(
            size.d_model,
            size.n_heads,
            size.dim_mlp,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=norm_first,
        )
        # The nested-tensor fast path skips padding (eval, post-norm, inference only).
        return nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=not norm_first)

    return build


def _run_torch_nn(model: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    return model(x, src_key_padding_mask=None if mask is None else ~mask)


# -- Hugging Face ----------------------------------------------------------------------------
def _build_hf(size: ModelSize, n_layers: int) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=64,  # unused: the benchmark feeds input vectors
        hidden_size=size.d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=size.n_heads,
        intermediate_size=size.dim_mlp,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=size.max_length,
    )
    return BertModel._from_config(config, attn_implementation="sdpa", add_pooling_layer=False)


def _run_hf(model: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    attention_mask = None if mask is None else mask.long()
    return model(inputs_embeds=x, attention_mask=attention_mask).last_hidden_state


# -- x-transformers --------------------------------------------------------------------------
def _build_xt(size: ModelSize, n_layers: int) -> nn.Module:
    from x_transformers import Encoder as XEncoder

    return XEncoder(
        dim=size.d_model,
        depth=n_layers,
        heads=size.n_heads,
        ff_mult=size.dim_mlp // size.d_model,
        attn_flash=True,
    )


def _run_xt(model: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    return model(x, mask=mask)


# -- the floor for one long layer: a plain pre-norm layer around SDPA ------------------------
class SdpaLayer(nn.Module):
    """The least an encoder layer can do: fused QKV, SDPA, output, feed-forward, two norms."""

    def __init__(self, size: ModelSize) -> None:
        super().__init__()
        D = size.d_model
        self.n_heads = size.n_heads
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, size.dim_mlp), nn.Linear(size.dim_mlp, D)

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.n_heads, -1).unbind(2)
        # (B, T, H, Dh) -> (B, H, T, Dh)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.out(a.transpose(1, 2).reshape(B, T, D))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def _build_sdpa_layer(size: ModelSize, n_layers: int) -> nn.Module:
    return SdpaLayer(size)


def _run_sdpa_layer(model: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    if mask is not None:
        raise ValueError("the SDPA reference layer runs unmasked batches only")
    return model(x)


# -- the lists -------------------------------------------------------------------------------
def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def stack_peers(*, with_math: bool = True) -> list[Peer]:
    """Implementations of a whole encoder stack."""
    peers = [
        Peer(
            "clearformer auto",
            "clearformer",
            _clearformer("auto"),
            _run_clearformer,
            "packs ragged batches, SDPA otherwise",
        ),
        Peer(
            "clearformer varlen",
            "clearformer",
            _clearformer("varlen"),
            _run_clearformer,
            "always packed",
        ),
        Peer(
            "clearformer sdpa",
            "clearformer",
            _clearformer("sdpa"),
            _run_clearformer,
            "padded layout",
        ),
    ]
    if with_math:
        peers.append(
            Peer(
                "clearformer math",
                "clearformer",
                _clearformer("math"),
                _run_clearformer,
                "reference, padded",
            )
        )
    peers += [
        Peer(
            "torch.nn post-norm",
            "torch.nn",
            _torch_nn(False),
            _run_torch_nn,
            "nested-tensor fast path in inference",
        ),
        Peer("torch.nn pre-norm", "torch.nn", _torch_nn(True), _run_torch_nn, "plain path"),
    ]
    if has_module("transformers"):
        peers.append(Peer("HF BertModel sdpa", "hf", _build_hf, _run_hf, "random init"))
    if has_module("x_transformers"):
        peers.append(
            Peer("x-transformers", "x-transformers", _build_xt, _run_xt, "pre-norm, attn_flash")
        )
    return peers


def long_sequence_peers(*, with_math: bool = True) -> list[Peer]:
    """Implementations of one layer for the long-sequence rows (no mask)."""
    peers = [
        Peer("clearformer auto", "clearformer", _clearformer("auto"), _run_clearformer),
        Peer(
            "SDPA layer",
            "sdpa",
            _build_sdpa_layer,
            _run_sdpa_layer,
            "plain layer around SDPA: the floor",
        ),
        Peer("torch.nn pre-norm", "torch.nn", _torch_nn(True), _run_torch_nn),
    ]
    if with_math:
        peers.insert(
            1, Peer("clearformer math", "clearformer", _clearformer("math"), _run_clearformer)
        )
    return peers


def find_peer(name: str) -> Peer:
    for peer in stack_peers() + long_sequence_peers():
        if peer.name == name:
            return peer
    raise ValueError(f"unknown implementation {name!r}")
