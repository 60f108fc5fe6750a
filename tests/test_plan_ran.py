"""A call runs what its plan says: the routes decide, the kernels execute.

Each layer's attention kernel and each fused product notes what it runs (``clearformer.ran``);
these tests run the stack of every layer kind on every backend, in inference (fused linear
layers) and with gradients (eager layers), with clearformer's AVX-512 kernels switched on where
they build and off, and hold the notes against the plan printed before the call. A kernel
that chose another implementation on its own (a silent fall-back, a switch read while running)
would run something the plan does not say, and fail here; a mutation that makes one do so
shows the check fails. A static check holds ``fast/`` and ``kernels/`` to reading no route,
switch or verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import clearformer
from clearformer.fast import avx512, varlen
from clearformer.fast.reordered_weights import ReorderedWeights, use_reordered_weights
from clearformer.ran import watching

from .helpers import AVX512_SUPPORT
from .test_agreement import FAMILIES, batch, encoder_of

LINEAR_KERNELS = {"onednn", "avx512", "int8"}


def expected_attention(plan) -> list[str]:
    """What each layer's attention runs, as the plan says, in layer order."""
    if plan.kernel.choice == "math" and not plan.packed:
        return []  # the reference encoder runs the whole stack; it calls no kernel
    ran = []
    for layer in plan.layers:
        if layer.kernel.choice == "math":
            ran.append("math")
        elif layer.kernel.choice == "varlen":
            ran.append(layer.method.choice)
        elif layer.window is not None and not layer.band_in_mask:
            ran.append("banded")
        elif layer.padded_route is not None and layer.padded_route.choice == "avx512":
            ran.append("avx512")
        else:
            ran.append("sdpa")
    return ran


def check_ran_as_planned(plan, notes: list[tuple[str, str]]) -> None:
    """Raise AssertionError unless ``notes`` (from one call) are what ``plan`` says runs."""
    attention = [choice for what, choice in notes if what == "attention"]
    assert attention == expected_attention(plan), (
        f"attention ran {attention}, the plan says {expected_attention(plan)}:\n{plan}"
    )
    products = {choice for what, choice in notes if what == "linear"}
    if not plan.fused_linear:
        assert not products, f"eager linear layers planned, {products} ran:\n{plan}"
        return
    allowed = LINEAR_KERNELS if plan.layer(0).avx512_linear else LINEAR_KERNELS - {"avx512"}
    assert products and products <= allowed, f"products ran {products}, allowed {allowed}"


def run_watched(encoder, x, mask, backend: str, *, grad: bool):
    """(plan, notes) of one forward of ``encoder`` on ``backend``, gradients on or off."""
    with torch.set_grad_enabled(grad):
        plan = encoder.plan_for(mask, backend=backend, dtype=x.dtype)
        # Weights reordered for the call, as encode packs them: the AVX-512 linear kernel's
        # epilogues read reordered weights only.
        with use_reordered_weights(ReorderedWeights()), watching() as notes:
            encoder(x, plan=plan)
    return plan, list(notes)


SWITCHES = ["off"]
if AVX512_SUPPORT.choice == "available":
    SWITCHES.append("on")


@pytest.mark.parametrize("switch", SWITCHES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_layer_runs_what_the_plan_says(family, switch, monkeypatch, request):
    if switch == "on":
        request.getfixturevalue("avx512_library")
    monkeypatch.setenv("CLEARFORMER_AVX512", switch)
    encoder = encoder_of(family)
    # Holes in a mask only where no window or relative bias reads distances off the rows.
    spec = FAMILIES[family]
    x, mask = batch(holes="local_window" not in spec and "relative_attention_buckets" not in spec)
    x = torch.where(mask[..., None], x, 0.0)
    full = torch.ones_like(mask)  # no padding: the padded layout, unmasked
    for backend in ("auto", "math", "sdpa", "varlen"):
        for rows_mask in (mask, full):
            for grad in (False, True):
                plan, notes = run_watched(encoder, x, rows_mask, backend, grad=grad)
                check_ran_as_planned(plan, notes)


def test_the_avx512_kernels_run_where_the_plan_names_them(avx512_library, monkeypatch):
    """Control: where the switch takes the kernels, the plan names them and they run, on
    packed rows, on unmasked padded rows and on key runs; otherwise the checks above would
    hold trivially."""
    if AVX512_SUPPORT.choice != "available":
        pytest.skip(AVX512_SUPPORT.reason)
    monkeypatch.setenv("CLEARFORMER_AVX512", "on")
    encoder = encoder_of("bert")
    x, mask = batch(holes=False)
    ran = set()
    for backend, rows_mask in (("varlen", mask), ("sdpa", torch.ones_like(mask)), ("sdpa", mask)):
        plan, notes = run_watched(encoder, x, rows_mask, backend, grad=False)
        check_ran_as_planned(plan, notes)
        ran |= {choice for _, choice in notes}
    assert "avx512" in ran


def test_a_kernel_that_decides_on_its_own_fails_the_check(monkeypatch):
    """The mutation: the varlen kernel second-guesses the plan (a single run of sequences
    'needs no threads', so it takes ``sequence`` where the plan said ``threads``)."""
    original = varlen.attend

    def deciding(q, k, v, layout, method, **kwargs):
        if method == "threads" and len(layout.runs) < 8:
            method = "sequence"  # the kernel's own idea, not the plan's
        return original(q, k, v, layout, method, **kwargs)

    encoder = encoder_of("bert")
    x, mask = batch(holes=True)
    x = torch.where(mask[..., None], x, 0.0)
    plan, notes = run_watched(encoder, x, mask, "varlen", grad=False)
    if plan.method.choice != "threads":
        pytest.skip(f"auto takes {plan.method} here (one thread): no threads to second-guess")
    check_ran_as_planned(plan, notes)  # unmutated: as planned
    monkeypatch.setattr(varlen, "attend", deciding)
    monkeypatch.setattr(clearformer.kernels, "attend", deciding)
    plan, notes = run_watched(encoder, x, mask, "varlen", grad=False)
    with pytest.raises(AssertionError, match="attention ran"):
        check_ran_as_planned(plan, notes)


def test_a_fallback_inside_the_padded_kernel_fails_the_check(avx512_library, monkeypatch):
    """The mutation: the sdpa kernel finds the AVX-512 kernel 'cannot read the rows' and
    quietly takes PyTorch's, where the plan named clearformer's."""
    if AVX512_SUPPORT.choice != "available":
        pytest.skip(AVX512_SUPPORT.reason)
    monkeypatch.setenv("CLEARFORMER_AVX512", "on")
    encoder = encoder_of("bert")
    x = torch.randn(2, 9, encoder.config.d_model)
    full = torch.ones(2, 9, dtype=torch.bool)
    plan, notes = run_watched(encoder, x, full, "sdpa", grad=False)
    assert plan.layer(0).padded_route.choice == "avx512", str(plan.layer(0).padded_route)
    check_ran_as_planned(plan, notes)
    monkeypatch.setattr(avx512, "serves", lambda *rows: False)
    plan, notes = run_watched(encoder, x, full, "sdpa", grad=False)
    with pytest.raises(AssertionError, match="attention ran"):
        check_ran_as_planned(plan, notes)


# What a kernel or a fast route must never call while it runs: the deciding is the routes'.
DECIDING = re.compile(
    r"\b(kernel_route|varlen_method|resolve_method|in_use|linear_route|fusion_decision|"
    r"padded_attention_route|epilogue_route|cached_verdicts|kernel_setting|calibration_enabled)"
    r"\s*\(|\bswitches\.|\bfrom \.\.(routes|kernel_routes|attention_routes|switches)\b|"
    r"\bimport (routes|kernel_routes|attention_routes)\b"
)


def deciding_lines(package: Path) -> list[str]:
    """``path:line: text`` of every line of ``fast/`` and ``kernels/`` that decides a route."""
    found = []
    for folder in ("fast", "kernels"):
        for path in sorted((package / folder).glob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if DECIDING.search(code) and not code.lstrip().startswith(("``", ":func:")):
                    found.append(f"{path.relative_to(package)}:{number}: {line.strip()}")
    return found


PACKAGE = Path(clearformer.__file__).parent


def test_kernels_and_fast_routes_read_no_route_switch_or_verdict():
    assert deciding_lines(PACKAGE) == []


def test_the_static_check_sees_a_kernel_that_reads_a_route(tmp_path):
    import shutil

    copy = tmp_path / "clearformer"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    sdpa = copy / "kernels" / "sdpa.py"
    sdpa.write_text(sdpa.read_text() + "\n\ndef _taken(q):\n    return avx512.in_use(q.dtype)\n")
    assert [line for line in deciding_lines(copy) if "in_use" in line]
