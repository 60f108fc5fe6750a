"""Text embeddings: the application on top of a pretrained checkpoint.

* :mod:`.encoder` -- :class:`TextEncoder`: texts in, sentence embeddings out (tokenize, batch,
  run, pool, normalise);
* :mod:`.batching` -- how sorted texts are cut into forward passes;
* :mod:`.workers` -- independent forward passes side by side on a CPU's cores.

The checkpoint format it reads is :mod:`clearformer.interop.hf`; the pooling is
:func:`clearformer.heads.pool`.
"""

from .encoder import TextEncoder

__all__ = ["TextEncoder"]
