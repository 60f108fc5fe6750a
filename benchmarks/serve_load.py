"""Load test on loopback: ``clearformer serve`` against infinity-emb, same model, same CPU.

Each server is started in turn on 127.0.0.1 with the bundled all-MiniLM-L6-v2 checkpoint
directory, warmed with a few requests, then driven by ``--clients`` concurrent clients, each on
one keep-alive connection, each sending its next request as soon as the last is answered, on
the OpenAI-compatible route both servers have (``POST /v1/embeddings`` here,
``POST /embeddings`` on infinity), ``encoding_format: float``. Two workloads:

* ``online``: one sentence per request (a search box's traffic), the server batching the
  clients' requests together;
* ``bulk``: 32 sentences per request (indexing a corpus).

The sentences are random vocabulary words of sentence length (log-normal around 16 words), as
``benchmarks/encode_throughput.py``'s ``sentences`` corpus, each sent once per run (neither
server can answer from a cache). Reported per server and workload: texts/s, word pieces/s,
latency percentiles, the answers other than 200, and the server process's CPU seconds per
1,000 texts (its own work, which other load distorts less than wall time). The servers take
turns ``--rounds`` times and the median round is kept; other processes' busy CPUs during each
run (the servers, child processes of this one, not counted: clearformer.bench.load), and the
CPU's model, are recorded. The load generator shares the CPU with the server
(both servers pay for it alike); on a machine shared with other work the figures are
provisional, and the report says so.

The client is a minimal HTTP/1.1 client on asyncio streams (no library), so that its own CPU
cost is small and the same for both servers. Nothing leaves 127.0.0.1, every run is bounded in
requests and time, and both servers are stopped by the script (SIGTERM, then SIGKILL).

Each workload runs at every client count of ``--clients`` (default 1, 8 and 64). With
``--unbatched`` the same clearformer server also runs one request at a time (``--workers 1
--max-batch-tokens 1``: each input is a batch of its own), the baseline dynamic batching is
measured against.

Run: ``python benchmarks/serve_load.py --infinity /path/to/venv/bin/infinity_emb --unbatched
[--clients 1,8,64] [--requests 1500] [--rounds 2] [--out benchmarks/results/serve-load]``.
Without ``--infinity`` only clearformer is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from clearformer.io import write_text_atomically

WORKLOADS = {"online": 1, "bulk": 32}  # texts per request
SERVER_START_TIMEOUT = 300.0  # seconds for a server to load and warm up
NEIGHBOUR_PIDS: set[int] = set()  # --busy-neighbour's processes: their CPU is others'
RUN_TIMEOUT = 600.0  # seconds a run may take before the script gives up on it
MODEL_NAME = "all-MiniLM-L6-v2"


def make_sentences(n: int, seed: int) -> list[str]:
    """``n`` sentence-length texts of random vocabulary words (encode_throughput's recipe)."""
    from clearformer.interop.hf import bundled_model_dir

    vocab = (bundled_model_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")
    words = [w for w in vocab[2000:] if w.isalpha() and w.isascii()]
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        count = min(max(int(round(rng.lognormvariate(math.log(16), 0.55))), 3), 80)
        texts.append(" ".join(rng.choice(words) for _ in range(count)).capitalize() + ".")
    return texts


# The servers ---------------------------------------------------------------------------


class Server:
    """A server process on 127.0.0.1:``port``, started and stopped by this script."""

    def __init__(
        self, name: str, command: list[str], port: int, path: str, env: dict, cwd: str | None = None
    ) -> None:
        self.name, self.command, self.port, self.path, self.env = name, command, port, path, env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-load-{name}.log"

    def start(self) -> None:
        handle = self.log.open("w")
        # In a scratch directory: infinity makes a cache folder in its working directory.
        self.proc = subprocess.Popen(
            self.command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd or tempfile.mkdtemp(prefix=f"serve-load-{self.name}-"),
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start; see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        raise RuntimeError(f"{self.name} was not healthy within {SERVER_START_TIMEOUT:g} s")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the server process and its children so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)


def clearformer_server(
    port: int,
    model: str,
    *,
    batched: bool = True,
    precision: str = "float32",
    workers: int | None = None,
    fixed_threads: bool = False,
) -> Server:
    """clearformer serve with its defaults; ``batched=False``: one input per forward pass, one
    at a time (an input over ``--max-batch-tokens`` runs alone); ``fixed_threads``: every batch
    on its whole share of threads, whatever else the machine runs (``--fixed-threads``)."""
    command = [sys.executable, "-m", "clearformer.cli", "serve", "--port", str(port)]
    command += ["--model", f"{MODEL_NAME}={model}", "--precision", precision]
    if not batched:
        command += ["--workers", "1", "--max-batch-tokens", "1"]
    elif workers is not None:
        command += ["--workers", str(workers)]
    if fixed_threads:
        command += ["--fixed-threads"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    name = "clearformer" if batched else "clearformer-unbatched"
    if fixed_threads:
        name += "-fixed-threads"
    return Server(name, command, port, "/v1/embeddings", env)


def infinity_server(
    port: int,
    model: str,
    executable: str,
    onnx_dir: str | None = None,
    *,
    precision: str = "float32",
) -> Server:
    """infinity on its torch engine; with ``onnx_dir``, on its ONNX Runtime engine (optimum)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
    }
    common = ["--served-model-name", MODEL_NAME, "--device", "cpu", "--no-vector-disk-cache"]
    common += ["--dtype", INFINITY_DTYPES[precision]]
    common += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    if onnx_dir is None:
        command = [executable, "v2", "--model-id", model, "--engine", "torch", *common]
        return Server("infinity", command, port, "/embeddings", env)
    # infinity 0.0.78 hands optimum 2.x the ONNX file's absolute path, which optimum refuses:
    # from inside the folder, as ".", the path is relative. Its ONNX engine also pools the
    # CLS token unless told the model's mean pooling (then it agrees to cosine 1.0).
    command = [executable, "v2", "--model-id", ".", "--engine", "optimum"]
    command += ["--pooling-method", "mean", *common]
    return Server("infinity-onnx", command, port, "/embeddings", env, cwd=onnx_dir)


# infinity's --dtype for each of clearformer's --precision values the benchmark offers. Its
# int8 on the CPU is torch's dynamic quantization of every Linear (quantize_dynamic: one
# activation scale per tensor); clearformer's int8 scales each token's row (docs/int8.md).
INFINITY_DTYPES = {"float32": "float32", "bf16": "bfloat16", "int8": "int8"}


# The load -----------------------------------------------------------------------------


def start_busy_neighbours(count: int) -> list[subprocess.Popen]:
    """``count`` processes that each keep one CPU busy for as long as they live: another
    program's work beside the server, as on a shared machine, a laptop or a container host."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


async def _client(port: int, path: str, bodies: asyncio.Queue, latencies: list, statuses: dict):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            try:
                body = bodies.get_nowait()
            except asyncio.QueueEmpty:
                return
            head = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            started = time.perf_counter()
            writer.write(head + body)
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            status = int(status_line.split()[1])
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def _drive(port: int, path: str, bodies: list[bytes], clients: int):
    queue: asyncio.Queue = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    started = time.perf_counter()
    await asyncio.wait_for(
        asyncio.gather(*(_client(port, path, queue, latencies, statuses) for _ in range(clients))),
        RUN_TIMEOUT,
    )
    return time.perf_counter() - started, latencies, statuses


def run_load(server: Server, texts: list[str], per_request: int, clients: int) -> dict:
    bodies = [
        json.dumps(
            {"model": MODEL_NAME, "input": texts[i : i + per_request], "encoding_format": "float"}
        ).encode()
        for i in range(0, len(texts), per_request)
    ]
    from clearformer.bench.load import LoadMeter

    # No idle probe per run (main's meter probed once): others' CPU during this run, the
    # server (a child process) and this load generator not counted.
    meter = LoadMeter(
        threads=os.cpu_count() or 1, probe_seconds=0, exclude=lambda: NEIGHBOUR_PIDS
    ).start()
    cpu_before = server.cpu_seconds()
    seconds, latencies, statuses = asyncio.run(_drive(server.port, server.path, bodies, clients))
    cpu = server.cpu_seconds() - cpu_before
    ok = statuses.get(200, 0)
    latencies.sort()

    def percentile(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "requests": len(bodies),
        "texts": len(texts),
        "seconds": seconds,
        "texts_per_s": ok * per_request / seconds,
        "latency_ms": {
            "p50": percentile(0.50),
            "p95": percentile(0.95),
            "p99": percentile(0.99),
            "max": latencies[-1] * 1000,
        },
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_cpu_s_per_1000_texts": 1000 * cpu / max(ok * per_request, 1),
        "load": meter.record().to_dict(),
    }


def check_answers(server: Server, texts: list[str]) -> list[list[float]]:
    body = json.dumps({"model": MODEL_NAME, "input": texts}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{server.path}",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return [d["embedding"] for d in json.loads(answer.read())["data"]]


# The report ---------------------------------------------------------------------------


def batching_ceiling(precision: str, batch: int, texts: int = 256) -> dict:
    """What batching can gain on this CPU before any HTTP: ``encode``'s process CPU time per
    text one text per call (one worker, every thread: the unbatched server's forward passes)
    against ``batch`` texts per call (the largest batch ``batch`` clients can make), in this
    process, with no server running."""
    import time as clock

    from clearformer import TextEncoder
    from clearformer.interop.hf import bundled_model_dir

    encoder = TextEncoder.from_pretrained(str(bundled_model_dir()))
    sentences = make_sentences(texts, 99)
    encoder.keep_weights_packed()  # as the servers' warm-up does

    def cpu_ms_per_text(size: int) -> float:
        encoder.encode(sentences[:size], batch_size=size, precision=precision, workers=1)
        started = clock.process_time()
        for i in range(0, texts, size):
            chunk = sentences[i : i + size]
            encoder.encode(chunk, batch_size=size, precision=precision, workers=1)
        return 1000 * (clock.process_time() - started) / texts

    alone, batched = cpu_ms_per_text(1), cpu_ms_per_text(batch)
    return {"batch": batch, "alone_ms": alone, "batched_ms": batched, "ratio": alone / batched}


def to_markdown(report: dict) -> str:
    lines = [
        "# `clearformer serve` against infinity-emb: loopback load test",
        "",
        f"CPU: {report['cpu']}; {report['cores']} logical CPUs, shared by the server and the "
        f"load generator. Model: {MODEL_NAME} (bundled checkpoint directory), "
        f"{report['precision']}. "
        f"{', '.join(map(str, report['clients']))} concurrent clients, "
        f"{report['rounds']} round(s) per server "
        f"(the median round by texts/s is shown; with an even count, the lower middle one). "
        f"Versions: {report['versions']}. Servers: `{report['commands']['clearformer']}`"
        + "".join(f"; `{c}`" for n, c in report["commands"].items() if n != "clearformer")
        + ".",
        "",
        (
            f"A busy neighbour: {report['busy_neighbour']} other process(es) started by the "
            "benchmark each kept one CPU busy for the whole run (counted in others' CPUs). "
            if report.get("busy_neighbour")
            else ""
        )
        + f"{'QUIET' if report['quiet'] else 'PROVISIONAL: the machine was shared with other work'}"
        f" ({report['quiet_reason']}).",
        "",
        "| workload | clients | server | requests/s | texts/s | p50 ms | p95 ms | p99 ms | "
        "CPU s / 1k texts | answers | others' CPUs |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for key, per_server in report["results"].items():
        workload, clients = key.split("@")
        for name, run in per_server.items():
            m = run["median"]
            lat = m["latency_ms"]
            statuses = ", ".join(f"{k}: {v}" for k, v in m["statuses"].items())
            lines.append(
                f"| {workload} ({WORKLOADS[workload]}/request) | {clients} | {name} | "
                f"{m['texts_per_s'] / WORKLOADS[workload]:.1f} | "
                f"{m['texts_per_s']:.1f} | {lat['p50']:.1f} | {lat['p95']:.1f} | "
                f"{lat['p99']:.1f} | {m['server_cpu_s_per_1000_texts']:.2f} | {statuses} | "
                f"{m['load']['others_during']:.2f} |"
            )
        ours = per_server["clearformer"]
        for name, theirs in per_server.items():
            if name == "clearformer":
                continue
            ratios = [
                a["texts_per_s"] / b["texts_per_s"]
                for a, b in zip(ours["rounds"], theirs["rounds"], strict=True)
            ]
            report.setdefault("ratios", {}).setdefault(key, {})[name] = ratios
            cpu = (
                theirs["median"]["server_cpu_s_per_1000_texts"]
                / ours["median"]["server_cpu_s_per_1000_texts"]
            )
            lines.append(
                f"| {workload} | {clients} | **clearformer / {name}** | "
                f"**{statistics.median(ratios):.2f}x** (rounds: "
                f"{', '.join(f'{r:.2f}x' for r in ratios)}) | | | | | {cpu:.2f}x less | | |"
            )
    if "agreement" in report:
        lines += ["", f"Answers compared: {report['agreement']}."]
    if "ceiling" in report:
        c = report["ceiling"]
        lines += [
            "",
            f"Batching's ceiling here (`encode` in one process, no server, no HTTP): "
            f"{c['alone_ms']:.2f} CPU ms per text one text per call, {c['batched_ms']:.2f} in "
            f"calls of {c['batch']}: at most {c['ratio']:.2f}x the requests/s of one request "
            f"at a time, before HTTP and the load generator take their share.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--infinity", metavar="PATH", help="infinity_emb executable (its venv)")
    parser.add_argument(
        "--infinity-onnx",
        metavar="DIR",
        help="also run infinity's ONNX Runtime engine on DIR: the model exported by "
        "`optimum-cli export onnx --model MODEL --task feature-extraction --library-name "
        "transformers DIR`, with the model's 1_Pooling/, modules.json and "
        "sentence_bert_config.json copied in",
    )
    parser.add_argument(
        "--clients",
        default="1,8,64",
        help="comma-separated concurrent client counts; each workload runs at each (1,8,64)",
    )
    parser.add_argument(
        "--unbatched",
        action="store_true",
        help="also run clearformer one request at a time (--workers 1 --max-batch-tokens 1), "
        "the baseline of dynamic batching, and measure batching's ceiling on this CPU "
        "(encode's CPU time per text alone against in batches of the most clients)",
    )
    parser.add_argument("--requests", type=int, default=1500, help="online requests per run (1500)")
    parser.add_argument("--bulk-requests", type=int, default=60, help="bulk requests per run (60)")
    parser.add_argument("--rounds", type=int, default=3, help="turns per server (3)")
    parser.add_argument("--workloads", default="online,bulk", help="comma-separated: online, bulk")
    parser.add_argument(
        "--precision",
        choices=sorted(INFINITY_DTYPES),
        default="float32",
        help="weights and matrix products of every server: clearformer's --precision, "
        "infinity's --dtype (float32, bfloat16 or int8) (float32)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="the batching clearformer server's --workers (its default when left out)",
    )
    parser.add_argument(
        "--busy-neighbour",
        type=int,
        default=0,
        metavar="N",
        help="keep N CPUs busy with other processes (a plain Python loop each) for the whole "
        "run; their CPU counts as others' in the load record (default 0)",
    )
    parser.add_argument(
        "--fixed-threads-too",
        action="store_true",
        help="also run clearformer serve --fixed-threads (every batch on its whole thread "
        "share, whatever else runs), to see what following the free CPUs changes",
    )
    parser.add_argument("--port", type=int, default=18080, help="first port to use (18080)")
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = parser.parse_args()

    import numpy as np

    from clearformer import __version__
    from clearformer.cpu import cpu_info
    from clearformer.interop.hf import bundled_model_dir

    model = str(bundled_model_dir())
    workloads = [w for w in args.workloads.split(",") if w]
    try:
        client_counts = [int(c) for c in args.clients.split(",") if c]
    except ValueError:
        client_counts = []
    if not client_counts or min(client_counts) < 1:
        parser.error(f"--clients must be positive counts, got {args.clients!r}")
    precision = args.precision
    servers = [clearformer_server(args.port, model, precision=precision, workers=args.workers)]
    if args.unbatched:
        servers.append(clearformer_server(args.port + 3, model, batched=False, precision=precision))
    if args.fixed_threads_too:
        servers.append(
            clearformer_server(
                args.port + 4, model, precision=precision, workers=args.workers, fixed_threads=True
            )
        )
    versions = f"clearformer {__version__}"
    if args.infinity:
        servers.append(infinity_server(args.port + 1, model, args.infinity, precision=precision))
        if args.infinity_onnx:
            onnx_dir = str(Path(args.infinity_onnx).resolve())
            servers.append(
                infinity_server(args.port + 2, model, args.infinity, onnx_dir, precision=precision)
            )
        version = subprocess.run(
            [
                str(Path(args.infinity).parent / "python"),
                "-c",
                "import importlib.metadata as m; print(m.version('infinity-emb'))",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        versions += f", infinity-emb {version or 'unknown'}"
    # Before any server starts: the CPU is the encoder's alone.
    ceiling = batching_ceiling(precision, max(client_counts)) if args.unbatched else None
    counts = {"online": args.requests, "bulk": args.bulk_requests * WORKLOADS["bulk"]}
    from clearformer.bench.load import LoadMeter

    neighbours = start_busy_neighbours(args.busy_neighbour)
    neighbour_pids = {n.pid for n in neighbours}
    NEIGHBOUR_PIDS.update(neighbour_pids)
    meter = LoadMeter(threads=os.cpu_count() or 1, exclude=lambda: neighbour_pids).start()
    keys = [f"{w}@{c}" for w in workloads for c in client_counts]
    results: dict = {k: {s.name: {"rounds": []} for s in servers} for k in keys}
    answers = {}
    seed = 100
    try:
        for _ in range(args.rounds):
            for server in servers:
                server.start()
                try:
                    answers.setdefault(server.name, check_answers(server, make_sentences(8, 1)))
                    run_load(server, make_sentences(64, 2), 1, max(client_counts))  # warm the path
                    for key in keys:
                        workload, clients = key.split("@")
                        seed += 1
                        texts = make_sentences(counts[workload], seed)
                        run = run_load(server, texts, WORKLOADS[workload], int(clients))
                        results[key][server.name]["rounds"].append(run)
                        print(
                            f"{workload:>6} x{clients:>3} {server.name:>21}: "
                            f"{run['texts_per_s']:8.1f} texts/s, "
                            f"p50 {run['latency_ms']['p50']:7.1f} ms, "
                            f"p99 {run['latency_ms']['p99']:7.1f} ms, statuses {run['statuses']}, "
                            f"others busy on {run['load']['others_during']:.2f} CPUs",
                            flush=True,
                        )
                finally:
                    server.stop()
        # Before the neighbours end: once reaped, their time counts as this process's own.
        load = meter.record()
    finally:
        for neighbour in neighbours:
            neighbour.kill()
            neighbour.wait()
    for per_server in results.values():
        for run in per_server.values():
            rounds = sorted(run["rounds"], key=lambda r: r["texts_per_s"])
            run["median"] = rounds[(len(rounds) - 1) // 2]
    report = {
        "commands": {s.name: " ".join(s.command[1:]) for s in servers},
        "cpu": cpu_info().summary(),
        "cores": os.cpu_count(),
        "clients": client_counts,
        "rounds": args.rounds,
        "versions": versions,
        "precision": precision,
        "load": load.to_dict(),
        # Beside --busy-neighbour's processes the run is quiet when nothing else kept more
        # than the margin busy on top of them.
        "busy_neighbour": args.busy_neighbour,
        "quiet": (
            not load.loaded
            if not args.busy_neighbour
            else max(load.others_before or 0.0, load.others_during or 0.0)
            <= args.busy_neighbour + load.margin
        ),
        "quiet_reason": (
            load.describe()
            if not args.busy_neighbour
            else f"besides the neighbours' {args.busy_neighbour} CPU(s), nothing else busy "
            f"beyond {load.margin} CPU: others' CPUs {load.others_before or 0.0:.2f} before and "
            f"{load.others_during or 0.0:.2f} during the run, the neighbours included. CPU: "
            f"{load.cpu}"
        ),
        "results": results,
    }
    if ceiling is not None:
        report["ceiling"] = ceiling
    ours = np.asarray(answers["clearformer"], dtype=np.float64)
    agreement = []
    for name, theirs in answers.items():
        if name == "clearformer":
            continue
        theirs = np.asarray(theirs, dtype=np.float64)
        cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1)
        cosine /= np.linalg.norm(theirs, axis=1)
        agreement.append(f"{name} min {cosine.min():.7f}")
    if agreement:
        report["agreement"] = (
            "cosine of each server's embeddings of 8 sentences to clearformer's: "
            + ", ".join(agreement)
        )
    markdown = to_markdown(report)
    print(markdown)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(args.out.with_suffix(".json"), json.dumps(report, indent=1) + "\n")
        write_text_atomically(args.out.with_suffix(".md"), markdown)


if __name__ == "__main__":
    main()
