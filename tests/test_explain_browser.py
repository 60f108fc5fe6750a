"""The HTML report in a real browser: headless Chromium runs its script without console errors,
draws every heatmap, and a screenshot is saved.

Needs Debian's ``chromium`` package (``apt-get install --no-install-recommends chromium
fonts-dejavu-core``); skipped with the reason when it is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from clearformer import EncoderConfig, EncoderModel, explain
from clearformer.explainer import write_html

from .helpers import lengths_mask

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Lets the page's script finish before the DOM is dumped or the screenshot taken.
    "--virtual-time-budget=5000",
]


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium found (apt-get install chromium); the browser check needs one")


def _run(browser: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"  # a fresh one per run
    command = [browser, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, int]:
    torch.manual_seed(0)
    config = EncoderConfig(d_model=32, n_heads=4, n_layers=3, dim_mlp=64, vocab_size=50)
    model = EncoderModel(config).eval()
    ids = torch.randint(1, 50, (2, 7))
    words = [
        ["The", "cat", "sat", "on", "the", "mat", "."],
        ["A", "dog", "barked", "<b>&amp;", "", "", ""],
    ]
    trace = explain(model, ids, lengths_mask([7, 4], 7), tokens=words)
    path = tmp_path_factory.mktemp("report") / "report.html"
    write_html(trace, path)
    return path, config.n_layers * config.n_heads


def test_report_renders_without_console_errors(report, tmp_path):
    browser = _browser()
    path, n_maps = report
    url = path.resolve().as_uri() + "#sequence=1&layer=2&head=1"
    result = _run(browser, tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", url)
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    status = re.search(r'<span id="status"([^>]*)>([^<]*)<', result.stdout)
    assert status is not None, result.stdout[-2000:]
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', status.group(1)))
    assert attrs.get("status") == "ok", status.group(0)
    assert attrs["heatmaps"] == str(n_maps) and attrs["painted"] == str(n_maps)
    assert "layer 2, head 1 (sequence 1)" in result.stdout  # the view asked for in the address
    assert result.stdout.count("<canvas") == n_maps + 1  # the grid and the large view
    assert "<svg" in result.stdout  # the residual-stream chart


def _status(result: subprocess.CompletedProcess) -> dict[str, str]:
    status = re.search(r'<span id="status"([^>]*)>', result.stdout)
    assert status is not None, result.stdout[-2000:]
    return dict(re.findall(r'data-(\w+)="([^"]*)"', status.group(1)))


@pytest.mark.parametrize("width", [1280, 800])
def test_the_attention_grid_fits_the_window(tmp_path, width):
    # MiniLM's 12 heads of a 9-token text were cut at 1280 px: the maps shrink to fit.
    torch.manual_seed(0)
    config = EncoderConfig(d_model=48, n_heads=12, n_layers=2, dim_mlp=96, vocab_size=50)
    trace = explain(EncoderModel(config).eval(), torch.randint(1, 50, (1, 9)))
    path = tmp_path / "wide.html"
    write_html(trace, path)
    result = _run(
        _browser(), tmp_path, f"--window-size={width},900", "--dump-dom", path.resolve().as_uri()
    )
    assert result.returncode == 0, result.stderr[-2000:]
    attrs = _status(result)
    assert attrs.get("status") == "ok" and attrs["heatmaps"] == str(2 * 12), attrs
    assert attrs["cut"] == "0", attrs
    assert float(attrs["fill"]) >= 0.8, attrs  # shrunk to fit, not further


def test_screenshot(report, tmp_path):
    browser = _browser()
    path, _ = report
    shot = tmp_path / "report.png"
    url = path.resolve().as_uri() + "#sequence=1"
    result = _run(browser, tmp_path, "--window-size=1280,1600", f"--screenshot={shot}", url)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mpimg = pytest.importorskip("matplotlib.image")
    pixels = mpimg.imread(shot)[..., :3]
    colours = {tuple(p) for p in (pixels[::7, ::7] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 50, "the screenshot is (nearly) blank"
