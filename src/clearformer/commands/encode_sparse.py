"""``clearformer encode --model SPARSE_DIR``: SPLADE weights as JSONL, one object per text.

Each line is ``{"index": i, "text": ..., "sparse": {"<token id>": weight, ...}}``, the text's
non-zero weights in token-id order (``SparseEncoder.encode_document``'s; 9 significant digits,
enough to restore every float32). The flags of dense embeddings (``--similarity``,
``--dimensions``, ``--no-normalize``, ``.npy`` or shard outputs, ``--precision int8``), and
``--max-tokens`` and a ``--device`` other than the CPU, which a sparse model cannot honour,
are refused by name before any work; ``--workers`` and ``--batch-size`` apply.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..precision.names import is_int8


def is_sparse_model(model: str | None) -> bool:
    """Whether ``--model`` names a sparse (SPLADE) model directory."""
    from ..model_kinds import model_kind

    return model is not None and Path(model).expanduser().is_dir() and model_kind(model) == "sparse"


def check_sparse_flags(args: argparse.Namespace) -> None:
    """Every flag run_sparse cannot honour refused by name, before the model loads."""
    from ..cli import CliError
    from ..devices import check_device
    from ..text.batching import DEFAULT_MAX_TOKENS

    refused = [
        ("--similarity", args.similarity),
        ("--dimensions", args.dimensions is not None),
        ("--no-normalize", args.normalize is False),
        (f"--precision {args.precision}", is_int8(args.precision)),
        (
            f"--output {args.output}",
            args.output is not None and Path(args.output).suffix != ".jsonl",
        ),
    ]
    for flag, given in refused:
        if given:
            raise CliError(
                f"{flag} is for dense embeddings; --model {args.model} is a sparse (SPLADE) "
                "model, whose weights go to JSONL (stdout or --output FILE.jsonl)"
            )
    # SparseEncoder.encode batches by --batch-size or its own token budget, on the CPU alone:
    # these flags would change nothing.
    if args.max_tokens is not None:
        raise CliError(
            f"--max-tokens applies to dense models; --model {args.model} is a sparse (SPLADE) "
            f"model, batched by up to {DEFAULT_MAX_TOKENS} padded tokens: give --batch-size N"
        )
    if args.device is not None and check_device(args.device, "--device").type != "cpu":
        raise CliError(
            f"--device {args.device}: sparse models run on the CPU here; only dense models are "
            "placed on another device"
        )


def run_sparse(args: argparse.Namespace, texts: list[str], output: Path | None) -> int:
    from ..io import atomic_write
    from ..text import SparseEncoder
    from .status_line import progress_for

    check_sparse_flags(args)
    # auto: decided among float32 and bf16 by the encoder, as for a dense model.
    encoder = SparseEncoder.from_pretrained(
        args.model, backend=args.backend, precision=args.precision
    )
    precision = encoder.precision
    vectors = encoder.encode_document(
        texts,
        batch_size=args.batch_size,
        progress=progress_for(args, len(texts)),
        precision=precision,
        workers=args.workers,
    ).coalesce()  # (n, V)
    if output is None:
        write_sparse_jsonl(sys.stdout, texts, vectors)
        return 0
    with atomic_write(output) as handle:
        write_sparse_jsonl(handle, texts, vectors)
    print(f"wrote {len(texts)} sparse vectors to {output}", file=sys.stderr)
    return 0


def write_sparse_jsonl(handle, texts: list[str], vectors) -> None:
    rows, columns = vectors.indices().tolist()
    values = vectors.values().tolist()
    entries: list[list[str]] = [[] for _ in texts]
    for row, column, value in zip(rows, columns, values, strict=True):
        entries[row].append(f'"{column}": {value:.9g}')
    for index, text in enumerate(texts):
        handle.write(
            f'{{"index": {index}, "text": {json.dumps(text, ensure_ascii=False)}, '
            f'"sparse": {{{", ".join(entries[index])}}}}}\n'
        )
