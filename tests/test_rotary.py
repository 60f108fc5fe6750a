"""Rotary positions as the fast path applies them, against the formula written out: the same
bits in float32 and bfloat16, with and without gradients, the input left as it was."""

from __future__ import annotations

import pytest
import torch

from clearformer.positions import apply_rotary, rotary_tables


def formula(x, cos, sin):
    """x * cos + rotate_half(x) * sin in float32, back to x's dtype (Su et al., 2021)."""
    wide = x.float()
    first, second = wide.chunk(2, dim=-1)
    return (wide * cos + torch.cat([-second, first], dim=-1) * sin).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [True, False])
def test_it_equals_the_formula_bit_for_bit_and_leaves_its_input(dtype, packed):
    g = torch.Generator().manual_seed(0)
    if packed:  # (N, H, Dh) rows, tables (N, 1, Dh)
        x = torch.randn(300, 4, 64, generator=g).to(dtype)
        positions = torch.arange(300) * 37  # far positions: angles in the thousands
    else:  # (B, H, T, Dh) rows, tables (B, 1, T, Dh)
        x = torch.randn(2, 4, 50, 32, generator=g).to(dtype)
        positions = torch.arange(100).view(2, 50)
    cos, sin = (
        t.unsqueeze(-2 if packed else 1) for t in rotary_tables(positions, x.shape[-1], 1e4)
    )
    kept = x.clone()
    with torch.no_grad():
        got = apply_rotary(x, cos, sin)
    assert torch.equal(x, kept)
    assert got.dtype == dtype and torch.equal(got, formula(x, cos, sin))
    # A rotation keeps each pair's length: the test's formula is the rotation it claims.
    pairs = torch.stack(got.float().chunk(2, dim=-1)).norm(dim=0)
    torch.testing.assert_close(
        pairs,
        torch.stack(x.float().chunk(2, -1)).norm(dim=0),
        atol=0.05 if dtype == torch.bfloat16 else 1e-5,
        rtol=0.02 if dtype == torch.bfloat16 else 1e-5,
    )
    leaf = x.float().requires_grad_()
    with torch.enable_grad():
        traced = apply_rotary(leaf, cos, sin)
        traced.sum().backward()
    assert torch.equal(traced.detach(), formula(leaf.detach(), cos, sin))
    assert leaf.grad is not None
