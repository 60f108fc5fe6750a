"""How the server's models tokenize a request's inputs in its handler: a refused input is
counted, and a left cut gets its prompt back, without tokenizers' single-input ``encode`` on the
input (it holds the GIL for the whole text: a body near the size limit would stop every other
request, ``/health`` included, for about a second); and a too-long ``/rerank`` pair is refused
naming the side at fault."""

from __future__ import annotations

import os

import pytest

from .helpers import write_tiny_bert
from .test_serve_prompts import WORDS, _prompts

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from clearformer.serve.errors import ApiError  # noqa: E402
from clearformer.serve.models import ModelSpec, load_model  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LONG = " ".join(["cat"] * 40)  # 42 tokens with [CLS] and [SEP]


class SingleEncodeSpy:
    """A ``tokenizers.Tokenizer`` in all but its single-input ``encode``, whose inputs it
    records before passing the call on."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.encoded: list[str] = []

    def encode(self, *args, **kwargs):
        self.encoded.extend(a for a in args if isinstance(a, str))
        return self._tokenizer.encode(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def _spied(served, attribute: str = "_full", key=None) -> SingleEncodeSpy:
    if key is None:
        spy = SingleEncodeSpy(getattr(served, attribute))
        setattr(served, attribute, spy)
    else:
        spy = SingleEncodeSpy(getattr(served, attribute)[key])
        getattr(served, attribute)[key] = spy
    return spy


@pytest.fixture(autouse=True)
def _short_heads(monkeypatch):
    # The prompt's tokens are read from a bounded start of each input: bounded here below
    # the test texts' lengths, so that a single-input encode of a whole text shows.
    from clearformer.serve import prompt_cut

    monkeypatch.setattr(prompt_cut, "CONTEXT_CHARS", 8)


def _only_prompts(spy: SingleEncodeSpy, *prompts: str) -> None:
    """Single-input encodes saw prompts and the bounded starts of inputs, never a whole
    text."""
    bound = max((len(p) for p in prompts), default=0) + 8
    assert all(len(text) <= bound for text in spy.encoded), spy.encoded


def _refusal(call) -> ApiError:
    with pytest.raises(ApiError) as refused:
        call()
    assert refused.value.status == 413
    return refused.value


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    path = write_tiny_bert(tmp_path_factory.mktemp("prompted"), WORDS)
    _prompts(path, {"q": "dog dog "})
    return path


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    pytest.importorskip("transformers")
    from .test_sequence_classification import make_classifier

    path = tmp_path_factory.mktemp("prompted-reranker")
    make_classifier("bert", path, num_labels=1)
    _prompts(path, {"q": "w5 w6 w7 "}, default="q")
    return path


def _served(path, limit: int | None = None):
    return load_model(
        ModelSpec(str(path)), max_input_tokens=limit, precision="float32", backend="auto"
    )


def test_an_embedding_input_is_refused_and_cut_without_a_single_text_encode(prompted):
    served = _served(prompted)
    spy = _spied(served)
    refused = _refusal(lambda: served.prepare(["a", LONG], field="inputs", normalize=True))
    assert refused.message.startswith("inputs[1] has 42 tokens, over the limit of 32")
    cut = served.prepare(
        [LONG], field="inputs", normalize=True, truncate=True, direction="left", prompt_name="q"
    )
    dog, cat = WORDS.index("dog"), WORDS.index("cat")
    assert list(cut.encodings[0].ids) == [2, dog, dog, *[cat] * 28, 3]  # the prompt kept
    _only_prompts(spy, "dog dog ")


def test_a_rerank_pair_is_refused_and_cut_without_a_single_text_encode(reranker):
    served = _served(reranker, limit=12)
    spy = _spied(served)
    long = "w1 w2 w3 w4 w5 w6 w8 w9 w10 w11"
    _refusal(lambda: served.prepare_pairs("w1", [long], activation="identity"))
    served.prepare_pairs("w1", [long], activation="identity", truncate=True, direction="left")
    _only_prompts(spy, "w5 w6 w7 ")


def test_a_sparse_input_is_refused_and_cut_without_a_single_text_encode(tmp_path):
    pytest.importorskip("sentence_transformers")
    from clearformer.serve.sparse import load_sparse

    from .sparse_helpers import splade_dir, write_mlm

    path = splade_dir(write_mlm(tmp_path / "mlm"), tmp_path / "splade")
    _prompts(path, {"document": "hello world "})
    served = load_sparse(
        ModelSpec(str(path)), max_input_tokens=8, precision="float32", backend="auto"
    )
    spy = _spied(served, "_untruncated", "document")
    text = "the quick brown fox jumps over the lazy"
    refused = _refusal(lambda: served.prepare_sparse([text], task="document"))
    assert "inputs[0] has 12 tokens" in refused.message
    served.prepare_sparse([text], task="document", truncate=True, direction="left")
    _only_prompts(spy, "hello world ")


def test_a_bge_m3_input_is_refused_without_a_single_text_encode(tmp_path):
    pytest.importorskip("transformers")
    from clearformer.serve.token_models import load_served_model

    from .xlmr_helpers import make_bge_m3

    make_bge_m3(tmp_path, seed=2)
    served = load_served_model(
        ModelSpec(str(tmp_path)), max_input_tokens=8, precision="float32", backend="auto"
    )
    spy = _spied(served)
    refused = _refusal(
        lambda: served.prepare_tokens(
            ["a b c d e f g h i j"], output="dense", side="document", field="inputs", truncate=False
        )
    )
    assert "inputs[0] has" in refused.message
    _only_prompts(spy)


def test_a_too_long_pair_names_the_query_when_it_alone_is_over_the_limit(reranker):
    served = _served(reranker, limit=12)
    long = "w1 w2 w3 w4 w5 w6 w8 w9 w10 w11"  # 10 words
    # The prompt's 3 words, the query's 10, [CLS] and [SEP]: no text fits beside them.
    refused = _refusal(lambda: served.prepare_pairs(long, ["w1"], activation="identity"))
    assert refused.param == "query"
    assert refused.message == (
        "query has 15 tokens with the model's prompt, over the limit of 12 tokens per "
        f"(query, text) pair of model {served.name!r}, whatever the text; send "
        '"truncate": true to cut the pair to 12'
    )


def test_a_too_long_pair_names_the_pair_when_the_query_fits(reranker):
    served = _served(reranker, limit=12)
    long = "w1 w2 w3 w4 w5 w6 w8 w9 w10 w11"
    # [CLS], the prompt's 3 words, the query's one, [SEP], the text's 10, [SEP].
    refused = _refusal(lambda: served.prepare_pairs("w1", ["w2", long], activation="identity"))
    assert refused.param == "texts"
    assert refused.message.startswith(
        "the pair (query, texts[1]) has 17 tokens, over the limit of 12 tokens per (query, text) "
        "pair of model"
    )


def test_tokenize_refuses_a_prompt_name_for_a_reranker(reranker):
    served = _served(reranker)
    with pytest.raises(ApiError) as refused:
        served.tokenize(["w1"], add_special_tokens=True, prompt_name="q")
    assert refused.value.status == 422 and refused.value.param == "prompt_name"
    assert refused.value.message == (
        f"prompt_name must be left out for model {served.name!r}, a rerank model: it names an "
        "embedding model's prompt, got 'q'"
    )
    assert served.tokenize(["w1"], add_special_tokens=True, prompt_name=None).startswith(b"[[")


def test_a_limit_below_the_special_tokens_is_refused(prompted, reranker):
    """Below the template's special tokens the tokenizers library truncates nothing: every
    input would run whole under a limit the server reports in /info."""
    with pytest.raises(ValueError, match="max_input_tokens must be at least 2, .* text, got 1"):
        _served(prompted, 1)
    with pytest.raises(ValueError, match="max_input_tokens must be at least 3, .* pair, got 2"):
        _served(reranker, 2)
    served = _served(reranker, 3)
    prepared = served.prepare_pairs(
        "dog", ["cat dog"], activation=served.model.activation, truncate=True
    )
    assert [len(e.ids) for e in prepared.encodings] == [3]  # the special tokens alone: it holds
