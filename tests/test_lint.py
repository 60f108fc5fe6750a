"""The code base passes ruff (lint and format), so style problems fail the test suite."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = [p for p in ("src", "tests", "benchmarks", "examples") if (ROOT / p).exists()]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
@pytest.mark.parametrize("args", [["check"], ["format", "--check"]])
def test_ruff(args):
    result = subprocess.run(
        ["ruff", *args, *PATHS], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_merge_conflict_markers_are_left_in_the_tree():
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    files = [ROOT / name for name in listed] or list(ROOT.glob("**/*.md"))
    marked = []
    for path in files:
        if path.suffix not in (".py", ".md", ".toml", ".txt", ".cfg", "") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "=======":
                marked.append(f"{path.relative_to(ROOT)}:{number}")
    assert not marked, marked
