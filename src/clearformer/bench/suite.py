"""The whole benchmark run: options, sections, rows.

Sections:
    ``kernels``    attention alone on the ragged batch: each varlen method against padded SDPA.
    ``inference``  whole stacks, fixed and ragged batches, ``inference_mode``.
    ``long``       one layer, B 1, T in ``long_seqlens``: speed, and peak extra memory measured
                   in a fresh process per row (:mod:`clearformer.bench.memory`).
    ``training``   one step (forward, backward, AdamW) on fixed and ragged batches.
    ``packing``    packed against padded clearformer as padding grows from 0 (the basis of
                   ``clearformer.plan.PACK_MIN_PADDING``).
"""

from __future__ import annotations

import functools
import gc
import logging
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from ..checks import check_positive_int
from . import memory
from .flops import forward_flops, step_flops
from .gemm import gemm_rate
from .load import LoadMeter
from .peers import Peer, long_sequence_peers, stack_peers
from .timing import interleaved
from .workloads import SIZES, Batch, ModelSize, fixed_batch, ragged_batch

log = logging.getLogger(__name__)

# In running order: the cheap and the headline sections first, the threshold sweep last.
SECTIONS = ("kernels", "inference", "long", "training", "packing")


@dataclass(frozen=True)
class BenchOptions:
    """What to run. Validated on construction; every error names the option."""

    sizes: tuple[str, ...] = ("minilm", "bert-base")
    batch: int = 32  # sequences per inference batch
    seqlen: int = 128  # length of the fixed batches
    min_length: int = 16  # ragged lengths are uniform in [min_length, max_length] ...
    max_length: int = 256  # ... and padded to max_length
    train_batch: int = 16  # sequences per training step (fixed and ragged)
    long_seqlens: tuple[int, ...] = (512, 2048, 8192)
    repeats: int = 5  # timed rounds (medians reported)
    train_repeats: int = 3
    warmup: int = 1
    sections: tuple[str, ...] = SECTIONS
    with_math: bool = True  # include the math (reference) backend
    measure_memory: bool = True
    threads: int | None = None  # None: torch's default
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.sizes:
            if name not in SIZES:
                raise ValueError(f"size must be one of {sorted(SIZES)}, got {name!r}")
        if not self.sizes:
            raise ValueError("sizes must name at least one size")
        for name in (
            "batch",
            "seqlen",
            "min_length",
            "max_length",
            "train_batch",
            "repeats",
            "train_repeats",
        ):
            check_positive_int(getattr(self, name), name)
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads <= 0):
            raise ValueError(f"threads must be a positive int, got {self.threads!r}")
        limit = min(SIZES[name].max_length for name in self.sizes)
        for name in ("seqlen", "max_length"):
            value = getattr(self, name)
            if value > limit:
                raise ValueError(
                    f"{name} must be at most the models' maximum length {limit}, got {value}"
                )
        if self.min_length > self.max_length:
            raise ValueError(
                f"min_length must be <= max_length, got {self.min_length} > {self.max_length}"
            )
        for value in self.long_seqlens:
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"long_seqlens must be positive ints, got {value!r}")
        for name in self.sections:
            if name not in SECTIONS:
                raise ValueError(f"sections must be among {SECTIONS}, got {name!r}")
        # An empty list would run nothing and write an empty report, exit status 0.
        if not self.sections:
            raise ValueError(f"sections must name at least one of {SECTIONS}")
        if "long" in self.sections and not self.long_seqlens:
            raise ValueError("long_seqlens must name at least one length for section 'long'")

    @classmethod
    def quick(cls, **overrides) -> BenchOptions:
        """A run that finishes in under two minutes on an idle 2-core machine: MiniLM size, small
        batches, T <= 2048, no math backend, no packing-threshold sweep."""
        base = dict(
            sizes=("minilm",),
            sections=("kernels", "inference", "long", "training"),
            batch=8,
            train_batch=8,
            long_seqlens=(512, 2048),
            repeats=3,
            train_repeats=2,
            with_math=False,
        )
        base.update(overrides)
        return cls(**base)


@dataclass
class Results:
    options: dict
    environment: dict
    gemm_gflops: dict[str, float] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    # Whether the run was quiet: other processes' CPU time counted (bench/load.py), and
    # the GEMM rate measured first and last (a fall between them is load too).
    load: dict = field(default_factory=dict)
    gemm_first_last: dict[str, list[float]] = field(default_factory=dict)


def run_suite(
    options: BenchOptions,
    progress: Callable[[str], None] | None = None,
    on_section: Callable[[Results], None] | None = None,
) -> Results:
    """Run the selected sections and return every row.

    ``on_section`` receives the results so far after each section (to save partial output).
    """
    say = progress or (lambda message: log.info("%s", message))
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    meter = LoadMeter(threads=torch.get_num_threads()).start()
    results = Results(asdict(options), _environment())
    for name in options.sizes:
        say(f"GEMM rate at {name} shapes ...")
        results.gemm_gflops[name] = gemm_rate(SIZES[name])
        results.gemm_first_last[name] = [results.gemm_gflops[name]]
        say(f"  {results.gemm_gflops[name]:.0f} GFLOP/s")
    sections = {
        "kernels": _kernels,
        "packing": _packing,
        "inference": _inference,
        "training": _training,
        "long": _long,
    }
    for section in SECTIONS:
        if section in options.sections:
            sections[section](options, results, say)
            # A shared machine can be slow at any moment: measure the ceiling again after each
            # section and keep the highest figure (a rate the machine did reach), so a loaded
            # moment cannot flatter the utilisation figures.
            for name in options.sizes:
                rate = gemm_rate(SIZES[name])
                results.gemm_gflops[name] = max(results.gemm_gflops[name], rate)
                results.gemm_first_last[name][1:] = [rate]
            results.load = meter.record().to_dict()
            finalize(results)
            if on_section is not None:
                on_section(results)
    return results


def _environment() -> dict:
    from importlib import metadata

    from ..cpu import cpu_description
    from ..runtime import retain_freed_memory

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "x_transformers": version("x-transformers"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_description(),
        "threads": torch.get_num_threads(),
        "dtype": "float32",
        # Idempotent: the CLI already asked; a library caller gets the same setting here.
        "allocator": "glibc malloc retaining freed memory (M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"
        if retain_freed_memory()
        else "platform default malloc",
    }


def _batches(options: BenchOptions, size: ModelSize, batch: int) -> list[Batch]:
    return [
        fixed_batch(size, batch, options.seqlen, options.seed),
        ragged_batch(size, batch, options.min_length, options.max_length, options.seed),
    ]


def _row(section, size, batch_desc, peer_name, family, times, tokens, flops, cpu=None, **extra):
    seconds = statistics.median(times)
    if cpu:
        # Process CPU seconds per call: the load-independent cross-check of the wall time.
        extra["cpu_ms"] = statistics.median(cpu) * 1e3
    return {
        "section": section,
        "size": size.name,
        "workload": batch_desc,
        "impl": peer_name,
        "family": family,
        "seconds": seconds,
        "times": times,
        "real_tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "model_flops": flops,
        **extra,
    }


# -- sections --------------------------------------------------------------------------------
def _kernels(options: BenchOptions, results: Results, say) -> None:
    for name in options.sizes:
        size = SIZES[name]
        batch = ragged_batch(
            size, options.batch, options.min_length, options.max_length, options.seed
        )
        say(f"kernels {name}: varlen methods on {batch.describe()}")
        fns = _attention_calls(size, batch, options.seed)
        attn_flops = 4.0 * size.d_model * sum(n * n for n in batch.lengths)
        # no_grad, not inference_mode: jagged nested tensors cannot be built from inference
        # tensors in this torch version.
        with torch.no_grad():
            times = interleaved(fns, warmup=options.warmup, repeats=options.repeats)
        for impl, ts in times.items():
            results.rows.append(
                _row(
                    "kernels",
                    size,
                    batch.describe(),
                    impl,
                    "kernel",
                    ts,
                    batch.real_tokens,
                    attn_flops,
                    cpu=times.cpu[impl],
                )
            )


def _attention_calls(size: ModelSize, batch: Batch, seed: int) -> dict[str, Callable]:
    """Attention alone on one ragged batch: each varlen method and padded, masked SDPA."""
    import torch.nn.functional as F

    from ..packed_attention import varlen_attention
    from ..padding import unpad
    from ..routes import kernel_route
    from .varlen_methods import BENCH_METHODS, bench_varlen_attention

    B, T = batch.mask.shape
    H, Dh = size.n_heads, size.d_model // size.n_heads
    padded = torch.randn(B, T, 3, H, Dh, generator=torch.Generator().manual_seed(seed))
    rows, layout = unpad(padded.view(B, T, 3 * H * Dh), batch.mask)  # (N, 3*H*Dh)
    q, k, v = rows.view(-1, 3, H, Dh).unbind(1)  # (N, H, Dh) each
    pq, pk, pv = (t.transpose(1, 2) for t in padded.unbind(2))  # (B, H, T, Dh) each
    key_mask = batch.mask[:, None, None, :]  # (B, 1, 1, T)
    methods = ["sequence", "padded", "threads"]
    if kernel_route("avx512_attention").choice == "avx512":  # built, and auto takes it here
        methods.append("avx512")
    fns: dict[str, Callable] = {
        f"varlen {method}": functools.partial(varlen_attention, q, k, v, layout, method=method)
        for method in methods
    }
    for method in BENCH_METHODS:
        fns[f"varlen {method}"] = functools.partial(
            bench_varlen_attention, q, k, v, layout, method=method
        )
    fns["padded SDPA (masked)"] = functools.partial(
        F.scaled_dot_product_attention, pq, pk, pv, attn_mask=key_mask
    )
    return fns


PACKING_FRACTIONS = (0.0, 0.025, 0.05, 0.1, 0.2)


def _packing(options: BenchOptions, results: Results, say) -> None:
    """Packed vs padded clearformer on fixed-length batches with a little padding."""
    size = SIZES[options.sizes[0]]
    peers = [p for p in stack_peers(with_math=False) if p.name in _PACKING_PAIR]
    models = {p.name: p.build(size, size.n_layers).eval() for p in peers}
    models[_PACKING_PAIR[1]].load_state_dict(models[_PACKING_PAIR[0]].state_dict())
    base = fixed_batch(size, options.batch, options.seqlen, options.seed)
    gen = torch.Generator().manual_seed(options.seed)
    for fraction in PACKING_FRACTIONS:
        # Shorten each sequence by U[0, 2 * fraction * T] tokens: about `fraction` padding.
        cut = (torch.rand(options.batch, generator=gen) * 2 * fraction * options.seqlen).long()
        lengths = (options.seqlen - cut).clamp(min=1)  # (B,)
        mask = torch.arange(options.seqlen)[None, :] < lengths[:, None]  # (B, T)
        batch = Batch("ragged", base.x, mask, tuple(int(n) for n in lengths))
        label = f"B {options.batch} x T {options.seqlen}, {batch.padding:.1%} padding"
        say(f"packing {size.name}: {label}")
        fns = {p.name: _call(p, models[p.name], batch.x, mask) for p in peers}
        with torch.inference_mode():
            times = interleaved(fns, warmup=options.warmup, repeats=options.repeats)
        flops = forward_flops(size, batch.lengths)
        for p in peers:
            results.rows.append(
                _row(
                    "packing",
                    size,
                    label,
                    p.name,
                    p.family,
                    times[p.name],
                    batch.real_tokens,
                    flops,
                    padding=batch.padding,
                    cpu=times.cpu[p.name],
                )
            )


_PACKING_PAIR = ("clearformer varlen", "clearformer sdpa")


def _inference(options: BenchOptions, results: Results, say) -> None:
    for name in options.sizes:
        size = SIZES[name]
        peers = stack_peers(with_math=options.with_math)
        models = {p.name: p.build(size, size.n_layers).eval() for p in peers}
        for batch in _batches(options, size, options.batch):
            say(f"inference {name}: {batch.describe()} ({len(peers)} implementations)")
            mask = None if batch.kind == "fixed" else batch.mask
            fns = {p.name: _call(p, models[p.name], batch.x, mask) for p in peers}
            with torch.inference_mode():
                times = interleaved(fns, warmup=options.warmup, repeats=options.repeats)
            flops = forward_flops(size, batch.lengths)
            for p in peers:
                results.rows.append(
                    _row(
                        "inference",
                        size,
                        batch.describe(),
                        p.name,
                        p.family,
                        times[p.name],
                        batch.real_tokens,
                        flops,
                        note=p.note,
                        cpu=times.cpu[p.name],
                    )
                )
        del models
        gc.collect()


def _call(peer: Peer, model, x: Tensor, mask: Tensor | None):
    return lambda: peer.run(model, x, mask)


def _training(options: BenchOptions, results: Results, say) -> None:
    for name in options.sizes:
        size = SIZES[name]
        # Every model keeps its AdamW state while the rounds interleave (BERT-base: 1.4 GB
        # each), so rows that add no information are left out: varlen trains as auto does on a
        # ragged batch, math as sdpa but slower, and torch.nn has no fast path in training, so
        # its pre-norm stack runs the same plain path as its post-norm one.
        skip = ("clearformer varlen", "torch.nn pre-norm")
        peers = [p for p in stack_peers(with_math=False) if p.name not in skip]
        for batch in _batches(options, size, options.train_batch):
            say(f"training {name}: {batch.describe()} ({len(peers)} implementations)")
            mask = None if batch.kind == "fixed" else batch.mask
            steps = {p.name: _train_step(p, size, batch.x, mask) for p in peers}
            times = interleaved(steps, warmup=options.warmup, repeats=options.train_repeats)
            flops = step_flops(size, batch.lengths, training=True)
            for p in peers:
                note = "plain path (no fast path in training)" if p.family == "torch.nn" else ""
                results.rows.append(
                    _row(
                        "training",
                        size,
                        batch.describe(),
                        p.name,
                        p.family,
                        times[p.name],
                        batch.real_tokens,
                        flops,
                        note=note,
                        cpu=times.cpu[p.name],
                    )
                )
            del steps
            gc.collect()


def _train_step(peer: Peer, size: ModelSize, x: Tensor, mask: Tensor | None):
    torch.manual_seed(0)
    model = peer.build(size, size.n_layers).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        out = peer.run(model, x, mask)  # (B, T, D)
        # Only real positions carry a loss, as in any masked objective.
        loss = (out[mask] if mask is not None else out).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _long(options: BenchOptions, results: Results, say) -> None:
    size = SIZES["minilm"] if "minilm" in options.sizes else SIZES[options.sizes[0]]
    for seqlen in options.long_seqlens:
        # math materialises (H, T, T) scores and probabilities: skip it where that is > 2 GB.
        with_math = options.with_math and 2 * size.n_heads * seqlen * seqlen * 4 <= 2 * 1024**3
        peers = long_sequence_peers(with_math=with_math)
        say(f"long: one {size.name} layer at T={seqlen} ({len(peers)} implementations)")
        x = torch.randn(1, seqlen, size.d_model, generator=torch.Generator().manual_seed(0))
        models = {p.name: p.build(size, 1).eval() for p in peers}
        fns = {p.name: _call(p, models[p.name], x, None) for p in peers}
        with torch.inference_mode():
            times = interleaved(fns, warmup=options.warmup, repeats=options.repeats)
        del models, fns
        gc.collect()
        flops = forward_flops(size, [seqlen], n_layers=1)
        for p in peers:
            extra = {}
            if options.measure_memory:
                say(f"  peak memory of {p.name} at T={seqlen} (fresh process)")
                probe = memory.measure(p.name, size.name, seqlen, torch.get_num_threads())
                extra["peak_extra_mb"] = probe["peak_extra_bytes"] / 2**20
            results.rows.append(
                _row(
                    "long",
                    size,
                    f"1 layer, B 1, T {seqlen}",
                    p.name,
                    p.family,
                    times[p.name],
                    seqlen,
                    flops,
                    note=p.note,
                    **extra,
                    cpu=times.cpu[p.name],
                )
            )


def finalize(results: Results) -> None:
    """Utilisation against the GEMM rate, and each row's ratio to the best torch.nn row of its
    workload (and, for one long layer, to the SDPA layer's speed and memory)."""
    for row in results.rows:
        gemm = results.gemm_gflops.get(row["size"])
        row["mfu"] = row["model_flops"] / row["seconds"] / (gemm * 1e9) if gemm else None
    groups: dict[tuple, list[dict]] = {}
    for row in results.rows:
        groups.setdefault((row["section"], row["size"], row["workload"]), []).append(row)
    for rows in groups.values():
        torch_nn = [r["tokens_per_s"] for r in rows if r["family"] == "torch.nn"]
        best = max(torch_nn) if torch_nn else None
        sdpa = next((r for r in rows if r["family"] == "sdpa"), None)
        for row in rows:
            row["vs_torch_nn"] = row["tokens_per_s"] / best if best else None
            if sdpa is not None:
                row["vs_sdpa"] = row["tokens_per_s"] / sdpa["tokens_per_s"]
                if "peak_extra_mb" in row and sdpa.get("peak_extra_mb"):
                    row["memory_vs_sdpa"] = row["peak_extra_mb"] / sdpa["peak_extra_mb"]
