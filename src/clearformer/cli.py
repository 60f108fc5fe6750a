"""The ``clearformer`` command line. Only this module and ``commands/`` print.

Nothing heavy is imported before the arguments are parsed (``clearformer --help`` imports no
torch); each command imports what it needs when it runs.

Faults the process itself meets are handled here, for every command:

* a closed stdin, stdout or stderr (the shell's ``0<&-``, ``>&-``) is an error naming the
  stream when a command needs it, never a traceback; the closed descriptors are first pointed
  at ``/dev/null`` so that no file the command opens takes their number;
* SIGTERM is handled like Ctrl-C (SIGINT): the command stops, an output being written is
  removed (``clearformer.io.atomic_write``), and the exit status is 143 (130 for SIGINT),
  the process ending without the interpreter's finalization (:func:`entry` says why).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

from .commands import COMMANDS
from .progress import LOGGER_NAME as PROGRESS_LOGGER

EXIT_SIGINT = 130  # 128 + SIGINT, as shells report it
EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_SIGPIPE = 128 + 13  # as a shell reports a command killed by SIGPIPE (`yes | head -1`)


class CliError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM. A BaseException, like KeyboardInterrupt, so that
    no ``except Exception`` swallows it and every ``finally`` and atomic write cleans up."""


class _HelpShowsDefaults(argparse.HelpFormatter):
    """``--help`` names the default of every option that takes a value, unless its help
    already says it: a reader should not have to guess what ``-k`` shows when not given."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or action.nargs == 0  # a switch: its default is its absence
            or default is None
            or default is argparse.SUPPRESS
            or "default" in text
        ):
            return action.help
        return f"{text} (default %(default)s)".lstrip()


class CommandParser(argparse.ArgumentParser):
    """The parser of ``clearformer`` and of each command under it.

    An argument no parser knows is reported by the innermost command's parser, with that
    command's usage and the closest option it has (``clearformer train --lrr``: did you mean
    ``--lr``?). argparse would hand it up to the top-level parser, whose usage names no
    option of the command.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpShowsDefaults)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return namespace, extras

    def _unrecognized(self, extras: list[str]) -> str:
        guesses = []
        for arg in extras:
            if not arg.startswith("-") or arg == "-":
                continue  # a value or a stray word: nothing to compare with the options
            flag = arg.split("=", 1)[0]
            close = difflib.get_close_matches(flag, list(self._option_string_actions), n=1)
            if close:
                guesses.append((flag, close[0]))
        message = f"unrecognized arguments: {' '.join(extras)}"
        if len(guesses) == 1:
            return f"{message} (did you mean {guesses[0][1]}?)"
        if guesses:
            meant = ", ".join(f"{close} for {flag}" for flag, close in guesses)
            return f"{message} (did you mean {meant}?)"
        return message


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="clearformer",
        description="A readable, verified and fast Transformer encoder.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def _occupy_closed_descriptors() -> None:
    """Open /dev/null on each of fds 0-2 that is closed.

    Python sets ``sys.stdin``/``sys.stdout``/``sys.stderr`` to None for a descriptor closed
    at start-up, and the next file opened would take its number: an output file on fd 1
    would then receive whatever a library prints to stdout.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # a lower number was free after all: leave fd alone
                os.close(opened)


def _on_sigterm(signum, frame) -> None:
    raise Terminated


def _report(args, exc: BaseException) -> int:
    """One line naming the command and the error on stderr; exit status 2."""
    if args.verbose:
        raise exc
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"clearformer {args.command}: error: {message}", file=sys.stderr)
    return 2


def _show_progress(args) -> logging.Handler | None:
    """Long work's phases and progress (``clearformer.progress``) as lines on stderr, by
    default: "clearformer serve: calibrating kernels for this CPU (once per machine)...".
    Not with ``-q``. Returns the handler, removed when the command ends."""
    if getattr(args, "quiet", False):
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"clearformer {args.command}: %(message)s"))
    logger = logging.getLogger(PROGRESS_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # shown once, also under --verbose
    return handler


def _hide_progress(handler: logging.Handler | None) -> None:
    if handler is None:
        return
    logger = logging.getLogger(PROGRESS_LOGGER)
    logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


def _stdout_reader_gone() -> bool:
    """stdout is a pipe or socket whose reader has closed it (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll here, or stdout is not a real file
        return False


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout already gone or not a real file
        pass


def main(argv: list[str] | None = None) -> int:
    _occupy_closed_descriptors()
    if sys.stderr is None:
        # print(file=None) writes to stdout: messages must not land among the results.
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 -- lives as long as the process
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    writes_stdout = getattr(args, "writes_stdout", lambda args: True)
    if sys.stdout is None and writes_stdout(args):
        print(
            f"clearformer {args.command}: error: stdout is closed, and this command writes its "
            "results there" + getattr(args, "stdout_hint", ""),
            file=sys.stderr,
        )
        return 2
    from .runtime import retain_freed_memory

    retain_freed_memory()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    progress = _show_progress(args)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("clearformer: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except Terminated:
        print("clearformer: terminated", file=sys.stderr)
        return EXIT_SIGTERM
    except BrokenPipeError as exc:
        if not _stdout_reader_gone():
            return _report(args, exc)  # another pipe broke (stderr's reader): a real error
        # The reader of stdout went away (`clearformer encode ... | head -1`): stop quietly,
        # as a Unix tool does, with no message among the reader's results and no second error
        # when the interpreter flushes stdout at exit.
        _silence_stdout()
        return EXIT_SIGPIPE
    except (CliError, ValueError, TypeError, OSError, UnicodeDecodeError) as exc:
        return _report(args, exc)
    except ImportError as exc:
        # An optional package this command needs (bm25s, usearch, pyarrow, ...) is missing or
        # broken: one line naming it, as for any other fault of the setup.
        name = getattr(exc, "name", None)
        hint = f" (pip install {name})" if name and "pip install" not in str(exc) else ""
        return _report(args, CliError(f"{exc}{hint}"))
    finally:
        _hide_progress(progress)
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def entry() -> NoReturn:
    """The ``clearformer`` command: :func:`main`, then the process ends with its status.

    A run stopped by a signal ends at once, without the interpreter's finalization: a batch
    worker may still be inside a forward pass (torch's C++ code), and a thread that takes the
    GIL back during finalization is ended with pthread_exit, whose unwinding cannot pass that
    frame: "terminate called without an active exception" and SIGABRT (134) instead of the
    promised 130 or 143. By then the outputs being written were removed (the exception passed
    through their ``atomic_write``) and nothing is left to do but flush."""
    status = main()
    if status in (EXIT_SIGINT, EXIT_SIGTERM):
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    # Run as ``python -m clearformer.cli`` this file is ``__main__``, a second copy of the
    # module whose CliError is not the clearformer.cli.CliError the commands raise: run the
    # package's own copy.
    from clearformer.cli import entry as package_entry

    package_entry()
