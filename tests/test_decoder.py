"""The decoder stack: incremental decoding with a cache equals the full causal call, padded
positions never reach real ones, and every backend agrees with torch.nn."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clearformer import Decoder, DecoderBlock, DecoderCache, DecoderConfig, from_torch


def _stack(norm: str, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    config = DecoderConfig(d_model=16, n_heads=4, n_layers=3, dim_mlp=32, norm=norm)
    return Decoder(config).eval()


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x, memory = torch.randn(3, 6, 16, generator=g), torch.randn(3, 8, 16, generator=g)
    mask = torch.arange(6)[None] < torch.tensor([6, 4, 1])[:, None]  # (B, T)
    memory_mask = torch.arange(8)[None] < torch.tensor([8, 3, 5])[:, None]  # (B, S)
    return x, memory, mask, memory_mask


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
def test_step_by_step_with_a_cache_equals_the_full_causal_call(norm, backend):
    decoder = _stack(norm)
    x, memory, _, memory_mask = _inputs()
    with torch.no_grad():
        full = decoder(x, memory, None, memory_mask, backend=backend)  # (B, T, D)
        cache = decoder.start_cache(memory)
        steps = []
        for t in range(x.shape[1]):
            y, cache = decoder(x[:, t : t + 1], None, memory_mask=memory_mask, cache=cache)
            steps.append(y)
        assert isinstance(cache, DecoderCache) and cache.length == x.shape[1]
        # Two new rows at once after a cached prefix: causal within them, all of the prefix.
        cache2 = decoder.start_cache(memory)
        _, cache2 = decoder(x[:, :4], None, memory_mask=memory_mask, cache=cache2)
        tail, _ = decoder(x[:, 4:], None, memory_mask=memory_mask, cache=cache2)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-6, rtol=0)
    torch.testing.assert_close(tail, full[:, 4:], atol=2e-6, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
def test_stack_equals_torch_nn_with_a_causal_mask(norm_first, backend):
    torch.manual_seed(2)
    layer = nn.TransformerDecoderLayer(
        16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first, activation="gelu"
    )
    stack = nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(16)).eval()
    ours = from_torch(stack)
    x, memory, mask, memory_mask = _inputs()
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    with torch.no_grad():
        want = stack(
            x,
            memory,
            tgt_mask=causal,
            tgt_is_causal=True,
            tgt_key_padding_mask=~mask,
            memory_key_padding_mask=~memory_mask,
        )
        got = ours(x, memory, mask, memory_mask, backend=backend)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)
    assert (got[~mask] == 0).all()


def test_padded_positions_never_reach_real_ones():
    decoder = _stack("pre")
    x, memory, mask, memory_mask = _inputs()
    with torch.no_grad():
        clean = decoder(x, memory, mask, memory_mask)
        dirty_x = torch.where(mask[..., None], x, float("nan"))
        dirty_memory = torch.where(memory_mask[..., None], memory, 1e30)
        for backend in ("math", "sdpa"):
            dirty = decoder(dirty_x, dirty_memory, mask, memory_mask, backend=backend)
            assert not dirty.isnan().any()
            torch.testing.assert_close(dirty, clean, atol=1e-6, rtol=0)


def test_a_memory_with_no_real_token_gives_finite_rows():
    decoder = _stack("post")
    x, memory, mask, memory_mask = _inputs()
    memory_mask[1] = False
    for backend in ("math", "sdpa", "auto"):
        with torch.no_grad():
            out = decoder(x, memory, mask, memory_mask, backend=backend)
        assert torch.isfinite(out).all(), backend


def test_block_converts_from_torch_in_either_batch_layout():
    torch.manual_seed(4)
    for batch_first in (True, False):
        layer = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=batch_first)
        layer.eval()
        block = from_torch(layer)
        x, memory, _, _ = _inputs()
        causal = nn.Transformer.generate_square_subsequent_mask(6)
        with torch.no_grad():
            if batch_first:
                want = layer(x, memory, tgt_mask=causal, tgt_is_causal=True)
            else:
                want = layer(
                    x.transpose(0, 1), memory.transpose(0, 1), tgt_mask=causal, tgt_is_causal=True
                ).transpose(0, 1)
            torch.testing.assert_close(block(x, memory), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda d, x, m: d(x, None), ValueError, "memory must be a (B, S, D) tensor"),
        (lambda d, x, m: d(x, m[:2]), ValueError, "memory must have batch size 3"),
        (lambda d, x, m: d(x[..., :8], m), ValueError, "x must have shape (B, T, d_model=16)"),
        (lambda d, x, m: d(x, m, backend="varlen"), ValueError, "padded layout"),
        (
            lambda d, x, m: d(x, None, torch.ones(3, 6, dtype=torch.bool), cache=d.start_cache(m)),
            ValueError,
            "mask must be None with a cache",
        ),
        (lambda d, x, m: d(x, m, cache=("k", "v")), TypeError, "cache must be a DecoderCache"),
        (
            lambda d, x, m: d(x, m, cache=d.start_cache(m)),
            ValueError,
            "memory must be None with a cache",
        ),
        (lambda d, x, m: d(x, m, torch.ones(3, 5, dtype=torch.bool)), ValueError, "mask"),
    ],
)
def test_bad_input_is_named(call, error, words):
    decoder = _stack("pre")
    x, memory, _, _ = _inputs()
    with pytest.raises(error) as info:
        call(decoder, x, memory)
    assert words in str(info.value)


def test_from_torch_dispatches_to_the_decoder_converters():
    layer = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    assert isinstance(from_torch(layer), DecoderBlock)
    assert isinstance(from_torch(nn.TransformerDecoder(layer, 2)), Decoder)
