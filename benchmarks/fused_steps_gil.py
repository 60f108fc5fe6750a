"""How long a Python thread beside an int8 fused step waits for the GIL while the step runs.

The suite checks that the compiled steps release the GIL without a clock
(``tests/test_int8.py::test_fused_steps_let_other_threads_run``: what decides there is which
value the step read, not when). This reports the figure the suite's earlier, timed check
decided on: a second thread notes the time in a Python loop while the first runs a step on a
large input, and the longest gap between its notes, as a share of the step's time alone, is
about 1 for a step that holds the GIL (the watcher notes nothing while the kernel runs) and
below that for one that releases it, by how much depending on how the cores are shared (beside
the suite's other process it was 0.56 in single tries and 0.816 in a CI run that failed the
old check's limit of 0.8), so the load average is printed with it.

Run: ``python benchmarks/fused_steps_gil.py`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time


def longest_gap(call) -> float:
    """Seconds: the longest stretch during ``call()`` in which a second thread, noting the time
    in a Python loop, noted nothing."""
    stamps: list[float] = []
    started, done = threading.Event(), threading.Event()

    def note_times() -> None:
        started.set()
        while not done.is_set():
            stamps.append(time.perf_counter())

    watcher = threading.Thread(target=note_times)
    watcher.start()
    started.wait()
    begin = time.perf_counter()
    call()
    end = time.perf_counter()
    done.set()
    watcher.join()
    inside = [begin] + [t for t in stamps if begin < t < end] + [end]
    return max(b - a for a, b in zip(inside[:-1], inside[1:], strict=True))


def alone(call, repeats: int = 3) -> float:
    """Seconds: the fastest of ``repeats`` calls with no other thread running."""
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The longest wait of a Python thread beside each int8 fused step, as a "
        "share of the step's time alone (about 1: the step holds the GIL).",
    )
    parser.add_argument("--rows", type=int, default=4096, help="rows of the input (4096)")
    parser.add_argument("--width", type=int, default=2048, help="columns of the input (2048)")
    parser.add_argument(
        "--tries", type=int, default=10, help="tries per step; the smallest share is kept (10)"
    )
    parser.add_argument(
        "--wrapper",
        choices=("cpp", "default"),
        default="cpp",
        help="Inductor's C++ wrapper, which clearformer compiles with and which releases the "
        "GIL (cpp), or its default Python wrapper, which holds it while a kernel runs",
    )
    args = parser.parse_args(argv)

    import torch

    from clearformer.quant import fused
    from clearformer.quant.onednn import accumulator_dtype

    steps = fused._compiled_steps(fused.COMPILE_OPTIONS if args.wrapper == "cpp" else {})
    m, k = args.rows, args.width
    torch.manual_seed(0)
    rows = torch.randn(m, k)
    keep = torch.ones(k)
    keep[3] = 0
    outliers = torch.tensor([3])
    acc = torch.randint(-1000, 1000, (m, k), dtype=torch.int32).to(accumulator_dtype())
    x_scale, w_scale, bias = torch.rand(m, 1), torch.rand(k), torch.rand(k)
    x_o, w_o_t = torch.rand(m, 1), torch.rand(1, k)
    calls = {  # the arguments' kinds of fused_steps' own warm-up: no new compile
        "prologue": lambda: steps.prologue(rows, None, keep, outliers),
        "epilogue": lambda: steps.epilogue(acc, x_scale, w_scale, bias, x_o, w_o_t),
    }

    from clearformer.bench.load import LoadMeter

    meter = LoadMeter(threads=2).start()  # the step's thread and the watcher
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # the watcher gets the GIL back at once when it is free
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as each encode worker runs
    try:
        for name, call in calls.items():
            call()  # warm-up
            solo = alone(call)
            share = math.inf
            for _ in range(args.tries):
                share = min(share, longest_gap(call) / solo)
            print(
                f"{name:9s} alone {solo * 1e3:8.2f} ms   longest wait beside it "
                f"{share * solo * 1e3:8.2f} ms = {share:.3f} of the step "
                f"(smallest of {args.tries}; {args.wrapper} wrapper)"
            )
    finally:
        sys.setswitchinterval(interval)
        torch.set_num_threads(before)
    print(meter.record().describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
