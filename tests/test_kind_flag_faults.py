"""Review faults 10 and 11 (sparse, multi-vector and bge-m3 on the command line and the server).

10: a ``--model`` of a kind the command does not run is refused in one line naming the flag
    and the command-line route (``--kind sparse``, ``--sparse-model``, ...), before any model
    loads, never with the library's Python advice ("use clearformer.SparseEncoder...").
11: a flag or field that would change nothing is refused by name, or honoured: ``--workers``
    reaches a sparse encode and ``--max-tokens`` is refused there; ``--candidates`` on a sparse
    index of the exact engine; a model's flags where BM25 alone runs; ``/embed_multivector``'s
    ``truncate`` and ``truncation_direction``.
"""

from __future__ import annotations

import json

import pytest
import torch

from clearformer import TextEncoder

from .hybrid_helpers import FakeSparseEncoder
from .index_helpers import cli, tiny_model, word_texts

pytest.importorskip("usearch")
pytest.importorskip("bm25s")

QUERY = "w3 w7 w11"


def snapshot(folder) -> list[tuple[str, int]]:
    return sorted((str(p), p.stat().st_size) for p in folder.rglob("*") if p.is_file())


def refused(*argv: str) -> str:
    """The one error line of a refused command (exit 2, nothing on stdout, no traceback)."""
    result = cli(*argv)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny dense model, a plain dense index and a bm25-only folder over a word corpus, and
    model directories of each other kind (their kind is read from their files alone: the
    refusals come before any weight is read, so no weights are needed)."""
    root = tmp_path_factory.mktemp("kind-flags")
    model = tiny_model(root / "model")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(word_texts(40)) + "\n", encoding="utf-8")
    more = root / "more.txt"
    more.write_text("w1 w2 w3\nw4 w5\n", encoding="utf-8")
    for out, flags in (("dense1", ("--model", str(model))), ("bm25", ("--kind", "bm25"))):
        result = cli("index", "build", "--corpus", str(corpus), "--out", str(root / out),
                     "--no-progress", *flags)  # fmt: skip
        assert result.returncode == 0, result.stderr
    kinds = {"sparse": "SparseEncoder", "multivector": "MultiVectorEncoder"}
    for kind, model_type in kinds.items():
        (root / kind).mkdir()
        (root / kind / "config_sentence_transformers.json").write_text(
            json.dumps({"model_type": model_type}), encoding="utf-8"
        )
    (root / "m3").mkdir()
    (root / "m3" / "sparse_linear.pt").write_bytes(b"")  # bge-m3's head file names its kind
    return {"root": root, "model": model, "corpus": corpus, "more": more}


@pytest.fixture
def no_dense_load(monkeypatch):
    """Loading a dense model is a test failure: the refusal must come first."""

    def loaded(*args, **kwargs):
        raise AssertionError("TextEncoder.from_pretrained called before the kind was refused")

    monkeypatch.setattr(TextEncoder, "from_pretrained", loaded)


# Fault 10 -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, said",
    [
        (("index", "build", "--corpus", "{corpus}", "--out", "{root}/X", "--model", "{sparse}"),
         "--model {sparse} is a sparse model; build its index with --kind sparse"),
        (("index", "build", "--corpus", "{corpus}", "--out", "{root}/X", "--model", "{m3}"),
         "--model {m3} is a bge-m3 model; build its dense view with --kind dense"),
        (("search", QUERY, "--index", "{root}/dense1", "--model", "{sparse}"),
         "--model {sparse} is a sparse model; {root}/dense1 is a dense index, searched with its "
         "own dense model (omit --model); a sparse model needs an index built with "
         "`clearformer index build --kind sparse`"),
        (("search", QUERY, "--corpus", "{corpus}", "--model", "{multivector}"),
         "--model {multivector} is a multivector model; a --corpus search ranks with a dense "
         "model: build an index with `clearformer index build --kind multivector --corpus FILE "
         "--out INDEX --model {multivector}`"),
        (("encode", "--model", "{multivector}", "x"),
         "--model {multivector} is a multivector model; encode embeds dense and sparse models: "
         "index it with `clearformer index build --kind multivector --model {multivector}`, or "
         "serve it"),
        (("encode", "--model", "{m3}", "x"),
         "--model {m3} is a bge-m3 model; encode embeds dense and sparse models"),
        (("encode", "--model", "{sparse}", "--input", "{corpus}", "--output", "{root}/shards/"),
         "--model {sparse} is a sparse model; its weights go to JSONL"),
        (("index", "add", "{root}/dense1", "--corpus", "{more}", "--model", "{sparse}"),
         "--model {sparse} is a sparse model; {root}/dense1 is a dense index, embedded with its "
         "own dense model (omit --model)"),
    ],
)  # fmt: skip
def test_a_model_of_another_kind_is_refused_naming_the_flag_and_the_cli_route(
    setup, no_dense_load, argv, said
):
    names = {k: str(setup["root"] / k) for k in ("sparse", "multivector", "m3")}
    names.update(root=str(setup["root"]), corpus=str(setup["corpus"]), more=str(setup["more"]))
    before = snapshot(setup["root"])
    line = refused(*(a.format(**names) for a in argv))
    assert said.format(**names) in line, line
    assert "from_pretrained" not in line and "TextEncoder" not in line  # no Python advice
    assert snapshot(setup["root"]) == before  # nothing written


# Fault 11 -------------------------------------------------------------------------------


class _SpyEncoder:
    """A SparseEncoder stand-in recording what encode_document was asked."""

    precision = "float32"
    asked: dict = {}

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        return cls()

    def encode_document(self, texts, **kwargs):
        _SpyEncoder.asked = kwargs
        indices = torch.tensor([list(range(len(texts))), [1] * len(texts)])
        shape = (len(texts), 4)
        return torch.sparse_coo_tensor(
            indices, torch.ones(len(texts)), shape, check_invariants=True
        )


def test_a_sparse_encode_takes_workers_and_refuses_max_tokens(setup, monkeypatch):
    import clearformer.text

    monkeypatch.setattr(clearformer.text, "SparseEncoder", _SpyEncoder, raising=False)
    sparse = str(setup["root"] / "sparse")
    result = cli("encode", "--model", sparse, "--workers", "3", "a", "b")
    assert result.returncode == 0, result.stderr
    assert _SpyEncoder.asked.get("workers") == 3  # passed through, not dropped
    line = refused("encode", "--model", sparse, "--max-tokens", "1", "a")
    assert f"--max-tokens applies to dense models; --model {sparse} is a sparse" in line
    assert "--batch-size" in line


def test_candidates_on_a_sparse_index_of_the_exact_engine_is_refused(setup, monkeypatch, tmp_path):
    """The sparse encoder loads through commands.kind_models.load_model (faked here)."""
    import clearformer.commands.kind_models as kinds

    monkeypatch.setattr(kinds, "load_model", lambda kind, path, **o: FakeSparseEncoder())
    monkeypatch.setattr(kinds, "checkpoint_kind", lambda path: "sparse")
    out = tmp_path / "idx"
    result = cli("index", "build", "--kind", "sparse", "--model", str(tmp_path), "--corpus",
                 str(setup["corpus"]), "--out", str(out), "--no-progress")  # fmt: skip
    assert result.returncode == 0, result.stderr
    model = ("--sparse-model", str(tmp_path))
    assert cli("search", QUERY, "--index", str(out), *model).returncode == 0
    line = refused("search", QUERY, "--index", str(out), "--mode", "sparse", "--candidates", "7",
                   *model)  # fmt: skip
    assert "--candidates applies to multivector or a sparse index of engine seismic" in line
    assert f"the sparse index of {out} is of engine exact" in line


@pytest.mark.parametrize(
    "flags, said",
    [
        (("--precision", "bf16"), "--precision bf16 applies to a model"),
        (("--workers", "2"), "--workers applies to a model"),
        (("--max-tokens", "9"), "--max-tokens applies to a model"),
    ],
)
def test_a_model_flag_where_bm25_alone_runs_is_refused(setup, flags, said):
    root = setup["root"]
    before = snapshot(root)
    line = refused("search", QUERY, "--index", str(root / "bm25"), "--mode", "bm25", *flags)
    assert said in line and "--mode bm25 uses none" in line, line
    line = refused("index", "build", "--kind", "bm25", "--corpus", str(setup["corpus"]),
                   "--out", str(root / "new-bm25"), *flags)  # fmt: skip
    assert said in line and "--kind bm25 uses none" in line, line
    line = refused("index", "add", str(root / "bm25"), "--corpus", str(setup["more"]), *flags)
    assert said in line and "(bm25 alone) uses none" in line, line
    assert snapshot(root) == before


@pytest.fixture(scope="module")
def colbert_server(tmp_path_factory):
    """A served ColBERT directory (sentence-transformers writes it; queries of 12 tokens,
    documents of 20): skipped, alone, where the server or sentence-transformers is missing."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    pytest.importorskip("sentence_transformers")
    from clearformer.serve import ModelSpec, ServeConfig

    from .multivector_helpers import bert_base, st_multivector_dir
    from .test_serve_api import running_server

    base = tmp_path_factory.mktemp("bert")
    bert_base(base)
    expansion = {"strategy": "fixed", "length": 12, "attend": False}
    colbert = st_multivector_dir(base, tmp_path_factory.mktemp("colbert"), expansion=expansion)
    config = ServeConfig(port=0, workers=1, max_client_batch_size=8)
    with running_server(config, [ModelSpec(str(colbert), name="colbert")]) as running:
        yield running


@pytest.mark.parametrize("mode, limit", [("query", 12), ("document", 20)])
def test_embed_multivector_holds_to_truncate_and_refuses_a_cut_at_the_start(
    colbert_server, mode, limit
):
    from .test_serve_api import post

    def answer(text, **fields):
        body = {"inputs": [text], "mode": mode, "model": "colbert", **fields}
        response = post(colbert_server.url, "/embed_multivector", body)
        error = response.json()["error"] if response.status_code != 200 else ""
        return response.status_code, error

    long = "quick brown fox jumps over the lazy dog " * 4  # past either side's length
    assert answer(long)[0] == 200  # not sent: cut at the end, as encode cuts it
    assert answer(long, truncate=True)[0] == 200
    status, error = answer(long, truncate=False)
    assert status == 413 and "inputs[0] has" in error, error
    assert f"over the limit of {limit} tokens per input for {mode} inputs" in error
    assert answer("the cat", truncate=False)[0] == 200  # a short text is not cut: kept
    status, error = answer(long, truncation_direction="left")
    assert status == 422 and "truncation_direction must be 'right'" in error, error
    assert "got 'left'" in error
