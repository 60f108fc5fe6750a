"""Token embeddings: word + position (+ token type), optional LayerNorm, dropout."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import EncoderConfig
from .dropout import Dropout
from .norms import make_norm
from .positions import sinusoidal_table
from .tracing import record


class Embeddings(nn.Module):
    """``(B, T)`` token ids -> ``(B, T, D)`` vectors.

    ``x = Dropout(Norm(word[ids] + position[offset + t] + token_type[type_ids]))``; the norm
    only when ``config.embedding_norm`` (BERT), token types only when ``type_vocab_size > 0``;
    ``word[ids]`` times sqrt(D) when ``config.scale_embeddings`` (Gemma).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("Embeddings need EncoderConfig.vocab_size, got None")
        self.config = config
        d = config.d_model
        self.word = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        if config.positions == "learned":
            self.position = nn.Embedding(config.max_positions, d)
        else:
            self.position = None
        if config.positions == "sinusoidal":
            self.register_buffer(
                "position_table", self.computed_buffers()["position_table"], persistent=False
            )
        else:
            self.position_table = None
        self.token_type = (
            nn.Embedding(config.type_vocab_size, d) if config.type_vocab_size > 0 else None
        )
        self.norm = (
            make_norm(
                config.norm_kind,
                d,
                config.norm_eps,
                bias=config.bias,
                unit_offset=config.norm_unit_offset,
            )
            if config.embedding_norm
            else nn.Identity()
        )
        self.dropout = Dropout(config.dropout)

    def computed_buffers(self) -> dict[str, Tensor]:
        """The buffers this module computes rather than loads (the sinusoidal table), made
        anew: a model built on the meta device to be filled by a checkpoint gets them here."""
        if self.config.positions != "sinusoidal":
            return {}
        return {"position_table": sinusoidal_table(self.config.max_positions, self.config.d_model)}

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """``(B, T)`` ids -> ``(B, T, D)``; or ``(N,)`` packed ids with their ``positions``
        (N,) within their own sequences -> ``(N, D)``. Padded ids take ``positions`` (B, T)
        (each token's index among its sequence's real tokens) or, when None, 0 .. T-1."""
        x = self.word(input_ids)  # (B, T, D) or (N, D)
        if self.config.scale_embeddings:
            # Gemma: times sqrt(D), the factor rounded to float32 and then to the table's dtype,
            # as Gemma's code does (bfloat16 holds sqrt(768) = 27.71 as 27.75).
            factor = torch.tensor(self.config.d_model**0.5, dtype=torch.float32)
            x = x * factor.to(device=x.device, dtype=x.dtype)
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device)  # (T,)
        positions = positions + self.config.position_offset
        if self.position is not None:
            x = x + self.position(positions)  # (T, D) broadcast over B, (B, T, D) or (N, D)
        elif self.position_table is not None:
            x = x + self.position_table[positions].to(x.dtype)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type(token_type_ids)
        record("embeddings.sum", x)
        x = self.dropout(self.norm(x))
        record("embeddings.output", x)
        return x
