"""``MultiVectorEncoder`` against sentence-transformers 6's ``MultiVectorEncoder`` on
directories it wrote itself, and against PyLate's encoding written out on transformers'
BertModel (and sentence-transformers' loading of the same PyLate directory): token vectors and
MaxSim scores within 1e-5, with ragged batches (padding that matters), query expansion
attended and not, the document skiplist, and negative controls."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from clearformer import MultiVectorEncoder, TextEncoder
from clearformer.interop.hf import CheckpointError
from clearformer.retrieval.maxsim import maxsim_scores

from .multivector_helpers import (
    DOCUMENT_LENGTH,
    QUERY_LENGTH,
    TEXTS,
    bert_base,
    pylate_dir,
    pylate_reference,
    st_multivector_dir,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

QUERIES = ["the cat", "quick brown fox jumps over the lazy dog and far away", "hello?"]
EXPANSIONS = {
    "fixed-masked": {"strategy": "fixed", "length": QUERY_LENGTH, "attend": False},
    "min-attended": {"strategy": "min", "length": 8, "attend": True},
    "none": None,
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    bert_base(path)
    return path


@pytest.fixture(scope="module")
def st_dirs(base, tmp_path_factory):
    prompts = {"query": "[Q] ", "document": "[D] "}
    return {
        name: st_multivector_dir(
            base, tmp_path_factory.mktemp(name), expansion=expansion, prompts=prompts
        )
        for name, expansion in EXPANSIONS.items()
    }


@pytest.fixture(scope="module")
def pylate_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pylate")
    return {a: pylate_dir(root / f"attend-{a}", attend=a) for a in (False, True)}


def _assert_same(ours, theirs, atol=1e-5):
    assert [tuple(v.shape) for v in ours] == [tuple(v.shape) for v in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b.float(), atol=atol, rtol=0)


@pytest.mark.parametrize("name", list(EXPANSIONS))
def test_token_vectors_and_scores_equal_sentence_transformers(st_dirs, name):
    path = st_dirs[name]
    ours = MultiVectorEncoder.from_pretrained(path)
    ref = st.MultiVectorEncoder(str(path), device="cpu")
    queries, documents = ours.encode_query(QUERIES), ours.encode_document(TEXTS)
    want_q, want_d = ref.encode_query(QUERIES), ref.encode_document(TEXTS)
    _assert_same(queries, want_q)
    _assert_same(documents, want_d)
    scores = ours.similarity(queries, documents)
    assert scores.shape == (len(QUERIES), len(TEXTS))
    torch.testing.assert_close(scores, ref.similarity(want_q, want_d).float(), atol=1e-5, rtol=0)
    if EXPANSIONS[name] is not None:  # every query is the expansion's length or longer
        assert all(q.shape[0] >= EXPANSIONS[name]["length"] for q in queries)
    # The skiplist dropped the punctuation of "the cat, sat on the mat!": [CLS] + prompt
    # pieces + 6 words + [SEP], without "," and "!" (nor the prompt's "[" and "]").
    assert documents[0].shape[0] < len(ours.tokenizer_for("document").encode([TEXTS[0]])[0].ids)


def test_negative_controls_differ(st_dirs):
    """Queries as documents, expansion attended instead of not, and no projection each give
    other vectors: the comparisons above can fail."""
    path = st_dirs["fixed-masked"]
    ours = MultiVectorEncoder.from_pretrained(path)
    ref = st.MultiVectorEncoder(str(path), device="cpu")
    want = ref.encode_query(QUERIES)
    assert _differ(ours.encode_document(QUERIES), want)
    assert _differ(
        MultiVectorEncoder.from_pretrained(st_dirs["min-attended"]).encode_query(QUERIES), want
    )
    unprojected = MultiVectorEncoder.from_pretrained(st_dirs["fixed-masked"])
    unprojected.projection[0].linear.weight.data.mul_(-1.0)
    assert _differ(unprojected.encode_query(QUERIES), want)
    # The short queries are expanded, and their [MASK] tokens are not attended; the long one
    # fills the expansion's length (cut to it) and has none.
    rows = ours.token_rows("query", QUERIES)
    assert [r.extra > 0 for r in rows] == [True, False, True]
    assert not any(r.extra_attended for r in rows) and all(len(r) == QUERY_LENGTH for r in rows)


def _differ(ours, theirs) -> bool:
    pairs = zip(ours, theirs, strict=True)
    return any(a.shape != b.shape or float((a - b).abs().max()) > 1e-3 for a, b in pairs)


def test_each_text_alone_equals_it_in_the_batch(st_dirs):
    for name in ("fixed-masked", "none"):
        ours = MultiVectorEncoder.from_pretrained(st_dirs[name])
        for side in ("query", "document"):
            encode = getattr(ours, f"encode_{side}")
            together = encode(TEXTS)
            for text, row in zip(TEXTS, together, strict=True):
                (alone,) = encode([text])
                torch.testing.assert_close(alone, row, atol=1e-6, rtol=0)
            # batch_size=1 runs one text per forward pass: the same vectors.
            for a, b in zip(encode(TEXTS, batch_size=1), together, strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_left_padding_in_the_tokenizer_changes_nothing(st_dirs, tmp_path):
    path = tmp_path / "left"
    shutil.copytree(st_dirs["none"], path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["padding_side"] = "left"
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    left = MultiVectorEncoder.from_pretrained(path)
    right = MultiVectorEncoder.from_pretrained(st_dirs["none"])
    _assert_same(left.encode_document(TEXTS), right.encode_document(TEXTS), atol=1e-6)
    _assert_same(left.encode_query(TEXTS), right.encode_query(TEXTS), atol=1e-6)


@pytest.mark.parametrize("attend", [False, True])
def test_pylate_directory_equals_pylate_formulas_and_sentence_transformers(pylate_dirs, attend):
    path = pylate_dirs[attend]
    ours = MultiVectorEncoder.from_pretrained(path)
    assert ours.config.layout == "pylate"
    assert ours.config.query.marker_id is not None and ours.config.document.marker_id is not None
    assert ours.config.query.expansion.attend is attend
    queries, documents = ours.encode_query(QUERIES), ours.encode_document(TEXTS)
    _assert_same(queries, pylate_reference(path, QUERIES, query=True))
    _assert_same(documents, pylate_reference(path, TEXTS, query=False))
    assert all(q.shape[0] == QUERY_LENGTH for q in queries)
    assert max(d.shape[0] for d in documents) <= DOCUMENT_LENGTH
    # sentence-transformers reads PyLate's layout too (its legacy path): the same vectors.
    ref = st.MultiVectorEncoder(str(path), device="cpu")
    _assert_same(queries, ref.encode_query(QUERIES))
    _assert_same(documents, ref.encode_document(TEXTS))
    for a in queries:  # rows are unit vectors
        torch.testing.assert_close(a.norm(dim=-1), torch.ones(a.shape[0]), atol=1e-5, rtol=0)


def test_pylate_without_expansion_keeps_only_real_query_tokens(tmp_path):
    path = pylate_dir(tmp_path / "plain", expansion=False)
    ours = MultiVectorEncoder.from_pretrained(path)
    queries = ours.encode_query(QUERIES)
    _assert_same(queries, pylate_reference(path, QUERIES, query=True))
    assert queries[0].shape[0] < QUERY_LENGTH  # [CLS] [Q] the cat [SEP]


def test_similarity_is_maxsim(st_dirs):
    ours = MultiVectorEncoder.from_pretrained(st_dirs["none"])
    q, d = ours.encode_query(QUERIES), ours.encode_document(TEXTS)
    torch.testing.assert_close(ours.similarity(q, d), maxsim_scores(q, d))
    by_hand = (q[0] @ d[0].T).max(dim=1).values.sum()
    torch.testing.assert_close(ours.similarity(q, d)[0, 0], by_hand)


def test_identity_names_the_head_and_hashes_the_projection(st_dirs, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(st_dirs["none"], path)
    identity = MultiVectorEncoder.from_pretrained(path).identity
    assert (identity.pooling, identity.width, identity.normalize) == ("colbert", 16, True)
    assert identity.max_length == DOCUMENT_LENGTH
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "1_Dense" / "model.safetensors")
    save_file({k: v + 0.01 for k, v in weights.items()}, path / "1_Dense" / "model.safetensors")
    changed = MultiVectorEncoder.from_pretrained(path).identity
    assert changed.revision != identity.revision


def test_the_wrong_class_for_a_directory_is_one_line_naming_kind_and_class(st_dirs, base):
    path = st_dirs["none"]
    with pytest.raises(CheckpointError) as caught:
        TextEncoder.from_pretrained(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message and "multivector" in message and "MultiVectorEncoder" in message
    with pytest.raises(CheckpointError) as caught:
        MultiVectorEncoder.from_pretrained(base)  # a plain BERT: a dense model
    message = str(caught.value)
    assert "\n" not in message and str(base) in message and "TextEncoder" in message


def test_bad_arguments_are_refused_before_work(st_dirs):
    ours = MultiVectorEncoder.from_pretrained(st_dirs["none"])
    with pytest.raises(TypeError, match="texts"):
        ours.encode_document("one text, not a list")
    with pytest.raises(ValueError, match="max_length"):
        MultiVectorEncoder.from_pretrained(st_dirs["none"], max_length=0)
    assert ours.encode_query([]) == []


def test_max_length_cuts_documents(st_dirs):
    ours = MultiVectorEncoder.from_pretrained(st_dirs["none"], max_length=6)
    assert max(d.shape[0] for d in ours.encode_document(TEXTS)) <= 6


@pytest.mark.parametrize(
    "file, change, message",
    [
        ("sentence_bert_config.json", {"query_expansion": {"strategy": "all"}}, "query_expansion"),
        ("sentence_bert_config.json", {"document_length": 500}, "document_length"),
        ("2_MultiVectorMask/config.json", {"keep_only_token_ids": [5]}, "keep_only_token_ids"),
        ("config_sentence_transformers.json", {"similarity_fn_name": "cosine"}, "similarity"),
    ],
)
def test_bad_configs_name_the_file_and_field(st_dirs, tmp_path, file, change, message):
    path = tmp_path / "bad"
    shutil.copytree(st_dirs["none"], path)
    config = json.loads((path / file).read_text())
    config.update(change)
    (path / file).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as caught:
        MultiVectorEncoder.from_pretrained(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_maxsim_refuses_what_is_not_a_matrix_of_the_same_dtype():
    query, document = torch.ones(2, 4), torch.ones(3, 4)
    with pytest.raises(TypeError, match=r"each document must be a \(tokens, dim\) tensor, got"):
        maxsim_scores([query], [[1.0, 2.0]])
    with pytest.raises(TypeError, match="dtypes differ: torch.float32 vs torch.bfloat16"):
        maxsim_scores([query], [document.bfloat16()])
    assert maxsim_scores([query], [document]).tolist() == [[8.0]]
