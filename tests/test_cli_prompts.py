"""The model's prompts on the command line: ``search --corpus`` embeds the query with the
model's ``query`` prompt and the corpus with its ``document`` prompt (or the names
``--query-prompt-name`` / ``--document-prompt-name`` give), and ``encode --prompt-name NAME`` /
``--prompt TEXT`` put a prompt before every text, checked against the model before any work
and, for a directory of shards, recorded in the job."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clearformer.sharded.shards import read_shards
from clearformer.text import TextEncoder

from .index_helpers import cli, tiny_model, word_texts

PROMPTS = {"query": "w1 w2 ", "document": "w3 "}  # words of the tiny model's vocabulary
CORPUS = ["w5 w6 w7", "w8 w9", "w10 w11 w12 w13", "w14"]
QUERY = "w5 w9"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = tiny_model(tmp_path_factory.mktemp("prompted") / "model")
    config = {"prompts": PROMPTS, "default_prompt_name": None}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return path


def one_error_line(result) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


def search_scores(model, corpus, *flags: str) -> dict[int, float]:
    result = cli("search", QUERY, "--corpus", str(corpus), "--model", str(model), "--json",
                 "-k", str(len(CORPUS)), *flags)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return {item["line"]: item["score"] for item in map(json.loads, result.stdout.splitlines())}


def expected_scores(model, query_prompt: str | None, document_prompt: str | None):
    encoder = TextEncoder.from_pretrained(model)
    docs = encoder.encode(CORPUS, normalize=True, prompt_name=document_prompt)
    query = encoder.encode([QUERY], normalize=True, prompt_name=query_prompt)[0]
    return {line: round(float(score), 6) for line, score in enumerate(docs @ query, start=1)}


# --- search --corpus ------------------------------------------------------------------------


def test_search_embeds_with_the_models_query_and_document_prompts(model, corpus):
    got = search_scores(model, corpus)
    want = expected_scores(model, "query", "document")
    assert got == pytest.approx(want, abs=2e-6)
    assert got != pytest.approx(expected_scores(model, None, None), abs=1e-4)


def test_search_takes_the_prompt_names_as_eval_does(model, corpus):
    got = search_scores(model, corpus, "--query-prompt-name", "document",
                        "--document-prompt-name", "query")  # fmt: skip
    assert got == pytest.approx(expected_scores(model, "document", "query"), abs=2e-6)


@pytest.mark.parametrize("flag", ["--query-prompt-name", "--document-prompt-name"])
def test_search_refuses_a_prompt_name_the_model_lacks(model, corpus, flag):
    result = cli("search", QUERY, "--corpus", str(corpus), "--model", str(model), flag, "nope")
    line = one_error_line(result)
    assert f"{flag} 'nope': the model has no such prompt (its prompts: document, query)" in line


@pytest.mark.parametrize("flag", ["--query-prompt-name", "--document-prompt-name"])
def test_an_index_search_refuses_the_corpus_prompt_flags(tmp_path, flag):
    # An index records the prompt its texts were embedded with: these flags would go unused.
    result = cli("search", QUERY, "--index", str(tmp_path / "idx"), flag, "query")
    line = one_error_line(result)
    assert f"{flag} applies to --corpus, not an --index search" in line


def test_search_with_a_model_without_prompts_is_as_before(tmp_path, corpus):
    plain = tiny_model(tmp_path / "plain")
    assert search_scores(plain, corpus) == pytest.approx(
        expected_scores(plain, None, None), abs=2e-6
    )


# --- encode --prompt-name / --prompt ------------------------------------------------------------


def encoded(result) -> np.ndarray:
    assert result.returncode == 0, result.stderr
    return np.array([json.loads(line)["embedding"] for line in result.stdout.splitlines()])


def test_encode_puts_the_named_prompt_before_every_text(model):
    encoder = TextEncoder.from_pretrained(model)
    got = encoded(cli("encode", "--model", str(model), "--prompt-name", "query", *CORPUS))
    np.testing.assert_allclose(got, encoder.encode(CORPUS, prompt_name="query"), atol=1e-7)
    got = encoded(cli("encode", "--model", str(model), "--prompt", "w4 ", *CORPUS))
    np.testing.assert_allclose(got, encoder.encode(CORPUS, prompt="w4 "), atol=1e-7)
    plain = encoded(cli("encode", "--model", str(model), *CORPUS))
    assert not np.allclose(got, plain, atol=1e-4)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prompt-name", "nope"],
         "--prompt-name 'nope': the model has no such prompt (its prompts: document, query)"),
        (["--prompt-name", "query", "--prompt", "w4 "],
         "give --prompt-name NAME or --prompt TEXT, not both"),
    ],
)  # fmt: skip
def test_encode_refuses_a_bad_prompt_before_any_work(tmp_path, model, corpus, flags, message):
    out = tmp_path / "out.npy"
    line = one_error_line(cli("encode", "--model", str(model), "-i", str(corpus), "-o",
                              str(out), *flags))  # fmt: skip
    assert message in line, line
    assert not out.exists()
    shards = tmp_path / "shards"
    line = one_error_line(cli("encode", "--model", str(model), "-i", str(corpus), "-o",
                              f"{shards}/", *flags))  # fmt: skip
    assert message in line, line
    assert not (shards / ".chunks").exists()


def test_sharded_encode_records_the_prompt_and_refuses_a_resume_with_another(tmp_path, model):
    source = tmp_path / "corpus.txt"
    texts = word_texts(20)
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["encode", "--model", str(model), "-i", str(source), "-o", f"{out}/",
            "--chunk-rows", "8"]  # fmt: skip
    result = cli(*argv, "--prompt-name", "query")
    assert result.returncode == 0, result.stderr
    encoder = TextEncoder.from_pretrained(model)
    np.testing.assert_array_equal(read_shards(out), encoder.encode(texts, prompt_name="query"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["job"]["prompt"] == PROMPTS["query"]
    # The same command again: nothing to do. Another prompt, or none: another job, refused.
    assert "nothing to do" in cli(*argv, "--prompt-name", "query").stderr
    for flags in (["--prompt-name", "document"], ["--prompt", "w4 "], []):
        line = one_error_line(cli(*argv, *flags))
        assert "already holds the shards of another run" in line, line


def test_a_killed_sharded_run_resumed_with_another_prompt_is_refused(tmp_path, model):
    from clearformer.sharded.shards import encode_shard

    class Killed(Exception):
        pass

    def stop(index, reused):
        raise Killed

    texts = word_texts(20)
    source = tmp_path / "corpus.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(Killed):
        encode_shard(texts, out, TextEncoder.from_pretrained(model), chunk_rows=8,
                     on_chunk=stop, prompt_name="query")  # fmt: skip
    argv = ["encode", "--model", str(model), "-i", str(source), "-o", f"{out}/",
            "--chunk-rows", "8", "--prompt-name", "document"]  # fmt: skip
    line = one_error_line(cli(*argv))
    assert "holds the chunks of another job (it differs in prompt)" in line, line
