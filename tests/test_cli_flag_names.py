"""Errors name what the user typed, before any work: the export API's bool flags, the beam width
of generate / translate, explain's ``--json`` value, and the flags of demo, explain --random,
bench, rerank and export; and docs/architecture.md lists the commands ``--help`` lists."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

from clearformer.cli import build_parser, main
from clearformer.export import ExportableEncoder, export_onnx, export_program
from clearformer.export import onnx as export_onnx_module
from clearformer.train import train
from clearformer.train.tasks.translate import VOCABULARY_FILE
from clearformer.train.tasks.words import load_vocabularies

from .test_export import ort, tiny_encoder  # noqa: F401  (fixtures)
from .test_train_reverse import _config as reverse_config
from .test_train_translate import trained  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[1]


def _one_line_error(capsys, argv: list[str], command: str) -> str:
    """Run the CLI: exit 2, nothing on stdout, one error line naming the command; the line."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert out == "" and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"clearformer {command}: error: "), err
    return lines[0]


# -- 2: the export API's bool flags ----------------------------------------------------------


@pytest.fixture
def no_work(monkeypatch):
    """Make the first step of an export fail loudly: a check must come before it."""

    def began(*args, **kwargs):
        raise AssertionError("the export began before its arguments were checked")

    monkeypatch.setattr(export_onnx_module, "require_packages", began)
    monkeypatch.setattr(torch.export, "export", began)


@pytest.mark.parametrize("flag", ["pooling", "verify", "overwrite"])
def test_export_onnx_refuses_a_non_bool_flag_before_any_work(no_work, tmp_path, flag):
    # overwrite="no" used to be truthy: it replaced an earlier export.
    target = tmp_path / "earlier"
    target.mkdir()
    (target / "model.onnx").write_bytes(b"the earlier export")
    with pytest.raises(TypeError, match=rf"^{flag} must be a bool \(True or False\), got 'no'$"):
        export_onnx(None, target, **{flag: "no"})
    assert [p.name for p in tmp_path.iterdir()] == ["earlier"]
    assert (target / "model.onnx").read_bytes() == b"the earlier export"


@pytest.mark.parametrize("flag", ["normalize", "strict"])
def test_export_program_refuses_a_non_bool_flag_before_tracing(no_work, tiny_encoder, flag):  # noqa: F811
    with pytest.raises(TypeError, match=rf"^{flag} must be a bool \(True or False\), got 'no'$"):
        export_program(tiny_encoder.model, pooling="mean", **{flag: "no"})


def test_exportable_encoder_refuses_a_non_bool_normalize(tiny_encoder):  # noqa: F811
    with pytest.raises(TypeError, match="normalize must be a bool"):
        ExportableEncoder(tiny_encoder.model, pooling="mean", normalize="no")


# -- 6: the beam width of generate and translate ---------------------------------------------


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory) -> Path:
    """A reversal run of 4 steps: ids 0-2 are specials, 3-8 its 6 symbols (9 target tokens)."""
    run = tmp_path_factory.mktemp("reverse") / "run"
    train(reverse_config(steps=4, eval_every=4, checkpoint_every=4), run)
    return run


@pytest.mark.parametrize("beams", [10, 10**12])
def test_generate_refuses_more_beams_than_target_tokens(capsys, reverse_run, beams):
    argv = ["generate", "--run", str(reverse_run), "3 4 5", "--num-beams", str(beams)]
    line = _one_line_error(capsys, argv, "generate")
    assert line.endswith(
        f"--num-beams must be at most 9 for this run (its target vocabulary), got {beams}"
    )


def test_generate_takes_as_many_beams_as_target_tokens(capsys, reverse_run):
    assert main(["generate", "--run", str(reverse_run), "3 4 5", "--num-beams", "9"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def _target_tokens(run: Path) -> int:
    text = (run / VOCABULARY_FILE).read_text(encoding="utf-8")
    return len(load_vocabularies(text, str(run / VOCABULARY_FILE))[1])


@pytest.mark.parametrize("source", [["Ich sehe Brot."], ["--bleu"]], ids=["sentence", "bleu"])
@pytest.mark.parametrize("huge", [False, True], ids=["one-more", "huge"])
def test_translate_refuses_more_beams_than_target_words(capsys, trained, source, huge):  # noqa: F811
    run, _ = trained
    bound = _target_tokens(run)
    beams = 10**12 if huge else bound + 1
    argv = ["translate", "--run", str(run), *source, "--beams", str(beams)]
    line = _one_line_error(capsys, argv, "translate")
    assert line.endswith(
        f"--beams must be at most {bound} for this run (its target vocabulary), got {beams}"
    )


def test_translate_takes_as_many_beams_as_target_words(capsys, trained):  # noqa: F811
    run, _ = trained
    beams = str(_target_tokens(run))
    assert main(["translate", "--run", str(run), "Ich sehe Brot.", "--beams", beams]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


# -- 9: explain --json with a text for its value ---------------------------------------------

TOY = ["explain", "--random", "--d-model", "32", "--n-heads", "4", "--n-layers", "1"]


def test_explain_json_before_the_texts_is_refused_and_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [*TOY, "--json", "The cat sat.", "Dogs bark."]
    line = _one_line_error(capsys, argv, "explain")
    assert "--json must be a FILE ending in .json or - for stdout, got 'The cat sat.'" in line
    assert "put --json after them" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["-", "trace.json", "TRACE.JSON"])
def test_explain_json_takes_a_json_file_or_stdout(capsys, tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    assert main([*TOY, "The cat sat.", "--json", value]) == 0
    out = capsys.readouterr().out
    if value == "-":
        assert out.startswith("{"), out
    else:
        assert out == "" and (tmp_path / value).is_file()


# -- 10: the flag typed, not the config field ------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--n-heads", "3"], "--d-model must be divisible by --n-heads"),
        (["demo", "--n-heads", "0"], "--n-heads must be positive, got 0"),
        (["demo", "--d-model", "-4"], "--d-model must be positive, got -4"),
        (["demo", "--n-layers", "0"], "--n-layers must be positive, got 0"),
        (
            ["explain", "--random", "--d-model", "63", "--n-heads", "4", "x"],
            "--d-model must be divisible by --n-heads (each head takes an equal share), "
            "got --d-model 63 and --n-heads 4",
        ),
        (["explain", "--random", "--n-heads", "0", "x"], "--n-heads must be positive, got 0"),
    ],
)
def test_model_sizes_name_their_flags(capsys, argv, message):
    line = _one_line_error(capsys, argv, argv[0])
    assert message in line and "EncoderConfig" not in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch", "0"], "--batch: batch must be a positive int, got 0"),
        (["--threads", "0"], "--threads: threads must be a positive int, got 0"),
        (["--repeats", "0"], "--repeats: repeats must be a positive int, got 0"),
        (["--quick", "--repeats", "0"], "--repeats: repeats must be a positive int, got 0"),
        (["--seqlen", "0"], "--seqlen: seqlen must be a positive int, got 0"),
        (["--long-seqlens", "512,0"], "--long-seqlens: long_seqlens must be positive ints"),
        (["--warmup", "-1"], "--warmup: warmup must be an int >= 0, got -1"),
        (["--min-length", "0"], "--min-length: min_length must be a positive int, got 0"),
        (["--train-batch", "-3"], "--train-batch: train_batch must be a positive int, got -3"),
        (["--sizes", "foo"], "--sizes: size must be one of"),
        (["--sections", "speed"], "--sections: sections must be among"),
        # The message names two fields: the flag typed is the one to change.
        (["--max-length", "10"], "--max-length: min_length must be <= max_length, got 16 > 10"),
        (
            ["--min-length", "300", "--max-length", "200"],
            "--min-length, --max-length: min_length must be <= max_length",
        ),
    ],
)
def test_bench_options_name_their_flags(capsys, argv, message):
    line = _one_line_error(capsys, ["bench", *argv], "bench")
    assert line.startswith(f"clearformer bench: error: {message}"), line


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("a cat\na dog\n", encoding="utf-8")
    return path


def test_rerank_names_model_for_a_missing_directory(capsys, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["rerank", "x", "--corpus", str(corpus), "--model", "nope"]
    line = _one_line_error(capsys, argv, "rerank")
    assert line.endswith("error: --model: checkpoint directory not found: nope"), line


def test_rerank_names_model_for_a_file(capsys, corpus, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    argv = ["rerank", "x", "--corpus", str(corpus), "--model", str(afile)]
    line = _one_line_error(capsys, argv, "rerank")
    assert line.endswith(
        f"error: --model: checkpoint path must be a directory, got a file: {afile}"
    )


def test_export_names_model_for_a_file(ort, capsys, tmp_path):  # noqa: F811
    afile = tmp_path / "afile"
    afile.write_text("x")
    argv = ["export", "--onnx", str(tmp_path / "x"), "--model", str(afile)]
    line = _one_line_error(capsys, argv, "export")
    assert line.endswith(
        f"error: --model: checkpoint path must be a directory, got a file: {afile}"
    )
    assert not (tmp_path / "x").exists()


# -- 11: docs/architecture.md lists the commands of --help -----------------------------------


def test_architecture_lists_the_commands_of_help():
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    row = next(
        line
        for line in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| `cli.py`, `commands/` |")
    )
    listed = re.search(r"`clearformer ([^`]*)`", row).group(1)
    assert [name.strip() for name in listed.split("|")] == list(sub.choices)
