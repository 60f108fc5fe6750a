"""``clearformer --help`` answers at once: parsing arguments imports no torch, numpy or
tokenizers (they took 1.3-1.5 s before). Checked by what is imported, not by a clock."""

from __future__ import annotations

import subprocess
import sys

from .conftest import cli_env, run_cli

PROBE = """
import sys
from clearformer.cli import build_parser
build_parser().parse_args(["encode", "x"])
print(sorted(m for m in ("torch", "numpy", "tokenizers", "safetensors") if m in sys.modules))
"""


def test_parsing_imports_nothing_heavy():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_help_lists_every_command():
    done = run_cli("--help")
    assert done.returncode == 0
    for command in ("encode", "search", "rerank", "explain", "bench", "demo"):
        assert command in done.stdout


def test_package_names_still_import_on_use():
    import clearformer

    assert clearformer.EncoderConfig(d_model=8, n_heads=2).d_model == 8
    assert "TextEncoder" in dir(clearformer)
