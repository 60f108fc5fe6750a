"""``torch.compile(fullgraph=True)`` on the padded path: no graph breaks, same output as eager.

The graph-break check uses the ``aot_eager`` backend (traces forward and backward without code
generation, seconds on CPU); one small inductor run checks the generated code's numbers.
"""

from __future__ import annotations

import pytest
import torch

from clearformer import Encoder, EncoderConfig

from .helpers import lengths_mask


def small_encoder(backend: str, norm: str = "pre") -> Encoder:
    config = EncoderConfig(
        d_model=32, n_heads=4, n_layers=2, dim_mlp=64, norm=norm, activation="gelu",
        backend=backend,
    )  # fmt: skip
    return Encoder(config).eval()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_fullgraph_matches_eager_forward_and_backward(backend, norm):
    encoder = small_encoder(backend, norm).train()  # dropout 0: training mode is deterministic
    mask = lengths_mask([5, 1, 3])
    x = torch.randn(3, 5, 32)
    compiled = torch.compile(encoder, fullgraph=True, backend="aot_eager")
    x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = encoder(x_eager, mask), compiled(x_compiled, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got[~mask] == 0).all()
    want.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(x_compiled.grad, x_eager.grad, atol=1e-5, rtol=1e-5)


def test_auto_stays_padded_under_compile():
    encoder = small_encoder("auto")
    mask = lengths_mask([6, 1, 2, 1])  # mostly padding: eager packs, compiled must not
    assert encoder.plan_for(mask).packed
    x = torch.randn(4, 6, 32)
    compiled = torch.compile(encoder, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, mask), encoder(x, mask), atol=1e-5, rtol=1e-5)


def test_inductor_matches_eager():
    encoder = small_encoder("sdpa")
    mask = lengths_mask([4, 2])
    x = torch.randn(2, 4, 32)
    compiled = torch.compile(encoder, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, mask), encoder(x, mask), atol=1e-5, rtol=1e-5)


def test_rotary_and_local_layers_compile_in_one_graph():
    config = EncoderConfig(
        d_model=32,
        n_heads=4,
        n_layers=3,
        dim_mlp=48,
        activation="geglu",
        positions="rotary",
        local_window=8,
        global_every=3,
        first_attn_norm=False,
    )
    encoder = Encoder(config).eval()
    mask = lengths_mask([20, 5, 12])
    x = torch.randn(3, 20, 32)
    compiled = torch.compile(encoder, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, mask), encoder(x, mask), atol=1e-5, rtol=1e-5)
