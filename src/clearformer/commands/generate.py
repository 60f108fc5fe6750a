"""``clearformer generate --run RUN SEQUENCE ...``: decode with a trained sequence-to-sequence
run (``clearformer train --task reverse``).

Each SEQUENCE is space-separated token ids (``"3 7 5"``); the output is one line per input,
the decoded ids and the sequence's score. The run's final weights (``model.safetensors``) are
used.
"""

from __future__ import annotations

import argparse
import math

from .encode import add_precision_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="decode token sequences with a trained seq2seq run")
    p.add_argument("sequences", nargs="+", metavar="SEQUENCE", help='token ids, e.g. "3 7 5"')
    p.add_argument("--run", required=True, metavar="RUN", help="a clearformer train output folder")
    p.add_argument("--num-beams", type=int, default=1, help="beams of beam search (1: greedy)")
    p.add_argument(
        "--length-penalty",
        type=float,
        default=1.0,
        help="a finished beam's score is its log-probability / length ** this",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="default: each SEQUENCE's own length + 1 (at most the run's positions)",
    )
    add_precision_argument(
        p,
        ("float32", "bf16"),
        "bf16 (bfloat16): a bfloat16 copy of the model decodes, faster on CPUs with AMX; "
        "its log-probabilities are close to float32's, so a near tie may decode differently",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..cli import CliError
    from .runs import WEIGHTS, load_weights, require_files

    folder = Path(args.run)
    require_files(folder, ("config.toml", WEIGHTS))
    sources = []
    for text in args.sequences:
        try:
            sources.append([int(t) for t in text.split()])
        except ValueError:
            raise CliError(f"SEQUENCE must be space-separated token ids, got {text!r}") from None
        if not sources[-1]:
            raise CliError("SEQUENCE must hold at least one token id, got an empty one")
    if args.num_beams < 1:
        raise CliError(f"--num-beams must be a positive int, got {args.num_beams}")
    # 0 must not fall back to the default (`0 or default`), and all of these are checked
    # before the run is read, not by generate() after the model is loaded.
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be a positive int, got {args.max_new_tokens}")
    if not math.isfinite(args.length_penalty):
        raise CliError(f"--length-penalty must be a finite number, got {args.length_penalty}")

    import torch

    from ..generation import generate
    from ..train.tomlfile import load_config

    config = load_config(folder / "config.toml")
    if config.task == "translate":
        raise CliError(
            f"--run {folder}: a 'translate' run reads words, not token ids: use "
            f'clearformer translate --run {folder} "a sentence"'
        )
    if config.task != "reverse":
        raise CliError(f"--run {folder}: a {config.task!r} run, not a sequence-to-sequence one")
    from ..train.tasks.reverse import FIRST, PAD, build_model

    model = build_model(config)
    seq2seq = model.model
    check_beams(args.num_beams, "--num-beams", seq2seq.config.target_vocab)
    vocab = seq2seq.config.src_vocab_size
    for s in sources:
        bad = [t for t in s if not FIRST <= t < vocab]
        if bad:
            raise CliError(f"token ids must be in [{FIRST}, {vocab}) for this run, got {bad[:5]}")
    longest = max(len(s) for s in sources)
    limit = seq2seq.config.max_positions - 1
    if longest > limit:
        raise CliError(f"a SEQUENCE has {longest} tokens; this run takes at most {limit}")
    # A larger request is refused, not clamped: the output would be cut short without a word.
    # The decoder feeds back the start token and all but the last new token: up to
    # max_positions new tokens (so a SEQUENCE's own length + 1 always fits).
    new_limit = seq2seq.config.max_positions
    if args.max_new_tokens is not None and args.max_new_tokens > new_limit:
        raise CliError(
            f"--max-new-tokens must be at most {new_limit} for this run (its positions), "
            f"got {args.max_new_tokens}"
        )
    # The ids are checked against the built model's sizes before its weights are read.
    load_weights(folder, model, "its config.toml")
    seq2seq.eval()
    # Without --max-new-tokens each sequence may run to its own length + 1: the sequences of
    # one length are decoded together, so that an output never depends on the other
    # sequences of the call (a batch's limit would be its longest's).
    groups: dict[int, list[int]] = {}
    for row, s in enumerate(sources):
        groups.setdefault(len(s) if args.max_new_tokens is None else 0, []).append(row)
    eos = seq2seq.config.eos_id
    lines: list[str] = [""] * len(sources)
    for length, rows in groups.items():
        wanted = length + 1 if args.max_new_tokens is None else args.max_new_tokens
        width = max(len(sources[row]) for row in rows)
        src = torch.full((len(rows), width), PAD, dtype=torch.long)  # (B, T)
        for i, row in enumerate(rows):
            src[i, : len(sources[row])] = torch.tensor(sources[row])
        out = generate(
            seq2seq,
            src,
            src != PAD,
            max_new_tokens=wanted,
            num_beams=args.num_beams,
            length_penalty=args.length_penalty,
            precision=args.precision,
        )
        for i, (row, n) in enumerate(zip(rows, out.lengths.tolist(), strict=True)):
            ids = out.sequences[i, :n].tolist()
            ids = ids[:-1] if ids and ids[-1] == eos else ids
            lines[row] = f"{' '.join(map(str, ids))}\t{out.scores[i].item():.4f}"
    for line in lines:
        print(line)
    return 0


def check_beams(beams: int, flag: str, target_vocab: int) -> None:
    """CliError for a beam wider than the run's target vocabulary, before decoding: more beams
    cannot be distinct at the first step, and a huge width ends in an allocation failure (or
    minutes of work) inside the search."""
    from ..cli import CliError

    if beams > target_vocab:
        raise CliError(
            f"{flag} must be at most {target_vocab} for this run (its target vocabulary), "
            f"got {beams}"
        )
