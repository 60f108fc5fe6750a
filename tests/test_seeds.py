"""Both seed layers, reproduced from their own parameter names (and their bugs left behind)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clearformer import EncoderBlock, MultiHeadAttention
from clearformer.interop.seeds import block_from_seed000, block_from_seed001

from .helpers import lengths_mask


class Seed000EncoderLayer(nn.Module):
    """Seed 000 as written (post-norm, no mask, ReLU, W_Q/W_K/W_V/W_O)."""

    def __init__(self, d_model, num_heads, dim_ff):
        super().__init__()
        self.num_heads, self.d_model, self.d_k = num_heads, d_model, d_model // num_heads
        self.attn_ln = nn.LayerNorm(d_model)
        self.ffn_ln = nn.LayerNorm(d_model)
        self.W_Q = nn.Linear(d_model, d_model)
        self.W_K = nn.Linear(d_model, d_model)
        self.W_V = nn.Linear(d_model, d_model)
        self.W_O = nn.Linear(d_model, d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, dim_ff), nn.ReLU(), nn.Linear(dim_ff, d_model))

    def forward(self, x):
        B, T, _ = x.shape
        Q = self.W_Q(x).view(B, T, self.num_heads, self.d_k).transpose(1, 2)
        K = self.W_K(x).view(B, T, self.num_heads, self.d_k).transpose(1, 2)
        V = self.W_V(x).view(B, T, self.num_heads, self.d_k).transpose(1, 2)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / (self.d_k**0.5)
        attn = torch.matmul(F.softmax(scores, dim=-1), V)
        attn = self.W_O(attn.transpose(1, 2).contiguous().view(B, T, self.d_model))
        x = self.attn_ln(x + attn)
        return self.ffn_ln(x + self.ffn(x))


class Seed001MultiHeadAttention(nn.Module):
    """Seed 001's attention as documented: Q, K, V without bias, Wo with bias, (B, T) mask."""

    def __init__(self, in_dim, qk_dim, v_dim, out_dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.Q = nn.Linear(in_dim, qk_dim, bias=False)
        self.K = nn.Linear(in_dim, qk_dim, bias=False)
        self.V = nn.Linear(in_dim, v_dim, bias=False)
        self.Wo = nn.Linear(v_dim, out_dim)

    def forward(self, queries, keys, values, mask=None):
        B, Tq, _ = queries.shape
        Tk, H = keys.shape[1], self.n_heads
        q = self.Q(queries).view(B, Tq, H, -1).transpose(1, 2)
        k = self.K(keys).view(B, Tk, H, -1).transpose(1, 2)
        v = self.V(values).view(B, Tk, H, -1).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if mask is not None:  # True = takes part; masks keys
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        w = torch.softmax(scores, -1)
        z = (w @ v).transpose(1, 2).reshape(B, Tq, -1)
        return self.Wo(z), w


class Seed001EncoderBlock(nn.Module):
    """Seed 001's block, with the residual as its documentation states: x + Attn(Norm(x))."""

    def __init__(self, d_model, n_heads, dim_mlp, buggy_residual=False):
        super().__init__()
        self.attn = Seed001MultiHeadAttention(d_model, d_model, d_model, d_model, n_heads)
        self.attn_norm = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, dim_mlp), nn.ReLU(), nn.Linear(dim_mlp, d_model)
        )
        self.mlp_norm = nn.LayerNorm(d_model)
        self.buggy_residual = buggy_residual

    def forward(self, x, mask=None):
        if self.buggy_residual:  # the seed's code: the residual carries Norm(x)
            x = self.attn_norm(x)
            z = x + self.attn(x, x, x, mask)[0]
            z = self.mlp_norm(z)
            return z + self.mlp(z)
        h = self.attn_norm(x)
        z = x + self.attn(h, h, h, mask)[0]
        return z + self.mlp(self.mlp_norm(z))


def randomize_norms(module):
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return module


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_seed000_is_a_post_norm_block(backend):
    seed = randomize_norms(Seed000EncoderLayer(8, 2, 32))  # the seed's own example sizes
    block = block_from_seed000(seed.state_dict(), num_heads=2, backend=backend).eval()
    assert block.norm == "post" and block.mlp.activation == "relu"
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(block(x), seed(x), atol=1e-5, rtol=1e-5)


def test_seed000_ignores_padding_but_clearformer_masks_it():
    seed = Seed000EncoderLayer(8, 2, 32)
    block = block_from_seed000(seed.state_dict(), num_heads=2).eval()
    mask = lengths_mask([5, 3])
    x = torch.randn(2, 5, 8)
    other = x.clone()
    other[1, 3:] = torch.randn(2, 8)  # change padding only
    with torch.no_grad():
        assert not torch.allclose(seed(x)[1, :3], seed(other)[1, :3])  # the seed's bug
        torch.testing.assert_close(block(x, mask)[mask], block(other, mask)[mask])


def test_seed000_mapping_is_strict():
    state = Seed000EncoderLayer(8, 2, 32).state_dict()
    state.pop("W_O.bias")
    with pytest.raises(ValueError, match="missing keys.*W_O.bias"):
        block_from_seed000(state, num_heads=2)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_seed001_block_is_standard_pre_norm(backend):
    seed = randomize_norms(Seed001EncoderBlock(16, 4, 64))
    block = block_from_seed001(seed.state_dict(), n_heads=4, backend=backend).eval()
    x = torch.randn(3, 6, 16)
    mask = lengths_mask([6, 1, 3])
    with torch.no_grad():
        want = seed(x, mask)
        got = block(x, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)


def test_seed001_residual_bug_is_not_reproduced():
    """The seed's code cuts the residual stream: its output ignores the input's scale."""
    buggy = randomize_norms(Seed001EncoderBlock(16, 4, 64, buggy_residual=True))
    block = block_from_seed001(buggy.state_dict(), n_heads=4).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(buggy(x), buggy(3 * x), atol=1e-4, rtol=1e-4)
        assert not torch.allclose(block(x), block(3 * x), atol=1e-2)


def test_seed001_attention_interface():
    """(in_dim, qk_dim, v_dim, out_dim, n_heads, attn_dropout) -> (out, attn_weights)."""
    seed = Seed001MultiHeadAttention(12, 8, 20, 6, 2)
    attn = MultiHeadAttention(12, 8, 20, 6, 2, 0.0, backend="math").eval()
    with torch.no_grad():
        attn.in_proj.weight.copy_(torch.cat([seed.Q.weight, seed.K.weight, seed.V.weight]))
        attn.in_proj.bias.zero_()
        attn.out_proj.load_state_dict(seed.Wo.state_dict())
    x = torch.randn(2, 5, 12)
    mask = lengths_mask([5, 2])
    out, weights = attn(x, x, x, mask=mask, need_weights=True)
    want, want_w = seed(x, x, x, mask)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-5)


def test_seed001_block_signature():
    block = EncoderBlock(16, 4, 64, 0.1)  # EncoderBlock(d_model, n_heads, dim_mlp, dropout)
    assert block.norm == "pre"
    assert block.attn.attn_dropout == 0.1 and block.attn_residual_dropout.p == 0.1
