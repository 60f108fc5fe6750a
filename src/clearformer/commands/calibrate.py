"""``clearformer calibrate``: measure clearformer's kernels against PyTorch's routes on this
CPU, cache the verdicts ``auto`` reads, and print them.

Measures only where nothing is cached for this CPU model, PyTorch, clearformer and kernel
build (``--force`` measures again); ``--show`` prints what is cached and measures nothing. It
builds the AVX-512 library first where it is not built (a few seconds, once). On a CPU without
AVX-512 there is nothing to measure: it says so and exits 0.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure clearformer's kernels against PyTorch's routes on this CPU",
        description="Times each of clearformer's own kernels (AVX-512 attention and linear) "
        "against the PyTorch route it replaces, at MiniLM-sized shapes, alternating, a few "
        "rounds; caches the verdicts per CPU model and software version, where `auto` reads "
        "them (a kernel is taken only where it measured decisively faster). Takes a few "
        "seconds; run it on a machine where nothing else is busy.",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="measure again even where verdicts for this CPU and build are cached",
    )
    p.add_argument(
        "--show",
        action="store_true",
        help="print the cached verdicts and what auto takes now; measure nothing",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..cli import CliError

    if args.force and args.show:
        raise CliError("--force measures and --show does not: give one of them")
    from ..calibration import cache
    from ..calibration.kernels import calibrate
    from ..fast import avx512
    from ..machine import machine

    supported = machine().avx512
    if supported.choice != "available":
        print(
            f"nothing to measure on this machine: {supported.reason}; auto keeps PyTorch's routes"
        )
        return 0
    key = avx512.calibration_key()
    if args.show:
        verdicts = cache.read(key)
        if verdicts is None:
            print(
                f"no verdicts cached for {key.describe()} (looked in {key.path()}); "
                "`clearformer calibrate` measures them"
            )
            return 1
        _print_table(verdicts, key, key.path(), "cached")
        return 0
    result = calibrate(force=args.force)
    if not result.verdicts:
        raise CliError(result.reason)
    _print_table(result.verdicts, key, result.path, "measured now" if result.measured else "cached")
    return 0


def _print_table(verdicts: dict, key, path, how: str) -> None:
    from ..fast import avx512
    from ..routes import kernel_route

    print(f"clearformer's kernels against PyTorch's routes: {key.describe()} ({how})")
    print(f"verdicts: {path}")
    print()
    print("| kernel | speed vs PyTorch (geometric mean) | measured winner | auto takes now |")
    print("| --- | ---: | --- | --- |")
    for name, verdict in verdicts.items():
        now = kernel_route(name) if name in avx512.KERNELS else None
        takes = "" if now is None else f"{now.choice} ({now.reason})"
        print(f"| {name} | {verdict.speedup():.2f}x | {verdict.winner} | {takes} |")
    for name, verdict in verdicts.items():
        candidates = [verdict.baseline, *(c for c in verdict.speedups if c != verdict.baseline)]
        print()
        loaded = " LOADED while measured:" if verdict.context.get("loaded") else ""
        print(
            f"{name}: {verdict.reason} (margin {verdict.margin:.0%}, {verdict.rounds} rounds, "
            f"medians; {verdict.context.get('threads', '?')} threads;{loaded} "
            f"{verdict.context.get('load', 'load not recorded')})"
        )
        print("| workload | " + " | ".join(f"{c} ms" for c in candidates) + " |")
        print("| --- |" + " ---: |" * len(candidates))
        for workload, seconds in verdict.seconds.items():
            cells = " | ".join(f"{seconds[c] * 1e3:.2f}" for c in candidates)
            print(f"| {workload} | {cells} |")
