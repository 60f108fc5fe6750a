"""The fused linear layers (oneDNN: bias, activation and residual inside the matrix product)
equal the eager layers, run only where they may, and never hide a hook or a gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from clearformer import Encoder, EncoderConfig
from clearformer.fast import fused_blocks
from clearformer.fast.fused_linear import linear
from clearformer.feedforward import FeedForward, activation_fn
from clearformer.machine import machine
from clearformer.routes import fusion_decision

pytestmark = pytest.mark.skipif(
    not machine().onednn, reason="this PyTorch build has no oneDNN fused linear op"
)


def _ran_fused(fn) -> bool:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return any("_linear_pointwise" in e.key for e in prof.key_averages())


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24)])
def test_linear_with_activation_equals_eager(activation, shape):
    torch.manual_seed(0)
    layer = nn.Linear(24, 40)
    x = torch.randn(*shape) * 3
    with torch.inference_mode():
        want = layer(x) if activation is None else activation_fn(activation)(layer(x))
        got = linear(x, layer, activation=activation)
        assert _ran_fused(lambda: linear(x, layer, activation=activation))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_linear_with_residual_equals_eager_and_needs_it():
    torch.manual_seed(0)
    layer = nn.Linear(24, 16)
    x, residual = torch.randn(2, 9, 24), torch.randn(2, 9, 16)
    with torch.inference_mode():
        got = linear(x, layer, residual=residual)
        torch.testing.assert_close(got, residual + layer(x), atol=1e-5, rtol=1e-5)
        # The residual is really added: without it the result is far off.
        assert (got - layer(x)).abs().max() > 0.5
        # No bias, and zero rows, still work.
        plain = nn.Linear(24, 16, bias=False)
        torch.testing.assert_close(linear(x, plain), plain(x), atol=1e-5, rtol=1e-5)
        assert linear(x[:, :0], layer, residual=residual[:, :0]).shape == (2, 0, 16)
    with pytest.raises(ValueError, match="not both"):
        linear(x, layer, activation="gelu", residual=residual)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu", "geglu"])
def test_feed_forward_fused_equals_eager(activation):
    torch.manual_seed(0)
    ff = FeedForward(32, 48, activation).eval()
    x, residual = torch.randn(4, 6, 32), torch.randn(4, 6, 32)
    with torch.inference_mode():
        want = residual + ff(x)
        got = fused_blocks.feed_forward(ff, x, residual=residual)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_hooks_see_every_call():
    # A forward hook on a linear layer (int8 calibration, a user's probe) must fire: that
    # layer runs eagerly.
    torch.manual_seed(0)
    layer = nn.Linear(8, 8)
    seen = []
    layer.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.inference_mode():
        linear(torch.randn(3, 8), layer, activation="gelu")
    assert seen == [torch.Size([3, 8])]


def _encoder(norm: str) -> Encoder:
    torch.manual_seed(0)
    config = EncoderConfig(
        d_model=48, n_heads=4, n_layers=2, dim_mlp=96, norm=norm, activation="gelu"
    )
    return Encoder(config).eval()


def _ragged() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(4, 12, 48)
    mask = torch.arange(12)[None, :] < torch.tensor([12, 7, 1, 4])[:, None]
    x[~mask] = float("nan")  # padded positions hold anything: they must not matter
    return x, mask


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("backend", ["auto", "sdpa", "varlen"])
def test_encoder_fused_equals_the_eager_reference(norm, backend):
    encoder = _encoder(norm)
    x, mask = _ragged()
    with torch.inference_mode():
        plan = encoder.plan_for(mask, backend=backend)
        assert plan.fused_linear, str(plan)
        assert "linear layers: fused" in str(plan)
        got = encoder(x, mask, backend=backend)
        assert _ran_fused(lambda: encoder(x, mask, backend=backend))
        want = encoder(x, mask, backend="math")
        assert not encoder.plan_for(mask, backend="math").fused_linear
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got[~mask] == 0).all()


def test_calls_that_need_eager_layers_get_them():
    encoder = _encoder("pre")
    x, mask = _ragged()
    x = torch.where(mask[..., None], x, 0.0)
    cpu = torch.device("cpu")
    assert fusion_decision(cpu, torch.float32, training=False).choice == "eager"  # grad on
    with torch.no_grad():
        assert fusion_decision(cpu, torch.float32, training=False).choice == "fused"
        assert fusion_decision(cpu, torch.float32, training=True).choice == "eager"
        assert fusion_decision(cpu, torch.float64, training=False).choice == "eager"
        assert fusion_decision(torch.device("meta"), torch.float32, False).choice == "eager"
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert fusion_decision(cpu, torch.float32, training=False).choice == "eager"
        plan = encoder.plan_for(mask)  # made for inference ...
    assert plan.fused_linear
    # ... and run with gradients: the stack takes the eager layers, so gradients flow.
    x.requires_grad_(True)
    out = encoder(x, plan=plan)
    out.sum().backward()
    assert x.grad is not None and x.grad[mask].abs().sum() > 0
    assert encoder.layers[0].mlp.fc_in.weight.grad is not None


def test_linear_with_gradients_falls_back_to_eager():
    # The oneDNN op has no autograd formula: asked to fuse where a gradient is needed, linear
    # runs the eager layer, and the gradients equal the eager ones.
    torch.manual_seed(0)
    layer = nn.Linear(8, 6)
    x = torch.randn(5, 8)
    linear(x, layer, activation="gelu").sum().backward()
    fused_grad = layer.weight.grad.clone()
    layer.weight.grad = None
    nn.functional.gelu(layer(x)).sum().backward()
    torch.testing.assert_close(fused_grad, layer.weight.grad)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_fused_equals_the_eager_reference_with_and_without_the_cache(norm, activation):
    from clearformer import Decoder, DecoderConfig

    torch.manual_seed(0)
    config = DecoderConfig(
        d_model=32, n_heads=4, n_layers=2, dim_mlp=64, norm=norm, activation=activation
    )
    decoder = Decoder(config).eval()
    B, T, S = 3, 6, 5
    x, memory = torch.randn(B, T, 32), torch.randn(B, S, 32)
    mask = torch.arange(T)[None, :] < torch.tensor([6, 4, 1])[:, None]  # (B, T)
    memory_mask = torch.arange(S)[None, :] < torch.tensor([5, 2, 3])[:, None]  # (B, S)
    x = torch.where(mask[..., None], x, float("nan"))  # padded rows must not matter
    memory = torch.where(memory_mask[..., None], memory, float("nan"))
    with torch.inference_mode():
        want = decoder(x, memory, mask, memory_mask, backend="math")
        got = decoder(x, memory, mask, memory_mask, backend="sdpa")
        assert _ran_fused(lambda: decoder(x, memory, mask, memory_mask, backend="sdpa"))
        # Step by step with the cache (all rows real), fused against eager.
        full = torch.nan_to_num(x[:1])
        steps = {}
        for backend in ("math", "sdpa"):
            cache = decoder.start_cache(memory[:1, :5])
            rows = []
            for t in range(T):
                y, cache = decoder(full[:, t : t + 1], None, cache=cache, backend=backend)
                rows.append(y)
            steps[backend] = torch.cat(rows, dim=1)  # (1, T, D)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got[~mask] == 0).all()
    torch.testing.assert_close(steps["sdpa"], steps["math"], atol=1e-5, rtol=1e-5)


def test_decoder_in_training_or_with_gradients_keeps_the_eager_layers():
    from clearformer import Decoder, DecoderConfig

    decoder = Decoder(DecoderConfig(d_model=16, n_heads=2, n_layers=1, dim_mlp=32))
    x, memory = torch.randn(2, 3, 16, requires_grad=True), torch.randn(2, 4, 16)
    assert not _ran_fused(lambda: decoder.eval()(x, memory).sum().backward())
    assert x.grad is not None and x.grad.abs().sum() > 0
    with torch.no_grad():
        assert not _ran_fused(lambda: decoder.train()(x, memory))
        assert _ran_fused(lambda: decoder.eval()(x, memory))


def _stack_and_call(kind: str):
    from clearformer import Decoder, DecoderConfig

    if kind == "encoder":
        encoder = _encoder("post")
        x, mask = _ragged()
        return encoder, lambda backend: encoder(x, mask, backend=backend)
    decoder = Decoder(DecoderConfig(d_model=32, n_heads=4, n_layers=1, dim_mlp=64)).eval()
    memory = torch.randn(2, 5, 32)
    return decoder, lambda backend: decoder(memory[:, :3], memory, backend=backend)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_hooks_inside_a_stack_see_what_the_eager_layers_give(kind):
    # A fused block adds the residual inside the feed-forward network's last product: a hook
    # on that network would see x + FFN(x). Any hook inside the stack keeps the eager layers.
    stack, call = _stack_and_call(kind)
    seen = []
    handle = stack.layers[0].mlp.register_forward_hook(lambda m, i, out: seen.append(out))
    with torch.no_grad():
        decision = fusion_decision(torch.device("cpu"), torch.float32, False, stack)
        assert decision.choice == "eager" and "forward hooks" in decision.reason
        assert not _ran_fused(lambda: call("sdpa"))
        seen.clear()
        call("sdpa")
        call("math")
    handle.remove()
    torch.testing.assert_close(seen[0], seen[1], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert _ran_fused(lambda: call("sdpa"))  # without the hook: fused again


def test_a_torchscript_trace_of_the_decoder_records_the_eager_layers():
    from clearformer import Decoder, DecoderConfig

    decoder = Decoder(DecoderConfig(d_model=16, n_heads=2, n_layers=1, dim_mlp=32)).eval()
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    with torch.no_grad():
        traced = torch.jit.trace(decoder, (x, memory), check_trace=False)
        torch.testing.assert_close(traced(x, memory), decoder(x, memory), atol=1e-5, rtol=1e-5)
