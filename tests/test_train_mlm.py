"""The mlm task: BERT's masking rule drawn per (seed, step, example) and never from a global
generator; the head decodes only the masked rows with the tied word embeddings; a resumed run
is bitwise the uninterrupted one; perplexity picks the best checkpoint (lower is better) with
no mode given; RUN/hf/ loads in transformers with the same logits; text files and their
errors."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from clearformer.train import TrainConfig, train
from clearformer.train.masking import MaskingVocab, collate_masked, generator, mask_example
from clearformer.train.precision import Precision
from clearformer.train.step import build_optimizer, train_step
from clearformer.train.tasks import build_task
from clearformer.train.tasks.text_data import read_texts

from .helpers import write_tiny_bert
from .train_helpers import final_weights, same_weights

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: it reads it then

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "red", "blue", "big", "small", "ran"]
WORDS += ["to", "from", "house", "tree", "bird", "sang"]
VOCAB = SPECIALS + WORDS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random 2-layer BERT (width 16) with a WordPiece vocabulary, no masked-LM head."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), VOCAB, n_layers=2)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    gen = random.Random(0)
    lines = [" ".join(gen.choices(WORDS, k=gen.randint(3, 12))) for _ in range(80)]
    path = tmp_path_factory.mktemp("data") / "train.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def config(checkpoint, text_file, **changes) -> TrainConfig:
    base = dict(
        task="mlm",
        train_file=str(text_file),
        model=str(checkpoint),
        steps=12,
        batch_size=8,
        warmup_steps=2,
        eval_every=4,
        checkpoint_every=4,
        log_every=2,
        lr=1e-2,
        eval_fraction=0.25,
    )
    return TrainConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, checkpoint, text_file):
    run = tmp_path_factory.mktemp("mlm") / "whole"
    return run, train(config(checkpoint, text_file), run)


def test_masking_follows_berts_rule():
    vocab = MaskingVocab.of(mask_id=4, special_ids=[0, 1, 2, 3], vocab_size=1000)
    rng = np.random.default_rng(0)
    chosen = fates = 0
    counts = {"mask": 0, "random": 0, "kept": 0}
    for index in range(3000):
        real = rng.integers(5, 1000, rng.integers(1, 30))
        ids = np.concatenate([[2], real, [1], real[:2], [3]])  # [CLS] ... [UNK] ... [SEP]
        masked, positions, labels = mask_example(ids, vocab, generator(0, 0, 0, index))
        n_real = len(ids) - 3
        assert len(positions) == max(1, round(0.15 * n_real))
        assert not set(ids[positions].tolist()) & {0, 1, 2, 3, 4}  # never a special token
        assert np.array_equal(labels, ids[positions])
        untouched = np.setdiff1d(np.arange(len(ids)), positions)
        assert np.array_equal(masked[untouched], ids[untouched])
        counts["mask"] += int((masked[positions] == 4).sum())
        counts["kept"] += int((masked[positions] == ids[positions]).sum())
        chosen += len(positions)
        fates += int(np.isin(masked[positions], [0, 1, 2, 3]).sum())
    counts["random"] = chosen - counts["mask"] - counts["kept"]
    assert fates == 0  # a random replacement is never a special token
    # 80 / 10 / 10 (a random draw equal to the original counts as kept: 1 in 995)
    assert abs(counts["mask"] / chosen - 0.8) < 0.02
    assert abs(counts["random"] / chosen - 0.1) < 0.015
    assert abs(counts["kept"] / chosen - 0.1) < 0.015


def per_example(batch):
    """(masked ids, masked offsets) of each sequence of a packed batch."""
    cu = batch.cu_seqlens.tolist()
    out = []
    for b in range(len(cu) - 1):
        inside = (batch.positions >= cu[b]) & (batch.positions < cu[b + 1])
        out.append(
            (
                batch.input_ids[cu[b] : cu[b + 1]].tolist(),
                (batch.positions[inside] - cu[b]).tolist(),
            )
        )
    return out


def test_masks_are_a_function_of_seed_step_and_example(checkpoint, text_file):
    task = build_task(config(checkpoint, text_file))
    torch.manual_seed(0)
    np.random.seed(0)
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    first = per_example(task.train_batch_at([5, 9, 2, 7], step=3))
    # The global generators are neither read nor moved.
    assert torch.equal(states[0], torch.get_rng_state())
    assert np.array_equal(states[1], np.random.get_state()[1]) and states[2] == random.getstate()
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    # Another order, other batch-mates (a micro-batch, another rank's slice): the same masks.
    again = per_example(task.train_batch_at([7, 2], step=3)) + per_example(
        task.train_batch_at([9, 5], step=3)
    )
    assert again == [first[3], first[2], first[1], first[0]]
    # Another step masks anew; the held-out set is masked the same every time.
    assert per_example(task.train_batch_at([5, 9, 2, 7], step=4)) != first
    one, two = list(task.eval_batches(8)), list(task.eval_batches(8))
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(one, two, strict=True))
    assert all(torch.equal(a.positions, b.positions) for a, b in zip(one, two, strict=True))
    # The loss divides by the masked tokens, known before the draw.
    counted = per_example(task.train_batch_at([5, 9], step=0))
    assert task.scored_positions([5, 9]) == sum(len(p) for _, p in counted)


def test_the_head_decodes_masked_rows_only_with_the_tied_embeddings(checkpoint, text_file):
    task = build_task(config(checkpoint, text_file))
    torch.manual_seed(0)
    model = task.build_model()
    V, D = len(VOCAB), 16
    seen = {}

    def look(head, args):
        seen["rows"], seen["table"] = args[0].shape[0], args[1]

    model.head.register_forward_pre_hook(look)
    table = model.model.embeddings.word.weight
    assert sum(p.shape == (V, D) for p in model.parameters()) == 1  # no decoder of its own
    packed = task.train_batch_at(list(range(8)), step=0)
    logits = model(packed)
    n = len(packed.labels)
    assert logits.shape == (n, V) and seen["rows"] == n < packed.input_ids.shape[0] / 3
    assert seen["table"].data_ptr() == table.data_ptr()
    # Gathering before the projection changes nothing: the full (N, V) logits there agree.
    rows = model.model(packed.input_ids, cu_seqlens=packed.cu_seqlens)
    full = model.head(rows, table)  # (N, V)
    torch.testing.assert_close(logits, full[packed.positions], rtol=0, atol=1e-5)
    # The same texts padded give the same logits.
    examples = [
        mask_example(task.train_ids[i], task.vocab, generator(0, 0, 0, i)) for i in range(8)
    ]
    padded = collate_masked(examples, packed=False, pad_id=0)
    torch.testing.assert_close(model(padded), logits, rtol=0, atol=1e-5)

    # A step trains the one table (as input and output) and keeps it shared; its loss is the
    # mean cross-entropy per masked token.
    before = table.detach().clone()
    optimizer = build_optimizer(model, task.config)
    loss, _ = train_step(
        model,
        task,
        list(range(8)),
        accumulation=2,
        optimizer=optimizer,
        precision=Precision("fp32", torch.device("cpu")),
        scaler=None,
        clip_norm=1.0,
        device=torch.device("cpu"),
    )
    mean = torch.nn.functional.cross_entropy(logits, packed.labels).item()
    assert loss == pytest.approx(mean, rel=1e-5)
    assert not torch.equal(before, model.model.embeddings.word.weight)
    model(packed)
    assert seen["table"].data_ptr() == model.model.embeddings.word.weight.data_ptr()
    assert model.decoder_weight is model.model.embeddings.word.weight


def test_resume_is_bitwise_and_perplexity_picks_the_best(
    tmp_path, whole_run, checkpoint, text_file
):
    run, result = whole_run

    class Stop(Exception):
        pass

    def stop_at_6(event, record):
        if event == "train" and record["step"] >= 6:
            raise Stop

    with pytest.raises(Stop):
        train(config(checkpoint, text_file), tmp_path / "cut", progress=stop_at_6)
    resumed = train(config(checkpoint, text_file), tmp_path / "cut")
    assert resumed.resumed_from == 4
    assert same_weights(final_weights(run), final_weights(tmp_path / "cut"))
    assert (run / "metrics.jsonl").read_text() == (tmp_path / "cut" / "metrics.jsonl").read_text()

    # perplexity = exp(loss); the best is the lowest, with no mode in the config.
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "eval_perplexity" in r]
    for r in evals:
        assert r["eval_perplexity"] == pytest.approx(np.exp(r["eval_loss"]), rel=1e-9)
    best = min(evals, key=lambda r: r["eval_perplexity"])
    assert evals[0]["eval_perplexity"] > best["eval_perplexity"]  # it learns something
    assert (result.metric, result.best, result.best_step) == (
        "perplexity",
        best["eval_perplexity"],
        best["step"],
    )
    assert (run / "checkpoints" / "best").read_text().strip() == f"step-{best['step']:08d}"


def test_the_hugging_face_export_loads_with_the_same_logits(tmp_path, whole_run):
    transformers = pytest.importorskip("transformers")
    from clearformer.interop.hf import find_checkpoint
    from clearformer.train import load_config
    from clearformer.train.tasks.mlm import build_model, export_hf

    run, _ = whole_run
    cfg = load_config(run / "config.toml")
    ours = build_model(cfg, find_checkpoint(cfg.model), weights=False)
    ours.load_state_dict(final_weights(run), strict=True)
    ours.eval()
    ids = torch.tensor([[2, 5, 7, 4, 9, 3, 0], [2, 10, 4, 12, 13, 14, 3]])
    mask = ids != 0
    with torch.no_grad():
        want = ours.head(ours.model(ids, mask), ours.decoder_weight)  # (B, T, V)
    for folder in (run / "hf", export_hf(run, tmp_path / "best", checkpoint="best")):
        hf, info = transformers.AutoModelForMaskedLM.from_pretrained(
            str(folder), output_loading_info=True
        )
        assert type(hf).__name__ == "BertForMaskedLM"
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        with torch.no_grad():
            got = hf.eval()(input_ids=ids, attention_mask=mask.long()).logits
        if folder == run / "hf":
            assert got[mask].abs().max() > 0.5
            torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-4)
        assert (folder / "vocab.txt").is_file()


def test_jsonl_from_scratch_padded_and_a_head_from_a_masked_lm_checkpoint(tmp_path, text_file):
    from safetensors.torch import load_file

    from .test_masked_lm_bert import make_mlm

    pytest.importorskip("transformers")
    make_mlm("bert", tmp_path / "mlm")  # BertForMaskedLM: the task keeps its head
    lines = text_file.read_text().splitlines()
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"body": t}) + "\n" for t in lines), encoding="utf-8")
    cfg = config(tmp_path / "mlm", data, text_field="body", steps=2, eval_every=2)
    task = build_task(cfg)
    stored = load_file(tmp_path / "mlm" / "model.safetensors")
    assert torch.equal(task.build_model().head.bias, stored["cls.predictions.bias"])
    scratch = {"from_scratch": True, "batching": "padded"}
    result = train(TrainConfig(**{**cfg.to_dict(), **scratch}), tmp_path / "run")
    assert result.step == 2 and "eval_perplexity" in result.final
    assert (tmp_path / "run" / "hf" / "config.json").is_file()


def test_text_files_lines_paragraphs_and_errors(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("one two\nthree\n\n  four  \n\n\nfive\nsix\n", encoding="utf-8")
    assert [r.text for r in read_texts(path, "text")] == ["one two", "three", "four", "five", "six"]
    paragraphs = read_texts(path, "text", "paragraph")
    assert [(r.text, r.line) for r in paragraphs] == [
        ("one two three", 1),
        ("four", 4),
        ("five six", 7),
    ]
    (tmp_path / "e.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"e.txt is empty: expected texts"):
        read_texts(tmp_path / "e.txt", "text")
    (tmp_path / "b.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"b.jsonl line 2: the object has no 'text' field"):
        read_texts(tmp_path / "b.jsonl", "text")
    (tmp_path / "u.txt").write_bytes(b"fine\n\xff\n")
    with pytest.raises(ValueError, match=r"u.txt line 2: not UTF-8"):
        read_texts(tmp_path / "u.txt", "text")
    with pytest.raises(ValueError, match=r"train_file must name a .txt or JSONL file"):
        TrainConfig(task="mlm")
