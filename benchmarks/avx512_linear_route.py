"""``TextEncoder.encode`` with clearformer's AVX-512 linear kernel (GELU and post-norm LayerNorm
in the products' epilogue) against the same calls on oneDNN's fused op with a separate
LayerNorm, in one process.

The switch is ``CLEARFORMER_AVX512_LINEAR`` (read on every call), so both sides run the same
model, packing and workers. Each round encodes the whole corpus once per side, the order
alternating; each figure is the side's best round. Also: the products alone, one thread, the
first feed-forward product with its GELU and the attention output with its residual and
LayerNorm (the kernel against oneDNN + ``torch.nn.LayerNorm``), and the largest difference of
each against float64. The load average before and after is recorded.

Run: ``python benchmarks/avx512_linear_route.py [--texts 1000] [--rounds 5]`` on a quiet
machine (about 3 minutes).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

SWITCH = "CLEARFORMER_AVX512_LINEAR"


def products_alone(rounds: int) -> None:
    """One thread, MiniLM's shapes, M = 4,000 rows: kernel vs oneDNN on the two fused calls."""
    import torch
    from torch import nn

    from clearformer.fast.fused_linear import linear
    from clearformer.fast.packed_weights import PackedWeights, use_packed_weights

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    M, D, F = 4000, 384, 1536
    cases = {
        "feed-forward in + GELU": (nn.Linear(D, F), torch.randn(M, D), {"activation": "gelu"}),
        "attention out + residual + LayerNorm": (
            nn.Linear(D, D),
            torch.randn(M, D),
            {"residual": torch.randn(M, D), "norm": nn.LayerNorm(D)},
        ),
        "feed-forward out + residual + LayerNorm": (
            nn.Linear(F, D),
            torch.randn(M, F),
            {"residual": torch.randn(M, D), "norm": nn.LayerNorm(D)},
        ),
    }
    packing = PackedWeights()
    with torch.inference_mode(), use_packed_weights(packing):
        for name, (layer, x, extra) in cases.items():
            reference = _float64(layer, x, **extra)
            best, error = {}, {}
            for setting in ("on", "off"):
                os.environ[SWITCH] = setting
                out = linear(x, layer, fused=True, **extra)
                error[setting] = (out.double() - reference).abs().max().item()
                best[setting] = float("inf")
            for round_ in range(rounds * 2):
                for setting in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
                    os.environ[SWITCH] = setting
                    start = time.perf_counter()
                    linear(x, layer, fused=True, **extra)
                    best[setting] = min(best[setting], time.perf_counter() - start)
            flops = 2.0 * M * layer.in_features * layer.out_features
            print(
                f"{name:>40}: kernel {flops / best['on'] / 1e9:6.1f} GFLOP/s, oneDNN "
                f"{flops / best['off'] / 1e9:6.1f} ({best['off'] / best['on']:.3f}x); largest "
                f"difference to float64: kernel {error['on']:.1e}, oneDNN {error['off']:.1e}"
            )
    torch.set_num_threads(threads)
    os.environ.pop(SWITCH, None)


def _float64(layer, x, activation=None, residual=None, norm=None):
    import torch.nn.functional as F

    out = x.double() @ layer.weight.double().t() + layer.bias.double()
    if activation == "gelu":
        out = F.gelu(out)
    if residual is not None:
        out = out + residual.double()
    if norm is not None:
        out = F.layer_norm(
            out, norm.normalized_shape, norm.weight.double(), norm.bias.double(), norm.eps
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from clearformer.bench.load import judge, load_average

    before = load_average()
    from clearformer.runtime import retain_freed_memory

    retain_freed_memory()
    import numpy as np
    import torch

    from clearformer.interop.hf import bundled_model_dir
    from clearformer.fast import avx512
    from clearformer.text import TextEncoder
    from encode_throughput import make_corpus

    decision = avx512.load(build=True)
    if decision.choice != "loaded":
        raise SystemExit(f"the AVX-512 library is not available here: {decision.reason}")
    products_alone(args.rounds)
    encoder = TextEncoder.from_pretrained(bundled_model_dir())
    for kind in ("sentences", "mixed"):
        texts = make_corpus(args.texts, kind)
        best, vectors = {}, {}
        for setting in ("on", "off"):  # warm-up: packing, the kernels' first calls
            os.environ[SWITCH] = setting
            encoder.encode(texts, progress=False)
            best[setting] = float("inf")
        for round_ in range(args.rounds):
            for setting in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
                os.environ[SWITCH] = setting
                start = time.perf_counter()
                vectors[setting] = encoder.encode(texts, progress=False)
                best[setting] = min(best[setting], time.perf_counter() - start)
        cosine = (vectors["on"] * vectors["off"]).sum(axis=1)
        print(
            f"encode, {kind}: kernel {best['on']:.3f} s, oneDNN + LayerNorm {best['off']:.3f} s, "
            f"{best['off'] / best['on']:.3f}x; min cosine between them {np.min(cosine):.7f}"
        )
    os.environ.pop(SWITCH, None)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(judge(before, load_average(), threads=torch.get_num_threads()).describe())


if __name__ == "__main__":
    main()
