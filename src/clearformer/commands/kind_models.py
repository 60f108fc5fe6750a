"""The one place the commands load a sparse or multi-vector model, and tell a checkpoint's
kind (so that a sparse model given to a dense build is refused naming both kinds)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def checkpoint_kind(path: str | Path) -> str | None:
    """The kind of model a checkpoint directory holds (:func:`clearformer.model_kinds.
    model_kind`); None for a path that is not a directory (its loader reports that)."""
    from ..model_kinds import model_kind

    if not Path(path).expanduser().is_dir():
        return None
    return model_kind(path)


def is_bge_m3(path: str | Path) -> bool:
    """Whether ``path`` is a bge-m3 checkpoint: a dense kind loads it as
    :class:`~clearformer.BGEM3Encoder` (its dense view), not as a TextEncoder."""
    return checkpoint_kind(path) == "bge-m3"


def check_model_kind(kind: str, path: str | Path, flag: str = "model") -> None:
    """ValueError naming both kinds unless the checkpoint at ``path`` can serve a ``kind``
    index (a BGE-M3 checkpoint serves dense, sparse and multivector)."""
    found = checkpoint_kind(path)
    if found is None or found == kind or found == "bge-m3":
        return
    raise ValueError(f"{flag} {path} is a {found} model; a {kind} index needs a {kind} model")


def refuse_other_kind(
    model: str | Path | None, route: Callable[[str], str], serves: tuple[str, ...] = ("dense",)
) -> None:
    """CliError naming ``--model`` when its checkpoint is of a kind the command does not run,
    before any weight is read: the loader's own refusal gives Python advice ("use
    clearformer.SparseEncoder.from_pretrained"), which a command line cannot follow.
    ``route(kind)`` says what runs a model of that kind on the command line."""
    from ..cli import CliError

    found = None if model is None else checkpoint_kind(model)
    if found is None or found in serves:
        return
    raise CliError(f"--model {model} is a {found} model; {route(found)}")


def kind_flag(kind: str) -> str:
    """The ``index build`` flag that builds an index of a ``kind`` model (bge-m3: any of
    three, its dense view among them, written as a usage line writes a choice)."""
    return "--kind dense|sparse|multivector" if kind == "bge-m3" else f"--kind {kind}"


def kind_precision(kind: str, precision: str) -> str:
    """``--precision`` for a sparse, multi-vector or bge-m3 model: float32 or bf16 (``auto``
    decided here, as for a cross-encoder); int8, which only dense TextEncoder models run,
    refused naming the kind."""
    from ..precision import check_precision, choose_precision, is_int8

    offered = ("float32", "bf16")
    asked = check_precision(precision, "--precision")
    if is_int8(asked):
        which = "dense TextEncoder models" if kind == "bge-m3" else "dense models"
        raise ValueError(
            f"--precision {asked} applies to {which}; a {kind} model runs float32 or bf16"
        )
    precision = check_precision(precision, "--precision", (*offered, "auto"))
    return choose_precision(precision, offered=offered).choice


def load_model(
    kind: str, path: str | Path | None, precision: str | None = None, device: str | None = None
) -> Any:
    """The sparse or multi-vector model at ``path`` (a BGE-M3 checkpoint as BGE-M3, which
    serves both, and dense: :func:`is_bge_m3`), holding ``precision`` alone where one is given
    (``--precision``: float32, bf16 or auto; int8 is for dense models and is refused here).
    The classes are imported here, on use, so that the commands import without the sparse
    and multi-vector encoders (dense models load with ``encode.load_encoder``). ``device``
    (``--device``): these models run on the CPU alone, and another device is refused before
    any weight is read."""
    label = "bge-m3" if path is not None and is_bge_m3(path) else kind
    if device is not None:
        from ..devices import check_device

        if check_device(device, "--device").type != "cpu":
            which = "dense TextEncoder models" if label == "bge-m3" else "dense models"
            raise ValueError(
                f"--device {device}: {label} models run on the CPU here; only {which} "
                f"are placed on another device"
            )
    if path is None:
        raise ValueError(f"a {kind} index needs --model: no {kind} model ships with clearformer")
    check_model_kind(kind, path, "--model")
    if precision is not None:
        precision = kind_precision(label, precision)
    if label == "bge-m3":
        from ..text.bge_m3 import BGEM3Encoder

        return BGEM3Encoder.from_pretrained(path, precision=precision)
    if kind == "sparse":
        from ..text.sparse_encoder import SparseEncoder

        return SparseEncoder.from_pretrained(path, precision=precision)
    if kind == "multivector":
        from ..text.multivector_encoder import MultiVectorEncoder

        return MultiVectorEncoder.from_pretrained(path, precision=precision)
    raise ValueError(f"unknown kind {kind!r}; expected one of dense, sparse, multivector, bm25")
