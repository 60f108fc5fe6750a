"""``clearformer explain TEXT``: a live walk through the encoder's forward pass.

Prints the annotated listing (each step's code, formula, shape and statistics) and writes the
HTML report, PNG attention maps or JSON trace on request. The checks on the arguments run before
any work: output paths and empty texts before the model is loaded, the filters (which need the
model's size) before it runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from ..options import BACKENDS, NORMS

# The toy encoder's options: flag, type, default, meaning. Given without --random, they fail
# rather than being silently ignored.
_TOY_OPTIONS = (
    ("--d-model", int, 64, "width D"),
    ("--n-heads", int, 4, "attention heads"),
    ("--n-layers", int, 2, "blocks"),
    ("--max-length", int, 64, "words kept per text"),
    ("--seed", int, 0, "initialises the parameters"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="walk through the encoder's real forward pass on a text",
        description="Run the encoder on TEXT and narrate every step: the line of clearformer "
        "that computes it, its formula, the live shapes and statistics, the attention maps.",
    )
    p.add_argument("texts", nargs="+", metavar="TEXT", help="one or more texts (a batch)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="DIR", help="checkpoint directory (default: bundled)")
    source.add_argument("--random", action="store_true", help="an untrained toy encoder")
    toy = p.add_argument_group("toy encoder (--random)")
    for flag, kind, default, what in _TOY_OPTIONS:
        toy.add_argument(flag, type=kind, help=f"{what} (default {default})")
    toy.add_argument("--norm", choices=NORMS, help="norm placement (default pre)")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="the attention backend the model runs in production",
    )
    show = p.add_argument_group("what to show")
    show.add_argument("--layer", type=int, help="only this layer (0-based)")
    show.add_argument("--head", type=int, help="attention of this head (0-based)")
    show.add_argument("--step", help="only these steps: a name (attn.scores) or group (attn)")
    show.add_argument("--sequence", type=int, default=0, help="which text of the batch to show")
    show.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no listing on stdout (the default with --html, --png or --json FILE)",
    )
    out = p.add_argument_group("outputs (written atomically)")
    out.add_argument("--html", metavar="FILE", help="self-contained HTML report")
    out.add_argument("--png", metavar="FILE", help="attention maps (needs matplotlib)")
    out.add_argument(
        "--json",
        metavar="FILE",
        nargs="?",
        const="-",
        help="the whole trace as JSON (to stdout without FILE)",
    )
    p.set_defaults(
        func=run,
        writes_stdout=lambda args: _prints_listing(args) or args.json == "-",
        stdout_hint="; give --html, --png or --json FILE",
    )


def _files(args: argparse.Namespace) -> dict[str, str]:
    """The files asked for, by flag (``--json`` alone writes to stdout, not a file)."""
    outputs = {"--html": args.html, "--png": args.png, "--json": args.json}
    return {flag: path for flag, path in outputs.items() if path is not None and path != "-"}


def _prints_listing(args: argparse.Namespace) -> bool:
    """The listing runs to hundreds of lines: it is printed only when nothing else is asked
    for. With a report or a trace to write, the terminal gets one line naming the files."""
    return not args.quiet and args.json is None and not _files(args)


def run(args: argparse.Namespace) -> int:
    from ..checks import check_unicode
    from ..cli import CliError
    from ..explainer import explain
    from ..explainer.filters import Filters, check_filters

    toy_given = [f for f, *_ in _TOY_OPTIONS if getattr(args, _dest(f)) is not None]
    toy_given += ["--norm"] if args.norm is not None else []
    if toy_given and not args.random:
        raise CliError(f"{', '.join(toy_given)} configure the toy encoder: add --random")
    for flag, _, default, _ in _TOY_OPTIONS:
        if getattr(args, _dest(flag)) is None:
            setattr(args, _dest(flag), default)
    args.norm = args.norm or "pre"
    for i, text in enumerate(args.texts):
        if not text.strip():
            raise CliError(f"TEXT {i + 1} is empty: give a text with at least one word")
        check_unicode(text, f"TEXT {i + 1}")
    files = _files(args)
    for flag, path in files.items():
        _check_writable(flag, path)
    _check_json_name(args.json)
    if args.png is not None and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--png needs matplotlib: pip install 'clearformer[plot]'")
    filters = Filters(args.layer, args.head, args.step, args.sequence)

    if args.random:
        _check_random(args)
    encoder = _load(args)
    config = encoder.model.config
    check_filters(filters, n_layers=config.n_layers, n_heads=config.n_heads, batch=len(args.texts))
    trace = explain(encoder, args.texts)
    listing = _prints_listing(args)
    # The notes are in the listing's header, or in the files (the summary line below says
    # what matters of them: fidelity, truncation); otherwise (-q, or the JSON trace on
    # stdout) on stderr.
    if not listing and not files:
        for note in trace.notes:
            print(f"clearformer explain: note: {note}", file=sys.stderr)

    # Every output rendered before any is written: one that fails to render (a PNG, say)
    # leaves none of the others behind.
    rendered: list[tuple[str, str | bytes]] = []
    json_text = None
    if args.json is not None:
        json_text = trace.to_json(indent=1) + "\n"
        if args.json != "-":
            rendered.append((args.json, json_text))
    if args.html is not None:
        from ..explainer.render_html import render_html

        rendered.append((args.html, render_html(trace)))
    if args.png is not None:
        from ..explainer.render_png import render_png

        rendered.append((args.png, render_png(trace, filters)))
    for path, content in rendered:
        _write(path, content)
    if args.json == "-":
        sys.stdout.write(json_text)
    if listing:
        from ..explainer.render_text import render_text

        sys.stdout.write(render_text(trace, filters))
    if files:
        print(f"clearformer explain: {_summary(trace, files)}", file=sys.stderr)
    return 0


def _summary(trace, files: dict[str, str]) -> str:
    """One line: the files written, what they hold and whether the trace is faithful."""
    written = ", ".join(f"{path} ({flag[2:]})" for flag, path in files.items())
    m = trace.model
    texts = len(trace.tokens)
    cut = sum(trace.truncated)
    truncated = f", {cut} truncated" if cut else ""
    fid = trace.fidelity
    verdict = "within" if fid.ok else "ABOVE"
    return (
        f"wrote {written}: {m['n_layers']} layers x {m['n_heads']} heads, {texts} "
        f"text{'s' if texts != 1 else ''}{truncated}; max |trace - production| = "
        f"{fid.max_abs_diff:.1e}, {verdict} the tolerance {fid.tolerance:g}"
    )


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _load(args: argparse.Namespace):
    if args.random:
        from ..explainer.toy import ToyTextEncoder

        return ToyTextEncoder(
            args.d_model,
            args.n_heads,
            args.n_layers,
            norm=args.norm,
            backend=args.backend,
            max_length=args.max_length,
            seed=args.seed,
        )
    from ..text import TextEncoder

    return TextEncoder.from_pretrained(args.model, backend=args.backend)


def _check_random(args: argparse.Namespace) -> None:
    """A random model's sizes and seed, before it is built: as ``demo`` bounds its own, plus
    the toy's tables (a 4,096-word vocabulary and max_length positions, each D wide)."""
    from ..cli import CliError
    from ..explainer.toy import VOCAB_SIZE
    from .demo import MAX_LAYERS, check_parameters, check_seed, check_sizes

    check_seed(args.seed)
    flags = ("--d-model", "--n-heads", "--n-layers", "--max-length")
    check_sizes({flag: getattr(args, _dest(flag)) for flag in flags})
    if args.n_layers > MAX_LAYERS:  # thin layers are cheap in parameters, not in time
        raise CliError(f"--n-layers must be at most {MAX_LAYERS}, got {args.n_layers}")
    parameters = (12 * args.n_layers * args.d_model + VOCAB_SIZE + args.max_length) * args.d_model
    sizes = (
        f"--d-model {args.d_model}, --n-layers {args.n_layers} and --max-length {args.max_length}"
    )
    check_parameters(parameters, sizes, "a random model has")


def _check_json_name(path: str | None) -> None:
    """``--json`` takes an optional FILE, so ``--json "The cat sat." "Dogs bark."`` reads the
    first text as the file name: a value that is no ``.json`` path is refused, not written."""
    from ..cli import CliError

    if path is None or path == "-" or path.lower().endswith(".json"):
        return
    raise CliError(
        f"--json must be a FILE ending in .json or - for stdout, got {path!r}; to print the "
        "trace of these texts, put --json after them: clearformer explain TEXT ... --json"
    )


def _check_writable(flag: str, path: str) -> None:
    from .outputs import check_destination

    check_destination(flag, path)


def _write(path: str, content: str | bytes) -> None:
    from ..io import atomic_write

    with atomic_write(path, "wb" if isinstance(content, bytes) else "w") as handle:
        handle.write(content)
