"""``export_onnx``: a loaded encoder as ``model.onnx``, with its tokenizer and configs beside it.

The graph is translated from the ``torch.export`` program of :mod:`.module` (one trace, one
path for both exports) by ``torch.onnx`` (which needs ``onnx`` and ``onnxscript``). Before the
directory is published the graph is run under ``onnxruntime`` on a ragged batch of another
shape than the traced one, and compared with clearformer's own forward pass: an export whose
outputs differ by more than :data:`TOLERANCE`, or whose axes did not stay dynamic, is an error
and leaves nothing behind.

The directory is built in a temporary sibling folder and renamed into place only when it is
complete, so a reader never sees half an export and a failed export leaves no folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_bool
from ..heads import pool
from ..model import EncoderModel
from .module import ExportableEncoder, eval_mode, export_program
from .targets import check_apart, check_target

__all__ = [
    "DEFAULT_OPSET",
    "INSTALL_HINT",
    "MODEL_FILE",
    "METADATA_FILE",
    "TOLERANCE",
    "ExportError",
    "OnnxExport",
    "export_onnx",
    "missing_packages",
]

log = logging.getLogger(__name__)

# Opset 18 is read by every onnxruntime since 1.14 and has LayerNormalization; the exporter
# writes GELU as its erf formula there (the Gelu operator needs opset 20).
DEFAULT_OPSET = 18
MIN_OPSET = 18  # the oldest opset torch.onnx writes natively; below it, conversion may fail
TOLERANCE = 1e-4  # largest absolute difference from clearformer's forward pass an export may show
INSTALL_HINT = "pip install 'clearformer[onnx]'"
MODEL_FILE = "model.onnx"
METADATA_FILE = "clearformer_export.json"
# Files of the checkpoint copied beside the graph: what a runtime needs to tokenize, and the
# configs that say how to pool (the pooling module's own config.json is found from modules.json).
COPIED_FILES = (
    "config.json",
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
# The check batch: ragged, with punctuation, digits and a longer text, so it is padded and
# longer than the 8 positions the graph is traced on.
CHECK_TEXTS = (
    "A cat sits on the mat.",
    "Stock markets fell sharply today, after the central bank raised rates by 0.5 points "
    "for the third time this year.",
    "ok",
)

Progress = Callable[[str], None]


class ExportError(RuntimeError):
    """No trustworthy graph came out: torch.onnx could not translate the program, or the graph
    fails or differs from clearformer's outputs under onnxruntime."""


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote.

    Attributes:
        path: the export directory.
        files: every file in it, relative to ``path``.
        inputs, outputs: the graph's input and output names, in order.
        pooling: the pooling of the ``sentence_embedding`` output; None without one.
        normalize: whether ``sentence_embedding`` is L2-normalised.
        opset: the ONNX opset of the graph.
        check_shape: (B, T) of the batch the graph was checked on under onnxruntime.
        max_abs_diff: per output, the largest absolute difference from clearformer's forward
            pass on that batch (real positions of the hidden states); empty when not checked.
    """

    path: Path
    files: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    pooling: str | None
    normalize: bool
    opset: int
    check_shape: tuple[int, int] | None = None
    max_abs_diff: dict[str, float] = field(default_factory=dict)

    @property
    def model(self) -> Path:
        return self.path / MODEL_FILE


def missing_packages(verify: bool = True) -> list[str]:
    """The packages an ONNX export needs that are not installed (onnxruntime for the check)."""
    needed = ["onnx", "onnxscript"] + (["onnxruntime"] if verify else [])
    return [name for name in needed if importlib.util.find_spec(name) is None]


def require_packages(verify: bool = True) -> None:
    """Raise ModuleNotFoundError naming the missing packages and the extra that installs them."""
    missing = missing_packages(verify)
    if missing:
        raise ModuleNotFoundError(
            f"ONNX export needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'}"
            f" not installed; install the onnx extra: {INSTALL_HINT}",
            name=missing[0],
        )


def export_onnx(
    model_or_dir: object,
    out_dir: str | os.PathLike,
    *,
    opset: int = DEFAULT_OPSET,
    pooling: bool = True,
    backend: str | None = None,
    verify: bool = True,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> OnnxExport:
    """Export an encoder to ``out_dir/model.onnx`` with its tokenizer files and configs.

    Args:
        model_or_dir: a checkpoint directory (None: the bundled all-MiniLM-L6-v2), a
            :class:`~clearformer.TextEncoder`, or a bare :class:`~clearformer.EncoderModel`
            (then no files are copied, and ``pooling`` must be False: a bare model has no
            pooling config).
        out_dir: the export directory; it must not exist, or be empty (or ``overwrite``); its
            parent must exist.
        opset: the ONNX opset to write.
        pooling: add a ``sentence_embedding`` output, pooled and normalised as the
            checkpoint's sentence-transformers modules say.
        backend: the attention kernel traced into the graph, ``sdpa`` or ``math``; None:
            ``sdpa``, or ``math`` for a model with long local layers
            (:func:`~clearformer.export.module.export_backend`).
        verify: run the graph under onnxruntime before publishing it and raise
            :class:`ExportError` unless it matches clearformer within :data:`TOLERANCE`.
        overwrite: replace an existing non-empty ``out_dir`` (only once the new export is
            complete).
        progress: called with a line saying what is being done, step by step.

    Returns:
        an :class:`OnnxExport` describing what was written.

    Raises:
        ModuleNotFoundError: onnx, onnxscript (or, to verify, onnxruntime) is not installed.
        FileNotFoundError, CheckpointError: no such checkpoint, or an unusable one.
        FileExistsError: ``out_dir`` is not empty and ``overwrite`` is False.
        OSError: ``out_dir`` cannot be written.
        ExportError: torch.onnx cannot translate the graph, or under onnxruntime it fails or
            its outputs differ from clearformer's.
    """
    say = _reporter(progress)
    if not isinstance(opset, int) or isinstance(opset, bool) or opset < MIN_OPSET:
        raise ValueError(f"opset must be an int >= {MIN_OPSET}, got {opset!r}")
    # Before anything is loaded or written: overwrite="no" would be truthy and replace an
    # earlier export, pooling="no" and verify="no" would pool and check anyway.
    for value, name in ((pooling, "pooling"), (verify, "verify"), (overwrite, "overwrite")):
        check_bool(value, name)
    require_packages(verify)
    target = check_target(Path(out_dir), overwrite)
    model, text = _resolve(model_or_dir, pooling, say)
    if text is not None and text.path is not None:
        check_apart(target, text.path, flag="out_dir", named=str(text.path))
    mode = text.pooling if (pooling and text is not None) else None
    if mode is not None and text.head.config.steps:
        raise ValueError(
            f"{text.path} runs sentence-transformers Dense modules after its pooling, which the "
            "exported sentence_embedding would leave out; export with pooling=False "
            "(--no-pooling) and apply them to the pooled last_hidden_state yourself"
        )
    normalize = bool(pooling and text is not None and text.normalize)
    if text is not None and mode is not None and not text.include_prompt:
        log.warning(
            "%s pools without its prompt's tokens (include_prompt: false); the exported "
            "sentence_embedding pools every real token, so leave prompts out of its inputs or "
            "pool last_hidden_state yourself",
            text.path,
        )
    module = ExportableEncoder(model, backend=backend, pooling=mode, normalize=normalize)

    parent = target.parent
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot write {target}: {exc.strerror}") from None
    try:
        say(f"tracing the encoder (torch.export, {module.backend} kernel, padded layout)")
        started = time.perf_counter()
        program = export_program(module)
        say(f"translating to ONNX opset {opset}")
        onnx_program = _to_onnx(program, module, opset)
        _describe(onnx_program, module, text)
        onnx_program.save(staging / MODEL_FILE)
        log.info("exported %s in %.1fs", staging / MODEL_FILE, time.perf_counter() - started)
        if text is not None:
            _copy_checkpoint_files(text, staging)
        check_shape, diffs = None, {}
        if verify:
            say("checking the graph under onnxruntime against clearformer")
            check_shape, diffs = _check_parity(staging / MODEL_FILE, module, model, text)
            say(
                f"largest difference on a {check_shape[0]} x {check_shape[1]} batch: "
                + ", ".join(f"{name} {diff:.1e}" for name, diff in diffs.items())
            )
        result = OnnxExport(
            path=target,
            files=(),  # listed once the metadata is written too
            inputs=module.input_names,
            outputs=module.output_names,
            pooling=mode,
            normalize=normalize,
            opset=opset,
            check_shape=check_shape,
            max_abs_diff=diffs,
        )
        _write_metadata(staging, result, text, module.backend)
        files = tuple(
            sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        )
        _publish(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say(f"wrote {target}")
    return replace(result, files=files)


def _reporter(progress: Progress | None) -> Progress:
    def say(message: str) -> None:
        log.info("%s", message)
        if progress is not None:
            progress(message)

    return say


def _resolve(model_or_dir: object, pooling: bool, say: Progress):
    """(EncoderModel, TextEncoder or None) for what the caller gave."""
    from ..text import TextEncoder

    if isinstance(model_or_dir, TextEncoder):
        return model_or_dir.model, model_or_dir
    if isinstance(model_or_dir, EncoderModel):
        if pooling:
            raise ValueError(
                "a bare EncoderModel has no pooling config: pass pooling=False, or a "
                "TextEncoder or checkpoint directory"
            )
        return model_or_dir, None
    if model_or_dir is not None and not isinstance(model_or_dir, str | os.PathLike):
        raise TypeError(
            "model_or_dir must be a checkpoint directory, None (the bundled model), a "
            f"TextEncoder or an EncoderModel, got {type(model_or_dir).__name__}"
        )
    say(f"loading {'the bundled model' if model_or_dir is None else model_or_dir}")
    text = TextEncoder.from_pretrained(model_or_dir)
    return text.model, text


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Keep torch.onnx's own chatter (status lines, notes on optional packages, renaming
    notes) out of the caller's output; errors still raise."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*axis name.*will not be used")
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _to_onnx(program: torch.export.ExportedProgram, module: ExportableEncoder, opset: int):
    with _quiet_exporter():
        try:
            onnx_program = torch.onnx.export(
                program,
                dynamo=True,
                input_names=list(module.input_names),
                output_names=list(module.output_names),
                opset_version=opset,
                verbose=False,
            )
        except Exception as exc:  # torch.onnx's errors are long reports; keep their cause
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            message = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
            hint = "; try backend='math'" if module.backend != "math" else ""
            raise ExportError(
                f"torch.onnx could not translate the {module.backend} graph: "
                f"{type(cause).__name__}: {message}{hint}; nothing was written"
            ) from exc
    # Translated from a program, the graph's axes carry the tracer's symbols (s18, s41): give
    # them the names a runtime's user reads, from the first input's (B, T).
    dims = zip(onnx_program.model.graph.inputs[0].shape, ("batch", "sequence"), strict=True)
    onnx_program.rename_axes({dim: name for dim, name in dims if not isinstance(dim, int)})
    # The exporter falls back to its own opset when a conversion fails, with a log line only.
    written = onnx_program.model.opset_imports.get("")
    if written != opset:
        raise ValueError(f"torch.onnx could not write opset {opset} (it wrote {written})")
    return onnx_program


def _describe(onnx_program, module: ExportableEncoder, text) -> None:
    """Metadata a runtime can read from the graph itself."""
    props = onnx_program.model.metadata_props
    props["producer"] = "clearformer"
    props["pooling"] = module.pooling or ""
    props["normalize"] = str(module.normalize).lower()
    props["max_length"] = str(text.max_length if text is not None else module.config.max_length)


def _copy_checkpoint_files(text, staging: Path) -> None:
    from ..interop.hf import find_checkpoint

    source = Path(text.path)
    names = list(COPIED_FILES)
    for entry in find_checkpoint(source).modules or []:
        if str(entry.get("type", "")).endswith(".Pooling") and entry.get("path"):
            names.append(f"{entry['path']}/config.json")
    for name in names:
        path = source / name
        if path.is_file():
            copy = staging / name
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)


def _check_batch(module: ExportableEncoder, text) -> tuple[Tensor, ...]:
    """The batch the graph is checked on: real texts when there is a tokenizer, else seeded
    random ids; ragged either way, and of another shape than the traced (2, 8)."""
    if text is not None:
        batch = text.tokenize(list(CHECK_TEXTS))
        mask = batch.attention_mask.long()
        ids = batch.input_ids
        tt = batch.token_type_ids
        tt = torch.zeros_like(ids) if tt is None else tt
        # And the shortest text again, padded on the left, as some tokenizers pad.
        short = int(mask.sum(dim=1).argmin())
        shift = int((mask[short] == 0).sum())
        ids = torch.cat([ids, ids[short].roll(shift)[None]])
        mask = torch.cat([mask, mask[short].roll(shift)[None]])
        tt = torch.cat([tt, tt[short].roll(shift)[None]])
        inputs = (ids, mask)
        if "token_type_ids" in module.input_names:
            inputs += (tt,)
        return inputs
    config = module.config
    generator = torch.Generator().manual_seed(0)
    T = min(13, config.max_length)
    ids = torch.randint(0, config.vocab_size, (4, T), generator=generator)
    mask = (torch.arange(T) < torch.tensor([[T], [T // 2], [2], [T]])).long()
    mask[3] = mask[1].flip(0)  # the last row padded on the left, as some tokenizers pad
    inputs = (ids, mask)
    if "token_type_ids" in module.input_names:
        inputs += (torch.zeros_like(ids),)
    return inputs


def _check_parity(path: Path, module: ExportableEncoder, model: EncoderModel, text):
    """Run the graph under onnxruntime and compare it with the model's own forward pass."""
    import onnxruntime

    inputs = _check_batch(module, text)
    feed = {name: t.cpu().numpy() for name, t in zip(module.input_names, inputs, strict=True)}
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = [torch.from_numpy(a) for a in session.run(list(module.output_names), feed)]
    except Exception as exc:  # onnxruntime's own error classes are not importable by name
        shape = tuple(inputs[0].shape)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(
            f"the ONNX graph fails under onnxruntime on a {shape[0]} x {shape[1]} batch: "
            f"{message}; nothing was written"
        ) from exc
    want = _reference(module, model, inputs)
    real = inputs[1] != 0  # (B, T)
    diffs = {}
    for name, g, w in zip(module.output_names, got, want, strict=True):
        if name == "last_hidden_state":
            g, w = g[real], w[real]
        diffs[name] = float((g - w.to(g.dtype)).abs().max())
    bad = {name: diff for name, diff in diffs.items() if not diff <= TOLERANCE}
    if bad:
        raise ExportError(
            "the ONNX graph's outputs differ from clearformer's by more than "
            f"{TOLERANCE:g} under onnxruntime: "
            + ", ".join(f"{name} {diff:.3g}" for name, diff in bad.items())
            + "; nothing was written"
        )
    return tuple(inputs[0].shape), diffs


def _reference(module: ExportableEncoder, model: EncoderModel, inputs) -> list[Tensor]:
    """clearformer's outputs for the check batch: the model's own call (its default kernel and
    layout), pooled and normalised as TextEncoder.encode does."""
    ids, mask = inputs[0], inputs[1].bool()
    types = inputs[2] if len(inputs) > 2 else None
    with eval_mode(model), torch.inference_mode():
        hidden = model(ids, mask, types)  # (B, T, D)
        outputs = [hidden]
        if module.pooling is not None:
            vectors = pool(hidden, mask, module.pooling)
            if module.normalize:
                vectors = F.normalize(vectors, p=2.0, dim=-1)
            outputs.append(vectors)
    return outputs


def _write_metadata(staging: Path, result: OnnxExport, text, backend: str) -> None:
    from ..version import __version__

    info = {
        "format": 1,
        "model": MODEL_FILE,
        "source": None if text is None else str(text.path),
        "inputs": list(result.inputs),
        "input_dtype": "int64",
        "outputs": list(result.outputs),
        "pooling": result.pooling,
        "normalize": result.normalize,
        "max_length": None if text is None else text.max_length,
        "opset": result.opset,
        "attention": {"backend": backend, "layout": "padded"},
        "check": None
        if result.check_shape is None
        else {
            "runtime": "onnxruntime",
            "batch_shape": list(result.check_shape),
            "max_abs_diff": result.max_abs_diff,
            "tolerance": TOLERANCE,
        },
        "clearformer_version": __version__,
    }
    (staging / METADATA_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def _publish(staging: Path, target: Path) -> None:
    """Move the finished ``staging`` folder onto ``target``: a rename, after the old folder (an
    empty one, or one being overwritten) is moved aside; the old one is removed last."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it owner-only
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, old / target.name)
    try:
        os.replace(staging, target)
    except BaseException:
        if old is not None:
            os.replace(old / target.name, target)  # put the earlier export back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
