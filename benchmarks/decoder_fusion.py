"""What the fused linear layers bring to decoding: ``generate`` with the decoder's linear
layers fused (the default in CPU inference) against the same model with them eager, taking
turns in one process.

The model is the one of ``benchmarks/decoding.py`` (width 256, 3 + 3 layers, batch 4, a
24-token source, the key/value cache on). The eager runs replace the decoder's fusion decision
for the duration of the call; the encoder of the source stays fused in both.

Run: ``python benchmarks/decoder_fusion.py [--repeats 5] [--lengths 32 128] [--beams 1 4]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


@contextmanager
def eager_decoder():
    """The decoder's linear layers eager while the block runs."""
    import clearformer.decoder_block as decoder_block
    from clearformer.options import Decision

    real = decoder_block.fusion_decision
    decoder_block.fusion_decision = lambda *a, **k: Decision("eager", "benchmark: eager decoder")
    try:
        yield
    finally:
        decoder_block.fusion_decision = real


def main() -> None:
    import decoding

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    from clearformer.bench.load import judge, load_average

    start = load_average()
    shape = argparse.Namespace(
        vocab=8000, width=256, heads=4, layers=3, lengths=args.lengths, source=24
    )
    ours, _ = decoding.build(shape)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, shape.vocab, (4, shape.source), generator=g)  # (B, S)
    mask = torch.ones_like(src, dtype=torch.bool)
    for length in args.lengths:
        for beams in args.beams:
            decoding.run_ours(ours, src, mask, length, beams, True)  # warm-up
            times: dict[str, list[float]] = {"fused": [], "eager": []}
            for _ in range(args.repeats):
                for name in times:
                    began = time.perf_counter()
                    if name == "eager":
                        with eager_decoder():
                            decoding.run_ours(ours, src, mask, length, beams, True)
                    else:
                        decoding.run_ours(ours, src, mask, length, beams, True)
                    times[name].append(time.perf_counter() - began)
            fused, eager = (statistics.median(times[n]) for n in ("fused", "eager"))
            print(
                f"L {length:4d} beams {beams}: fused {fused * 1e3:7.1f} ms, eager "
                f"{eager * 1e3:7.1f} ms, fused {eager / fused:.2f}x faster"
            )
    print(judge(start, load_average(), torch.get_num_threads()).describe())


if __name__ == "__main__":
    main()
