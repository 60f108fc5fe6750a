"""A retrieval benchmark in BEIR's folder layout, read and checked before any work.

::

    DIR/corpus.jsonl        {"_id": "d1", "title": "...", "text": "..."}   one document a line
    DIR/queries.jsonl       {"_id": "q1", "text": "..."}                   one query a line
    DIR/qrels/<split>.tsv   query-id <TAB> corpus-id <TAB> score           a header line first

A document is embedded as its title and text joined by a space (BEIR's own convention, so
figures compare with BEIR's); an empty title leaves the text alone. Only the queries that the
split judges are evaluated.

Every fault is found before any model is loaded and reported as :class:`DataError`: one line
naming the file, the line and the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

_LEVEL = re.compile(r"[+-]?[0-9]+")  # a relevance level, as trec_eval's atoi reads it


class DataError(ValueError):
    """A benchmark folder that cannot be evaluated; the message names file, line and field."""


@dataclass(frozen=True)
class RetrievalData:
    """A benchmark split: the corpus, the judged queries and their relevance levels.

    Attributes:
        corpus_ids, corpus_texts: the documents, in file order; a text is ``title + " " + text``.
        query_ids, query_texts: the queries the split judges, in ``queries.jsonl`` order.
        qrels: query id -> document id -> relevance level (an int; >= 1 is relevant).
        folder, split: where it was read from.
        sha256: a hash of the three files' bytes: two results with the same hash scored the
            same benchmark.
    """

    corpus_ids: list[str]
    corpus_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, int]]
    folder: Path
    split: str
    sha256: str = field(default="")

    def describe(self) -> dict:
        return {
            "folder": str(self.folder),
            "split": self.split,
            "documents": len(self.corpus_ids),
            "queries": len(self.query_ids),
            "judgements": sum(len(j) for j in self.qrels.values()),
            "sha256": self.sha256,
        }


def load_beir(folder: str | Path, split: str = "test") -> RetrievalData:
    """Read and check ``folder``'s corpus, queries and ``qrels/<split>.tsv``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"--data {folder}: no such directory")
    corpus_path = folder / "corpus.jsonl"
    queries_path = folder / "queries.jsonl"
    qrels_path = folder / "qrels" / f"{split}.tsv"
    for path in (corpus_path, queries_path, qrels_path):
        if path.is_dir():  # "missing" would send the user looking for a file that is there
            raise DataError(f"{path}: is a directory, not a file")
    for path in (corpus_path, queries_path):
        if not path.is_file():
            raise DataError(
                f"{path}: missing (a BEIR folder holds corpus.jsonl, queries.jsonl "
                "and qrels/<split>.tsv)"
            )
    if not qrels_path.is_file():
        offered = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
        raise DataError(
            f"{qrels_path}: missing; split {split!r} has no qrels file"
            + (f" (splits here: {', '.join(offered)})" if offered else "")
        )
    digest = hashlib.sha256()
    corpus = _read_jsonl(corpus_path, ("_id", "text"), ("title",), digest)
    corpus_ids = [row["_id"] for row in corpus]
    corpus_texts = [_document_text(row) for row in corpus]
    if not corpus_ids:
        raise DataError(f"{corpus_path}: no documents")
    queries = _read_jsonl(queries_path, ("_id", "text"), (), digest)
    query_text = {row["_id"]: row["text"] for row in queries}
    qrels = _read_qrels(qrels_path, set(corpus_ids), query_text, digest)
    query_ids = [row["_id"] for row in queries if row["_id"] in qrels]
    return RetrievalData(
        corpus_ids=corpus_ids,
        corpus_texts=corpus_texts,
        query_ids=query_ids,
        query_texts=[query_text[q] for q in query_ids],
        qrels=qrels,
        folder=folder,
        split=split,
        sha256=digest.hexdigest(),
    )


def _document_text(row: dict) -> str:
    title = row.get("title") or ""
    return f"{title} {row['text']}".strip() if title else row["text"]


def _read_jsonl(path: Path, required: tuple, optional: tuple, digest) -> list[dict]:
    rows: list[dict] = []
    seen: dict[str, int] = {}
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            digest.update(raw)
            if not raw.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                raise DataError(f"{where}: not a JSON object ({exc})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for name in required:
                if name not in row:
                    raise DataError(f"{where}: field {name!r} is missing")
            for name in (*required, *optional):
                value = row.get(name)
                if value is None and name in optional:
                    continue  # an optional field may be null
                if not isinstance(value, str):
                    raise DataError(
                        f"{where}: field {name!r} must be a string, got "
                        f"{type(value).__name__} {value!r:.40}"
                    )
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate, written as a \ud800 escape
                    raise DataError(
                        f"{where}: field {name!r} is not valid Unicode text (a lone surrogate)"
                    ) from None
            if not row["_id"].strip():
                raise DataError(f"{where}: field '_id' is empty")
            if row["_id"] != row["_id"].strip():
                # qrels' fields are read stripped: such an id could never be judged.
                raise DataError(
                    f"{where}: field '_id' {row['_id']!r} begins or ends with whitespace"
                )
            if not (row["text"].strip() or (row.get("title") or "").strip()):
                raise DataError(f"{where}: field 'text' is empty")
            if row["_id"] in seen:
                raise DataError(
                    f"{where}: duplicate _id {row['_id']!r} (first on line {seen[row['_id']]})"
                )
            seen[row["_id"]] = number
            rows.append(row)
    return rows


def _read_qrels(path: Path, documents: set[str], queries: dict, digest) -> dict:
    qrels: dict[str, dict[str, int]] = {}
    with path.open("rb") as f:
        lines = f.read()
    digest.update(lines)
    try:
        text = lines.decode("utf-8-sig")  # a byte order mark is not part of the header
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc})") from None
    # Lines end at "\n" alone (str.splitlines would also cut at U+2028, form feeds and the
    # like, inside an id, and number the lines after it wrongly).
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        fields = line.split("\t")
        where = f"{path}, line {number}"
        # The header: BEIR's is "query-id corpus-id score"; any first line whose score is
        # not a number is one (BEIR's loader skips the first line whatever it says).
        if number == 1 and (
            fields[0].strip() == "query-id" or not _LEVEL.fullmatch(fields[-1].strip())
        ):
            continue
        if len(fields) != 3:
            raise DataError(
                f"{where}: expected 3 tab-separated fields (query-id, corpus-id, score), "
                f"got {len(fields)}"
            )
        query, document, score = (f.strip() for f in fields)
        if not _LEVEL.fullmatch(score):
            raise DataError(f"{where}: field 'score' must be an integer, got {score!r}")
        level = int(score)
        if query not in queries:
            raise DataError(f"{where}: field 'query-id' names {query!r}, not in queries.jsonl")
        if document not in documents:
            raise DataError(f"{where}: field 'corpus-id' names {document!r}, not in corpus.jsonl")
        judged = qrels.setdefault(query, {})
        if document in judged:
            raise DataError(f"{where}: ({query!r}, {document!r}) is judged twice")
        judged[document] = level
    if not qrels:
        raise DataError(f"{path}: the split judges no query")
    return qrels
