"""A contrastive training step: clearformer's against sentence-transformers' own trainer.

The same model (the bundled all-MiniLM-L6-v2), loss (in-batch negatives plus one hard negative,
cosine x 20), batch (``--batch-size`` rows of anchor, positive, negative), data (BBC News
headline -> article rows mined by ``clearformer mine``, or any rows file) and max length, in
float32 and in bfloat16 autocast:

* sentence-transformers: ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss``,
  ``max_steps`` steps of AdamW, its batch sampler ``NO_DUPLICATES``; the time is the
  trainer's own ``train_runtime`` for the steps after the first (a first run of one step is
  subtracted: loading, the first step's allocations);
* clearformer: ``clearformer.train`` with ``task="contrastive"`` over the same rows, the same
  steps, timed the same way (a run of one step subtracted from a run of 1 + steps).

Tokens per step are the mean row's tokens (anchor, positive and negative after truncation)
times the batch, since each library's sampler draws its own rows.

Reported: tokens per second (real tokens of every text of the batch: anchors, positives and
negatives, after truncation), the ratio, and peak resident memory of each process. With
``--gradcache N``: clearformer at an effective batch of N rows in mini-batches (peak memory
is the point).

Run: ``python benchmarks/contrastive_step.py --rows FILE.jsonl [--steps 8] [--batch-size 32]
[--max-length 128] [--precision fp32 bf16] [--out benchmarks/results/contrastive-step]``.
Each configuration runs in a process of its own, one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clearformer.io import write_text_atomically

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _rows(path: str, count: int) -> list[dict]:
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("negative")]
    return [
        {"anchor": r["anchor"], "positive": r["positive"], "negative": r["negative"][0]}
        for r in rows[:count]
    ]


def _token_count(rows: list[dict], max_length: int) -> int:
    from clearformer.interop.hf import find_checkpoint
    from clearformer.interop.hf.tokenizer import TextTokenizer

    files = find_checkpoint(None)
    tokenizer = TextTokenizer.from_files(files, max_length, 0)
    texts = [t for r in rows for t in (r["anchor"], r["positive"], r["negative"])]
    return sum(len(e.ids) for e in tokenizer.encode(texts))


def run_sentence_transformers(args, rows, steps) -> float:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from sentence_transformers.training_args import BatchSamplers

    from clearformer.interop.hf.bundled import bundled_model_dir

    model = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    model.max_seq_length = args.max_length
    data = Dataset.from_list(rows)
    with tempfile.TemporaryDirectory() as out:
        training = SentenceTransformerTrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=2e-5,
            warmup_steps=0,
            bf16=args.precision == "bf16",
            use_cpu=True,
            batch_sampler=BatchSamplers.NO_DUPLICATES,
            save_strategy="no",
            report_to=[],
            logging_steps=10_000,
            dataloader_drop_last=True,
            disable_tqdm=True,
        )
        trainer = SentenceTransformerTrainer(
            model=model,
            args=training,
            train_dataset=data,
            loss=MultipleNegativesRankingLoss(model),
        )
        return float(trainer.train().metrics["train_runtime"])


def run_clearformer(args, rows, steps) -> float:
    from clearformer.train import TrainConfig, train

    with tempfile.TemporaryDirectory() as out:
        path = Path(out) / "rows.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    {"anchor": r["anchor"], "positive": r["positive"], "negative": [r["negative"]]}
                )
                + "\n"
                for r in rows
            )
        )
        config = TrainConfig(
            task="contrastive",
            train_file=str(path),
            steps=steps,
            batch_size=args.batch_size,
            lr=2e-5,
            warmup_steps=0,
            max_length=args.max_length,
            eval_every=10_000,
            checkpoint_every=10_000,
            log_every=10_000,
            eval_fraction=0.02,
            precision=args.precision,
            mini_batch_size=args.mini_batch_size,
            checkpointing=args.checkpointing,
        )
        start = time.perf_counter()
        train(config, Path(out) / "run")
        return time.perf_counter() - start


def child(args) -> None:
    args.precision = args.precision[0]  # one precision per child process
    rows = _rows(args.rows, args.rows_used)
    run = run_clearformer if args.library == "clearformer" else run_sentence_transformers
    first = run(args, rows, 1)
    whole = run(args, rows, 1 + args.steps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB on Linux
    print(json.dumps({"seconds": whole - first, "first": first, "peak_mib": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"])
    parser.add_argument(
        "--gradcache",
        type=int,
        default=0,
        help="also clearformer at this effective batch in mini-batches",
    )
    parser.add_argument("--mini-batch-size", type=int, default=0)
    parser.add_argument(
        "--checkpointing",
        action="store_true",
        help="clearformer's GradCache run recomputes each layer's activations in backward "
        "(TrainConfig.checkpointing): its memory is one layer's, not the mini-batch's",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--library", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rows-used", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.library:
        child(args)
        return
    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_info

    # Other processes' CPU time around the whole comparison (the children are this run's).
    meter = LoadMeter(threads=os.cpu_count() or 1).start()
    results = []
    for precision in args.precision:
        configs = [
            ("sentence-transformers", args.batch_size, 0),
            ("clearformer", args.batch_size, 0),
        ]
        if args.gradcache:
            configs.append(("clearformer", args.gradcache, args.batch_size))
        for library, batch, mini in configs:
            rows_used = batch * (args.steps + 2)
            command = [
                sys.executable,
                __file__,
                "--rows",
                args.rows,
                "--steps",
                str(args.steps),
                "--batch-size",
                str(batch),
                "--max-length",
                str(args.max_length),
                "--precision",
                precision,
                "--library",
                library.split("-")[0],
                "--rows-used",
                str(rows_used),
                "--mini-batch-size",
                str(mini),
            ]
            if mini and args.checkpointing:
                command.append("--checkpointing")
            if library == "sentence-transformers":
                command[command.index("--library") + 1] = "sentence-transformers"
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(done.stderr[-3000:])
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            # Both samplers draw their own rows: the tokens of a step are counted as the mean
            # row's tokens times the batch.
            used = _rows(args.rows, rows_used)
            tokens = _token_count(used, args.max_length) / len(used) * batch * args.steps
            results.append(
                {
                    "library": library,
                    "precision": precision,
                    "batch": batch,
                    "mini_batch": mini or None,
                    "checkpointing": bool(mini and args.checkpointing),
                    "steps": args.steps,
                    "tokens_per_second": tokens / measured["seconds"],
                    "seconds": measured["seconds"],
                    "peak_mib": measured["peak_mib"],
                }
            )
            print(json.dumps(results[-1]), flush=True)
    load = meter.record()
    report = {
        "load_before": os.getloadavg(),
        "load": load.to_dict(),
        "machine": load.describe(),
        "cpu": cpu_info().summary(),
        "results": results,
    }
    if args.out:
        write_text_atomically(Path(args.out + ".json"), json.dumps(report, indent=1) + "\n")
        write_text_atomically(Path(args.out + ".md"), markdown(report) + "\n")


def markdown(report: dict) -> str:
    lines = [
        f"Machine: {report['machine']}",
        "",
        "| library | precision | batch | tokens/s | ratio | peak MiB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    base = {}
    for r in report["results"]:
        if r["library"] == "sentence-transformers":
            base[r["precision"]] = r["tokens_per_second"]
    for r in report["results"]:
        ratio = r["tokens_per_second"] / base[r["precision"]] if r["precision"] in base else 0
        batch = f"{r['batch']}" + (f" ({r['mini_batch']} a pass)" if r["mini_batch"] else "")
        batch += ", checkpointing" if r.get("checkpointing") else ""
        lines.append(
            f"| {r['library']} | {r['precision']} | {batch} | "
            f"{r['tokens_per_second']:,.0f} | {ratio:.2f}x | {r['peak_mib']:,.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
