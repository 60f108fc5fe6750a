"""clearformer's AVX-512 linear kernel (clearformer.fast.avx512_linear): its GELU against
float64 erf, its products with bias, activation, residual and LayerNorm against float64 and
against the eager layers, the same bits at any thread count, and the rules for which fused
calls take it. Skipped, with the reason, where this machine cannot build the library."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from clearformer import TextEncoder, switches
from clearformer.fast import avx512_linear
from clearformer.fast.reordered_weights import ReorderedWeights, use_reordered_weights
from clearformer.interop.hf import bundled_model_dir
from clearformer.routes import kernels_wanted

from .helpers import fused_linear, intra_op_threads, needs_avx512_library

pytestmark = needs_avx512_library


@pytest.fixture(autouse=True)
def _library_switched_on(monkeypatch):
    """The suite runs with ``CLEARFORMER_AVX512=off`` (conftest), which switches off every
    kernel of the library; this module tests its linear kernel."""
    monkeypatch.setenv("CLEARFORMER_AVX512", "on")


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the fused calls that reach the kernel."""
    calls = []
    original = avx512_linear.linear

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(avx512_linear, "linear", counting)
    return calls


def float64_reference(x, layer, activation=None, residual=None, norm=None):
    out = x.double() @ layer.weight.double().t()
    if layer.bias is not None:
        out = out + layer.bias.double()
    if activation == "gelu":
        out = F.gelu(out)
    elif activation == "relu":
        out = out.clamp_min(0)
    if residual is not None:
        out = out + residual.double()
    if norm is not None:
        out = F.layer_norm(
            out, norm.normalized_shape, norm.weight.double(), norm.bias.double(), norm.eps
        )
    return out


def make_layer(fan_in, fan_out, bias=True, seed=0):
    torch.manual_seed(seed)
    layer = nn.Linear(fan_in, fan_out, bias=bias)
    return layer


def make_norm(width, seed=1):
    g = torch.Generator().manual_seed(seed)
    norm = nn.LayerNorm(width)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(width, generator=g) + 0.5)
        norm.bias.copy_(torch.randn(width, generator=g))
    return norm


def kernel(x, layer, **epilogue):
    with torch.inference_mode():
        return avx512_linear.linear(x, avx512_linear.reorder(layer.weight), layer, **epilogue)


def gelu_exact(values: np.ndarray) -> np.ndarray:
    return np.array([v * 0.5 * math.erfc(-v / math.sqrt(2.0)) for v in values.tolist()])


def test_the_gelu_is_within_float32_rounding_of_float64_erf():
    # One input feature and a weight of ones: every output is the GELU of its row's value.
    values = torch.linspace(-12, 12, 60_001)
    layer = nn.Linear(1, 64, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    out = kernel(values[:, None], layer, activation="gelu")
    assert torch.equal(out, out[:, :1].expand(-1, 64))
    exact = gelu_exact(values.double().numpy())
    error = np.abs(out[:, 0].double().numpy() - exact)
    assert error.max() < 3e-7
    # Relative error where the GELU is not tiny: the negative tail is where erf formulas lose.
    sizeable = np.abs(exact) > 1e-3
    assert (error[sizeable] / np.abs(exact[sizeable])).max() < 2e-5
    # and no worse than PyTorch's own GELU anywhere
    torch_error = np.abs(F.gelu(values).double().numpy() - exact)
    assert error.max() <= torch_error.max()


def test_the_gelu_of_nan_and_infinities_is_nan_as_in_torch():
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e30, -1e30])
    layer = nn.Linear(1, 64, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    out = kernel(special[:, None], layer, activation="gelu")[:, 0]
    expected = F.gelu(special)
    assert torch.equal(out.isnan(), expected.isnan())
    finite = ~expected.isnan()
    torch.testing.assert_close(out[finite], expected[finite], rtol=1e-6, atol=0)


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 100])
@pytest.mark.parametrize(
    "fan_in,fan_out,epilogue",
    [
        (384, 1536, "gelu"),
        (37, 128, "relu"),
        (384, 384, "residual+norm"),
        (1536, 384, "residual+norm"),
        (48, 64, "norm"),
        (384, 64, "none"),
        (20, 192, "residual"),
    ],
)
def test_products_match_float64(rows, fan_in, fan_out, epilogue):
    layer = make_layer(fan_in, fan_out)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, fan_in, generator=g)
    extra = {}
    if epilogue in ("gelu", "relu"):
        extra["activation"] = epilogue
    if "residual" in epilogue:
        extra["residual"] = torch.randn(rows, fan_out, generator=g)
    if "norm" in epilogue:
        extra["norm"] = make_norm(fan_out)
    out = kernel(x, layer, **extra)
    expected = float64_reference(x, layer, **extra)
    assert ((out.double() - expected).abs() <= rounding_bound(x, layer, **extra)).all()


def rounding_bound(x, layer, activation=None, residual=None, norm=None):
    """A float32 bound on each output's error: a sum of K terms in order errs by at most
    K u sum|terms| (u = 2^-24; Higham, "Accuracy and Stability of Numerical Algorithms",
    3.1), the GELU's slope is below 1.13 and its own error below 3e-7, and a LayerNorm scales
    an error by its weight over the row's deviation (twice, for the mean it subtracts)."""
    u = 2.0**-24
    terms = x.double().abs() @ layer.weight.double().abs().t()
    if layer.bias is not None:
        terms = terms + layer.bias.double().abs()
    bound = (x.shape[-1] + 1) * u * terms
    pre = float64_reference(x, layer, activation=activation)
    if activation == "gelu":
        bound = 1.13 * bound + 3e-7 + u * pre.abs()
    if residual is not None:
        pre = pre + residual.double()
        bound = bound + u * pre.abs()
    if norm is not None:
        deviation = pre.std(dim=-1, unbiased=False, keepdim=True)
        scale = norm.weight.double().abs().max()
        bound = 2 * bound.amax(dim=-1, keepdim=True) * scale / deviation + 1e-6
    return bound + 1e-7


def test_rows_with_a_stride_and_no_bias():
    layer = make_layer(64, 128, bias=False)
    wide = torch.randn(9, 100)
    x = wide[:, 10:74]  # (9, 64), rows 100 floats apart
    residual_wide = torch.randn(9, 200)
    residual = residual_wide[:, :128]
    norm = make_norm(128)
    out = kernel(x, layer, residual=residual, norm=norm)
    expected = float64_reference(x, layer, residual=residual, norm=norm)
    bound = rounding_bound(x, layer, residual=residual, norm=norm)
    assert ((out.double() - expected).abs() <= bound).all()


def test_padded_rows_never_reach_real_ones():
    # Rows are independent: NaN or huge values in one row leave every other row's bits alone.
    layer, norm = make_layer(384, 384), make_norm(384)
    x = torch.randn(14, 384)
    residual = torch.randn(14, 384)
    clean = kernel(x, layer, residual=residual, norm=norm)
    x[3], x[11] = float("nan"), 1e30
    residual[5] = float("inf")
    dirty = kernel(x, layer, residual=residual, norm=norm)
    others = [i for i in range(14) if i not in (3, 5, 11)]
    assert torch.equal(clean[others], dirty[others])
    assert dirty[3].isnan().all()


@pytest.mark.parametrize("rows", [19, 301], ids=["few rows: panels outer", "rows outer"])
def test_the_same_bits_at_any_thread_count(rows):
    layer, norm = make_layer(384, 1536), make_norm(384)
    second = make_layer(1536, 384, seed=3)
    x = torch.randn(rows, 384)
    outs = []
    for count in (1, 2, 3):
        with intra_op_threads(count):
            h = kernel(x, layer, activation="gelu")
            outs.append(kernel(h, second, residual=x, norm=norm))
    assert all(torch.equal(outs[0], other) for other in outs[1:])


@pytest.mark.parametrize(
    "epilogue",
    [{}, {"activation": "gelu"}, {"activation": "relu"}, {"residual": True, "norm": True}],
    ids=["plain", "gelu", "relu", "residual and norm"],
)
def test_few_rows_take_the_same_sums_as_many(epilogue):
    """At most FEW_ROWS rows the kernel streams panels outer, above it rows outer: a row's
    output is the same sum in the same order either way, so a sentence alone equals its rows
    inside a batch, to the bit."""
    layer, norm = make_layer(384, 1536), make_norm(1536)
    x = torch.randn(200, 384)  # rows outer
    residual = torch.randn(200, 1536)
    options = {
        "activation": epilogue.get("activation"),
        "residual": residual if epilogue.get("residual") else None,
        "norm": norm if epilogue.get("norm") else None,
    }
    many = kernel(x, layer, **options)
    for first, stop in ((0, 19), (40, 104), (199, 200)):  # 19, 64 (FEW_ROWS) and 1 rows
        few_options = dict(options)
        if options["residual"] is not None:
            few_options["residual"] = residual[first:stop]
        few = kernel(x[first:stop], layer, **few_options)
        assert torch.equal(few, many[first:stop]), (first, stop)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 40),
    fan_in=st.integers(1, 70),
    panels=st.integers(1, 3),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
)
def test_any_shape_matches_float64(rows, fan_in, panels, scale):
    layer = make_layer(fan_in, 64 * panels, seed=rows)
    x = torch.randn(rows, fan_in) * scale
    norm = make_norm(64 * panels)
    h = kernel(x, layer, activation="gelu")
    expected = float64_reference(x, layer, activation="gelu")
    assert ((h.double() - expected).abs() <= rounding_bound(x, layer, activation="gelu")).all()
    out = kernel(x, layer, residual=h, norm=norm)
    expected = float64_reference(x, layer, residual=h, norm=norm)
    assert (
        (out.double() - expected).abs() <= rounding_bound(x, layer, residual=h, norm=norm)
    ).all()


def test_bad_arguments_are_refused_with_what_was_expected():
    with pytest.raises(RuntimeError, match="multiple of 64"):
        avx512_linear.reorder(torch.randn(100, 8))
    layer = make_layer(8, 64)
    packed = avx512_linear.reorder(layer.weight)
    with pytest.raises(RuntimeError, match="x has 9 features, the weight 8"):
        torch.ops.clearformer_avx512.linear(
            torch.randn(2, 9), packed, None, 0, None, None, None, 0.0
        )
    with pytest.raises(RuntimeError, match="activation must be"):
        torch.ops.clearformer_avx512.linear(
            torch.randn(2, 8), packed, None, 7, None, None, None, 0.0
        )
    with pytest.raises(RuntimeError, match="norm_weight and norm_bias"):
        torch.ops.clearformer_avx512.linear(
            torch.randn(2, 8), packed, None, 0, None, torch.ones(64), None, 0.0
        )
    with pytest.raises(RuntimeError, match="residual must be"):
        torch.ops.clearformer_avx512.linear(
            torch.randn(2, 8), packed, None, 0, torch.randn(3, 64), None, None, 0.0
        )


# --- which fused calls take it ---------------------------------------------------------------


def fused_call(layer, x, **epilogue):
    with torch.inference_mode():
        return fused_linear(x, layer, **epilogue)


def test_a_packing_caller_sends_gelu_and_layer_norm_products_to_the_kernel(kernel_calls):
    up, down, norm = make_layer(384, 1536), make_layer(1536, 384, seed=2), make_norm(384)
    x = torch.randn(2, 40, 384)  # 80 rows: above FEW_ROWS, threads split the rows
    with use_reordered_weights(ReorderedWeights()):
        h = fused_call(up, x, activation="gelu")
        out = fused_call(down, h, residual=x, norm=norm)
        fused_call(up, x)  # a plain product stays with oneDNN, which is faster there
        fused_call(down, h, residual=x)  # and so does a residual add alone
    assert len(kernel_calls) == 2
    assert out.shape == (2, 40, 384)
    expected = float64_reference(
        float64_reference(x, up, activation="gelu").float(), down, residual=x, norm=norm
    )
    assert (out.double() - expected).abs().max() < 2e-5


def test_calls_without_packing_or_switched_off_or_odd_widths_stay_with_onednn(
    kernel_calls, monkeypatch
):
    up, odd, norm = make_layer(384, 1536), make_layer(384, 100), make_norm(100)
    x = torch.randn(80, 384)  # above FEW_ROWS
    fused_call(up, x, activation="gelu")  # no packing: packing per call would cost more
    fused_call(up, x[:19], activation="gelu")  # nor on a sentence's few rows
    fused_call(up, x[:1], activation="gelu")  # nor on a decoding step's row
    with use_reordered_weights(ReorderedWeights()):
        fused_call(up, x, activation="relu")  # oneDNN's ReLU costs next to nothing
        fused_call(odd, x, activation="gelu")  # 100 outputs: not whole panels
        fused_call(odd, x, residual=torch.randn(80, 100), norm=norm)
        fused_call(up, x, activation="gelu_tanh")  # an activation it does not compute
        no_bias = nn.LayerNorm(1536, bias=False)
        fused_call(up, x, norm=no_bias)
        monkeypatch.setenv(switches.AVX512_LINEAR_VARIABLE, "off")
        fused_call(up, x, activation="gelu")
    assert kernel_calls == []


@pytest.mark.parametrize("threads", [1, 2, 16])
def test_any_row_count_takes_the_same_kinds_of_product(kernel_calls, threads):
    """A sentence's few rows, a decoding step's one row and the rows between FEW_ROWS and one
    tile per thread take the kernel for the same products a batch does (the exact GELU, a
    LayerNorm epilogue), within float32 rounding of float64; plain products, ReLU and residual
    adds alone stay with oneDNN at every row count. So a row takes the same products alone
    and in a batch."""
    up, down, norm = make_layer(384, 1536), make_layer(1536, 384, seed=2), make_norm(384)
    with intra_op_threads(threads), use_reordered_weights(ReorderedWeights()):
        for rows in (1, 19, 80):  # 80 at 16 threads: fewer row tiles than threads
            x = torch.randn(rows, 384)
            before = len(kernel_calls)
            h = fused_call(up, x, activation="gelu")
            out = fused_call(down, h, residual=x, norm=norm)
            fused_call(up, x)
            fused_call(up, x, activation="relu")
            fused_call(down, h, residual=x)
            assert len(kernel_calls) - before == 2, rows
            expected = float64_reference(
                float64_reference(x, up, activation="gelu").float(), down, residual=x, norm=norm
            )
            assert (out.double() - expected).abs().max() < 2e-5, rows


def test_the_norm_epsilon_counts_as_torch_counts_it():
    # A zero product and small residuals: the variance (1e-4) is far below eps, so an eps
    # dropped, or added outside the square root, would change every output.
    layer = make_layer(16, 64)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
    norm = make_norm(64)
    norm.eps = 0.1
    residual = torch.randn(12, 64) * 0.01
    out = kernel(torch.randn(12, 16), layer, residual=residual, norm=norm)
    with torch.no_grad():
        expected = norm(residual)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    assert (out - norm.bias).abs().max() > 1e-2  # the rows are not flattened to the bias


def test_a_trainable_norm_or_residual_keeps_its_gradient():
    # The kernel has no autograd formula: with a gradient to compute, the eager layers run.
    layer = make_layer(384, 384).requires_grad_(False)
    norm = make_norm(384)
    x = torch.randn(40, 384)
    residual = torch.randn(40, 384, requires_grad=True)
    with use_reordered_weights(ReorderedWeights()):
        out = fused_linear(x, layer, residual=residual, norm=norm)
    out.square().sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.abs().sum() > 0
    assert residual.grad is not None and residual.grad.abs().sum() > 0


def test_a_bad_switch_value_is_refused(monkeypatch):
    monkeypatch.setenv(switches.AVX512_LINEAR_VARIABLE, "sometimes")
    with pytest.raises(
        ValueError, match="CLEARFORMER_AVX512_LINEAR: expected 'on', 'off' or 'auto'"
    ):
        kernels_wanted(("avx512_linear",))


def test_a_weight_changed_in_place_is_packed_again(kernel_calls):
    layer, x = make_layer(64, 128), torch.randn(30, 64)
    packing = ReorderedWeights()
    with use_reordered_weights(packing):
        first = fused_call(layer, x, activation="gelu")
        with torch.no_grad():
            layer.weight.mul_(-1)
        second = fused_call(layer, x, activation="gelu")
    assert len(kernel_calls) == 2
    assert (second.double() - float64_reference(x, layer, activation="gelu")).abs().max() < 1e-5
    assert not torch.allclose(first, second)


def test_encode_with_the_kernel_matches_encode_without_it(kernel_calls, monkeypatch):
    encoder = TextEncoder.from_pretrained(bundled_model_dir())
    texts = [f"sentence number {i} about the weather in a city by the sea" for i in range(300)]
    with_kernel = encoder.encode(
        texts, progress=False
    )  # over REORDER_MIN_TOKENS: reordered weights
    assert kernel_calls, "the bundled model's post-norm layers should take the kernel"
    monkeypatch.setenv(switches.AVX512_LINEAR_VARIABLE, "off")
    calls = len(kernel_calls)
    without = encoder.encode(texts, progress=False)
    assert len(kernel_calls) == calls
    np.testing.assert_allclose(with_kernel, without, atol=2e-6)
    assert (with_kernel * without).sum(axis=1).min() > 1 - 1e-6


def test_a_text_alone_equals_its_row_in_a_batch_with_the_kernel_on(kernel_calls):
    """With both linear verdicts taking the kernel (CLEARFORMER_AVX512=on here), a sentence
    alone (its few rows, panels outer) and the same sentence inside a batch of hundreds of
    rows (rows outer) take the same sums: the same embedding to the bit, as a server's lone
    request and its merged batches must."""
    encoder = TextEncoder.from_pretrained(bundled_model_dir())
    encoder.keep_weights_reordered()  # as the server does: the kernel needs packed weights
    texts = [f"sentence number {i} about the weather in a city by the sea" for i in range(40)]
    encodings = encoder.tokenizer.encode(texts)
    together = encoder.embed_batch(encodings, normalize=True)  # hundreds of rows
    calls = len(kernel_calls)
    alone = np.stack([encoder.embed_batch([e], normalize=True)[0] for e in encodings])
    assert calls and len(kernel_calls) > calls, "both orders should have reached the kernel"
    assert np.array_equal(alone, together)


@pytest.mark.parametrize("threads", [1, 2, 16])
@pytest.mark.parametrize(("width", "norm"), [(768, "post"), (384, "pre"), (128, "post")], ids=str)
def test_a_sequence_alone_equals_its_rows_in_a_batch(kernel_calls, width, norm, threads):
    """Widths and layouts where oneDNN's plain products add otherwise than the kernel (768
    inputs; a pre-norm block's residual-only product of 1,536 inputs), and thread counts
    where a batch's rows are fewer than one tile per thread: each sequence run alone (at most
    FEW_ROWS rows) equals its rows in the packed batch (more), to the bit, with both linear
    verdicts taking the kernel. A row takes the same kinds of product at every row count."""
    from clearformer import Encoder, EncoderConfig

    config = EncoderConfig(
        d_model=width, n_heads=4, n_layers=2, dim_mlp=4 * width, norm=norm, activation="gelu"
    )
    torch.manual_seed(0)
    model = Encoder(config).eval()
    lengths = [7, 30, 19, 41]  # 97 rows together, each at most FEW_ROWS alone
    x = torch.randn(len(lengths), max(lengths), width)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    packing = use_reordered_weights(ReorderedWeights())
    with intra_op_threads(threads), torch.inference_mode(), packing:
        together = model(x, mask, backend="varlen")  # (B, T, D)
        alone = [model(x[b : b + 1, :n], backend="varlen")[0] for b, n in enumerate(lengths)]
    assert kernel_calls, "the GELU products should take the kernel"
    for b, n in enumerate(lengths):
        assert torch.equal(alone[b], together[b, :n]), (b, n)


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_a_post_norm_encoder_under_packing_matches_its_eager_layers(backend, kernel_calls):
    from clearformer import Encoder, EncoderConfig

    config = EncoderConfig(
        d_model=128, n_heads=4, n_layers=2, dim_mlp=512, norm="post", activation="gelu"
    )
    torch.manual_seed(0)
    model = Encoder(config).eval()
    x = torch.randn(3, 9, 128)
    mask = torch.tensor([[True] * 9, [True] * 5 + [False] * 4, [False] * 2 + [True] * 7])
    x[~mask] = float("nan")  # padded positions hold anything; real rows must not see it
    eager = model(x, mask, backend="math")  # gradients enabled: the eager layers
    with torch.inference_mode(), use_reordered_weights(ReorderedWeights()):
        fused = model(x, mask, backend=backend)
    assert kernel_calls, "the post-norm blocks should take the kernel"
    torch.testing.assert_close(fused[mask], eager.detach()[mask], atol=2e-5, rtol=1e-5)
    assert not fused[mask].isnan().any()


def test_the_library_switch_turns_the_linear_kernel_off_too(monkeypatch):
    """``CLEARFORMER_AVX512=off`` switches off every kernel of the library, the linear one
    included, even while the library is loaded."""
    torch.manual_seed(0)
    layer, norm = nn.Linear(64, 64), nn.LayerNorm(64)
    x, residual = torch.randn(48, 64), torch.randn(48, 64)
    original, calls = avx512_linear.linear, []

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(avx512_linear, "linear", counting)
    outs = []
    for setting in ("on", "off"):
        monkeypatch.setenv("CLEARFORMER_AVX512", setting)
        with torch.inference_mode(), use_reordered_weights(ReorderedWeights()):
            outs.append(fused_linear(x, layer, residual=residual, norm=norm))
        if setting == "on":
            assert calls == [1]  # the kernel serves this call while the switch is on
    assert calls == [1] and not kernels_wanted(("avx512_linear",))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_a_sentences_few_rows_ask_their_own_verdict(monkeypatch):
    """The route asks ``avx512_linear_rows`` for calls of at most FEW_ROWS rows and
    ``avx512_linear`` above: on a CPU where only the first measured faster, a sentence alone
    takes the kernel and a batch keeps oneDNN."""
    from clearformer import EncoderConfig, EncoderModel, routes
    from clearformer.options import Decision

    asked = []

    def verdict(kernel):
        asked.append(kernel)
        return Decision("avx512" if kernel == "avx512_linear_rows" else "torch", "test")

    monkeypatch.setattr(routes, "kernel_route", verdict)
    fused = Decision("fused", "test")
    assert routes.epilogue_route(fused, torch.float32, 1)
    assert routes.epilogue_route(fused, torch.float32, avx512_linear.FEW_ROWS)
    assert not routes.epilogue_route(fused, torch.float32, avx512_linear.FEW_ROWS + 1)
    assert asked == ["avx512_linear_rows", "avx512_linear_rows", "avx512_linear"]
    config = EncoderConfig(
        d_model=64, n_heads=4, n_layers=1, dim_mlp=128, norm="post", vocab_size=50
    )
    model = EncoderModel(config).eval()
    with torch.inference_mode():
        for tokens, taken in ((19, True), (200, False)):
            mask = torch.ones(1, tokens, dtype=torch.bool)
            plan = model.encoder.plan_for(mask)
            assert plan.layer(0).avx512_linear is taken, tokens
