"""``CrossEncoder.predict`` against ``sentence_transformers.CrossEncoder.predict`` on small
random BERT cross-encoders (one label: sigmoid scores; three: raw logits, or softmax)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from clearformer import CrossEncoder, TextEncoder
from clearformer.interop.hf import CheckpointError

from .helpers import intra_op_threads, record_packings
from .test_sequence_classification import make_classifier
from .xlmr_helpers import make_xlmr

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

PAIRS = [
    ("w1 w2 w3", "w4 w5"),
    ("w7", ""),
    ("", "w8 w9 w10"),
    ("W11 w12 unknown", "w13 w14 w15 w16 w17 w18 w19 w20"),
    ("w1 " * 20, "w2 w3 " * 20),  # longer than max_length: truncated, the longer side first
    ("w5 w6", "w5 w6"),
]


@pytest.fixture(scope="module", params=[1, 3], ids=["1-label", "3-labels"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"ce{request.param}")
    make_classifier("bert", path, num_labels=request.param)
    # Both sides truncate at 32 pieces (the pair template counts in).
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    return path, request.param


def test_predict_equals_sentence_transformers(checkpoint):
    path, labels = checkpoint
    reference = st.CrossEncoder(str(path), device="cpu")
    ours = CrossEncoder.from_pretrained(path)
    assert ours.num_labels == labels and ours.max_length == 32
    assert ours.activation == ("sigmoid" if labels == 1 else "identity")
    want = reference.predict(PAIRS, batch_size=2)
    got = ours.predict(PAIRS, max_tokens=64)  # other batches than the reference's
    assert got.shape == want.shape == ((len(PAIRS),) if labels == 1 else (len(PAIRS), labels))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    if labels > 1:
        soft = ours.predict(PAIRS, apply_softmax=True)
        np.testing.assert_allclose(
            soft, reference.predict(PAIRS, apply_softmax=True), atol=1e-5, rtol=0
        )
        np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-6)
    else:
        # Negative control: without the sigmoid the scores are the logits, not the reference.
        assert np.abs(ours.predict(PAIRS, activation="identity") - want).max() > 1e-3


def test_predict_reads_reordered_weights_and_scores_the_same(checkpoint, monkeypatch):
    import clearformer.fast.reordered_weights as reordered_weights_module

    path, _ = checkpoint
    ours = CrossEncoder.from_pretrained(path)
    made = record_packings(monkeypatch, reordered_weights_module)
    assert ours.predict(PAIRS[:2]) is not None and made == []  # too few tokens to repay it
    monkeypatch.setattr(reordered_weights_module, "REORDER_MIN_TOKENS", 1)
    packed = ours.predict(PAIRS, max_tokens=64)  # several batches
    assert len(made) == 1 and len(made[0]) > 0
    ours.predict(PAIRS[:1])
    assert len(made) == 1  # kept for later calls
    ours.drop_reordered_weights()
    monkeypatch.setattr(reordered_weights_module, "REORDER_MIN_TOKENS", 10**12)
    plain = ours.predict(PAIRS, max_tokens=64)
    assert len(made) == 1
    np.testing.assert_array_equal(packed, plain)


def test_loaded_in_bf16_holds_the_bf16_copy_alone(checkpoint):
    """``precision="bf16"`` at load: the scores of ``predict(precision="bf16")`` of a float32
    cross-encoder, bit for bit; its model and head in bfloat16; float32 calls refused."""
    import torch

    path, _ = checkpoint
    held = CrossEncoder.from_pretrained(path, precision="bf16")
    linear = {m.weight.dtype for m in held.model.modules() if isinstance(m, torch.nn.Linear)}
    assert linear == {torch.bfloat16}
    assert held.bf16_model() == (held.model, held.head)
    want = CrossEncoder.from_pretrained(path).predict(PAIRS, precision="bf16")
    assert np.array_equal(held.predict(PAIRS), want)
    assert np.array_equal(held.predict(PAIRS, precision="auto"), want)
    with pytest.raises(ValueError, match=r"loaded with precision='bf16' .* got 'float32'"):
        held.predict(PAIRS, precision="float32")
    with pytest.raises(ValueError, match="precision"):
        CrossEncoder.from_pretrained(path, precision="int8")


def test_token_types_mark_the_second_text(checkpoint):
    path, _ = checkpoint
    ours = CrossEncoder.from_pretrained(path)
    (encoding,) = ours.tokenizer.encode_pairs([("w1 w2", "w3")])
    assert encoding.type_ids == [0, 0, 0, 0, 1, 1]  # [CLS] w1 w2 [SEP] w3 [SEP]


def test_rank_orders_documents_by_score(tmp_path):
    make_classifier("bert", tmp_path, num_labels=1)
    ours = CrossEncoder.from_pretrained(tmp_path)
    documents = [b for _, b in PAIRS]
    ranked = ours.rank("w1 w2", documents, top_k=3)
    scores = ours.predict([("w1 w2", d) for d in documents])
    assert [i for i, _ in ranked] == list(np.argsort(-scores, kind="stable")[:3])
    assert [s for _, s in ranked] == sorted((float(s) for s in scores), reverse=True)[:3]


def test_xlm_roberta_cross_encoder_passes_no_token_types(tmp_path):
    make_xlmr(tmp_path, head="classification", num_labels=1)
    reference = st.CrossEncoder(str(tmp_path), device="cpu")
    pairs = [("Café déjà vu", "東京は日本の首都です"), ("emoji 🙂", ""), ("hello", "world")]
    got = CrossEncoder.from_pretrained(tmp_path).predict(pairs)
    np.testing.assert_allclose(got, reference.predict(pairs), atol=1e-5, rtol=0)


def test_predict_runs_two_workers_on_balanced_batches_and_scores_the_same(checkpoint, monkeypatch):
    import clearformer.text.cross_encoder as module

    path, _ = checkpoint
    ours = CrossEncoder.from_pretrained(path)
    pairs = PAIRS * 5  # 30 pairs of mixed lengths
    one = ours.predict(pairs, max_tokens=64, workers=1)
    calls = []
    real = module.map_in_workers

    def spy(fn, batches, workers):
        calls.append((len(batches), workers))
        return real(fn, batches, workers)

    monkeypatch.setattr(module, "map_in_workers", spy)
    monkeypatch.setattr(module.torch, "get_num_threads", lambda: 2)  # as on a two-core CPU
    # workers=None: two; the budget's three batches are cut again into four, two per worker.
    two = ours.predict(pairs, max_tokens=256)
    ((batches, workers),) = calls
    assert (batches, workers) == (4, 2)
    np.testing.assert_allclose(two, one, atol=1e-6, rtol=0)
    named = ours.predict(pairs, batch_size=7, workers=2)  # a named batch size is kept
    assert calls[-1] == (5, 2)
    np.testing.assert_allclose(named, one, atol=1e-6, rtol=0)


def test_predict_refuses_a_bad_worker_count(checkpoint):
    from clearformer.tracing import recording

    ours = CrossEncoder.from_pretrained(checkpoint[0])
    steps = []

    class Steps:
        def on_step(self, name, value, meta, file, line):
            steps.append(name)

    with recording(Steps()), pytest.raises(ValueError, match="workers must be 1 while a trace"):
        ours.predict(PAIRS, workers=2)
    assert steps == []  # refused before any forward pass
    with pytest.raises(ValueError, match="workers must be a positive int, got 0"):
        ours.predict(PAIRS, workers=0)
    with pytest.raises(TypeError, match="workers must be a positive int, got '2'"):
        ours.predict(PAIRS, workers="2")


def test_empty_input_and_bad_pairs(checkpoint):
    path, labels = checkpoint
    ours = CrossEncoder.from_pretrained(path)
    assert ours.predict([]).shape == ((0,) if labels == 1 else (0, labels))
    with pytest.raises(TypeError, match="single pair"):
        ours.predict(("a", "b"))
    with pytest.raises(TypeError, match=r"pairs\[1\] must be a \(text, text\) pair"):
        ours.predict([("a", "b"), "c"])
    with pytest.raises(TypeError, match=r"pairs\[0\]\[1\] must be a str"):
        ours.predict([("a", 3)])
    with pytest.raises(ValueError, match="activation must be one of"):
        ours.predict([("a", "b")], activation="softmax")


def test_a_cross_encoder_does_not_embed_and_an_embedder_does_not_rerank(tmp_path):
    (tmp_path / "ce").mkdir()
    make_classifier("bert", tmp_path / "ce", num_labels=1)
    with pytest.raises(TypeError, match="does not embed texts.*TextEncoder"):
        CrossEncoder.from_pretrained(tmp_path / "ce").encode(["a"])
    from .test_pretrained_checkpoints import make_checkpoint

    (tmp_path / "embed").mkdir()
    make_checkpoint("bert", tmp_path / "embed")
    with pytest.raises(TypeError, match="no classification head.*CrossEncoder"):
        TextEncoder.from_pretrained(tmp_path / "embed").predict([("a", "b")])
    with pytest.raises(CheckpointError, match="has no sequence-classification head"):
        CrossEncoder.from_pretrained(tmp_path / "embed")


def test_a_directory_saved_by_sentence_transformers_keeps_its_activation(tmp_path):
    import torch

    (tmp_path / "src").mkdir()
    make_classifier("bert", tmp_path / "src", num_labels=1)
    reference = st.CrossEncoder(str(tmp_path / "src"), activation_fn=torch.nn.Identity())
    reference.save(str(tmp_path / "saved"))  # activation_fn in config_sentence_transformers.json
    ours = CrossEncoder.from_pretrained(tmp_path / "saved")
    assert ours.activation == "identity"
    again = st.CrossEncoder(str(tmp_path / "saved"), device="cpu")
    np.testing.assert_allclose(ours.predict(PAIRS), again.predict(PAIRS), atol=1e-5, rtol=0)


def test_an_unknown_activation_names_the_file_and_field(tmp_path):
    make_classifier("bert", tmp_path, num_labels=1)
    (tmp_path / "config_sentence_transformers.json").write_text(
        json.dumps({"activation_fn": "my.module.Swish"})
    )
    with pytest.raises(CheckpointError, match="config_sentence_transformers.json 'activation_fn'"):
        CrossEncoder.from_pretrained(tmp_path)


def test_a_score_does_not_depend_on_its_batch_mates(checkpoint):
    path, _ = checkpoint
    ours = CrossEncoder.from_pretrained(path)
    # Two pairs one piece apart: about 1 % padding, under the share at which `auto` alone
    # would run the batch padded; packed, each pair's token states are its own to the bit.
    short = ("w1 w2 w3 w4 w5 w6", "w7 w8 w9 w10 w11")
    long_ = ("w1 w2 w3 w4 w5 w6", "w7 w8 w9 w10 w11 w12")
    encodings = ours.tokenizer.encode_pairs([long_, short])
    assert len(encodings[0].ids) == len(encodings[1].ids) + 1
    # On one thread: PyTorch's attention kernel splits its work by the thread count, and for
    # heads as narrow as these a text alone on two threads may round otherwise than one of
    # two texts given a thread each (docs/serving.md). Then the head's products are what
    # could tell the rows apart: on CPUs whose kernels round a one-row product otherwise than
    # a two-row one (AMD Zen 4 does, 1e-7), whole-batch products in the head fail this test.
    with intra_op_threads(1):
        together = ours.score_batch(encodings)
        for i, encoding in enumerate(encodings):
            np.testing.assert_array_equal(ours.score_batch([encoding])[0], together[i])
            alone = ours.predict([(long_, short)[i]], batch_size=1)
            np.testing.assert_array_equal(alone.reshape(together[i].shape), together[i])
