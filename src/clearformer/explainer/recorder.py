"""The recorder: turns the tensors handed to ``clearformer.tracing.record`` into trace steps.

It keeps summaries (statistics, per-token norms) and the attention weights, never the modules
or their parameters, and it reads each tensor once, right when it is recorded.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .source import Source, locate
from .steps import ModelFacts, step_info
from .trace import LayerAttention, Stats, Step

# Record points that mark a position in the stack rather than a step of their own.
_MARKERS = ("encoder.layer",)


class TraceRecorder:
    """Collects the steps of one forward pass (implements ``clearformer.tracing.Recorder``).

    Args:
        facts: how the model is built (for the formulas).
        token_mask: (B, T) bool, True = real token; statistics cover real tokens only.
        layer: the block index of steps before the first ``encoder.layer`` marker (0 when a
            lone block is traced, None when embeddings come first).
    """

    def __init__(self, facts: ModelFacts, token_mask: Tensor, layer: int | None = None) -> None:
        self.facts = facts
        self.token_mask = token_mask
        self.layer = layer
        self.steps: list[Step] = []
        self.attention: list[LayerAttention] = []
        self._attn_mask: Tensor | None = None  # the mask of the attention call under way

    # -- clearformer.tracing.Recorder ----------------------------------------------------------
    def on_step(self, name: str, value: Tensor, meta: dict[str, Any], file: str, line: int):
        if name in _MARKERS:
            self.layer = int(meta["layer"])
            return
        if name == "encoder.output":
            self.layer = None
        if name == "attn.scores":
            self._attn_mask = None
        elif name == "attn.masked_scores":
            self._attn_mask = meta.get("mask")
        anchor = step_info(name, self.facts).anchor
        self.add(name, value, locate(file, line, anchor))
        if name == "attn.weights":
            self._add_attention(value)

    # -- steps ---------------------------------------------------------------------------------
    def add(self, name: str, value: Tensor, source: Source) -> Step:
        """Summarise ``value`` as step ``name`` computed at ``source``."""
        info = step_info(name, self.facts)
        value = value.detach()
        dims = info.dims
        if len(dims) != value.dim():
            dims = tuple(f"d{i}" for i in range(value.dim()))
        attn_mask = self._attn_mask if name in ("attn.masked_scores", "attn.weights") else None
        token_norms = None
        if dims == ("B", "T", "D"):
            token_norms = value.float().norm(dim=-1).cpu()  # (B, T)
        step = Step(
            index=len(self.steps),
            name=name,
            layer=self.layer,
            title=info.title,
            formula=info.formula,
            latex=info.latex,
            about=info.about,
            source=source,
            shape=tuple(value.shape),
            dims=dims,
            stats=summarize(value, dims, self.token_mask, attn_mask),
            token_norms=token_norms,
        )
        self.steps.append(step)
        return step

    def _add_attention(self, weights: Tensor) -> None:
        B, H, Tq, Tk = weights.shape
        mask = None
        if self._attn_mask is not None:
            mask = self._attn_mask.expand(B, H, Tq, Tk).cpu()  # broadcast (B|1, H|1, ...) out
        lost = (~mask).sum(dim=-1) if mask is not None else torch.zeros(B, H, Tq, dtype=torch.long)
        layer = self.layer if self.layer is not None else len(self.attention)
        self.attention.append(
            LayerAttention(layer, weights.detach().float().cpu().clone(), mask, lost)
        )


def summarize(
    value: Tensor, dims: tuple[str, ...], token_mask: Tensor, attn_mask: Tensor | None = None
) -> Stats:
    """Statistics of ``value`` over the entries that take part.

    Args:
        value: the recorded tensor; its leading dims are named by ``dims``.
        dims: e.g. ("B", "T", "D"), ("B", "H", "T", "Dh"), ("B", "H", "Tq", "Tk").
        token_mask: (B, T) bool; padded tokens are left out (their rows are computed, but the
            stack discards them).
        attn_mask: for scores and weights, the attention mask; masked entries are left out.
    """
    v = value.detach().float()
    m = token_mask.to(v.device)
    B, T = m.shape
    if dims[:2] == ("B", "T") and tuple(v.shape[:2]) == (B, T):
        chosen = v[m]  # (real tokens, ...)
    elif dims[:3] == ("B", "H", "T") and (v.shape[0], v.shape[2]) == (B, T):
        chosen = v.transpose(1, 2)[m]
    elif dims == ("B", "H", "Tq", "Tk") and (v.shape[0], v.shape[2], v.shape[3]) == (B, T, T):
        keep = m[:, None, :, None] & m[:, None, None, :]  # (B, 1, Tq, Tk)
        if attn_mask is not None:
            keep = keep & attn_mask.to(v.device)
        chosen = v[keep.expand_as(v)]
    else:
        chosen = v.reshape(-1)
    chosen = chosen.reshape(-1)
    if chosen.numel() == 0:
        return Stats(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    return Stats(
        mean=float(chosen.mean()),
        std=float(chosen.std(unbiased=False)),
        min=float(chosen.min()),
        max=float(chosen.max()),
        norm=float(chosen.norm()),
        count=int(chosen.numel()),
    )
