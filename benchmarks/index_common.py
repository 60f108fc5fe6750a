"""Shared parts of the index benchmarks: the embeddings, an encoder that serves them, the
machine's record, recall and per-query timing."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from clearformer.bench.load import LoadMeter  # noqa: E402
from clearformer.index.quantize import truncate  # noqa: E402
from clearformer.io import write_text_atomically  # noqa: E402


def embeddings(path: Path, texts: Path | None) -> np.ndarray:
    """(n, D) unit float32 embeddings from ``path`` (.npy); if it does not exist, the texts of
    ``texts`` (one per line) encoded by the bundled model and saved there first."""
    if not path.is_file():
        if texts is None:
            raise SystemExit(f"{path} does not exist: give --texts FILE to encode it")
        from clearformer.text import TextEncoder

        lines = texts.read_text(encoding="utf-8").splitlines()
        started = time.perf_counter()
        vectors = TextEncoder.from_pretrained().encode(lines, normalize=True)
        print(f"encoded {len(lines):,} texts in {time.perf_counter() - started:.0f}s")
        np.save(path, vectors)
    return truncate(np.load(path), None)


def grow(vectors: np.ndarray, rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` unit vectors: the real ones, then noisy copies of them (each a real vector plus
    Gaussian noise of norm about 0.5, renormalised: cosine about 0.9 to its original), so a
    larger collection keeps the real one's clusters instead of becoming uniform noise, on
    which no graph index reaches a useful recall."""
    if rows <= len(vectors):
        return vectors[:rows]
    rng = np.random.default_rng(seed)
    parts, have = [vectors], len(vectors)
    scale = 0.5 / np.sqrt(vectors.shape[1])
    while have < rows:
        take = min(len(vectors), rows - have)
        noise = rng.standard_normal((take, vectors.shape[1]), dtype=np.float32) * scale
        parts.append(truncate(vectors[:take] + noise, None))
        have += take
    return np.concatenate(parts)


class RowEncoder:
    """Serves precomputed vectors to ``build_index`` as a TextEncoder would, with the bundled
    model's identity: the text ``"<i>"`` embeds to row i."""

    def __init__(self, vectors: np.ndarray) -> None:
        from clearformer.interop.hf.bundled import bundled_model_dir

        self.vectors = vectors
        self.path = bundled_model_dir()
        self.pooling, self.normalize, self.max_length = "mean", True, 256
        self.dim = vectors.shape[1]

    def texts(self, rows: range) -> list[str]:
        return [str(i) for i in rows]

    def encode(self, texts, normalize=True, **options) -> np.ndarray:
        return self.vectors[[int(t) for t in texts]]


def exact_top(corpus: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """(Q, k) rows of the float32 exact top k, in blocks (a 1M x 384 corpus is 1.5 GB)."""
    best = []
    for start in range(0, len(queries), 64):
        scores = queries[start : start + 64] @ corpus.T  # (q, n)
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
        best.append(np.take_along_axis(top, order, axis=1))
    return np.concatenate(best)


def recall(rows: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(a[:k]) & set(b)) / k for a, b in zip(rows, truth, strict=True)]))


def per_query_ms(search, queries: np.ndarray) -> tuple[float, float]:
    """Median and 95th percentile of one query at a time, in milliseconds."""
    search(queries[:1])  # warm: first touches of memory-mapped files
    times = []
    for i in range(len(queries)):
        started = time.perf_counter()
        search(queries[i : i + 1])
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times), float(np.percentile(times, 95))


def machine(threads: int) -> dict:
    from clearformer.cpu import cpu_info

    return {
        "cpu": cpu_info().summary(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "usearch": _version("usearch"),
        "threads": threads,
        "cores": os.cpu_count(),
    }


def start_load(threads: int) -> LoadMeter:
    """Count other processes' CPU time from here (an idle probe first: clearformer.bench.load)."""
    return LoadMeter(threads=threads).start()


def load_record(meter: LoadMeter) -> str:
    return meter.record().describe()


def write_report(
    intro: list[str], rows: list[dict], host: dict, load: str, out: Path | None, record: dict
) -> None:
    """Print ``intro``, the rows as a table, the machine and the load; with ``out``, write the
    same text to ``out`` and ``record`` as JSON beside it (``out`` with ``.json``)."""
    lines = [
        *intro,
        "",
        "| " + " | ".join(rows[0]) + " |",
        "| " + " | ".join("---" for _ in rows[0]) + " |",
        *("| " + " | ".join(str(v) for v in row.values()) + " |" for row in rows),
        "",
        f"Machine: {host['cpu']}; numpy {host['numpy']}, usearch {host['usearch']}.",
        f"Load: {load}.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out, text)
        write_text_atomically(out.with_suffix(".json"), json.dumps(record, indent=1) + "\n")


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"
