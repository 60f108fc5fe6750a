"""MultiHeadAttention and its backends: agreement, masks, weights, edge rows, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clearformer import MultiHeadAttention
from clearformer.attention import math_attention, sdpa_attention
from clearformer.masks import causal_mask

from .helpers import lengths_mask

PADDED_BACKENDS = ("math", "sdpa")


def reference_mha(attn: MultiHeadAttention, query, key, value, mask_4d):
    """Multi-head attention written from the textbook, with the module's own parameters."""
    (wq, bq), (wk, bk), (wv, bv) = attn.projection_weights()
    H = attn.n_heads
    B, Tq, _ = query.shape
    Tk = key.shape[1]
    q = F.linear(query, wq, bq).view(B, Tq, H, -1).transpose(1, 2)
    k = F.linear(key, wk, bk).view(B, Tk, H, -1).transpose(1, 2)
    v = F.linear(value, wv, bv).view(B, Tk, H, -1).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask_4d is not None:
        scores = scores.masked_fill(~mask_4d, float("-inf"))
    weights = torch.softmax(scores, -1)
    weights = torch.nan_to_num(weights, nan=0.0)  # rows with no key: zero by definition
    out = (weights @ v).transpose(1, 2).reshape(B, Tq, -1)
    return attn.out_proj(out), weights


def random_masks(B: int, H: int, Tq: int, Tk: int) -> dict[str, torch.Tensor | None]:
    lengths = [1, Tk, max(1, Tk // 2)][:B] + [Tk] * max(0, B - 3)
    key_padding = lengths_mask(lengths, Tk)
    dense = torch.rand(B, Tq, Tk) > 0.4
    dense[0, 0] = False  # one query row with no key at all
    per_head = torch.rand(B, H, Tq, Tk) > 0.4
    return {"none": None, "key_padding": key_padding, "dense": dense, "per_head": per_head}


def as_4d(mask, B, H, Tq, Tk):
    if mask is None:
        return None
    if mask.dim() == 2:
        return mask[:, None, None, :].expand(B, H, Tq, Tk)
    if mask.dim() == 3:
        return mask[:, None].expand(B, H, Tq, Tk)
    return mask


@pytest.mark.parametrize("backend", PADDED_BACKENDS)
@pytest.mark.parametrize("mask_kind", ["none", "key_padding", "dense", "per_head"])
def test_backends_match_textbook_reference_self_attention(backend, mask_kind):
    B, T, D, H = 3, 6, 16, 4
    attn = MultiHeadAttention(D, D, D, D, H, backend=backend).eval()
    x = torch.randn(B, T, D)
    mask = random_masks(B, H, T, T)[mask_kind]
    out, _ = attn(x, x, x, mask)
    ref, _ = reference_mha(attn, x, x, x, as_4d(mask, B, H, T, T))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", PADDED_BACKENDS)
def test_cross_attention_with_distinct_widths(backend):
    """Seed 001's interface: qk_dim != v_dim != out_dim, kv from another width, Tk != Tq."""
    B, Tq, Tk, H = 2, 5, 9, 2
    attn = MultiHeadAttention(12, 8, 20, 6, H, kv_dim=10, backend=backend).eval()
    query, memory = torch.randn(B, Tq, 12), torch.randn(B, Tk, 10)
    mask = lengths_mask([3, 9], Tk)
    out, _ = attn(query, memory, memory, mask)
    assert out.shape == (B, Tq, 6)
    ref, _ = reference_mha(attn, query, memory, memory, as_4d(mask, B, H, Tq, Tk))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # Distinct key and value tensors take a third path through the projections.
    values = torch.randn(B, Tk, 10)
    out2, _ = attn(query, memory, values, mask)
    ref2, _ = reference_mha(attn, query, memory, values, as_4d(mask, B, H, Tq, Tk))
    torch.testing.assert_close(out2, ref2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", PADDED_BACKENDS)
@pytest.mark.parametrize("tq,tk", [(6, 6), (2, 6)])
def test_causal_and_combined_with_key_padding(backend, tq, tk):
    B, D, H = 2, 8, 2
    attn = MultiHeadAttention(D, D, D, D, H, backend=backend).eval()
    q, kv = torch.randn(B, tq, D), torch.randn(B, tk, D)
    key_padding = lengths_mask([tk, 3], tk)
    causal = causal_mask(tq, tk)
    for mask, want in (
        (None, causal.expand(B, H, tq, tk)),
        (key_padding, key_padding[:, None, None, :] & causal),
    ):
        out, _ = attn(q, kv, kv, mask, is_causal=True)
        ref, _ = reference_mha(attn, q, kv, kv, want)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_causal_mask_is_bottom_right_aligned():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_weights_sum_to_one_and_are_exactly_zero_on_masked_keys():
    B, T, D, H = 3, 7, 16, 4
    attn = MultiHeadAttention(D, D, D, D, H).eval()
    x = torch.randn(B, T, D)
    mask = lengths_mask([2, 7, 5])
    _, w = attn(x, mask=mask, need_weights=True)
    assert w.shape == (B, H, T, T)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
    masked = ~mask[:, None, None, :].expand_as(w)
    assert masked.any()
    assert (w[masked] == 0).all()
    assert attn.plan_for(x, need_weights=True).kernel.choice == "math"


@pytest.mark.parametrize("backend", PADDED_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_query_with_no_key_gives_zeros_and_finite_gradients(backend, dtype):
    B, T, D, H = 2, 4, 8, 2
    attn = MultiHeadAttention(D, D, D, D, H, bias=False, backend=backend).to(dtype)
    x = torch.randn(B, T, D, dtype=dtype, requires_grad=True)
    dense = torch.ones(B, T, T, dtype=torch.bool)
    dense[0, 1] = False  # query 1 of sequence 0 may see no key
    full_pad = lengths_mask([0, T], T)  # sequence 0 has no real key at all
    for mask in (dense, full_pad):
        out, _ = attn(x, mask=mask)
        assert torch.isfinite(out).all()
        # Without bias the output projection of a zero context is exactly zero.
        if mask is dense:
            assert (out[0, 1] == 0).all()
        else:
            assert (out[0] == 0).all()
        (grad,) = torch.autograd.grad(out.float().sum(), x)
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_backend_functions_zero_rows_without_keys(dtype):
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=dtype) for _ in range(3))
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    mask[..., 2, :] = False
    for fn in (math_attention, sdpa_attention):
        out, _ = fn(q, k, v, mask)
        assert (out[..., 2, :] == 0).all()
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("backend", PADDED_BACKENDS)
def test_gradcheck_float64(backend):
    B, T, D, H = 2, 4, 6, 2
    attn = MultiHeadAttention(D, D, D, D, H, backend=backend).double()
    x = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    mask = lengths_mask([2, 4])
    assert torch.autograd.gradcheck(lambda t: attn(t, mask=mask)[0], (x,), eps=1e-6, atol=1e-5)


def test_attention_dropout_only_in_training():
    attn = MultiHeadAttention(8, 8, 8, 8, 2, attn_dropout=0.5, backend="math")
    x = torch.randn(2, 5, 8)
    attn.eval()
    a, b = attn(x)[0], attn(x)[0]
    torch.testing.assert_close(a, b)
    attn.train()
    assert not torch.allclose(attn(x)[0], attn(x)[0])


def test_auto_reports_its_choice_and_reason():
    from clearformer.padding import unpad

    attn = MultiHeadAttention(8, 8, 8, 8, 2)
    x = torch.randn(2, 3, 8)
    assert attn.plan_for(x).kernel.choice == "sdpa"
    assert "weights" in attn.plan_for(x, need_weights=True).kernel.reason
    rows, layout = unpad(x, lengths_mask([3, 1]))
    assert attn.plan_for(rows, layout=layout).kernel.choice == "varlen"
    assert str(attn.plan_for(x).kernel).startswith("sdpa (")
    assert attn.plan_for(x, backend="math").kernel.choice == "math"  # per call
    assert attn.backend == "auto"  # and nothing stored
