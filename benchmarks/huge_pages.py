"""Whole float32 ``encode`` calls with glibc's malloc asking for transparent huge pages
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``) against without, in alternating processes: a
process-wide setting, read once at start-up, so the two sides cannot share one process.

Each child process loads the bundled encoder, encodes the benchmark's corpus
(:func:`encode_throughput.make_corpus`) once to warm up and then ``--calls`` times, and
reports its best texts/s and how much of its memory the kernel backed with huge pages
(``AnonHugePages``). The pairs alternate which side runs first. Huge pages change where the
memory lies, not the arithmetic: the embeddings are compared to the bit. Results in
docs/performance.md (Intel Xeon, "Not met here").

Run: ``python benchmarks/huge_pages.py [--corpus sentences] [--texts 1000] [--pairs 4]
[--calls 3] [--workers 2] [--threads 2]``. Needs glibc 2.35 or later and transparent huge
pages set to ``madvise`` or ``always`` (``/sys/kernel/mm/transparent_hugepage/enabled``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

from encode_throughput import CORPORA, make_corpus

TUNABLE = "glibc.malloc.hugetlb=1"


def huge_kib() -> int:
    """This process's anonymous memory backed by transparent huge pages, in KiB."""
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def child(args: argparse.Namespace) -> None:
    import torch

    from clearformer import TextEncoder
    from clearformer.interop.hf import bundled_model_dir
    from clearformer.runtime import retain_freed_memory

    torch.set_num_threads(args.threads)
    retain_freed_memory()
    encoder = TextEncoder.from_pretrained(bundled_model_dir())
    texts = make_corpus(args.texts, args.corpus)
    vectors = encoder.encode(texts, workers=args.workers, progress=False)  # warm-up
    best = float("inf")
    for _ in range(args.calls):
        start = time.perf_counter()
        encoder.encode(texts, workers=args.workers, progress=False)
        best = min(best, time.perf_counter() - start)
    digest = hashlib.sha256(vectors.tobytes()).hexdigest()[:16]
    print(json.dumps({"texts_per_s": len(texts) / best, "huge_kib": huge_kib(), "sha": digest}))


def run_child(huge: bool, argv: list[str]) -> dict:
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if huge:
        env["GLIBC_TUNABLES"] = TUNABLE
    done = subprocess.run(
        [sys.executable, __file__, "--child", *argv], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"child process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="sentences", choices=CORPORA)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--calls", type=int, default=3, help="timed calls per process")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch's intra-op threads")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    argv = [
        f"--corpus={args.corpus}",
        f"--texts={args.texts}",
        f"--calls={args.calls}",
        f"--workers={args.workers}",
        f"--threads={args.threads}",
    ]
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{args.corpus}, {args.texts} texts, workers {args.workers}, threads {args.threads}:")
    results: dict[bool, list[dict]] = {True: [], False: []}
    for pair in range(args.pairs):
        for huge in (True, False) if pair % 2 == 0 else (False, True):
            result = run_child(huge, argv)
            results[huge].append(result)
            side = "huge pages" if huge else "plain     "
            print(
                f"  {side} {result['texts_per_s']:8.1f} texts/s, "
                f"{result['huge_kib'] / 1024:6.0f} MiB in huge pages"
            )
    best = {huge: max(r["texts_per_s"] for r in rs) for huge, rs in results.items()}
    ratios = [
        h["texts_per_s"] / p["texts_per_s"]
        for h, p in zip(results[True], results[False], strict=True)
    ]
    print(f"  speed-up with huge pages: {best[True] / best[False]:.3f}x (best against best)")
    print("  each pair: " + ", ".join(f"{r:.2f}" for r in ratios))
    same = len({r["sha"] for rs in results.values() for r in rs}) == 1
    print(f"  embeddings equal to the bit across all processes: {same}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
