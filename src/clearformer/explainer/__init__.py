"""Explain: a live walk through the encoder's real forward pass.

``explain(model, inputs)`` runs the model twice, as in production and then with recording on
(on the reference attention path), and returns a :class:`Trace`: every step with its formula,
the line of clearformer's source that computed it, the live shape (named dimensions) and
statistics, the attention weights of every head, and how far the recorded output is from the
production one.
Renderers turn a trace into a terminal listing, JSON (``Trace.to_json``), an HTML report or
PNG attention maps.

The function is exported as ``clearformer.explain``; this package is ``clearformer.explainer``.
"""

from .api import explain
from .filters import Filters
from .render_html import render_html, write_html
from .render_png import render_png, write_png
from .render_text import render_text
from .trace import SCHEMA, SCHEMA_VERSION, LayerAttention, Stats, Step, Trace

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "Filters",
    "LayerAttention",
    "Stats",
    "Step",
    "Trace",
    "explain",
    "render_html",
    "render_png",
    "render_text",
    "write_html",
    "write_png",
]
