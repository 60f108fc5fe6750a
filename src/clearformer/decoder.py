"""The decoder stack: N decoder blocks over one memory, planned once per call, a final norm for
pre-norm, and an explicit cache for incremental decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .checks import (
    check_bool,
    check_choice,
    check_divisible,
    check_positive_float,
    check_positive_int,
    check_probability,
)
from .decoder_block import DecoderBlock, LayerCache, prepare_call
from .options import ACTIVATIONS, BACKENDS, NORMS


@dataclass(frozen=True)
class DecoderConfig:
    """A decoder stack (the decoder's embeddings belong to the model that owns it)."""

    d_model: int = 512  # width D of the target rows and the memory
    n_heads: int = 8
    n_layers: int = 6
    dim_mlp: int = 2048
    dropout: float = 0.0
    attn_dropout: float | None = None  # None: same as dropout
    norm: str = "pre"  # "pre" or "post" (the original paper's)
    activation: str = "relu"
    norm_eps: float = 1e-5
    bias: bool = True
    final_norm: bool | None = None  # None: only for pre-norm
    backend: str = "auto"  # auto | math | sdpa (the decoder runs on the padded layout)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "dim_mlp"):
            check_positive_int(getattr(self, name), f"DecoderConfig.{name}")
        check_choice(self.norm, NORMS, "DecoderConfig.norm")
        check_choice(self.backend, BACKENDS, "DecoderConfig.backend")
        check_bool(self.final_norm, "DecoderConfig.final_norm", optional=True)
        check_bool(self.bias, "DecoderConfig.bias")
        check_divisible(self.d_model, self.n_heads, "DecoderConfig.d_model", "n_heads")
        check_probability(self.dropout, "DecoderConfig.dropout")
        check_probability(self.attn_dropout, "DecoderConfig.attn_dropout", optional=True)
        check_positive_float(self.norm_eps, "DecoderConfig.norm_eps")
        check_choice(self.activation, ACTIVATIONS, "DecoderConfig.activation")
        if self.backend == "varlen":
            raise ValueError(
                "DecoderConfig.backend must be 'auto', 'math' or 'sdpa' (the decoder runs on "
                "the padded layout), got 'varlen'"
            )

    @property
    def use_final_norm(self) -> bool:
        return self.norm == "pre" if self.final_norm is None else self.final_norm


@dataclass(frozen=True)
class DecoderCache:
    """Every block's :class:`LayerCache`: what incremental decoding carries between steps."""

    layers: tuple[LayerCache, ...]

    @property
    def length(self) -> int:
        """Target tokens cached so far."""
        return self.layers[0].length

    @property
    def batch(self) -> int:
        return self.layers[0].batch

    @property
    def memory_length(self) -> int:
        return self.layers[0].memory_length

    def select(self, rows: Tensor, *, memory: bool = True) -> DecoderCache:
        """The cache of batch rows ``rows``, in that order (see :meth:`LayerCache.select`)."""
        return DecoderCache(tuple(c.select(rows, memory=memory) for c in self.layers))


class Decoder(nn.Module):
    """A stack of :class:`DecoderBlock` built from a :class:`DecoderConfig`."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
        self.config = config
        self.layers = nn.ModuleList(
            DecoderBlock(
                config.d_model,
                config.n_heads,
                config.dim_mlp,
                config.dropout,
                norm=config.norm,
                activation=config.activation,
                attn_dropout=config.attn_dropout,
                norm_eps=config.norm_eps,
                bias=config.bias,
                backend=config.backend,
            )
            for _ in range(config.n_layers)
        )
        self.final_norm = (
            nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)
            if config.use_final_norm
            else nn.Identity()
        )

    def start_cache(self, memory: Tensor) -> DecoderCache:
        """An empty cache for decoding against ``memory`` (B, S, D); every layer projects the
        memory's keys and values here, once per source."""
        return DecoderCache(tuple(block.start_cache(memory) for block in self.layers))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        cache: DecoderCache | None = None,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, DecoderCache]:
        """Decode ``x`` (B, T, D) against ``memory`` (B, S, D).

        Masks and cache as :meth:`DecoderBlock.forward`: ``mask`` (B, T) and ``memory_mask``
        (B, S) bool, True = real token; with a cache, ``x`` holds the new rows only and
        ``(y, cache)`` returns. The output is zero at padded target positions.
        """
        x, start, self_plan, cross_plan = prepare_call(
            self,
            x,
            memory,
            mask,
            memory_mask,
            cache,
            cache_type=DecoderCache,
            heads=self.config.n_heads,
            backend=self.config.backend if backend is None else backend,
        )
        caches = []
        for block, layer_cache in zip(self.layers, start.layers, strict=True):
            x, new = block.run(x, layer_cache, self_plan, cross_plan)
            caches.append(new)
        x = self.final_norm(x)
        if mask is not None:
            x = torch.where(mask[..., None], x, 0.0)
        return x if cache is None else (x, DecoderCache(tuple(caches)))
