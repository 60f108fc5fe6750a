"""Model heads: what turns an encoder's token states into the output a task needs.

* :mod:`.pooling` -- :func:`pool`, the sentence-embedding head (one vector per sequence);
* :mod:`.classification` -- :class:`SequenceClassifier`, the sequence-classification head
  (pooled states -> dense -> activation -> optional norm -> logits) that cross-encoders and
  text classifiers put on top of the encoder;
* :mod:`.masked_lm` -- :class:`MaskedLMHead`, token states -> vocabulary logits, decoding
  with the tied word-embedding table;
* :mod:`.sentence` -- :class:`SentenceHead`: the pooling, then sentence-transformers' Dense and
  Normalize modules, then a Matryoshka cut;
* :mod:`.logit_score` -- :class:`LogitScore`: a causal language model's "yes" minus "no" logit
  at the last token, the score of an LLM reranker;
* :mod:`.maxsim` -- :func:`~.maxsim.maxsim_scores`: ColBERT's late-interaction score of
  multi-vector embeddings.

They live beside the model rather than in the text applications, so that anything holding
token states (a trainer, the explainer's toy encoder) uses them the same way.
"""

from __future__ import annotations

from .classification import CLASSIFIER_ACTIVATIONS, ClassifierConfig, SequenceClassifier
from .logit_score import LogitScore, LogitScoreConfig
from .masked_lm import MaskedLMConfig, MaskedLMHead
from .pooling import POOLING_MODES, pool
from .sentence import DenseConfig, SentenceHead, SentenceHeadConfig

__all__ = [
    "CLASSIFIER_ACTIVATIONS",
    "POOLING_MODES",
    "ClassifierConfig",
    "DenseConfig",
    "LogitScore",
    "LogitScoreConfig",
    "MaskedLMConfig",
    "MaskedLMHead",
    "SentenceHead",
    "SentenceHeadConfig",
    "SequenceClassifier",
    "pool",
]
