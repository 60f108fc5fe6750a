"""``clearformer encode`` and ``clearformer search`` on the bundled model, in-process."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

from clearformer.cli import main
from clearformer.text import TextEncoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell today."]


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return TextEncoder.from_pretrained().encode(TEXTS)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_texts_as_arguments_to_stdout_jsonl(capsys, reference):
    code, out, err = _run(capsys, "encode", *TEXTS)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == TEXTS and [r["index"] for r in rows] == [0, 1, 2]
    np.testing.assert_allclose(np.array([r["embedding"] for r in rows]), reference, atol=1e-7)


@pytest.mark.parametrize(
    "limits",
    [["--max-tokens", "8"], ["--batch-size", "1"], ["--workers", "2", "--max-tokens", "8"]],
)
def test_batching_options_do_not_change_embeddings(capsys, reference, limits):
    code, out, err = _run(capsys, "encode", *limits, *TEXTS)
    assert code == 0, err
    got = np.array([json.loads(line)["embedding"] for line in out.splitlines()])
    np.testing.assert_allclose(got, reference, atol=1e-6)


def test_bad_batching_option_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["encode", "--max-tokens", "0", "x"])
    assert exit_info.value.code == 2
    assert "--max-tokens: expected a positive integer, got 0" in capsys.readouterr().err


def test_input_file_to_npy(tmp_path, capsys, reference):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    target = tmp_path / "out.npy"
    code, _, err = _run(capsys, "encode", "--input", str(source), "--output", str(target))
    assert code == 0, err
    np.testing.assert_allclose(np.load(target), reference, atol=1e-6)
    assert "wrote 3 x 384" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy", "texts.txt"]


def test_jsonl_input_with_field_to_jsonl(tmp_path, capsys, reference):
    source = tmp_path / "docs.jsonl"
    source.write_text(
        "\n".join(json.dumps({"id": i, "body": t}) for i, t in enumerate(TEXTS)), encoding="utf-8"
    )
    target = tmp_path / "out.jsonl"
    code, _, err = _run(capsys, "encode", "-i", str(source), "--field", "body", "-o", str(target))
    assert code == 0, err
    rows = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    got = np.array([r["embedding"] for r in rows], dtype=np.float32)
    np.testing.assert_array_equal(got, reference.astype(np.float32))  # 9 digits: exact


@pytest.mark.parametrize("name", ["docs.JSONL", "docs.ndjson"])
def test_jsonl_input_is_known_by_its_suffix_in_any_case(tmp_path, capsys, reference, name):
    """Read as plain lines, each line's JSON syntax would be embedded, in silence."""
    source = tmp_path / name
    source.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS), encoding="utf-8")
    code, out, err = _run(capsys, "encode", "-i", str(source))
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == TEXTS
    got = np.array([r["embedding"] for r in rows], dtype=np.float32)
    np.testing.assert_allclose(got, reference, atol=1e-6)
    code, out, err = _run(capsys, "search", TEXTS[1], "--corpus", str(source), "--json")
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["text"] == TEXTS[1]


def test_stdin(monkeypatch, capsys, reference):
    data = ("\n".join(TEXTS) + "\n").encode("utf-8")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, err = _run(capsys, "encode")
    assert code == 0, err
    np.testing.assert_allclose(
        np.array([json.loads(line)["embedding"] for line in out.splitlines()]), reference, atol=1e-7
    )


def test_similarity_matrix(capsys, reference):
    code, out, err = _run(capsys, "encode", "--similarity", *TEXTS)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"[1] {TEXTS[0]}"
    matrix = np.array([[float(x) for x in line.split()[1:]] for line in lines[-3:]])
    np.testing.assert_allclose(matrix, reference @ reference.T, atol=1e-3)
    assert matrix[0, 1] > matrix[0, 2]  # the two cat sentences are the closest pair


def test_search_ranks_by_meaning(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "The stock market crashed.\n\nDogs and cats are popular pets.\nPython is a language.\n",
        encoding="utf-8",
    )
    code, out, err = _run(capsys, "search", "animals at home", "--corpus", str(corpus), "-k", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and "corpus.txt:3: Dogs and cats" in lines[0]
    code, out, _ = _run(capsys, "search", "money", "--corpus", str(corpus), "--json")
    results = [json.loads(line) for line in out.splitlines()]
    assert [r["rank"] for r in results] == [1, 2, 3]  # blank line skipped
    assert results[0]["line"] == 1 and results[0]["score"] >= results[1]["score"]
    assert results[0]["id"] == "corpus.txt:1"  # as `index build` names the line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["encode", "--model", "{tmp}/missing", "x"], "checkpoint directory not found"),
        (["encode", "--model", "{tmp}", "x"], "is incomplete: missing config.json"),
        (["encode", "-i", "{tmp}/latin1.txt"], "not valid UTF-8 text: byte 0xe9"),
        (["encode", "-i", "{tmp}/empty.txt"], "empty input"),
        (["encode", "-i", "{tmp}/nothere.txt"], "--input file not found"),
        (["encode", "-i", "{tmp}"], "--input: {tmp} is a directory, expected a file"),
        (["search", "q", "--corpus", "{tmp}"], "--corpus: {tmp} is a directory, expected a file"),
        (["encode", "x", "-o", "{tmp}/out.csv"], "--output must end in .npy or .jsonl"),
        (["encode", "x", "-o", "{tmp}/no/dir/out.npy"], "--output directory does not exist"),
        (["encode", "x", "-i", "{tmp}/empty.txt"], "not both"),
        (["encode", "-i", "{tmp}/bad.jsonl"], "line 2 is not valid JSON"),
        (["search", "q", "--corpus", "{tmp}/empty.txt"], "empty input"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n', encoding="utf-8")
    message = message.replace("{tmp}", str(tmp_path))
    code, out, err = _run(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


def test_failed_run_keeps_the_earlier_output(tmp_path, capsys):
    target = tmp_path / "out.npy"
    assert _run(capsys, "encode", "first", "-o", str(target))[0] == 0
    before = target.read_bytes()
    code, _, err = _run(capsys, "encode", "x", "--model", str(tmp_path / "nope"), "-o", str(target))
    assert code == 2 and target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy"]


def test_atomic_write_leaves_nothing_on_error(tmp_path):
    from clearformer.io import atomic_write

    target = tmp_path / "file.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write("half")
        raise RuntimeError("boom")
    assert target.read_text() == "old" and sorted(tmp_path.iterdir()) == [target]


def test_read_texts_lines_and_jsonl():
    from clearformer.io import read_texts

    assert read_texts(b"\xef\xbb\xbfa\r\nb\n\nc", "f") == ["a", "b", "", "c"]  # BOM, CRLF
    assert read_texts(b"a\n", "f") == ["a"]  # a final newline adds no text
    data = b'{"text": "x"}\n\n{"text": "y", "id": 2}\n'
    assert read_texts(data, "f", field="text") == ["x", "y"]
    with pytest.raises(ValueError, match="line 1: field 'text' must be a string, got int"):
        read_texts(b'{"text": 3}', "f", field="text")
    with pytest.raises(ValueError, match=r"line 1: expected a JSON object with a 'body' field"):
        read_texts(b'{"text": "x"}', "f", field="body")
    with pytest.raises(ValueError, match=r"not valid UTF-8 text: byte 0xff at offset 2 \(line 2\)"):
        read_texts(b"a\n\xff", "f")


def test_outputs_get_ordinary_file_permissions(tmp_path):
    """Atomic writes go through mkstemp (0600); the published file gets 0666 less the umask."""
    import os

    from clearformer.io import atomic_write

    target = tmp_path / "out.txt"
    with atomic_write(target) as handle:
        handle.write("x")
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_reader_that_stops_early_ends_the_run_quietly(tmp_path):
    # `clearformer encode ... | head -1`: the pipe closes after the first line, while most of
    # the output (300 rows of 384 numbers, far more than a pipe holds) is still to be written.
    import os
    import subprocess
    import sys

    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"text number {i} about cats\n" for i in range(300)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        [sys.executable, "-m", "clearformer", "encode", "--input", str(texts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    first = child.stdout.readline()
    child.stdout.close()
    _, stderr = child.communicate(timeout=120)
    assert first.startswith(b'{"index": 0')
    assert child.returncode == 141, stderr.decode()  # 128 + SIGPIPE, as a shell reports it
    assert stderr == b""  # no error message and no traceback


def test_only_a_closed_stdout_counts_as_the_reader_stopping(tmp_path, monkeypatch):
    # A broken pipe elsewhere (stderr's reader gone) is an error, not the quiet exit 141.
    import os
    import sys

    from clearformer.cli import _stdout_reader_gone

    read_end, write_end = os.pipe()
    with open(write_end, "w") as pipe, open(tmp_path / "out.txt", "w") as regular:
        monkeypatch.setattr(sys, "stdout", pipe)
        assert not _stdout_reader_gone()  # the reader is still there
        os.close(read_end)
        assert _stdout_reader_gone()
        monkeypatch.setattr(sys, "stdout", regular)
        assert not _stdout_reader_gone()
