"""The renderers: terminal listing, JSON, HTML report, PNG attention maps."""

from __future__ import annotations

import importlib
import json
import re

import pytest
import torch

from clearformer import EncoderConfig, EncoderModel, explain
from clearformer.explainer import SCHEMA, SCHEMA_VERSION
from clearformer.explainer.filters import Filters
from clearformer.explainer.render_html import render_html, write_html
from clearformer.explainer.render_text import WIDTH, render_text

from .helpers import lengths_mask


@pytest.fixture(scope="module")
def trace():
    torch.manual_seed(0)
    config = EncoderConfig(d_model=32, n_heads=4, n_layers=2, dim_mlp=64, vocab_size=50)
    model = EncoderModel(config).eval()
    ids = torch.randint(1, 50, (2, 6))
    words = [
        ["The", "cat", "sat", "on", "the", "supercalifragilisticexpialidocious-mat"],
        ["A", "dog", "barked", "x", "y", "z"],
    ]
    return explain(model, ids, lengths_mask([6, 3], 6), tokens=words)


# -- text --------------------------------------------------------------------------------------
def test_listing_fits_100_columns_and_shows_code_formula_and_stats(trace):
    text = render_text(trace)
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    assert "scores = torch.matmul(q * scale, k.transpose(-2, -1))" in text
    assert "S = Q Kᵀ / √Dh" in text
    assert "clearformer/reference.py:" in text
    assert "(B=2, H=4, Tq=6, Tk=6)" in text
    assert "== layer 0" in text and "== layer 1" in text and "== embeddings" in text


def test_listing_filters(trace):
    text = render_text(trace, Filters(layer=1))
    assert "== layer 1" in text and "== layer 0" not in text and "embeddings.sum" not in text
    text = render_text(trace, Filters(step="scores"))
    steps = re.findall(r"^# \[L\d\] (\S+):", text, re.M)
    assert steps == ["attn.scores", "attn.scores"]
    text = render_text(trace, Filters(step="attn.weights", head=3, sequence=1))
    assert "head 3" in text and "sequence 1" in text
    # The padded keys of sequence 1 are drawn as masked cells, its padded queries left out.
    grid = [line for line in text.splitlines() if line.startswith("#   A ")]
    assert grid and grid[0].split()[-3:] == [".", ".", "."]
    assert "0." in grid[0].split()[2]
    masked = render_text(trace, Filters(step="masked_scores", sequence=1))
    assert "every real query of sequence 1 lost 3" in masked


@pytest.mark.parametrize(
    "filters,fragments",
    [
        (Filters(layer=2), ("--layer", "[0, 1]", "got 2")),
        (Filters(layer=-1), ("--layer", "got -1")),
        (Filters(head=4), ("--head", "[0, 3]", "got 4")),
        (Filters(step="softmaxx"), ("--step", "softmaxx", "attn.weights")),
        (Filters(sequence=5), ("--sequence", "[0, 1]", "got 5")),
    ],
)
def test_bad_filters_are_named(trace, filters, fragments):
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    with pytest.raises(ValueError, match=re.compile(pattern, re.S)):
        render_text(trace, filters)


# -- JSON --------------------------------------------------------------------------------------
def test_json_has_a_versioned_stable_schema(trace):
    data = json.loads(trace.to_json())
    assert data["schema"] == SCHEMA and data["version"] == SCHEMA_VERSION == 1
    assert list(data) == [
        "schema",
        "version",
        "model",
        "inputs",
        "notes",
        "fidelity",
        "steps",
        "attention",
        "output",
        "pooled",
    ]
    step = data["steps"][0]
    assert set(step) == {
        "index",
        "name",
        "layer",
        "title",
        "formula",
        "about",
        "source",
        "shape",
        "dims",
        "stats",
        "token_norms",
    }
    assert set(step["formula"]) == {"text", "latex"}
    assert set(step["source"]) == {"file", "line", "code", "function"}
    assert set(step["stats"]) == {"mean", "std", "min", "max", "norm", "count"}
    attention = data["attention"][1]
    assert attention["layer"] == 1
    assert torch.tensor(attention["weights"]).shape == (2, 4, 6, 6)
    assert torch.tensor(attention["mask"]).shape == (2, 4, 6, 6)
    assert attention["lost_keys"][1][0][:3] == [3, 3, 3]
    assert data["inputs"]["mask"][1] == [1, 1, 1, 0, 0, 0]
    assert data["fidelity"]["ok"] is True
    assert trace.to_json() == trace.to_json()  # same trace, same text


# -- HTML --------------------------------------------------------------------------------------
def test_html_is_self_contained(trace):
    page = render_html(trace)
    assert page.startswith("<!doctype html>")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    for forbidden in ("<link", " src=", "href=", "url(", "@import", "fetch(", "XMLHttpRequest"):
        assert forbidden not in page, forbidden
    data = re.search(
        r'<script type="application/json" id="explain-data">(.*?)</script>', page, re.S
    )
    parsed = json.loads(data.group(1))
    assert len(parsed["layers"]) == 2 and parsed["n_heads"] == 4
    assert [p["label"] for p in parsed["stream"]][:3] == ["embeddings", "L0 +attn", "L0 +ffn"]
    assert "supercalifragilisticexpialidocious-mat" in page
    assert 'id="status" data-status="pending"' in page


def test_html_escapes_texts(trace):
    trace.tokens[0][0] = "</script><b>x"
    try:
        page = render_html(trace)
    finally:
        trace.tokens[0][0] = "The"
    assert "</script><b>x" not in page


# -- PNG and atomic writes ---------------------------------------------------------------------
def test_png_attention_maps(trace, tmp_path):
    pytest.importorskip("matplotlib")
    from clearformer.explainer.render_png import render_png, write_png

    data = render_png(trace, Filters(layer=1, head=2, sequence=1))
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    path = write_png(trace, tmp_path / "maps.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["maps.png"]


def test_failed_write_leaves_no_file(trace, tmp_path, monkeypatch):
    module = importlib.import_module("clearformer.explainer.render_html")

    def broken(_trace):
        raise RuntimeError("render failed")

    target = tmp_path / "report.html"
    target.write_text("old report")
    write_html(trace, target)
    assert target.read_text().startswith("<!doctype html>")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_html(trace, tmp_path / "missing" / "report.html")
    monkeypatch.setattr(module, "render_html", broken)
    with pytest.raises(RuntimeError):
        module.write_html(trace, tmp_path / "other.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
