"""The layer kinds of decoder-born embedders against transformers' own modules: grouped-query
attention, RMSNorm (with Gemma's 1 + weight), per-head q/k norms, causal attention, Gemma3's
local and global layers with their rotary bases and window, embedding scaling, GeGLU (tanh)
and SwiGLU, explicit head width and score scale.

Tiny random ``Qwen3Model`` and ``Gemma3TextModel`` models are built offline; their weights are
copied by hand into a clearformer ``EncoderModel`` (tests/layer_kinds_helpers.py) and the
hidden states compared on ragged batches, right and left padded, on every backend. Each kind
has a negative control: the same comparison with the kind switched off fails.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from clearformer import EncoderModel
from clearformer.norms import RMSNorm

from .layer_kinds_helpers import (
    gemma3,
    gemma3_config,
    max_diff_on_tokens,
    qwen3,
    qwen3_config,
    ragged,
    twin,
)

transformers = pytest.importorskip("transformers")

TOL = 1e-5
LENGTHS = [9, 5, 1, 7]  # a window of 4 or 3 is shorter than most of them
BACKENDS = ["math", "sdpa", "varlen", "auto"]


def hf_states(hf, ids, mask, positions):
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state


def ours_states(model, ids, mask, backend):
    with torch.no_grad():
        return model(ids, mask, backend=backend)


def diff_from_hf(model, hf, backend: str = "sdpa", left: bool = False) -> float:
    """max |clearformer - transformers| over the real tokens of a ragged batch."""
    ids, mask, positions = ragged(LENGTHS, left=left)
    got, want = ours_states(model, ids, mask, backend), hf_states(hf, ids, mask, positions)
    return max_diff_on_tokens(got, want, mask)


# -- norms ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_qwen3_and_gemma3_norms(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x = (torch.randn(3, 5, 32) * 4).to(dtype)
    weight = torch.randn(32) * 0.5
    for theirs, offset in ((Qwen3RMSNorm(32, eps=1e-6), False), (Gemma3RMSNorm(32, 1e-6), True)):
        ours = RMSNorm(32, 1e-6, unit_offset=offset)
        with torch.no_grad():
            theirs.weight.copy_(weight)
            ours.weight.copy_(weight)
        theirs, ours = theirs.to(dtype), ours.to(dtype)
        with torch.no_grad():
            want, got = theirs(x), ours(x)
        assert got.dtype == want.dtype
        # Same steps, same roundings: equal, in bfloat16 too.
        assert torch.equal(got, want), (type(theirs).__name__, (got - want).abs().max())


def test_dropping_gemmas_unit_offset_changes_the_norm():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    theirs, ours = Gemma3RMSNorm(32, 1e-6), RMSNorm(32, 1e-6, unit_offset=False)
    x = torch.randn(4, 32)
    with torch.no_grad():
        theirs.weight.normal_(0.0, 0.5)
        ours.weight.copy_(theirs.weight)  # the checkpoint's weight, read without the offset
        assert (ours(x) - theirs(x)).abs().max() > 0.1


# -- Qwen3: causal, GQA, q/k norms, SwiGLU, a head width of its own ---------------------------
@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4], ids=["mqa", "gqa", "mha"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_qwen3_hidden_states_match_transformers(n_kv_heads, backend, left):
    hf = qwen3(n_kv_heads)
    model = twin(hf, qwen3_config(hf))
    ids, mask, positions = ragged(LENGTHS, left=left)
    want = hf_states(hf, ids, mask, positions)
    got = ours_states(model, ids, mask, backend)
    assert max_diff_on_tokens(got, want, mask) <= TOL
    assert (got[~mask.bool()] == 0).all()


def test_qwen3_run_bidirectionally_does_not_match():
    """Negative control: the same weights without the causal mask give other states."""
    hf = qwen3()
    model = twin(hf, qwen3_config(hf, causal=False))
    assert diff_from_hf(model, hf) > 1e-2


def test_qwen3_without_qk_norm_does_not_match():
    hf = qwen3()
    config = qwen3_config(hf, qk_norm=False)
    model = EncoderModel(config).eval()
    state = twin(hf, qwen3_config(hf)).state_dict()
    qk = (".q_norm.", ".k_norm.")
    model.load_state_dict({k: v for k, v in state.items() if not any(n in k for n in qk)})
    assert diff_from_hf(model, hf) > 1e-2


# -- Gemma3: local/global layers, (1 + w) norms on both sides, GeGLU tanh, scaled embeddings --
@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma3_hidden_states_match_transformers(bidirectional, backend, left):
    # Odd window when causal (3 keys), even when bidirectional (|i - j| <= 2): both conventions.
    hf = gemma3(n_kv_heads=2, bidirectional=bidirectional, window=4 if bidirectional else 3)
    model = twin(hf, gemma3_config(hf))
    ids, mask, positions = ragged(LENGTHS, left=left)
    want = hf_states(hf, ids, mask, positions)
    got = ours_states(model, ids, mask, backend)
    assert max_diff_on_tokens(got, want, mask) <= TOL


@pytest.mark.parametrize("n_kv_heads", [1, 4])
def test_gemma3_multi_query_and_multi_head(n_kv_heads):
    hf = gemma3(n_kv_heads=n_kv_heads, window=5, pattern=("local", "global", "local"))
    model = twin(hf, gemma3_config(hf, pattern=("local", "global", "local")))
    ids, mask, positions = ragged(LENGTHS)
    for backend in ("math", "varlen"):
        got = ours_states(model, ids, mask, backend)
        assert max_diff_on_tokens(got, hf_states(hf, ids, mask, positions), mask) <= TOL


@pytest.mark.parametrize(
    "change",
    [
        dict(norm_unit_offset=False),  # the (1 + weight) scaling dropped
        dict(causal=True),  # a bidirectional model run causally
        dict(local_window=2),  # a window half as wide (|i - j| <= 1)
        dict(local_window=6),  # or wider
        dict(scale_embeddings=False),
        dict(attn_scale=None),  # head_dim ** -0.5 instead of query_pre_attn_scalar ** -0.5
        dict(local_rope_theta=1_000_000.0),  # the global base on local layers
        dict(activation="geglu"),  # the exact GELU for Gemma's tanh
    ],
    ids=lambda c: next(iter(c)),
)
def test_gemma3_negative_controls(change):
    """Each kind is needed: the comparison above fails without it."""
    hf = gemma3(n_kv_heads=2, window=4)
    good = gemma3_config(hf)
    weights = twin(hf, good).state_dict()
    model = EncoderModel(dataclasses.replace(good, **change)).eval()
    model.load_state_dict(weights)
    diff = diff_from_hf(model, hf)
    assert diff > 10 * TOL, f"{change}: still matches ({diff:.1e})"


def test_gemma3_window_is_symmetric_and_half_the_stated_size():
    """transformers' bidirectional Gemma3 halves config.json's window in memory (w // 2 + 1,
    exclusive): a query sees |i - j| <= w // 2. Read off its own mask."""
    from transformers.masking_utils import create_sliding_window_causal_mask
    from transformers.models.gemma3.modeling_gemma3 import _bidirectional_window_overlay

    hf = gemma3(window=6)
    T = 10
    embeds = torch.zeros(1, T, hf.config.hidden_size)
    mask = create_sliding_window_causal_mask(
        config=hf.config,
        inputs_embeds=embeds,
        attention_mask=torch.ones(1, T, dtype=torch.long),
        cache=None,
        position_ids=torch.arange(T)[None],
        or_mask_function=_bidirectional_window_overlay(hf.config.sliding_window),
    )
    allowed = mask[0, 0] == 0 if mask.dtype != torch.bool else mask[0, 0]
    rows = torch.arange(T)
    want = (rows[:, None] - rows[None, :]).abs() <= gemma3_config(hf).window_of("local")
    assert torch.equal(allowed, want)
    assert gemma3_config(hf).window_of("local") == 3


# -- embedding scaling ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_scale_is_rounded_to_the_table_dtype_as_gemma_does(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    from clearformer import EncoderConfig
    from clearformer.embeddings import Embeddings

    d = 768  # sqrt(768) = 27.71..., 27.75 in bfloat16
    config = EncoderConfig(
        d_model=d, n_heads=12, vocab_size=50, positions="rotary", scale_embeddings=True
    )
    ours = Embeddings(config).to(dtype).eval()
    theirs = Gemma3TextScaledWordEmbedding(50, d, 0, embed_scale=d**0.5).to(dtype)
    theirs.embed_scale.fill_(d**0.5)  # a buffer built in float32, as transformers loads it
    with torch.no_grad():
        theirs.weight.copy_(ours.word.weight)
        ids = torch.arange(50)[None]
        assert torch.equal(ours(ids), theirs(ids))
        if dtype == torch.bfloat16:  # an unrounded factor would differ
            assert not torch.equal(ours.word(ids) * d**0.5, theirs(ids))


# -- a lone attention layer with grouped keys and a per-head mask -----------------------------
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_lone_grouped_attention_with_a_per_head_mask(backend):
    from clearformer import MultiHeadAttention

    torch.manual_seed(4)
    attn = MultiHeadAttention(32, 48, 48, 32, 4, n_kv_heads=2, scale=0.3).eval()
    x = torch.randn(2, 6, 32)
    mask = torch.rand(2, 4, 6, 6) > 0.4
    mask[..., 0] = True  # every query some key
    mask[1, 2:, :, 5] = False  # a key one group of query heads never uses (zeroed for it)
    with torch.no_grad():
        out, _ = attn(x, mask=mask, backend=backend)
        wq, wk, wv = attn.in_proj.weight.split(list(attn.proj_sizes))
        q = (x @ wq.T + attn.in_proj.bias[:48]).view(2, 6, 4, 12).transpose(1, 2)
        bk, bv = attn.in_proj.bias[48:72], attn.in_proj.bias[72:]
        k = (x @ wk.T + bk).view(2, 6, 2, 12).transpose(1, 2).repeat_interleave(2, dim=1)
        v = (x @ wv.T + bv).view(2, 6, 2, 12).transpose(1, 2).repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf"))
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 48)
        want = attn.out_proj(ctx)
    assert (out - want).abs().max() <= TOL


def test_to_torch_refuses_the_kinds_torch_nn_lacks():
    from clearformer import Encoder, EncoderConfig
    from clearformer.interop.torch_nn import to_torch

    for fields in (
        dict(n_kv_heads=2),
        dict(norm_kind="rms"),
        dict(qk_norm=True),
        dict(head_dim=12),
        dict(causal=True),
    ):
        encoder = Encoder(EncoderConfig(d_model=32, n_heads=4, n_layers=1, dim_mlp=48, **fields))
        with pytest.raises(ValueError, match="torch.nn"):
            to_torch(encoder)
