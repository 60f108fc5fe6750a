"""Text that is not valid Unicode (a lone surrogate from a JSON escape, a command-line byte
that is not UTF-8) is an error saying which input and why, not the tokenizer's type error."""

from __future__ import annotations

import os
import subprocess

import pytest

from clearformer.text import TextEncoder

from .conftest import cli_command, cli_env, run_cli


def test_api_names_the_index_and_the_code_point(tiny_checkpoint):
    encoder = TextEncoder.from_pretrained(tiny_checkpoint)
    with pytest.raises(ValueError) as info:
        encoder.encode(["a cat", "a \ud800 dog"])
    message = str(info.value)
    assert "texts[1] is not valid Unicode text: a lone surrogate U+D800" in message, message
    assert "at character 2" in message


def test_jsonl_escape_names_the_line(tmp_path, tiny_checkpoint):
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "ok"}\n{"text": "bad \\ud800"}\n', encoding="utf-8")
    done = run_cli("encode", "--model", str(tiny_checkpoint), "-i", str(source))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{source} line 2: field 'text' is not valid Unicode text: a lone surrogate" in (
        done.stderr
    )


@pytest.mark.parametrize("command", ["encode", "search"])
def test_argument_byte_that_is_not_utf8(tmp_path, tiny_checkpoint, command):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a cat\n", encoding="utf-8")
    extra = ["--corpus", str(corpus)] if command == "search" else []
    argv = [os.fsencode(a) for a in cli_command(command, "--model", str(tiny_checkpoint), *extra)]
    done = subprocess.run(
        [*argv, b"caf\xff"], env=cli_env(), capture_output=True, text=True, timeout=120
    )
    name = "QUERY" if command == "search" else "TEXT 1"
    assert done.returncode == 2, done.stderr
    assert f"{name} is not valid Unicode text: byte 0xff that is not UTF-8 at character 3" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
