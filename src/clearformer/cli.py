"""The ``clearformer`` command line. Only this module and ``commands/`` print."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .commands import COMMANDS


class CliError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .runtime import retain_freed_memory

    retain_freed_memory()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("clearformer: interrupted", file=sys.stderr)
        return 130
    except (CliError, ValueError, TypeError, OSError, UnicodeDecodeError) as exc:
        if args.verbose:
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"clearformer {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
