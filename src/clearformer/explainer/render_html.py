"""The HTML report: one self-contained file (inline CSS, script and data; no network at view
time, enforced by a Content-Security-Policy that allows nothing to be fetched).

Sections: the input and notes; token-labelled attention heatmaps per layer and head (click one
for a large view; masked cells hatched); the residual-stream norms through the layers; every
step with its formula, source line, shape and statistics.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

from .html_assets import CSS, JS
from .trace import Step, Trace

# Steps after which the residual stream holds the model's running representation.
STREAM_STEPS = {
    "embeddings.output": "embeddings",
    "block.attn_residual": "+attn",
    "block.mlp_residual": "+ffn",
    "encoder.output": "final",
}
_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def render_html(trace: Trace) -> str:
    """The report as one HTML string."""
    data = json.dumps(_data(trace), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # "</" inside a script element would end it early.
    data = data.replace("</", "<\\/")
    m = trace.model
    title = trace.texts[0] if trace.texts else f"{m['kind']} trace"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>clearformer explain: {_e(title[:80])}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>clearformer explain</h1>",
        f'<p class="summary">{_e(_summary(trace))}</p>',
        _inputs(trace),
        _notes(trace),
        "<h2>Attention</h2>",
        '<p class="muted">Rows are queries, columns are keys; each map is one head of one layer. '
        'Brighter = more weight (scaled to each map\'s largest weight). <span class="swatch">'
        "</span> = masked: a padded key, or a padded query.</p>",
        _sequence_picker(trace),
        '<div id="grid" class="grid"></div>',
        '<div class="focus"><div><h2 id="focus-title"></h2>',
        '<canvas id="focus-canvas" width="10" height="10"></canvas>',
        '<p id="hover"></p><p id="lost" class="muted"></p></div></div>',
        "<h2>Residual stream</h2>",
        '<p class="muted">The norm of each token\'s vector in the residual stream after each '
        "sub-layer: how much each step writes into the stream.</p>",
        '<div id="stream"></div>',
        "<h2>Steps</h2>",
        _steps(trace),
        '<footer>schema clearformer.explain.trace · <span id="status" data-status="pending">'
        "script not run</span></footer>",
        f'<script type="application/json" id="explain-data">{data}</script>',
        f"<script>{JS}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_html(trace: Trace, path: str | os.PathLike) -> Path:
    """Write the report to ``path`` atomically (a temporary file, then ``os.replace``)."""
    from ..io import atomic_write

    text = render_html(trace)
    with atomic_write(path, "w") as handle:
        handle.write(text)
    return Path(path)


def _data(trace: Trace) -> dict:
    stream = []
    for step in trace.steps:
        label = STREAM_STEPS.get(step.name)
        if label is None and step.name == "block.input" and step.layer == 0 and not stream:
            label = "input"  # a lone block or a bare stack: its input starts the stream
        if label is None or step.token_norms is None:
            continue
        prefix = "" if step.layer is None else f"L{step.layer} "
        stream.append({"label": prefix + label, "norms": _rounded(step.token_norms, 4)})
    return {
        "tokens": trace.tokens,
        "mask": trace.token_mask.int().tolist(),
        "n_heads": trace.n_heads,
        "layers": [
            {
                "weights": _rounded(a.weights, 5),
                "mask": _mask(a.mask, trace.token_mask),
                "lost_keys": a.lost_keys.tolist(),
            }
            for a in trace.attention
        ],
        "stream": stream,
    }


def _mask(mask, token_mask) -> list | str | None:
    """The attention mask for the page: "keys" when it is the key-padding mask (the script then
    reads the (B, T) token mask), saving a (B, H, T, T) array."""
    if mask is None:
        return None
    keys = token_mask[:, None, None, :].expand_as(mask)  # (B, H, Tq, Tk)
    return "keys" if bool((mask == keys).all()) else mask.int().tolist()


def _rounded(t, digits: int) -> list:
    return t.float().nan_to_num(0.0, 0.0, 0.0).round(decimals=digits).tolist()


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _summary(trace: Trace) -> str:
    m = trace.model
    return (
        f"{m['kind']}: {m['n_layers']} × {m['norm']}-norm blocks, D = {m['d_model']}, "
        f"H = {m['n_heads']} heads of Dh = {m['head_dim']}, feed-forward {m['dim_mlp']} "
        f"({m['activation']}), {m['parameters']:,} parameters"
    )


def _inputs(trace: Trace) -> str:
    rows = []
    for b, tokens in enumerate(trace.tokens):
        text = trace.texts[b] if trace.texts else None
        chips = "".join(
            f'<span class="{"" if keep else "pad"}">{_e(t)}</span>'
            for t, keep in zip(tokens, trace.token_mask[b].tolist(), strict=True)
        )
        head = f"<b>{b}</b> " + (f"“{_e(text)}”" if text is not None else "")
        cut = " <i>(truncated)</i>" if trace.truncated[b] else ""
        rows.append(f'<p class="tokens">{head}{cut}<br>{chips}</p>')
    return "\n".join(rows)


def _notes(trace: Trace) -> str:
    fid = trace.fidelity
    verdict = (
        f'<span class="ok">✓ within {fid.tolerance:g}</span>'
        if fid.ok
        else f'<span class="bad">✗ above {fid.tolerance:g}</span>'
    )
    items = [
        f"<li>traced on the {_e(fid.traced)}; max |trace − production| = "
        f"{fid.max_abs_diff:.1e} {verdict}</li>"
    ]
    items += [f"<li>{_e(n)}</li>" for n in trace.notes]
    return f'<ul class="notes">{"".join(items)}</ul>'


def _sequence_picker(trace: Trace) -> str:
    if len(trace.tokens) < 2:
        return ""
    options = "".join(f'<option value="{b}">{b}</option>' for b in range(len(trace.tokens)))
    return (
        f'<p class="controls"><label>sequence <select id="sequence">{options}</select></label></p>'
    )


def _steps(trace: Trace) -> str:
    groups: dict[object, list[Step]] = {}
    for step in trace.steps:
        groups.setdefault(step.layer, []).append(step)
    out = []
    for key, steps in groups.items():
        if key is None:
            title = "embeddings" if steps[0].name.startswith("embeddings") else "after the stack"
        else:
            title = f"layer {key}"
        rows = "".join(_step_row(s) for s in steps)
        out.append(
            f"<details{' open' if key == 0 else ''}><summary>{_e(title)}</summary>"
            '<table class="steps"><tr><th>step</th><th>formula</th><th>code</th>'
            f"<th>shape</th><th>statistics</th></tr>{rows}</table></details>"
        )
    return "\n".join(out)


def _step_row(step: Step) -> str:
    s = step.stats
    shape = " × ".join(f"{d}={n}" for d, n in zip(step.dims, step.shape, strict=False))
    stats = (
        f"mean {s.mean:+.3g}<br>std {s.std:.3g}<br>min {s.min:+.3g}<br>max {s.max:+.3g}"
        f"<br>‖·‖ {s.norm:.3g}"
    )
    return (
        f"<tr><td><b>{_e(step.title)}</b><br><code>{_e(step.name)}</code></td>"
        f'<td><span class="formula" title="{_e(step.latex)}">{_e(step.formula)}</span>'
        f'<br><span class="muted">{_e(step.about)}</span></td>'
        f"<td><pre>{_e(step.source.code)}</pre>"
        f'<span class="where">{_e(step.source.file)}:{step.source.line}</span></td>'
        f'<td>{_e(shape)}</td><td class="stats">{stats}</td></tr>'
    )
