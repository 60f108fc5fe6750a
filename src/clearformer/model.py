"""``EncoderModel``: token ids in, hidden states out (embeddings + encoder stack)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import EncoderConfig
from .embeddings import Embeddings
from .encoder import Encoder
from .masks import from_attention_mask


class EncoderModel(nn.Module):
    """Embeddings followed by an :class:`~clearformer.encoder.Encoder`."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderConfig):
            raise TypeError(f"config must be an EncoderConfig, got {type(config).__name__}")
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Encode token ids.

        Args:
            input_ids: (B, T) int64 token ids.
            attention_mask: (B, T), bool or 0/1 integers (Hugging Face style): 1/True = token.
            token_type_ids: (B, T) segment ids, when the model has token types.

        Returns:
            (B, T, D) hidden states, zero at padded positions.
        """
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
            raise ValueError(f"input_ids must be a 2-D (B, T) tensor, got {shape}")
        if input_ids.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"input_ids must hold integers, got dtype {input_ids.dtype}")
        B, T = input_ids.shape
        if self.config.max_length < T:
            raise ValueError(
                f"input_ids has length T={T}, above the model's maximum "
                f"{self.config.max_length}; truncate the input"
            )
        vocab = self.config.vocab_size
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab):
            raise ValueError(
                f"input_ids must be in [0, vocab_size={vocab}), got values in "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]"
            )
        mask = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor):
                raise TypeError(
                    f"attention_mask must be a torch.Tensor or None, "
                    f"got {type(attention_mask).__name__}"
                )
            if tuple(attention_mask.shape) != (B, T):
                raise ValueError(
                    f"attention_mask must have shape (B, T) = ({B}, {T}), "
                    f"got {tuple(attention_mask.shape)}"
                )
            mask = from_attention_mask(attention_mask)
        if token_type_ids is not None:
            self._check_token_types(token_type_ids, B, T)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        return self.encoder(x, mask)

    def _check_token_types(self, token_type_ids: Tensor, B: int, T: int) -> None:
        if not isinstance(token_type_ids, Tensor) or tuple(token_type_ids.shape) != (B, T):
            shape = getattr(token_type_ids, "shape", type(token_type_ids).__name__)
            raise ValueError(f"token_type_ids must have shape (B, T) = ({B}, {T}), got {shape}")
        if not token_type_ids.numel():
            return
        low, high = int(token_type_ids.min()), int(token_type_ids.max())
        types = self.config.type_vocab_size
        if types == 0 and (low, high) != (0, 0):
            # Zeros are what a tokenizer gives for single texts; anything else would be dropped.
            raise ValueError(
                "token_type_ids must be all 0: the model has no token type embeddings "
                f"(type_vocab_size=0), got values in [{low}, {high}]"
            )
        if types > 0 and (low < 0 or high >= types):
            raise ValueError(
                f"token_type_ids must be in [0, {types}) (type_vocab_size), "
                f"got values in [{low}, {high}]"
            )
