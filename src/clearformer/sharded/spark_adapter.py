"""Spark: embed a DataFrame's text column with an iterator pandas UDF, the model loaded once
per Python worker.

An iterator UDF receives a partition's batches as one iterator, so setup before the loop runs
once per task; the encoder is also kept per worker process (Spark reuses its Python workers by
default, ``spark.python.worker.reuse``), so later tasks on that worker load nothing. PySpark is
imported only when the UDF is made. ``pip install 'clearformer[spark]'`` (and a Java runtime).

::

    from clearformer.sharded.spark_adapter import embedding_udf

    embed = embedding_udf(model=None)  # None: the bundled all-MiniLM-L6-v2
    df = spark.read.text("corpus.txt").withColumnRenamed("value", "text")
    df.withColumn("embedding", embed("text")).write.parquet("embeddings/")
"""

# No ``from __future__ import annotations`` here: PySpark reads the UDF's type hints to
# choose the iterator form, and needs them as objects, not strings naming a local ``pd``.
import functools
from collections.abc import Iterator
from typing import Any

from .batch_texts import batch_texts
from .options import check_encode_options


@functools.lru_cache(maxsize=4)
def _encoder(model: str | None):
    from ..text import TextEncoder

    return TextEncoder.from_pretrained(model)


def embedding_udf(
    model: str | None = None,
    *,
    normalize: bool | None = None,
    precision: str = "float32",
    **encode_options: Any,
):
    """A pandas UDF (``Iterator[pd.Series] -> Iterator[pd.Series]``) from a text column to an
    ``array<float>`` column of embeddings.

    Args:
        model: a checkpoint directory that every worker can read; None = the bundled model.
        normalize, precision, encode_options: as :meth:`clearformer.TextEncoder.encode` (but
            ``progress``), checked here, on the driver: a wrong one would otherwise fail in
            every executor, at its first batch.
    """
    check_encode_options(normalize, precision, encode_options)
    import pandas as pd
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType

    options = {"normalize": normalize, "precision": precision, **encode_options}

    @pandas_udf(ArrayType(FloatType()))
    def embed(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        encoder = _encoder(model)  # once per worker process, before the first batch
        for texts in batches:
            vectors = encoder.encode(batch_texts(texts.tolist()), progress=False, **options)
            yield pd.Series(list(vectors))

    return embed
