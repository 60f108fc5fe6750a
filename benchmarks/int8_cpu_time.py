"""Load-independent int8 check: one thread, process CPU time, best of 3 rounds, 400 mixed texts.

On a shared machine wall-clock figures swing with other processes' load; CPU time of a
one-thread run does not (docs/int8.md). Run: ``python benchmarks/int8_cpu_time.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from clearformer.runtime import retain_freed_memory

    retain_freed_memory()
    from sentence_transformers import SentenceTransformer

    from clearformer import TextEncoder
    from clearformer.interop.hf import bundled_model_dir
    from encode_throughput import make_corpus

    load_start = os.getloadavg()[0]
    ours = TextEncoder.from_pretrained()
    theirs = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    ours.int8_model(fused=True)
    texts = make_corpus(400, "mixed", seed=0)
    runs = {
        "sentence-transformers": lambda: theirs.encode(texts, normalize_embeddings=True),
        "clearformer float32": lambda: ours.encode(texts, progress=False),
        "clearformer int8": lambda: ours.encode(
            texts, progress=False, precision="int8", fuse_int8=False
        ),
        "clearformer int8 fused": lambda: ours.encode(
            texts, progress=False, precision="int8", fuse_int8=True
        ),
    }
    for run in runs.values():
        run()  # warm-up
    best: dict[str, float] = {}
    for _ in range(3):
        for name, run in runs.items():
            start = time.process_time()
            run()
            best[name] = min(best.get(name, float("inf")), time.process_time() - start)
    reference = best["sentence-transformers"]
    for name, seconds in best.items():
        print(
            f"{name:24s} {seconds:6.2f} s CPU  {len(texts) / seconds:6.1f} texts/CPU-s  "
            f"{reference / seconds:.2f}x sentence-transformers"
        )
    print(f"load average {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
