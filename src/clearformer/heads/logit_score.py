"""A causal language model read as a reranker: the score of a (query, document) text is the
next-token logit of "yes" minus that of "no" at its last real token (Qwen3-Reranker), as
sentence-transformers' ``LogitScore`` module computes it.

Only the language-model head's rows of those two tokens are kept: the score needs two logits,
not the whole vocabulary's, and ``h . w_yes - h . w_no`` is the same number as the difference
of those logits (to float rounding: a sum of D products in another order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..checks import check_int, check_positive_int
from .pooling import pool
from .rowwise import each_row

__all__ = ["LogitScore", "LogitScoreConfig"]


@dataclass(frozen=True)
class LogitScoreConfig:
    """Which vocabulary rows make the score.

    Attributes:
        d_model: width D of the token states.
        vocab_size: rows of the language-model head the ids index.
        true_token_id: the token of a relevant pair ("yes").
        false_token_id: the token of an irrelevant one ("no"); None: the score is the true
            token's logit alone.
    """

    d_model: int
    vocab_size: int
    true_token_id: int
    false_token_id: int | None = None

    def __post_init__(self) -> None:
        check_positive_int(self.d_model, "LogitScoreConfig.d_model")
        check_positive_int(self.vocab_size, "LogitScoreConfig.vocab_size")
        for name in ("true_token_id", "false_token_id"):
            check_int(
                getattr(self, name),
                f"LogitScoreConfig.{name}",
                high=self.vocab_size,
                high_name="vocab_size",
                optional=name == "false_token_id",
            )

    @property
    def num_labels(self) -> int:
        return 1

    @property
    def labels(self) -> tuple[str, ...]:
        return ()

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The rows :attr:`LogitScore.rows` holds, in order."""
        if self.false_token_id is None:
            return (self.true_token_id,)
        return (self.true_token_id, self.false_token_id)


class LogitScore(nn.Module):
    """(B, T, D) final token states + (B, T) mask -> (B, 1) scores.

    Parameters: ``rows`` (1 or 2, D), the language-model head's rows of the true (and false)
    token.
    """

    def __init__(self, config: LogitScoreConfig) -> None:
        super().__init__()
        self.config = config
        self.rows = nn.Parameter(torch.zeros(len(config.token_ids), config.d_model))

    def load_rows(self, lm_head: Tensor) -> None:
        """Take the rows of :attr:`LogitScoreConfig.token_ids` from a (V, D) head weight."""
        with torch.no_grad():
            self.rows.copy_(lm_head[list(self.config.token_ids)].to(self.rows.dtype))

    def forward(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """Scores at each row's last real token, whatever the padding side."""
        last = pool(hidden, attention_mask, "lasttoken")  # (B, D)
        logits = each_row(lambda row: row @ self.rows.T, last)  # (B, 1 or 2): the two logits
        if self.config.false_token_id is None:
            return logits[:, :1]
        return logits[:, :1] - logits[:, 1:]  # (B, 1)
