"""Small utilities shared by the tests."""

from __future__ import annotations

import contextlib
import fcntl
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from clearformer import EncoderConfig, EncoderModel, routes
from clearformer.fast import avx512
from clearformer.fast.fused_linear import linear
from clearformer.fast.reordered_weights import ReorderedWeights
from clearformer.interop.hf import save_model
from clearformer.machine import machine
from clearformer.options import Decision

AVX512_SUPPORT = machine().avx512
# For a module of tests of clearformer's AVX-512 library: skipped, with the reason, where this
# machine cannot build it; else the library is loaded for the module (conftest's
# ``avx512_library``).
needs_avx512_library = [
    pytest.mark.skipif(
        AVX512_SUPPORT.choice != "available",
        reason=f"the AVX-512 library cannot build here: {AVX512_SUPPORT.reason}",
    ),
    pytest.mark.usefixtures("avx512_library"),
]


def resolve_method(
    method: str,
    layout,
    *,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    head_dim: int | None = None,
    is_causal: bool = False,
) -> Decision:
    """The varlen method the routes give a plain layer call with these facts (gradients as
    the caller's grad mode says)."""
    call = routes.VarlenCall(device, dtype, head_dim, is_causal, grad=torch.is_grad_enabled())
    return routes.varlen_method(layout, call, method)


def avx512_in_use(dtype: torch.dtype = torch.float32) -> bool:
    """Whether ``auto`` takes the AVX-512 attention kernel for rows of ``dtype`` here."""
    return routes.kernel_route(avx512.attention_kernel(dtype)).choice == "avx512"


def fused_linear(x: torch.Tensor, layer, **epilogue) -> torch.Tensor:
    """``layer`` called as a fused plan calls it: the AVX-512 linear kernel for its epilogue
    where the routes take it (:func:`clearformer.routes.epilogue_route`)."""
    rows = x.reshape(-1, x.shape[-1]).shape[0]  # (..., in) -> the rows the product sees
    taken = routes.epilogue_route(Decision("fused", "a test's fused call"), x.dtype, rows)
    return linear(x, layer, avx512=taken, **epilogue)


def lengths_mask(lengths: list[int], T: int | None = None) -> torch.Tensor:
    """(B, T) bool key-padding mask: row b has ``lengths[b]`` real tokens, then padding."""
    T = max(max(lengths), 1) if T is None else T
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """Run the block with PyTorch's intra-op thread count set to ``count``, then restore it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_tiny_bert(
    directory: Path, words: Sequence[str], *, n_layers: int = 1, width: int = 16, heads: int = 2
) -> Path:
    """Write a random BERT checkpoint (``width`` wide, ``heads`` heads, ``n_layers`` layers,
    feed-forward twice as wide, drawn from seed 0) to ``directory`` with ``words`` as its
    WordPiece vocabulary, one id per word in order. Written by clearformer itself, so no
    transformers is needed. Returns ``directory``."""
    torch.manual_seed(0)
    config = EncoderConfig(
        d_model=width,
        n_heads=heads,
        n_layers=n_layers,
        dim_mlp=2 * width,
        norm="post",
        activation="gelu",
        norm_eps=1e-12,
        final_norm=False,
        vocab_size=len(words),
        max_positions=32,
        type_vocab_size=2,
        embedding_norm=True,
    )
    save_model(EncoderModel(config).eval(), directory, "bert")
    (directory / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return directory


def record_packings(monkeypatch, module) -> list[ReorderedWeights]:
    """Every ReorderedWeights ``module`` makes from now on, in the list returned."""
    made = []

    class Recorded(ReorderedWeights):
        def __init__(self):
            super().__init__()
            made.append(self)

    monkeypatch.setattr(module, "ReorderedWeights", Recorded)
    return made


def torchrun_command(nproc: int, *argv: str) -> list[str]:
    """The command that runs ``argv`` in ``nproc`` processes under torchrun on this machine.
    Rendezvous on port 0 of 127.0.0.1: the launcher binds a free port itself, so two runs never
    race for one found free beforehand."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        *argv,
    ]


def watch_lock_waits(monkeypatch) -> tuple[threading.Event, object]:
    """An event set once a thread other than the main one is about to wait for a lock
    (``fcntl.flock`` without ``LOCK_NB``), and ``fcntl.flock`` itself, for the test that plays
    the other process and holds the lock."""
    flock = fcntl.flock
    waiting = threading.Event()

    def watched(fd, operation):
        if threading.current_thread() is not threading.main_thread() and not (
            operation & fcntl.LOCK_NB
        ):
            waiting.set()  # the thread under test is about to wait for the lock
        return flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", watched)
    return waiting, flock
