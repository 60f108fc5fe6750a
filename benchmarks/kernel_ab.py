"""Every kernel clearformer builds itself against the PyTorch route it replaces, in one process,
alternating, on the CPU at hand; and whether ``auto`` takes the faster side.

Kernels (``--kernels``):

``avx512_attention``  clearformer's AVX-512 attention (packed rows and unpadded sequences)
                      against the varlen method ``auto`` takes without it and SDPA's flash kernel
``avx512_linear``     clearformer's AVX-512 products with their GELU or LayerNorm epilogue
                      against oneDNN's fused products (weights reordered once, as ``encode`` runs)
``int8_steps``        the int8 layers' element-wise steps compiled by ``torch.compile`` against
                      the same steps eager (``encode(precision="int8", fuse_int8=...)``; the
                      first compile takes a minute or more on two cores)

Two levels (``--levels``):

``ops``     the calibration's workloads (:mod:`clearformer.calibration.kernels`: MiniLM's shapes,
            short ragged batches and one 512-token sequence), each side timed alternately
            ``--rounds`` rounds, medians
``encode``  whole ``TextEncoder.encode`` calls of the bundled MiniLM on ``--texts`` synthetic
            texts, each kernel switched on and off between calls (``CLEARFORMER_AVX512_ATTENTION``
            / ``CLEARFORMER_AVX512_LINEAR``, the library's other kernel off on both sides; the
            compiled int8 steps by ``fuse_int8``), alternating, ``--rounds`` rounds, medians

For each kernel the report names what ``auto`` takes here and why (the switches and this CPU's
cached verdict, :func:`clearformer.routes.kernel_route`), the faster side (whole ``encode``
calls where measured, else the operations; within ``MARGIN`` it is a tie, where either choice
is right), and whether the two match. It also names the CPU and the load: other
processes' CPU time counted before and during the run (:mod:`clearformer.bench.load`; a LOADED
run does not reproduce). Nothing needs stopping: run it where nothing else is busy.

    python benchmarks/kernel_ab.py --out kernel-ab            # writes kernel-ab.json and .md
    python benchmarks/kernel_ab.py --texts 40 --rounds 1 --kernels avx512_attention   # a try
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from clearformer.io import write_text_atomically

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

KERNELS = ("avx512_attention", "avx512_linear", "int8_steps")
LEVELS = ("ops", "encode")
# The variable that switches one AVX-512 kernel alone (clearformer.switches).
OWN_VARIABLE = {
    "avx512_attention": "CLEARFORMER_AVX512_ATTENTION",
    "avx512_linear": "CLEARFORMER_AVX512_LINEAR",
}
SWITCHES = (
    "CLEARFORMER_KERNELS",
    "CLEARFORMER_AVX512",
    "CLEARFORMER_AVX512_ATTENTION",
    "CLEARFORMER_AVX512_LINEAR",
)


def _names(text: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{option}: expected a comma-separated subset of {','.join(allowed)}, got {text!r}"
        )
    return names


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--kernels",
        type=lambda t: _names(t, KERNELS, "--kernels"),
        default=KERNELS,
        help=f"comma-separated kernels to compare (default {','.join(KERNELS)})",
    )
    parser.add_argument(
        "--levels",
        type=lambda t: _names(t, LEVELS, "--levels"),
        default=LEVELS,
        help="comma-separated: ops (the calibration's workloads), encode (whole encode calls) "
        "(default both)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=7,
        help="timed rounds of each side, alternating; medians reported (default %(default)s)",
    )
    parser.add_argument(
        "--texts",
        type=int,
        default=2000,
        help="synthetic texts per encode call (sentences up to paragraphs; default %(default)s)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own)"
    )
    parser.add_argument(
        "--no-build",
        action="store_true",
        help="do not build the AVX-512 library where it is not built yet (its kernels are then "
        "reported as not run)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write OUT.json and OUT.md (default: print only)",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.texts < 1:
        parser.error(f"--rounds and --texts must be at least 1, got {args.rounds}, {args.texts}")
    return args


@contextlib.contextmanager
def environment(**settings: str | None):
    """Within the block, the switches as given (None: unset); restored after."""
    saved = {name: os.environ.get(name) for name in SWITCHES}
    try:
        for name in SWITCHES:
            os.environ.pop(name, None)
        for name, value in settings.items():
            if value is not None:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def sides_of(kernel: str) -> dict[str, dict[str, str]]:
    """The switches of PyTorch's side and of the kernel's side of a whole-call A/B: the kernel
    alone on (unmeasured) or off, the library's other kernels off on both sides."""
    if kernel == "int8_steps":
        return {"torch": {}, "clearformer": {}}  # fuse_int8 decides, per call
    own = OWN_VARIABLE[kernel]
    others = dict.fromkeys((v for v in OWN_VARIABLE.values() if v != own), "off")
    return {"torch": {own: "off", **others}, "clearformer": {own: "on", **others}}


def ops_level(kernel: str, rounds: int) -> dict:
    """The calibration's workloads of ``kernel``, measured with more rounds."""
    import torch

    from clearformer.calibration.kernels import attention_workloads, linear_workloads
    from clearformer.calibration.measure import measure_choice

    if kernel == "int8_steps":
        return {"skipped": "int8's steps are compared in whole encode calls only"}
    work = attention_workloads() if kernel == "avx512_attention" else linear_workloads()
    with torch.inference_mode():
        verdict = measure_choice(kernel, work, baseline="torch", rounds=rounds)
    return {
        "speedup": verdict.speedups["avx512"],
        "seconds": verdict.seconds,
        "reason": verdict.reason,
    }


def encode_level(kernel: str, encoder, texts: list[str], rounds: int) -> dict:
    """Whole encode calls, the kernel on and off, alternating."""
    sides = sides_of(kernel)
    int8 = kernel == "int8_steps"
    options = {"progress": False}
    if int8:
        options["precision"] = "int8"
        encoder.int8_model(fused=True)  # calibration and compilation, before any timing
    calls = {
        name: (
            lambda env=env, fuse=name == "clearformer": _timed(
                encoder, texts, env, options, fuse if int8 else None
            )
        )
        for name, env in sides.items()
    }
    for call in calls.values():
        call()  # warm-up: packing, compilation, first calls
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(rounds):
        order = list(calls) if round_ % 2 == 0 else list(calls)[::-1]
        for name in order:
            seconds[name].append(calls[name]())
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    ratios = [t / c for t, c in zip(seconds["torch"], seconds["clearformer"], strict=True)]
    return {
        "texts_per_s": {name: len(texts) / s for name, s in medians.items()},
        "seconds": seconds,
        "speedup": medians["torch"] / medians["clearformer"],
        "paired_ratios": ratios,
        "environments": sides,
    }


def _timed(encoder, texts, env, options, fuse_int8) -> float:
    extra = {} if fuse_int8 is None else {"fuse_int8": fuse_int8}
    with environment(**env):
        started = time.perf_counter()
        encoder.encode(texts, **options, **extra)
        return time.perf_counter() - started


def auto_choice(kernel: str, texts: list[str], encoder) -> tuple[str, str]:
    """What ``auto`` takes for ``kernel`` here, with the switches as the caller set them."""
    if kernel == "int8_steps":
        from clearformer import switches
        from clearformer.text.encoder import FUSED_INT8_MIN_TOKENS

        setting = switches.kernel_setting("int8_steps")
        tokens = sum(len(e.ids) for e in encoder.tokenizer.encode(texts))
        if setting.choice == "off":
            return "torch", setting.reason
        fused = tokens >= FUSED_INT8_MIN_TOKENS
        why = f"{tokens} tokens {'>=' if fused else '<'} FUSED_INT8_MIN_TOKENS (unmeasured)"
        return ("clearformer" if fused else "torch"), why
    from clearformer.routes import kernel_route

    route = kernel_route(kernel)
    return ("clearformer" if route.choice == "avx512" else "torch"), route.reason


def judge_match(result: dict, margin: float) -> None:
    """The faster side (whole calls where measured, else the operations) and whether auto's
    choice is it (``yes``, ``no``); within ``margin`` a ``tie``, where either choice is right."""
    level = "encode" if "speedup" in result.get("encode", {}) else "ops"
    speedup = result.get(level, {}).get("speedup")
    if speedup is None:
        result.update(faster="not measured", matches="not measured")
        return
    if abs(speedup - 1) < margin:
        # Neither side is faster: either choice is as good (auto's own rule keeps PyTorch's).
        result["faster"] = f"tie ({speedup:.2f}x, within {margin:.0%}; {level})"
        result["matches"] = "tie"
        return
    faster = "clearformer" if speedup > 1 else "torch"
    result["faster"] = f"{faster} ({speedup:.2f}x; {level})"
    result["matches"] = "yes" if result["auto"] == faster else "no"


def to_markdown(report: dict) -> str:
    lines = [
        "# clearformer's own kernels against PyTorch's routes (A/B in one process)",
        "",
        f"CPU: {report['cpu']['summary']}. torch {report['torch']}, {report['threads']} threads, "
        f"{report['rounds']} rounds each side, alternating; {report['texts']} texts per encode "
        "call.",
        "",
        f"Machine: {report['load']['verdict']}",
        "",
        "| kernel | ops: kernel vs PyTorch | encode: kernel vs PyTorch | faster | auto takes | "
        "auto matches |",
        "| --- | ---: | ---: | --- | --- | --- |",
    ]
    for name, result in report["kernels"].items():
        ops = result.get("ops", {}).get("speedup")
        enc = result.get("encode", {}).get("speedup")
        lines.append(
            f"| {name} | {'-' if ops is None else f'{ops:.2f}x'} | "
            f"{'-' if enc is None else f'{enc:.2f}x'} | {result['faster']} | "
            f"{result['auto']} ({result['auto_reason']}) | {result['matches']} |"
        )
    for name, result in report["kernels"].items():
        if "not_run" in result:
            lines += ["", f"{name}: not run: {result['not_run']}"]
        seconds = result.get("ops", {}).get("seconds", {})
        if seconds:
            lines += [
                "",
                f"{name}, operations (medians):",
                "",
                "| workload | PyTorch ms | clearformer ms | speed-up |",
                "| --- | ---: | ---: | ---: |",
            ]
            for workload, both in seconds.items():
                lines.append(
                    f"| {workload} | {both['torch'] * 1e3:.2f} | {both['avx512'] * 1e3:.2f} | "
                    f"{both['torch'] / both['avx512']:.2f}x |"
                )
        encode = result.get("encode", {})
        if "texts_per_s" in encode:
            each = " ".join(f"{r:.2f}" for r in encode["paired_ratios"])
            lines += [
                "",
                f"{name}, whole encode calls: PyTorch {encode['texts_per_s']['torch']:.1f} "
                f"texts/s, clearformer {encode['texts_per_s']['clearformer']:.1f} texts/s; "
                f"each round's ratio: {each}",
            ]
    return "\n".join(lines) + "\n"


def main() -> int:
    args = parse_args()
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from clearformer import TextEncoder
    from clearformer.bench.load import LoadMeter
    from clearformer.calibration.measure import MARGIN
    from clearformer.cpu import cpu_description
    from clearformer.fast import avx512
    from clearformer.machine import machine
    from clearformer.quant.int8 import int8_support
    from encode_throughput import make_corpus

    meter = LoadMeter(threads=torch.get_num_threads()).start()
    encoder = TextEncoder.from_pretrained()
    texts = make_corpus(args.texts, "mixed", seed=7)
    library = machine().avx512
    if library.choice == "available":
        library = avx512.load(build=not args.no_build)
    results: dict[str, dict] = {}
    for kernel in args.kernels:
        auto, why = auto_choice(kernel, texts, encoder)
        result = {"auto": auto, "auto_reason": why}
        results[kernel] = result
        if kernel != "int8_steps" and library.choice != "loaded":
            result["not_run"] = f"the AVX-512 library is {library.choice}: {library.reason}"
        elif kernel == "int8_steps" and not int8_support().available:
            result["not_run"] = f"no int8 here: {int8_support().reason}"
        else:
            if "ops" in args.levels:
                result["ops"] = ops_level(kernel, args.rounds)
            if "encode" in args.levels:
                print(f"{kernel}: whole encode calls ...", flush=True)
                result["encode"] = encode_level(kernel, encoder, texts, args.rounds)
        judge_match(result, MARGIN)
        print(
            f"{kernel}: faster {result['faster']}; auto takes {auto}; matches {result['matches']}",
            flush=True,
        )
    load = meter.record()
    report = {
        "cpu": cpu_description(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "texts": args.texts,
        "levels": list(args.levels),
        "load": {**load.to_dict(), "verdict": load.describe()},
        "kernels": results,
    }
    markdown = to_markdown(report)
    print(markdown)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(args.out.with_suffix(".json"), json.dumps(report, indent=1) + "\n")
        write_text_atomically(args.out.with_suffix(".md"), markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
