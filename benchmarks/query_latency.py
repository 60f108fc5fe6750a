"""A lone query's latency in each precision: one sentence per forward pass, as a search box or
a server with one client sends them.

One text's forward pass has a few rows, so it reads every weight once for little arithmetic:
on a large model it is bound by how many bytes of weights there are, which is where the
precisions differ most (float32 4 bytes per weight, bf16 2, int8 1, int8-blocks 1.125).

For each precision the model at ``--model`` is loaded in that precision alone
(``TextEncoder.from_pretrained(dir, precision=...)``, as ``serve --precision`` loads it), warmed
up, and each of ``--queries`` BBC sentences is embedded alone (``embed_batch``, as the server
calls it), at 1 thread and at every thread; the median and 90th percentile in milliseconds.

Run: ``python benchmarks/query_latency.py --model DIR [--queries 60]
[--precisions float32,bf16,int8,int8-blocks] [--out benchmarks/results/query-latency]``; the
Qwen3-Embedding-0.6B shape of ``llm_embedders.py`` is
``~/.cache/clearformer-bench/llm-embedders/qwen3-full``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import torch

from clearformer.io import write_text_atomically

sys.path.insert(0, str(Path(__file__).resolve().parent))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the bundled MiniLM")
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--precisions", default="float32,bf16,int8,int8-blocks")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.md")
    args = parser.parse_args(argv)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions:
        parser.error(f"--precisions: expected a comma-separated list, got {args.precisions!r}")

    from clearformer import TextEncoder
    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_description
    from llm_embedders import sentences

    threads = os.cpu_count() or 1
    meter = LoadMeter(threads=threads).start()
    texts = sentences(args.queries)
    rows = []
    for precision in precisions:
        encoder = TextEncoder.from_pretrained(args.model, precision=precision)
        encodings = encoder.tokenizer.encode(texts)
        for count in sorted({1, threads}):
            torch.set_num_threads(count)
            for encoding in encodings[:5]:  # warm-up (and int8's or bf16's first-call work)
                encoder.embed_batch([encoding], normalize=True)
            times = []
            for encoding in encodings:
                start = time.perf_counter()
                encoder.embed_batch([encoding], normalize=True)
                times.append((time.perf_counter() - start) * 1000)
            rows.append((precision, count, percentile(times, 0.5), percentile(times, 0.9)))
            print(f"{precision:12s} {count} thread(s): p50 {rows[-1][2]:.1f} ms, "
                  f"p90 {rows[-1][3]:.1f} ms", flush=True)  # fmt: skip
        del encoder
        gc.collect()
    torch.set_num_threads(threads)
    lengths = sorted(len(e.ids) for e in encodings)
    name = "bundled all-MiniLM-L6-v2" if args.model is None else args.model.name
    lines = [
        f"# A lone query's latency by precision: {name}",
        "",
        f"{len(texts)} BBC sentences embedded one at a time ({lengths[0]}-{lengths[-1]} tokens, "
        f"median {lengths[len(lengths) // 2]}). {cpu_description()['summary']}, "
        f"torch {torch.__version__}.",
        f"Machine: {meter.record().describe()}",
        f"Command: `python benchmarks/query_latency.py"
        f"{'' if args.model is None else f' --model {args.model}'} "
        f"--queries {args.queries} --precisions {args.precisions}`",
        "",
        "| precision | threads | p50 ms | p90 ms |",
        "| --- | ---: | ---: | ---: |",
        *(f"| {p} | {c} | {p50:.1f} | {p90:.1f} |" for p, c, p50, p90 in rows),
    ]
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        write_text_atomically(args.out.with_suffix(".md"), text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
