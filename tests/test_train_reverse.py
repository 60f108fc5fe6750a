"""``train --task reverse``: the seed's demo on the trainer. Held-out sequences never occur in
training, and a trained model decodes each row the same in a padded batch as alone (the
origin project's reversal model scored 1.000 batched and 0.16 alone)."""

from __future__ import annotations

import pytest
import torch

from clearformer.train import TrainConfig, train
from clearformer.train.tasks.reverse import ReverseTask, exact_match
from clearformer.train.tasks.seq2seq_data import collate_pairs

from .train_helpers import final_weights


def _config(**changes):
    base = dict(
        task="reverse",
        steps=20,
        batch_size=16,
        warmup_steps=5,
        eval_every=10,
        checkpoint_every=10,
        log_every=5,
        d_model=32,
        dim_mlp=64,
        dropout=0.0,
        reverse_vocab=6,
        reverse_min_length=1,
        reverse_max_length=6,
        reverse_examples=400,
    )
    return TrainConfig(**{**base, **changes})


def test_held_out_sequences_never_occur_in_training():
    task = ReverseTask(_config())
    seen = {tuple(s) for s in task.train_sources}
    assert task.eval_sources and not any(tuple(s) in seen for s in task.eval_sources)


def test_a_held_out_set_with_nothing_left_is_refused_at_once():
    # Two symbols, lengths 1-3: 14 distinct sequences, all drawn by 200 training examples.
    config = _config(reverse_vocab=2, reverse_min_length=1, reverse_max_length=3,
                     reverse_examples=200)  # fmt: skip
    with pytest.raises(ValueError, match="no held-out sequence is left"):
        ReverseTask(config)


def test_teacher_forcing_scores_real_target_positions_only():
    batch = collate_pairs([([3, 4, 5], [5, 4, 3]), ([6], [6])], pad=0, bos=1, eos=2)
    assert batch.tgt_in.tolist() == [[1, 5, 4, 3], [1, 6, 0, 0]]
    assert batch.labels.tolist() == [5, 4, 3, 2, 6, 2]  # target + end, row by row
    assert int(batch.tgt_mask.sum()) == len(batch.labels)


def test_the_training_loss_is_a_mean_per_target_token_like_the_evaluations():
    from clearformer.train.tasks.base import scored_count

    task = ReverseTask(_config())
    for indices in ([0], [3, 1, 4, 1, 5], list(range(16))):
        batch = task.train_batch(indices)
        # The trainer divides the summed cross-entropy by this count; evaluation divides by
        # the number of labels: the same scale only if they agree.
        assert scored_count(task, indices) == len(batch.labels) > len(indices)


def test_a_trained_model_decodes_the_same_batched_and_alone(tmp_path):
    config = _config()
    result = train(config, tmp_path / "run")
    assert "eval_accuracy" in result.final
    task = ReverseTask(config)
    wrapper = task.build_model()
    wrapper.load_state_dict(final_weights(tmp_path / "run"))
    sources = task.eval_sources[:40]
    batched, ours = exact_match(wrapper.model, sources, batch_size=16)
    alone, theirs = exact_match(wrapper.model, sources, one_at_a_time=True)
    assert ours == theirs and batched == alone
    beam, _ = exact_match(wrapper.model, sources, batch_size=16, num_beams=3)
    assert 0.0 <= beam <= 1.0
    assert torch.is_tensor(next(iter(wrapper.state_dict().values())))


def test_generate_command_decodes_a_run_and_names_bad_input(tmp_path, capsys):
    from clearformer.cli import main

    run = tmp_path / "run"
    train(_config(steps=4, eval_every=4, checkpoint_every=4), run)
    assert main(["generate", "--run", str(run), "3 4 5", "6"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("\t" in line for line in lines)
    # A sequence's output does not depend on the other sequences of the call: each runs to
    # its own length + 1, not to the longest's.
    long = " ".join(["4"] * 5)
    for argv in (["6"], ["6", long], [long, "6"]):
        assert main(["generate", "--run", str(run), *argv]) == 0
        out = capsys.readouterr().out.strip().splitlines()
        assert out[argv.index("6")] == lines[1], argv
        ids = out[argv.index("6")].split("\t")[0].split()
        assert len(ids) <= 2  # at most its length + 1 (the end token not printed)
    for argv, said in (
        (["generate", "--run", str(run), "3 x"], "space-separated token ids"),
        (["generate", "--run", str(tmp_path / "none"), "3"], "config.toml is missing"),
        (["generate", "--run", str(run), "99"], "token ids must be in [3, 9)"),
        (["generate", "--run", str(run), "--num-beams", "0", "3"], "--num-beams"),
    ):
        assert main(argv) == 2
        assert said in capsys.readouterr().err
