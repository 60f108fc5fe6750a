"""How far apart a lone request's fast and slow answers are before any HTTP: the forward pass
alone, one text per call, on the texts ``serve_load.py`` sends.

``serve_load.py --busy-neighbour 1 --clients 1`` reports the p99 and p50 of a server's answers
to one client while another process keeps a CPU busy. Part of their ratio is the texts: they
are log-normal around 16 words, so the 99th percentile text is about 3.5 times the median
one, and its forward pass is longer by nearly as much. This script measures that part alone:
``TextEncoder.embed_batch`` of each text by itself (the server's call for a lone request),
in this process, at each ``--threads`` count, first with nothing else running and then beside
``--busy-neighbour`` processes that each keep a CPU busy (``while True: pass``). It prints the
p50, p90 and p99 of the call times and p99 / p50 for each.

Run: ``python benchmarks/latency_spread.py [--texts 600] [--threads 1,2] [--busy-neighbour 1]
[--precision bf16] [--by-tokens]``
on a quiet machine (the load average is printed with the figures).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def percentiles(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99)}


def time_each(encoder, encodings: list) -> list[float]:
    """Milliseconds of ``embed_batch`` for each text alone, in order."""
    times = []
    for encoding in encodings:
        started = time.perf_counter()
        encoder.embed_batch([encoding], normalize=True)
        times.append((time.perf_counter() - started) * 1000)
    return times


def by_tokens(encodings: list, times_ms: list[float], band: int = 10) -> str:
    """The median call time of each ``band``-token band, with its text count: a pass grows
    with its tokens, which sets how far the p99 text's time is from the median's."""
    bands: dict[int, list[float]] = {}
    for encoding, ms in zip(encodings, times_ms, strict=True):
        bands.setdefault(len(encoding.ids) // band * band, []).append(ms)
    return ", ".join(
        f"{low}-{low + band - 1}: {sorted(v)[len(v) // 2]:.1f} ms ({len(v)})"
        for low, v in sorted(bands.items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=600, help="texts timed per setting (600)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (1,2)")
    parser.add_argument(
        "--busy-neighbour", type=int, default=1, help="CPUs kept busy in the second pass (1)"
    )
    parser.add_argument(
        "--by-tokens",
        action="store_true",
        help="also print the median call time of each 10-token band of the texts",
    )
    parser.add_argument(
        "--precision",
        default="float32",
        help="the precision the encoder is loaded in, as serve --precision (float32)",
    )
    args = parser.parse_args()
    if args.texts < 100:
        parser.error(f"--texts must be at least 100 for a p99, got {args.texts}")
    counts = [int(t) for t in args.threads.split(",") if t]

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from clearformer import TextEncoder
    from clearformer.cpu import cpu_info
    from serve_load import make_sentences

    encoder = TextEncoder.from_pretrained(precision=args.precision)  # as serve loads it
    encoder.keep_weights_reordered()  # as the server does from its warm-up on
    encodings = encoder.tokenizer.encode(make_sentences(args.texts, 101))
    lengths = sorted(len(e.ids) for e in encodings)
    print(
        f"CPU: {cpu_info().summary()}; load average {os.getloadavg()[0]:.2f}; "
        f"precision {args.precision} (runs {encoder.precision_for(None).choice}); "
        f"{args.texts} texts of {lengths[len(lengths) // 2]} tokens at the median, "
        f"{lengths[int(0.99 * len(lengths))]} at p99"
    )
    print("| threads | neighbours | p50 ms | p90 ms | p99 ms | p99 / p50 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for neighbours in (0, args.busy_neighbour):
        spinners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(neighbours)
        ]
        try:
            time.sleep(0.5)
            for threads in counts:
                torch.set_num_threads(threads)
                time_each(encoder, encodings[:50])  # warm at this count
                times = time_each(encoder, encodings)
                p = percentiles(times)
                print(
                    f"| {threads} | {neighbours} | {p['p50']:.2f} | {p['p90']:.2f} | "
                    f"{p['p99']:.2f} | {p['p99'] / p['p50']:.2f} |"
                )
                if args.by_tokens:
                    print(f"|   by tokens: {by_tokens(encodings, times)} |")
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
