"""The terminal listing: the real code of every step, each with a comment saying what it does,
its formula, and the live shape and statistics (in the spirit of a commented source listing).

Every line fits in ``WIDTH`` columns.
"""

from __future__ import annotations

import textwrap

import torch

from .filters import Filters, check_filters
from .trace import Step, Trace

WIDTH = 100
# A grid row is "#   " + a 10-column label + 6 columns per key: 14 keys fill WIDTH. Wider
# attention matrices print as "top keys per query" instead.
_GRID_MAX_TOKENS = (WIDTH - 14) // 6


def render_text(trace: Trace, filters: Filters | None = None) -> str:
    """The annotated listing of ``trace``; ``filters`` picks layers, a head, steps, a sequence."""
    f = check_filters(
        filters or Filters(),
        n_layers=trace.n_layers,
        n_heads=trace.n_heads,
        batch=len(trace.tokens),
    )
    out: list[str] = _header(trace, f)
    group = object()
    for step in trace.steps:
        if not f.keeps(step.name, step.layer):
            continue
        if step.layer != group:
            group = step.layer
            out += ["", _rule(_group_title(step))]
        out += _step(trace, step, f)
    if len(out) == len(_header(trace, f)):
        out += ["", "# (no step matches the filters)"]
    return "\n".join(_fit(line) for line in out) + "\n"


def _header(trace: Trace, f: Filters) -> list[str]:
    m = trace.model
    row, keeps = trace.tokens[f.sequence], trace.token_mask[f.sequence].tolist()
    real = [t for t, keep in zip(row, keeps, strict=True) if keep]
    lines = [
        f"# clearformer explain: {m['kind']}, {m['n_layers']} x {m['norm']}-norm blocks, "
        f"D={m['d_model']}, H={m['n_heads']}, Dh={m['head_dim']}, Dff={m['dim_mlp']}, "
        f"{m['activation']}",
    ]
    lines += _wrap(
        f"tokens (sequence {f.sequence} of {len(trace.tokens)}, {len(real)} real): "
        + " | ".join(real)
    )
    fid = trace.fidelity
    verdict = "within" if fid.ok else "ABOVE"
    lines += _wrap(
        f"fidelity: max |trace - production| = {fid.max_abs_diff:.1e} ({verdict} tolerance "
        f"{fid.tolerance:g})"
    )
    for note in trace.notes:
        lines += _wrap(f"note: {note}")
    lines += _wrap(
        "stats cover the real tokens of the whole batch (and, for scores and weights, the "
        "keys each query may see)"
    )
    return lines


def _group_title(step: Step) -> str:
    if step.layer is not None:
        return f"layer {step.layer}"
    if step.name.startswith("embeddings"):
        return "embeddings"
    if step.name in ("pooling", "normalize"):
        return "sentence embedding"
    return "after the last layer"


def _rule(title: str) -> str:
    text = f"# == {title} "
    return text + "=" * (WIDTH - len(text))


def _step(trace: Trace, step: Step, f: Filters) -> list[str]:
    where = "" if step.layer is None else f"[L{step.layer}] "
    lines = ["", *_wrap(f"{where}{step.name}: {step.title}    {step.formula}")]
    lines += _wrap(step.about)
    lines += step.source.code.splitlines() or ["..."]
    shape = ", ".join(f"{d}={n}" for d, n in zip(step.dims, step.shape, strict=False))
    lines.append(f"#   -> {step.source.file}:{step.source.line}   ({shape})")
    s = step.stats
    lines.append(
        f"#   -> mean {s.mean:+.4g}  std {s.std:.4g}  min {s.min:+.4g}  max {s.max:+.4g}  "
        f"norm {s.norm:.4g}  ({s.count} values)"
    )
    if step.layer is not None and step.name in ("attn.masked_scores", "attn.weights"):
        attention = next((a for a in trace.attention if a.layer == step.layer), None)
        if attention is not None:
            if step.name == "attn.masked_scores":
                lines += _lost_keys(trace, attention.lost_keys, f)
            else:
                lines += _weights(trace, attention.weights, attention.mask, f)
    return lines


def _lost_keys(trace: Trace, lost: torch.Tensor, f: Filters) -> list[str]:
    b = f.sequence
    per_query = lost[b].max(dim=0).values  # (Tq,) the most any head lost
    keep = trace.token_mask[b]
    labels = trace.tokens[b]
    counts = [int(n) for n, k in zip(per_query, keep, strict=True) if k]
    if counts and all(c == counts[0] for c in counts):
        return [f"#   keys lost to the mask: every real query of sequence {b} lost {counts[0]}"]
    parts = [f"{lab} {int(n)}" for lab, n, k in zip(labels, per_query, keep, strict=True) if k]
    return _wrap(f"keys lost to the mask per query (sequence {b}): " + " | ".join(parts))


def _weights(trace: Trace, weights: torch.Tensor, mask, f: Filters) -> list[str]:
    b = f.sequence
    keep = trace.token_mask[b]
    if f.head is None:
        w, which = weights[b].mean(dim=0), f"mean over the {weights.shape[1]} heads"
    else:
        w, which = weights[b, f.head], f"head {f.head}"
    allowed = None if mask is None else mask[b].any(dim=0)  # (Tq, Tk)
    labels = trace.tokens[b]
    rows = [i for i in range(len(labels)) if keep[i]]
    if len(labels) <= _GRID_MAX_TOKENS:
        out = [f"#   attention of sequence {b}, {which} (rows: queries, columns: keys; . = masked)"]
        out.append("#   " + " " * 10 + "".join(f"{_short(lab, 5):>6}" for lab in labels))
        for i in range(len(labels)):
            if i not in rows:
                continue
            cells = []
            for j in range(len(labels)):
                masked = allowed is not None and not bool(allowed[i, j])
                cells.append(f"{'.':>6}" if masked else f"{float(w[i, j]):>6.2f}")
            out.append(f"#   {_short(labels[i], 9):<10}" + "".join(cells))
        return out
    out = [f"#   strongest keys per query of sequence {b}, {which}:"]
    for i in rows:
        top = torch.topk(w[i], k=min(3, w.shape[-1]))
        keys = ", ".join(
            f"{labels[j]} {float(v):.2f}" for v, j in zip(top.values, top.indices, strict=True)
        )
        out.append(f"#     {_short(labels[i], 12)} -> {keys}")
    return out


def _short(label: str, n: int) -> str:
    return label if len(label) <= n else label[: n - 1] + "~"


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - 4, initial_indent="# ", subsequent_indent="#   ") or []


def _fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."
