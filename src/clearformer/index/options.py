"""``IndexOptions``: how an index stores and searches its vectors, fixed when it is built."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

STORAGES = ("float32", "int8", "binary")
ANN_MODES = ("auto", "hnsw", "exact")
# Up to this many vectors `auto` searches exactly: a scan of 20,000 float32 rows of width 384
# takes a millisecond or two and loses no recall; below that a graph's build time and memory
# buy little.
EXACT_MAX_ROWS = 20_000
# Candidates fetched per result, rescored with the float32 vectors, by storage. On MiniLM
# embeddings of BBC News texts, with queries from other topics than the corpus (the hard
# case), an int8 scan found 99.2 % of the float32 top 10 among its top 40 and a binary scan
# 94.7 % among its top 160; twice as many leaves a margin at little cost (a few hundred
# float32 rows read per query; docs/index.md).
DEFAULT_RESCORE = {"float32": 1, "int8": 8, "binary": 32}


def resolve_ann(ann: str, rows: int) -> str:
    """The search an index of ``rows`` vectors (or documents) runs for ``ann``: ``auto`` is an
    exact scan up to :data:`EXACT_MAX_ROWS`, a graph above; ``exact`` and ``hnsw`` as named.
    Resolved at every build and add from the rows then held."""
    if ann != "auto":
        return ann
    return "exact" if rows <= EXACT_MAX_ROWS else "hnsw"


@dataclass(frozen=True)
class IndexOptions:
    """How an index stores and searches its vectors.

    Storage and dimensions are fixed when the index is built (``add`` keeps them); the search
    settings are defaults that a search may override.
    """

    storage: str = "float32"  # float32 | int8 | binary: what the graph (or scan) holds in memory
    dimensions: int | None = None  # Matryoshka: the first N of the model's D, renormalised
    ann: str = "auto"  # auto: exact below EXACT_MAX_ROWS vectors, else hnsw
    connectivity: int = 16  # HNSW edges per node (usearch's default): memory against recall
    expansion_add: int = 128  # HNSW candidate list while inserting (usearch's default)
    expansion_search: int = 128  # candidate list while searching: recall 0.99+ at 100k (docs)
    rescore_multiplier: int | None = None  # candidates per result; None = DEFAULT_RESCORE
    chunk_rows: int = 4096  # texts embedded per committed chunk: what a killed build resumes from

    def __post_init__(self) -> None:
        if self.storage not in STORAGES:
            raise ValueError(f"storage must be one of {STORAGES}, got {self.storage!r}")
        if self.ann not in ANN_MODES:
            raise ValueError(f"ann must be one of {ANN_MODES}, got {self.ann!r}")
        if self.dimensions is not None:
            _positive(self.dimensions, "dimensions")
            if self.storage == "binary" and self.dimensions % 8:
                raise ValueError(
                    f"dimensions must be a multiple of 8 with binary storage (8 bits a byte), "
                    f"got {self.dimensions}"
                )
        for name in ("connectivity", "expansion_add", "expansion_search", "chunk_rows"):
            _positive(getattr(self, name), name)
        if self.rescore_multiplier is not None:
            _positive(self.rescore_multiplier, "rescore_multiplier")

    @property
    def rescore(self) -> int:
        """Candidates fetched per result."""
        if self.rescore_multiplier is not None:
            return self.rescore_multiplier
        return DEFAULT_RESCORE[self.storage]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IndexOptions:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _positive(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
