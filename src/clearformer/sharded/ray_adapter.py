"""Ray Data: embed a dataset's text column with ``map_batches``, the model loaded once per
worker.

``map_batches`` given a callable *class* runs it in a pool of actors, each constructing it
once: so each actor loads the checkpoint once and embeds every batch it is sent with it (a
function would load the model for every batch). Ray itself is not imported here; this module
only defines what Ray calls. ``pip install 'clearformer[ray]'``.

::

    import ray
    from clearformer.sharded.ray_adapter import TextEmbedder

    ds = ray.data.read_text("corpus.txt")  # a "text" column
    ds = ds.map_batches(
        TextEmbedder,
        # checked here, on the driver; None: the bundled all-MiniLM-L6-v2
        fn_constructor_kwargs=TextEmbedder.arguments(model=None),
        batch_size=256,
        concurrency=2,  # actors, each with its own copy of the model
        batch_format="numpy",
    )
    ds.write_parquet("embeddings/")

Rows keep their order within a batch; across batches Ray may reorder them unless
``ray.data.DataContext.get_current().execution_options.preserve_order`` is set.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batch_texts import batch_texts
from .options import check_encode_options


class TextEmbedder:
    """Adds an embedding column to each batch (a dict of numpy arrays, or a pandas DataFrame).

    Args:
        model: a checkpoint directory; None = the bundled all-MiniLM-L6-v2.
        column: the text column; ``output_column``: where the (B, D) float32 embeddings go.
        normalize, precision, encode_options: as :meth:`clearformer.TextEncoder.encode`
            (but ``progress``), checked before the model loads.

    Ray constructs the class in each actor: :meth:`arguments` checks the options on the
    driver, before any actor starts.
    """

    @classmethod
    def arguments(cls, model: str | None = None, **options: Any) -> dict[str, Any]:
        """``fn_constructor_kwargs`` for ``map_batches``, checked as the constructor checks
        them (TypeError or ValueError naming the option), without loading the model."""
        _check(**options)
        return {"model": model, **options}

    def __init__(
        self,
        model: str | None = None,
        *,
        column: str = "text",
        output_column: str = "embedding",
        normalize: bool | None = None,
        precision: str = "float32",
        **encode_options: Any,
    ) -> None:
        from ..text import TextEncoder

        _check(  # before the model loads
            column=column,
            output_column=output_column,
            normalize=normalize,
            precision=precision,
            **encode_options,
        )
        self.encoder = TextEncoder.from_pretrained(model)  # once per actor
        self.column = column
        self.output_column = output_column
        self.options = {"normalize": normalize, "precision": precision, **encode_options}

    def __call__(self, batch):
        if self.column not in batch:
            raise KeyError(f"the batch has no column {self.column!r}; it has {list(batch)}")
        texts = batch_texts(batch[self.column], self.column)
        vectors = self.encoder.encode(texts, progress=False, **self.options)  # (B, D)
        if isinstance(batch, dict):
            return {**batch, self.output_column: vectors}
        batch = batch.copy()  # a pandas DataFrame: one array per row
        batch[self.output_column] = list(np.asarray(vectors))
        return batch


def _check(
    *,
    column: str = "text",
    output_column: str = "embedding",
    normalize: bool | None = None,
    precision: str = "float32",
    **encode_options: Any,
) -> None:
    """:class:`TextEmbedder`'s keywords checked as its constructor checks them."""
    for name, value in (("column", column), ("output_column", output_column)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {value!r}")
    check_encode_options(normalize, precision, encode_options)
