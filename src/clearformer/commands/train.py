"""``clearformer train --task NAME --out RUN``: train a model into a run folder.

Every field of :class:`~clearformer.train.config.TrainConfig` is a flag (``lr`` ->
``--lr``, ``checkpointing`` -> ``--checkpointing / --no-checkpointing``). The config is the
defaults, then ``--config FILE.toml``, then the flags given; the flags given are recorded in
``RUN/invocations.jsonl``. Running the same command again resumes the run from its newest
complete checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import MISSING, fields

from .. import progress

_FLAG_TYPES = {"int": int, "float": float, "str": str}


def register(sub: argparse._SubParsersAction) -> None:
    from ..train.config import CHOICES, TASKS, TrainConfig
    from ..train.tomlfile import _field_comments

    p = sub.add_parser(
        "train",
        help=f"train a model into a run folder (--task: {', '.join(TASKS)})",
        description="Train a model into the run folder RUN: checkpoints, metrics.jsonl, the "
        "resolved config.toml and a loss plot. The same command again resumes the run. "
        "Default: the digits task (scikit-learn's bundled 8x8 images), a few minutes on a CPU.",
    )
    p.add_argument(
        "--out", metavar="RUN", help="the run folder (created; resumed if it holds a checkpoint)"
    )
    p.add_argument("--config", metavar="FILE", help="a TOML file of config fields (flags win)")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config as TOML and exit (no training)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    group = p.add_argument_group("configuration (every field of TrainConfig)")
    comments = _field_comments()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        what = comments.get(f.name, "")
        helptext = f"{what} (default {default!r})" if what else f"default {default!r}"
        helptext = helptext.replace("%", "%%")  # argparse formats help with %: "30%" is text
        common = {"dest": f"set_{f.name}", "default": argparse.SUPPRESS, "help": helptext}
        if f.type == "bool":
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **common)
        else:
            group.add_argument(
                flag,
                type=_FLAG_TYPES[f.type],
                choices=CHOICES.get(f.name),
                metavar=f.name.upper() if f.name not in CHOICES else None,
                **common,
            )
    p.set_defaults(func=run, writes_stdout=lambda args: args.print_config)


def resolve(args: argparse.Namespace):
    """The config: defaults < --config file < flags; and the flags given."""
    from ..cli import CliError
    from ..train.config import TrainConfig, check_model_files
    from ..train.tomlfile import read_toml

    overrides = {k[4:]: v for k, v in vars(args).items() if k.startswith("set_")}
    base = read_toml(args.config) if args.config else {}
    source = args.config or "the command line"
    try:
        config = TrainConfig.from_dict({**base, **overrides}, source=source)
        check_model_files(config)  # a missing model refused now, not at the first evaluation
    except (TypeError, ValueError) as exc:
        # A field's own message starts with its name: say where the bad value came from.
        name = str(exc).split(" ", 1)[0]
        if name in overrides:
            raise CliError(f"--{name.replace('_', '-')}: {exc}") from None
        if name in base:
            raise CliError(f"{args.config}: {exc}") from None
        raise
    return config, overrides


def run(args: argparse.Namespace) -> int:
    from ..cli import CliError

    config, overrides = resolve(args)  # every field checked before any work
    if args.print_config:
        from ..train.tomlfile import dump_toml

        sys.stdout.write(dump_toml(config))
        return 0
    if not args.out:
        raise CliError("--out RUN is required: the folder the run is written to")
    printer = _Printer(config.steps, quiet=args.quiet)
    # Said before PyTorch is imported, which alone takes seconds.
    printer.say(f"the {config.task} task, {config.steps:,} steps, into {args.out}")
    from ..train import train

    invocation = {
        "argv": sys.argv[1:],
        "config_file": args.config,
        "overrides": overrides,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with _stop_on_signal() as requested:
        result = train(
            config,
            args.out,
            progress=printer,
            invocation=invocation,
            should_stop=lambda: requested["signal"] is not None,
        )
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun, rank 0 reports for all
    if result.interrupted:
        signum = requested["signal"]
        print(
            f"clearformer train: stopped at step {result.step} by {signal.Signals(signum).name}"
            f"; its checkpoint is written: run the same command to resume",
            file=sys.stderr,
        )
        return 128 + signum
    best = f"{result.best:.4f} at step {result.best_step}" if result.best is not None else "-"
    ended = "stopped early" if result.stopped_early else "finished"
    print(
        f"clearformer train: {ended} at step {result.step}; best {result.metric}"
        f" {best}; wrote {result.run_dir}",
        file=sys.stderr,
    )
    return 0


class _Printer:
    """Progress lines on stderr, from the loop's events: each phase of the set-up as it
    begins, then each training record with the pace of the steps and the time left."""

    def __init__(self, steps: int, *, quiet: bool) -> None:
        self.steps, self.quiet = steps, quiet
        self.started = time.perf_counter()
        self.first_step, self.training_since = 0, self.started
        # Under torchrun every rank runs the command; rank 0 speaks for all.
        self.speaks = os.environ.get("RANK", "0") == "0"

    def say(self, message: str) -> None:
        if self.speaks and not self.quiet:
            print(f"clearformer train: {message}", file=sys.stderr, flush=True)

    def __call__(self, event: str, record: dict) -> None:
        if event == "resume":
            print(
                f"clearformer train: resuming from {record['checkpoint']} (step {record['step']})",
                file=sys.stderr,
            )
        if event == "phase":
            self.say(f"{record['message']}...")
        elif event == "start":
            self.first_step, self.training_since = record["step"], time.perf_counter()
            self.say(
                f"training {record['parameters']:,} parameters from step {record['step']} to "
                f"{record['steps']}, a line every {record['log_every']} steps"
            )
        if self.quiet:
            return
        if event == "train":
            now = time.perf_counter()
            pace = progress.pace(
                record["step"] - self.first_step,
                self.steps - self.first_step,
                now - self.training_since,
                "steps",
            )
            print(
                f"step {record['step']:>6}/{self.steps}  epoch {record['epoch']:>3}  loss "
                f"{record['loss']:.4f}  lr {record['lr']:.2e}  grad {record['grad_norm']:.3f}"
                f"  {now - self.started:6.1f}s  {pace}",
                file=sys.stderr,
                flush=True,
            )
        elif event == "eval":
            scores = "  ".join(
                f"{k[5:]} {v:.4f}" for k, v in record.items() if k.startswith("eval_")
            )
            best = "  (best)" if record["best"] else ""
            print(f"eval {record['step']:>6}  {scores}{best}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stop_on_signal():
    """SIGINT / SIGTERM ask the loop to stop after the current step, checkpointed (a step
    cut in the middle of the optimizer's update could not be saved); a second one stops at
    once, as everywhere else in the CLI."""
    requested: dict = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def ask(signum, frame):
        if requested["signal"] is not None:
            raise KeyboardInterrupt  # the second: now (the newest checkpoint is complete)
        requested["signal"] = signum
        print(
            "clearformer train: stopping after this step, with a checkpoint (again: stop now)",
            file=sys.stderr,
            flush=True,
        )

    previous = {s: signal.signal(s, ask) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
