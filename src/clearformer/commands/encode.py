"""``clearformer encode``: sentence embeddings for texts, with a pretrained encoder.

Texts come from the arguments, a file (one per line, or JSONL with ``--field``) or stdin.
Embeddings go to ``.npy`` or ``.jsonl`` (written atomically) or to stdout as JSONL;
``--similarity`` prints their cosine matrix.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

from ..options import BACKENDS
from ..precision import ALIASES, PRECISION_NAMES
from ..precision.names import is_int8
from ..text.batching import DEFAULT_MAX_TOKENS, INT_MM_MAX_TOKENS
from .status_line import PROGRESS_MIN_TEXTS

SIMILARITY_MAX = 32  # texts; a larger matrix does not fit a terminal
ENCODE_PRECISIONS = ("float32", "bf16", "int8", "int8-blocks")
ENCODE_PRECISION_HELP = (
    "bf16 (bfloat16): bfloat16 matrix products, several times faster on CPUs with AMX, "
    "embeddings within cosine 0.995 of float32; int8: int8 matrix products, about 2x faster "
    "on CPUs with int8 instructions, embeddings within cosine 0.99 of float32; int8-blocks: "
    "int8 weights scaled per block of 32 and 16-bit activations (AVX512-VNNI), closer to "
    "float32 than int8, slower on batches"
)
OUTPUT_SUFFIXES = (".npy", ".jsonl")


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {number}")
    return number


def add_workers_argument(p: argparse.ArgumentParser) -> None:
    """``--workers N``: forward passes side by side (encode, search and rerank)."""
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="batches run side by side, the CPU threads split between them (default: 2 on a "
        "CPU with 2 or more threads and 2 or more batches, else 1)",
    )


def add_precision_argument(
    p: argparse.ArgumentParser,
    offered: tuple[str, ...],
    help_text: str,
    flag: str = "--precision",
) -> None:
    """``flag`` (``--precision``): the names ``offered`` (with their aliases, ``bfloat16`` for
    ``bf16``) and ``auto``; ``help_text`` says what the command's non-float32 choices do."""
    choices = [name for name in PRECISION_NAMES if ALIASES.get(name, name) in (*offered, "auto")]
    p.add_argument(
        flag,
        choices=choices,
        default="float32",
        help=f"{help_text}; auto: the fastest of them whose accuracy floor holds on this CPU "
        "(bf16 on an NVIDIA GPU from Ampere on; the choice and its reason are logged with -v; "
        "default float32)",
    )


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The options encode and search share: model, batching, workers, backend, progress."""
    p.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="checkpoint directory (default: the bundled all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        metavar="N",
        help="texts per forward pass (default: as many as fit in --max-tokens)",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"padded tokens per forward pass without --batch-size (default {DEFAULT_MAX_TOKENS}"
        f"; {INT_MM_MAX_TOKENS} with --precision int8 where the int8 products run through "
        "torch._int_mm)",
    )
    add_workers_argument(p)
    p.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        help="where a dense model runs: cpu (default), cuda, cuda:N; texts are tokenized on "
        "the CPU; --precision int8 and int8-blocks run on the CPU alone",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="attention backend (auto packs ragged batches)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr, with the rate and the time left (default: when stderr "
        f"is a terminal and there are {PROGRESS_MIN_TEXTS} texts or more)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "encode",
        help="sentence embeddings for texts",
        description="Encode texts into sentence embeddings with a pretrained encoder.",
    )
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to encode")
    p.add_argument(
        "-i", "--input", metavar="FILE", help="read texts from FILE, one per line ('-': stdin)"
    )
    p.add_argument(
        "--field",
        metavar="NAME",
        help="read JSONL input and take this string field (default for .jsonl input: text)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write embeddings to FILE.npy or FILE.jsonl, or to a directory of shards and a "
        "manifest (DIR/, an existing directory, or a path without a suffix; made if missing; "
        "resumable; one shard per process under torchrun)",
    )
    p.add_argument("--similarity", action="store_true", help="print the cosine similarity matrix")
    p.add_argument(
        "--no-normalize",
        dest="normalize",
        action="store_false",
        default=None,
        help="do not L2-normalise (default: as the checkpoint's pipeline says)",
    )
    p.add_argument(
        "--dimensions",
        type=positive_int,
        default=None,
        metavar="N",
        help="keep the first N values of each embedding (a Matryoshka model's shorter "
        "embedding), then normalise as the checkpoint says (default: the full width)",
    )
    add_prompt_arguments(p)
    add_precision_argument(p, ENCODE_PRECISIONS, ENCODE_PRECISION_HELP)
    add_model_arguments(p)
    p.set_defaults(
        func=run,
        writes_stdout=lambda args: args.output is None or args.similarity,
        stdout_hint="; give --output FILE",
    )


def add_prompt_arguments(p: argparse.ArgumentParser) -> None:
    """``--prompt-name NAME`` and ``--prompt TEXT``: what ``encode`` puts before every text."""
    p.add_argument(
        "--prompt-name",
        metavar="NAME",
        default=None,
        help="put the model's named prompt before every text (e.g. query or document, from its "
        "config_sentence_transformers.json; default: the model's default prompt, if any)",
    )
    p.add_argument(
        "--prompt",
        metavar="TEXT",
        default=None,
        help="put TEXT before every text (e.g. 'query: '), instead of a named prompt",
    )


def check_prompt_name(encoder, flag: str, name: str | None) -> None:
    """A prompt name a flag gives is one of the model's (None: none given), checked once the
    model is loaded, before any text is embedded."""
    from ..cli import CliError

    named = sorted(encoder.prompts.prompts)
    if name is not None and name not in named:
        raise CliError(
            f"{flag} {name!r}: the model has no such prompt (its prompts: "
            f"{', '.join(named) if named else 'none'})"
        )


def check_prompt_flags(encoder, args: argparse.Namespace) -> dict:
    """``encode``'s prompt keywords from ``--prompt-name`` / ``--prompt``, checked against the
    model's prompts once it is loaded, before any text is embedded: a name it lacks would
    otherwise fail only at the first batch (or, sharded, be recorded in no job)."""
    from ..checks import check_unicode
    from ..cli import CliError

    name, text = args.prompt_name, args.prompt
    if name is not None and text is not None:
        raise CliError("give --prompt-name NAME or --prompt TEXT, not both")
    check_prompt_name(encoder, "--prompt-name", name)
    if text is not None:
        check_unicode(text, "--prompt")
    return {"prompt": text, "prompt_name": name}


def refuse_sparse_prompt(args: argparse.Namespace) -> None:
    """A sparse model's ``encode`` embeds documents with its own document prompt: a prompt
    flag there would be ignored, so it is refused before the model loads."""
    from ..cli import CliError

    for flag, value in (("--prompt-name", args.prompt_name), ("--prompt", args.prompt)):
        if value is not None:
            raise CliError(
                f"{flag} is for dense embeddings; --model {args.model} is a sparse (SPLADE) "
                "model, which puts its own document prompt before each text"
            )


def read_input(texts: list[str], input_path: str | None, field: str | None) -> list[str]:
    """Texts from the arguments, ``--input`` or stdin (exactly one source)."""
    from ..checks import check_unicode
    from ..cli import CliError

    if texts and input_path is not None:
        raise CliError("give texts as arguments or with --input, not both")
    if texts:
        if field is not None:
            raise CliError("--field applies to --input or stdin, not to texts given as arguments")
        for i, text in enumerate(texts):
            check_unicode(text, f"TEXT {i + 1}")
        return texts
    if input_path is not None and input_path != "-":
        return read_input_file(input_path, field)[0]
    if sys.stdin is None:
        raise CliError("no input texts: stdin is closed; pass texts as arguments or --input FILE")
    if input_path is None and sys.stdin.isatty():
        raise CliError("no input texts: pass texts as arguments, --input FILE, or pipe stdin")
    return texts_of(sys.stdin.buffer.read(), "stdin", field)


def read_input_file(input_path: str, field: str | None) -> tuple[list[str], bytes]:
    """The texts of ``--input FILE`` and the file's bytes, read once: a named pipe or a
    process substitution (``-i <(...)``) gives its bytes once."""
    from .inputs import is_jsonl, require_input_file

    path = require_input_file(input_path, "--input")
    data = path.read_bytes()
    if field is None and is_jsonl(path):
        field = "text"
    return texts_of(data, str(path), field), data


def texts_of(data: bytes, source: str, field: str | None) -> list[str]:
    """The texts in ``data`` (lines, or a JSONL ``field``); CliError if it holds none."""
    from ..cli import CliError
    from ..io import read_texts

    result = read_texts(data, source, field=field)
    if not result:
        raise CliError(f"empty input: {source} holds no texts")
    return result


def check_output(output: str | None) -> Path | None:
    """The --output path, checked to be writable before any work."""
    from ..cli import CliError
    from .outputs import check_destination

    if output is None:
        return None
    path = Path(output)
    if path.suffix not in OUTPUT_SUFFIXES:
        raise CliError(
            f"--output must end in .npy or .jsonl, or name a directory of shards (DIR/, an "
            f"existing directory, or a new path without a suffix), got {output!r}"
        )
    if not path.parent.is_dir():
        raise CliError(f"--output directory does not exist: {path.parent}")
    return check_destination("--output", path)


def batching_options(args: argparse.Namespace) -> dict:
    """``encode``'s batching keywords from add_model_arguments' flags: speed and memory only."""
    return {"batch_size": args.batch_size, "max_tokens": args.max_tokens, "workers": args.workers}


def check_dimensions_flag(encoder, args: argparse.Namespace) -> None:
    """Refuse a ``--dimensions`` the model cannot give, before any work, naming the model."""
    from ..cli import CliError

    if args.dimensions is None:
        return
    try:
        encoder.head.check_dimensions(args.dimensions, "--dimensions")
    except ValueError as exc:
        raise CliError(f"--model {encoder.path}: {exc}") from None


def device_flag(args: argparse.Namespace):
    """``--device`` as a ``torch.device`` (the CPU when the command has no such flag), checked
    with the flag's name, and refused with ``--precision int8`` (which runs on the CPU alone):
    what every command calls before it reads anything."""
    from ..cli import CliError
    from ..devices import check_device

    device = check_device(getattr(args, "device", None), "--device")
    precision = getattr(args, "precision", None)
    if device.type != "cpu" and is_int8(precision):
        raise CliError(
            f"--precision {precision} runs on the CPU alone; with --device {args.device} use "
            f"--precision bf16 or float32"
        )
    return device


def load_encoder(
    args: argparse.Namespace,
    *,
    hold_precision: bool = False,
    route: Callable[[str], str] | None = None,
):
    """The dense model of ``--model``; with ``hold_precision``, loaded in ``--precision``
    alone (a command whose every call runs that precision: no float32 model kept beside a
    bf16 or int8 one). A model of another kind is refused naming ``--model`` and ``route(kind)``,
    what runs it on the command line (default: :func:`other_model_flag`)."""
    from ..text import TextEncoder
    from .kind_models import refuse_other_kind

    device = device_flag(args)  # named as the flag, before any read
    refuse_other_kind(args.model, route or (lambda kind: other_model_flag(args, kind)))
    precision = args.precision if hold_precision else None
    return TextEncoder.from_pretrained(
        args.model, backend=args.backend, precision=precision, device=device
    )


def other_model_flag(args: argparse.Namespace, kind: str) -> str:
    """What a command that runs a dense ``--model`` says of a model of another ``kind``: its
    own flag for that kind where it has one (eval's ``--sparse-model``), else that it embeds
    with a dense model."""
    if hasattr(args, f"{kind}_model"):
        return f"--model is the dense model: give it as --{kind}-model"
    return f"clearformer {args.command} embeds with a dense model"


def encode_route(kind: str, model: str) -> str:
    """What runs a ``kind`` model that ``encode`` cannot write (only dense embeddings go to
    shards; multi-vector and bge-m3 outputs are indexed or served)."""
    from .kind_models import kind_flag

    if kind == "sparse":
        return "its weights go to JSONL (stdout or --output FILE.jsonl), not to --output DIR"
    served = "POST /embed_multivector"
    if kind == "bge-m3":
        served = "POST /embed, /embed_sparse, /embed_multivector"
    return (
        f"encode embeds dense and sparse models: index it with `clearformer index build "
        f"{kind_flag(kind)} --model {model}`, or serve it (`clearformer serve --model {model}`, "
        f"{served})"
    )


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..cli import CliError
    from ..io import atomic_write
    from .outputs import check_finite
    from .status_line import encode_progress

    output = check_output(args.output)
    device_flag(args)  # before any input is read
    texts = read_input(args.texts, args.input, args.field)
    if args.similarity and len(texts) > SIMILARITY_MAX:
        raise CliError(
            f"--similarity prints an n x n matrix for at most {SIMILARITY_MAX} texts, "
            f"got {len(texts)}; use --output to save the embeddings"
        )
    from .encode_sparse import is_sparse_model, run_sparse

    if is_sparse_model(args.model):  # SPLADE weights: JSONL of {token id: weight}
        refuse_sparse_prompt(args)
        return run_sparse(args, texts, output)
    route = functools.partial(encode_route, model=args.model)
    encoder = load_encoder(args, hold_precision=True, route=route)
    check_dimensions_flag(encoder, args)  # a width the model cannot give: before any work
    prompts = check_prompt_flags(encoder, args)
    with encode_progress(args, len(texts)) as progress:  # its line ended before any message
        embeddings = encoder.encode(
            texts,
            batch_size=args.batch_size,
            max_tokens=args.max_tokens,
            workers=args.workers,
            normalize=args.normalize,
            progress=progress,
            precision=args.precision,
            dimensions=args.dimensions,
            **prompts,
        )  # (n, dimensions or width) float32
    ran = encoder.precision_for(args.precision)
    if is_int8(args.precision) and ran.choice != args.precision:  # no int8 products here
        print(f"note: encoded in {ran.choice}, not {args.precision}: {ran.reason}", file=sys.stderr)
    # NaN is not JSON, and a NaN row in an .npy poisons every similarity computed from it:
    # either is an error naming the texts, with nothing written.
    check_finite(embeddings, texts)
    if output is not None and output.suffix == ".npy":
        with atomic_write(output, "wb") as handle:
            np.save(handle, embeddings)
    elif output is not None:
        with atomic_write(output) as handle:
            write_jsonl(handle, texts, embeddings)
    if args.similarity:
        print(similarity_table(texts, embeddings))
    elif output is None:
        write_jsonl(sys.stdout, texts, embeddings)
    else:
        print(f"wrote {len(texts)} x {embeddings.shape[1]} embeddings to {output}", file=sys.stderr)
    return 0


def write_jsonl(handle, texts: list[str], embeddings) -> None:
    """One JSON object per text: its index, text and embedding (9 significant digits, enough
    to restore every float32 exactly)."""
    for index, (text, row) in enumerate(zip(texts, embeddings, strict=True)):
        numbers = ", ".join(f"{x:.9g}" for x in row.tolist())
        handle.write(
            f'{{"index": {index}, "text": {json.dumps(text, ensure_ascii=False)}, '
            f'"embedding": [{numbers}]}}\n'
        )


def cosine_matrix(embeddings):
    import numpy as np

    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)  # (n, 1)
    unit = embeddings / np.maximum(norms, 1e-12)
    return unit @ unit.T  # (n, n)


def similarity_table(texts: list[str], embeddings) -> str:
    """The cosine matrix with numbered texts as a legend."""
    sims = cosine_matrix(embeddings)
    n = len(texts)
    lines = [f"[{i + 1}] {_shorten(t)}" for i, t in enumerate(texts)]
    header = "     " + "".join(f"{f'[{j + 1}]':>8}" for j in range(n))
    lines += ["", header]
    for i in range(n):
        lines.append(f"{f'[{i + 1}]':<5}" + "".join(f"{sims[i, j]:8.3f}" for j in range(n)))
    return "\n".join(lines)


def _shorten(text: str, width: int = 70) -> str:
    flat = " ".join(text.split())
    if not flat:
        return repr(text)
    return flat if len(flat) <= width else flat[: width - 3] + "..."
