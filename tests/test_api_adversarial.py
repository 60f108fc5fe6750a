"""Adversarial input to the Python API: poisoned padding in pooling and heads, empty batches in
beam search, flags of the wrong type, rows in the wrong dtype. Each test reproduces a bug
found in review and checks the fix against an independent computation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from clearformer import (
    Encoder,
    EncoderBlock,
    EncoderConfig,
    EncoderModel,
    MultiHeadAttention,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TextEncoder,
)
from clearformer.decoder import Decoder, DecoderConfig
from clearformer.heads import POOLING_MODES, ClassifierConfig, SequenceClassifier, pool

POISONS = [float("nan"), float("inf"), -float("inf"), 1e30]
D, H = 16, 4


def reference_pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str, skip: int) -> torch.Tensor:
    """Each row pooled from its kept states alone, one row at a time (no masking arithmetic)."""
    B, T, _ = hidden.shape
    out = []
    for b in range(B):
        # The prompt left out is the row's first `skip` real tokens, whatever the padding side.
        kept = [t for t in range(T) if mask[b, t]][skip:]
        states = hidden[b, kept]  # (n, D)
        if mode == "max":
            out.append(states.amax(0) if kept else hidden.new_full((D,), -float("inf")))
        elif not kept:
            out.append(hidden.new_zeros(D))
        elif mode == "mean":
            out.append(states.mean(0))
        elif mode == "mean_sqrt_len_tokens":
            out.append(states.sum(0) / len(kept) ** 0.5)
        elif mode == "cls":
            # The first kept token: the row's first real one after any prompt (sentence-
            # transformers' rule, on either padding side).
            out.append(hidden[b, kept[0]])
        elif mode == "lasttoken":
            out.append(hidden[b, kept[-1]])
        else:  # weightedmean: weight t + 1 - (the row's first real token)
            start = int(mask[b].int().argmax())
            w = torch.tensor([t + 1 - start for t in kept], dtype=hidden.dtype)
            out.append((states * w[:, None]).sum(0) / w.sum())
    return torch.stack(out)


@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    left=st.booleans(),
    skip=st.integers(0, 3),
    poison=st.sampled_from(POISONS),
    mode=st.sampled_from(POOLING_MODES),
)
def test_pooling_never_reads_what_a_padded_position_holds(lengths, left, skip, poison, mode):
    """``hidden * mask`` is NaN where a pad holds NaN or inf (0 * NaN): mean pooling of a real
    row became NaN, and an empty row did not pool to the promised zeros."""
    T = 6
    steps = torch.arange(T)[None, :]
    count = torch.tensor(lengths)[:, None]
    mask = steps >= T - count if left else steps < count  # (B, T)
    hidden = torch.randn(len(lengths), T, D)
    hidden[~mask] = poison
    got = pool(hidden, mask, mode, skip=skip)
    want = reference_pool(hidden, mask, mode, skip)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if mode != "max":
        assert torch.isfinite(got).all()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("poison", POISONS)
def test_a_classifier_head_ignores_poisoned_padding(pooling, poison):
    head = SequenceClassifier(ClassifierConfig(d_model=D, num_labels=2, pooling=pooling)).eval()
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    clean = torch.randn(2, 5, D).masked_fill(~mask[..., None], 0.0)  # as an Encoder returns it
    poisoned = clean.masked_fill(~mask[..., None], poison)
    with torch.no_grad():
        torch.testing.assert_close(head(poisoned, mask), head(clean, mask))


@pytest.fixture(scope="module")
def seq2seq():
    torch.manual_seed(0)
    config = Seq2SeqConfig(
        src_vocab_size=12, d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1,
        dim_mlp=64, dropout=0.0, max_positions=16,
    )  # fmt: skip
    return Seq2SeqTransformer(config).eval()


@pytest.mark.parametrize("num_beams", [1, 2, 4])
@pytest.mark.parametrize("use_cache", [True, False])
def test_an_empty_batch_decodes_to_an_empty_result_with_any_beam_width(
    seq2seq, num_beams, use_cache
):
    """Beam search on B = 0 indexed with an empty float tensor (IndexError); greedy did not."""
    src = torch.randint(3, 12, (0, 5))
    out = seq2seq.generate(
        src, torch.ones(0, 5, dtype=torch.bool), max_new_tokens=4, num_beams=num_beams,
        use_cache=use_cache,
    )  # fmt: skip
    assert out.sequences.shape == (0, 0) and out.sequences.dtype == torch.long
    assert out.lengths.shape == out.scores.shape == (0,)
    assert out.token_logprobs.shape == (0, 0)
    # The empty batch is no special case: one real source decodes as it does alone.
    one = torch.randint(3, 12, (1, 5))
    alone = seq2seq.generate(one, max_new_tokens=4, num_beams=num_beams, use_cache=use_cache)
    batched = seq2seq.generate(
        torch.cat([src, one]), max_new_tokens=4, num_beams=num_beams, use_cache=use_cache
    )
    assert torch.equal(alone.sequences, batched.sequences)


@pytest.fixture(scope="module")
def text_encoder():
    return TextEncoder.from_pretrained()


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        (dict(normalize="no"), "normalize"),  # bool("no") is True: it normalised anyway
        (dict(normalize=0), "normalize"),
        (dict(fuse_int8="no"), "fuse_int8"),
        (dict(progress="yes"), "progress"),
        (dict(prompt_name=["query"]), "prompt_name"),  # unhashable: 'list', naming nothing
    ],
)
def test_encode_refuses_flags_of_the_wrong_type(text_encoder, monkeypatch, options, argument):
    def no_work(*args, **kwargs):
        raise AssertionError("tokenized before the arguments were checked")

    monkeypatch.setattr(text_encoder.tokenizer, "encode", no_work)
    with pytest.raises(TypeError, match=argument) as caught:
        text_encoder.encode(["a text"], **options)
    assert repr(next(iter(options.values()))) in str(caught.value)


def test_encode_takes_real_bools_as_before(text_encoder):
    texts = ["A cat sits on the mat.", "Stock markets fell."]
    raw = text_encoder.encode(texts, normalize=False)
    unit = text_encoder.encode(texts, normalize=True)
    torch.testing.assert_close(
        torch.from_numpy(unit), torch.nn.functional.normalize(torch.from_numpy(raw), dim=-1)
    )


def test_predict_refuses_flags_of_the_wrong_type(tmp_path):
    pytest.importorskip("transformers")
    from clearformer import CrossEncoder

    from .test_sequence_classification import make_classifier

    make_classifier("bert", tmp_path, num_labels=3)
    ranker = CrossEncoder.from_pretrained(tmp_path)
    with pytest.raises(TypeError, match="apply_softmax must be a bool.*'no'"):
        ranker.predict([("a", "b")], apply_softmax="no")
    with pytest.raises(TypeError, match=r"activation must be one of .*\['tanh'\]"):
        ranker.predict([("a", "b")], activation=["tanh"])
    scores = ranker.predict([("a", "b")], apply_softmax=True)
    torch.testing.assert_close(torch.from_numpy(scores).sum(-1), torch.ones(1))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(use_cache="no"), "use_cache must be a bool"),
        (dict(length_penalty=True), "length_penalty must be a finite number"),
    ],
)
def test_generate_refuses_flags_of_the_wrong_type(seq2seq, options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        seq2seq.generate(torch.randint(3, 12, (1, 5)), max_new_tokens=3, **options)


@pytest.mark.parametrize("flag", ["is_causal", "need_weights"])
def test_attention_flags_must_be_bools(flag):
    """is_causal="no" is truthy: the call silently masked the future."""
    attn = MultiHeadAttention(D, D, D, D, H, backend="math").eval()
    x = torch.randn(2, 5, D)
    with pytest.raises(TypeError, match=f"{flag} must be a bool.*'no'"):
        attn(x, **{flag: "no"})
    with torch.no_grad():  # the real bool still means what it says
        bidirectional, _ = attn(x, is_causal=False)
        causal, _ = attn(x, is_causal=True)
    torch.testing.assert_close(causal[:, -1], bidirectional[:, -1])  # the last sees every key
    assert not torch.allclose(causal[:, 0], bidirectional[:, 0])


@pytest.mark.parametrize("flag", ["output_attentions", "output_hidden_states"])
def test_encoder_output_flags_must_be_bools(flag):
    encoder = Encoder(EncoderConfig(d_model=D, n_heads=H, n_layers=1, dim_mlp=32)).eval()
    with pytest.raises(TypeError, match=f"{flag} must be a bool.*1"):
        encoder(torch.randn(2, 5, D), **{flag: 1})


def _lone_modules():
    encoder = Encoder(EncoderConfig(d_model=D, n_heads=H, n_layers=1, dim_mlp=32)).eval()
    block = EncoderBlock(D, H, 32).eval()
    attn = MultiHeadAttention(D, D, D, D, H).eval()
    decoder = Decoder(DecoderConfig(d_model=D, n_heads=H, n_layers=1, dim_mlp=32)).eval()
    other = torch.randn(2, 3, D)  # the decoder's other input, the same in every call
    return [
        ("x", lambda x: encoder(x)),
        ("x", lambda x: encoder(x.reshape(-1, D), cu_seqlens=torch.tensor([0, 5, 10]))),
        ("x", lambda x: block(x)),
        ("query", lambda x: attn(x)),
        ("x", lambda x: decoder(x, other)),
        ("memory", lambda x: decoder(other, x)),
    ]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64])
@pytest.mark.parametrize("case", range(6))
def test_rows_in_another_dtype_than_the_model_name_the_argument(dtype, case):
    """A float16 batch into a float32 model failed in the first product with "mat1 and mat2
    must have the same dtype" (a RuntimeError that names neither the argument nor the fix)."""
    name, call = _lone_modules()[case]
    x = torch.randn(2, 5, D).to(dtype)
    with pytest.raises(TypeError, match=name) as caught, torch.no_grad():
        call(x)
    assert str(dtype) in str(caught.value)


@pytest.mark.parametrize("case", range(6))
def test_rows_the_model_can_take_still_run(case):
    """The check refuses nothing that ran: the model's own dtype, and any under autocast."""
    name, call = _lone_modules()[case]
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        want = call(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = call(x.bfloat16())
    want, got = (t[0] if isinstance(t, tuple) else t for t in (want, got))
    torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.1)


def test_token_types_of_the_wrong_dtype_name_the_argument():
    config = EncoderConfig(
        d_model=D, n_heads=H, n_layers=1, dim_mlp=32, vocab_size=20, type_vocab_size=2
    )
    model = EncoderModel(config).eval()
    ids = torch.randint(0, 20, (2, 5))
    for types in (torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.bool)):
        with pytest.raises(TypeError, match=f"token_type_ids must be integer.*{types.dtype}"):
            model(ids, None, types)
    with torch.no_grad():  # integer ids still select the rows of the table
        a = model(ids, None, torch.zeros(2, 5, dtype=torch.long))
        b = model(ids, None, torch.ones(2, 5, dtype=torch.long))
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
@given(
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    left=st.lists(st.booleans(), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_a_text_gives_the_same_rows_whatever_its_padding_and_layout(positions, lengths, left, seed):
    # Positions count a sequence's real tokens, on every layout: a text padded on the left, on
    # the right or not at all gives the same rows, and the padded and the packed layout agree.
    # (Learned and sinusoidal positions once counted the left pads on the padded layout only.)
    torch.manual_seed(seed)
    config = EncoderConfig(
        d_model=D, n_heads=H, n_layers=2, dim_mlp=32, vocab_size=20, positions=positions
    )
    model = EncoderModel(config).eval()
    T = max(lengths) + 2
    ids = torch.randint(1, 20, (len(lengths), T))
    steps = torch.arange(T)
    mask = torch.stack(
        [
            (steps >= T - n) if on_left else (steps < n)
            for n, on_left in zip(lengths, left, strict=False)
        ]
    )  # (B, T), each row one run of real tokens at its left or right end
    with torch.no_grad():
        rows = {backend: model(ids, mask.long(), backend=backend) for backend in ("sdpa", "varlen")}
        for b in range(len(lengths)):
            alone = model(ids[b][mask[b]][None])[0]  # (n, D): the text without padding
            for backend, out in rows.items():
                torch.testing.assert_close(
                    out[b][mask[b]], alone, atol=1e-5, rtol=0, msg=f"{backend}, row {b}"
                )
