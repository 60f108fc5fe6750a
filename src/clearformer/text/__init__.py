"""Text embeddings: the application on top of a pretrained checkpoint.

* :mod:`.encoder` -- :class:`TextEncoder`: texts in, sentence embeddings out (tokenize, batch,
  run, pool, normalise);
* :mod:`.cross_encoder` -- :class:`CrossEncoder`: text pairs in, relevance scores out (a
  classification head in place of pooling);
* :mod:`.batching` -- how sorted texts are cut into forward passes;
* :mod:`.workers` -- independent forward passes side by side on a CPU's cores.

The checkpoint format it reads is :mod:`clearformer.interop.hf`; the pooling is
:func:`clearformer.heads.pool`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cross_encoder import CrossEncoder
    from .encoder import TextEncoder

__all__ = ["CrossEncoder", "TextEncoder"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the CLI reads batching defaults from .batching without paying
    # for torch (see clearformer/__init__.py).
    if name == "TextEncoder":
        from .encoder import TextEncoder

        return TextEncoder
    if name == "CrossEncoder":
        from .cross_encoder import CrossEncoder

        return CrossEncoder
    raise AttributeError(f"module 'clearformer.text' has no attribute {name!r}")
