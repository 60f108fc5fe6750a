"""Decoding is exact: the cache changes nothing, beam search keeps its promises, and a source
decodes the same in a padded batch as alone (the origin project's reversal model did not)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from clearformer import Seq2SeqConfig, Seq2SeqTransformer


def _model(
    vocab: int = 12, seed: int = 0, eos_boost: float = 2.0, tie_output: bool = False
) -> Seq2SeqTransformer:
    """A small random model; untied, its output table is scaled so that decoding meets
    spread-out distributions and the end token now and then (a tied one is left as drawn)."""
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
        tie_output=tie_output,
    )
    model = Seq2SeqTransformer(config).eval()
    if not tie_output:
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
    # Summed step by step against summed at once: equal up to float32 rounding of the total
    # (scores grow with the length when length_penalty < 0), far below one token's logprob.
    torch.testing.assert_close(out.scores, rebuilt, atol=1e-6, rtol=1e-6)
    eos, pad = model.config.eos_id, model.config.pad_id
    for row, n in enumerate(out.lengths.tolist()):
        seq = out.sequences[row]
        assert (seq[n:] == pad).all() and (out.token_logprobs[row, n:] == 0).all()
        if n < 12:
            assert seq[n - 1] == eos and eos not in seq[: n - 1].tolist()


def test_token_logprobs_are_the_models_own(model):
    """Teacher-forced log-probabilities of the returned tokens (padding removed, the rest
    renormalised, as decoding does) equal what decoding reported."""
    out = model.generate(SRC, MASK, max_new_tokens=12, num_beams=3)
    bos = torch.full((3, 1), model.config.bos_id)
    with torch.no_grad():
        logits = model(SRC, MASK, torch.cat([bos, out.sequences[:, :-1]], dim=1))
    logits[..., model.config.pad_id] = -math.inf
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
    steps, V, eos, pad = 3, 5, model.config.eos_id, model.config.pad_id
    out = model.generate(
        src,
        max_new_tokens=steps,
        num_beams=128,
        early_stopping="never",
        length_penalty=length_penalty,
    )
    bos = model.config.bos_id
    best_score, best_seq = -math.inf, None
    candidates = [(*prefix, eos) for n in range(steps) for prefix in _no_eos(n, V, eos, pad)]
    candidates += list(_no_eos(steps, V, eos, pad))
    with torch.no_grad():
        for seq in candidates:
            tgt = torch.tensor([[bos, *seq[:-1]]])
            logits = model(src, None, tgt)[0]  # (L, V)
            logits[:, pad] = -math.inf  # never generated: renormalised without it
            logp = torch.log_softmax(logits, -1)
            total = sum(logp[i, t].item() for i, t in enumerate(seq))
            score = total / len(seq) ** length_penalty
            if score > best_score:
                best_score, best_seq = score, list(seq)
    n = int(out.lengths[0])
    assert out.sequences[0, :n].tolist() == best_seq
    assert out.scores[0].item() == pytest.approx(best_score, abs=1e-5)


def _no_eos(n, V, eos, pad):
    return itertools.product([t for t in range(V) if t not in (eos, pad)], repeat=n)


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
    shortest = int(free.lengths.min())
    assert shortest < 10  # some row ends early when free to
    held = model.generate(SRC, MASK, max_new_tokens=12, min_length=shortest + 1)
    assert held.lengths.min() >= shortest + 2  # its end token comes after min_length tokens


def test_as_many_new_tokens_as_positions_fit(model):
    """The last new token is never fed back: max_positions new tokens use max_positions
    target positions (start token included), and decode as without the cache."""
    limit = model.config.max_positions
    with torch.no_grad():
        cached = model.generate(SRC, MASK, max_new_tokens=limit, min_length=limit - 1)
        plain = model.generate(
            SRC, MASK, max_new_tokens=limit, min_length=limit - 1, use_cache=False
        )
    assert int(cached.lengths.max()) == limit
    torch.testing.assert_close(cached.sequences, plain.sequences)
    with pytest.raises(ValueError, match=f"above max_positions={limit}"):
        model.generate(SRC, MASK, max_new_tokens=limit + 1)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive int"),
        (dict(max_new_tokens=4, num_beams=0), "num_beams must be a positive int"),
        (dict(max_new_tokens=4, early_stopping="sometimes"), "early_stopping must be"),
        (dict(max_new_tokens=4, early_stopping=1.0), "early_stopping must be"),
        (dict(max_new_tokens=4, early_stopping=0.0), "early_stopping must be"),
        (dict(max_new_tokens=4, early_stopping=np.bool_(True)), "early_stopping must be"),
        (dict(max_new_tokens=4, length_penalty=math.nan), "length_penalty must be"),
        (dict(max_new_tokens=12, length_penalty=300.0), "length_penalty must be within"),
        (dict(max_new_tokens=12, length_penalty=-300.0), "length_penalty must be within"),
        (dict(max_new_tokens=4, eos_id=99), "eos_id"),
        (dict(max_new_tokens=4, min_length=9), "min_length"),
        (dict(max_new_tokens=60), "max_positions=40"),
    ],
)
def test_bad_options_are_named(model, kwargs, words):
    with pytest.raises((ValueError, TypeError), match=words):
        model.generate(SRC, MASK, **kwargs)


def test_a_source_mask_that_is_no_tensor_is_named(model):
    with pytest.raises(TypeError, match="src_mask must be a torch.Tensor of 0/1 or bools, got"):
        model.generate(SRC, MASK.tolist(), max_new_tokens=4)


def test_the_padding_id_is_never_generated():
    model = _model(seed=5)
    with torch.no_grad():  # make padding the likeliest token everywhere
        model.output.weight[model.config.pad_id] = 5.0 * model.output.weight.abs().max()
    for beams in (1, 3):
        out = model.generate(SRC, MASK, max_new_tokens=8, num_beams=beams)
        for row, n in enumerate(out.lengths.tolist()):
            assert model.config.pad_id not in out.sequences[row, :n].tolist()


def test_an_empty_source_is_refused_before_any_work(model):
    mask = MASK.clone()
    mask[2] = False
    with pytest.raises(ValueError, match=r"src rows \[2\] are empty"):
        model.generate(SRC, mask, max_new_tokens=4)
    with pytest.raises(ValueError, match="no tokens"):
        model.generate(SRC[:, :0], None, max_new_tokens=4)


def test_future_target_tokens_leave_earlier_logits_unchanged(model):
    tgt = torch.tensor([[1, 5, 7, 3, 9, 4], [1, 8, 8, 6, 0, 0]])
    changed = tgt.clone()
    changed[:, 3:] = torch.tensor([[11, 10, 3], [4, 4, 4]])
    with torch.no_grad():
        before, after = model(SRC[:2], MASK[:2], tgt), model(SRC[:2], MASK[:2], changed)
    torch.testing.assert_close(before[:, :3], after[:, :3], atol=1e-6, rtol=0)
    assert (before[:, 3:] - after[:, 3:]).abs().max() > 1e-3  # the later ones do change


def test_work_per_step_is_linear_with_the_cache_and_quadratic_without(model):
    """Target rows the decoder processes per step: B with the cache, B * t without."""
    fed: list[int] = []
    hook = model.decoder.register_forward_pre_hook(
        lambda mod, args: fed.append(args[0].shape[0] * args[0].shape[1])
    )
    src, mask = SRC[:1].expand(3, -1), MASK[:1].expand(3, -1)  # rows end together
    try:
        kw = dict(max_new_tokens=10, min_length=10)
        model.generate(src, mask, **kw)
        cached, fed[:] = list(fed), []
        model.generate(src, mask, use_cache=False, **kw)
        full = list(fed)
    finally:
        hook.remove()
    assert cached == [3] * 10
    assert full == [3 * (t + 1) for t in range(10)]


class _ChainModel:
    """A toy decoder with fixed transition probabilities P(next | last), no network: the
    classic case where the likeliest first token leads nowhere good."""

    def __init__(self, table: torch.Tensor):
        from types import SimpleNamespace

        self.table = table.log()  # (V, V) log P(next | last)
        V = table.shape[0]
        self.config = SimpleNamespace(
            bos_id=0, eos_id=1, pad_id=V - 1, target_vocab=V, max_positions=64
        )
        self.decoder = SimpleNamespace(start_cache=lambda memory: _ChainCache(0))

    def encode(self, src, src_mask=None):
        return torch.zeros(src.shape[0], 1, 1)

    def decode(self, tgt, memory, tgt_mask=None, memory_mask=None, *, cache=None):
        logits = self.table[tgt[:, -1]][:, None, :]  # (B, 1, V)
        return logits if cache is None else (logits, _ChainCache(cache.length + 1))


class _ChainCache:
    def __init__(self, length):
        self.length = length

    def select(self, rows, memory=True):
        return self


def test_beam_two_beats_greedy_on_a_constructed_chain():
    # From the start: token 2 (p 0.6) then only poor continuations; token 3 (p 0.4) then the
    # end with p 0.9. Greedy takes 2 (score log .6 + log .5 = -1.20 for "2 end");
    # beam 2 finds "3 end" (log .4 + log .9 = -1.02).
    V = 5  # 0 start, 1 end, 2, 3, 4 = padding
    table = torch.full((V, V), 1e-9)
    table[0, 2], table[0, 3] = 0.6, 0.4
    table[2, 1], table[2, 2] = 0.5, 0.5
    table[3, 1], table[3, 3] = 0.9, 0.1
    table = table / table.sum(1, keepdim=True)
    from clearformer.generation import generate

    model = _ChainModel(table)
    src = torch.zeros(1, 1, dtype=torch.long)
    greedy = generate(model, src, max_new_tokens=2, length_penalty=0.0)
    beam = generate(model, src, max_new_tokens=2, num_beams=2, length_penalty=0.0)
    assert greedy.sequences[0].tolist() == [2, 1]
    assert beam.sequences[0].tolist() == [3, 1]
    assert beam.scores[0] > greedy.scores[0]
    assert beam.scores[0].item() == pytest.approx(math.log(0.4) + math.log(0.9), abs=1e-4)


@pytest.mark.parametrize("tie_output", [False, True])
def test_logits_under_reordered_weights_read_the_reordered_table(tie_output):
    """Inside generate's packing, the output projection (a Linear, or the tied embedding
    table) runs on its reordered copy: the same logits as the plain product; outside it, or
    where a gradient is wanted, the plain product runs."""
    from clearformer.fast.reordered_weights import ReorderedWeights, use_reordered_weights
    from clearformer.machine import machine
    from clearformer.routes import projection_route

    if torch.float32 not in machine().reorder:
        pytest.skip("this PyTorch build cannot reorder weights for oneDNN")
    model = _model(vocab=50, tie_output=tie_output)
    projection = model.target_embeddings.word if tie_output else model.output
    hidden = torch.randn(3, 1, 32)
    expected = torch.nn.functional.linear(hidden, projection.weight)
    packing = ReorderedWeights()
    with torch.no_grad(), use_reordered_weights(packing):
        got = model.logits(hidden)
    assert len(packing) == 1  # the projection's copy was made, and read
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert projection_route(hidden, projection).choice == "eager"  # no packing active
    with use_reordered_weights(packing):  # gradients on: the plain product
        route = projection_route(hidden, projection)
        assert route.choice == "eager" and "gradients" in route.reason


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_model_in_training_mode_decodes_without_dropout_and_keeps_its_modes(num_beams):
    # A freshly built model is in training mode; with dropout 0.5 every decoding step would
    # drop activations at random. The call decodes as in eval mode, and each module's own
    # mode comes back after it (a frozen part left in eval stays in eval).
    torch.manual_seed(3)
    config = Seq2SeqConfig(
        src_vocab_size=12,
        d_model=32,
        n_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        dim_mlp=64,
        dropout=0.5,
        max_positions=40,
    )
    model = Seq2SeqTransformer(config)
    frozen = next(iter(model.children()))
    frozen.eval()
    modes = {name: m.training for name, m in model.named_modules()}
    assert any(modes.values()) and not all(modes.values())
    first = model.generate(SRC, MASK, max_new_tokens=10, num_beams=num_beams)
    second = model.generate(SRC, MASK, max_new_tokens=10, num_beams=num_beams)
    assert {name: m.training for name, m in model.named_modules()} == modes
    reference = model.eval().generate(SRC, MASK, max_new_tokens=10, num_beams=num_beams)
    for out in (first, second):
        assert torch.equal(out.sequences, reference.sequences)
        torch.testing.assert_close(out.scores, reference.scores, rtol=0, atol=0)
