"""The AVX-512 kernels measured against PyTorch's routes, at MiniLM's shapes, on this CPU.

Each of clearformer's AVX-512 kernels (:mod:`clearformer.fast.avx512`) replaces a PyTorch
route that computes the same values. Which is faster depends on the CPU (MKL's AVX2 code on
AMD processors, AVX-512 on Intel's), so :func:`calibrate` times both at the shapes a
MiniLM-sized encoder (width 384, 12 heads of 32, feed-forward 1536) meets in ``encode``: two
batches of short ragged sentences and one long sequence, each side alternately, a few rounds,
medians (:func:`clearformer.calibration.measure.measure_choice`). The verdicts are cached per
CPU model, PyTorch, clearformer and kernel build (:mod:`clearformer.calibration.cache`), and
``auto`` reads them (:func:`clearformer.routes.kernel_route`).

* ``avx512_attention``: the packed kernel against the varlen method ``auto`` takes without it
  (``threads`` or ``sequence``), and on one long unpadded sequence against SDPA's flash kernel.
* ``avx512_attention_bf16``: the same on bfloat16 rows, the kernel's widening to float32 and
  rounding back included, against PyTorch's bfloat16 routes.
* ``avx512_flash`` and ``avx512_flash_bf16`` (the latter on CPUs with AVX512-BF16): the flash
  kernel of float32 and of bfloat16 rows against the route ``auto`` takes without it, on a
  grouped-query model's heads (16 query and 8 key/value heads of 64): causal sentences,
  bidirectional passages, and one causal sequence of ``FLASH_LONG`` tokens.
* ``avx512_linear``: the three products of a post-norm block that carry an epilogue (the first
  feed-forward product with the exact GELU; the attention output and the second feed-forward
  product with the residual add and the LayerNorm) against oneDNN's fused products, both on
  weights reordered once, as ``encode`` runs them; ``avx512_linear_rows`` the same on a
  sentence's few rows alone (1, 10, 19 and 40: the kernel streams each weight panel once
  there), as a server's lone requests and a decoding step run them.
* ``avx512_dropout``: dropout with counter-based masks against PyTorch's dropout, in training's
  sizes: a batch's hidden states and its attention probabilities, float32 and bfloat16.

It takes a few seconds on two cores and runs only when asked: ``clearformer calibrate``, an
``encode`` call large enough to build the kernels (:func:`measure_if_missing`), or the start
of ``clearformer serve`` (:func:`measure_before_serving`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import progress, routes
from ..fast import avx512, avx512_linear, counter_dropout
from ..fast.fused_linear import onednn_linear
from ..fast.reordered_weights import ReorderedWeights
from ..fast.varlen import attend
from ..machine import machine
from ..options import Decision
from ..padding import layout_from_cu_seqlens
from ..runtime import counter_masks
from . import cache
from .measure import Verdict, Workload, measure_choice

log = logging.getLogger(__name__)

# MiniLM-L6's shapes (sentence-transformers' all-MiniLM-L6-v2, the bundled model's family).
WIDTH, HEADS, HEAD_DIM, MLP = 384, 12, 32, 1536
# (name, number of sequences, shortest, longest): short sentences, longer passages, and one
# long sequence (unpadded: the padded layout, where SDPA's flash kernel is PyTorch's route).
BATCHES = (
    ("32 sentences of 8-48 tokens", 32, 8, 48),
    ("8 passages of 48-160 tokens", 8, 48, 160),
)
LONG = 512
# The flash kernels' workloads: a grouped-query model's heads, one long sequence.
FLASH_HEADS, FLASH_KV_HEADS, FLASH_HEAD_DIM, FLASH_LONG = 16, 8, 64, 1024
BASELINE = "torch"
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` found: the verdicts by kernel (empty where nothing could be
    measured), the file they are kept in, whether they were measured now, and why not."""

    verdicts: dict[str, Verdict]
    path: Path | None
    measured: bool
    reason: str
    key: cache.CalibrationKey | None = None


def calibrate(*, force: bool = False, rounds: int | None = None) -> Calibration:
    """Measure the AVX-512 kernels against PyTorch's routes on this CPU and cache the
    verdicts, building the library first if need be; with verdicts already cached for this
    CPU and build, return those unless ``force`` or they are provisional (measured while
    other processes were busy, and not by this process: :func:`cache.settled`). One process
    measures at a time (:func:`cache.turn`); one that waited reads what the other measured.
    Never raises for a machine that cannot run the kernels, nor for a cache folder that
    cannot keep the verdicts (this process uses them all the same): the result says why."""
    supported = machine().avx512
    if supported.choice != "available":
        return Calibration({}, None, False, f"nothing to measure: {supported.reason}")
    key = avx512.calibration_key()
    before = None if force else cache.read(key)
    if not force and cache.settled(key, before, avx512.kernels_here()):
        return _cached(key, before)
    loaded = avx512.load(build=False)
    if loaded.choice == "not built":
        # A compile of several seconds, which a person at a terminal should not wait through
        # in silence.
        progress.phase("building clearformer's AVX-512 kernels (once per machine)")
        loaded = avx512.load(build=True)
    if loaded.choice != "loaded":
        return Calibration(
            {}, None, False, f"the AVX-512 library is {loaded.choice}: {loaded.reason}", key
        )
    with cache.turn():
        if not force:
            # Again: a process this one waited for may have measured them. Those are taken
            # even where provisional: measured just now, they are what this start would get.
            now = cache.read(key)
            if now is not None and now != before:
                cache.settle(key)
            if cache.settled(key, now, avx512.kernels_here()):
                return _cached(key, now)
        return _measure(key, rounds)


def _cached(key: cache.CalibrationKey, verdicts: dict) -> Calibration:
    return Calibration(verdicts, cache.stored_path(key), False, "cached", key)


def _measure(key: cache.CalibrationKey, rounds: int | None) -> Calibration:
    """Time every kernel's workloads and keep the verdicts (the library is loaded)."""
    from ..bench.load import LoadMeter

    log.info("calibrating clearformer's AVX-512 kernels against PyTorch on %s", key.cpu)
    # Other processes' CPU time while measuring (no idle probe: seconds matter here).
    meter = LoadMeter(threads=torch.get_num_threads(), probe_seconds=0).start()
    options = {} if rounds is None else {"rounds": rounds}
    # Built outside inference mode: weights made inside it could not be packed.
    workloads = {
        "avx512_attention": attention_workloads(),
        "avx512_attention_bf16": attention_workloads(torch.bfloat16),
        "avx512_linear": linear_workloads(),
        avx512.LINEAR_ROWS: linear_workloads(few_rows=(1, 10, 19, 40)),
        avx512.FLASH: flash_workloads(torch.float32),
        avx512.DROPOUT: dropout_workloads(),
    }
    if avx512.FLASH_BF16 in avx512.kernels_here():
        workloads[avx512.FLASH_BF16] = flash_workloads(torch.bfloat16)
    total = sum(len(work) for work in workloads.values())
    progress.phase(
        f"calibrating kernels for this CPU (once per machine): {len(workloads)} kernels "
        f"against PyTorch's routes, {total} workloads"
    )
    timed = progress.Meter("calibrating", total, "workloads")
    done = 0

    def one_more(workload: Workload) -> None:
        nonlocal done
        done += 1
        timed.report(done)

    with torch.inference_mode():
        verdicts = {
            kernel: measure_choice(kernel, work, baseline=BASELINE, on_workload=one_more, **options)
            for kernel, work in workloads.items()
        }
    load = meter.record()
    if load.loaded:
        log.warning(
            "clearformer's kernels were measured while other processes were busy (%s); the "
            "verdicts may not hold on a quiet machine: they are used for now and measured "
            "again by the next process that calibrates",
            load.reason,
        )
    context = {
        "cpu": load.cpu,
        "threads": torch.get_num_threads(),
        "others_busy_cpus": load.others_during,
        "loaded": load.loaded,
        "load": load.reason,
    }
    verdicts = {k: dataclasses.replace(v, context=context) for k, v in verdicts.items()}
    try:
        path = cache.write(key, verdicts)
    except OSError as error:
        # A read-only or missing cache folder: the measurement still serves this process (a
        # server's start, a training run's first step must not fail over a cache).
        log.warning(
            "clearformer's kernel verdicts could not be cached (%s); used by this process only",
            error,
        )
        cache.keep_unsaved(key, verdicts)
        return Calibration(verdicts, None, True, "measured (not cached)", key)
    return Calibration(verdicts, path, True, "measured", key)


def measure_if_missing() -> Calibration | None:
    """Calibrate where ``auto`` would read a verdict and there is none yet: an AVX-512 CPU
    with the library built and loaded, neither kernel switched off or forced on, calibration
    not switched off. None where nothing was needed. ``encode`` calls it once it has built
    the library for a large call, which repays the seconds this takes."""
    if not avx512.is_loaded() or not routes.verdicts_wanted():
        return None
    return calibrate()


def measure_before_serving() -> Calibration | None:
    """Calibrate, building the library first (:func:`calibrate` does), where ``auto`` would
    read a verdict and none is cached, on a CPU that can build it
    (:func:`clearformer.routes.kernels_wanted`); None where nothing was needed. A build that
    fails gives a calibration that measured nothing and says why. ``clearformer serve`` calls
    it before it loads its models: a server runs for hours, so seconds once per machine repay
    at once, and done before it reports ready, the measurement meets no request and no route
    changes while it serves. ``clearformer.train`` calls it before a CPU run's first step, for
    the same reasons."""
    if not routes.kernels_wanted() or not routes.verdicts_wanted():
        return None
    return calibrate()


def attention_workloads(dtype: torch.dtype = torch.float32) -> list[Workload]:
    """The attention kernel and PyTorch's route on MiniLM's heads, rows of ``dtype``: each
    ragged batch packed, and the long sequence unpadded."""
    workloads = []
    for name, count, shortest, longest in BATCHES:
        lengths = _lengths(count, shortest, longest)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        layout = layout_from_cu_seqlens(cu)
        # (N, 3, H, Dh) projection rows, split as attention gets them: strided views
        q, k, v = torch.randn(layout.num_tokens, 3, HEADS, HEAD_DIM, dtype=dtype).unbind(1)
        call = routes.VarlenCall(torch.device("cpu"), dtype, HEAD_DIM)
        without = Decision("torch", "calibration: PyTorch's side")
        method = routes.varlen_method(layout, call, avx512_taken=without).choice
        scale = HEAD_DIM**-0.5
        workloads.append(
            Workload(
                f"attention, {name}, packed",
                {
                    BASELINE: lambda q=q, k=k, v=v, la=layout, m=method: attend(q, k, v, la, m),
                    "avx512": lambda q=q, k=k, v=v, la=layout, s=scale: avx512.attention(
                        q, k, v, la.cu_seqlens, s
                    ),
                },
            )
        )
    x = torch.randn(1, LONG, 3, HEADS, HEAD_DIM, dtype=dtype)
    q, k, v = (t.transpose(1, 2) for t in x.unbind(2))  # (1, H, T, Dh) views
    rows = [t.view(LONG, HEADS, HEAD_DIM) for t in x.unbind(2)]  # (T, H, Dh) views
    bounds = torch.tensor([0, LONG], dtype=torch.int64)
    workloads.append(
        Workload(
            f"attention, one sequence of {LONG} tokens, unpadded",
            {
                BASELINE: lambda: F.scaled_dot_product_attention(q, k, v),
                # (T, H, Dh) -> (1, H, T, Dh): a view, as clearformer.kernels.sdpa returns it
                "avx512": lambda: (
                    avx512.attention(*rows, bounds, HEAD_DIM**-0.5)
                    .view(1, LONG, HEADS, HEAD_DIM)
                    .transpose(1, 2)
                ),
            },
        )
    )
    return workloads


def dropout_workloads() -> list[Workload]:
    """Dropout (p = 0.1) on a training batch's hidden states, 32 texts of 128 tokens at
    MiniLM's width, and on their attention probabilities (32 x 12 heads x 128 x 128), in
    float32 and bfloat16: PyTorch's against :func:`clearformer.fast.counter_dropout.dropout`
    inside ``counter_masks()``, as a training run calls it (the library is loaded here)."""
    workloads = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, shape in (
            ("hidden states", (32 * 128, WIDTH)),
            ("attention probabilities", (32, HEADS, 128, 128)),
        ):
            x = torch.rand(shape, dtype=dtype)

            def ours(x=x):
                with counter_masks():
                    return counter_dropout.dropout(x, 0.1)

            workloads.append(
                Workload(
                    f"{_DTYPE_NAMES[dtype]} dropout on {name} {tuple(shape)}",
                    {BASELINE: lambda x=x: F.dropout(x, 0.1, True), "avx512": ours},
                )
            )
    return workloads


def flash_workloads(dtype: torch.dtype) -> list[Workload]:
    """The flash kernel of ``dtype`` and the varlen method ``auto`` takes without it, on
    grouped rows of ``dtype`` as a rotary model's attention gets them (queries and keys new
    tensors, values a view of the projection's rows)."""
    workloads = []
    cases = [
        (*BATCHES[0], True),
        (*BATCHES[1], False),
        (f"one sequence of {FLASH_LONG} tokens", 1, FLASH_LONG, FLASH_LONG, True),
    ]
    for name, count, shortest, longest, causal in cases:
        lengths = _lengths(count, shortest, longest)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        layout = layout_from_cu_seqlens(cu)
        heads, kv, dh = FLASH_HEADS, FLASH_KV_HEADS, FLASH_HEAD_DIM
        rows = torch.randn(layout.num_tokens, (heads + 2 * kv) * dh, dtype=dtype)
        # (N, (H + 2 Hkv) Dh) -> q (N, H, Dh), k and v (N, Hkv, Dh)
        q = rows[:, : heads * dh].reshape(-1, heads, dh).clone()
        k = rows[:, heads * dh : (heads + kv) * dh].reshape(-1, kv, dh).clone()
        v = rows[:, (heads + kv) * dh :].view(-1, kv, dh)
        call = routes.VarlenCall(
            torch.device("cpu"), dtype, dh, causal, grouped=True, rows_apart=True
        )
        without = Decision("torch", "calibration: PyTorch's side")
        method = routes.varlen_method(layout, call, avx512_taken=without).choice
        scale = dh**-0.5
        kind = "causal" if causal else "bidirectional"
        workloads.append(
            Workload(
                f"{_DTYPE_NAMES[dtype]} grouped attention, {name} ({kind}), packed",
                {
                    BASELINE: lambda q=q, k=k, v=v, la=layout, m=method, c=causal: attend(
                        q, k, v, la, m, is_causal=c
                    ),
                    "avx512": lambda q=q, k=k, v=v, la=layout, s=scale, c=causal: (
                        avx512.flash_attention(q, k, v, la.cu_seqlens, s, c)
                    ),
                },
            )
        )
    return workloads


def linear_workloads(few_rows: tuple[int, ...] = ()) -> list[Workload]:
    """A post-norm block's three products with an epilogue, on clearformer's kernel and on
    oneDNN, weights reordered once for each, at the rows of each batch and of the long
    sequence, or at each of ``few_rows`` (a sentence alone) where given. Few rows run six
    blocks of weights each, as a six-layer model does (one block's weights would stay in cache
    between repeats, which a model's do not)."""
    with torch.no_grad():  # packing needs weights that are not inference tensors
        blocks = [
            (nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, MLP), nn.Linear(MLP, WIDTH))
            for _ in range(6 if few_rows else 1)
        ]
        norm = nn.LayerNorm(WIDTH)
        packing = ReorderedWeights()
        layers = [layer for block in blocks for layer in block]
        own = {id(layer): packing.weight_for(layer, "avx512") for layer in layers}
        onednn = {id(layer): packing.weight_for(layer, "onednn") for layer in layers}

    def block_kernel(x, residual):
        for attn_out, fc_in, fc_out in blocks:
            a = avx512_linear.linear(x, own[id(attn_out)], attn_out, residual=residual, norm=norm)
            g = avx512_linear.linear(a, own[id(fc_in)], fc_in, activation="gelu")
            x = avx512_linear.linear(g, own[id(fc_out)], fc_out, residual=a, norm=norm)
        return x

    def block_onednn(x, residual):
        for attn_out, fc_in, fc_out in blocks:
            a = norm(onednn_linear(x, onednn[id(attn_out)], attn_out, residual=residual))
            g = onednn_linear(a, onednn[id(fc_in)], fc_in, activation="gelu")
            x = norm(onednn_linear(g, onednn[id(fc_out)], fc_out, residual=a))
        return x

    workloads = []
    # The products' cost grows with the rows alone: the short sentences and the long sequence
    # span the row counts encode's batches have.
    if few_rows:
        sizes = [("a sentence alone, six blocks", rows) for rows in few_rows]
    else:
        sizes = [(name, sum(_lengths(count, lo, hi))) for name, count, lo, hi in BATCHES[:1]]
        sizes.append((f"one sequence of {LONG} tokens", LONG))
    for name, rows in sizes:
        x, residual = torch.randn(rows, WIDTH), torch.randn(rows, WIDTH)
        workloads.append(
            Workload(
                f"linear epilogues, {name} ({rows} rows)",
                {
                    BASELINE: lambda x=x, r=residual: block_onednn(x, r),
                    "avx512": lambda x=x, r=residual: block_kernel(x, r),
                },
            )
        )
    return workloads


def _lengths(count: int, shortest: int, longest: int) -> list[int]:
    """``count`` sentence lengths drawn from a fixed seed (the same batches every run)."""
    g = torch.Generator().manual_seed(count * 1000 + longest)
    return torch.randint(shortest, longest + 1, (count,), generator=g).tolist()
