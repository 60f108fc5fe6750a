"""MaxSim, ColBERT's late-interaction score: :mod:`clearformer.heads.maxsim`, named here too.

It lives among the heads because the multi-vector encoders (``clearformer.text``) score with
it and the retrieval package is built on ``clearformer.text``: a text module importing from
here would close an import cycle (``tests/test_import_cycles.py``).
"""

from __future__ import annotations

from ..heads.maxsim import maxsim, maxsim_scores

__all__ = ["maxsim", "maxsim_scores"]
