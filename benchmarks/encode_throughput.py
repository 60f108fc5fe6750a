"""Sentence-encoding throughput: clearformer's ``TextEncoder`` against sentence-transformers.

Both encode the same texts with the bundled all-MiniLM-L6-v2, in one process, under the same
allocator setting (glibc keeps freed memory, see ``clearformer.runtime.retain_freed_memory``),
taking turns chunk by chunk so that drift and bursts of load hit every configuration alike.
Two synthetic corpora, built from the model's own vocabulary so nothing is downloaded:

``sentences``  word counts log-normal around 16 (from 3 to 80 words): sentence-like texts.
``mixed``      word counts log-uniform from 3 to 300: sentences with a tail of paragraphs past
               the 256-piece limit, where attention weighs more.

Configurations:

``sentence-transformers``       its ``encode`` with its defaults (batch_size=32); the reference.
``clearformer``                 ``TextEncoder.encode`` with its defaults (batches of at most
                                4096 padded tokens, two side by side on a CPU, each on one
                                half of the threads: ``workers=None``).
``clearformer workers 1``       its default batches, one at a time on all threads.
``clearformer batch 32``        ``batch_size=32, workers=1``: batches of the reference's size,
                                one at a time on all threads.
``clearformer int8``            ``precision="int8"``: int8 linear layers, element-wise steps
                                eager (``fuse_int8=False``).
``clearformer int8 fused``      ``precision="int8", fuse_int8=True``: the same, with the
                                element-wise steps compiled (compiled before timing starts).
``clearformer int8 fused workers 1``  the same, one batch at a time on all threads.
``clearformer bf16``            ``precision="bf16"``: the bfloat16 copy of the model (bfloat16
                                products, float32 norms, softmax and pooling).
``clearformer bf16 workers 1``  the same, one batch at a time on all threads.
``clearformer auto``            ``precision="auto"``: what auto takes on this CPU (the
                                environment records which and why).

``onnxruntime``, ``onnxruntime optimised``, ``onnxruntime int8``, ``onnxruntime int8 per-channel``,
``onnxruntime int8 per-channel, attention float32``
                                ONNX Runtime, float32 and int8, built by the benchmark from
                                the local checkpoint (:mod:`onnxruntime_encoder` describes
                                each; the ``onnx`` extra). ``--no-onnx`` leaves them out.

Every row is compared with clearformer's float32 embeddings: min and mean cosine, and how
often a text's nearest neighbour in the corpus (itself left out) is the one float32 finds
(retrieval agreement). ``--precision`` names the precisions timed besides float32 (default
int8; ``--precision bf16 int8 auto`` times them all); ``--no-int8`` leaves clearformer's int8
rows out. Each figure is the sum
of every chunk's best time; for the pairs in ``PAIRS`` the report also gives the ratio within
each whole repeat, whose spread shows how far one figure can move between runs.

The float32 bound: the corpus's matrix products on real tokens only (the four weight products
of every layer and attention's two, :func:`clearformer.bench.flops.forward_flops`) at the
machine's float32 GEMM rate at MiniLM's layer shapes (:func:`clearformer.bench.gemm.gemm_rate`,
the fastest of the readings before and after the corpus, of ``torch.matmul`` and oneDNN's
linear op). "of bound" is a configuration's pieces/s over that bound's (int8 products can beat
it); "of matmul bound" is the same against ``torch.matmul``'s rate alone, the GEMM rate most
utilisation figures use (oneDNN's op is faster on this CPU, so that bound is lower). The GEMM
rate is read again after every repeat, and each whole repeat is also held against the faster
reading on either side of it ("of the bound repeat by repeat"): on a host whose rate swings
within a run, that spread says how far the whole-run figure can be trusted. Beside it, the
same products run 40 times in a row before and after the corpus
(:func:`clearformer.bench.gemm.sustained_gemm_rate`) give the host's sustained rate, their
median round: the bound at that rate is what even a pure matrix-product workload, run as a
whole call runs, can reach on a host whose rate varies from call to call ("of sustained
bound"; the target stays "of bound"). Every result records the load average before and after
and whether the run was quiet (:mod:`clearformer.bench.load`).

Run: ``python benchmarks/encode_throughput.py [--texts 2000] [--repeats 4] [--corpus both]
[--precision bf16 int8] [--out benchmarks/results/encode-throughput]``: OUT.json, OUT.md
and, with matplotlib, a chart OUT.png; ``--replot OUT.json`` redraws the markdown and the
chart of a saved run.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

REFERENCE = "sentence-transformers"
CORPORA = ("sentences", "mixed")


def make_corpus(n: int, kind: str = "mixed", seed: int = 0) -> list[str]:
    """``n`` texts of random vocabulary words; see the module docstring for ``kind``."""
    from clearformer.interop.hf import bundled_model_dir

    vocab = (bundled_model_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")
    words = [w for w in vocab[2000:] if w.isalpha() and w.isascii()]
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        if kind == "sentences":
            count = min(max(int(round(rng.lognormvariate(math.log(16), 0.55))), 3), 80)
        elif kind == "mixed":
            count = int(round(3 * (100 ** rng.random())))  # 3 .. 300 words, log-uniform
        else:
            raise ValueError(f"kind must be one of {CORPORA}, got {kind!r}")
        sentence = " ".join(rng.choice(words) for _ in range(count))
        texts.append(sentence.capitalize() + ".")
    return texts


def measure(kind: str, args, ours, theirs, onnx: dict) -> dict:
    from clearformer.bench.flops import forward_flops
    from clearformer.bench.gemm import gemm_rates, sustained_gemm_rate
    from clearformer.bench.workloads import SIZES

    texts = make_corpus(args.texts, kind)
    lengths = [len(e.ids) for e in ours.tokenizer.encode(texts)]
    tokens = sum(lengths)
    readings = [gemm_rates(SIZES["minilm"])]  # GFLOP/s, before the corpus (again after it)
    sustained = [sustained_gemm_rate(SIZES["minilm"])]  # best and median round, before/after
    between: list[dict[str, float]] = []  # after each repeat; the last is the "after" reading
    runners = {
        REFERENCE: lambda chunk: theirs.encode(
            chunk, normalize_embeddings=True, convert_to_numpy=True
        ),
        "clearformer": lambda chunk: ours.encode(chunk, normalize=True, progress=False),
        "clearformer workers 1": lambda chunk: ours.encode(
            chunk, workers=1, normalize=True, progress=False
        ),
        "clearformer batch 32": lambda chunk: ours.encode(
            chunk, batch_size=32, workers=1, normalize=True, progress=False
        ),
    }
    if args.int8:
        runners["clearformer int8"] = lambda chunk: ours.encode(
            chunk, normalize=True, progress=False, precision="int8", fuse_int8=False
        )
        runners["clearformer int8 fused"] = lambda chunk: ours.encode(
            chunk, normalize=True, progress=False, precision="int8", fuse_int8=True
        )
        runners["clearformer int8 fused workers 1"] = lambda chunk: ours.encode(
            chunk, workers=1, normalize=True, progress=False, precision="int8", fuse_int8=True
        )
    if "bf16" in args.precision:
        runners["clearformer bf16"] = lambda chunk: ours.encode(
            chunk, normalize=True, progress=False, precision="bf16"
        )
        runners["clearformer bf16 workers 1"] = lambda chunk: ours.encode(
            chunk, workers=1, normalize=True, progress=False, precision="bf16"
        )
    if "auto" in args.precision:
        runners["clearformer auto"] = lambda chunk: ours.encode(
            chunk, normalize=True, progress=False, precision="auto"
        )
    for name, onnx_encoder in onnx.items():
        runners[name] = onnx_encoder.encode
    # One `encode` call sorts its texts by length before batching: clearformer by token count,
    # sentence-transformers by character count. Each library's order is computed once over the
    # whole corpus, its own way, and cut into chunks of `--chunk` texts, so a chunk holds texts
    # of similar length, as the batches of one call over the whole corpus would. Chunk c of
    # every configuration is timed back to back in every repeat and each chunk's best time
    # counts: a burst of load from other work spoils one chunk's sample, not a whole run.
    orders = {
        REFERENCE: [int(i) for i in np.argsort([-len(t) for t in texts], kind="stable")],
        "clearformer": sorted(range(len(texts)), key=lambda i: -lengths[i]),
    }
    for name in runners:
        orders.setdefault(name, orders["clearformer"])
    names = list(runners)
    chunks = {
        name: [order[i : i + args.chunk] for i in range(0, len(texts), args.chunk)]
        for name, order in orders.items()
    }
    n_chunks = len(chunks[REFERENCE])
    best = {name: [math.inf] * n_chunks for name in names}
    per_repeat = {name: [0.0] * args.repeats for name in names}  # seconds of each whole repeat
    results = {name: np.zeros((len(texts), ours.dim), dtype=np.float32) for name in names}
    for repeat in range(args.repeats):
        for c in range(n_chunks):
            turn = names[(repeat + c) % len(names) :] + names[: (repeat + c) % len(names)]
            for name in turn:
                rows = chunks[name][c]
                start = time.perf_counter()
                vectors = runners[name]([texts[i] for i in rows])
                elapsed = time.perf_counter() - start
                best[name][c] = min(best[name][c], elapsed)
                per_repeat[name][repeat] += elapsed
                results[name][rows] = vectors
        # A reading after every repeat: on a host whose GEMM rate swings, each repeat is held
        # against the rate of its own moment as well as against the run's before/after bound.
        between.append(gemm_rates(SIZES["minilm"]))
    seconds = {name: sum(best[name]) for name in names}
    readings.append(between[-1])
    sustained.append(sustained_gemm_rate(SIZES["minilm"]))
    rates = [max(r.values()) for r in readings]
    matmul_rate = max(r["matmul"] for r in readings)
    flops = forward_flops(SIZES["minilm"], lengths)
    bound_seconds = flops / (max(rates) * 1e9)
    moments = [max(r.values()) for r in [readings[0], *between]]  # before, after each repeat
    per_repeat_bound = fraction_per_repeat(flops, moments, per_repeat)
    matmul_bound_seconds = flops / (matmul_rate * 1e9)
    # The same bound at the host's sustained rate: the faster of the two medians.
    sustained_bound_seconds = flops / (max(r["median"] for r in sustained) * 1e9)
    float32 = results["clearformer"].astype(np.float64)
    cosine_to_float32 = {
        name: (results[name].astype(np.float64) * float32).sum(1) for name in names
    }
    neighbour = _nearest_neighbours(float32)
    return {
        "corpus": kind,
        "texts": len(texts),
        "tokens": tokens,
        "pieces_per_text": {
            "min": min(lengths),
            "median": int(np.median(lengths)),
            "max": max(lengths),
        },
        "min_cosine_vs_reference": {
            name: float(
                (results[name].astype(np.float64) * results[REFERENCE].astype(np.float64))
                .sum(1)
                .min()
            )
            for name in names
        },
        "cosine_to_clearformer_float32": {
            name: {"min": float(c.min()), "mean": float(c.mean())}
            for name, c in cosine_to_float32.items()
        },
        "top1_neighbour_agreement": {
            name: float((_nearest_neighbours(results[name]) == neighbour).mean()) for name in names
        },
        "seconds": seconds,
        "tokens_per_second": {name: tokens / s for name, s in seconds.items()},
        "speedup_vs_reference": {name: seconds[REFERENCE] / s for name, s in seconds.items()},
        "seconds_per_repeat": per_repeat,
        "paired_ratios": paired_ratios(per_repeat),
        "gemm_gflops_before_after": rates,
        "gemm_gflops_readings": readings,
        "bound_tokens_per_second": tokens / bound_seconds,
        "fraction_of_bound": {name: bound_seconds / s for name, s in seconds.items()},
        "gemm_gflops_after_each_repeat": [max(r.values()) for r in between],
        "fraction_of_bound_per_repeat": per_repeat_bound,
        "matmul_bound_tokens_per_second": tokens / matmul_bound_seconds,
        "sustained_gemm_gflops_before_after": sustained,
        "sustained_bound_tokens_per_second": tokens / sustained_bound_seconds,
        "fraction_of_sustained_bound": {
            name: sustained_bound_seconds / s for name, s in seconds.items()
        },
        "fraction_of_matmul_bound": {name: matmul_bound_seconds / s for name, s in seconds.items()},
    }


def _sustained_lines(run: dict) -> list[str]:
    """The bound at the host's sustained GEMM rate, where the run has it (older results not)."""
    if "sustained_gemm_gflops_before_after" not in run:
        return []
    readings = run["sustained_gemm_gflops_before_after"]
    medians = ", ".join(f"{r['median']:.0f}" for r in readings)
    bests = ", ".join(f"{r['best']:.0f}" for r in readings)
    ours = run["fraction_of_sustained_bound"].get("clearformer")
    return [
        f"The same products run 40 times in a row, before and after the corpus: median "
        f"{medians} GFLOP/s against best {bests}. A whole call runs at each moment's rate, so "
        f"on this host even pure matrix products stay below the best round; at the faster "
        f"median the bound is {run['sustained_bound_tokens_per_second']:,.0f} pieces/s"
        + (f", and clearformer runs at {ours:.0%} of it." if ours is not None else "."),
        "",
    ]


def fraction_per_repeat(
    flops: float, moments: list[float], per_repeat: dict[str, list[float]]
) -> dict[str, list[float]]:
    """Each configuration's fraction of the float32 bound in each whole repeat: ``flops`` at
    the faster of the GEMM readings (GFLOP/s) taken just before and just after that repeat
    (``moments``: one before the first repeat, then one after each), over the repeat's
    seconds."""
    if any(len(times) != len(moments) - 1 for times in per_repeat.values()):
        raise ValueError(f"expected one reading more than repeats, got {len(moments)} readings")
    return {
        name: [flops / (max(moments[r], moments[r + 1]) * 1e9) / t for r, t in enumerate(times)]
        for name, times in per_repeat.items()
    }


# Side-by-side pairs reported repeat by repeat: (faster-hoped configuration, the one it is held
# against). A pair is reported when both rows ran.
PAIRS = (
    ("clearformer", REFERENCE),
    ("clearformer int8 fused", REFERENCE),
    ("clearformer bf16", REFERENCE),
    ("clearformer bf16", "clearformer"),
    ("clearformer", "onnxruntime optimised"),
    ("clearformer int8 fused", "onnxruntime int8"),
    ("clearformer int8 fused", "onnxruntime int8 per-channel"),
    ("clearformer int8 fused", "onnxruntime int8 per-channel, attention float32"),
)


def paired_ratios(per_repeat: dict[str, list[float]]) -> list[dict]:
    """For each of ``PAIRS`` that ran: ``other's seconds / ours`` in each repeat (> 1: ours is
    faster). The configurations of one repeat ran chunk by chunk in turn, so a repeat's ratio
    compares them under the same conditions; the spread over repeats is the noise a single
    figure hides."""
    pairs = []
    for ours, other in PAIRS:
        if ours in per_repeat and other in per_repeat:
            ratios = [t / o for o, t in zip(per_repeat[ours], per_repeat[other], strict=True)]
            pairs.append({"ours": ours, "other": other, "ratios": ratios})
    return pairs


def _nearest_neighbours(vectors: np.ndarray) -> np.ndarray:
    """Index of each row's most similar other row (unit vectors, (N, D) -> (N,))."""
    similarity = vectors.astype(np.float64) @ vectors.astype(np.float64).T  # (N, N)
    np.fill_diagonal(similarity, -np.inf)
    return similarity.argmax(1)


def to_markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# Sentence-encoding throughput: clearformer, sentence-transformers and ONNX Runtime",
        "",
        f"torch {env['torch']}, sentence-transformers {env['sentence_transformers']}, "
        f"{env['threads']} threads, allocator retains freed memory: {env['retained']}, "
        f"load average at start {env['load_average_start']:.2f}, at end "
        f"{env['load_average']:.2f}. Each chunk's best of "
        f"{env['repeats']} repeats, summed.",
        "",
        f"Machine: {env['load_verdict']}",
        "",
        "clearformer's own kernels: "
        + (
            "; ".join(f"{k}: {v}" for k, v in env["routes"].items())
            if env.get("routes")
            else f"AVX-512 attention {env.get('attention_kernel', 'not recorded')}"
        ),
        "",
    ]
    if env.get("onnx"):
        fused = ", ".join(f"{op} {n}" for op, n in env["onnx"]["fused_operators"].items())
        lines += [
            f"ONNX Runtime {env['onnx']['onnxruntime']}; its transformer optimiser fused: "
            f"{fused}. Models built by `benchmarks/onnxruntime_encoder.py`.",
            "",
        ]
    for run in report["runs"]:
        p = run["pieces_per_text"]
        matmul = max(r["matmul"] for r in run["gemm_gflops_readings"])
        lines += [
            f"## Corpus `{run['corpus']}`: {run['texts']} texts, {run['tokens']} word pieces "
            f"(per text: min {p['min']}, median {p['median']}, max {p['max']})",
            "",
            f"float32 GEMM rate {run['gemm_gflops_before_after'][0]:.0f} -> "
            f"{run['gemm_gflops_before_after'][1]:.0f} GFLOP/s; the bound (matrix products on "
            f"real tokens at the faster rate): {run['bound_tokens_per_second']:,.0f} pieces/s. "
            f"At `torch.matmul`'s own rate ({matmul:.0f} GFLOP/s) the bound is "
            f"{run['matmul_bound_tokens_per_second']:,.0f} pieces/s "
            '(column "of matmul bound").',
            "",
            *_sustained_lines(run),
            "| configuration | pieces/s | vs sentence-transformers | of bound | of matmul bound | "
            "min cosine to it | min / mean cosine to clearformer float32 | "
            "nearest neighbour as float32's |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, rate in run["tokens_per_second"].items():
            c = run["cosine_to_clearformer_float32"][name]
            lines.append(
                f"| {name} | {rate:,.0f} | {run['speedup_vs_reference'][name]:.2f}x | "
                f"{run['fraction_of_bound'][name]:.0%} | "
                f"{run['fraction_of_matmul_bound'][name]:.0%} | "
                f"{run['min_cosine_vs_reference'][name]:.7f} | {c['min']:.4f} / {c['mean']:.5f} | "
                f"{run['top1_neighbour_agreement'][name]:.1%} |"
            )
        lines.append("")
        local = run.get("fraction_of_bound_per_repeat")  # absent from older results
        if local:
            after = ", ".join(f"{g:.0f}" for g in run["gemm_gflops_after_each_repeat"])
            lines += [
                f"Of the bound repeat by repeat, each whole repeat against the faster GEMM "
                f"reading on either side of it (readings after each repeat: {after} GFLOP/s):",
                "",
            ]
            for name in ("clearformer", "clearformer workers 1", REFERENCE):
                if name in local:
                    each = ", ".join(f"{f:.0%}" for f in local[name])
                    lines.append(f"- {name}: {each}")
            lines.append("")
        pairs = run.get("paired_ratios")  # absent from results saved before it was recorded
        if pairs:
            lines += [
                "Side by side, repeat by repeat (the other's time over ours: > 1 means ours is "
                "faster); the range is the spread of whole repeats, the figure in the table "
                "above uses each chunk's best:",
                "",
                "| ours | against | ratio in each repeat | range |",
                "| --- | --- | --- | --- |",
            ]
            for pair in pairs:
                ratios = pair["ratios"]
                each = ", ".join(f"{r:.2f}" for r in ratios)
                lines.append(
                    f"| {pair['ours']} | {pair['other']} | {each} | "
                    f"{min(ratios):.2f}-{max(ratios):.2f}x |"
                )
            lines.append("")
    return "\n".join(lines)


def chart_png(report: dict) -> bytes | None:
    """A PNG of pieces/s per configuration, one panel per corpus, the float32 bound as a
    dashed line; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    runs = report["runs"]
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(9, 0.32 * len(runs[0]["seconds"]) * len(runs) + 1.6)
    )
    axes = [axes] if len(runs) == 1 else list(axes)
    for ax, run in zip(axes, runs, strict=True):
        names = list(run["tokens_per_second"])
        rates = [run["tokens_per_second"][n] for n in names]
        colours = [
            "tab:blue"
            if n.startswith("clearformer")
            else "tab:orange"
            if n.startswith("onnxruntime")
            else "tab:gray"
            for n in names
        ]
        bars = ax.barh(names, rates, color=colours)
        for bar, name in zip(bars, names, strict=True):
            cosine = run["cosine_to_clearformer_float32"][name]["min"]
            label = f" {run['speedup_vs_reference'][name]:.2f}x"
            if cosine < 0.99999:
                label += f", min cosine {cosine:.3f}"
            ax.text(
                bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=7
            )
        ax.axvline(run["bound_tokens_per_second"], color="black", linestyle="--", linewidth=1)
        ax.text(run["bound_tokens_per_second"], len(names) - 0.2, " float32 GEMM bound", fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, max(rates) * 1.3)
        ax.set_title(
            f"corpus {run['corpus']}: {run['texts']} texts, {run['tokens']:,} word pieces "
            "(ratios vs sentence-transformers)",
            fontsize=9,
            loc="left",
        )
        ax.tick_params(labelsize=7)
        ax.set_xlabel("word pieces / s", fontsize=7)
    env = report["environment"]
    cpu = env.get("cpu", {}).get("model", "CPU not recorded")
    fig.suptitle(
        f"encode throughput, {cpu}, {env['threads']} threads, torch {env['torch']}; "
        f"{env['load_verdict'].split(':')[0]}",
        fontsize=9,
    )
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    return png.getvalue()


def write_report(report: dict, out: Path) -> None:
    """OUT.json, OUT.md and (with matplotlib) OUT.png, each written whole or not at all."""
    from clearformer.io import atomic_write

    out.parent.mkdir(parents=True, exist_ok=True)
    files = {".json": json.dumps(report, indent=2) + "\n", ".md": to_markdown(report)}
    png = chart_png(report)
    if png is not None:
        files[".png"] = png
    for suffix, content in files.items():
        with atomic_write(out.with_suffix(suffix), "wb" if suffix == ".png" else "w") as handle:
            handle.write(content)
    print("wrote " + ", ".join(str(out.with_suffix(suffix)) for suffix in files))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--texts", type=int, default=2000, help="texts per corpus (default %(default)s)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="timed passes over each corpus; each chunk's best time counts (default %(default)s)",
    )
    parser.add_argument(
        "--chunk", type=int, default=500, help="texts per timed encode call (default %(default)s)"
    )
    parser.add_argument(
        "--corpus",
        choices=(*CORPORA, "both"),
        default="both",
        help="synthetic corpus to encode: sentence-like texts, texts up to paragraphs, or both "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write OUT.json, OUT.md and OUT.png (default: print only)",
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=("bf16", "int8", "auto"),
        default=["int8"],
        metavar="NAME",
        help="clearformer's precisions timed besides float32 (which always runs: every row is "
        "compared with its embeddings): bf16 (rows 'clearformer bf16' and '... workers 1'), "
        "int8 (the three int8 rows), auto ('clearformer auto': what precision='auto' takes "
        "here); default: int8",
    )
    parser.add_argument(
        "--no-int8",
        dest="int8",
        action="store_false",
        help="leave out the int8 rows (as --precision without int8)",
    )
    parser.add_argument(
        "--no-onnx", dest="onnx", action="store_false", help="leave out the ONNX Runtime rows"
    )
    parser.add_argument(
        "--replot",
        type=Path,
        default=None,
        metavar="JSON",
        help="measure nothing: write the markdown and chart of a saved result beside it",
    )
    args = parser.parse_args()
    args.int8 = args.int8 and "int8" in args.precision
    if args.replot is not None:
        write_report(json.loads(args.replot.read_text()), args.replot.with_suffix(""))
        return
    import torch

    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_description

    meter = LoadMeter(threads=torch.get_num_threads()).start()

    from clearformer.runtime import retain_freed_memory

    retained = retain_freed_memory()  # before any large allocation, for both libraries alike

    import sentence_transformers

    from clearformer.text.encoder import attention_kernel_for

    # What encode does for a large call, before timing, so that every clearformer row runs
    # what a large call runs: where the AVX-512 kernels can be built (and no switch is off),
    # build them and, where this CPU has no verdict yet, measure them against PyTorch's
    # routes; auto then takes each only where it measured faster.
    attention_kernel_for(10**9, torch.device("cpu"))
    from sentence_transformers import SentenceTransformer

    from clearformer import TextEncoder
    from clearformer.interop.hf import bundled_model_dir

    ours = TextEncoder.from_pretrained()
    theirs = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    warm = make_corpus(64, "mixed", seed=1)
    ours.encode(warm, progress=False)  # first calls pay for lazy initialisation in both
    theirs.encode(warm)
    if args.int8:
        ours.int8_model(fused=True)  # calibration and compilation, before any timing
        ours.encode(warm, progress=False, precision="int8", fuse_int8=False)
        ours.encode(warm, progress=False, precision="int8", fuse_int8=True)
    if "bf16" in args.precision:
        ours.encode(warm, progress=False, precision="bf16")  # builds the copy before timing
    auto = ours.precision_for("auto") if "auto" in args.precision else None
    if auto is not None:
        ours.encode(warm, progress=False, precision="auto")
    onnx, onnx_info = {}, None
    scratch = None
    if args.onnx:
        import onnxruntime_encoder

        if not onnxruntime_encoder.available():
            parser.error("the ONNX Runtime rows need onnx and onnxruntime (or pass --no-onnx)")
        import onnxruntime

        print("building the ONNX Runtime models (export, optimise, quantise)")
        scratch = tempfile.TemporaryDirectory(prefix="encode-throughput-onnx-")
        paths, fused = onnxruntime_encoder.build_models(bundled_model_dir(), Path(scratch.name))
        onnx_info = {
            "onnxruntime": onnxruntime.__version__,
            "fused_operators": fused,
            "batch_size": onnxruntime_encoder.BATCH_SIZE,
            "spinning": False,
        }
        for name, path in paths.items():
            onnx[name] = onnxruntime_encoder.OnnxEncoder.load(
                path, ours.tokenizer, ours.dim, torch.get_num_threads()
            )
            onnx[name].encode(warm)
    kinds = CORPORA if args.corpus == "both" else (args.corpus,)
    runs = []
    for kind in kinds:
        run = measure(kind, args, ours, theirs, onnx)
        runs.append(run)
        print(f"corpus {kind}: {run['texts']} texts, {run['tokens']} pieces")
        for name, rate in run["tokens_per_second"].items():
            c = run["cosine_to_clearformer_float32"][name]
            print(
                f"  {name:>32}: {rate:8,.0f} pieces/s  "
                f"{run['speedup_vs_reference'][name]:.2f}x  "
                f"{run['fraction_of_bound'][name]:.0%} of bound  "
                f"min cosine {run['min_cosine_vs_reference'][name]:.7f}  "
                f"to float32 min {c['min']:.4f} mean {c['mean']:.5f}"
            )
        for pair in run["paired_ratios"]:
            each = " ".join(f"{r:.2f}" for r in pair["ratios"])
            print(f"  {pair['ours']} vs {pair['other']}, each repeat: {each}")
        print(f"  GEMM GFLOP/s before, after: {run['gemm_gflops_before_after']}")
        sustained = run["sustained_gemm_gflops_before_after"]
        print(
            "  sustained GEMM GFLOP/s (median of 40 rounds) before, after: "
            f"{[round(r['median']) for r in sustained]}; clearformer at "
            f"{run['fraction_of_sustained_bound']['clearformer']:.0%} of that bound"
        )
    load = meter.record()
    if scratch is not None:
        scratch.cleanup()  # the ONNX models (about 100 MB)
    print(load.describe())
    report = {
        "environment": {
            "torch": torch.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "threads": torch.get_num_threads(),
            "retained": retained,
            "repeats": args.repeats,
            "onnx": onnx_info,
            "load_average_start": load.before[0],
            "load_average": load.after[0],
            "load": load.to_dict(),
            "load_verdict": load.describe(),
            "cpu": cpu_description(),
            "routes": load.routes,
            "auto_precision": None if auto is None else str(auto),
        },
        "runs": runs,
    }
    if args.out is not None:
        write_report(report, args.out)


if __name__ == "__main__":
    main()
