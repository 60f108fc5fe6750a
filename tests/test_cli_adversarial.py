"""Bad input a user meets on the commands around the encoder: ``generate``, ``translate``,
``train``, ``export`` and ``demo``. Each case is an error of one line naming the argument,
what was expected and what came, given before the work it would spoil, and leaving the files
it names as they were."""

from __future__ import annotations

import re
import shutil

import pytest

from clearformer.cli import main
from clearformer.train import train

from .faults.conftest import WORDS
from .helpers import write_tiny_bert
from .test_train_reverse import _config
from .test_train_translate import TINY, _tsv


def _one_line_error(capsys, argv: list[str], command: str, *fragments: str) -> str:
    """Run the CLI in this process (a traceback would be an exception here) and check it
    ends in one error line holding every fragment, with nothing on stdout."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert out == "", out
    assert err.startswith(f"clearformer {command}: error: "), err
    assert len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def _damaged_copy(run, tmp_path):
    """A copy of ``run`` whose final weights are cut short."""
    copy = tmp_path / "damaged"
    shutil.copytree(run, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return copy


# -- generate ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory):
    """A reversal run of 4 steps (a second or two)."""
    run = tmp_path_factory.mktemp("reverse") / "run"
    config = _config(steps=4, warmup_steps=1, eval_every=4, checkpoint_every=4, log_every=2)
    train(config, run)
    return run


@pytest.fixture
def damaged_reverse_run(reverse_run, tmp_path):
    return _damaged_copy(reverse_run, tmp_path)


def test_generate_names_a_damaged_weights_file(damaged_reverse_run, capsys):
    # Was: safetensors' SafetensorError as a traceback, exit 1.
    _one_line_error(
        capsys,
        ["generate", "--run", str(damaged_reverse_run), "3 4"],
        "generate",
        f"--run {damaged_reverse_run}: cannot read model.safetensors",
        "corrupt or truncated",
    )


def test_generate_names_weights_of_another_shape(reverse_run, tmp_path, capsys):
    # Was: torch's RuntimeError (size mismatch ...) as a traceback, exit 1.
    run = tmp_path / "other"
    shutil.copytree(reverse_run, run)
    config = run / "config.toml"
    config.write_text(config.read_text().replace("d_model = 32", "d_model = 64"))
    _one_line_error(
        capsys,
        ["generate", "--run", str(run), "3 4"],
        "generate",
        f"--run {run}: model.safetensors does not fit its config.toml",
        "size mismatch",
    )


@pytest.mark.parametrize(
    "option,message",
    [
        # Was: 0 read as "not given" (`0 or default`), and decoded with the default.
        (["--max-new-tokens", "0"], "--max-new-tokens must be a positive int, got 0"),
        # Was: checked by generate() after the model loaded, naming max_new_tokens.
        (["--max-new-tokens", "-5"], "--max-new-tokens must be a positive int, got -5"),
        (["--length-penalty", "nan"], "--length-penalty must be a finite number, got nan"),
        (["--length-penalty", "inf"], "--length-penalty must be a finite number, got inf"),
    ],
    ids=["zero-tokens", "negative-tokens", "nan-penalty", "inf-penalty"],
)
def test_generate_checks_its_options_before_reading_the_run(
    damaged_reverse_run, capsys, option, message
):
    # The weights are damaged: an error naming the option proves it came before they were read.
    _one_line_error(
        capsys, ["generate", "--run", str(damaged_reverse_run), *option, "3 4"], "generate", message
    )


def test_generate_refuses_more_new_tokens_than_the_run_has_positions(reverse_run, capsys):
    # Was: clamped to the run's limit without a word, so the output could stop short.
    from clearformer.train.tasks.reverse import build_model
    from clearformer.train.tomlfile import load_config

    # The start token and all but the last new token take the decoder's positions.
    limit = build_model(load_config(reverse_run / "config.toml")).model.config.max_positions
    _one_line_error(
        capsys,
        ["generate", "--run", str(reverse_run), "--max-new-tokens", str(limit + 1), "3 4"],
        "generate",
        f"--max-new-tokens must be at most {limit} for this run (its positions), got {limit + 1}",
    )
    assert main(["generate", "--run", str(reverse_run), "--max-new-tokens", str(limit), "3 4"]) == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("steps = 1.5", "steps must be an int, got 1.5"),
        ('lr = "x"', "lr must be a number, got 'x'"),
    ],
    ids=["int-field", "float-field"],
)
def test_generate_names_the_config_file_of_a_bad_field(
    reverse_run, tmp_path, capsys, line, message
):
    # Was: the field's message alone, which does not say that it came from the run's config.toml.
    run = tmp_path / "bad-config"
    shutil.copytree(reverse_run, run)
    config = run / "config.toml"
    field = line.split(" ", 1)[0]
    text = re.sub(rf"^{field} = .*$", line, config.read_text(), count=1, flags=re.MULTILINE)
    assert line in text
    config.write_text(text)
    _one_line_error(
        capsys, ["generate", "--run", str(run), "3 4"], "generate", f"{config}: {message}"
    )


def test_generate_checks_token_ids_before_reading_the_weights(damaged_reverse_run, capsys):
    _one_line_error(
        capsys,
        ["generate", "--run", str(damaged_reverse_run), "99"],
        "generate",
        "token ids must be in [3, 9) for this run, got [99]",
    )


# -- translate -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("translate")
    data = folder / "pairs.tsv"
    _tsv(data)
    assert main(["train", *TINY, "--train-file", str(data), "--out", str(folder / "run")]) == 0
    return folder / "run"


@pytest.fixture
def damaged_translate_run(translate_run, tmp_path):
    return _damaged_copy(translate_run, tmp_path)


def test_translate_names_a_damaged_weights_file(damaged_translate_run, capsys):
    # Was: safetensors' SafetensorError as a traceback, exit 1.
    _one_line_error(
        capsys,
        ["translate", "--run", str(damaged_translate_run), "ich sehe"],
        "translate",
        f"--run {damaged_translate_run}: cannot read model.safetensors",
        "corrupt or truncated",
    )


def test_translate_names_a_vocabulary_that_is_not_utf8(translate_run, tmp_path, capsys):
    # Was: "'utf-8' codec can't decode byte 0xff in position 0", naming no file.
    run = tmp_path / "run"
    shutil.copytree(translate_run, run)
    (run / "vocabulary.json").write_bytes(b"\xff{}")
    _one_line_error(
        capsys,
        ["translate", "--run", str(run), "ich sehe"],
        "translate",
        f"--run {run}: vocabulary.json is not UTF-8 text (byte offset 0)",
    )


@pytest.mark.parametrize(
    "content,message",
    [
        (b"Ich sehe.\n\xff\xfe\n", "is not valid UTF-8 text: byte 0xff at offset 10 (line 2)"),
        (b"", "is empty: no sentences to translate"),
        (b"ja\n" + b"ja " * 20 + b"\n", "line 2 has 20 words; this run takes at most 8"),
    ],
    ids=["not-utf8", "empty", "too-long"],
)
def test_translate_checks_the_sentences_before_loading_the_model(
    damaged_translate_run, tmp_path, capsys, content, message
):
    # Was: the model was loaded first; with damaged weights the sentences were never read.
    source = tmp_path / "in.txt"
    source.write_bytes(content)
    out = tmp_path / "out.txt"
    argv = ["translate", "--run", str(damaged_translate_run), "--file", str(source)]
    _one_line_error(capsys, [*argv, "--out", str(out)], "translate", f"--file {source}", message)
    assert not out.exists()


def test_translate_says_a_file_argument_is_a_directory(damaged_translate_run, tmp_path, capsys):
    # Was: "--file not found: ." for a folder that plainly exists.
    argv = ["translate", "--run", str(damaged_translate_run), "--file", str(tmp_path)]
    _one_line_error(capsys, argv, "translate", f"--file: {tmp_path} is a directory")


# -- train ---------------------------------------------------------------------------------------
REVERSE = [
    "--task", "reverse", "--steps", "2", "--batch-size", "8", "--warmup-steps", "1",
    "--eval-every", "2", "--checkpoint-every", "2", "--d-model", "16", "--n-heads", "2",
    "--dim-mlp", "32", "--reverse-examples", "100", "-q",
]  # fmt: skip


@pytest.mark.parametrize("flag", ["--lr", "--eps", "--clip-norm", "--weight-decay"])
@pytest.mark.parametrize("value", ["inf", "1e999"])
def test_train_refuses_an_infinite_flag_before_the_run_folder(tmp_path, capsys, flag, value):
    # Was: --lr inf passed the range check (lr > 0), trained every weight to NaN, exit 0;
    # TrainConfig now requires finite numbers, and the CLI names the flag the value came from.
    run = tmp_path / "run"
    name = flag[2:].replace("-", "_")
    _one_line_error(
        capsys,
        ["train", *REVERSE, flag, value, "--out", str(run)],
        "train",
        f"{flag}: {name} must be a finite number",
    )
    assert not run.exists()


def test_train_refuses_an_infinite_field_of_the_config_file(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text("lr = inf\n", encoding="utf-8")  # TOML reads inf (and nan) as floats
    run = tmp_path / "run"
    _one_line_error(
        capsys,
        ["train", *REVERSE, "--config", str(config), "--out", str(run)],
        "train",
        f"{config}: lr must be a finite number",
    )
    assert not run.exists()


# -- export --------------------------------------------------------------------------------------
@pytest.fixture
def onnx_packages():
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name)


def test_export_never_replaces_the_checkpoint_it_reads(onnx_packages, tmp_path, capsys):
    # Was: the export ran and --force replaced the checkpoint's folder with the export, which
    # copies its configs and vocabulary but not model.safetensors: the weights were gone.
    checkpoint = write_tiny_bert(tmp_path / "parent" / "ckpt", WORDS)
    before = {p.name: p.read_bytes() for p in checkpoint.iterdir()}
    for target in (checkpoint, checkpoint.parent):
        _one_line_error(
            capsys,
            ["export", "--model", str(checkpoint), "--onnx", str(target), "--force"],
            "export",
            f"--onnx: {target} holds the checkpoint it exports (--model {checkpoint})",
        )
        assert {p.name: p.read_bytes() for p in checkpoint.iterdir()} == before


def test_export_refuses_an_opset_onnx_does_not_know_before_tracing(onnx_packages, tmp_path, capsys):
    # Was: ten seconds of tracing, then "could not write opset 99", or for a larger one a
    # conversion error advising backend='math'.
    from onnx.defs import onnx_opset_version

    newest = onnx_opset_version()
    for opset in (newest + 1, 10**11):
        _one_line_error(
            capsys,
            ["export", "--model", str(tmp_path / "nowhere"), "--onnx", str(tmp_path / "out")]
            + ["--opset", str(opset)],
            "export",
            f"--opset must be at most {newest} (the newest of the installed onnx), got {opset}",
        )
    assert not (tmp_path / "out").exists()


# -- demo ----------------------------------------------------------------------------------------
def test_demo_refuses_a_model_too_large_to_build(capsys):
    # Was: torch's "can't allocate memory" RuntimeError as a traceback, exit 1 (and a huge
    # --n-layers built modules for minutes).
    _one_line_error(
        capsys,
        ["demo", "--d-model", "1000000"],
        "demo",
        "--d-model 1000000 and --n-layers 2 make about 24,000,000,000,000 parameters",
        "at most 268,435,456",
    )


def test_demo_names_a_seed_out_of_range(capsys):
    # Was: "Overflow when unpacking long long", naming no argument.
    _one_line_error(
        capsys,
        ["demo", "--seed", str(2**64)],
        "demo",
        f"--seed must be an int in [{-(2**63)}, {2**64 - 1}], got {2**64}",
    )
