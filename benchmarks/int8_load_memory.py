"""Peak memory of loading a model in int8: the float32 model whole and converted in place,
against each layer read and converted in turn (``TextEncoder.from_pretrained(precision=
"int8")``), beside a float32 load.

Each load runs in a process of its own, which then encodes four sentences and reports its peak
resident memory (``VmHWM``: the interpreter, the libraries, the weights and the work), with
glibc's default allocator settings and with freed memory kept
(``clearformer.runtime.retain_freed_memory``, as the ``clearformer`` commands run).

Run: ``python benchmarks/int8_load_memory.py [--model DIR] [--out FILE.md]``; without
``--model``, the Qwen3-Embedding-0.6B shape of ``families_speed.py`` (random weights) is
written to a temporary folder first (a minute or two). Linux only (``/proc/self/status``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from clearformer.io import write_text_atomically

LOADS = ("float32", "int8-whole", "int8")
NAMES = {
    "float32": "float32",
    "int8-whole": "int8, the whole float32 model converted in place",
    "int8": "int8, a layer at a time",
}


def peak_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024


def child(load: str, path: str, keep_freed: bool) -> None:
    if keep_freed:
        from clearformer.runtime import retain_freed_memory

        retain_freed_memory()
    from clearformer import TextEncoder

    before = peak_mib()
    if load == "int8-whole":  # the float32 model read whole, then converted in place
        from clearformer.options import Decision
        from clearformer.text.encoder_files import read_encoder_parts

        parts = read_encoder_parts(
            path, backend="auto", strict=True, padding_side=None, truncate_dim=None
        )
        encoder = TextEncoder.from_parts(parts, held=Decision("int8", "whole"))
        del parts
    else:
        encoder = TextEncoder.from_pretrained(path, precision=load)
    encoder.encode(["the cat sat on the mat", "rates rose", "a third sentence", "a fourth"])
    print(json.dumps({"before_mib": before, "peak_mib": peak_mib()}))


def measure(load: str, path: str, keep_freed: bool) -> dict:
    command = [sys.executable, __file__, "--child", load, "--model", path]
    if keep_freed:
        command.append("--keep-freed")
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: Qwen3 shape)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to FILE.md")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--keep-freed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model, args.keep_freed)
        return
    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_info

    meter = LoadMeter(threads=os.cpu_count() or 1).start()
    with tempfile.TemporaryDirectory() as work:
        path = args.model
        if path is None:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from families_speed import write_model

            path = str(write_model("qwen3", Path(work) / "qwen3", None))
        size = sum(f.stat().st_size for f in Path(path).glob("*.safetensors")) / 2**20
        rows = []
        for load in LOADS:
            default = measure(load, path, keep_freed=False)
            kept = measure(load, path, keep_freed=True) if load != "float32" else None
            rows.append((load, default, kept))
    machine = meter.record().describe()
    lines = [
        "# Peak memory of a load in int8",
        "",
        f"CPU: {cpu_info().summary()}; model {path} ({size:,.0f} MiB of safetensors)",
        "",
        f"Machine: {machine}",
        "",
        "| load | glibc's default | freed memory kept (as the commands run) |",
        "| --- | ---: | ---: |",
    ]
    for name, default, kept in rows:
        kept_text = f"{kept['peak_mib']:,.0f} MiB" if kept else ""
        lines.append(f"| {NAMES[name]} | {default['peak_mib']:,.0f} MiB | {kept_text} |")
    lines += [
        "",
        f"Before each load: {rows[0][1]['before_mib']:,.0f} MiB (interpreter, libraries).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(args.out, text)


if __name__ == "__main__":
    main()
