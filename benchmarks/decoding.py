"""Decoding speed: clearformer's Seq2SeqTransformer.generate against Hugging Face ``generate``
on a BART of the same size, both randomly initialised, with and without a key/value cache.

Both models: post-norm, ReLU, ``--width`` wide, ``--layers`` encoder and decoder layers,
``--vocab`` tokens. Every output is forced to exactly L tokens (the end token is banned until
then: ``min_length`` here, ``min_new_tokens`` there), so both decode the same number of steps.
Workloads: L in ``--lengths`` (32, 64, 128), greedy and beam 4, on ``--batch`` sources of
``--source`` tokens. The two take turns within each round; reported: generated tokens per
second (median of ``--repeats`` rounds), the ratio, and the load average before and after
(a run under load is flagged: other processes distort both, unequally).

Run: ``python benchmarks/decoding.py [--repeats 3] [--out benchmarks/results/decoding]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from clearformer.io import write_text_atomically

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def build(args):
    import transformers

    from clearformer import Seq2SeqConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    ours = Seq2SeqTransformer(
        Seq2SeqConfig(
            src_vocab_size=args.vocab,
            d_model=args.width,
            n_heads=args.heads,
            encoder_layers=args.layers,
            decoder_layers=args.layers,
            dim_mlp=4 * args.width,
            dropout=0.0,
            norm="post",
            activation="relu",
            max_positions=max(*args.lengths, args.source) + 2,
            pad_id=1,
            bos_id=0,
            eos_id=2,
        )
    ).eval()
    config = transformers.BartConfig(
        vocab_size=args.vocab,
        d_model=args.width,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=4 * args.width,
        decoder_ffn_dim=4 * args.width,
        activation_function="relu",
        max_position_embeddings=max(*args.lengths, args.source) + 2,
        dropout=0.0,
        attention_dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        attn_implementation="sdpa",
    )
    theirs = transformers.BartForConditionalGeneration(config).eval()
    return ours, theirs


def run_ours(model, src, mask, length, beams, cache):
    return model.generate(
        src,
        mask,
        max_new_tokens=length,
        min_length=length,
        num_beams=beams,
        early_stopping=True,
        use_cache=cache,
    )


def run_theirs(model, src, mask, length, beams, cache):
    with torch.no_grad():
        return model.generate(
            input_ids=src,
            attention_mask=mask.long(),
            max_new_tokens=length,
            min_new_tokens=length,
            num_beams=beams,
            do_sample=False,
            early_stopping=True,
            use_cache=cache,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--width", type=int, default=256, help="model width D (default %(default)s)"
    )
    parser.add_argument(
        "--heads", type=int, default=4, help="attention heads (default %(default)s)"
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=3,
        help="encoder layers and decoder layers, each (default %(default)s)",
    )
    parser.add_argument(
        "--vocab", type=int, default=8000, help="vocabulary size (default %(default)s)"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=4,
        help="source sequences per generate call (default %(default)s)",
    )
    parser.add_argument(
        "--source", type=int, default=24, help="tokens per source sequence (default %(default)s)"
    )
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[32, 64, 128],
        help="generated lengths L, each forced exactly (default 32 64 128)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds; medians reported (default %(default)s)"
    )
    parser.add_argument(
        "--no-uncached", action="store_true", help="skip the runs without the key/value cache"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="write OUT.json and OUT.md (default: print only)"
    )
    args = parser.parse_args()

    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_description

    torch.set_num_threads(os.cpu_count() or 1)
    meter = LoadMeter(threads=torch.get_num_threads()).start()
    ours, theirs = build(args)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, args.vocab, (args.batch, args.source), generator=g)
    lengths = torch.randint(args.source // 2, args.source + 1, (args.batch,), generator=g)
    lengths[0] = args.source
    mask = torch.arange(args.source)[None] < lengths[:, None]  # (B, S) ragged sources
    src = src.masked_fill(~mask, 1)
    rows = []
    for length in args.lengths:
        for beams in (1, 4):
            for cache in (True, False) if not args.no_uncached else (True,):
                times = {"clearformer": [], "transformers": []}
                run_ours(ours, src, mask, 4, beams, cache)  # warm-up
                run_theirs(theirs, src, mask, 4, beams, cache)
                for _ in range(args.repeats):
                    for name, fn, model in (
                        ("clearformer", run_ours, ours),
                        ("transformers", run_theirs, theirs),
                    ):
                        start = time.perf_counter()
                        fn(model, src, mask, length, beams, cache)
                        times[name].append(time.perf_counter() - start)
                tokens = args.batch * length
                speed = {
                    f"{n}_tokens_per_s": tokens / statistics.median(t) for n, t in times.items()
                }
                row = {
                    "length": length,
                    "beams": beams,
                    "cache": cache,
                    **speed,
                }
                row["ratio"] = row["clearformer_tokens_per_s"] / row["transformers_tokens_per_s"]
                rows.append(row)
                print(
                    f"L={length:4d} beams={beams} cache={str(cache):5s} "
                    f"clearformer {row['clearformer_tokens_per_s']:8.1f} tok/s  "
                    f"transformers {row['transformers_tokens_per_s']:8.1f} tok/s  "
                    f"ratio {row['ratio']:.2f}",
                    flush=True,
                )
    load = meter.record()
    print(load.describe())
    if load.loaded:
        print("WARNING: the machine was loaded; these figures do not reproduce")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
        result["load"] = load.to_dict()
        result["cpu"] = cpu_description()
        write_text_atomically(args.out.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
        lines = [
            "| L | beams | cache | clearformer tok/s | transformers tok/s | ratio |",
            "| ---: | ---: | --- | ---: | ---: | ---: |",
        ]
        for r in rows:
            lines.append(
                f"| {r['length']} | {r['beams']} | {'yes' if r['cache'] else 'no'} | "
                f"{r['clearformer_tokens_per_s']:.1f} | {r['transformers_tokens_per_s']:.1f} | "
                f"{r['ratio']:.2f} |"
            )
        lines.append("")
        lines.append(
            "Machine: "
            + load.describe()
            + (" (LOADED: not a quiet-machine figure)" if load.loaded else "")
        )
        write_text_atomically(args.out.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
