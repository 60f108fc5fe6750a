"""``clearformer bench``: clearformer against torch.nn, Hugging Face and x-transformers.

Where results go: by default a new folder ``bench-results/<date>-<time>/`` under the current
directory, so that a run never replaces earlier results (the project's committed
``benchmarks/results/`` included). ``--out DIR`` names the folder; if it already holds a file
this run would write (``<name>.md``, ``.json``, ``.png``) the run is refused before any work
unless ``--force``. Every file is written atomically, after each section and at the end.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DEFAULT_ROOT = "bench-results"
OUTPUT_SUFFIXES = (".md", ".json", ".png")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark clearformer against its peers, side by side in one process",
        description="Times every implementation in one process under the same allocator "
        "setting; writes a markdown table, JSON and a PNG chart.",
    )
    p.add_argument("--quick", action="store_true", help="MiniLM size, small batches (< 2 min)")
    p.add_argument(
        "--sizes", type=_names, help="comma-separated model sizes: minilm, bert-base (default both)"
    )
    p.add_argument("--batch", type=int, help="sequences per inference batch (default 32)")
    p.add_argument("--seqlen", type=int, help="length of the fixed batches (default 128)")
    p.add_argument("--min-length", type=int, help="shortest ragged sequence (default 16)")
    p.add_argument(
        "--max-length",
        type=int,
        help="longest ragged sequence, and the padded length (default 256)",
    )
    p.add_argument("--train-batch", type=int, help="sequences per training step (default 16)")
    p.add_argument(
        "--long-seqlens",
        type=_int_list,
        help="comma-separated lengths of the one-layer long-sequence section (512,2048,8192)",
    )
    p.add_argument("--repeats", type=int, help="timed rounds, medians reported (default 5)")
    p.add_argument("--train-repeats", type=int, help="timed training rounds (default 3)")
    p.add_argument("--warmup", type=int, help="untimed rounds first (default 1)")
    p.add_argument(
        "--sections",
        type=_names,
        help="comma-separated sections to run: kernels (attention methods alone), inference, "
        "long (one long layer), training, packing (the padding threshold) (default all)",
    )
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--no-math", action="store_true", help="leave out the math backend")
    p.add_argument("--no-memory", action="store_true", help="skip peak-memory probes")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output folder (default: a new {DEFAULT_ROOT}/<date>-<time>/ here)",
    )
    p.add_argument("--name", default="bench", help="file stem of the outputs (default bench)")
    p.add_argument("--force", action="store_true", help="replace outputs of the same name in --out")
    # Its results are the files under --out; the table it prints is a courtesy.
    p.set_defaults(func=run, writes_stdout=lambda args: False)


_FIELDS = {
    "sizes": "sizes",
    "batch": "batch",
    "seqlen": "seqlen",
    "min_length": "min_length",
    "max_length": "max_length",
    "train_batch": "train_batch",
    "long_seqlens": "long_seqlens",
    "repeats": "repeats",
    "train_repeats": "train_repeats",
    "warmup": "warmup",
    "sections": "sections",
    "threads": "threads",
}


def options_from_args(args: argparse.Namespace):
    """A validated :class:`~clearformer.bench.suite.BenchOptions` (CliError naming the flag on
    bad input)."""
    from ..bench.suite import BenchOptions
    from ..cli import CliError

    chosen = {field: getattr(args, attr) for attr, field in _FIELDS.items()}
    chosen = {k: v for k, v in chosen.items() if v is not None}
    if args.no_math:
        chosen["with_math"] = False
    if args.no_memory:
        chosen["measure_memory"] = False
    try:
        return BenchOptions.quick(**chosen) if args.quick else BenchOptions(**chosen)
    except ValueError as exc:
        flags = _flags_named(str(exc), args)
        raise CliError(f"{flags}: {exc}" if flags else str(exc)) from None


def _flags_named(message: str, args: argparse.Namespace) -> str:
    """The flags of the BenchOptions fields a message names (``train_batch`` is
    ``--train-batch``), those the user typed first: the field names alone do not say which
    flag to change. Empty when it names none."""
    fields = {field: attr for attr, field in _FIELDS.items()} | {"size": "sizes"}
    found = sorted(
        (match.start(), attr)
        for field, attr in fields.items()
        if (match := re.search(rf"\b{field}\b", message))
    )
    named = list(dict.fromkeys(attr for _, attr in found))  # in the message's order, once
    typed = [attr for attr in named if getattr(args, attr) is not None]
    return ", ".join("--" + attr.replace("_", "-") for attr in typed or named)


def prepare_out(out: Path | None, name: str, *, force: bool) -> Path:
    """The output folder, created and checked writable before any work (CliError if not)."""
    import time

    from ..cli import CliError
    from .outputs import check_destination

    if not name or Path(name).name != name:
        raise CliError(f"--name must be a file stem without a folder, got {name!r}")
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = Path(DEFAULT_ROOT) / stamp
        count = 1
        while out.exists():  # two runs in one second
            count += 1
            out = Path(DEFAULT_ROOT) / f"{stamp}-{count}"
    elif out.exists() and not out.is_dir():
        raise CliError(f"--out {out} is a file; give a folder")
    elif not force:
        taken = [out / f"{name}{suffix}" for suffix in OUTPUT_SUFFIXES]
        taken = [str(path) for path in taken if path.exists()]
        if taken:
            raise CliError(
                f"--out {out} already holds {', '.join(taken)}; pass --force to replace, or "
                "choose another --out or --name"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--out: cannot create folder {out}: {exc.strerror}") from None
    check_destination("--out", out / f"{name}.json")
    return out


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)  # validate before any heavy import or work
    out = prepare_out(args.out, args.name, force=args.force)

    from ..bench.report import markdown, write
    from ..bench.suite import run_suite

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def save_partial(partial) -> None:
        # A long run that is interrupted still leaves the sections it finished.
        write(partial, out, args.name, with_chart=False)

    results = run_suite(options, progress, on_section=save_partial)
    print(markdown(results))
    for path in write(results, out, args.name, with_chart=not args.no_chart):
        print(f"wrote {path}", file=sys.stderr)
    if results.load.get("loaded"):
        print(
            "warning: the machine was loaded during the run (" + results.load["reason"] + "); "
            "ratios taken under load do not reproduce: rerun on a quiet machine",
            file=sys.stderr,
        )
    return 0
