"""``clearformer translate --run RUN SENTENCE ...``: translate with a trained translation run
(``clearformer train --task translate``), with the run's own vocabularies.

Sentences come from the arguments or ``--file`` (one per line); the translations go to stdout
or ``--out`` (written atomically), one line per sentence, lower case (as the model learnt
them). A word the run's source vocabulary does not hold is read as ``<unk>``, and the command
says which. ``--bleu`` decodes the run's held-out sentences instead and prints their BLEU.
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate",
        help="translate sentences with a trained translation run",
        description="Translate sentences with a run of 'clearformer train --task translate'.",
    )
    p.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences to translate")
    p.add_argument("--run", required=True, metavar="RUN", help="a clearformer train output folder")
    p.add_argument("--file", metavar="FILE", help="read sentences from FILE, one per line")
    p.add_argument("--out", metavar="FILE", help="write the translations to FILE (default stdout)")
    p.add_argument("--beams", type=int, default=1, help="beam width; 1: greedy (default 1)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences decoded at a time")
    p.add_argument(
        "--bleu",
        action="store_true",
        help="decode the run's held-out sentences and print their corpus BLEU",
    )
    p.set_defaults(func=run, writes_stdout=lambda args: args.out is None or args.bleu)


def _check_arguments(args: argparse.Namespace):
    from ..cli import CliError
    from .outputs import check_destination

    sources = (("SENTENCE", args.sentences), ("--file", args.file), ("--bleu", args.bleu))
    given = [name for name, value in sources if value]
    if len(given) != 1:
        raise CliError(
            "give sentences as arguments, --file FILE or --bleu (exactly one), got "
            + (" and ".join(given) if given else "none")
        )
    for flag, value in (("--beams", args.beams), ("--batch-size", args.batch_size)):
        if value < 1:
            raise CliError(f"{flag} must be a positive int, got {value}")
    return check_destination("--out", args.out) if args.out else None


def _load_config(folder):
    """The run's config; CliError naming --run for a missing file or another task's run."""
    from ..cli import CliError
    from ..train.tasks.translate import VOCABULARY_FILE
    from ..train.tomlfile import load_config
    from .runs import WEIGHTS, require_files

    require_files(folder, ("config.toml", WEIGHTS))
    config = load_config(folder / "config.toml")
    if config.task != "translate":
        raise CliError(
            f"--run {folder}: a {config.task!r} run, not a translation one "
            "(train one with --task translate)"
        )
    if not (folder / VOCABULARY_FILE).is_file():
        raise CliError(f"--run {folder}: {VOCABULARY_FILE} is missing")
    return config


def _load_vocabularies(folder):
    """The run's (source, target) vocabularies; CliError naming the file if it is damaged."""
    from ..cli import CliError
    from ..train.tasks.translate import VOCABULARY_FILE
    from ..train.tasks.words import load_vocabularies

    vocab_file = folder / VOCABULARY_FILE
    try:
        text = vocab_file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:  # its own message names no file
        raise CliError(
            f"--run {folder}: {VOCABULARY_FILE} is not UTF-8 text (byte offset {exc.start})"
        ) from None
    return load_vocabularies(text, str(vocab_file))


def _load_model(folder, config, source, target):
    """The run's model, for its vocabularies; CliError naming the file for damaged weights."""
    from ..train.tasks.translate import VOCABULARY_FILE, build_model
    from .runs import load_weights

    model = build_model(config, len(source), len(target))
    load_weights(folder, model, f"its config and {VOCABULARY_FILE}")
    return model.model.eval()


def _read_sentences(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(where, sentence) for each sentence, from the arguments or --file."""

    from ..checks import check_unicode
    from ..cli import CliError
    from ..io import read_lines

    if args.sentences:
        for i, text in enumerate(args.sentences, start=1):
            check_unicode(text, f"SENTENCE {i}")
        return [(f"SENTENCE {i}", s) for i, s in enumerate(args.sentences, start=1)]
    from .inputs import require_input_file

    path = require_input_file(args.file, "--file")
    lines = read_lines(path.read_bytes(), f"--file {path}")
    if not lines:
        raise CliError(f"--file {path} is empty: no sentences to translate")
    return [(f"--file {path} line {i}", line) for i, line in enumerate(lines, start=1)]


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..cli import CliError
    from ..io import atomic_write
    from .generate import check_beams

    out = _check_arguments(args)
    folder = Path(args.run)
    config = _load_config(folder)
    source, target = _load_vocabularies(folder)
    # The width's bound is the run's target vocabulary, known once its small file is read.
    check_beams(args.beams, "--beams", len(target))
    from ..train.tasks.translate import held_out_bleu, translate_ids
    from ..train.tasks.words import join_words, split_words

    # The sentences are read and checked before the model is loaded: a bad --file or an
    # over-long sentence fails at once.
    sentences = []
    if not args.bleu:
        limit = config.translate_max_length
        for where, sentence in _read_sentences(args):
            words = split_words(sentence)
            if not words:
                raise CliError(f"{where} is empty: there is nothing to translate")
            if len(words) > limit:
                raise CliError(
                    f"{where} has {len(words)} words; this run takes at most {limit} "
                    f"(its translate_max_length)"
                )
            sentences.append(words)
    model = _load_model(folder, config, source, target)
    if args.bleu:
        texts = _bleu(args, config, source, target, model, held_out_bleu)
    else:
        unknown: list[str] = []
        for words in sentences:
            for word in source.unknown(words):
                if word not in unknown:  # each word once, across and within the sentences
                    unknown.append(word)
        if unknown:
            shown = ", ".join(repr(w) for w in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            print(
                f"clearformer translate: {len(unknown)} word(s) not in the run's vocabulary, "
                f"read as <unk>: {shown}{more}",
                file=sys.stderr,
            )
        decoded = translate_ids(
            model,
            [source.encode(words) for words in sentences],
            max_new_tokens=config.translate_max_length + 1,
            num_beams=args.beams,
            batch_size=args.batch_size,
        )
        texts = [join_words(target.decode(t)) for t in decoded]
    if out is not None:
        with atomic_write(out) as handle:
            handle.writelines(text + "\n" for text in texts)
    elif not args.bleu:
        for text in texts:
            print(text)
    return 0


def _bleu(args, config, source, target, model, held_out_bleu) -> list[str]:
    """The held-out sentences of the run, rebuilt from its config, decoded and scored."""
    import time

    from ..cli import CliError
    from ..train.tasks.translate import TranslateTask

    task = TranslateTask(config)  # the same pairs, split and vocabularies as in training
    if (task.source_vocab, task.target_vocab) != (source, target):
        raise CliError(
            f"--run {args.run}: its training data ({config.train_file}) now gives other "
            "vocabularies than the run's: the held-out sentences cannot be rebuilt"
        )
    started = time.perf_counter()
    score, texts = held_out_bleu(model, task, num_beams=args.beams, batch_size=args.batch_size)
    search = "greedy" if args.beams == 1 else f"beam {args.beams}"
    print(
        f"{score} -- {search}, {len(texts)} held-out sentences, lower-cased, 13a, "
        f"{time.perf_counter() - started:.1f}s"
    )
    return texts
