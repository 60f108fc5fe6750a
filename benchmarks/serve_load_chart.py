"""A chart of ``serve_load.py``'s results: requests/s and p99 latency by concurrent clients,
one column per result file (a precision), one bar per server.

Run: ``python benchmarks/serve_load_chart.py benchmarks/results/serve-load.json
benchmarks/results/serve-load-bf16.json benchmarks/results/serve-load-int8.json --out
benchmarks/results/serve-load.png``. Needs matplotlib. It reads the JSON files only, so the
chart always shows the figures the tables show (each server's median round).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

COLOURS = {"clearformer": "tab:blue", "clearformer-unbatched": "lightsteelblue"}
LABELS = {
    "clearformer": "clearformer serve",
    "clearformer-unbatched": "clearformer, one request at a time",
}
WORKLOAD = "online"  # one sentence per request: the search box's traffic


def chart_png(reports: list[dict]) -> bytes:
    """The PNG: for each report a column of two panels, requests/s and p99 latency (log
    scale), grouped by client count. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(2, len(reports), figsize=(4.2 * len(reports), 6.4), squeeze=False)
    for column, report in enumerate(reports):
        keys = [k for k in report["results"] if k.startswith(f"{WORKLOAD}@")]
        clients = [int(k.split("@")[1]) for k in keys]
        servers = list(report["results"][keys[0]])
        width = 0.8 / len(servers)
        for i, server in enumerate(servers):
            medians = [report["results"][k][server]["median"] for k in keys]
            xs = [c + (i - (len(servers) - 1) / 2) * width for c in range(len(keys))]
            colour = COLOURS.get(server, "tab:orange")
            label = LABELS.get(server, server)
            rates = [m["texts_per_s"] for m in medians]  # one text per request
            bars = axes[0][column].bar(xs, rates, width, color=colour, label=label)
            axes[0][column].bar_label(bars, fmt="%.0f", fontsize=6)
            p99 = [m["latency_ms"]["p99"] for m in medians]
            bars = axes[1][column].bar(xs, p99, width, color=colour, label=label)
            axes[1][column].bar_label(bars, fmt="%.0f", fontsize=6)
        for row, what in enumerate(("requests / s", "p99 latency, ms (log)")):
            ax = axes[row][column]
            names = [f"{c} client{'s' if c > 1 else ''}" for c in clients]
            ax.set_xticks(range(len(keys)), names, fontsize=7)
            ax.set_ylabel(what, fontsize=7)
            ax.tick_params(labelsize=7)
        axes[1][column].set_yscale("log")
        axes[1][column].yaxis.set_major_formatter(ScalarFormatter())
        axes[1][column].yaxis.set_minor_formatter(NullFormatter())
        axes[0][column].set_title(f"{report['precision']}", fontsize=9)
    axes[0][0].legend(fontsize=7, loc="upper left")
    first = reports[0]
    fig.suptitle(
        f"clearformer serve against infinity-emb, one sentence per request, loopback; "
        f"{first['cpu'].split(',')[0]}, {first['cores']} CPUs; {first['versions']}",
        fontsize=8,
    )
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    return png.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="serve_load.py's OUT.json files")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    try:
        reports = [json.loads(path.read_text()) for path in args.results]
    except (OSError, json.JSONDecodeError) as error:
        print(f"error: cannot read the results: {error}", file=sys.stderr)
        return 2
    missing = [str(p) for p, r in zip(args.results, reports, strict=True) if "results" not in r]
    if missing:
        print(f"error: not serve_load.py results: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        png = chart_png(reports)
    except ImportError:
        print("error: the chart needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    from clearformer.io import atomic_write

    with atomic_write(args.out, "wb") as handle:
        handle.write(png)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
