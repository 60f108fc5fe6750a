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
        fn_constructor_kwargs={"model": None},  # None: the bundled all-MiniLM-L6-v2
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


class TextEmbedder:
    """Adds an embedding column to each batch (a dict of numpy arrays, or a pandas DataFrame).

    Args:
        model: a checkpoint directory; None = the bundled all-MiniLM-L6-v2.
        column: the text column; ``output_column``: where the (B, D) float32 embeddings go.
        normalize, precision, encode_options: as :meth:`clearformer.TextEncoder.encode`.
    """

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
