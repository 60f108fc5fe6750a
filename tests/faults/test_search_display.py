"""``clearformer search`` shows a long matching line cut to ``--width`` characters with the
count of those left out; ``--json`` keeps the whole text for programs."""

from __future__ import annotations

import json

from clearformer.cli import main


def test_long_line_is_cut_in_the_display(tmp_path, tiny_checkpoint, capsys):
    corpus = tmp_path / "corpus.txt"
    long_line = "a cat " * 100_000  # 600 kB on one line
    corpus.write_text(f"a dog\n{long_line}\n", encoding="utf-8")
    argv = ["search", "a cat", "--corpus", str(corpus), "--model", str(tiny_checkpoint)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len(out) < 1000, len(out)
    assert "... [599,799 more characters]" in out
    assert main([*argv, "--width", "10"]) == 0
    assert "corpus.txt:2: a cat a ca... [599,989 more characters]" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {len(r["text"]) for r in rows} == {len("a dog"), len(long_line)}
