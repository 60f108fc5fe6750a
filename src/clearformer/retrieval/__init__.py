"""Retrieval quality: how well a model and its search path find a benchmark's relevant texts.

* :mod:`.beir` -- :func:`load_beir`: a BEIR folder (corpus, queries, qrels), checked first;
* :mod:`.metrics` -- NDCG, MRR, recall, MAP and precision at a cut-off, as trec_eval computes them;
* :mod:`.stages` -- the search stages: exact, a persistent index, a cross-encoder rerank;
* :mod:`.evaluation` -- :func:`evaluate`: the stages run and scored (``clearformer eval``);
* :mod:`.comparison` -- two results compared per measure with a paired bootstrap interval;
* :mod:`.trec` -- runs in TREC format;
* :mod:`.model_kind` -- :func:`model_kind`: dense, sparse, multi-vector or BGE-M3, from a
  directory's files;
* :mod:`.bbc` -- the BBC News headline -> article benchmark that ships with the project.

See ``docs/retrieval.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports as _lazy_exports

# Imported on first use: the command line reads the measures' names without numpy or torch.
_EXPORTS = {
    "DataError": ".beir",
    "RetrievalData": ".beir",
    "load_beir": ".beir",
    "Difference": ".comparison",
    "compare": ".comparison",
    "EvalResult": ".evaluation",
    "EvalSettings": ".evaluation",
    "evaluate": ".evaluation",
    "DEFAULT_MEASURES": ".metrics",
    "evaluate_run": ".metrics",
    "mean_measures": ".metrics",
    "ranked": ".metrics",
}

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())

# Imported at once (it needs only the standard library): the function shares its module's
# name, and a lazy export would lose to the module once anything imported the module itself.
from .model_kind import MODEL_KINDS, model_kind  # noqa: E402

if TYPE_CHECKING:
    from .beir import DataError, RetrievalData, load_beir
    from .comparison import Difference, compare
    from .evaluation import EvalResult, EvalSettings, evaluate
    from .metrics import DEFAULT_MEASURES, evaluate_run, mean_measures, ranked

__all__ = [
    "DEFAULT_MEASURES",
    "DataError",
    "MODEL_KINDS",
    "Difference",
    "EvalResult",
    "EvalSettings",
    "RetrievalData",
    "compare",
    "evaluate",
    "evaluate_run",
    "load_beir",
    "mean_measures",
    "model_kind",
    "ranked",
]
