"""``clearformer encode`` checks where it writes before the work, names the user's path (never
the hidden temporary file), and refuses to write embeddings that are not finite."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from clearformer.cli import main

from .conftest import run_cli


def _unwritable_directory(tmp_path):
    """A directory no file can be created in, as root too (root ignores permission bits)."""
    if os.geteuid() == 0:
        return "/proc"  # a virtual file system: creating a file there fails for everyone
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return str(locked)


def test_unwritable_directory_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from clearformer.commands import encode, search  # search binds load_encoder on import

    assert search.load_encoder is encode.load_encoder

    def no_work(args):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(encode, "load_encoder", no_work)
    target = os.path.join(_unwritable_directory(tmp_path), "emb.npy")
    assert main(["encode", "a cat", "--output", target]) == 2
    err = capsys.readouterr().err
    assert f"--output: cannot write {target}: directory" in err and "not writable" in err, err
    assert ".tmp" not in err and ".probe" not in err


def test_atomic_write_names_the_target_not_the_temporary_file(tmp_path):
    from clearformer.io import atomic_write

    target = os.path.join(_unwritable_directory(tmp_path), "out.txt")
    with pytest.raises(OSError) as info, atomic_write(target) as handle:
        handle.write("x")
    assert f"cannot write {target}" in str(info.value) and ".tmp" not in str(info.value)


@pytest.fixture
def nan_checkpoint(checkpoint):
    """The tiny checkpoint with a NaN in the embedding row of the word "cat"."""
    from safetensors.torch import load_file, save_file

    path = checkpoint / "model.safetensors"
    tensors = load_file(str(path))
    cat = (checkpoint / "vocab.txt").read_text().split().index("cat")
    tensors["embeddings.word_embeddings.weight"][cat, 0] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})
    return checkpoint


@pytest.mark.parametrize("suffix", [".jsonl", ".npy", None])
def test_nan_embeddings_are_an_error_naming_the_texts(tmp_path, nan_checkpoint, suffix):
    output = [] if suffix is None else ["-o", str(tmp_path / f"emb{suffix}")]
    done = run_cli("encode", "--model", str(nan_checkpoint), "a dog", "a cat", "b", *output)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "the embeddings of 1 of 3 texts are not finite" in done.stderr
    assert "texts 1 ('a cat')" in done.stderr and "nothing was written" in done.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("emb", ".emb"))]


def test_finite_embeddings_still_written(tmp_path, tiny_checkpoint):
    target = tmp_path / "emb.jsonl"
    done = run_cli("encode", "--model", str(tiny_checkpoint), "a cat", "-o", str(target))
    assert done.returncode == 0, done.stderr
    row = json.loads(target.read_text())
    assert np.isfinite(row["embedding"]).all()
