"""Reading the run folder of ``clearformer train`` for ``generate`` and ``translate``: one set
of checks and messages for both, each naming ``--run``."""

from __future__ import annotations

from pathlib import Path

WEIGHTS = "model.safetensors"


def require_files(folder: Path, names: tuple[str, ...]) -> None:
    """CliError naming ``--run`` unless each of ``names`` is a file in ``folder``."""
    from ..cli import CliError

    for name in names:
        if not (folder / name).is_file():
            raise CliError(f"--run {folder}: {name} is missing (is it a finished run?)")


def load_weights(folder: Path, model, fits: str) -> None:
    """The run's final weights into ``model``. A damaged file or weights of another shape are a
    CliError naming ``--run`` (safetensors raises its own SafetensorError, torch a RuntimeError:
    neither is an error the CLI reports in one line by itself)."""
    from safetensors.torch import load_file

    from ..cli import CliError

    try:
        weights = load_file(str(folder / WEIGHTS))
    except OSError:
        raise  # unreadable, not damaged: the CLI names the file and the reason itself
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(
            f"--run {folder}: cannot read {WEIGHTS}: {reason} (the file is corrupt or truncated)"
        ) from None
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        # torch's first line only names the model class; the next names a tensor and its shapes.
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0] if lines else type(exc).__name__
        raise CliError(f"--run {folder}: {WEIGHTS} does not fit {fits}: {detail}") from None
