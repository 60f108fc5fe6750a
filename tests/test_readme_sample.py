"""The README's Python sample runs as written, so the documented API cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_in_python_sample_runs(capsys):
    import torch

    text = README.read_text()
    section = text.split("## In Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    every, hidden, mask = namespace["every"], namespace["hidden"], namespace["mask"]
    assert len(every.hidden_states) == namespace["config"].n_layers + 1
    assert every.attentions[0].shape == (3, 12, 10, 10)
    assert (hidden[~mask] == 0).all()
    # The plan it prints is the one of the forward pass it describes, `hidden`'s: made under
    # no_grad like that call (outside it, gradients would make the linear layers eager).
    with torch.no_grad():
        described = namespace["encoder"].plan_for(mask)
    assert capsys.readouterr().out == f"{described}\n"


def test_the_seq2seq_sample_runs():
    import torch

    text = README.read_text()
    section = text.split("An encoder-decoder Transformer", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.sequences.shape[0] == 2 and out.sequences.shape[1] <= 12
    rebuilt = out.token_logprobs.sum(1) / out.lengths.float()
    torch.testing.assert_close(rebuilt, out.scores, atol=1e-6, rtol=0)
