"""Decoding is exact: the cache changes nothing, beam search keeps its promises, and a source
decodes the same in a padded batch as alone (the origin project's reversal model did not)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from clearformer import Seq2SeqConfig, Seq2SeqTransformer


def _model(vocab: int = 12, seed: int = 0, eos_boost: float = 2.0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    config = Seq2SeqConfig(
        src_vocab_size=vocab,
        d_model=32,
        n_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        dim_mlp=64,
        dropout=0.0,
        max_positions=40,
        tie_output=False,
    )
    model = Seq2SeqTransformer(config).eval()
    with torch.no_grad():  # spread-out distributions, with the end token likely now and then
        model.output.weight.mul_(6.0)
        model.output.weight[config.eos_id].mul_(eos_boost)
    return model


SRC = torch.tensor([[5, 7, 3, 9, 4, 8, 6], [4, 4, 10, 3, 0, 0, 0], [11, 6, 0, 0, 0, 0, 0]])
LENGTHS = [7, 4, 2]
MASK = torch.arange(7)[None] < torch.tensor(LENGTHS)[:, None]


@pytest.fixture(scope="module")
def model():
    return _model()


def test_some_rows_end_early(model):
    out = model.generate(SRC, MASK, max_new_tokens=12, num_beams=3)
    assert out.lengths.min() < 12  # the fixture exercises the end token
    greedy = model.generate(SRC, MASK, max_new_tokens=12)
    assert greedy.lengths.min() < 12


@pytest.mark.parametrize("num_beams", [1, 2, 4])
@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_cache_changes_nothing(model, num_beams, early_stopping):
    kw = dict(max_new_tokens=12, num_beams=num_beams, early_stopping=early_stopping)
    cached = model.generate(SRC, MASK, **kw)
    full = model.generate(SRC, MASK, use_cache=False, **kw)
    assert torch.equal(cached.sequences, full.sequences)
    assert torch.equal(cached.lengths, full.lengths)
    torch.testing.assert_close(cached.scores, full.scores, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_source_decodes_the_same_alone_and_in_a_padded_batch(model, num_beams):
    batch = model.generate(SRC, MASK, max_new_tokens=12, num_beams=num_beams)
    for row, length in enumerate(LENGTHS):
        alone = model.generate(SRC[row : row + 1, :length], max_new_tokens=12, num_beams=num_beams)
        n = int(alone.lengths[0])
        assert int(batch.lengths[row]) == n
        assert torch.equal(batch.sequences[row, :n], alone.sequences[0, :n])
        torch.testing.assert_close(batch.scores[row], alone.scores[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, -1.0, 2.0])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_scores_rebuild_from_token_logprobs_and_pads_follow_the_end(
    model, length_penalty, num_beams
):
    out = model.generate(
        SRC, MASK, max_new_tokens=12, num_beams=num_beams, length_penalty=length_penalty
    )
    rebuilt = out.token_logprobs.sum(1) / out.lengths.float() ** length_penalty
    torch.testing.assert_close(out.scores, rebuilt, atol=1e-6, rtol=0)
    eos, pad = model.config.eos_id, model.config.pad_id
    for row, n in enumerate(out.lengths.tolist()):
        seq = out.sequences[row]
        assert (seq[n:] == pad).all() and (out.token_logprobs[row, n:] == 0).all()
        if n < 12:
            assert seq[n - 1] == eos and eos not in seq[: n - 1].tolist()


def test_token_logprobs_are_the_models_own(model):
    """Teacher-forced log-probabilities of the returned tokens equal what decoding reported."""
    out = model.generate(SRC, MASK, max_new_tokens=12, num_beams=3)
    bos = torch.full((3, 1), model.config.bos_id)
    with torch.no_grad():
        logits = model(SRC, MASK, torch.cat([bos, out.sequences[:, :-1]], dim=1))
    logp = torch.log_softmax(logits, -1).gather(-1, out.sequences[..., None])[..., 0]
    real = torch.arange(out.sequences.shape[1])[None] < out.lengths[:, None]
    torch.testing.assert_close(logp[real], out.token_logprobs[real], atol=1e-5, rtol=0)


def test_one_beam_with_early_stopping_is_greedy(model):
    greedy = model.generate(SRC, MASK, max_new_tokens=12)
    beam = model.generate(SRC, MASK, max_new_tokens=12, num_beams=1, early_stopping=True)
    assert torch.equal(greedy.sequences, beam.sequences)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, -0.5, 2.0])
def test_wide_beam_with_never_finds_the_exhaustive_optimum(length_penalty):
    """With more beams than partial sequences nothing is pruned: 'never' must return the best
    of every possible output, found here by enumerating them all."""
    model = _model(vocab=5, seed=3, eos_boost=1.5)
    src = torch.tensor([[3, 4, 3]])
    steps, V, eos = 3, 5, model.config.eos_id
    out = model.generate(
        src,
        max_new_tokens=steps,
        num_beams=128,
        early_stopping="never",
        length_penalty=length_penalty,
    )
    bos = model.config.bos_id
    best_score, best_seq = -math.inf, None
    candidates = [(*prefix, eos) for n in range(steps) for prefix in _no_eos(n, V, eos)]
    candidates += list(_no_eos(steps, V, eos))
    with torch.no_grad():
        for seq in candidates:
            tgt = torch.tensor([[bos, *seq[:-1]]])
            logp = torch.log_softmax(model(src, None, tgt)[0], -1)  # (L, V)
            total = sum(logp[i, t].item() for i, t in enumerate(seq))
            score = total / len(seq) ** length_penalty
            if score > best_score:
                best_score, best_seq = score, list(seq)
    n = int(out.lengths[0])
    assert out.sequences[0, :n].tolist() == best_seq
    assert out.scores[0].item() == pytest.approx(best_score, abs=1e-5)


def _no_eos(n, V, eos):
    return itertools.product([t for t in range(V) if t != eos], repeat=n)


def test_finished_rows_stop_costing_compute(model):
    """Rows that ended leave the batch: later steps decode fewer rows."""
    seen: list[int] = []
    hook = model.decoder.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[0]))
    try:
        out = model.generate(SRC, MASK, max_new_tokens=12)
    finally:
        hook.remove()
    assert seen[0] == 3 and len(seen) == int(out.lengths.max())
    for step, rows in enumerate(seen):
        assert rows == int((out.lengths > step).sum())


def test_min_length_forbids_an_early_end(model):
    free = model.generate(SRC, MASK, max_new_tokens=12)
    assert free.lengths.min() < 5
    held = model.generate(SRC, MASK, max_new_tokens=12, min_length=5)
    assert held.lengths.min() >= 6 or (held.lengths == 12).all()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive int"),
        (dict(max_new_tokens=4, num_beams=0), "num_beams must be a positive int"),
        (dict(max_new_tokens=4, early_stopping="sometimes"), "early_stopping must be"),
        (dict(max_new_tokens=4, length_penalty=math.nan), "length_penalty must be"),
        (dict(max_new_tokens=4, eos_id=99), "eos_id"),
        (dict(max_new_tokens=4, min_length=9), "min_length"),
        (dict(max_new_tokens=60), "max_positions=40"),
    ],
)
def test_bad_options_are_named(model, kwargs, words):
    with pytest.raises((ValueError, TypeError), match=words):
        model.generate(SRC, MASK, **kwargs)
