"""The encoder stack: N blocks, one layout for the whole stack, a final norm for pre-norm.

On a ragged batch the stack unpads once at its edge (``(B, T, D)`` -> ``(N, D)`` real tokens),
runs every block on the packed rows and repads once at the end. Either way the output at padded
positions is **zero**, so the padded and packed paths give the same tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .blocks import EncoderBlock
from .config import EncoderConfig
from .masks import validate_key_padding_mask
from .padding import PackedLayout, repad, unpad
from .tracing import record

# Packing costs one gather and one scatter of (N, D), and attention then needs either one call
# per run of equally long sequences or a gather to a padded copy (clearformer.attention.varlen).
# Measured on 2 CPU cores, idle (`clearformer bench --sections packing`, MiniLM size,
# B 32 x T 128): packed vs padded -1 % at 1.9 % padding, -2 % at 4.9 %, +12 % at 8.5 %,
# +17 % at 17.9 %; break-even lies between 5 and 8.5 %.
PACK_MIN_PADDING = 0.06


@dataclass(frozen=True)
class LayoutChoice:
    """Whether a call runs packed, and why."""

    packed: bool
    reason: str

    def __str__(self) -> str:
        return f"{'packed' if self.packed else 'padded'} ({self.reason})"


class Encoder(nn.Module):
    """A stack of :class:`~clearformer.blocks.EncoderBlock` built from an :class:`EncoderConfig`.

    Each block is initialised independently (no clones of one initialisation).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderConfig):
            raise TypeError(f"config must be an EncoderConfig, got {type(config).__name__}")
        self.config = config
        self.layers = nn.ModuleList(
            EncoderBlock(
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

    def layout_for(self, mask: Tensor | None) -> LayoutChoice:
        """Decide between the padded and the packed path for a (B, T) mask."""
        cfg = self.config
        if mask is None:
            if cfg.backend == "varlen":
                return LayoutChoice(True, "backend='varlen' runs on packed rows")
            return LayoutChoice(False, "no mask: nothing to unpad")
        if cfg.backend in ("math", "sdpa"):
            return LayoutChoice(False, f"backend={cfg.backend!r} runs on the padded layout")
        if cfg.packing == "never":
            return LayoutChoice(False, "packing='never'")
        if cfg.packing == "always" or cfg.backend == "varlen":
            return LayoutChoice(True, "packing requested")
        if torch.compiler.is_compiling():
            return LayoutChoice(False, "under torch.compile the padded path has static shapes")
        padding = 1.0 - float(mask.sum()) / max(mask.numel(), 1)
        if padding >= PACK_MIN_PADDING:
            return LayoutChoice(True, f"{padding:.0%} of positions are padding")
        return LayoutChoice(False, f"only {padding:.0%} padding: packing would not pay")

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Encode a batch.

        Args:
            x: (B, T, D) input vectors.
            mask: (B, T) bool, True = real token, False = padding.

        Returns:
            (B, T, D) hidden states; zero at padded positions.
        """
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.config.d_model:
            raise ValueError(
                f"x must have shape (B, T, d_model={self.config.d_model}), got {tuple(x.shape)}"
            )
        mask = validate_key_padding_mask(mask, x.shape[0], x.shape[1], x.device)
        if mask is not None and not torch.compiler.is_compiling() and bool(mask.all()):
            # Nothing is padding: the unmasked attention kernel is faster and nothing needs
            # zeroing. (Under torch.compile the check would break the graph; the mask stays.)
            mask = None
        if self.layout_for(mask).packed:
            if mask is None:
                mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)  # (B, T)
            rows, layout = unpad(x, mask)  # (N, D)
            rows = self._run_blocks(rows, None, layout)
            return repad(rows, layout)  # (B, T, D), zeros at padding
        x = self._run_blocks(x, mask, None)
        if mask is not None:
            x = torch.where(mask[..., None], x, 0.0)  # one pass (masked_fill clones, then fills)
        return x

    def _run_blocks(self, x: Tensor, mask: Tensor | None, layout: PackedLayout | None) -> Tensor:
        for index, block in enumerate(self.layers):
            record("encoder.layer", x, layer=index)
            if self.config.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, mask, layout=layout, use_reentrant=False)
            else:
                x = block(x, mask, layout=layout)
        x = self.final_norm(x)
        record("encoder.output", x)
        return x

    @classmethod
    def from_torch(cls, stack: nn.TransformerEncoder, backend: str = "auto") -> Encoder:
        """An :class:`Encoder` with the same numerics as a ``torch.nn.TransformerEncoder``."""
        from .interop.torch_nn import encoder_from_torch

        return encoder_from_torch(stack, backend=backend)
