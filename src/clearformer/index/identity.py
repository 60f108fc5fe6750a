"""The identity of the model that made an index's vectors, and the check that a query's model
is the same one.

Vectors from two models share no space: a query embedded by another checkpoint (or the same
one with another pooling) finds neighbours that mean nothing, and nothing in the numbers says
so. An index therefore records who made its vectors, and :meth:`ModelIdentity.check_same`
refuses any other model before a query is embedded.

The revision is a SHA-256 over the files that decide an embedding (config, weights, tokenizer,
the sentence-transformers modules), not over the directory's path or name: a copy of the same
checkpoint elsewhere is the same model, and a fine-tuned checkpoint saved over the old one is
not.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..interop.hf.files import CHECKPOINT_FILES

# Top-level files of a checkpoint that change what a text embeds to. The weights, the
# modules' own configs and the shards of a sharded checkpoint are added per directory.
_REVISION_FILES = ("config.json", *CHECKPOINT_FILES)
_MODULE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # a sentence-transformers module's
_BLOCK = 1 << 20  # bytes read at a time while hashing
_hashes: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, per process


class ModelMismatchError(ValueError):
    """A query's model is not the model that built the index."""


@dataclass(frozen=True)
class ModelIdentity:
    """Who made an index's vectors.

    Attributes:
        name: the checkpoint's name (the bundled model's, else its directory's); informative.
        revision: SHA-256 over the files that decide an embedding (see the module docstring).
        pooling: the checkpoint's pooling mode (``"mean"``, ``"cls"``, ...).
        normalize: whether the checkpoint's own pipeline L2-normalises (an index always stores
            unit vectors; a checkpoint that does not normalise is still normalised there).
        width: the model's embedding width D, before any truncation.
        max_length: texts are cut to this many pieces.
        path: where the model was loaded from: a hint for finding it again, never compared.
    """

    name: str
    revision: str
    pooling: str
    normalize: bool
    width: int
    max_length: int
    path: str = ""

    @classmethod
    def of(cls, encoder) -> ModelIdentity:
        """The identity of a :class:`~clearformer.TextEncoder`."""
        from ..interop.hf.bundled import BUNDLED_NAME, bundled_model_dir

        path = Path(encoder.path).resolve()
        try:
            bundled = path == bundled_model_dir().resolve()
        except FileNotFoundError:
            bundled = False
        return cls(
            name=BUNDLED_NAME if bundled else path.name,
            revision=checkpoint_revision(path),
            pooling=encoder.pooling,
            normalize=bool(encoder.normalize),
            width=int(encoder.dim),
            max_length=int(encoder.max_length),
            path=str(path),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelIdentity:
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**fields)

    def describe(self) -> str:
        return (
            f"{self.name} (revision {self.revision[:12]}, {self.pooling} pooling, "
            f"{'normalised' if self.normalize else 'not normalised'}, width {self.width}, "
            f"max_length {self.max_length})"
        )

    def differences(self, other: ModelIdentity) -> list[str]:
        """The compared fields where ``other`` differs (the name and path are not compared)."""
        return [
            name
            for name in ("revision", "pooling", "normalize", "width", "max_length")
            if getattr(self, name) != getattr(other, name)
        ]

    def check_same(
        self, other: ModelIdentity, where: str, purpose: str = "search", flag: str = "--model"
    ) -> None:
        """Raise :class:`ModelMismatchError` unless ``other`` is this model; ``purpose``
        (``"search"`` or ``"add"``) is what ``other`` was given for, and ``flag`` the
        command-line flag that names the model for it, both named in the message."""
        differ = self.differences(other)
        if differ:
            role = "the model adding texts" if purpose == "add" else "the query model"
            raise ModelMismatchError(
                f"{where} was built with {self.describe()}, but {role} is "
                f"{other.describe()} (differs in {', '.join(differ)}); vectors of two models "
                f"cannot be compared: {purpose} with the index's model ({flag} {self.path}) "
                "or build a new index"
            )


def checkpoint_revision(directory: str | os.PathLike, extra: Sequence[str] = ()) -> str:
    """SHA-256 over the files of a checkpoint directory that decide its embeddings, each
    hashed with its name, in name order; ``extra`` names more of them (relative paths: a
    multi-vector projection's weights, bge-m3's head files)."""
    root = Path(directory)
    digest = hashlib.sha256()
    for relative in sorted({*_revision_files(root), *extra}):
        digest.update(relative.encode("utf-8") + b"\0")
        digest.update(file_sha256(root / relative).encode("ascii") + b"\n")
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, remembered per process while its size and time stay."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(_BLOCK):
                digest.update(block)
        _hashes[key] = digest.hexdigest()
    return _hashes[key]


def _revision_files(root: Path) -> list[str]:
    names = {name for name in _REVISION_FILES if (root / name).is_file()}
    for weights in ("model.safetensors", "pytorch_model.bin"):
        if (root / weights).is_file():
            names.add(weights)
            break
    else:
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            if (root / index).is_file():
                names.add(index)
                weight_map = json.loads((root / index).read_text(encoding="utf-8"))
                names.update(str(v) for v in weight_map.get("weight_map", {}).values())
                break
    if (root / "modules.json").is_file():
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        for module in modules if isinstance(modules, list) else []:
            folder = Path(str(module.get("path", "")))
            if not str(module.get("path", "")):
                continue  # the checkpoint's own files, above
            # A module's weights decide the embedding as its config does (a Dense layer's
            # matrix: two Dense files of one shape give unrelated vectors).
            for name in ("config.json", *_MODULE_WEIGHTS):
                if (root / folder / name).is_file():
                    names.add((folder / name).as_posix())
    return sorted(names)
