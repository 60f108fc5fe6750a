"""Sharded encode throughput: one process on N threads against N processes on one thread each.

The same corpus goes through ``clearformer encode --input CORPUS --output DIR`` twice per
repeat, in alternating order so that drift and bursts of load hit both alike:

``1 process x N threads``    ``OMP_NUM_THREADS=N clearformer encode ...``: one process, its
                             batches run by ``encode``'s workers (two side by side from two
                             threads up).
``N processes x 1 thread``   ``OMP_NUM_THREADS=1 torchrun --nproc_per_node=N -m clearformer
                             encode ...``: N ranks, each on one thread, each writing its shard.

Each command runs whole, as a user would run it: interpreter start, ``import torch``, the model's
load and the manifest included ("wall"). Beside it, the encode phase alone ("encode"): the
longest rank's own time for its chunks, as its log line says (``-v``), to a tenth of a second.
Every run starts from an empty directory. The two outputs are compared row by row: the
figures of a run whose rows differ beyond float rounding mean nothing.

The JSON result names the machine (CPU model, flags, threads PyTorch's kernels use) and the
load average before and after, with the verdict of :mod:`clearformer.bench.load`: a figure
taken while other processes ran is marked LOADED. Do not quote figures from a loaded run.

Run: ``python benchmarks/shard_encode.py --texts 20000 [--processes 2] [--repeats 3]
[--chunk-rows 4096] [--out benchmarks/results/shard-encode.json]``, or ``--corpus FILE`` (one
text per line) in place of ``--texts``; ``--model DIR`` for another checkpoint than the
bundled all-MiniLM-L6-v2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from clearformer.bench.load import judge, load_average  # noqa: E402
from clearformer.cpu import cpu_description  # noqa: E402

RANK_LINE = re.compile(r"rank \d+/\d+: rows \d+-\d+, \d+ chunks encoded, \d+ reused, in ([\d.]+)s")


def environment(threads: int) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
    }


def command(processes: int, corpus: Path, out: Path, args) -> list[str]:
    """The command line of one run: one process, or ``processes`` ranks under torchrun."""
    encode = ["encode", "--input", str(corpus), "--output", str(out)]
    encode += ["--chunk-rows", str(args.chunk_rows)]
    if args.model:
        encode += ["--model", args.model]
    if processes == 1:
        return [sys.executable, "-m", "clearformer", "-v", *encode]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={processes}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        "-m",
        "clearformer",
        "-v",
        *encode,
    ]


def run_once(processes: int, threads: int, corpus: Path, out: Path, args) -> dict:
    """One whole command: its wall time and the longest rank's encode time."""
    started = time.perf_counter()
    done = subprocess.run(
        command(processes, corpus, out, args),
        env=environment(threads),
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{processes} process(es) failed:\n{done.stderr[-3000:]}")
    encode = [float(t) for t in RANK_LINE.findall(done.stderr)]
    if len(encode) != processes:
        raise SystemExit(f"expected {processes} rank line(s) in the log, got:\n{done.stderr}")
    return {"wall_s": wall, "encode_s": max(encode)}


def read_corpus(args) -> tuple[Path, int, tempfile.TemporaryDirectory | None]:
    if args.corpus:
        path = Path(args.corpus)
        rows = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        return path, rows, None
    from encode_throughput import make_corpus

    keep = tempfile.TemporaryDirectory(prefix="shard-encode-corpus-")
    path = Path(keep.name) / "corpus.txt"
    path.write_text("\n".join(make_corpus(args.texts, "sentences")) + "\n", encoding="utf-8")
    return path, args.texts, keep


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="text file, one text per line")
    source.add_argument(
        "--texts",
        type=int,
        help="N synthetic sentence-like texts from the bundled model's vocabulary (as "
        "encode_throughput.py's 'sentences' corpus)",
    )
    parser.add_argument("--model", help="checkpoint directory (default: the bundled MiniLM)")
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="N: one process on N threads against N processes on one thread (default 2)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument(
        "--chunk-rows", type=int, default=4096, help="encode's --chunk-rows (default 4096)"
    )
    parser.add_argument("--out", help="write the JSON result here (default: print only)")
    args = parser.parse_args()
    if args.processes < 2 or args.repeats < 1 or args.chunk_rows < 1:
        parser.error("--processes must be >= 2, --repeats and --chunk-rows >= 1")

    from clearformer.sharded.shards import read_shards

    corpus, rows, keep = read_corpus(args)
    n = args.processes
    configs = {f"1 process x {n} threads": (1, n), f"{n} processes x 1 thread": (n, 1)}
    times: dict[str, list[dict]] = {name: [] for name in configs}
    outputs: dict[str, np.ndarray] = {}
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="shard-encode-") as scratch:
        for repeat in range(args.repeats):
            order = list(configs) if repeat % 2 == 0 else list(reversed(configs))
            for name in order:
                processes, threads = configs[name]
                out = Path(scratch) / f"{repeat}-{processes}"
                times[name].append(run_once(processes, threads, corpus, out, args))
                if name not in outputs:
                    outputs[name] = read_shards(out)
    after = load_average()
    if keep is not None:
        keep.cleanup()

    one, many = (outputs[name] for name in configs)
    load = judge(before, after, threads=n)
    summary = {}
    for name, runs in times.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        encode = statistics.median(r["encode_s"] for r in runs)
        summary[name] = {
            "runs": runs,
            "median_wall_s": wall,
            "median_encode_s": encode,
            "rows_per_s_wall": rows / wall,
            "rows_per_s_encode": rows / encode if encode > 0 else None,
        }
    first, second = (summary[name] for name in configs)
    result = {
        "benchmark": "sharded encode: 1 process x N threads against N processes x 1 thread",
        "corpus": {"file": str(args.corpus) if args.corpus else f"synthetic {rows}", "rows": rows},
        "model": args.model or "bundled all-MiniLM-L6-v2",
        "processes": n,
        "chunk_rows": args.chunk_rows,
        "repeats": args.repeats,
        "results": summary,
        # Above 1: the processes were faster.
        "speedup_wall": first["median_wall_s"] / second["median_wall_s"],
        "speedup_encode": (
            first["median_encode_s"] / second["median_encode_s"]
            if second["median_encode_s"] > 0
            else None
        ),
        "rows": {
            "same_bits": bool(np.array_equal(one, many)),
            "max_abs_difference": float(np.abs(one - many).max()) if len(one) else 0.0,
        },
        "cpu": cpu_description(),
        "load": load.to_dict() | {"summary": load.describe()},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
