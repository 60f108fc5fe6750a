"""What a learner reads: the lines of clearformer that run from a forward call to the softmax.

``python -m pytest tests/test_learner_path.py -s`` prints the count that docs/architecture.md
quotes. The test holds the layout to its promise: once the plan is made, the whole math of the
reference path, up to the softmax of the first layer, runs in clearformer/reference.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import clearformer
from clearformer import Encoder, EncoderConfig

PACKAGE = Path(clearformer.__file__).resolve().parent


def lines_run_until_softmax(call, monkeypatch) -> dict[str, set[int]]:
    """file (relative to src/) -> the lines of clearformer run by ``call`` before its first
    softmax."""
    seen: dict[str, set[int]] = {}
    reached = []
    softmax = F.softmax

    def first_softmax(*args, **kwargs):
        reached.append(True)
        return softmax(*args, **kwargs)

    def tracer(frame, event, arg):
        if reached:
            return None
        path = Path(frame.f_code.co_filename)
        if event == "line" and path.is_relative_to(PACKAGE):
            seen.setdefault(path.relative_to(PACKAGE.parent).as_posix(), set()).add(frame.f_lineno)
        return tracer

    monkeypatch.setattr(F, "softmax", first_softmax)
    sys.settrace(tracer)
    try:
        with torch.no_grad():
            call()
    finally:
        sys.settrace(None)
    assert reached, "the call never reached a softmax"
    return seen


def _encoder_and_batch():
    config = EncoderConfig(d_model=32, n_heads=4, n_layers=2, dim_mlp=64, norm="post")
    encoder = Encoder(config).eval()
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2], dtype=torch.bool)
    return encoder, torch.randn(2, 5, 32), mask


def test_from_forward_to_the_softmax(monkeypatch):
    encoder, x, mask = _encoder_and_batch()
    seen = lines_run_until_softmax(lambda: encoder(x, mask, backend="math"), monkeypatch)
    total = sum(len(lines) for lines in seen.values())
    print(f"\nEncoder.forward -> softmax: {len(seen)} files, {total} lines run")
    for name, lines in sorted(seen.items()):
        print(f"  {name}: {len(lines)}")
    assert "clearformer/reference.py" in seen
    assert not any(name.startswith("clearformer/fast/") for name in seen)


def test_the_reference_path_is_the_reference_file_alone(monkeypatch):
    from clearformer import reference

    encoder, x, mask = _encoder_and_batch()
    seen = lines_run_until_softmax(lambda: reference.encoder(encoder, x, mask), monkeypatch)
    # record() returns at once when nothing records (tracing.py), and the config answers which
    # window and rotary base each layer type has (config.py); all else is reference.py.
    assert set(seen) <= {
        "clearformer/reference.py",
        "clearformer/tracing.py",
        "clearformer/config.py",
    }
    assert len(seen["clearformer/tracing.py"]) <= 3
    assert len(seen.get("clearformer/config.py", ())) <= 8
    print(f"\nreference.encoder -> softmax: {len(seen['clearformer/reference.py'])} lines run")
