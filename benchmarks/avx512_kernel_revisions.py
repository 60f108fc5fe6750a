"""The AVX-512 attention kernel of this checkout against the same kernel at another git
revision, in one process: by sequence length, and inside whole ``encode`` calls.

The older source is read out of git (``git show REV:src/clearformer/kernels/...``), its
operator library renamed so that both load side by side, and built into a scratch directory.
Then:

- for each length, about 4,096 tokens of sequences of that one length (12 heads of 32), the
  two kernels called in turns, best of ``--repeats`` each (GFLOP/s counts the two products);
  and whether their outputs are equal to the bit;
- ``encode`` of ``--texts`` texts of each corpus (``encode_throughput.make_corpus``), one
  worker of one thread, the two kernels in alternating rounds: the whole call's best time, and
  the seconds spent inside the attention kernel summed over the rounds, which a change of the
  kernel moves far more than the noise of a whole call does.

Run: ``python benchmarks/avx512_kernel_revisions.py --rev 03559fd`` on a quiet machine (the
load record comes with the report).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = "src/clearformer/fast/avx512_attention.cpp"
LENGTHS = (8, 16, 24, 32, 48, 64, 100, 128, 192, 256)


def build_revision(rev: str, scratch: Path) -> str:
    """Build the kernel source at ``rev`` as library ``clearformer_avx512_base``; returns the
    namespace under ``torch.ops``."""
    import torch
    from torch.utils import cpp_extension

    from clearformer.fast import avx512

    text = subprocess.run(
        ["git", "show", f"{rev}:{SOURCE}"],
        cwd=HERE.parent,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for macro in ("TORCH_LIBRARY(", "TORCH_LIBRARY_IMPL("):
        text = text.replace(f"{macro}clearformer_avx512,", f"{macro}clearformer_avx512_base,")
    source = scratch / "base.cpp"
    source.write_text(text)
    library = scratch / "base.so"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = ["g++", *avx512.COMPILE_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    command += [f"-I{path}" for path in cpp_extension.include_paths()] + [str(source)]
    command += [f"-L{path}" for path in cpp_extension.library_paths()]
    command += ["-lc10", "-ltorch_cpu", "-ltorch", "-o", str(library)]
    subprocess.run(command, check=True, capture_output=True)
    torch.ops.load_library(str(library))
    return "clearformer_avx512_base"


def by_length(base, head, repeats: int) -> list[tuple[int, float, float, bool]]:
    import torch

    H, Dh = 12, 32
    rows = []
    for T in LENGTHS:
        B = max(1, 4096 // T)
        N = B * T
        q, k, v = torch.randn(N, 3, H, Dh).unbind(1)  # (N, H, Dh) views, as attention gets
        cu = torch.arange(0, N + 1, T, dtype=torch.int64)
        rows_in = (q, k, v, cu, Dh**-0.5)
        calls = {
            "base": lambda a=rows_in: base.varlen_attention(*a),
            "head": lambda a=rows_in: head.varlen_attention(*a),
        }
        same = torch.equal(calls["base"](), calls["head"]())
        best = {name: float("inf") for name in calls}
        for _ in range(repeats):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                best[name] = min(best[name], time.perf_counter() - start)
        giga = 4.0 * B * H * T * T * Dh / 1e9
        rows.append((T, giga / best["base"], giga / best["head"], same))
    return rows


def in_encode(base, head, corpus: str, texts: int, rounds: int) -> dict:
    import numpy as np

    from clearformer import TextEncoder
    from clearformer.fast import avx512
    from encode_throughput import make_corpus

    original = (avx512.attention, avx512.padded_attention)
    inside = {"base": 0.0, "head": 0.0}

    def timed(name, op):
        def call(*args):
            start = time.perf_counter()
            out = op(*args)
            inside[name] += time.perf_counter() - start
            return out

        return call

    routes = {
        name: (timed(name, lib.varlen_attention), timed(name, lib.padded_attention))
        for name, lib in (("base", base), ("head", head))
    }
    encoder = TextEncoder.from_pretrained()
    corpus_texts = make_corpus(texts, corpus)
    encoder.encode(corpus_texts[:64], progress=False, workers=1)

    def encode(name):
        avx512.attention, avx512.padded_attention = routes[name]
        try:
            start = time.perf_counter()
            vectors = encoder.encode(corpus_texts, progress=False, workers=1)
            return time.perf_counter() - start, vectors
        finally:
            avx512.attention, avx512.padded_attention = original

    vectors = {name: encode(name)[1] for name in routes}
    inside = {"base": 0.0, "head": 0.0}  # the warm-up calls are not counted
    best = {name: float("inf") for name in routes}
    for r in range(rounds):
        for name in ("base", "head") if r % 2 == 0 else ("head", "base"):
            best[name] = min(best[name], encode(name)[0])
    return {
        "corpus": corpus,
        "best_s": best,
        "attention_s": dict(inside),
        "equal": bool(np.array_equal(vectors["base"], vectors["head"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the git revision to compare against")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--texts", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    import torch

    from clearformer.bench.load import judge, load_average
    from clearformer.fast import avx512

    before = load_average()
    torch.set_num_threads(1)
    loaded = avx512.load(build=True)
    if loaded.choice != "loaded":
        parser.error(f"the AVX-512 kernel cannot run here: {loaded.reason}")
    sys.path.insert(0, str(HERE))
    with tempfile.TemporaryDirectory(prefix="avx512-base-") as scratch:
        base = getattr(torch.ops, build_revision(args.rev, Path(scratch)))
        head = torch.ops.clearformer_avx512
        with torch.inference_mode():
            rows = by_length(base, head, args.repeats)
        runs = [in_encode(base, head, c, args.texts, args.rounds) for c in ("sentences", "mixed")]
    print(f"kernel at {args.rev} (base) against this checkout (head), 1 thread, 12 heads of 32")
    print("| tokens per sequence | " + " | ".join(str(r[0]) for r in rows) + " |")
    print("| --- |" + " ---: |" * len(rows))
    print("| base, GFLOP/s | " + " | ".join(f"{r[1]:.1f}" for r in rows) + " |")
    print("| head, GFLOP/s | " + " | ".join(f"{r[2]:.1f}" for r in rows) + " |")
    print("| speed-up | " + " | ".join(f"{r[2] / r[1]:.2f}x" for r in rows) + " |")
    print("| equal to the bit | " + " | ".join("yes" if r[3] else "NO" for r in rows) + " |")
    for run in runs:
        best, inside = run["best_s"], run["attention_s"]
        print(
            f"encode, {run['corpus']}, {args.texts} texts, one worker, best of {args.rounds}: "
            f"base {best['base']:.3f} s, head {best['head']:.3f} s "
            f"({best['base'] / best['head']:.3f}x); inside attention over the rounds "
            f"{inside['base']:.3f} s against {inside['head']:.3f} s "
            f"({inside['base'] / inside['head']:.2f}x); embeddings equal to the bit: "
            f"{'yes' if run['equal'] else 'NO'}"
        )
    print(judge(before, load_average(), threads=1).describe())


if __name__ == "__main__":
    main()
