"""The run folder: everything of one run in one place.

```
RUN/
  config.toml        the resolved config (clearformer train --config RUN/config.toml reruns it)
  invocations.jsonl  one line per start: argv, the fields set on the command line, resumed from
  data.json          the task's data and the padding fraction of its batching
  metrics.jsonl      training records (loss, lr, grad_norm) and evaluations (eval_accuracy ...)
  checkpoints/       step-XXXXXXXX/ folders, latest, best (see checkpoint.py)
  model.safetensors  the final weights
  summary.json       how the run ended: steps, best metric and its step, early stop, time
  loss.png           the loss curve (with matplotlib)
  vocabulary.json    translate: the source and target vocabularies (decoding needs them)
```

``metrics.jsonl`` is append-only while the run goes; a resume first cuts it back to the
length recorded in the checkpoint it resumes from, so records written after that checkpoint
(and a line half-written by a kill) are replaced by the same records computed again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..io import atomic_write, parse_json_object
from .config import TrainConfig
from .tomlfile import dump_toml

CONFIG = "config.toml"


class RunFolder:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.metrics = self.path / "metrics.jsonl"

    def check_usable(self) -> None:
        """A new folder, an empty one, or an earlier run's (it has config.toml): anything else
        is refused, so a mistyped --out never fills a folder of other files."""
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"--out must be a folder, got the file {self.path}")
        if self.path.is_dir() and any(self.path.iterdir()) and not (self.path / CONFIG).is_file():
            raise ValueError(
                f"--out {self.path} is a folder of other files (no {CONFIG} from an earlier "
                "run): give a new or empty folder"
            )

    def create(self) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: TrainConfig) -> None:
        with atomic_write(self.path / CONFIG) as handle:
            handle.write(dump_toml(config))

    def record_invocation(self, entry: dict[str, Any]) -> None:
        with open(self.path / "invocations.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def check_same_files(self, files: dict[str, bytes]) -> None:
        """Refuse to resume when a task's file (a vocabulary) differs from the run's own: the
        checkpoint's weights belong to the run's."""
        for name, data in files.items():
            path = self.path / name
            if path.is_file() and path.read_bytes() != data:
                raise ValueError(
                    f"cannot resume {self.path}: the data now gives another {name} than the "
                    "one the run was trained with (mismatched vocabularies: the training data "
                    "or the vocabulary fields changed); use another --out"
                )

    def write_files(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            with atomic_write(self.path / name, "wb") as handle:
                handle.write(data)

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        with atomic_write(self.path / name) as handle:
            handle.write(json.dumps(data, indent=1, sort_keys=True) + "\n")


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line, flushed as written."""

    def __init__(self, path: Path | None, keep: int) -> None:
        """``path`` None: records kept in memory only (the ranks that do not write)."""
        self.path = path
        self._handle = None
        self.records: list[dict[str, Any]] = []
        if path is None:
            return
        lines = []
        if path.is_file():
            try:
                text = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as exc:  # its own message names no file
                raise ValueError(f"{path} is not UTF-8 text (byte offset {exc.start})") from None
            lines = text.splitlines(keepends=True)[:keep]
        if len(lines) < keep:
            raise ValueError(
                f"{path} has {len(lines)} records, fewer than the {keep} the checkpoint was "
                "written after: the log was cut or replaced since"
            )
        # Read before the file is cut back, so a damaged log is left as it was.
        self.records = [
            parse_json_object(line, f"{path} line {number}")
            for number, line in enumerate(lines, start=1)
        ]
        with atomic_write(path) as handle:  # cut back to the checkpoint's records
            handle.writelines(lines)
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- closed in close()

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self._handle is not None:
            self._handle.write(json.dumps(record) + "\n")
            self._handle.flush()

    def sync(self) -> None:
        if self._handle is not None:
            os.fsync(self._handle.fileno())

    def __len__(self) -> int:
        return len(self.records)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
