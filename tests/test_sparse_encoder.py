"""SparseEncoder against sentence-transformers 6.3's SparseEncoder, on directories that
sentence-transformers itself wrote: SPLADE with max and sum pooling, ReLU and log1p-ReLU, and
an inference-free model (Router + SparseStaticEmbedding); max_active_dims; a text alone against
its row in a ragged batch; chunking; both padding sides; decode; the refusals; model_kind."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("sentence_transformers")
pytest.importorskip("transformers")

from clearformer import SparseEncoder, TextEncoder  # noqa: E402
from clearformer.interop.hf import CheckpointError  # noqa: E402
from clearformer.retrieval import model_kind  # noqa: E402

from .sparse_helpers import (  # noqa: E402
    TEXTS,
    V,
    assert_same_sparse,
    inference_free_dir,
    splade_dir,
    st_encode,
    write_mlm,
)

HEADS = [("max", "relu"), ("sum", "relu"), ("max", "log1p_relu"), ("sum", "log1p_relu")]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_mlm(tmp_path_factory.mktemp("mlm"))


@pytest.fixture(scope="module")
def splade(base, tmp_path_factory):
    return splade_dir(base, tmp_path_factory.mktemp("splade"))


@pytest.mark.parametrize(("pooling", "activation"), HEADS)
def test_splade_matches_sentence_transformers(base, tmp_path, pooling, activation):
    path = splade_dir(base, tmp_path / "splade", pooling=pooling, activation=activation)
    encoder = SparseEncoder.from_pretrained(path)
    for task in ("query", "document"):
        ours = encoder.encode(TEXTS, task=task, batch_size=4)
        assert_same_sparse(ours, st_encode(path, TEXTS, task, batch_size=4))
    # Sparse, not dense: the pushed-down bias leaves most entries zero, and some non-zero.
    nonzero = ours.to_dense().ne(0).sum(dim=1)
    assert 0 < int(nonzero.max()) < V
    assert encoder.identity.pooling == f"splade-{pooling}" + (
        "" if activation == "relu" else "-log1p_relu"
    )


def test_a_wrong_activation_is_caught(base, tmp_path):
    """Negative control: the comparison sees an activation the directory does not ask for."""
    path = splade_dir(base, tmp_path / "splade", activation="log1p_relu")
    reference = st_encode(path, TEXTS, "document")
    config = path / "1_SpladePooling" / "config.json"
    settings = json.loads(config.read_text())
    config.write_text(json.dumps({**settings, "activation_function": "relu"}))
    ours = SparseEncoder.from_pretrained(path).encode_document(TEXTS)
    with pytest.raises(AssertionError):
        assert_same_sparse(ours, reference)


def test_inference_free_matches_sentence_transformers(base, tmp_path):
    path = inference_free_dir(base, tmp_path / "free")
    encoder = SparseEncoder.from_pretrained(path)
    queries = encoder.encode_query(TEXTS)
    assert_same_sparse(queries, st_encode(path, TEXTS, "query"))
    assert_same_sparse(encoder.encode_document(TEXTS), st_encode(path, TEXTS, "document"))
    # The queries were looked up, not run: no special token, a repeated word counted once.
    vocabulary = encoder.vocabulary
    words = {vocabulary[i] for i in queries[3].coalesce().indices()[0].tolist()}
    assert "[CLS]" not in words and "far" in words
    assert encoder.pooling == "inference-free-splade-max"


def test_a_text_alone_equals_its_row_in_a_batch(splade):
    encoder = SparseEncoder.from_pretrained(splade)
    together = encoder.encode_document(TEXTS).to_dense()
    for i, text in enumerate(TEXTS):
        alone = encoder.encode_document([text]).to_dense()[0]
        torch.testing.assert_close(together[i], alone, atol=1e-6, rtol=0)


def test_chunks_do_not_change_the_weights(splade):
    """The pooling runs chunk by chunk; a chunk of 1 token, one that splits texts, and one that
    holds the whole batch give the same weights."""
    encoder = SparseEncoder.from_pretrained(splade)
    whole = encoder.encode_document(TEXTS, chunk_tokens=10_000).to_dense()
    for chunk in (1, 7):
        part = encoder.encode_document(TEXTS, chunk_tokens=chunk).to_dense()
        torch.testing.assert_close(part, whole, atol=1e-6, rtol=0)


def test_max_active_dims_from_the_config_and_per_call(base, tmp_path):
    path = splade_dir(base, tmp_path / "splade", max_active_dims=3)
    encoder = SparseEncoder.from_pretrained(path)
    assert encoder.max_active_dims == 3
    ours = encoder.encode_document(TEXTS)
    assert_same_sparse(ours, st_encode(path, TEXTS, "document"))
    assert int(ours.to_dense().ne(0).sum(dim=1).max()) == 3
    five = encoder.encode_document(TEXTS, max_active_dims=5)
    assert_same_sparse(five, st_encode(path, TEXTS, "document", max_active_dims=5))
    assert int(five.to_dense().ne(0).sum(dim=1).max()) == 5


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_max_active_dims_must_be_positive(splade, bad):
    encoder = SparseEncoder.from_pretrained(splade)
    with pytest.raises(ValueError, match=f"max_active_dims must be a positive int.*{bad!r}"):
        encoder.encode_query(["hello"], max_active_dims=bad)


def test_padding_sides(base, tmp_path):
    """A left-padding tokenizer gives the right-padding weights (batches are packed), and each
    text's are sentence-transformers' for the text alone. sentence-transformers' own batch
    with left padding differs (BERT counts the pads in its positions): the padding matters."""
    right = splade_dir(base, tmp_path / "right")
    left = splade_dir(write_mlm(tmp_path / "base-left", padding_side="left"), tmp_path / "left")
    ours = SparseEncoder.from_pretrained(left).encode_document(TEXTS)
    assert_same_sparse(ours, SparseEncoder.from_pretrained(right).encode_document(TEXTS), 1e-6)
    for i, text in enumerate(TEXTS):
        alone = st_encode(left, [text], "document")
        assert_same_sparse(torch.stack([ours[i]]).coalesce(), alone)
    batched = st_encode(left, TEXTS, "document")
    assert not torch.allclose(batched.to_dense(), ours.to_dense(), atol=1e-3)


def test_decode_and_vocabulary(splade):
    from sentence_transformers import SparseEncoder as Reference

    encoder = SparseEncoder.from_pretrained(splade)
    reference = Reference(str(splade), device="cpu")
    vectors = encoder.encode_document(TEXTS)
    assert encoder.vocabulary[5:8] == ["the", "cat", "sat"]
    ours, theirs = encoder.decode(vectors[0], top_k=4), reference.decode(vectors[0], top_k=4)
    assert [t for t, _ in ours] == [t for t, _ in theirs] and len(ours) == 4
    assert [w for _, w in ours] == sorted((w for _, w in ours), reverse=True)
    rows = encoder.decode(vectors)
    assert len(rows) == len(TEXTS) and rows[2] == reference.decode(vectors)[2]
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        encoder.decode(vectors[0], top_k=0)
    # Any sparse layout decodes as its dense rows; NaN or infinity is refused, not listed first.
    assert encoder.decode(vectors.to_dense().to_sparse_csr()) == rows
    for bad in (float("nan"), float("inf")):
        broken = vectors[0].to_dense().clone()
        broken[7] = bad
        with pytest.raises(ValueError, match="vector must hold finite weights"):
            encoder.decode(broken)


def test_kind_refusals(splade, base, tmp_path):
    from .family_helpers import sentence_dir

    with pytest.raises(CheckpointError) as caught:
        TextEncoder.from_pretrained(splade)
    message = str(caught.value)
    assert "\n" not in message
    assert str(splade) in message and "sparse model" in message and "SparseEncoder" in message
    dense = sentence_dir(base, tmp_path / "dense")
    with pytest.raises(CheckpointError, match="dense model.*TextEncoder") as caught:
        SparseEncoder.from_pretrained(dense)
    assert str(dense) in str(caught.value)


def test_model_kind(splade, base, tmp_path):
    from .family_helpers import sentence_dir

    assert model_kind(splade) == "sparse"
    assert model_kind(inference_free_dir(base, tmp_path / "free")) == "sparse"
    assert model_kind(sentence_dir(base, tmp_path / "dense")) == "dense"
    assert model_kind(base) == "dense"  # a plain transformers checkpoint
    colbert = tmp_path / "colbert"
    colbert.mkdir()
    (colbert / "config_sentence_transformers.json").write_text(
        '{"model_type": "MultiVectorEncoder"}'
    )
    assert model_kind(colbert) == "multivector"
    m3 = tmp_path / "m3"
    m3.mkdir()
    (m3 / "colbert_linear.pt").write_bytes(b"")
    assert model_kind(m3) == "bge-m3"
    with pytest.raises(FileNotFoundError):
        model_kind(tmp_path / "absent")


def test_bf16_is_close_to_float32(splade):
    encoder = SparseEncoder.from_pretrained(splade)
    full = encoder.encode_document(TEXTS).to_dense()
    half = encoder.encode_document(TEXTS, precision="bf16").to_dense()
    assert torch.nn.functional.cosine_similarity(full, half, dim=1)[full.any(dim=1)].min() > 0.99
    with pytest.raises(ValueError, match="precision"):
        encoder.encode_document(TEXTS, precision="int8")


def test_loaded_in_bf16_holds_the_bf16_copy_alone(splade):
    """``precision="bf16"`` at load: the weights of ``encode_document(precision="bf16")`` of a
    float32 encoder, bit for bit; no float32 linear layer left reachable; float32 refused."""
    import gc
    import weakref

    from clearformer.text import sparse_sides

    made: list = []
    original = sparse_sides.SpladeRunner.load.__func__

    def load(cls, *args, **kwargs):  # the float32 runner, seen before it lets go
        runner = original(cls, *args, **kwargs)
        made.extend(weakref.ref(m) for m in runner.loaded.loaded.model.modules()
                    if isinstance(m, torch.nn.Linear))  # fmt: skip
        return runner

    sparse_sides.SpladeRunner.load = classmethod(load)
    try:
        held = SparseEncoder.from_pretrained(splade, precision="bf16")
    finally:
        sparse_sides.SpladeRunner.load = classmethod(original)
    gc.collect()
    assert made and not [ref for ref in made if ref() is not None]
    expected = SparseEncoder.from_pretrained(splade).encode_document(TEXTS, precision="bf16")
    got = held.encode_document(TEXTS)
    assert torch.equal(got.to_dense(), expected.to_dense())
    assert torch.equal(held.encode_document(TEXTS, precision="bfloat16").to_dense(), got.to_dense())
    with pytest.raises(ValueError, match=r"loaded with precision='bf16' .* got 'float32'"):
        held.encode_document(TEXTS, precision="float32")
    with pytest.raises(ValueError, match="precision"):
        SparseEncoder.from_pretrained(splade, precision="int8")


def test_distilbert_splade_matches_sentence_transformers(tmp_path):
    """OpenSearch's SPLADE models are DistilBERT: no token types, another head layout."""
    import transformers

    from .sparse_helpers import SPECIALS, WORDS

    base = tmp_path / "distil"
    base.mkdir()
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(
        vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64
    )
    model = transformers.DistilBertForMaskedLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # off the initial values, so that logits reach above 0
            p.add_(0.1 * torch.randn(p.shape))
        model.vocab_projector.bias.sub_(0.4)
    model.save_pretrained(base)
    (base / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    path = splade_dir(base, tmp_path / "splade", activation="log1p_relu")
    ours = SparseEncoder.from_pretrained(path).encode_document(TEXTS)
    assert_same_sparse(ours, st_encode(path, TEXTS, "document"))
    assert 0 < ours._nnz() < len(TEXTS) * V


def test_an_untied_decoder_decodes(tmp_path):
    """A checkpoint whose decoder has weights of its own (tie_word_embeddings false) decodes
    with them, not with the word embeddings."""
    import transformers

    from .sparse_helpers import SPECIALS, WORDS

    base = tmp_path / "untied"
    base.mkdir()
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape))
        model.cls.predictions.decoder.weight.normal_(0, 0.5)
        model.cls.predictions.decoder.bias.sub_(0.4)
    model.save_pretrained(base)
    (base / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    path = splade_dir(base, tmp_path / "splade")
    encoder = SparseEncoder.from_pretrained(path)
    ours = encoder.encode_document(TEXTS)
    assert_same_sparse(ours, st_encode(path, TEXTS, "document"))
    assert 0 < ours._nnz() < len(TEXTS) * V
    side = encoder.sides["document"].loaded
    assert side.decoder is not None
    assert not torch.equal(side.decoder, side.loaded.model.embeddings.word.weight)


def test_identity(splade, base, tmp_path):
    from clearformer.index.identity import checkpoint_revision

    identity = SparseEncoder.from_pretrained(splade).identity
    assert identity.revision == checkpoint_revision(splade)  # hashed as a dense model's
    assert (identity.width, identity.normalize, identity.max_length) == (V, False, 64)
    free = inference_free_dir(base, tmp_path / "free")
    before = SparseEncoder.from_pretrained(free).identity
    assert before.pooling == "inference-free-splade-max"
    # Other query weights in the Router's folder: another model, another revision.
    inference_free_dir(base, tmp_path / "free", seed=2)
    after = SparseEncoder.from_pretrained(free).identity
    assert after.revision != before.revision and after.differences(before) == ["revision"]


def test_cli_encode_writes_sparse_jsonl(splade, tmp_path, capsys):
    from clearformer.cli import main

    out = tmp_path / "weights.jsonl"
    assert main(["encode", "--model", str(splade), "-o", str(out), *TEXTS[:3]]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    want = SparseEncoder.from_pretrained(splade).encode_document(TEXTS[:3]).to_dense()
    for row, vector in zip(rows, want, strict=True):
        got = torch.zeros(V)
        for index, value in row["sparse"].items():
            got[int(index)] = value
        torch.testing.assert_close(got, vector, atol=0, rtol=0)
    assert [row["text"] for row in rows] == TEXTS[:3]
    capsys.readouterr()
    assert main(["encode", "--model", str(splade), "--dimensions", "4", "x"]) == 2
    error = capsys.readouterr().err
    assert "--dimensions is for dense embeddings" in error and "Traceback" not in error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["relu", "log1p_relu"])
def test_max_pooling_of_the_logits_equals_the_max_of_the_weights_to_the_bit(dtype, activation):
    """Max pooling reduces the raw logits and activates the (B, V) result; the definition
    activates every token's logits, then takes the max. relu and log1p never decrease, so the
    two agree to the bit: for every chunk size (texts split across chunks), an empty text in
    the middle, and bfloat16 logits."""
    from clearformer.heads.splade import SpladeConfig, splade_pool

    torch.manual_seed(0)
    lengths = [5, 0, 9, 1, 13]
    rows = torch.randn(sum(lengths), 16)  # (N, D) packed
    table = torch.randn(300, 16)  # (V, D)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])

    logits = (rows @ table.T).to(dtype)  # (N, V), computed once: a chunk's product may round
    row_bytes = rows.stride(0) * rows.element_size()  # differently from the whole's

    def head(chunk):  # the chunk's rows of the logits
        start = (chunk.data_ptr() - rows.data_ptr()) // row_bytes
        return logits[start : start + len(chunk)]  # (n, V)

    weights = logits.float().relu().log1p()  # the definition, token by token
    if activation == "log1p_relu":
        weights = weights.log1p()
    expected = torch.zeros(len(lengths), 300)
    for b in range(len(lengths)):
        if lengths[b]:
            expected[b] = weights[cu_seqlens[b] : cu_seqlens[b + 1]].amax(dim=0)
    config = SpladeConfig(pooling="max", activation=activation)
    for chunk_tokens in (1, 4, 7, 256):
        got = splade_pool(rows, cu_seqlens, head, config, 300, chunk_tokens=chunk_tokens)
        assert got.dtype == torch.float32
        assert torch.equal(got, expected), chunk_tokens
    assert torch.equal(got[1], torch.zeros(300))  # the empty text
    assert int((got > 0).sum()) > 0  # the test sees non-zero weights, not zeros everywhere


@pytest.mark.parametrize(("pooling", "activation"), HEADS[:2])
def test_weights_reordered_for_onednn_match_sentence_transformers(
    base, tmp_path, monkeypatch, pooling, activation
):
    """Once calls have carried enough tokens, the encoder's weights and the vocabulary table
    are read in oneDNN's layout (the table's product through the packed projection): the
    weights still equal sentence-transformers'."""
    from clearformer import ran
    from clearformer.fast import reordered_weights

    monkeypatch.setattr(reordered_weights, "REORDER_MIN_TOKENS", 1)  # from the first call on
    path = splade_dir(base, tmp_path / "splade", pooling=pooling, activation=activation)
    encoder = SparseEncoder.from_pretrained(path)
    with ran.watching() as notes:  # the notes of the calling thread: no workers
        ours = encoder.encode(TEXTS, task="document", batch_size=4, workers=1)
    from clearformer.machine import machine

    if torch.float32 in machine().reorder:  # a build whose oneDNN reorders weights
        assert ("linear", "packed projection") in notes
    assert encoder.sides["document"]._reordering.kept is not None
    assert_same_sparse(ours, st_encode(path, TEXTS, "document", batch_size=4))


def test_entries_moved_into_text_order_equal_a_coalesce():
    """The batches' entries come in batch order (texts sorted by length); moving each text's
    run into text order gives what a full coalesce gives, empty texts included."""
    from clearformer.text.sparse_encoder import in_text_order

    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(1, 12, (1,), generator=generator))
        dense = torch.rand(n, 40, generator=generator)
        dense *= torch.rand(n, 40, generator=generator) > 0.7  # sparse
        dense[torch.rand(n, generator=generator) > 0.7] = 0.0  # some texts without entries
        texts = torch.randperm(n, generator=generator)
        rows, columns, values = [], [], []
        for batch in texts.split(3):  # batches of texts in a shuffled order
            weights = dense[batch]
            row, column = weights.nonzero(as_tuple=True)
            rows.append(batch[row])
            columns.append(column)
            values.append(weights[row, column])
        row, column, value = in_text_order(torch.cat(rows), torch.cat(columns), torch.cat(values))
        expected = dense.to_sparse().coalesce()
        assert torch.equal(torch.stack([row, column]), expected.indices())
        assert torch.equal(value, expected.values())


def test_workers_side_by_side_give_each_text_its_weights(splade):
    """Batches run two at a time (each on a share of the threads) give what one at a time
    gives, in text order; a bad worker count is refused before any work."""
    encoder = SparseEncoder.from_pretrained(splade)
    texts = TEXTS * 5  # several batches of 3
    alone = encoder.encode_document(texts, batch_size=3, workers=1)
    together = encoder.encode_document(texts, batch_size=3, workers=2)
    assert_same_sparse(together, alone, atol=1e-6)
    bf16 = encoder.encode_document(texts, batch_size=3, workers=2, precision="bf16")
    assert_same_sparse(
        bf16, encoder.encode_document(texts, batch_size=3, precision="bf16", workers=1)
    )
    with pytest.raises(ValueError, match="workers"):
        encoder.encode_document(texts, workers=0)


PROMPT_CASES = [
    ({"query": "hello: ", "passage": "world: "}, None),  # no "document": no document prompt
    ({"corpus": "one two ", "other": "three "}, "other"),  # neither fallback nor default
    ({"other": "three "}, "other"),
    ({"query": "far ", "document": "the ", "other": "three "}, "other"),
]


@pytest.mark.parametrize(("prompts", "default"), PROMPT_CASES)
@pytest.mark.parametrize("kind", ["splade", "inference-free"])
def test_prompts_follow_sentence_transformers_6(base, tmp_path, prompts, default, kind):
    """sentence-transformers 6 holds a "query" and a "document" prompt for every sparse model
    (empty where the config names none): encode_document never takes "passage", "corpus" or
    the default prompt."""
    make = splade_dir if kind == "splade" else inference_free_dir
    path = make(base, tmp_path / kind)
    config_file = path / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text())
    config = {**config, "prompts": prompts, "default_prompt_name": default}
    config_file.write_text(json.dumps(config))
    encoder = SparseEncoder.from_pretrained(path)
    for task in ("query", "document"):
        assert encoder.prompt_for(task) == (prompts.get(task) or None)
        assert_same_sparse(encoder.encode(TEXTS, task=task), st_encode(path, TEXTS, task))


def test_auto_precision_is_decided_among_float32_and_bf16(splade, tmp_path):
    from clearformer.cli import main
    from clearformer.precision.auto import choose_precision

    expected = choose_precision("auto", offered=("float32", "bf16")).choice
    encoder = SparseEncoder.from_pretrained(splade, precision="auto")
    assert encoder.precision == expected
    want = SparseEncoder.from_pretrained(splade, precision=expected).encode_document(TEXTS)
    assert_same_sparse(encoder.encode_document(TEXTS, precision="auto"), want, atol=0)
    out = tmp_path / "auto.jsonl"
    argv = ["encode", "--model", str(splade), "--precision", "auto", "-o", str(out), *TEXTS[:2]]
    assert main(argv) == 0
    assert len(out.read_text().splitlines()) == 2


def test_sides_of_other_lengths_share_one_model(base, tmp_path):
    """query_length 8, document_length 32: each side cuts at its own length (as
    sentence-transformers does) on one copy of the weights, float32 and bf16."""
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    path = tmp_path / "lengths"
    side = Transformer(str(base), transformer_task="fill-mask", query_length=8, document_length=32)
    STSparseEncoder(modules=[side, SpladePooling("max")], device="cpu").save(str(path))
    encoder = SparseEncoder.from_pretrained(path)
    query, document = encoder.sides["query"], encoder.sides["document"]
    assert (query.max_length, document.max_length) == (8, 32)
    assert query.model is document.model
    for task in ("query", "document"):
        assert_same_sparse(encoder.encode(TEXTS, task=task), st_encode(path, TEXTS, task))
    held = SparseEncoder.from_pretrained(path, precision="bf16")
    assert held.sides["query"].loaded is held.sides["document"].loaded
    assert held.sides["query"].loaded.loaded.model.embeddings.word.weight.dtype == torch.bfloat16


def test_a_max_length_below_the_special_tokens_is_refused(splade):
    """Below the template's special tokens the tokenizers library truncates nothing: a limit of
    1 would run every text whole while the model (and an index's identity) claimed 1."""
    with pytest.raises(ValueError, match="max_length must be at least 2, the special .* got 1"):
        SparseEncoder.from_pretrained(splade, max_length=1)
    model = SparseEncoder.from_pretrained(splade, max_length=2)
    (row,) = model.sides["document"].encode([TEXTS[0]])
    assert len(row.ids) == 2  # the special tokens alone: the limit holds
