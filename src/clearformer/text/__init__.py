"""Text embeddings: the application on top of a pretrained checkpoint.

* :mod:`.encoder` -- :class:`TextEncoder`: texts in, sentence embeddings out (tokenize, batch,
  run, pool, normalise);
* :mod:`.cross_encoder` -- :class:`CrossEncoder`: text pairs in, relevance scores out (a
  classification head in place of pooling);
* :mod:`.multivector_encoder` -- :class:`MultiVectorEncoder`: a vector per token (ColBERT,
  MaxSim); :mod:`.bge_m3` -- :class:`BGEM3Encoder`: bge-m3's dense, sparse and ColBERT outputs;
* :mod:`.sparse_encoder` -- :class:`SparseEncoder`: texts in, SPLADE weights over the
  vocabulary out;
* :mod:`.batching` -- how sorted texts are cut into forward passes;
* :mod:`.workers` -- independent forward passes side by side on a CPU's cores.

The checkpoint format it reads is :mod:`clearformer.interop.hf`; the pooling is
:func:`clearformer.heads.pool`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports as _lazy_exports

# Imported on first use: the CLI reads batching defaults from .batching without paying for
# torch (see clearformer/__init__.py).
_EXPORTS = {
    "TextEncoder": ".encoder",
    "CrossEncoder": ".cross_encoder",
    "MultiVectorEncoder": ".multivector_encoder",
    "BGEM3Encoder": ".bge_m3",
    "SparseEncoder": ".sparse_encoder",
}
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from .bge_m3 import BGEM3Encoder
    from .cross_encoder import CrossEncoder
    from .encoder import TextEncoder
    from .multivector_encoder import MultiVectorEncoder
    from .sparse_encoder import SparseEncoder

__all__ = ["BGEM3Encoder", "CrossEncoder", "MultiVectorEncoder", "SparseEncoder", "TextEncoder"]
