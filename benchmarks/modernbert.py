"""ModernBERT on clearformer against transformers' ModernBertModel (sdpa), side by side.

One random ModernBERT with base widths (768 wide, 12 heads, feed-forward 1152, local window
128, every third layer global; ``--layers`` of them, 6 by default so that a run fits a CPU),
written by transformers and loaded by clearformer, so both run the very same weights. In one
process, under the same allocator setting, the two take turns on each workload:

``ragged``  a batch of ``--batch`` sequences with lengths uniform in [16, 512];
``long``    one sequence of each ``--long`` length (2048 and 8192 by default).

Reported: real tokens per second (median of ``--repeats``), the ratio, the largest difference
of the outputs at real positions, and, for the long sequences, the peak extra memory of one
forward measured in a fresh process per implementation.

Run: ``python benchmarks/modernbert.py [--layers 6] [--repeats 3]
[--out benchmarks/results/modernbert]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

WIDTHS = dict(
    hidden_size=768,
    intermediate_size=1152,
    num_attention_heads=12,
    local_attention=128,
    global_attn_every_n_layers=3,
    max_position_embeddings=8192,
    vocab_size=50368,
)


def write_checkpoint(directory: Path, layers: int) -> None:
    import transformers

    torch.manual_seed(0)
    config = transformers.ModernBertConfig(num_hidden_layers=layers, **WIDTHS)
    transformers.ModernBertModel(config).save_pretrained(directory)
    vocab = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"] + [f"w{i}" for i in range(WIDTHS["vocab_size"])]
    (directory / "vocab.txt").write_text("\n".join(vocab[: WIDTHS["vocab_size"]]))


def load_both(directory: Path):
    import transformers

    from clearformer.interop.hf.loading import load_model

    ours = load_model(directory).model.eval()
    theirs = transformers.ModernBertModel.from_pretrained(
        directory, attn_implementation="sdpa"
    ).eval()
    return ours, theirs


def batch(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    ids = torch.randint(10, WIDTHS["vocab_size"], (len(lengths), T)).masked_fill(~mask, 0)
    return ids, mask


def seconds(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


_MEMORY_PROBE = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[4])
from modernbert import batch, load_both
from clearformer.bench.memory import _high_water_bytes, _reset_high_water, _rss_bytes
ours, theirs = load_both(__import__("pathlib").Path(sys.argv[1]))
model = ours if sys.argv[2] == "clearformer" else theirs
ids, mask = batch([int(sys.argv[3])])
with torch.inference_mode():
    _reset_high_water()
    before = _rss_bytes()
    if sys.argv[2] == "clearformer":
        model(ids, mask)
    else:
        model(input_ids=ids, attention_mask=mask.long())
print(json.dumps({"peak_extra_bytes": max(0, _high_water_bytes() - before)}))
"""


def peak_memory(directory: Path, impl: str, length: int) -> int:
    here = str(Path(__file__).resolve().parent)
    run = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, str(directory), impl, str(length), here],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--layers", type=int, default=6, help="ModernBERT layers (default %(default)s)"
    )
    parser.add_argument(
        "--batch", type=int, default=16, help="sequences in the ragged batch (default %(default)s)"
    )
    parser.add_argument(
        "--long",
        default="2048,8192",
        help="comma-separated lengths of the single long sequences (default %(default)s)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="turns; medians reported (default %(default)s)"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory probes")
    parser.add_argument(
        "--out", type=Path, default=None, help="write OUT.json and OUT.md (default: print only)"
    )
    args = parser.parse_args()
    from clearformer.bench.load import LoadMeter
    from clearformer.runtime import retain_freed_memory

    meter = LoadMeter(threads=torch.get_num_threads()).start()

    retain_freed_memory()
    torch.manual_seed(1)
    workloads = {
        f"ragged B {args.batch}, T U[16, 512]": [
            int(n) for n in torch.randint(16, 513, (args.batch,))
        ],
        **{f"long T {n}": [n] for n in map(int, args.long.split(","))},
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_checkpoint(directory, args.layers)
        ours, theirs = load_both(directory)
        for name, lengths in workloads.items():
            ids, mask = batch(lengths)
            real = int(mask.sum())
            with torch.inference_mode():
                a = ours(ids, mask)
                b = theirs(input_ids=ids, attention_mask=mask.long()).last_hidden_state
                diff = float((a[mask] - b[mask]).abs().max())
                times = {"clearformer": [], "transformers": []}
                for _ in range(args.repeats):  # take turns: drift hits both alike
                    times["clearformer"].append(seconds(ours, ids, mask))
                    times["transformers"].append(
                        seconds(theirs, input_ids=ids, attention_mask=mask.long())
                    )
            row = {
                "workload": name,
                "real_tokens": real,
                "max_abs_diff": diff,
                **{f"{k}_tok_s": real / statistics.median(v) for k, v in times.items()},
            }
            row["ratio"] = row["clearformer_tok_s"] / row["transformers_tok_s"]
            if name.startswith("long") and not args.no_memory:
                for impl in ("clearformer", "transformers"):
                    row[f"{impl}_peak_mib"] = peak_memory(directory, impl, lengths[0]) / 2**20
            rows.append(row)
            print(json.dumps(row), flush=True)
    load = meter.record()
    lines = [
        f"# ModernBERT: clearformer vs transformers (sdpa), {args.layers} layers at base widths",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32; medians of "
        f"{args.repeats} turns each.",
        "",
        f"Machine: {load.describe()}",
        "",
        "| workload | real tokens | clearformer tok/s | transformers tok/s | ratio | max abs diff "
        "| peak MiB (clearformer / transformers) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        memory = (
            f"{r['clearformer_peak_mib']:.0f} / {r['transformers_peak_mib']:.0f}"
            if "clearformer_peak_mib" in r
            else "-"
        )
        lines.append(
            f"| {r['workload']} | {r['real_tokens']:,} | {r['clearformer_tok_s']:,.0f} | "
            f"{r['transformers_tok_s']:,.0f} | {r['ratio']:.2f}x | {r['max_abs_diff']:.1e} | "
            f"{memory} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        from clearformer.io import atomic_write

        with atomic_write(args.out.with_suffix(".json"), "w") as handle:
            json.dump(
                {"load": load.to_dict(), "rows": rows, "layers": args.layers}, handle, indent=1
            )
        with atomic_write(args.out.with_suffix(".md"), "w") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
