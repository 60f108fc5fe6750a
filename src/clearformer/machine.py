"""What this machine can do, read once per process: one frozen snapshot that every route reads.

The routes (:mod:`clearformer.routes`) choose between implementations by what the machine
offers: the CPU's instruction sets, oneDNN's fused linear op (float32 and bfloat16), oneDNN's
weight reordering, the ``flash_attn`` package on CUDA, a C++ compiler for clearformer's own
AVX-512 library. Each is probed once, here, on the first :func:`machine` call; nothing else in
the package probes the machine. What changes while a process runs (the switches, a library
built later, a measured verdict) is not a capability and is read by the routes on each
decision.

:func:`cache_folder` is the one folder clearformer keeps files in between processes: built
kernels, measured verdicts, the bfloat16 speed-up.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .cpu import CpuInfo, cpu_info
from .options import Decision

__all__ = ["CACHE_VARIABLE", "Machine", "NoCacheFolder", "cache_folder", "compiler", "machine"]

CACHE_VARIABLE = "CLEARFORMER_CACHE"
# The flags clearformer's AVX-512 library is compiled for.
AVX512_FLAGS = ("avx512f", "avx512dq", "fma")


@dataclass(frozen=True)
class Machine:
    """What this process can run, probed once.

    Attributes:
        cpu: the CPU's model and flags.
        avx512: ``available`` where clearformer's AVX-512 library can be built and run here
            (Linux, an AVX-512 CPU, a C++ compiler), else ``unavailable`` with the reason.
        onednn: oneDNN's fused linear op (``mkldnn::_linear_pointwise``) runs here.
        onednn_bf16: it runs bfloat16 rows and weights with its post-operations too.
        reorder: dtypes whose linear weights oneDNN can reorder into its own layout here.
        flash_attn: the ``flash_attn`` package imports (CUDA varlen attention).
    """

    cpu: CpuInfo
    avx512: Decision
    onednn: bool
    onednn_bf16: bool
    reorder: frozenset[torch.dtype]
    flash_attn: bool

    @property
    def avx512_available(self) -> bool:
        return self.avx512.choice == "available"


@functools.cache
def machine() -> Machine:
    """This process's :class:`Machine` (probed on the first call)."""
    onednn = _onednn_runs()
    return Machine(
        cpu=cpu_info(),
        avx512=_avx512_support(),
        onednn=onednn,
        onednn_bf16=onednn and _onednn_bf16_runs(),
        reorder=frozenset(d for d in (torch.float32, torch.bfloat16) if _reorder_runs(d)),
        flash_attn=flash_attn_varlen() is not None,
    )


class NoCacheFolder(OSError):
    """No setting names a cache folder and the user has no home folder (no ``$HOME`` and a uid
    without a passwd entry: a container run as ``--user 12345``). An ``OSError``: the callers
    treat it as a cache they cannot read or write, so nothing is built or kept and PyTorch's
    routes run."""


def cache_folder() -> Path:
    """clearformer's cache folder: ``$CLEARFORMER_CACHE``, else ``$XDG_CACHE_HOME/clearformer``
    (an absolute ``XDG_CACHE_HOME`` only, as the XDG rules say), else ``~/.cache/clearformer``.
    Read on each call: a test or a program may point it elsewhere between calls. Raises
    :class:`NoCacheFolder` where none of them names a folder."""
    own = os.environ.get(CACHE_VARIABLE)
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "clearformer"
    try:
        home = Path.home()
    except RuntimeError:  # "Could not determine home directory."
        raise NoCacheFolder(
            f"no cache folder: neither ${CACHE_VARIABLE}, $XDG_CACHE_HOME nor a home folder "
            f"names one (set ${CACHE_VARIABLE} to keep built kernels and measured verdicts)"
        ) from None
    return home / ".cache" / "clearformer"


def compiler() -> str | None:
    """The C++ compiler clearformer's kernels are built with (``$CXX``, else ``g++``)."""
    return shutil.which(os.environ.get("CXX", "g++"))


def flash_attn_varlen():
    """``flash_attn.flash_attn_varlen_func``, or None where the package is not installed."""
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_varlen_func


def _avx512_support() -> Decision:
    if not sys.platform.startswith("linux"):
        return Decision("unavailable", f"built on Linux only, this is {sys.platform}")
    missing = [flag for flag in AVX512_FLAGS if flag not in cpu_info().flags]
    if missing:
        return Decision("unavailable", f"this CPU lacks {', '.join(missing)}")
    if compiler() is None:
        return Decision("unavailable", f"no C++ compiler ({os.environ.get('CXX', 'g++')})")
    return Decision("available", "AVX-512 CPU with a C++ compiler")


def _onednn_runs() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        op = torch.ops.mkldnn._linear_pointwise
        with torch.inference_mode():
            op(torch.ones(2, 4), torch.ones(3, 4), torch.zeros(3), "gelu", [], "none")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


def _onednn_bf16_runs() -> bool:
    # oneDNN takes bfloat16 on CPUs with AVX-512 (emulating what the CPU lacks) and AMX; the
    # probe runs the two post-operations the fused blocks use.
    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        op = torch.ops.mkldnn._linear_pointwise
        rows = torch.ones(2, 4, dtype=torch.bfloat16)
        weight = torch.ones(3, 4, dtype=torch.bfloat16)
        with torch.inference_mode():
            out = op.default(rows, weight, torch.zeros(3, dtype=torch.bfloat16), "gelu", [], "none")
            added = op.binary(rows, out, weight, None, "add")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return added.dtype == torch.bfloat16 and bool((added == 4.0 + out).all())


def _reorder_runs(dtype: torch.dtype) -> bool:
    # The reordered weight must give the plain weight's product.
    try:
        weight = torch.arange(12.0).view(3, 4).to(dtype)
        rows = torch.ones(2, 4, dtype=dtype)
        with torch.inference_mode():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            got = torch.ops.mkldnn._linear_pointwise(rows, packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return bool((got.float() == torch.tensor([6.0, 22.0, 38.0])).all())
