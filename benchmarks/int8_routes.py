"""Whole int8 ``encode`` calls with the products through oneDNN's quantised linear op against
the same calls through ``torch._int_mm``, side by side in one process.

Both routes run the same int8 model with the compiled steps (``fuse_int8=True``) on the
benchmark's corpus (:func:`encode_throughput.make_corpus`), taking turns round by round (the
order alternates), best of ``--rounds``. Each route is warmed up before timing (the compiled
epilogue compiles once per kind of integer sums). The embeddings of the two routes are compared:
equal to the bit where each runs in a process of its own; this script switches routes inside
one process, where the compiled epilogue then holds a variant for each dtype. Load average
recorded before and after.

Run: ``python benchmarks/int8_routes.py [--corpus mixed] [--texts 1000] [--rounds 4]
[--workers N]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from encode_throughput import CORPORA, make_corpus
from route_comparison import compare_routes


def main() -> None:
    from clearformer import TextEncoder
    from clearformer.interop.hf import bundled_model_dir
    from clearformer.quant.int8 import Int8Linear
    from clearformer.quant.onednn import onednn_int8_available
    from clearformer.runtime import retain_freed_memory

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="mixed", choices=CORPORA)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=None, help="default: encode's own")
    args = parser.parse_args()
    if not onednn_int8_available():
        raise SystemExit("oneDNN's quantised linear op does not run here")
    retain_freed_memory()
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    encoder = TextEncoder.from_pretrained(bundled_model_dir())
    texts = make_corpus(args.texts, args.corpus)
    options = dict(workers=args.workers, progress=False, precision="int8", fuse_int8=True)
    layers = [m for m in encoder.int8_model(fused=True).modules() if isinstance(m, Int8Linear)]

    def encode(onednn: bool) -> tuple[float, np.ndarray]:
        for layer in layers:
            layer._use_onednn = onednn
        start = time.perf_counter()
        vectors = encoder.encode(texts, **options)
        return time.perf_counter() - start, vectors

    routes = {"oneDNN op": True, "torch._int_mm": False}
    print(f"{args.corpus}, {args.texts} texts, workers {args.workers or 'default'}:")
    compare_routes(lambda name: encode(routes[name]), "oneDNN op", "torch._int_mm", args.rounds)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
