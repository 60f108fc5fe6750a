"""TrainConfig: every impossible value named before any work; TOML out and back; the CLI's
flags, --config and --print-config; bad input exits non-zero with one line, no traceback."""

from __future__ import annotations

import pytest

from clearformer.train import TrainConfig, dump_toml, load_config
from clearformer.train.config import check_against_data

from .train_helpers import run_train, tiny_flags


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lr": -1e-3}, "lr must be a finite number > 0.0, got -0.001"),
        ({"lr": float("inf")}, "lr must be a finite number > 0.0, got inf"),
        ({"lr": float("nan")}, "lr must be a finite number > 0.0, got nan"),
        ({"eps": float("inf")}, "eps must be a finite number > 0.0, got inf"),
        ({"accumulation": 0}, "accumulation must be a positive int, got 0"),
        ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
        ({"steps": 1.5}, "steps must be an int, got 1.5"),
        ({"checkpointing": "yes"}, "checkpointing must be a bool (true or false), got 'yes'"),
        ({"decay": "exp"}, "decay must be one of ('cosine', 'linear', 'constant'), got 'exp'"),
        ({"beta2": 1.0}, "beta2 must be a number in [0.0, 1.0), got 1.0"),
        ({"clip_norm": -1}, "clip_norm must be a finite number >= 0.0, got -1.0"),
        ({"weight_decay": float("inf")}, "weight_decay must be a finite number >= 0.0"),
        ({"dropout": 1.0}, "dropout must be a number in [0.0, 1.0), got 1.0"),
        ({"d_model": 30, "n_heads": 4}, "d_model must be divisible by n_heads=4, got 30"),
        ({"accumulation": 5, "batch_size": 4}, "accumulation must be at most batch_size=4"),
        ({"metric": "loss", "mode": "max"}, "mode must be 'min' (or '') for metric='loss'"),
        ({"metric": "perplexity", "mode": "max"}, "for metric='perplexity'"),
        ({"task": "classify"}, "train_file must name a CSV or JSONL file"),
        ({"train_file": "x.csv"}, "train_file is for task='classify', 'mlm' or 'translate'"),
        ({"task": "reverse", "eval_file": "x.tsv"}, "task='reverse' uses generated sequences"),
        ({"warmup_steps": -1}, "warmup_steps must be an int >= 0, got -1"),
        # The learning rate would never reach lr.
    ],
)
def test_impossible_values_name_the_field(changes, message):
    with pytest.raises((ValueError, TypeError)) as info:
        TrainConfig(**changes)
    assert message in str(info.value)


def test_a_batch_larger_than_the_data_is_named():
    with pytest.raises(ValueError, match=r"batch_size must be at most the training set's size"):
        check_against_data(TrainConfig(batch_size=2000), 1438)


def test_unknown_keys_are_named_with_a_suggestion():
    with pytest.raises(ValueError, match=r"unknown field 'lrr' \(did you mean 'lr'\?\)"):
        TrainConfig.from_dict({"lrr": 1e-3}, source="run.toml")


def test_toml_round_trip(tmp_path):
    config = TrainConfig(
        task="classify",
        train_file="x.csv",
        lr=3e-5,
        steps=7,
        warmup_steps=2,
        decay="linear",
        checkpointing=True,
        metric="",
        model='dir with "quotes" and \\ slash',
        min_delta=1e-9,
    )
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(config))
    assert load_config(path) == config


def test_toml_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("lr = \n")
    with pytest.raises(ValueError, match="bad.toml is not valid TOML"):
        load_config(path)
    path.write_text("[optim]\nlr = 1.0\n")
    with pytest.raises(ValueError, match=r"one flat table.*\[optim\]"):
        load_config(path)
    path.write_text("steps = 10\nbatchsize = 3\n")
    with pytest.raises(ValueError, match=r"bad.toml: unknown field 'batchsize'"):
        load_config(path)


def test_print_config_loads_back_to_the_same_run(tmp_path):
    flags = tiny_flags(lr=2e-3, decay="linear")
    printed = run_train(*flags, "--print-config")
    assert printed.returncode == 0, printed.stderr
    path = tmp_path / "resolved.toml"
    path.write_text(printed.stdout)
    # The file alone resolves to the config the flags gave ...
    from_file = run_train("--config", str(path), "--print-config")
    assert from_file.stdout == printed.stdout
    # ... and flags on top of a file win over it.
    on_top = run_train("--config", str(path), "--lr", "0.5", "--print-config")
    assert "lr = 0.5" in on_top.stdout and 'decay = "linear"' in on_top.stdout


def test_cli_records_the_resolved_config_and_the_overrides(tmp_path):
    import json

    run = tmp_path / "run"
    result = run_train(*tiny_flags(steps=10), "--out", str(run), "-q")
    assert result.returncode == 0, result.stderr
    from .train_helpers import tiny

    assert load_config(run / "config.toml") == tiny(steps=10)
    invocation = json.loads((run / "invocations.jsonl").read_text().splitlines()[0])
    assert invocation["overrides"]["steps"] == 10
    assert invocation["overrides"]["d_model"] == 16
    assert "lr" not in invocation["overrides"]  # not given: the default
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_accuracy" in r for r in records)
    assert (run / "loss.png").is_file()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--lr", "-0.1"], "--lr: lr must be a finite number > 0.0, got -0.1"),
        (["--accumulation", "0"], "accumulation must be a positive int, got 0"),
        (
            ["--batch-size", "5000"],
            "batch_size must be at most the training set's size (1438 examples), got 5000",
        ),
        (["--precision", "fp16", "--device", "cpu"], "precision='fp16' needs a CUDA GPU"),
        (["--task", "classify"], "train_file must name a CSV or JSONL file"),
        (["--config", "missing.toml"], "config file not found: missing.toml"),
        (["--metric", "f1"], "metric must be one of ('loss', 'accuracy'), got 'f1'"),
        ([], "--out RUN is required"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, argv, said):
    out = [] if argv == [] else ["--out", str(tmp_path / "run")]
    result = run_train(*argv, *out)
    assert result.returncode == 2, result.stderr
    assert said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before any work


def test_cli_unknown_toml_key_exits_2(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("stepz = 3\n")
    result = run_train("--config", str(path), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "unknown field 'stepz' (did you mean 'steps'?)" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_refuses_a_folder_of_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = run_train(*tiny_flags(), "--out", str(tmp_path))
    assert result.returncode == 2
    assert "is a folder of other files" in result.stderr


def test_a_field_added_since_a_checkpoint_counts_as_its_default():
    from clearformer.train.config import changed_fields

    mlm = {"task": "mlm", "train_file": "texts.txt"}
    old = TrainConfig(**mlm).to_dict()
    del old["text_unit"]  # a run written before the field existed
    assert changed_fields(old, TrainConfig(**mlm)) == {}
    assert changed_fields(old, TrainConfig(**mlm, text_unit="paragraph")) == {
        "text_unit": ("line", "paragraph")
    }


def test_the_learning_rate_defaults_to_the_tasks_own():
    # contrastive and rerank fine-tune a pretrained model: sentence-transformers' 5e-5, not
    # the from-scratch 1e-3 that wrecks a pretrained embedder; a given lr is kept as given.
    assert TrainConfig().lr == 1e-3
    assert TrainConfig(task="contrastive", train_file="x.jsonl").lr == 5e-5
    assert TrainConfig(task="rerank", train_file="x.jsonl").lr == 5e-5
    assert TrainConfig(task="contrastive", train_file="x.jsonl", lr=2e-4).lr == 2e-4
    # What a run records is the value it trained with: the same config again, as resolved.
    resolved = TrainConfig(task="rerank", train_file="x.jsonl")
    assert TrainConfig.from_dict(resolved.to_dict()) == resolved
