"""``clearformer bench`` never overwrites results it was not told to: by default it writes a
new folder under the current directory; an ``--out`` holding outputs of the same name, or
naming a file, is refused before any section runs (unless ``--force``); files are written
atomically. The suite itself is replaced by a stand-in: these tests are about the outputs."""

from __future__ import annotations

import json

import pytest

from clearformer.bench import suite
from clearformer.cli import main

QUICK = ["bench", "--sizes", "minilm", "--sections", "kernels", "--no-chart"]


@pytest.fixture
def stand_in(monkeypatch):
    """run_suite replaced: records that it ran, reports one section, returns its results."""
    ran = []

    def run_suite(options, progress=None, on_section=None):
        ran.append(options)
        env = {"date": "today", "torch": "x", "threads": 1, "dtype": "float32", "allocator": "a"}
        results = suite.Results(options={}, environment=env, gemm_gflops={"minilm": 1.0})
        if on_section is not None:
            on_section(results)
        return results

    monkeypatch.setattr(suite, "run_suite", run_suite)
    return ran


def test_default_is_a_new_folder_here(tmp_path, monkeypatch, stand_in, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(QUICK) == 0
    assert main(QUICK) == 0
    folders = sorted((tmp_path / "bench-results").iterdir())
    assert len(folders) == 2, folders  # the second run did not replace the first
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) == ["bench.json", "bench.md"]
        assert json.loads((folder / "bench.json").read_text())["gemm_gflops"] == {"minilm": 1.0}
    assert not (tmp_path / "benchmarks").exists()


def test_existing_outputs_are_refused_before_any_work(tmp_path, stand_in, capsys):
    (tmp_path / "bench.md").write_text("committed results\n")
    assert main([*QUICK, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path} already holds {tmp_path / 'bench.md'}; pass --force" in err
    assert stand_in == [] and (tmp_path / "bench.md").read_text() == "committed results\n"
    assert main([*QUICK, "--out", str(tmp_path), "--name", "other"]) == 0  # another name: fine
    assert main([*QUICK, "--out", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "bench.md").read_text().startswith("# clearformer benchmark")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_out_naming_a_file_is_refused_before_any_work(tmp_path, stand_in, capsys):
    target = tmp_path / "results.txt"
    target.write_text("x")
    assert main([*QUICK, "--out", str(target)]) == 2
    assert f"--out {target} is a file; give a folder" in capsys.readouterr().err
    assert stand_in == []


def test_report_files_are_written_atomically(tmp_path, monkeypatch):
    """A write that fails at the last step (the move into place) leaves the earlier file
    whole and no temporary file behind."""
    from clearformer import io
    from clearformer.bench import report

    (tmp_path / "bench.md").write_text("earlier\n")

    def failing_move(tmp, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io, "publish", failing_move)
    results = suite.Results(options={}, environment={}, gemm_gflops={})
    monkeypatch.setattr(report, "markdown", lambda results: "new\n")
    with pytest.raises(OSError, match="No space left"):
        report.write(results, tmp_path, with_chart=False)
    assert (tmp_path / "bench.md").read_text() == "earlier\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.md"]
