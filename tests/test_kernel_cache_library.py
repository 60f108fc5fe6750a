"""The AVX-512 library's build cache (clearformer.fast.avx512.load): a library file that is
damaged (cut short, emptied, changed, without the record of its build) is never handed to the
dynamic loader (a file cut short stops the process with SIGBUS there) but removed and built
again; one that fails to load is removed; the build syncs the library before it renames it
into place; a process that finds another building waits for it and loads what it built.

No real build: a fake compiler (a shell script) writes the same bytes wherever ``-o`` says,
and a fake loader records what each file it is handed holds. Runs on any Linux machine."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import threading
from pathlib import Path

import pytest
import torch

from clearformer.fast import avx512
from clearformer.machine import machine
from clearformer.options import Decision

from .helpers import watch_lock_waits

# What the fake compiler writes: large enough that a cut or a changed byte is not the end.
BUILT = b"\x7fELF a fake library, built by a test\n" * 300


class Kernels:
    """``load`` with a fake compiler and loader; ``builds()`` counts the links so far."""

    def __init__(self, tmp_path: Path) -> None:
        self.library = tmp_path / "cache" / "kernels" / "avx512_kernels-test.so"
        self.record = self.library.with_suffix(".record")
        self.handed: list[bytes] = []  # what each file handed to the loader held
        self.refuse = False  # the loader raises, as dlopen does for a bad file
        self.compiles = tmp_path / "compiles.log"

    def builds(self) -> int:
        if not self.compiles.exists():
            return 0
        return sum(line.endswith(".so") for line in self.compiles.read_text().splitlines())

    def load_library(self, path: str) -> None:
        self.handed.append(Path(path).read_bytes())
        if self.refuse:
            raise OSError(f"{path}: invalid ELF header")

    @staticmethod
    def new_process() -> None:
        avx512._state.clear()  # what a process remembers of its load


@pytest.fixture
def kernels(tmp_path, monkeypatch) -> Kernels:
    fake = Kernels(tmp_path)
    built = tmp_path / "built.bin"
    built.write_bytes(BUILT)
    compiler = tmp_path / "fake-c++"
    compiler.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\n'
        f'cp "{built}" "$out"\n'
        f'echo "$out" >> "{fake.compiles}"\n'
    )
    compiler.chmod(0o755)
    able = dataclasses.replace(machine(), avx512=Decision("available", "a test's machine"))
    monkeypatch.setattr(avx512, "machine", lambda: able)
    monkeypatch.setattr(avx512, "compiler", lambda: str(compiler))
    monkeypatch.setattr(avx512, "library_path", lambda: fake.library)
    monkeypatch.setattr(avx512, "_state", {})
    monkeypatch.setattr(torch.ops, "load_library", fake.load_library)
    return fake


def test_a_build_syncs_the_library_before_renaming_it_and_records_it(kernels, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), fsync(fd))[1])
    monkeypatch.setattr(
        os, "replace", lambda a, b: (events.append(("replace", Path(b))), replace(a, b))[1]
    )
    assert avx512.load(build=True).choice == "loaded"
    assert kernels.handed == [BUILT] and kernels.builds() == 1
    renamed = events.index(("replace", kernels.library))
    assert "fsync" in events[:renamed]  # its bytes on disk before the name points at them
    record = json.loads(kernels.record.read_text())
    assert record == {"size": len(BUILT), "sha256": hashlib.sha256(BUILT).hexdigest()}


def cut_short(kernels):
    kernels.library.write_bytes(BUILT[: len(BUILT) // 2])


def emptied(kernels):
    kernels.library.write_bytes(b"")


def changed(kernels):
    kernels.library.write_bytes(BUILT[:-1] + b"?")


def unrecorded(kernels):
    kernels.record.unlink()  # a build that stopped after the rename, or an older version


def misrecorded(kernels):
    kernels.record.write_bytes(b"\xff not a record")


DAMAGE = [cut_short, emptied, changed, unrecorded, misrecorded]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_library_is_never_loaded_but_built_again(kernels, damage, caplog):
    assert avx512.load(build=True).choice == "loaded"
    damage(kernels)
    kernels.new_process()
    with caplog.at_level(logging.WARNING, logger="clearformer.fast.avx512"):
        outcome = avx512.load(build=True)
    assert outcome.choice == "loaded", outcome.reason
    assert kernels.handed == [BUILT, BUILT]  # the damaged file never reached the loader
    assert kernels.builds() == 2
    assert len(caplog.records) == 1 and "removed, building it again" in caplog.text


@pytest.mark.parametrize("damage", DAMAGE)
def test_without_a_build_a_damaged_library_is_removed_and_pytorch_kept(kernels, damage, caplog):
    # A route's check (load(build=False)) compiles nothing: PyTorch's route, and the next
    # call that may build makes the library again.
    assert avx512.load(build=True).choice == "loaded"
    damage(kernels)
    kernels.new_process()
    with caplog.at_level(logging.WARNING, logger="clearformer.fast.avx512"):
        assert avx512.load(build=False).choice == "not built"
        assert avx512.load(build=False).choice == "not built"
    assert kernels.handed == [BUILT] and not kernels.library.exists()
    assert len(caplog.records) == 1  # one line, not one per decision
    assert avx512.load(build=True).choice == "loaded"
    assert kernels.handed == [BUILT, BUILT] and kernels.builds() == 2


def test_a_library_that_fails_to_load_is_removed_and_built_again(kernels):
    assert avx512.load(build=True).choice == "loaded"
    kernels.new_process()
    kernels.refuse = True
    outcome = avx512.load(build=False)
    assert outcome.choice == "unavailable" and "did not load" in outcome.reason
    assert not kernels.library.exists()  # not met again by every later process
    kernels.new_process()
    kernels.refuse = False
    assert avx512.load(build=True).choice == "loaded"
    assert kernels.builds() == 2


def test_a_build_waits_for_another_process_building_and_loads_its_library(kernels, monkeypatch):
    # The test plays the other process: it holds the library's lock, builds, and lets go.
    waiting, flock = watch_lock_waits(monkeypatch)
    kernels.library.parent.mkdir(parents=True)
    outcomes = []
    with open(kernels.library.with_suffix(".lock"), "a") as lock:
        flock(lock.fileno(), fcntl.LOCK_EX)
        loading = threading.Thread(target=lambda: outcomes.append(avx512.load(build=True)))
        loading.start()
        while not waiting.is_set() and loading.is_alive():
            waiting.wait(0.05)
        assert waiting.is_set(), "load built without waiting for the lock"
        avx512._build(kernels.library)  # the other process's build, under its lock
    loading.join(timeout=300)
    assert not loading.is_alive()
    assert [outcome.choice for outcome in outcomes] == ["loaded"]
    assert kernels.builds() == 1  # it found the library built after the wait
    assert kernels.handed == [BUILT]
