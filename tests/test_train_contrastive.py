"""``clearformer train --task contrastive`` end to end on a tiny sentence-transformers model:
evaluated before and during training, exported as a directory sentence-transformers loads to
the same embeddings, resumed bitwise after SIGKILL, two gloo processes equal to one, and bad
rows refused with the file, line and field."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from .contrastive_helpers import write_retrieval_data, write_sentence_transformer
from .helpers import torchrun_command
from .train_helpers import env, final_weights, run_train, same_weights

pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("contrastive")
    model = write_sentence_transformer(root / "st", dropout=0.1)
    pairs, beir = write_retrieval_data(root / "data")
    return {"model": model, "pairs": pairs, "beir": beir, "root": root}


def flags(data, **changes) -> list[str]:
    values = {
        "task": "contrastive",
        "train-file": data["pairs"],
        "model": data["model"],
        "steps": 6,
        "batch-size": 8,
        "mini-batch-size": 5,
        "warmup-steps": 1,
        "lr": 1e-3,
        "eval-every": 3,
        "checkpoint-every": 2,
        "log-every": 1,
        **changes,
    }
    out = []
    for key, value in values.items():
        if value is None:
            continue
        out += [f"--{key}", str(value)]
    return out


@pytest.fixture(scope="module")
def whole_run(data, tmp_path_factory):
    run = tmp_path_factory.mktemp("whole") / "run"
    result = run_train(*flags(data, **{"eval-data": data["beir"]}), "--out", str(run), "-q")
    assert result.returncode == 0, result.stderr
    return run


def test_evaluated_before_training_and_the_best_model_exported(whole_run):
    records = [json.loads(x) for x in (whole_run / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "eval_ndcg@10" in r]
    assert [r["step"] for r in evaluations] == [0, 3, 6]
    assert evaluations[0]["best"] is False  # the base model: no checkpoint of it
    summary = json.loads((whole_run / "summary.json").read_text())
    card = (whole_run / "model" / "README.md").read_text()
    assert f"checkpoints/step-{summary['best_step']:08d}"[-13:] in card or "step-" in card
    for record in evaluations:
        assert f"| {record['step']} | {record['eval_ndcg@10']:.4f} |" in card


def test_sentence_transformers_loads_the_export_to_clearformers_embeddings(whole_run, data):
    from sentence_transformers import SentenceTransformer

    from clearformer import TextEncoder

    texts = [json.loads(x)["positive"] for x in data["pairs"].read_text().splitlines()]
    theirs = SentenceTransformer(str(whole_run / "model"), device="cpu").encode(texts)
    ours = TextEncoder.from_pretrained(whole_run / "model").encode(texts)
    assert np.abs(theirs - ours).max() <= 1e-6
    # The export holds trained weights, not the base model's.
    base = TextEncoder.from_pretrained(data["model"]).encode(texts)
    assert np.abs(base - ours).max() > 1e-3


def test_the_export_is_the_best_checkpoints_weights(whole_run):
    from clearformer.train import checkpoint as ckpt

    best = ckpt.read_pointer(whole_run / "checkpoints", ckpt.BEST)
    weights = ckpt.load_checkpoint(whole_run / "checkpoints" / best).weights
    exported = load_file(whole_run / "model" / "model.safetensors")
    # The encoder's first word-embedding table under the Hugging Face name.
    name = next(k for k in exported if k.endswith("word_embeddings.weight"))
    ours = next(v for k, v in weights.items() if k.endswith("embeddings.word.weight"))
    assert torch.equal(exported[name], ours)


PAUSED = """
import sys
from clearformer.train.tasks.contrastive import ContrastiveTask
step = ContrastiveTask.train_step
def held(self, *args, **kwargs):
    if kwargs["step"] == 3:
        print("PAUSED", file=sys.stderr, flush=True)
        sys.stdin.readline()
    return step(self, *args, **kwargs)
ContrastiveTask.train_step = held
from clearformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigkill_mid_run_then_resume_is_bitwise(data, whole_run, tmp_path):
    # The same flags as whole_run: that run is the uninterrupted one to compare with.
    argv = flags(data, **{"eval-data": data["beir"]})
    run = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-c", PAUSED, "train", *argv, "--out", str(run), "-q"],
        env=env(),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in process.stderr:
            if line.strip() == "PAUSED":
                break
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        process.kill()
    assert not (run / "model").exists()  # killed before the end
    result = run_train(*argv, "--out", str(run), "-q")
    assert result.returncode == 0, result.stderr
    assert same_weights(final_weights(run), final_weights(whole_run))
    assert (run / "metrics.jsonl").read_text() == (whole_run / "metrics.jsonl").read_text()


def test_two_gloo_processes_equal_one(data, tmp_path):
    model = write_sentence_transformer(tmp_path / "st0", dropout=0.0)
    argv = flags({**data, "model": model}, steps=3, eps=1e-4, **{"checkpoint-every": 3})
    one = tmp_path / "one"
    assert run_train(*argv, "--distributed", "ddp", "--out", str(one), "-q").returncode == 0
    two = tmp_path / "two"
    command = torchrun_command(
        2,
        "-m",
        "clearformer.cli",
        "train",
        *argv,
        "--distributed",
        "ddp",
        "--out",
        str(two),
        "-q",
    )
    result = subprocess.run(
        command, env=env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = final_weights(one), final_weights(two)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)
    losses = [
        [json.loads(x).get("loss") for x in (run / "metrics.jsonl").read_text().splitlines()]
        for run in (one, two)
    ]
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)


def test_two_processes_whose_text_counts_differ_equal_one(data, tmp_path):
    """Row 0 alone has negatives, so in its step one rank embeds more texts than
    --mini-batch-size (GradCache) and the other fewer: both must take GradCache's passes (the
    plain step's collectives would not meet the other rank's), and the run equals one
    process."""
    rows = [json.loads(x) for x in data["pairs"].read_text().splitlines()]
    others = [r["negative"][0] for r in rows[1:4]]
    rows = [{**rows[0], "negative": others}] + [
        {"anchor": r["anchor"], "positive": r["positive"]} for r in rows[1:]
    ]
    pairs = tmp_path / "uneven.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = write_sentence_transformer(tmp_path / "st0", dropout=0.0)
    changes = {"train-file": pairs, "mini-batch-size": 8, "checkpoint-every": 3}
    argv = flags({**data, "model": model}, steps=3, eps=1e-4, **changes)
    one = tmp_path / "one"
    assert run_train(*argv, "--distributed", "ddp", "--out", str(one), "-q").returncode == 0
    two = tmp_path / "two"
    command = torchrun_command(
        2, "-m", "clearformer.cli", "train", *argv, "--distributed", "ddp", "--out", str(two), "-q"
    )
    result = subprocess.run(
        command, env=env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = final_weights(one), final_weights(two)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)


BAD_ROWS = {
    "missing": ('{"anchor": "w1 w2"}', "field 'positive' is missing"),
    "empty": ('{"anchor": "w1", "positive": "  "}', "field 'positive' is empty"),
    "not a string": ('{"anchor": 3, "positive": "w1"}', "field 'anchor' must be a string"),
    "anchor is positive": ('{"anchor": "w1 w2", "positive": "w1 w2"}', "anchor equals"),
    "bad negative": ('{"anchor": "w1", "positive": "w2", "negative": [""]}', "'negative' item 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows_are_one_line_errors_naming_file_line_and_field(data, tmp_path, case):
    row, fragment = BAD_ROWS[case]
    good = data["pairs"].read_text().splitlines()[:3]
    bad = tmp_path / "pairs.jsonl"
    bad.write_text("\n".join([*good, row]) + "\n")
    run = tmp_path / "run"
    result = run_train(*flags(data, **{"train-file": bad}), "--out", str(run))
    assert result.returncode == 2, result.stderr
    assert f"{bad}, line 4" in result.stderr and fragment in result.stderr, result.stderr
    # One error line (the lines before it say what the command was starting to do).
    errors = [x for x in result.stderr.splitlines() if x.startswith("clearformer train: error:")]
    assert len(errors) == 1 and fragment in errors[0] and "Traceback" not in result.stderr
    assert not run.exists()  # nothing half-written


def test_a_batch_larger_than_the_data_is_refused(data, tmp_path):
    result = run_train(*flags(data, **{"batch-size": 500}), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "batch_size must be at most" in result.stderr
    assert not (tmp_path / "run").exists()


def test_csv_and_tsv_rows_read_as_jsonl_rows(tmp_path):
    from clearformer.train.pairs import read_pairs

    (tmp_path / "rows.tsv").write_text(
        "anchor\tpositive\tnegative_1\tnegative_2\nw1 w2\tw1 w3\tw9\tw8\nw4\tw4 w5\t\t\n"
    )
    (tmp_path / "rows.csv").write_text("anchor,positive,negative\nw1 w2,w1 w3,w9\n")
    tsv = read_pairs(tmp_path / "rows.tsv")
    assert [(p.anchor, p.positive, p.negatives) for p in tsv] == [
        ("w1 w2", "w1 w3", ("w9", "w8")),
        ("w4", "w4 w5", ()),
    ]
    assert read_pairs(tmp_path / "rows.csv")[0].negatives == ("w9",)
    (tmp_path / "bad.csv").write_text("query,positive\nw1,w2\n")
    with pytest.raises(ValueError, match=r"bad.csv, line 1: the header has no 'anchor' column"):
        read_pairs(tmp_path / "bad.csv")


@pytest.mark.parametrize("task", ["contrastive", "rerank"])
def test_max_length_is_honoured_above_the_length_the_files_record(data, task):
    # The files record the length the model was last used at (here sentence-transformers'
    # max_seq_length 32; positions 64): a run asked for 48 tokens trains on 48, as asked,
    # and only the position table bounds it.
    from clearformer.train import TrainConfig
    from clearformer.train.tasks import build_task

    def length(asked):
        config = TrainConfig(task=task, train_file=str(data["pairs"]), model=str(data["model"]),
                             max_length=asked, batch_size=4)  # fmt: skip
        return build_task(config).tokenizer.max_length

    assert (length(48), length(16), length(100)) == (48, 16, 64)
