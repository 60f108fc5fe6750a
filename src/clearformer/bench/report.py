"""Writing the results: a markdown table, JSON, and a PNG chart (when matplotlib is present)."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path

from ..io import atomic_write
from .suite import Results

TITLES = {
    "kernels": "Attention alone on the ragged batch (varlen methods vs padded SDPA)",
    "inference": "Inference (whole stack)",
    "training": "Training step (forward, backward, AdamW)",
    "long": "One layer, long sequences (no mask)",
    "packing": "When packing pays: packed (varlen) vs padded (sdpa) clearformer",
}


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def markdown(results: Results) -> str:
    env = results.environment
    lines = [
        "# clearformer benchmark",
        "",
        f"{env['date']} · torch {env['torch']} · transformers {env.get('transformers')} · "
        f"x-transformers {env.get('x_transformers')} · {env['threads']} threads · "
        f"{env['dtype']} · allocator: {env['allocator']}.",
        "",
        f"CPU: {env['cpu']['summary']}." if "cpu" in env else "CPU: not recorded.",
        "",
        "GEMM rate (the faster of torch.matmul and oneDNN's linear op at each size's layer "
        "shapes): "
        + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in results.gemm_gflops.items())
        + " (fastest of 10 rounds, highest of the runs before and after each section). Tokens are"
        " real tokens only; tokens/s and ms are medians,"
        " best = tokens/s of the fastest round; MFU = model FLOPs on real tokens / median time /"
        " GEMM rate; × torch.nn = median tokens/s over the best torch.nn row of the workload.",
    ]
    if results.load:
        load = results.load
        state = "**LOADED: these figures do not reproduce**" if load["loaded"] else "quiet"
        first_last = ", ".join(
            f"{k} {v[0]:.0f} -> {v[-1]:.0f} GFLOP/s" for k, v in results.gemm_first_last.items()
        )
        if load.get("others_during") is not None:
            probe = load.get("others_before")
            counted = (
                f"other processes busy on {'' if probe is None else f'{probe:.2f} CPUs before, '}"
                f"{load['others_during']:.2f} during the run, its own threads not counted; load "
                f"average {load['before'][0]:.2f} -> {load['after'][0]:.2f}"
            )
        else:
            counted = f"load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after"
        routes = ", ".join(f"{k}: {v}" for k, v in load.get("routes", {}).items())
        lines += [
            "",
            f"Machine: {state} ({counted}; {load['threads']} threads on {load['cores']} cores: "
            f"{load['reason']}). GEMM rate first -> last: {first_last}. cpu ms = process CPU "
            "time per call (median), the cross-check that other processes distort least.",
        ]
        if routes:
            lines += ["", f"clearformer's own kernels: {routes}."]
    sections = [s for s in TITLES if any(r["section"] == s for r in results.rows)]
    for section in sections:
        rows = [r for r in results.rows if r["section"] == section]
        long = section == "long"
        lines += ["", f"## {TITLES[section]}", ""]
        header = "| size | workload | implementation | tokens/s | best | ms | cpu ms | × torch.nn "
        header += "| MFU |"
        rule = "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        if long:
            header += " × SDPA speed | peak extra MB | memory × SDPA |"
            rule += " ---: | ---: | ---: |"
        lines += [header, rule]
        for r in rows:
            cells = [
                r["size"],
                r["workload"],
                r["impl"],
                f"{r['tokens_per_s']:,.0f}",
                f"{r['real_tokens'] / min(r['times']):,.0f}",
                f"{r['seconds'] * 1e3:,.1f}",
                _fmt(r.get("cpu_ms"), ",.1f"),
                _fmt(r.get("vs_torch_nn"), ".2f"),
                _fmt(r.get("mfu"), ".0%"),
            ]
            if long:
                cells += [
                    _fmt(r.get("vs_sdpa"), ".2f"),
                    _fmt(r.get("peak_extra_mb"), ",.0f"),
                    _fmt(r.get("memory_vs_sdpa"), ".2f"),
                ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_json(results: Results) -> str:
    return json.dumps(asdict(results), indent=2)


def chart(results: Results, path) -> bool:
    """A PNG bar chart of tokens/s per workload into ``path`` (a path or a binary file);
    False when matplotlib is not installed or there is nothing to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups: dict[str, list[dict]] = {}
    for r in results.rows:
        if r["section"] in ("inference", "training", "long"):
            groups.setdefault(f"{r['section']} · {r['size']} · {r['workload']}", []).append(r)
    if not groups:
        return False
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 2.2 * len(groups) + 0.5), squeeze=False)
    for ax, (title, rows) in zip(axes[:, 0], groups.items(), strict=True):
        names = [r["impl"] for r in rows]
        values = [r["tokens_per_s"] for r in rows]
        colours = ["tab:blue" if r["family"] == "clearformer" else "tab:gray" for r in rows]
        ax.barh(names, values, color=colours)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        ax.set_xlabel("real tokens / s", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return True


def write(results: Results, out_dir: Path, stem: str = "bench", with_chart: bool = True) -> list:
    """Write ``<stem>.md``, ``<stem>.json`` and (optionally) ``<stem>.png``; return the paths.

    Each file is written atomically (:func:`clearformer.io.atomic_write`): an interrupted run
    leaves the previous complete version of each file, never half of one.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path, text in ((out_dir / f"{stem}.md", markdown(results)),
                       (out_dir / f"{stem}.json", to_json(results))):  # fmt: skip
        with atomic_write(path) as handle:
            handle.write(text)
        written.append(path)
    image = io.BytesIO()
    if with_chart and chart(results, image):  # drawn in memory: no chart, no file touched
        png = out_dir / f"{stem}.png"
        with atomic_write(png, "wb") as handle:
            handle.write(image.getvalue())
        written.append(png)
    return written
