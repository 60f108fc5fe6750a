"""Whole float32 ``encode`` calls with the fused linear layers on oneDNN's inner product (as
clearformer runs them) against MKL's packed sgemm, side by side in one process: a measured
alternative, not a route of the package.

The MKL route replaces :func:`clearformer.fast.fused_linear.linear` where its callers look it up
(the attention's and feed-forward's modules) with ``torch.ops.mkl._mkl_linear`` on a weight
packed once by ``torch.ops.mkl._mkl_reorder_linear_weight``: the bias inside the call, the GELU
and the residual add as passes of their own (MKL has no post-operations). Both routes run on
the benchmark's corpus (:func:`encode_throughput.make_corpus`), taking turns round by round
(the order alternates), best of ``--rounds``; the min cosine between their embeddings and the
load average before and after are printed. Results in docs/performance.md (Intel Xeon,
"Not met here").

Run: ``python benchmarks/mkl_linear_route.py [--corpus sentences] [--texts 1000] [--rounds 4]
[--workers 1] [--threads 1]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from encode_throughput import CORPORA, make_corpus
from route_comparison import compare_routes


def mkl_linear_for(original):
    """A stand-in for ``fused_linear.linear`` that runs plain ``nn.Linear`` layers through MKL's
    packed sgemm (a copy packed once per layer) and everything else as ``original`` does."""
    packed: dict[int, torch.Tensor] = {}

    def linear(x, layer, *, fused, activation=None, residual=None):
        if not fused or type(layer) is not torch.nn.Linear or x.numel() == 0:
            return original(x, layer, fused=fused, activation=activation, residual=residual)
        rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (M, in)
        if id(layer) not in packed:
            packed[id(layer)] = torch.ops.mkl._mkl_reorder_linear_weight(layer.weight, 4096)
        weight = packed[id(layer)]
        if residual is not None:
            out = torch.ops.mkl._mkl_linear(rows, weight, layer.weight, None, rows.shape[0])
            out += layer.bias
            out += residual.reshape(out.shape)  # (..., out) -> (M, out)
        else:
            out = torch.ops.mkl._mkl_linear(rows, weight, layer.weight, layer.bias, rows.shape[0])
            if activation is not None:
                if activation != "gelu":
                    raise ValueError(f"this comparison runs exact GELU only, got {activation!r}")
                out = F.gelu(out)
        return out.view(*x.shape[:-1], out.shape[-1])  # (M, out) -> (..., out)

    return linear


def main() -> None:
    from clearformer import TextEncoder, fused_linear
    from clearformer.interop.hf import bundled_model_dir
    from clearformer.runtime import retain_freed_memory

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="sentences", choices=CORPORA)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    args = parser.parse_args()
    if not torch.backends.mkl.is_available():
        raise SystemExit("this PyTorch build has no MKL")
    torch.set_num_threads(args.threads)
    retain_freed_memory()
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    encoder = TextEncoder.from_pretrained(bundled_model_dir())
    texts = make_corpus(args.texts, args.corpus)
    original = fused_linear.linear
    callers = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("clearformer") and getattr(module, "linear", None) is original
    ]
    routes = {"oneDNN": original, "MKL packed": mkl_linear_for(original)}

    def encode(route: str) -> tuple[float, np.ndarray]:
        for module in callers:
            module.linear = routes[route]
        try:
            start = time.perf_counter()
            vectors = encoder.encode(texts, workers=args.workers, progress=False)
            return time.perf_counter() - start, vectors
        finally:
            for module in callers:
                module.linear = original

    print(f"{args.corpus}, {args.texts} texts, workers {args.workers}, threads {args.threads}:")
    print(f"  modules whose fused linear was swapped: {[m.__name__ for m in callers]}")
    compare_routes(encode, "MKL packed", "oneDNN", args.rounds)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
