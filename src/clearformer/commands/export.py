"""``clearformer export --onnx DIR``: a pretrained encoder as an ONNX graph for deployment.

``DIR`` receives ``model.onnx`` (input_ids, attention_mask[, token_type_ids] -> last hidden
state and the pooled sentence embedding), the checkpoint's tokenizer files and configs, and
``clearformer_export.json``; the graph is checked under onnxruntime before ``DIR`` appears.
Progress goes to stderr; nothing to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a pretrained encoder to ONNX",
        description=(
            "Export a pretrained encoder to DIR/model.onnx, with its tokenizer files and "
            "configs beside it. The graph is checked under onnxruntime against clearformer "
            "before DIR is written. Needs the onnx extra: pip install 'clearformer[onnx]'."
        ),
    )
    p.add_argument(
        "--onnx",
        metavar="DIR",
        required=True,
        help="the export directory (new or empty; its parent must exist)",
    )
    p.add_argument(
        "--model",
        metavar="DIR",
        default=None,
        help="checkpoint directory (default: the bundled all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--no-pooling",
        dest="pooling",
        action="store_false",
        help="export the hidden states only (no sentence_embedding output)",
    )
    p.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset (default 18)")
    p.add_argument(
        "--backend",
        choices=("sdpa", "math"),
        default=None,
        help="attention kernel traced into the graph (default sdpa; math for long local layers)",
    )
    p.add_argument(
        "--force", action="store_true", help="replace DIR if it holds files (once the export works)"
    )
    p.set_defaults(func=run, writes_stdout=lambda args: False)


def check_target(value: str, force: bool) -> Path:
    """The --onnx directory, checked before any work: its parent exists and is writable, and
    it is new, empty, or --force replaces it."""
    from ..cli import CliError

    target = Path(value).expanduser()
    if target.exists() and not target.is_dir():
        raise CliError(f"--onnx: {target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise CliError(
            f"--onnx: {target} exists and is not empty; give a new directory, or --force to "
            "replace it"
        )
    parent = target.parent
    if not parent.is_dir():
        raise CliError(f"--onnx: cannot write {target}: directory {parent} does not exist")
    try:  # os.access says yes to root and knows nothing of read-only mounts: try it.
        probe = tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".probe", dir=parent)
    except OSError as exc:
        raise CliError(
            f"--onnx: cannot write {target}: directory {parent} is not writable ({exc.strerror})"
        ) from None
    os.rmdir(probe)
    return target


def check_model(value: str | None) -> None:
    """--model is a directory, said with the flag: the loader's own message names neither."""
    from .inputs import check_model_directory

    if value is not None:  # None: the bundled model
        check_model_directory(value)


def check_apart(target: Path, model: str | None) -> None:
    """--force replaces the --onnx directory, and the export copies the checkpoint's configs
    but not its weights: the directory must neither be the checkpoint nor hold it."""
    from ..cli import CliError
    from ..export.targets import check_apart
    from ..interop.hf.bundled import bundled_model_dir

    try:
        checkpoint = Path(model).expanduser() if model else bundled_model_dir()
    except FileNotFoundError:
        return  # no bundled model to replace; loading it reports the missing package
    named = f"--model {model}" if model else "the bundled model"
    try:
        check_apart(target, checkpoint, flag="--onnx:", named=named)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from ..cli import CliError
    from ..export.onnx import (
        DEFAULT_OPSET,
        MIN_OPSET,
        ExportError,
        export_onnx,
        require_packages,
    )

    try:
        require_packages()
    except ModuleNotFoundError as exc:
        raise CliError(str(exc)) from None
    from onnx.defs import onnx_opset_version

    if args.opset is not None and args.opset < MIN_OPSET:
        raise CliError(f"--opset must be at least {MIN_OPSET}, got {args.opset}")
    # Above the newest opset the installed onnx defines, torch.onnx fails only after the trace.
    newest = onnx_opset_version()
    if args.opset is not None and args.opset > newest:
        raise CliError(
            f"--opset must be at most {newest} (the newest of the installed onnx), got {args.opset}"
        )
    check_model(args.model)
    target = check_target(args.onnx, args.force)
    check_apart(target, args.model)

    def progress(message: str) -> None:
        print(f"export: {message}", file=sys.stderr, flush=True)

    try:
        result = export_onnx(
            args.model,
            target,
            opset=DEFAULT_OPSET if args.opset is None else args.opset,
            pooling=args.pooling,
            backend=args.backend,
            overwrite=args.force,
            progress=progress,
        )
    except ExportError as exc:
        raise CliError(str(exc)) from None
    size = result.model.stat().st_size / 2**20
    print(
        f"export: {result.model.name} ({size:.1f} MiB) takes {', '.join(result.inputs)} and "
        f"returns {', '.join(result.outputs)}; {len(result.files)} files in {result.path}",
        file=sys.stderr,
    )
    return 0
