"""Attention maps as a PNG image (matplotlib, an optional dependency: ``clearformer[plot]``).

One panel per layer and head of one sequence (``Filters`` narrows to a layer and/or a head);
tokens label the axes when few panels are drawn. Masked cells (padded keys, padded queries)
are grey and hatched.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from .filters import Filters, check_filters
from .trace import Trace

_LABELLED_PANELS = 4  # up to this many panels get token labels on their axes
_HATCH_MAX_TOKENS = 48  # above this, masked cells are grey without hatching


def render_png(trace: Trace, filters: Filters | None = None, *, dpi: int = 110) -> bytes:
    """The attention maps of ``trace`` as PNG bytes."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError as exc:
        raise ImportError(
            "PNG attention maps need matplotlib: pip install 'clearformer[plot]'"
        ) from exc
    f = check_filters(
        filters or Filters(),
        n_layers=trace.n_layers,
        n_heads=trace.n_heads,
        batch=len(trace.tokens),
    )
    b = f.sequence
    layers = [a for a in trace.attention if f.layer is None or a.layer == f.layer]
    heads = list(range(trace.n_heads)) if f.head is None else [f.head]
    labels = trace.tokens[b]
    T = len(labels)
    real = trace.token_mask[b].numpy()  # (T,)
    labelled = len(layers) * len(heads) <= _LABELLED_PANELS
    size = 4.2 if labelled else 1.6
    fig = Figure(figsize=(size * len(heads) + 0.8, size * len(layers) + 0.8), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    image = None
    for r, attention in enumerate(layers):
        for c, h in enumerate(heads):
            ax = axes[r][c]
            weights = attention.weights[b, h].numpy()  # (Tq, Tk)
            # (Tq, Tk): a real query and a real key the mask lets it see. Built as the full
            # grid even when no mask was recorded (a batch without padding).
            allowed = real[:, None] & real[None, :]
            if attention.mask is not None:
                allowed = allowed & attention.mask[b, h].numpy()
            shown = np.ma.masked_array(weights, mask=~allowed)
            cmap = _cmap()
            image = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
            if T <= _HATCH_MAX_TOKENS:
                for i, j in zip(*np.nonzero(~allowed), strict=True):
                    ax.add_patch(
                        Rectangle(
                            (j - 0.5, i - 0.5),
                            1,
                            1,
                            fill=False,
                            hatch="///",
                            edgecolor="#a4a9b4",
                            linewidth=0,
                        )
                    )
            ax.set_title(f"layer {attention.layer}, head {h}", fontsize=9 if labelled else 7)
            if labelled:
                shown_labels = [_literal(label) for label in labels]
                ax.set_xticks(range(T), shown_labels, rotation=90, fontsize=8)
                ax.set_yticks(range(T), shown_labels, fontsize=8)
                ax.set_xlabel("key", fontsize=8)
                ax.set_ylabel("query", fontsize=8)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
    text = trace.texts[b] if trace.texts else f"sequence {b}"
    fig.suptitle(f"attention weights: {_literal(text[:90])}", fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="weight")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def write_png(
    trace: Trace, path: str | os.PathLike, filters: Filters | None = None, *, dpi: int = 110
) -> Path:
    """Write the attention maps to ``path`` atomically (temporary file, then ``os.replace``)."""
    from ..io import atomic_write

    data = render_png(trace, filters, dpi=dpi)
    with atomic_write(path, "wb") as handle:
        handle.write(data)
    return Path(path)


def _cmap():
    from matplotlib import colormaps

    return colormaps["viridis"].with_extremes(bad="#e4e6eb")


def _literal(text: str) -> str:
    """``text`` drawn as it is: matplotlib reads a pair of ``$`` as mathematics (and fails on
    one it cannot parse), so each is escaped."""
    return text.replace("$", r"\$")
