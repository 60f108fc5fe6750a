"""A ``.bin`` checkpoint holding pickled objects is refused with what was found, no advice to
unpickle it anyway, and no torch warning on stderr before the one error line."""

from __future__ import annotations

import pathlib
import pickle
import warnings

import pytest
import torch

from clearformer.interop.hf import CheckpointError, load_model

from .conftest import run_cli


def _bin_with_path_object(directory: pathlib.Path) -> None:
    (directory / "model.safetensors").unlink()
    torch.save({"weights": pathlib.Path("not a tensor")}, directory / "pytorch_model.bin")


def _raw_pickle(directory: pathlib.Path) -> None:
    """A plain (non-zip) pickle of protocol 4, as ``pickle.dump`` writes it."""
    (directory / "model.safetensors").unlink()
    with open(directory / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"weights": pathlib.Path("x")}, handle, protocol=4)


@pytest.mark.parametrize(
    ("damage", "found"),
    [
        (_bin_with_path_object, "(Unsupported global: GLOBAL pathlib.PosixPath)"),
        (_raw_pickle, "(Unsupported operand 149)"),
    ],
)
def test_pickle_is_refused_with_what_was_found(checkpoint, damage, found):
    damage(checkpoint)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(CheckpointError) as info:
        warnings.simplefilter("always")
        load_model(checkpoint)
    message = str(info.value)
    assert "pickled Python objects" in message and found in message, message
    assert "will not load it" in message and "safetensors" in message, message
    assert "weights_only=False" not in message and "`weights_only` set to `False`" not in message
    assert not [w for w in caught if "pickle protocol" in str(w.message)]


def test_cli_prints_one_line_for_a_raw_pickle(checkpoint):
    _raw_pickle(checkpoint)
    done = run_cli("encode", "--model", str(checkpoint), "a cat")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("clearformer encode: error: ") and "will not load it" in lines[0]


def test_other_warnings_are_not_silenced_for_good(checkpoint):
    """The filter lives only around the load: afterwards the warning shows again."""
    _raw_pickle(checkpoint)
    with pytest.raises(CheckpointError):
        load_model(checkpoint)
    warned = pytest.warns(UserWarning, match="Detected pickle protocol")
    with warned, pytest.raises(pickle.UnpicklingError):
        torch.load(checkpoint / "pytorch_model.bin", weights_only=True)
