"""clearformer's own packed-attention kernel for AVX-512 CPUs (varlen method ``avx512``).

PyTorch's CPU flash-attention kernel does its products in the BLAS library's sgemm. On AMD
processors MKL runs its AVX2 code, so attention there ran at a quarter to a third of the rate
oneDNN's AVX-512 linear products reach on the same core; ``avx512_attention.cpp`` (beside this
file) computes each sequence's attention in AVX-512 registers instead, 1.35-2.3x faster than
the flash kernel at 8-256 tokens on such a CPU (docs/performance.md, "Attention on AMD
processors"). On an Intel Xeon with AMX, where MKL runs AVX-512, it was faster alone but whole
``encode`` calls were slower with the library on (0.89x-0.99x): which side wins depends on the
CPU, so ``auto`` takes it only where this CPU measured it faster
(:func:`clearformer.routes.kernel_route`, :mod:`clearformer.calibration`).

The same library carries clearformer's AVX-512 linear kernel (``avx512_linear.cpp``, which
:mod:`clearformer.fast.avx512_linear` routes calls to) and flash-style attention kernels for
float32 rows (``avx512_flash.cpp``) and for bfloat16 rows on CPUs with AVX512-BF16
(``avx512_flash_bf16.cpp``), both behind :func:`flash_attention`: one build, one load.

It is C++, so it is compiled here, by the system's C++ compiler (``$CXX``, else ``g++``), once
per source, PyTorch version and compiler, into clearformer's cache folder
(:func:`clearformer.machine.cache_folder`)/kernels; later processes load the built
library in milliseconds. Beside it, a record of what the build wrote (its size and SHA-256):
a library that does not match its record (cut short by a full disk or a crash, emptied, or
left without a record by a build that stopped) is never loaded (a truncated one would stop
the process with SIGBUS) but removed, and built again where a build is allowed; one that
fails to load is removed too. One process at a time builds or removes a library
(``kernels/<name>.lock``); the others wait for it and load what it built. Nothing is
compiled unless asked: :func:`load` with ``build=True``
(``TextEncoder.encode`` asks for calls of at least ``BUILD_MIN_TOKENS`` tokens on CPUs that
:func:`clearformer.routes.kernels_wanted` names, and measures it there), ``clearformer
calibrate``, or a call with ``method="avx512"``. Where it cannot be built (no AVX-512, no
compiler, another platform) :func:`load` says why and every call keeps PyTorch's kernels.
The switches (:mod:`clearformer.switches`: ``CLEARFORMER_KERNELS``, ``CLEARFORMER_AVX512``)
turn it off, a library already built and loaded included.

What it serves: float32 CPU rows without gradients, heads a multiple of 16 wide, plain
bidirectional attention (no causal mask, window, bias or dropout); the varlen kernel sends every
other call to PyTorch's kernels. bfloat16 rows are widened to float32 for the kernel and its
output rounded back to bfloat16: PyTorch's bfloat16 attention on the CPU also computes in
float32 and rounds once at the end, so the two differ by that rounding only. Whether ``auto``
takes it for bfloat16 rows is a verdict of its own (``avx512_attention_bf16``), measured with
the conversions included: PyTorch's bfloat16 route is not its float32 one.

The bfloat16 flash kernel (``avx512_flash_bf16.cpp``, its own verdict ``avx512_flash_bf16``)
takes the bfloat16 calls the first one cannot: causal attention, local windows, grouped keys
and values, and queries and keys made apart from the values (rotary positions, per-head
norms), heads a multiple of 32 wide, any length (the scores of one block of keys at a time).
It multiplies bfloat16 pairs into float32 sums (AVX512-BF16's vdpbf16ps) in both products,
the probabilities rounded to bfloat16 for the second as flash attention in bfloat16 does on
GPUs; softmax in float32. At long inputs attention is half of a grouped-query model's work, and
PyTorch's bfloat16 attention on a CPU without AMX runs near its float32 rate. Its float32 twin
(``avx512_flash.cpp``, verdict ``avx512_flash``) takes the same calls on float32 rows (float32
and int8 models, whose attention runs in float32) with plain FMAs in both products: PyTorch's
flash kernel does its products in the BLAS library's sgemm (MKL's AVX2 code on AMD processors)
and reads a grouped key/value head once per query head.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import Tensor

from ..calibration.cache import CalibrationKey, held_lock
from ..cpu import cpu_info
from ..machine import cache_folder, compiler, machine
from ..options import Decision
from ..runtime import capturing_graph
from ..version import __version__
from . import library_record

log = logging.getLogger(__name__)

# Built into one library: the attention kernel and the linear layers with their epilogue
# (clearformer.fast.avx512_linear says which calls take those).
SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "avx512_attention.cpp",
        "avx512_linear.cpp",
        "avx512_flash.cpp",
        "avx512_flash_bf16.cpp",
        "avx512_dropout.cpp",
        "avx512_int8_blocks.cpp",
    )
)
# Included by the sources (the shared exponential): part of what the build's name hashes.
HEADERS = tuple(Path(__file__).with_name(n) for n in ("avx512_exp.h", "avx512_flash_plan.h"))
# -fopenmp: ATen's parallel_for is a header template that splits work across threads only where
# the including file is compiled with OpenMP; without it every call ran on one thread. The
# library then needs libgomp.so.1, which resolves to the copy PyTorch has already loaded.
COMPILE_FLAGS = (
    "-O3",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-mavx512f",
    "-mavx512dq",
    "-mfma",
)
# A cold build takes about 10 s on two cores: an encode call is worth building for from this
# many tokens (about 20,000 sentence-length texts), where the kernels save more than that.
BUILD_MIN_TOKENS = 500_000
# Or from this much attention (multiply-adds of the scores: sum of squared lengths x layers x
# heads x head width; about one text of 6,000 tokens at Qwen3-Embedding-0.6B's shape), where
# the bfloat16 flash kernel saves more than the build and the calibration take.
BUILD_MIN_ATTENTION = 2 * 10**12

_lock = threading.Lock()
_state: dict[str, Decision] = {}  # "load" -> the outcome of the first load in this process


# The library's kernels, as the switches and the calibration name them: the attention kernel
# has a verdict for float32 rows and one for bfloat16 rows (widened for it), and each flash
# kernel (float32, bfloat16) one of its own, all under the attention switch.
KERNELS = (
    "avx512_attention",
    "avx512_attention_bf16",
    "avx512_linear",
    "avx512_linear_rows",
    "avx512_flash",
    "avx512_flash_bf16",
    "avx512_dropout",
)
FLASH = "avx512_flash"
DROPOUT = "avx512_dropout"
# The linear kernel on a sentence's few rows (panels outer): a verdict of its own, since oneDNN
# and the kernel rank otherwise there than on a batch's rows; the linear switch covers both.
LINEAR_ROWS = "avx512_linear_rows"
FLASH_BF16 = "avx512_flash_bf16"
# The flash kernels' ops in the library, by the dtype of the rows they take.
_FLASH_OPS = {torch.float32: "flash_attention_f32", torch.bfloat16: "flash_attention_bf16"}
# Heads the flash kernel takes: a multiple of this many values wide (two 16-lane vectors).
FLASH_HEAD_MULTIPLE = 32


def bf16_products() -> bool:
    """This CPU has AVX512-BF16 (vdpbf16ps), which the bfloat16 flash kernel runs on."""
    return "avx512_bf16" in cpu_info().flags


def kernels_here() -> tuple[str, ...]:
    """The :data:`KERNELS` this CPU can run (the bfloat16 flash kernel needs AVX512-BF16, and a
    library built with it where one is loaded): the ones the calibration measures and ``auto``
    reads a verdict for."""
    flash_bf16 = bf16_products() and (not is_loaded() or _has_flash_op(torch.bfloat16))
    return tuple(k for k in KERNELS if k != FLASH_BF16 or flash_bf16)


def flash_kernel(dtype: torch.dtype) -> str:
    """The flash kernel's name in :data:`KERNELS` for rows of ``dtype``."""
    return FLASH_BF16 if dtype == torch.bfloat16 else FLASH


def _has_flash_op(dtype: torch.dtype) -> bool:
    """The loaded library has the flash kernel for rows of ``dtype`` (a compiler without
    AVX512-BF16 intrinsics builds it without the bfloat16 one)."""
    name = _FLASH_OPS.get(dtype)
    return name is not None and hasattr(torch.ops.clearformer_avx512, name)


def attention_kernel(dtype: torch.dtype) -> str:
    """The attention kernel's name in :data:`KERNELS` for rows of ``dtype``: its own verdict
    for bfloat16 rows, the float32 one otherwise."""
    return "avx512_attention_bf16" if dtype == torch.bfloat16 else "avx512_attention"


@functools.cache
def calibration_key() -> CalibrationKey:
    """What this library's measured verdicts depend on: the CPU, PyTorch, clearformer and
    this build (the library's hash, :func:`library_path`)."""
    info = cpu_info()
    cpu = f"{info.model} (family {info.family})" if info.family else info.model
    return CalibrationKey(cpu, torch.__version__, __version__, _build_hash())


def is_loaded() -> bool:
    """The kernel is loaded in this process (``torch.ops.clearformer_avx512``)."""
    outcome = _state.get("load")
    return outcome is not None and outcome.choice == "loaded"


def load(build: bool = True) -> Decision:
    """Load the kernel, building it first when ``build`` and it is not in the cache.

    Returns ``Decision("loaded" | "not built" | "unavailable", reason)``; never raises for a
    machine that cannot build it (the reason is logged once). Safe to call from several
    threads and processes: one builds, the others wait for it (``kernels/<name>.lock``).
    """
    with _lock:
        if "load" in _state:
            return _state["load"]
        supported = machine().avx512
        if supported.choice != "available":
            return _remember(supported)
        try:
            library = library_path()
        except OSError as error:  # no cache folder: nowhere to build or find it
            return _remember(Decision("unavailable", str(error)))
        if not library.exists() and not build:
            return Decision("not built", f"no {library.name} in {library.parent} yet")
        if library_record.fault(library) is not None:
            # Built, removed or waited for under the build's lock.
            outcome = _make_sound(library, build)
            if outcome is not None:
                return outcome
        try:
            torch.ops.load_library(str(library))
        except OSError as error:  # the dynamic loader refused the file
            # Removed, so that the next build makes it again rather than every later process
            # meeting the same file.
            with held_lock(_lock_path(library), wait=False) as held:
                if held:
                    with contextlib.suppress(OSError):  # unused here either way
                        library_record.discard(library)
            return _remember(Decision("unavailable", f"{library} did not load: {error}"))
        except RuntimeError as error:  # PyTorch refused its ops: the file may serve others
            return _remember(Decision("unavailable", f"{library} did not load: {error}"))
        return _remember(Decision("loaded", str(library)))


def _make_sound(library: Path, build: bool) -> Decision | None:
    """Under ``library``'s lock: None once ``library`` matches its record (another process
    built it meanwhile, or this one built it now), else the outcome to return. A damaged
    library is removed first (one warning). Without ``build`` (a route's check: no compile,
    no wait for another process's), "not built"."""
    with held_lock(_lock_path(library), wait=build) as held:
        if not held:
            return Decision("not built", f"{library.name} is being built by another process")
        fault = library_record.fault(library)  # again: the lock's last holder may have built it
        if fault is None:
            return None
        if library.exists():
            try:
                library_record.discard(library)
            except OSError as error:  # a read-only folder: no build could replace it either
                return _remember(
                    Decision("unavailable", f"{library} {fault} and cannot be removed: {error}")
                )
            then = "building it again" if build else "the next build makes it again"
            log.warning("clearformer's AVX-512 library %s %s; removed, %s", library, fault, then)
        if not build:
            return Decision("not built", f"no {library.name} in {library.parent} yet")
        try:
            _build(library)
        except subprocess.CalledProcessError as error:
            said = (error.stderr or "").strip()[-800:]
            return _remember(Decision("unavailable", f"the build failed: {said}"))
        except OSError as error:
            return _remember(Decision("unavailable", f"the build failed: {error}"))
        return None


def attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: float) -> Tensor:
    """softmax(q k^T * scale) v within each sequence of ``cu_seqlens``: q, k, v (N, H, Dh)
    with equal strides and a contiguous last dimension, float32 or bfloat16 (widened);
    returns (N, H, Dh) in their dtype. Needs :func:`load` first."""
    dtype = q.dtype
    q, k, v = _widened(q, k, v)
    out = torch.ops.clearformer_avx512.varlen_attention(q, k, v, cu_seqlens, scale)
    return out.to(dtype)


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    scale: float,
    causal: bool,
    window: int | None = None,
) -> Tensor:
    """Attention within each sequence of ``cu_seqlens`` on float32 or bfloat16 rows: q
    (N, H, Dh), k and v (N, Hkv, Dh) with Hkv dividing H (query head h reads key/value head
    h // (H // Hkv)), each row's heads contiguous; token i sees tokens j <= i of its sequence
    when ``causal``, and only those with |i - j| <= ``window`` where one is given (local
    attention). Returns (N, H, Dh) in the rows' dtype. Needs :func:`load` first, and for
    bfloat16 rows an AVX512-BF16 CPU (:func:`flash_serves`)."""
    if q.dtype == torch.bfloat16 and not bf16_products():
        # Its instructions would stop the process, not raise.
        raise RuntimeError(f"the bfloat16 flash kernel needs AVX512-BF16: {cpu_info().summary()}")
    name = _FLASH_OPS.get(q.dtype)
    if name is None:
        raise TypeError(f"q must be float32 or bfloat16 for the flash kernels, got {q.dtype}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        raise TypeError(f"window must be an int >= 0 or None, got {window!r}")
    if window is not None and window < 0:  # the kernel reads -1 as no window at all
        raise ValueError(f"window must be >= 0 (or None: no window), got {window}")
    band = -1 if window is None else window
    return getattr(torch.ops.clearformer_avx512, name)(q, k, v, cu_seqlens, scale, causal, band)


def flash_serves(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether a flash kernel (float32, or bfloat16 on an AVX512-BF16 CPU) can take these
    rows, (N, H, Dh) and (N, Hkv, Dh), as they are (the caller has ruled out biases and
    dropout)."""
    return (
        is_loaded()
        and q.dtype == k.dtype == v.dtype
        and (q.dtype != torch.bfloat16 or bf16_products())
        and _has_flash_op(q.dtype)
        and not capturing_graph()
        and q.device.type == "cpu"
        and q.dim() == k.dim() == v.dim() == 3
        and k.shape == v.shape
        and k.shape[0] == q.shape[0]
        and k.shape[2] == q.shape[2]
        and q.shape[1] % k.shape[1] == 0
        and q.shape[-1] % FLASH_HEAD_MULTIPLE == 0
        and all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (q, k, v))
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
    )


def counter_dropout(x: Tensor, seed: int, threshold: int, scale: float) -> Tensor:
    """``x`` times ``scale`` where element i's Philox word under ``seed``
    (:func:`clearformer.philox.mask_words`) is at least ``threshold``, else times 0; float32 or
    bfloat16 on the CPU, any shape (read contiguous). Needs :func:`load` first."""
    return torch.ops.clearformer_avx512.counter_dropout(x, seed, threshold, scale)


def dropout_serves(x: Tensor) -> bool:
    """Whether :func:`counter_dropout` can take ``x`` (a graph capture records PyTorch's own
    ops: this one has no shape function)."""
    return (
        is_loaded()
        and not capturing_graph()
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and hasattr(torch.ops.clearformer_avx512, "counter_dropout")
    )


def padded_attention(
    q: Tensor, k: Tensor, v: Tensor, key_start: Tensor, key_count: Tensor, scale: float
) -> Tensor:
    """Every query of sequence b attends its keys ``key_start[b] : key_start[b] + key_count[b]``
    (at least one): q, k, v (B, T, H, Dh) with equal strides and a contiguous last dimension,
    float32 or bfloat16 (widened); returns (B, T, H, Dh) in their dtype. Needs :func:`load`
    first."""
    dtype = q.dtype
    q, k, v = _widened(q, k, v)
    out = torch.ops.clearformer_avx512.padded_attention(q, k, v, key_start, key_count, scale)
    return out.to(dtype)


def _widened(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """float32 rows as they are; bfloat16 rows as float32 copies, each contiguous, so that the
    three share their strides as the kernel needs."""
    if q.dtype != torch.bfloat16:
        return q, k, v  # float32, or a dtype the kernel refuses by name
    return tuple(t.to(torch.float32, memory_format=torch.contiguous_format) for t in (q, k, v))


def serves(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the kernel can take these rows, (N, H, Dh) or (B, T, H, Dh), as they are (the
    caller has ruled out masks, windows, biases and dropout)."""
    return (
        is_loaded()
        # A graph capture needs PyTorch's own kernels (this op has no shape function).
        and not capturing_graph()
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.bfloat16)
        and k.dtype == v.dtype == q.dtype
        and q.shape == k.shape == v.shape
        and q.shape[-1] % 16 == 0
        and q.stride() == k.stride() == v.stride()
        and q.stride(-1) == 1
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
    )


@functools.cache
def library_path() -> Path:
    """Where the built library lives: its name hashes the source, the PyTorch version and
    the compiler, so a change of any of them builds anew instead of loading a stale one.
    Raises :class:`clearformer.machine.NoCacheFolder` where there is no cache folder."""
    return cache_folder() / "kernels" / f"avx512_kernels-{_build_hash()}.so"


@functools.cache
def _build_hash() -> str:
    """The build's name: the sources, the PyTorch version, the compiler and its flags."""
    key = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        key.update(source.read_bytes())
    key.update(torch.__version__.encode())
    key.update(" ".join((compiler() or "", *COMPILE_FLAGS)).encode())
    return key.hexdigest()[:16]


def _lock_path(library: Path) -> Path:
    """The lock its builders and removers take turns on."""
    return library.with_suffix(".lock")


def _build(library: Path) -> None:
    """Compile ``SOURCES`` against this PyTorch into ``library``, atomically (a killed build
    leaves no half-written library behind), and write its record. The sources compile side
    by side, one compiler process each, then link. The caller holds ``library``'s lock."""
    library.parent.mkdir(parents=True, exist_ok=True)
    log.info("building clearformer's AVX-512 kernels into %s (once)", library)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        partial = Path(scratch) / library.name
        _compile(Path(scratch), partial)
        library_record.publish(partial, library)
    log.info("built the AVX-512 kernels in %.1fs", time.perf_counter() - started)


def _compile(scratch: Path, partial: Path) -> None:
    """Compile ``SOURCES`` into objects in ``scratch`` and link them into ``partial``."""
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cxx = compiler() or "g++"
    flags = [*COMPILE_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    includes = [f"-I{path}" for path in cpp_extension.include_paths()]
    libraries = [f"-L{path}" for path in cpp_extension.library_paths()]
    libraries += ["-lc10", "-ltorch_cpu", "-ltorch"]
    objects = [scratch / f"{source.stem}.o" for source in SOURCES]
    compiles = [
        subprocess.Popen(
            [cxx, *flags, "-c", *includes, str(source), "-o", str(obj)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for source, obj in zip(SOURCES, objects, strict=True)
    ]
    # Every compiler is waited for before any failure is raised: one still writing into
    # the scratch folder as it is removed would replace the compiler's message.
    failures = [
        subprocess.CalledProcessError(process.returncode, process.args, stderr=stderr)
        for process in compiles
        for _, stderr in [process.communicate()]
        if process.returncode
    ]
    if failures:
        raise failures[0]
    link = [cxx, *flags, *map(str, objects), *libraries, "-o", str(partial)]
    subprocess.run(link, check=True, capture_output=True, text=True)


def _remember(outcome: Decision) -> Decision:
    _state["load"] = outcome
    if outcome.choice != "loaded":
        log.info("clearformer's AVX-512 kernels are not used: %s", outcome.reason)
    return outcome
