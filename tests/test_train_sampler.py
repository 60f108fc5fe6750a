"""The bucketed sampler (seeded, resumable, its own generator) and the collators."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from clearformer.train.collate import pack_sequences, pad_sequences, unpack_to_padded
from clearformer.train.sampler import BucketSampler, padding_fraction, random_batches

_RNG = random.Random(0)
LENGTHS = [_RNG.randint(1, 60) for _ in range(257)]


def take(sampler, n):
    return [sampler.next_batch() for _ in range(n)]


def test_every_example_once_per_epoch():
    sampler = BucketSampler(LENGTHS, 16, seed=3, bucket=4)
    for _ in range(3):
        epoch = take(sampler, sampler.batches_per_epoch)
        assert sorted(i for b in epoch for i in b) == list(range(len(LENGTHS)))


@pytest.mark.parametrize("stop", [0, 1, 7, 17, 33, 50])  # 17 batches per epoch: borders too
def test_resume_gives_the_uninterrupted_order(stop):
    uninterrupted = take(BucketSampler(LENGTHS, 16, seed=5, bucket=4), 60)
    first = BucketSampler(LENGTHS, 16, seed=5, bucket=4)
    before = take(first, stop)
    state = first.state_dict()
    take(first, 5)  # the interrupted process went on a little before it died
    second = BucketSampler(LENGTHS, 16, seed=99, bucket=4)  # another seed: the state wins
    second.load_state_dict(state)
    assert before + take(second, 60 - stop) == uninterrupted


def test_state_is_the_epoch_start_and_the_position():
    sampler = BucketSampler(LENGTHS, 16, seed=5)
    start = torch.Generator().manual_seed(5).get_state()
    take(sampler, 3)
    state = sampler.state_dict()
    assert (state["epoch"], state["position"]) == (0, 3)
    assert torch.equal(state["epoch_start_generator"], start)


def test_the_global_generator_is_neither_used_nor_moved():
    torch.manual_seed(1)
    before = torch.get_rng_state()
    a = take(BucketSampler(LENGTHS, 16, seed=5), 30)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(2)  # another global seed changes nothing
    assert take(BucketSampler(LENGTHS, 16, seed=5), 30) == a
    assert take(BucketSampler(LENGTHS, 16, seed=6), 30) != a


def test_bucketing_cuts_padding():
    sampler = BucketSampler(LENGTHS, 16, seed=0, bucket=8)
    bucketed = padding_fraction(sampler.epoch_batches(), LENGTHS)
    shuffled = padding_fraction(random_batches(len(LENGTHS), 16, 0), LENGTHS)
    assert bucketed < shuffled / 2, (bucketed, shuffled)


def test_a_state_of_another_sampler_is_refused():
    state = BucketSampler(LENGTHS, 16, seed=0).state_dict()
    with pytest.raises(ValueError, match=r"\(batch_size, bucket, examples\)"):
        BucketSampler(LENGTHS, 8, seed=0).load_state_dict(state)


def test_batch_larger_than_the_data_is_an_error():
    with pytest.raises(ValueError, match="batch_size must be at most the number of examples"):
        BucketSampler([3, 4], 3, seed=0)


def test_packed_and_padded_collators_hold_the_same_sequences():
    seqs = [[5, 6, 7], [8], [9, 10]]
    packed = pack_sequences(seqs, [0, 1, 2])
    assert packed.input_ids.tolist() == [5, 6, 7, 8, 9, 10]  # (N,)
    assert packed.cu_seqlens.tolist() == [0, 3, 4, 6] and packed.cu_seqlens.dtype == torch.int32
    assert packed.max_seqlen == 3 and packed.padding_fraction == 0.0
    padded = pad_sequences(seqs, [0, 1, 2], pad_id=0)
    assert padded.input_ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert padded.attention_mask.sum().item() == 6
    assert padded.padding_fraction == pytest.approx(3 / 9)
    again = unpack_to_padded(packed, pad_id=0)
    assert torch.equal(again.input_ids, padded.input_ids)
    assert torch.equal(again.attention_mask, padded.attention_mask)


def test_collators_refuse_empty_input():
    with pytest.raises(ValueError, match="at least one token"):
        pack_sequences([[1], []], [0, 1])
    with pytest.raises(ValueError, match="one label per sequence"):
        pad_sequences([[1]], [0, 1], 0)


def test_duplicate_free_batches_hold_no_text_twice_and_resume_exactly():
    from clearformer.train.duplicate_free_sampler import DuplicateFreeSampler

    # Rows share positives in pairs: a plain shuffle would put some pairs in one batch.
    texts = [(f"anchor {i}", f"positive {i // 2}") for i in range(40)]
    sampler = DuplicateFreeSampler(texts, 8, seed=3)
    taken = [sampler.next_batch() for _ in range(12)]  # over two epochs
    for batch in taken:
        assert len(batch) == 8
        words = [t for i in batch for t in texts[i]]
        assert len(words) == len(set(words))
    again = DuplicateFreeSampler(texts, 8, seed=3)
    for _ in range(5):
        again.next_batch()
    resumed = DuplicateFreeSampler(texts, 8, seed=3)
    resumed.load_state_dict(again.state_dict())
    assert [resumed.next_batch() for _ in range(7)] == taken[5:]
    with pytest.raises(ValueError, match=r"\(batch_size, examples\)"):
        DuplicateFreeSampler(texts, 4, seed=3).load_state_dict(again.state_dict())


def test_waiting_examples_that_fill_a_batch_close_it():
    """Examples 1 and 2 wait for example 0's batch to close and then fill the next one by
    themselves: that batch closes too, and the epoch goes on (it once grew past the batch size
    and took nothing more)."""
    from clearformer.train.duplicate_free_sampler import duplicate_free_batches

    rows = [{"a", "p", "q"}, {"b", "p"}, {"c", "q"}, {"d", "e"}, {"f", "g"}, {"h", "i"}]
    rows += [{"j", "k"}, {"l", "m"}]
    texts = [frozenset(r) for r in rows]
    assert duplicate_free_batches(range(8), texts, 2) == [[0, 3], [1, 2], [4, 5], [6, 7]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sets(st.integers(0, 40), min_size=1, max_size=4), min_size=1, max_size=80),
    st.integers(1, 8),
    st.randoms(use_true_random=False),
)
def test_duplicate_free_batches_are_full_distinct_and_leave_out_little(rows, batch_size, rng):
    """Every batch is full and holds no text twice, no example comes twice in an epoch, and
    an example is left out only while it meets a text of the open batch or of a waiting
    example taken before it, or the data ran out before its batch filled."""
    from clearformer.train.duplicate_free_sampler import duplicate_free_batches

    texts = [frozenset(f"t{x}" for x in r) for r in rows]
    order = list(range(len(texts)))
    rng.shuffle(order)
    batches = duplicate_free_batches(order, texts, batch_size)
    used = [i for b in batches for i in b]
    assert len(used) == len(set(used))
    for batch in batches:
        assert len(batch) == batch_size
        words = [t for i in batch for t in texts[i]]
        assert len(words) == len(set(words))
    left = [i for i in order if i not in set(used)]
    # Whatever is left cannot hold a whole batch of examples that share no text with each
    # other and came in order: a greedy pass over them, as the sampler's next batch would be
    # filled, closes no batch.
    open_batch: list[int] = []
    for i in left:
        if not any(texts[i] & texts[j] for j in open_batch):
            open_batch.append(i)
    assert len(open_batch) < batch_size
    if all(len(t) == 1 for t in texts) and len({t for t in texts}) == len(texts):
        assert len(left) == len(texts) % batch_size  # nothing in common: only the remainder


def test_an_epoch_that_cuts_no_batch_is_skipped_and_too_many_are_an_error():
    from clearformer.train.duplicate_free_sampler import DuplicateFreeSampler

    texts = [(f"anchor {i}", f"positive {i}") for i in range(6)]
    sampler = DuplicateFreeSampler(texts, 3, seed=0)
    made = iter([[], [], [[0, 1, 2]]])
    sampler._make_epoch = lambda: next(made)
    sampler.position = sampler.batches_per_epoch  # the first epoch taken
    epoch = sampler.epoch
    assert sampler.next_batch() == [0, 1, 2] and sampler.epoch == epoch + 3
    sampler._make_epoch = lambda: []
    with pytest.raises(ValueError, match="epochs in a row cut no batch of batch_size 3"):
        sampler.next_batch()


def test_texts_that_differ_only_by_white_space_never_share_a_batch():
    """The tokenizer reads "a text " as "a text": in one batch, each would be the other's
    in-batch negative, a text taught not to be relevant to itself."""
    from clearformer.train.duplicate_free_sampler import DuplicateFreeSampler

    texts = [(f"anchor {i}", "one article" + " " * (i % 2)) for i in range(4)]
    texts += [(f"other {i}", f"article {i}") for i in range(8)]
    sampler = DuplicateFreeSampler(texts, 4, seed=0)
    for _ in range(3 * sampler.batches_per_epoch):
        batch = sampler.next_batch()
        shared = [i for i in batch if texts[i][1].strip() == "one article"]
        assert len(shared) <= 1, batch
