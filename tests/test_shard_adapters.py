"""The Ray Data and Spark adapters in local mode: each embeds a text column with the model
loaded once per worker, and gives the embeddings ``TextEncoder.encode`` gives.

Both frameworks start their own runtime (Ray's processes, Spark's JVM), which takes several
seconds. They are optional extras for users (``clearformer[ray]``, ``clearformer[spark]``) and
part of the ``test`` extra; these tests skip where a package, or Spark's Java runtime, is
missing (``.ci/run`` installs one)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from clearformer.text import TextEncoder

from .index_helpers import tiny_model, word_texts


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def test_ray_map_batches_with_the_callable_class(model):
    ray = pytest.importorskip("ray")
    from clearformer.sharded.ray_adapter import TextEmbedder

    texts = word_texts(40)
    expected = TextEncoder.from_pretrained(model).encode(texts)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        ds = ray.data.from_items([{"text": t, "row": i} for i, t in enumerate(texts)])
        ds = ds.map_batches(
            TextEmbedder,
            fn_constructor_kwargs={"model": str(model)},
            batch_size=16,
            concurrency=1,
            batch_format="numpy",
        )
        rows = sorted(ds.take_all(), key=lambda r: r["row"])
    finally:
        ray.shutdown()
    got = np.stack([r["embedding"] for r in rows])
    assert [r["text"] for r in rows] == texts
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_ray_embedder_takes_pandas_batches_and_names_a_missing_column(model):
    pd = pytest.importorskip("pandas")
    from clearformer.sharded.ray_adapter import TextEmbedder

    embedder = TextEmbedder(str(model), column="body")
    frame = pd.DataFrame({"body": ["w1 w2", "w3"]})
    out = embedder(frame)
    assert list(out.columns) == ["body", "embedding"] and len(out.embedding[0]) == 16
    with pytest.raises(KeyError, match="no column 'body'"):
        embedder({"text": np.array(["w1"])})


def test_spark_iterator_pandas_udf(model, monkeypatch):
    pytest.importorskip("pyspark")
    pytest.importorskip("pandas")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("Spark needs a Java runtime: apt-get install openjdk-17-jre-headless")
    # Spark's workers start PYSPARK_PYTHON (else the system python3, which may lack pandas):
    # run them on this interpreter, as a user's job does from its own environment.
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from clearformer.sharded.spark_adapter import embedding_udf

    texts = word_texts(40)
    expected = TextEncoder.from_pretrained(model).encode(texts)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("clearformer-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "16")
        .getOrCreate()
    )
    try:
        frame = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], ["row", "text"])
        embed = embedding_udf(str(model))
        rows = frame.withColumn("embedding", embed("text")).orderBy("row").collect()
    finally:
        spark.stop()
    got = np.array([r["embedding"] for r in rows], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_the_test_extra_installs_what_these_tests_need():
    # Without them every test here skips, and nothing shows that the adapters work: the
    # README's test command (which .ci/run runs) installs the `test` extra.
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    test = {Requirement(r).name: Requirement(r) for r in extras["test"]}
    assert {"ray", "pandas", "pyspark"} <= set(test)
    assert "data" in test["ray"].extras  # Ray Data's map_batches


def test_the_spark_udf_refuses_a_text_that_is_no_string():
    """The pandas UDF's texts (Spark sends a pandas Series per batch): a null or a NaN is an
    error naming its row, not the embedding of "None" or "nan"."""
    pd = pytest.importorskip("pandas")
    from clearformer.sharded.batch_texts import batch_texts

    assert batch_texts(pd.Series(["a", "b"])) == ["a", "b"]
    for bad in (None, float("nan"), 3):
        with pytest.raises(TypeError, match="row 1 of this batch is"):
            batch_texts(pd.Series(["a", bad], dtype=object))
