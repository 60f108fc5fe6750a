"""Multi-vector (ColBERT) encoding: clearformer's ``MultiVectorEncoder`` against
sentence-transformers' ``MultiVectorEncoder`` on the same directory.

A random-weight directory at ColBERTv2's shape is written by sentence-transformers itself to a
temporary directory (nothing downloaded): BERT-base (12 layers, hidden 768, 12 heads,
intermediate 3072) with the bundled all-MiniLM-L6-v2 WordPiece vocabulary (30,522 pieces, the
size of BERT's), then Dense 768 -> 128 (no bias, identity) on the token embeddings,
MultiVectorMask (the punctuation skiplist on documents), Normalize; ``[Q] `` / ``[D] `` prompts,
query_length 32 with fixed query expansion (the [MASK] tokens not attended), document_length
180. Both libraries encode the same corpus, each as a user calls it: documents with
``encode_document`` (the figure that matters for indexing), queries with ``encode_query``.

The corpus is encode_throughput's (``--corpus sentences``: word counts log-normal around 16;
``mixed``: 3 to 300 words, log-uniform), whole words of the vocabulary with a full stop. Each
library's call takes turns with the other's in one process, ``--repeats`` times; texts/s is the
median. Reported: texts/s per library and side, the ratio, and the largest difference between
the two libraries' token vectors (the same numbers, so the speed is for the same work).

Run: ``python benchmarks/multivector_encode.py [--texts 2000] [--corpus sentences]
[--repeats 3] [--batch-size 32] [--out benchmarks/results/multivector-encode]``; a quick check
that it works: ``--layers 1 --texts 16 --repeats 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import string
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SIDES = ("document", "query")
LIBRARIES = ("clearformer", "sentence-transformers")


def write_model(out: Path, layers: int) -> Path:
    """The ColBERT-shaped directory, written by sentence-transformers (see the docstring)."""
    import transformers
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    from clearformer.interop.hf import bundled_model_dir

    base = out / "base"
    base.mkdir(parents=True)
    bundled = bundled_model_dir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(bundled / name, base / name)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).eval().save_pretrained(str(base))
    expansion = {"strategy": "fixed", "length": 32, "attend": False}
    transformer = Transformer(
        str(base), query_length=32, document_length=180, query_expansion=expansion
    )
    projection = Dense(
        768,
        128,
        bias=False,
        activation_function=torch.nn.Identity(),
        module_input_name="token_embeddings",
    )
    modules = [
        transformer,
        projection,
        MultiVectorMask(skiplist_words=list(string.punctuation)),
        Normalize(module_input_name="token_embeddings"),
    ]
    prompts = {"query": "[Q] ", "document": "[D] "}
    model = MultiVectorEncoder(modules=modules, prompts=prompts, device="cpu")
    directory = out / "colbert"
    model.save(str(directory))
    return directory


def measure(directory: Path, texts: list[str], args) -> dict:
    from sentence_transformers import MultiVectorEncoder as Reference

    from clearformer import MultiVectorEncoder

    ours = MultiVectorEncoder.from_pretrained(directory)
    theirs = Reference(str(directory), device="cpu")
    calls = {
        ("clearformer", side): (
            lambda side=side: getattr(ours, f"encode_{side}")(texts, batch_size=args.batch_size)
        )
        for side in SIDES
    }
    calls.update(
        {
            ("sentence-transformers", side): (
                lambda side=side: getattr(theirs, f"encode_{side}")(
                    texts, batch_size=args.batch_size
                )
            )
            for side in SIDES
        }
    )
    for side in SIDES:  # a short warm-up of every path: first-call allocations, lazy setup
        getattr(ours, f"encode_{side}")(texts[:8])
        getattr(theirs, f"encode_{side}")(texts[:8])
    seconds: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    outputs = {}
    for _ in range(args.repeats):
        for key, call in calls.items():
            started = time.perf_counter()
            outputs[key] = call()
            seconds[key].append(time.perf_counter() - started)
    rows = []
    for side in SIDES:
        ours_out, theirs_out = (
            outputs[("clearformer", side)],
            outputs[("sentence-transformers", side)],
        )
        same_shapes = all(a.shape == b.shape for a, b in zip(ours_out, theirs_out, strict=True))
        difference = (
            max(
                float((a - b.float()).abs().max())
                for a, b in zip(ours_out, theirs_out, strict=True)
                if a.numel()
            )
            if same_shapes
            else None
        )
        rates = {
            library: len(texts) / statistics.median(seconds[(library, side)])
            for library in LIBRARIES
        }
        rows.append(
            {
                "side": side,
                "texts_per_s": rates,
                "ratio": rates["clearformer"] / rates["sentence-transformers"],
                "same_shapes": same_shapes,
                "max_abs_difference": difference,
                "vectors": sum(v.shape[0] for v in ours_out),
            }
        )
    return {"rows": rows}


def report_text(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# Multi-vector encoding: clearformer vs sentence-transformers",
        "",
        f"{env['texts']} texts ({env['corpus']}), ColBERTv2 shape ({env['layers']} layers), "
        f"batch size {env['batch_size']}, {env['threads']} threads, median of {env['repeats']}; "
        f"{env['cpu']['summary']}; {env['load_verdict']}",
        "",
        "| side | clearformer texts/s | sentence-transformers texts/s | ratio | max abs diff |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        rates = row["texts_per_s"]
        diff = row["max_abs_difference"]
        lines.append(
            f"| {row['side']} | {rates['clearformer']:,.1f} | "
            f"{rates['sentence-transformers']:,.1f} | {row['ratio']:.2f}x | "
            f"{'shapes differ' if diff is None else f'{diff:.1e}'} |"
        )
    return "\n".join(lines) + "\n"


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=positive, default=2000, help="texts per call (2000)")
    parser.add_argument(
        "--corpus", choices=("sentences", "mixed"), default="sentences", help="(sentences)"
    )
    parser.add_argument("--repeats", type=positive, default=3, help="turns per call (3)")
    parser.add_argument("--batch-size", type=positive, default=32, help="both libraries (32)")
    parser.add_argument("--layers", type=positive, default=12, help="BERT layers (12)")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_description

    meter = LoadMeter(threads=torch.get_num_threads()).start()
    import sentence_transformers

    from encode_throughput import make_corpus

    texts = make_corpus(args.texts, args.corpus)
    with tempfile.TemporaryDirectory(prefix="multivector-encode-") as tmp:
        directory = write_model(Path(tmp), args.layers)
        measured = measure(directory, texts, args)
    load = meter.record()
    result = {
        "environment": {
            "torch": torch.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "threads": torch.get_num_threads(),
            "texts": args.texts,
            "corpus": args.corpus,
            "repeats": args.repeats,
            "batch_size": args.batch_size,
            "layers": args.layers,
            "load": load.to_dict(),
            "load_verdict": load.describe(),
            "cpu": cpu_description(),
        },
        **measured,
    }
    text = report_text(result)
    print(text)
    if args.out is not None:
        from clearformer.io import atomic_write

        with atomic_write(args.out.with_suffix(".json"), "w") as handle:
            json.dump(result, handle, indent=1)
        with atomic_write(args.out.with_suffix(".md"), "w") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
