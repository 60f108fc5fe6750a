"""Qwen3 as clearformer loads it: Qwen3-Embedding (Qwen3Model, causal, last-token pooling,
prompts), Qwen3-Reranker as a causal LM scored by logit('yes') - logit('no') with its chat
template, and Qwen3ForSequenceClassification; against transformers and sentence-transformers on
small random checkpoints, every backend, left and right padding."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_hypothesis

from clearformer import CrossEncoder, EncoderModel, TextEncoder
from clearformer.interop.hf import CheckpointError, load_model, save_model

from .family_helpers import (
    BACKENDS,
    TEXTS,
    WORDS,
    assert_batch_invariant,
    perturb,
    sentence_dir,
    set_padding_side,
    st_encode,
    word_tokenizer,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

QUERY_PROMPT = "Instruct: Given a query, retrieve relevant passages\nQuery:"
# Qwen3-Reranker's template as its sentence-transformers files lay a pair out (flat messages).
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: {{ messages | selectattr('role', 'eq', 'system') | "
    "map(attribute='content') | first | default('Given a web search query, retrieve relevant "
    "passages that answer the query') }}\n<Query>: {{ messages | selectattr('role', 'eq', "
    "'query') | map(attribute='content') | first }}\n<Document>: {{ messages | "
    "selectattr('role', 'eq', 'document') | map(attribute='content') | first }}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
PAIRS = [
    ("what is the cat", "the cat sat on the mat"),
    ("hello", "world"),
    ("quick brown fox", "the lazy dog ran far far away " * 3),
    ("one two", ""),
]


def qwen3_config(**overrides):
    fields = dict(
        vocab_size=48,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,  # not 64 / 4: the attention is wider than the model, as in Qwen3-0.6B
        max_position_embeddings=128,
        pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )
    return transformers.Qwen3Config(**{**fields, **overrides})


def write(path, cls=None, side="right", chat_template=None, words=WORDS, **overrides):
    torch.manual_seed(0)
    model = (cls or transformers.Qwen3Model)(qwen3_config(**overrides)).eval()
    perturb(model, seed=11)
    model.save_pretrained(path)
    # A reranker's template alone is some 50 tokens: room for the pairs up to the positions.
    extra = {} if chat_template is None else {"chat_template": chat_template}
    extra["model_max_length"] = 64 if chat_template is None else 128
    word_tokenizer(path, padding_side=side, extra=extra, words=words)
    return model


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"kv{n}")
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"qwen3-kv{request.param}")
    return path, write(path, num_key_value_heads=request.param)


def tokenized(encoder, texts, side):
    encoder.tokenizer.padding_side = side
    try:
        return encoder.tokenize(texts)
    finally:
        encoder.tokenizer.padding_side = "right"


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_layer_matches_transformers(checkpoint, backend, side):
    path, hf = checkpoint
    encoder = TextEncoder.from_pretrained(path, backend=backend)
    config = encoder.config
    assert config.causal and config.qk_norm and config.head_width == 24
    assert config.kv_heads == hf.config.num_key_value_heads
    batch = tokenized(encoder, TEXTS, side)
    ids, mask = batch.input_ids, batch.attention_mask
    assert not mask.all() and (mask[:, -1] if side == "left" else mask[:, 0]).any()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)
        got = encoder.model(ids, mask, output_hidden_states=True)
    assert len(got.hidden_states) == len(want.hidden_states) == config.n_layers + 1
    for layer in range(config.n_layers):  # the last entry: after transformers' final norm
        torch.testing.assert_close(
            got.hidden_states[layer][mask], want.hidden_states[layer][mask], atol=1e-5, rtol=0
        )
    torch.testing.assert_close(
        got.last_hidden_state[mask], want.last_hidden_state[mask], atol=1e-5, rtol=0
    )
    assert (got.last_hidden_state[~mask] == 0).all()


def test_run_bidirectionally_it_no_longer_matches(checkpoint):
    """Negative control: the same weights without the causal mask are another model."""
    path, hf = checkpoint
    loaded = load_model(path)
    bidirectional = EncoderModel(dataclasses.replace(loaded.model.config, causal=False)).eval()
    bidirectional.load_state_dict(loaded.model.state_dict())
    encoder = TextEncoder.from_pretrained(path)
    batch = encoder.tokenize(TEXTS)
    mask = batch.attention_mask
    with torch.no_grad():
        want = hf(input_ids=batch.input_ids, attention_mask=mask.long()).last_hidden_state
        causal = loaded.model(batch.input_ids, mask)
        both_ways = bidirectional(batch.input_ids, mask)
    torch.testing.assert_close(causal[mask], want[mask], atol=1e-5, rtol=0)
    assert (both_ways[mask] - want[mask]).abs().max() > 1e-2


@pytest.fixture(scope="module")
def embedding_dirs(tmp_path_factory):
    """Qwen3-Embedding's sentence-transformers stack: last-token pooling, Normalize, the
    query prompt; one directory per padding side."""
    out = {}
    for side in ("right", "left"):
        base = tmp_path_factory.mktemp(f"qwen3-base-{side}")
        write(base, side=side)
        out[side] = sentence_dir(
            base,
            tmp_path_factory.mktemp(f"qwen3-st-{side}"),
            pooling="lasttoken",
            normalize=True,
            prompts={"query": QUERY_PROMPT, "document": ""},
        )
    return out


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_embeddings_equal_sentence_transformers(embedding_dirs, backend, side):
    path = embedding_dirs[side]
    ours = TextEncoder.from_pretrained(path, backend=backend)
    assert ours.tokenizer.padding_side == side and ours.pooling == "lasttoken"
    np.testing.assert_allclose(ours.encode(TEXTS), st_encode(path, TEXTS), atol=1e-5, rtol=0)
    got = ours.encode(TEXTS, prompt_name="query")
    np.testing.assert_allclose(got, st_encode(path, TEXTS, prompt_name="query"), atol=1e-5)
    assert np.abs(got - ours.encode(TEXTS)).max() > 1e-3  # the prompt changed something
    cut = ours.encode(TEXTS, dimensions=16)
    want = st_encode(path, TEXTS, truncate_dim=16, normalize_embeddings=True)
    np.testing.assert_allclose(cut, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_text_alone_equals_it_in_the_batch(embedding_dirs, backend, side):
    ours = TextEncoder.from_pretrained(embedding_dirs[side], backend=backend)
    assert_batch_invariant(ours, TEXTS)
    assert_batch_invariant(ours, TEXTS, prompt_name="query")


def test_pooling_the_last_column_fails_on_right_padding(embedding_dirs, monkeypatch):
    """Negative control: a last-token pooling that reads position -1 gives pads' states on
    right-padded rows, and the comparison with sentence-transformers fails."""
    import clearformer.heads.sentence as sentence

    want = st_encode(embedding_dirs["right"], TEXTS)
    real = sentence.pool

    def last_column(hidden, mask, mode, skip=0):
        return hidden[:, -1] if mode == "lasttoken" else real(hidden, mask, mode, skip=skip)

    monkeypatch.setattr(sentence, "pool", last_column)
    ours = TextEncoder.from_pretrained(embedding_dirs["right"])
    assert np.abs(ours.encode(TEXTS) - want).max() > 1e-2
    left = TextEncoder.from_pretrained(embedding_dirs["left"])  # the last column is real there
    np.testing.assert_allclose(
        left.encode(TEXTS), st_encode(embedding_dirs["left"], TEXTS), atol=1e-5
    )


def test_round_trip_through_transformers(checkpoint, tmp_path):
    path, hf = checkpoint
    loaded = load_model(path)
    out = save_model(loaded.model, tmp_path / "saved", "qwen3", base_config=loaded.hf_config)
    back = transformers.AutoModel.from_pretrained(out).eval()
    assert (
        type(back) is type(hf) and back.config.num_key_value_heads == hf.config.num_key_value_heads
    )
    ids = torch.randint(6, 44, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        theirs = back(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    torch.testing.assert_close(theirs[mask], want[mask], atol=1e-6, rtol=0)
    (out / "tokenizer.json").write_bytes((path / "tokenizer.json").read_bytes())
    again = load_model(out)
    assert again.model.config == loaded.model.config
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids, mask)[mask], want[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_sliding_window": True}, "'use_sliding_window' must be false"),
        ({"layer_types": ["sliding_attention"] * 3}, "'layer_types' must list only"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "'rope_type'.*'yarn'"),
        ({"hidden_act": "gelu"}, "'hidden_act' must be 'silu'"),
        ({"num_key_value_heads": 3}, "'num_key_value_heads'=3 must divide"),
    ],
)
def test_unsupported_configs_name_the_field(tmp_path, change, message):
    write(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message) as info:
        TextEncoder.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)


# -- the reranker ------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["template", "pair", "tied"])
def reranker(request, tmp_path_factory):
    """Qwen3ForCausalLM with a yes/no vocabulary: with its chat template, without one (the
    tokenizer's pair template), and with the head tied to the embeddings."""
    path = tmp_path_factory.mktemp(f"qwen3-reranker-{request.param}")
    template = None if request.param == "pair" else RERANK_TEMPLATE
    tied = request.param == "tied"
    write(
        path,
        transformers.Qwen3ForCausalLM,
        side="left",
        chat_template=template,
        tie_word_embeddings=tied,
    )
    if request.param == "pair":
        word_tokenizer(
            path, template="$A <eos>", pair="$A <eos> $B:1 <eos>:1", extra={"model_max_length": 128}
        )
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_reranker_scores_equal_sentence_transformers(reranker, backend):
    ours = CrossEncoder.from_pretrained(reranker, backend=backend)
    assert ours.num_labels == 1 and ours.activation == "sigmoid"
    reference = st.CrossEncoder(str(reranker), device="cpu")
    want = reference.predict(PAIRS)
    np.testing.assert_allclose(ours.predict(PAIRS), want, atol=1e-5, rtol=0)
    prompt = "Given a question, find the answer"
    got = ours.predict(PAIRS, prompt=prompt, activation="identity")
    want = reference.predict(PAIRS, prompt=prompt, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    ranked = ours.rank(PAIRS[0][0], [d for _, d in PAIRS])
    assert sorted(i for i, _ in ranked) == list(range(len(PAIRS)))


def test_reranker_truncation_keeps_the_template_tail(reranker):
    long = [("the cat", "the dog ran far away " * 40), *PAIRS]  # past the 128-token limit
    assert len(CrossEncoder.from_pretrained(reranker).tokenizer.encode_pairs(long)[0].ids) == 128
    ours = CrossEncoder.from_pretrained(reranker)
    reference = st.CrossEncoder(str(reranker), device="cpu")
    np.testing.assert_allclose(ours.predict(long), reference.predict(long), atol=1e-5, rtol=0)


def test_reranker_score_is_yes_minus_no_at_the_last_real_token(tmp_path):
    hf = write(tmp_path, transformers.Qwen3ForCausalLM, side="left", chat_template=RERANK_TEMPLATE)
    ours = CrossEncoder.from_pretrained(tmp_path)
    encodings = ours.tokenizer.encode_pairs(PAIRS)
    batch = ours.tokenizer.pad(encodings, with_tokens=False)
    yes, no = (
        ours.tokenizer.tokenizer.token_to_id("yes"),
        ours.tokenizer.tokenizer.token_to_id("no"),
    )
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    want = (logits[:, -1, yes] - logits[:, -1, no]).numpy()  # left padded: -1 is real
    np.testing.assert_allclose(ours.predict(PAIRS, activation="identity"), want, atol=1e-5)


def test_reranker_without_yes_and_no_tokens_is_refused(tmp_path):
    words = [w for w in WORDS if w not in ("yes", "no")]
    write(tmp_path, transformers.Qwen3ForCausalLM, chat_template=RERANK_TEMPLATE, words=words)
    with pytest.raises(CheckpointError, match=r"tokenizer.json has no token 'yes' or 'no'"):
        CrossEncoder.from_pretrained(tmp_path)
    done = _cli("rerank", "hello", "--corpus", str(_corpus(tmp_path)), "--model", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "has no token 'yes' or 'no'" in done.stderr and len(done.stderr.splitlines()) == 1


def test_reranker_template_without_the_pair_roles_is_refused(tmp_path):
    generic = "{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_end|>{% endfor %}"
    write(tmp_path, transformers.Qwen3ForCausalLM, chat_template=generic)
    with pytest.raises(CheckpointError, match="does not lay out the 'query' and 'document'"):
        CrossEncoder.from_pretrained(tmp_path)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "clearformer", *args], capture_output=True, text=True, timeout=300
    )


def _corpus(path):
    corpus = path / "corpus.txt"
    corpus.write_text("\n".join(d for _, d in PAIRS if d) + "\n")
    return corpus


def test_cli_rerank_with_an_llm_reranker(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    write(model, transformers.Qwen3ForCausalLM, side="left", chat_template=RERANK_TEMPLATE)
    done = _cli(
        "rerank",
        "what is the cat",
        "--corpus",
        str(_corpus(tmp_path)),
        "--model",
        str(model),
        "--json",
        "-k",
        "3",
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    documents = [d for _, d in PAIRS if d]
    want = st.CrossEncoder(str(model), device="cpu").predict(
        [("what is the cat", d) for d in documents]
    )
    assert [r["line"] - 1 for r in rows] == list(np.argsort(-want, kind="stable")[:3])
    np.testing.assert_allclose([r["score"] for r in rows], np.sort(want)[::-1][:3], atol=1e-5)


# -- sequence classification ------------------------------------------------------------------
@pytest.mark.parametrize("side", ["right", "left"])
def test_sequence_classification_equals_sentence_transformers(tmp_path, side):
    hf = write(tmp_path, transformers.Qwen3ForSequenceClassification, side=side, num_labels=1)
    word_tokenizer(tmp_path, template="$A <eos>", pair="$A <eos> $B:1 <eos>:1", padding_side=side)
    ours = CrossEncoder.from_pretrained(tmp_path)
    assert ours.head.config.pooling == "lasttoken" and ours.head.dense is None
    want = st.CrossEncoder(str(tmp_path), device="cpu").predict(PAIRS)
    np.testing.assert_allclose(ours.predict(PAIRS), want, atol=1e-5, rtol=0)
    batch = ours.tokenizer.pad(ours.tokenizer.encode_pairs(PAIRS), with_tokens=False)
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    np.testing.assert_allclose(ours.predict(PAIRS, activation="identity"), logits[:, 0], atol=1e-5)
    set_padding_side(tmp_path, side)


def test_serve_refuses_a_chat_template_reranker(tmp_path):
    from clearformer.serve.models import ServedModel

    write(tmp_path, transformers.Qwen3ForCausalLM, side="left", chat_template=RERANK_TEMPLATE)
    model = CrossEncoder.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="LLM reranker laid out by a chat template"):
        ServedModel("r", model, "rerank", max_input_tokens=64)


@pytest.fixture(scope="module")
def left_encoder(embedding_dirs):
    return TextEncoder.from_pretrained(embedding_dirs["left"], backend="auto")


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st_hypothesis.lists(
        st_hypothesis.lists(st_hypothesis.sampled_from(WORDS), max_size=30).map(" ".join),
        min_size=1,
        max_size=6,
    )
)
def test_any_text_alone_equals_it_in_any_ragged_batch(left_encoder, texts):
    """Causal, left-padded, packed or padded as the plan chooses: a text's embedding does not
    depend on its batch-mates (Hypothesis draws the batches)."""
    assert_batch_invariant(left_encoder, texts)
