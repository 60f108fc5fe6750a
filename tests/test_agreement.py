"""Every production route against the reference encoder (clearformer/reference.py).

The reference runs in float64 on a copy of the model; production runs the model itself in
float32 on each backend, varlen method, with its linear layers fused and eager, with the
AVX-512 kernels where they build, and in int8 (compared by cosine). The batches have left and
right padding, a fully padded row, holes in the mask (for global layers) and NaN at every padded
position, so a route that lets padding leak, drops a residual or a norm, or moves a position
gives another result than the reference. The families cover every layer kind: post- and
pre-norm, LayerNorm and RMSNorm (Gemma's 1 + weight too), branch norms, grouped keys and
values, heads wider than D / H, q/k norms, causal and bidirectional, local and global layers.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from clearformer import DecoderBlock, Encoder, EncoderConfig, reference
from clearformer.fast import fused_linear
from clearformer.options import Decision

from .helpers import needs_avx512_library

D, H = 64, 4
ATOL = 2e-5

FAMILIES = {
    # BERT: post-norm, exact GELU.
    "bert": dict(norm="post", activation="gelu", norm_eps=1e-12),
    # A pre-norm stack with a gated feed-forward (the seeds' EncoderBlock, SwiGLU).
    "pre-swiglu": dict(norm="pre", activation="swiglu"),
    # ModernBERT: pre-norm GeGLU, rotary positions, local layers between global ones.
    "modernbert": dict(
        norm="pre",
        activation="geglu",
        positions="rotary",
        local_window=4,
        global_every=2,
        rope_theta=160_000.0,
        local_rope_theta=10_000.0,
        first_attn_norm=False,
        bias=False,
    ),
    # MPNet: post-norm, a relative position bias shared by every layer.
    "mpnet": dict(
        norm="post",
        activation="gelu",
        relative_attention_buckets=8,
        relative_attention_max_distance=16,
    ),
    # The seeds' post-norm layer with ReLU and tanh-GELU.
    "post-relu": dict(norm="post", activation="relu"),
    "pre-gelu-tanh": dict(norm="pre", activation="gelu_tanh"),
    # Qwen3: causal, grouped keys (2 of 4 heads), heads wider than D / H, per-head q/k RMSNorm,
    # RMSNorm, SwiGLU, rotary positions, no biases.
    "qwen3": dict(
        norm="pre",
        activation="swiglu",
        norm_kind="rms",
        norm_eps=1e-6,
        qk_norm=True,
        n_kv_heads=2,
        head_dim=24,
        causal=True,
        positions="rotary",
        bias=False,
    ),
    # EmbeddingGemma (Gemma3, bidirectional): local, local, global layers with their own rotary
    # bases, one key/value head, (1 + weight) RMSNorms on both sides of each branch, GeGLU with
    # the tanh GELU, a score scale of its own.
    "gemma3": dict(
        norm="pre",
        activation="geglu_tanh",
        norm_kind="rms",
        norm_unit_offset=True,
        branch_norm=True,
        qk_norm=True,
        n_kv_heads=1,
        head_dim=24,
        attn_scale=20**-0.5,
        positions="rotary",
        rope_theta=1_000_000.0,
        local_rope_theta=10_000.0,
        layer_pattern=("local", "local", "global"),
        local_window=4,
        bias=False,
    ),
    # Gemma3 as a causal model: a causal window of the 3 most recent keys.
    "gemma3-causal": dict(
        norm="pre",
        activation="geglu_tanh",
        norm_kind="rms",
        norm_unit_offset=True,
        branch_norm=True,
        qk_norm=True,
        n_kv_heads=2,
        head_dim=24,
        positions="rotary",
        layer_pattern=("local", "global", "local"),
        local_window=3,
        causal=True,
        bias=False,
    ),
    # Post-norm causal attention with grouped keys, LayerNorms and biases.
    "post-causal-gqa": dict(norm="post", activation="gelu", causal=True, n_kv_heads=2),
}


def encoder_of(family: str, seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    config = EncoderConfig(d_model=D, n_heads=H, n_layers=3, dim_mlp=96, **FAMILIES[family])
    encoder = Encoder(config).eval()
    with torch.no_grad():  # norms away from their identity initialisation
        for name, p in encoder.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return encoder


def batch(holes: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, D) rows with NaN at every padded position, and their (B, T) mask: right padding,
    left padding, a full row, a fully padded row, and (``holes``) a row with gaps."""
    torch.manual_seed(1)
    T = 9
    rows = [
        [1] * 6 + [0] * 3,  # right padding
        [0] * 4 + [1] * 5,  # left padding
        [1] * 9,  # no padding
        [0] * 9,  # nothing real
        [1, 1, 1, 1, 1, 1, 1, 1, 0],  # runs of unequal lengths
    ]
    if holes:
        rows.append([1, 0, 1, 1, 0, 0, 1, 1, 0])
    mask = torch.tensor(rows, dtype=torch.bool)
    x = torch.randn(len(rows), T, D)
    x[~mask] = float("nan")
    return x, mask


def reference_of(encoder: Encoder, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    wide = copy.deepcopy(encoder).double()
    with torch.no_grad():
        last, _, _ = reference.encoder(wide, x.double(), mask)
    return last


def with_method(plan, method: str):
    """``plan`` with every layer's varlen method ``method``."""
    choice = Decision(method, "chosen by the test")
    layers = tuple(dataclasses.replace(p, method=choice) for p in plan.layers)
    return dataclasses.replace(plan, layers=layers)


def production(encoder, x, mask, *, backend, method=None, fused=True):
    """The encoder's own forward on ``backend`` (and varlen ``method``), its linear layers fused
    (inference) or eager (a call with gradients enabled)."""
    context = torch.no_grad() if fused else torch.enable_grad()
    with context:
        plan = encoder.plan_for(mask, backend=backend, dtype=x.dtype)
        assert plan.fused_linear == (fused and backend != "math"), str(plan)
        if method is not None:
            plan = with_method(plan, method)
        return encoder.run(x, plan).detach()


def assert_agrees(out: torch.Tensor, want: torch.Tensor, mask: torch.Tensor, what: str) -> None:
    assert not out.isnan().any(), f"{what}: NaN in the output"
    assert (out[~mask] == 0).all(), f"{what}: padded positions are not zero"
    err = (out.double() - want).abs().max().item()
    assert err <= ATOL, f"{what}: max |production - reference| = {err:.2e}"


ROUTES = [
    ("math", None),
    ("sdpa", None),
    ("varlen", "sequence"),
    ("varlen", "padded"),
    ("varlen", "threads"),
    ("varlen", None),  # what auto takes on this machine
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize("backend,method", ROUTES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_route_agrees_with_the_reference(family, backend, method, fused):
    encoder = encoder_of(family)
    # Local windows and a relative bias read distances off the row index: they take masks whose
    # real tokens are one run per sequence (planning refuses others).
    holes = (
        FAMILIES[family].get("local_window") is None
        and "relative_attention_buckets" not in (FAMILIES[family])
    )
    x, mask = batch(holes)
    want = reference_of(encoder, x, mask)
    out = production(encoder, x, mask, backend=backend, method=method, fused=fused)
    assert_agrees(out, want, mask, f"{family} {backend}/{method} fused={fused}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hidden_states_and_attention_weights_agree_with_the_reference(family):
    encoder = encoder_of(family)
    x, mask = batch(holes=False)
    wide = copy.deepcopy(encoder).double()
    with torch.no_grad():
        _, hidden, weights = reference.encoder(wide, x.double(), mask)
        out = encoder(x, mask, output_hidden_states=True, output_attentions=True)
        packed = encoder(x, mask, backend="varlen", output_hidden_states=True)
    for got, want in zip(out.hidden_states, hidden, strict=True):
        assert (got.double() - want).abs().max() <= ATOL
    for got, want in zip(packed.hidden_states, hidden, strict=True):
        assert (got.double() - want).abs().max() <= ATOL
    for got, want in zip(out.attentions, weights, strict=True):
        assert (got.double() - want).abs().max() <= ATOL


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "eager"])
def test_the_decoder_block_agrees_with_the_reference(norm, backend, fused):
    torch.manual_seed(2)
    block = DecoderBlock(D, H, 96, norm=norm, activation="gelu").eval()
    x, memory = torch.randn(3, 7, D), torch.randn(3, 5, D)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [0] * 7], dtype=torch.bool)
    memory_mask = torch.tensor([[1] * 5, [1] * 2 + [0] * 3, [1] * 5], dtype=torch.bool)
    x[~mask] = float("nan")
    memory = memory.masked_fill(~memory_mask[..., None], 0.0)
    with torch.no_grad():
        want = reference.decoder_block(
            copy.deepcopy(block).double(), x.double(), memory.double(), mask, memory_mask
        )
    with torch.no_grad() if fused else torch.enable_grad():
        out = block(x, memory, mask, memory_mask, backend=backend).detach()
    assert_agrees(out, want, mask, f"decoder {norm} {backend} fused={fused}")


@pytest.mark.parametrize("family", ["bert", "modernbert", "mpnet", "qwen3", "gemma3"])
def test_int8_agrees_with_the_reference_by_cosine(family):
    from clearformer.quant import int8_support, quantize_int8

    if not int8_support().available:
        pytest.skip(f"no int8 products here: {int8_support().reason}")
    encoder = encoder_of(family)
    x, mask = batch(holes=False)
    want = reference_of(encoder, x, mask)
    quantized = quantize_int8(encoder)
    with torch.no_grad():
        out = quantized(x, mask)
    assert not out.isnan().any() and (out[~mask] == 0).all()
    cosine = F.cosine_similarity(out[mask].double(), want[mask], dim=-1)
    assert cosine.min() >= 0.99, f"{family} int8: min cosine {cosine.min():.4f}"


@pytest.mark.parametrize("family", ["bert", "pre-gelu-tanh", "modernbert"])
@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
class TestWithTheAVX512Kernels:
    pytestmark = needs_avx512_library

    def test_the_avx512_routes_agree_with_the_reference(self, family, backend, monkeypatch):
        from clearformer.fast import avx512_linear
        from clearformer.fast.reordered_weights import ReorderedWeights, use_reordered_weights

        # The suite switches the library off (conftest); here both of its kernels run.
        monkeypatch.setenv("CLEARFORMER_AVX512", "on")
        encoder = encoder_of(family)
        x, mask = batch(holes=False)
        want = reference_of(encoder, x, mask)
        linear_calls = []
        original = avx512_linear.linear

        def counting(*args, **kwargs):
            linear_calls.append(1)
            return original(*args, **kwargs)

        monkeypatch.setattr(avx512_linear, "linear", counting)
        # Reordered weights let the AVX-512 linear kernel take the GELU and LayerNorm epilogues.
        with use_reordered_weights(ReorderedWeights()):
            out = production(encoder, x, mask, backend=backend)
            with torch.no_grad():
                plan = encoder.plan_for(mask, backend=backend)
        assert_agrees(out, want, mask, f"{family} {backend} avx512")
        if backend == "varlen" and FAMILIES[family].get("local_window") is None:
            assert plan.method.choice == "avx512", str(plan)
        if FAMILIES[family]["activation"] == "gelu" or FAMILIES[family]["norm"] == "post":
            assert linear_calls, "the AVX-512 linear kernel was not taken"


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
class TestGroupedKeysWithTheAVX512Kernels:
    """The AVX-512 attention kernel reads one key/value head per query head: a grouped stack
    (here bidirectional, which it would otherwise serve) goes to the float32 flash kernel, and
    agrees."""

    pytestmark = needs_avx512_library

    def test_grouped_keys_take_another_method_and_agree(self, backend, monkeypatch):
        monkeypatch.setenv("CLEARFORMER_AVX512", "on")
        # heads of 32: the kernel takes widths in multiples of 16
        FAMILIES["bidirectional-gqa"] = dict(FAMILIES["qwen3"], causal=False, head_dim=32)
        try:
            encoder = encoder_of("bidirectional-gqa")
        finally:
            del FAMILIES["bidirectional-gqa"]
        x, mask = batch(holes=True)
        want = reference_of(encoder, x, mask)
        out = production(encoder, x, mask, backend=backend)
        assert_agrees(out, want, mask, f"grouped {backend} avx512 on")
        with torch.no_grad():
            plan = encoder.plan_for(mask, backend="varlen")
            # The same stack with one key head per query head, and queries, keys and values of
            # one layout (no rotary positions, no per-head norms): the kernel takes it.
            plain_config = dataclasses.replace(
                encoder.config, n_kv_heads=None, qk_norm=False, positions="learned"
            )
            plain = Encoder(plain_config).eval().plan_for(mask, backend="varlen")
        # Grouped rows are the float32 flash kernel's (its own verdict), not this kernel's.
        assert plan.method.choice == "avx512", str(plan)
        assert "flash attention (float32)" in plan.method.reason, str(plan)
        assert plain.method.choice == "avx512", str(plain)
        assert "flash" not in plain.method.reason, str(plain)


def test_the_agreement_check_fails_on_a_fast_path_that_drops_its_residual(monkeypatch):
    """The test above can fail: a fused epilogue that forgets the residual add is caught."""
    encoder = encoder_of("bert")
    x, mask = batch(holes=True)
    want = reference_of(encoder, x, mask)
    original = fused_linear.linear

    def without_residual(x, layer, *, avx512=False, activation=None, residual=None, norm=None):
        return original(x, layer, avx512=avx512, activation=activation, norm=norm)

    monkeypatch.setattr(fused_linear, "linear", without_residual)
    from clearformer.fast import fused_blocks

    monkeypatch.setattr(fused_blocks, "linear", without_residual)
    out = production(encoder, x, mask, backend="sdpa")
    with pytest.raises(AssertionError, match="production - reference"):
        assert_agrees(out, want, mask, "bert sdpa without residual")
