"""Local (sliding-window) attention: the same numbers on every backend and layout, and memory
that grows with T * window, never T * T."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from clearformer import Encoder, EncoderConfig
from clearformer.fast.local import banded_attention, use_banded
from clearformer.kernels.math import math_attention
from clearformer.masks import band_mask

from .helpers import lengths_mask


@pytest.mark.parametrize("window", [1, 5, 64])
@pytest.mark.parametrize("is_causal", [False, True])
def test_banded_slabs_equal_the_whole_band(window, is_causal):
    torch.manual_seed(0)
    B, H, T, Dh = 2, 2, 700, 8
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    keys = lengths_mask([700, 250])[:, None, None, :]  # (B, 1, 1, T): padded keys in row 1
    want, _ = math_attention(q, k, v, band_mask(T, window) & keys, is_causal=is_causal)
    got = banded_attention(q, k, v, window, keys, is_causal=is_causal, block=96)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # pads beyond the window of every real token: no key, zeros, finite gradients
    assert (got[1, :, 250 + window :] == 0).all()
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    for a, b in zip(grads, want_grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def local_stack(backend: str) -> Encoder:
    config = EncoderConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        dim_mlp=48,
        activation="geglu",
        positions="rotary",
        local_window=16,  # half-window 8
        global_every=2,  # layer 0 global, layer 1 local
        first_attn_norm=False,
        backend=backend,
    )
    torch.manual_seed(0)
    return Encoder(config).eval()


def test_long_local_layers_agree_on_every_backend():
    """At T = 600 the sdpa and packed paths take the slab kernel; math keeps the whole band."""
    assert use_banded(600, 8)
    lengths = [600, 230, 1]
    mask = lengths_mask(lengths)
    x = torch.randn(len(lengths), 600, 32)
    with torch.no_grad():
        want = local_stack("math")(x, mask)
        for backend in ("sdpa", "varlen", "auto"):
            got = local_stack(backend)(x, mask)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=backend)
    plan = local_stack("sdpa").plan_for(mask)
    assert plan.layer(1).window == 8 and not plan.layer(1).band_in_mask
    assert plan.layer(1).mask.shape == (3, 1, 1, 600)  # keys only: no (T, T) band
    assert "layers [1]: local |i - j| <= 8, rotary" in str(plan)


_PROBE = r"""
import json, sys, torch
from clearformer import Encoder, EncoderConfig
from clearformer.bench.memory import _high_water_bytes, _reset_high_water, _rss_bytes

torch.set_num_threads(1)
backend, T = sys.argv[1], int(sys.argv[2])
config = EncoderConfig(d_model=64, n_heads=4, n_layers=2, dim_mlp=64, activation="geglu",
                       positions="rotary", local_window=128, global_every=2, backend=backend)
encoder = Encoder(config).eval()
x = torch.randn(1, T, 64)
mask = torch.ones(1, T, dtype=torch.bool)
mask[0, -1] = False  # a padded position, so that every path has a mask to respect
with torch.inference_mode():  # one cold forward: freed memory is not reused from a warm-up
    _reset_high_water()
    before = _rss_bytes()
    encoder(x, mask)
print(json.dumps({"peak_extra_bytes": max(0, _high_water_bytes() - before)}))
"""


def probe(backend: str, T: int, local: bool = True) -> int:
    script = _PROBE if local else _PROBE.replace("local_window=128", "local_window=None")
    run = subprocess.run(
        [sys.executable, "-c", script, backend, str(T)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(run.stdout.strip().splitlines()[-1])["peak_extra_bytes"]


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_a_local_layer_at_8k_tokens_never_holds_a_t_by_t_tensor(backend):
    """Peak memory of a global + local stack: below the smallest (T, T) tensor (a bool band:
    64 MiB at 8k, 256 MiB at 16k), growing linearly with T, and about what the same stack with
    both layers global (fused attention, linear memory) needs."""
    peak_8k, peak_16k = probe(backend, 8192), probe(backend, 16384)
    mib = f"8k: {peak_8k / 2**20:.0f} MiB, 16k: {peak_16k / 2**20:.0f} MiB"
    assert peak_8k < 8192 * 8192 and peak_16k < 16384 * 16384 / 2, mib
    assert peak_16k < 2.5 * peak_8k, mib  # linear, not quadratic, growth
    # Resident-set peaks move by about 15 MiB between identical runs; 32 MiB of slack is still
    # an eighth of the (T, T) bool band (256 MiB) that a local layer must never build.
    assert peak_16k < probe(backend, 16384, local=False) + 32 * 2**20, mib


def test_the_probe_sees_a_t_by_t_tensor_when_there_is_one():
    """Control: the math kernel folds the whole band into a (T, T) mask and scores."""
    T = 4096
    assert probe("math", T) > T * T * 4  # at least one float32 (T, T) score matrix


@pytest.mark.parametrize("is_causal", [False, True])
def test_causal_local_layers_agree_across_kernels_and_layouts(is_causal):
    """A causal flag survives the per-layer plans on every path (slab kernel included)."""
    import dataclasses

    from clearformer.padding import repad

    stack = local_stack("math")
    # The plans of the same stack made causal (or not): a plan does not read the weights.
    planner = Encoder(dataclasses.replace(stack.config, causal=is_causal)).eval()
    lengths = [600, 230]
    mask = lengths_mask(lengths)
    x = torch.randn(2, 600, 32)
    outs = {}
    with torch.no_grad():
        for backend in ("math", "sdpa", "varlen"):
            plan = planner.plan_for(mask, backend=backend)
            rows = x.reshape(-1, 32)[plan.packing.indices] if plan.packed else x
            for i, block in enumerate(stack.layers):
                rows = block.run(rows, plan.layer(i)).hidden
            out = repad(rows, plan.packing) if plan.packed else rows
            outs[backend] = torch.where(mask[..., None], out, 0.0)
    torch.testing.assert_close(outs["sdpa"], outs["math"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["varlen"], outs["math"], atol=1e-5, rtol=1e-5)


def test_many_long_sequences_through_the_padded_varlen_method():
    """More than MAX_SEQUENCE_CALLS lengths: varlen attends on a padded copy, slab by slab."""
    from clearformer.packed_attention import varlen_attention
    from clearformer.padding import unpad

    from .helpers import intra_op_threads

    lengths = [520 + 7 * i for i in range(10)]
    mask = lengths_mask(lengths)
    N = int(mask.sum())
    q, k, v = (torch.randn(N, 2, 8) for _ in range(3))
    _, layout = unpad(torch.zeros(len(lengths), mask.shape[1], 1), mask)
    with intra_op_threads(2):
        got = varlen_attention(q, k, v, layout, method="padded", window=6)
    want = varlen_attention(q, k, v, layout, reference=True, window=6)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_mask_with_holes_is_refused_for_local_layers():
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, 5:15] = False  # a gap inside sequence 0
    with pytest.raises(ValueError, match=r"one contiguous run.*rows \[0\]"):
        local_stack("sdpa")(torch.randn(2, 20, 32), mask)
    left = torch.ones(2, 20, dtype=torch.bool)
    left[0, :6] = False  # left padding is one run: accepted, and packed = padded
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            local_stack("sdpa")(x, left), local_stack("varlen")(x, left), atol=1e-5, rtol=1e-5
        )
