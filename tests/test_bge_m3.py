"""``BGEM3Encoder`` against FlagEmbedding's formulas, written out here on transformers'
``XLMRobertaModel`` (a tiny random one and random ``sparse_linear.pt`` / ``colbert_linear.pt``):

* dense: ``normalize(h[:, 0])``;
* sparse: ``relu(sparse_linear(h))`` scattered into a (B, T, vocab) tensor at each token's id,
  the max over T, the cls / eos / pad / unk columns zeroed (``_sparse_embedding``);
* ColBERT: ``colbert_linear(h[:, 1:]) * mask[:, 1:]``, the first (real tokens - 1) rows,
  normalised (``_colbert_embedding`` and ``_process_colbert_vecs``).

The reference runs whole padded batches, padded on the right (FlagEmbedding's) and on the left,
so padding matters; a head file whose pickle would run code is refused."""

from __future__ import annotations

import os
import pickle
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

from clearformer import BGEM3Encoder, MultiVectorEncoder
from clearformer.interop.hf import CheckpointError
from clearformer.text.bge_m3 import BGEM3Output

from .xlmr_helpers import CORPUS, make_bge_m3

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

TEXTS = [*CORPUS, "hello hello hello world, hello", "", "fox fox"]
UNUSED = (0, 2, 1, 3)  # <s>, </s>, <pad>, <unk>: XLM-R's cls, eos, pad, unk


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    """(directory, transformers model, heads): a bge-m3 directory at width 32."""
    path = tmp_path_factory.mktemp("bge-m3")
    model, heads = make_bge_m3(path, seed=11, sparse=(0.3, 0.1), colbert=(0.3, 0.1))
    return path, model, heads


def _flag_embedding(path, model, heads, texts, *, side, max_length, drop_unused=True):
    """FlagEmbedding's three outputs on one padded batch through transformers."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.enable_truncation(max_length)
    encodings = [tok.encode(t).ids for t in texts]
    T = max(len(ids) for ids in encodings)
    ids = torch.full((len(texts), T), 1)  # <pad>
    mask = torch.zeros(len(texts), T, dtype=torch.long)
    for b, row in enumerate(encodings):
        at = slice(T - len(row), T) if side == "left" else slice(0, len(row))
        ids[b, at], mask[b, at] = torch.tensor(row), 1
    with torch.no_grad():
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, D)
    sparse_linear, colbert_linear = heads["sparse_linear"], heads["colbert_linear"]
    dense, colbert = [], []
    weights = torch.relu(h @ sparse_linear["weight"].T + sparse_linear["bias"])  # (B, T, 1)
    table = torch.zeros(len(texts), T, model.config.vocab_size)
    table = torch.scatter(
        table, dim=-1, index=(ids * mask).unsqueeze(-1), src=weights * mask[..., None]
    )
    sparse = table.max(dim=1).values  # (B, vocab)
    if drop_unused:
        sparse[:, list(UNUSED)] = 0.0
    for b in range(len(texts)):
        real = h[b][mask[b].bool()]  # (n, D): the text's tokens, wherever the padding is
        dense.append(F.normalize(real[0], dim=-1))
        vectors = real[1:] @ colbert_linear["weight"].T + colbert_linear["bias"]
        colbert.append(F.normalize(vectors, dim=-1))
    return torch.stack(dense), sparse, colbert


@pytest.mark.parametrize("side", ["right", "left"])
def test_three_outputs_equal_flag_embedding(m3, side):
    path, model, heads = m3
    ours = BGEM3Encoder.from_pretrained(path)
    out = ours.encode(TEXTS)
    assert isinstance(out, BGEM3Output)
    dense, sparse, colbert = _flag_embedding(
        path, model, heads, TEXTS, side=side, max_length=ours.max_length
    )
    assert out.dense.dtype == torch.float32 and out.dense.shape == (len(TEXTS), 32)
    torch.testing.assert_close(out.dense, dense, atol=1e-5, rtol=0)
    assert out.sparse.is_sparse and out.sparse.is_coalesced() and out.sparse.dtype == torch.float32
    assert out.sparse.shape == (len(TEXTS), model.config.vocab_size)
    want = sparse.to_sparse().coalesce()
    assert torch.equal(out.sparse.indices(), want.indices())  # the same non-zero entries
    torch.testing.assert_close(out.sparse.values(), want.values(), atol=1e-5, rtol=0)
    assert bool((out.sparse.values() > 0).all())  # only non-zero weights are stored
    assert [tuple(v.shape) for v in out.colbert] == [tuple(v.shape) for v in colbert]
    for a, b in zip(out.colbert, colbert, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_negative_controls(m3):
    """The comparisons can fail: the heads swapped for others, the unused tokens kept."""
    path, model, heads = m3
    ours = BGEM3Encoder.from_pretrained(path)
    out = ours.encode(TEXTS)
    _, sparse, colbert = _flag_embedding(
        path, model, heads, TEXTS, side="right", max_length=ours.max_length
    )
    other = {k: {n: -t for n, t in v.items()} for k, v in heads.items()}
    _, sparse_other, colbert_other = _flag_embedding(
        path, model, other, TEXTS, side="right", max_length=ours.max_length
    )
    assert not torch.allclose(out.sparse.to_dense(), sparse_other, atol=1e-3)
    assert (out.colbert[0] - colbert_other[0]).abs().max() > 1e-2
    torch.testing.assert_close(out.sparse.to_dense(), sparse, atol=1e-5, rtol=0)


def test_special_tokens_weigh_nothing(m3, tmp_path):
    """With a bias that makes every token's weight positive, <s> and </s> would weigh
    something: FlagEmbedding drops them, and so does this."""
    path, model, heads = m3
    shifted = tmp_path / "shifted"
    shutil.copytree(path, shifted)
    heads = {**heads, "sparse_linear": {**heads["sparse_linear"], "bias": torch.tensor([3.0])}}
    torch.save(heads["sparse_linear"], shifted / "sparse_linear.pt")
    ours = BGEM3Encoder.from_pretrained(shifted)
    got = ours.encode(TEXTS, dense=False, colbert=False).sparse.to_dense()
    want = dict(side="right", max_length=ours.max_length)
    _, sparse, _ = _flag_embedding(path, model, heads, TEXTS, **want)
    _, kept, _ = _flag_embedding(path, model, heads, TEXTS, drop_unused=False, **want)
    torch.testing.assert_close(got, sparse, atol=1e-5, rtol=0)
    assert bool((kept[:, [0, 2]] > 0).all())  # the control: <s> and </s> had weights
    assert bool((got[:, list(UNUSED)] == 0).all())


def test_one_forward_pass_for_the_three_outputs(m3):
    path, _, _ = m3
    ours = BGEM3Encoder.from_pretrained(path)
    calls = []
    handle = ours.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        out = ours.encode(TEXTS, batch_size=len(TEXTS))
    finally:
        handle.remove()
    assert len(calls) == 1
    assert out.dense is not None and out.sparse is not None and out.colbert is not None
    only = ours.encode(TEXTS, dense=False, colbert=False)
    assert only.dense is None and only.colbert is None
    torch.testing.assert_close(only.sparse.to_dense(), out.sparse.to_dense(), atol=1e-6, rtol=0)


def test_each_text_alone_equals_it_in_the_batch(m3):
    path, _, _ = m3
    ours = BGEM3Encoder.from_pretrained(path)
    together = ours.encode(TEXTS)
    for i, text in enumerate(TEXTS):
        alone = ours.encode([text])
        torch.testing.assert_close(alone.dense[0], together.dense[i], atol=1e-6, rtol=0)
        torch.testing.assert_close(
            alone.sparse.to_dense()[0], together.sparse.to_dense()[i], atol=1e-6, rtol=0
        )
        torch.testing.assert_close(alone.colbert[0], together.colbert[i], atol=1e-6, rtol=0)


def test_views_behave_as_their_kinds(m3):
    path, _, _ = m3
    ours = BGEM3Encoder.from_pretrained(path)
    out = ours.encode(TEXTS[:3])
    dense, sparse, multi = ours.as_dense(), ours.as_sparse(), ours.as_multivector()
    assert (dense.kind, sparse.kind, multi.kind, ours.kind) == (
        "dense",
        "sparse",
        "multivector",
        "bge-m3",
    )
    torch.testing.assert_close(dense.encode_query(TEXTS[:3]), out.dense)
    torch.testing.assert_close(sparse.encode_document(TEXTS[:3]).to_dense(), out.sparse.to_dense())
    vectors = multi.encode_document(TEXTS[:3])
    for a, b in zip(vectors, out.colbert, strict=True):
        torch.testing.assert_close(a, b)
    half = ours.encode(TEXTS[:3], precision="bf16")
    torch.testing.assert_close(dense.encode_document(TEXTS[:3], precision="bf16"), half.dense)
    scores = multi.similarity(multi.encode_query(TEXTS[:2]), vectors)
    assert scores.shape == (2, 3)
    identities = [v.identity for v in (dense, sparse, multi)]
    assert [i.pooling for i in identities] == ["cls", "sparse_linear", "colbert"]
    assert [i.width for i in identities] == [32, ours.vocab_size, 32]
    assert len({i.revision for i in identities}) == 1


def test_head_files_are_in_the_revision_and_safetensors_load(m3, tmp_path):
    path, _, heads = m3
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    before = BGEM3Encoder.from_pretrained(copy).identity.revision
    torch.save({k: v + 0.5 for k, v in heads["colbert_linear"].items()}, copy / "colbert_linear.pt")
    assert BGEM3Encoder.from_pretrained(copy).identity.revision != before
    from safetensors.torch import save_file

    side = tmp_path / "safetensors"
    shutil.copytree(path, side)
    for name in ("sparse_linear", "colbert_linear"):
        (side / f"{name}.pt").unlink()
        save_file(heads[name], side / f"{name}.safetensors")
    a = BGEM3Encoder.from_pretrained(path).encode(TEXTS[:2])
    b = BGEM3Encoder.from_pretrained(side).encode(TEXTS[:2])
    torch.testing.assert_close(a.dense, b.dense)
    torch.testing.assert_close(a.colbert[1], b.colbert[1])


class _RunsCode:
    """Unpickled, it would create a file: code run from a checkpoint file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


class _RunsCommand:
    """Unpickled, it would run a shell command that creates a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(
    ("written_by", "code", "named"),
    [("pickle", _RunsCode, "open"), ("torch.save", _RunsCode, "open"),
     ("torch.save", _RunsCommand, "system")],
)  # fmt: skip
def test_a_head_file_that_would_run_code_is_refused_in_one_line(
    m3, tmp_path, written_by, code, named
):
    """Refused naming the global torch refused, however torch words it (a blocked module's
    global is "unsupported GLOBAL", others "Unsupported global")."""
    path, _, _ = m3
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    marker = tmp_path / "ran"
    payload = {"weight": code(marker)}
    if written_by == "pickle":
        with open(bad / "sparse_linear.pt", "wb") as handle:
            pickle.dump(payload, handle, protocol=2)
    else:
        torch.save(payload, bad / "sparse_linear.pt")
    with pytest.raises(CheckpointError) as caught:
        BGEM3Encoder.from_pretrained(bad)
    message = str(caught.value)
    assert "\n" not in message and "sparse_linear.pt" in message and "weights_only" in message
    assert re.search(rf"unsupported global\W.*\b{named}\b", message, re.IGNORECASE), message
    assert not marker.exists()


def test_wrong_shapes_and_wrong_classes_are_refused(m3, tmp_path):
    path, _, heads = m3
    bad = tmp_path / "shape"
    shutil.copytree(path, bad)
    torch.save({"weight": torch.zeros(2, 32), "bias": torch.zeros(2)}, bad / "sparse_linear.pt")
    with pytest.raises(CheckpointError, match="sparse_linear"):
        BGEM3Encoder.from_pretrained(bad)
    with pytest.raises(CheckpointError, match="BGEM3Encoder"):
        MultiVectorEncoder.from_pretrained(path)
    plain = tmp_path / "plain"
    shutil.copytree(path, plain)
    (plain / "colbert_linear.pt").unlink()
    # One head file left: a bge-m3 directory missing the other, named (not a dense model).
    with pytest.raises(CheckpointError, match="lacks its head file colbert_linear.pt"):
        BGEM3Encoder.from_pretrained(plain)
    (plain / "sparse_linear.pt").unlink()
    with pytest.raises(CheckpointError, match="TextEncoder"):
        BGEM3Encoder.from_pretrained(plain)


def test_a_colbert_head_of_another_width_sets_the_multivector_width(m3, tmp_path):
    """FlagEmbedding's colbert_dim may differ from D: the token vectors, the view's dim and
    identity, and an index built on the view all take the head's width."""
    from clearformer.index import build_index

    path, _, _ = m3
    narrow = tmp_path / "narrow"
    shutil.copytree(path, narrow)
    generator = torch.Generator().manual_seed(3)
    head = {"weight": torch.randn(16, 32, generator=generator), "bias": torch.zeros(16)}
    torch.save(head, narrow / "colbert_linear.pt")
    ours = BGEM3Encoder.from_pretrained(narrow)
    view = ours.as_multivector()
    vectors = view.encode_document(TEXTS[:3])
    assert {v.shape[1] for v in vectors} == {16}
    assert (ours.colbert_dim, view.dim, view.identity.width, ours.dim) == (16, 16, 16, 32)
    index = build_index(tmp_path / "index", TEXTS[:3], view, kind="multivector")
    assert (index.rows, index.width) == (3, 16)
    rows, _ = index.search_texts(["fox"], k=3)
    assert sorted(rows[0].tolist()) == [0, 1, 2]
