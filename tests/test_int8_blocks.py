"""``precision="int8-blocks"``: int8 weights with a scale per block of 32 inputs, int16
activations (:mod:`clearformer.quant.int8_blocks`, ``fast/avx512_int8_blocks.cpp``).

The kernel is held to the layer's arithmetic computed exactly (float64 sums of the same
integers and scales), to an analytical case it must reproduce exactly (weights and activations
already on their grids), and to the float32 fallback; every family is held to the cosine floor
of the other precisions, with a negative control; a text alone equals its row in a batch.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

from clearformer import TextEncoder
from clearformer.precision import choose_precision
from clearformer.quant.int8 import Int8Linear
from clearformer.quant.int8_blocks import (
    BLOCK,
    Int8BlockLinear,
    block_kernel_support,
    block_linear_reference,
    pack_weights,
    quantize_activations,
    quantize_blocks,
    quantize_int8_blocks,
)
from clearformer.text.precision_models import OFFERED

from .test_family_precision import (  # noqa: F401 (family: a fixture)
    MIN_COSINE,
    _cosines,
    family,
    spy_layer_reads,
)

SENTENCES = [
    "The central bank raised interest rates again on Thursday.",
    "A cat sits on the mat.",
    "Shares in the carmaker fell after it cut its forecast for the year.",
    "Rain is expected across the north by the evening.",
]
needs_kernel = pytest.mark.skipif(
    block_kernel_support().choice != "available",
    reason=f"no int8-blocks kernel here: {block_kernel_support().reason}",
)


def _exact(layer: Int8BlockLinear, x: torch.Tensor) -> torch.Tensor:
    """The layer's sum in float64: the same integers and scales, no float32 rounding."""
    q, scale = quantize_activations(x.float())
    w = layer.dequantized().double()  # s_w Q_w, each a float32 product, exact in float64
    out = (q.double() @ w.t()) * scale.double()
    return out if layer.bias is None else out + layer.bias.double()


# Rows: one tile, a full tile, remainder tiles of 1-5 rows, several chunks (K = 1024 holds 120
# rows a chunk); columns: a last panel 13, 16, 18 and 32 wide; K padded (100) or not.
SHAPES = [
    (1, 64, 32),
    (5, 32, 16),
    (6, 96, 64),
    (7, 100, 45),
    (9, 64, 50),
    (10, 96, 61),
    (13, 1024, 80),
    (300, 1024, 50),
    (300, 384, 1536),
]


@needs_kernel
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_the_kernel_computes_the_layers_sum(shape, bias):
    """Rows of one tile, several and a remainder; K not a multiple of 32 (padded); N ending
    inside a panel; a row with one large value; a row of zeros."""
    M, K, N = shape
    torch.manual_seed(M * 7 + K + N)
    layer = Int8BlockLinear.from_linear(nn.Linear(K, N, bias=bias))
    assert layer._op is not None
    x = torch.randn(M, K) * 2
    x[0, K // 3] = 300.0  # sets row 0's scale alone
    if M > 2:
        x[2] = 0.0
    got = layer(x).double()
    exact = _exact(layer, x)
    # Row by row: float32's rounding of sums of this row's size, so one integer off in any row
    # (about |s_x| |W| per element, far above it) fails.
    tolerance = 1e-6 * (exact.abs().amax(dim=1, keepdim=True) + 1)
    assert ((got - exact).abs() <= tolerance).all(), ((got - exact).abs() / tolerance).max()
    if M > 2:
        expected_zero_row = torch.zeros(N) if not bias else layer.bias
        assert torch.equal(got[2].float(), expected_zero_row.float())


@needs_kernel
def test_values_on_the_grid_come_back_exactly():
    """Analytical case: weights that are integers of at most 127 times a power of two per
    block (each block holding a 127, so its scale is that power of two) and activations that
    are integers with one of 32767 per row: both roundings are exact, so the kernel returns
    x W^T exactly (all sums are integers times powers of two within float32's range)."""
    M, K, N = 9, 128, 48
    g = torch.Generator().manual_seed(0)
    q_w = torch.randint(-127, 128, (N, K), generator=g).float()
    q_w[:, 1::BLOCK] = 127.0
    q_w[:, 0] = 0.0  # against the 32767s: every sum stays below 2^24, exact in float32
    powers = 2.0 ** torch.randint(-6, 3, (N, K // BLOCK), generator=g).float()
    w = (q_w.view(N, K // BLOCK, BLOCK) * powers[:, :, None]).view(N, K)
    x = torch.randint(-50, 51, (M, K), generator=g).float()
    x[:, 0] = 32767.0
    linear = nn.Linear(K, N, bias=False)
    with torch.no_grad():
        linear.weight.copy_(w)
    layer = Int8BlockLinear.from_linear(linear)
    expected = x.double() @ w.double().t()
    assert torch.equal(layer.dequantized(), w)
    assert torch.equal(layer(x).double(), expected)


@needs_kernel
def test_the_fallback_equals_the_kernel_up_to_float_rounding():
    """The layer without its kernel (as on a CPU without VNNI) rounds the same integers."""
    torch.manual_seed(1)
    layer = Int8BlockLinear.from_linear(nn.Linear(200, 70))
    x = torch.randn(33, 200) * torch.logspace(-3, 3, 33)[:, None]  # scales of every size
    kernel = layer(x)
    layer._kernel = False
    fallback = layer(x)
    assert torch.allclose(kernel, fallback, rtol=2e-6, atol=1e-6 * kernel.abs().max().item())
    assert torch.equal(fallback, block_linear_reference(x, layer.dequantized(), layer.bias))


@needs_kernel
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_input_gives_non_finite_outputs_in_its_row_alone(bad):
    """A NaN or an infinity upstream must not come out as a finite embedding."""
    torch.manual_seed(5)
    layer = Int8BlockLinear.from_linear(nn.Linear(64, 40))
    x = torch.randn(4, 64)
    x[1, 17] = bad
    kernel = layer(x)
    assert not torch.isfinite(kernel[1]).any()
    assert torch.isfinite(kernel[[0, 2, 3]]).all()
    layer._kernel = False
    fallback = layer(x)
    assert not torch.isfinite(fallback[1]).any() and torch.isfinite(fallback[[0, 2, 3]]).all()


@needs_kernel
def test_a_row_too_small_for_any_scale_gives_the_bias():
    layer = Int8BlockLinear.from_linear(nn.Linear(64, 40))
    x = torch.full((2, 64), 1e-36)
    assert torch.equal(layer(x), layer.bias.expand(2, 40))


@needs_kernel
def test_the_kernel_refuses_a_mismatched_layout_naming_the_shapes():
    layer = Int8BlockLinear.from_linear(nn.Linear(64, 40))
    op, x = layer._op, torch.randn(3, 64)
    with pytest.raises(RuntimeError, match=r"scale must be the packed \(2, 2, 32\)"):
        op(x, layer.weight_packed, layer.scale_packed.reshape(2, 64), None, 40)
    with pytest.raises(RuntimeError, match="out_features must be in .* got 70"):
        op(x, layer.weight_packed, layer.scale_packed, None, 70)
    with pytest.raises(RuntimeError, match="width K must be in .* got 30"):
        op(torch.randn(3, 30), layer.weight_packed, layer.scale_packed, None, 40)
    with pytest.raises(
        ValueError, match=r"last dimension must be in_features=64, got shape \(3, 30\)"
    ):
        layer(torch.randn(3, 30))
    with pytest.raises(ValueError, match="in_features must be at least 1, got 0"):
        Int8BlockLinear.from_linear(nn.Linear(0, 4))
    broken = nn.Linear(64, 4)
    with torch.no_grad():
        broken.weight[1, 3] = float("inf")
        broken.weight[2, 5] = float("nan")
    with pytest.raises(ValueError, match="weight must be finite .* got 2 NaN or infinite"):
        Int8BlockLinear.from_linear(broken)


@needs_kernel
def test_a_row_alone_equals_its_row_in_any_batch():
    """Each row's sums depend on that row alone, in an order fixed by K: the same bits for a
    row alone, in a tile, in a remainder tile and in a later chunk of rows."""
    torch.manual_seed(2)
    layer = Int8BlockLinear.from_linear(nn.Linear(1024, 96))
    x = torch.randn(500, 1024)
    batch = layer(x)
    for i in (0, 5, 6, 131, 499):
        assert torch.equal(layer(x[i : i + 1]), batch[i : i + 1]), i


def test_block_scales_round_heavy_tailed_weights_closer_than_channel_scales():
    """Why the scheme exists: a weight row with a few large values sets one per-channel scale
    for all of its values, and a block scale for its own 32 alone."""
    torch.manual_seed(3)
    w = torch.randn(64, 1024) * torch.where(torch.rand(64, 1024) < 0.01, 8.0, 1.0)
    q, scale = quantize_blocks(w)
    blocks = (q.float().view(64, 32, BLOCK) * scale[:, :, None]).view(64, 1024)
    channel = Int8Linear.from_linear(_linear(w)).weight
    assert (blocks - w).norm() < 0.5 * (channel - w).norm()


def _linear(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def test_the_packing_round_trips():
    torch.manual_seed(4)
    w = torch.randn(45, 100)
    q, scale = quantize_blocks(w)
    assert q.shape == (45, 128) and scale.shape == (45, 4)
    assert torch.equal(q[:, 100:], torch.zeros(45, 28, dtype=torch.int8))
    packed, packed_scale = pack_weights(q, scale)
    assert packed.shape == (2, 64, 32, 2) and packed_scale.shape == (2, 4, 32)
    layer = Int8BlockLinear(packed, packed_scale, None, (45, 100))
    expected = (q.float().view(45, 4, BLOCK) * scale[:, :, None]).view(45, 128)[:, :100]
    assert torch.equal(layer.dequantized(), expected)
    assert (layer.dequantized() - w).abs().max() <= scale.max() / 2 + 1e-7


def test_an_all_zero_block_and_row_round_to_zeros():
    w = torch.randn(4, 64)
    w[1, :32] = 0.0
    q, scale = quantize_blocks(w)
    assert torch.equal(q[1, :32], torch.zeros(32, dtype=torch.int8)) and scale[1, 0] == 0
    rows = torch.zeros(2, 64)
    q_x, s_x = quantize_activations(rows)
    assert torch.equal(q_x, rows) and torch.equal(s_x, torch.ones(2, 1))


def test_where_the_kernel_cannot_run_int8_blocks_runs_float32(monkeypatch, caplog):
    """No kernel here (no VNNI, no compiler): a call that asks for int8-blocks and a load in it
    run float32, the same rows as float32, and say why."""
    import clearformer.quant.int8_blocks as int8_blocks
    from clearformer.options import Decision

    monkeypatch.setattr(
        int8_blocks, "block_kernel_support", lambda: Decision("unavailable", "mocked")
    )
    encoder = TextEncoder.from_pretrained()
    texts = SENTENCES
    assert encoder.precision_for("int8-blocks").choice == "float32"
    float32 = encoder.encode(texts)
    assert np.array_equal(encoder.encode(texts, precision="int8-blocks"), float32)
    with caplog.at_level(logging.WARNING, logger="clearformer.text.precisions"):
        held = TextEncoder.from_pretrained(precision="int8-blocks")
    assert "precision int8-blocks runs as float32: int8-blocks requested, but mocked" in caplog.text
    assert held.precision_for("int8-blocks").choice == "float32"
    assert np.array_equal(held.encode(texts), float32)
    assert "mocked" in held.precision_for("int8-blocks").reason
    # Asked by what it runs, the load explains itself as that, with the reason kept.
    own = held.precision_for("float32").reason
    assert own.startswith("the precision this model was loaded in") and "mocked" in own


def test_a_layer_pickles_and_keeps_float32_scales_through_dtype_conversions():
    import io

    torch.manual_seed(0)
    layer = Int8BlockLinear.from_linear(nn.Linear(70, 40))
    x = torch.randn(5, 70)
    expected = layer(x)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(loaded(x), expected)
    for convert in (lambda m: m.half(), lambda m: m.to(torch.bfloat16), lambda m: m.double()):
        converted = convert(Int8BlockLinear.from_linear(nn.Linear(70, 40)))
        assert converted.scale_packed.dtype == converted.bias.dtype == torch.float32
        assert converted.weight_packed.dtype == torch.int8
    converted = Int8BlockLinear.from_linear(nn.Linear(70, 40))
    converted.load_state_dict(layer.state_dict())
    assert torch.equal(converted.half()(x), expected)  # same scales: the same rows


def test_an_int8_layer_computes_the_same_rows_after_a_dtype_conversion():
    torch.manual_seed(0)
    layer = Int8Linear.from_linear(nn.Linear(64, 32))
    x = torch.randn(4, 64)
    expected = layer(x)
    converted = layer.half()
    assert all(t.dtype in (torch.int8, torch.float32) for t in converted.buffers())
    assert torch.equal(converted(x), expected)  # scales not rounded to float16


def test_a_float64_weight_beyond_float32s_range_is_refused():
    linear = nn.Linear(40, 3).double()
    with torch.no_grad():
        linear.weight[0, 0] = 1e300
    with pytest.raises(ValueError, match="linear.weight must be finite .* got 1 NaN or infinite"):
        Int8BlockLinear.from_linear(linear)


def test_a_deferred_load_is_converted_in_place_only():
    from clearformer.text.int8_models import int8_blocks_model

    model = TextEncoder.from_pretrained().model
    with pytest.raises(ValueError, match="pass in_place=True with deferred"):
        int8_blocks_model(model, deferred=object())


def test_auto_never_picks_int8_blocks():
    from clearformer.precision import auto_precision

    assert auto_precision(offered=OFFERED, calibrate=False).choice != "int8-blocks"


def test_every_kernel_off_runs_float32(monkeypatch):
    monkeypatch.setenv("CLEARFORMER_KERNELS", "off")
    decision = choose_precision("int8-blocks", offered=OFFERED)
    assert decision.choice == "float32" and "CLEARFORMER_KERNELS=off" in decision.reason


def test_int8_blocks_is_refused_off_the_cpu():
    with pytest.raises(ValueError, match="'int8-blocks' runs on CPUs only"):
        choose_precision("int8-blocks", device="meta", offered=OFFERED)


# --- every family ----------------------------------------------------------------------------


@needs_kernel
def test_int8_blocks_holds_the_floor(family):  # noqa: F811 (the fixture)
    name, encoder, texts, float32 = family
    rows = encoder.encode(texts, normalize=True, precision="int8-blocks")
    layers = [m for m in encoder._models.int8_blocks().modules() if isinstance(m, nn.Linear)]
    assert not layers, f"{name}: {len(layers)} linear layers left in float32"
    cosine = _cosines(rows, float32)
    assert cosine.min() >= MIN_COSINE, f"{name}: {cosine.min():.5f} at {texts[cosine.argmin()]!r}"
    assert np.abs(rows - float32).max() > 1e-5, f"{name}: the int8-blocks rows are float32's"
    # Closer to float32 than per-channel int8, text by text on average.
    int8 = _cosines(encoder.encode(texts, normalize=True, precision="int8"), float32)
    assert (1 - cosine).mean() < (1 - int8).mean(), name


@needs_kernel
def test_a_broken_block_scale_falls_below_the_floor(family):  # noqa: F811
    """Negative control: every fourth output column's block scales off by 1.5x."""
    name, encoder, texts, float32 = family
    layers = [m for m in encoder._models.int8_blocks().modules() if isinstance(m, Int8BlockLinear)]
    saved = [m.scale_packed.clone() for m in layers]
    try:
        with torch.no_grad():
            for m in layers:
                m.scale_packed[:, :, ::4] *= 1.5
        broken = encoder.encode(texts, normalize=True, precision="int8-blocks")
    finally:
        with torch.no_grad():
            for m, scale in zip(layers, saved, strict=True):
                m.scale_packed.copy_(scale)
    assert _cosines(broken, float32).min() < MIN_COSINE, name
    rows = encoder.encode(texts, normalize=True, precision="int8-blocks")
    assert _cosines(rows, float32).min() >= MIN_COSINE


@needs_kernel
def test_loaded_in_int8_blocks_reads_one_layer_at_a_time(family, monkeypatch):  # noqa: F811
    """Held alone, read layer by layer (the layers after the one being read are unread, those
    before converted), the same rows as the per-call model, to the bit; a text alone equals
    its row in the batch."""
    name, encoder, texts, _ = family
    seen = spy_layer_reads(monkeypatch, Int8BlockLinear, "blocks")
    held = TextEncoder.from_pretrained(encoder.path, precision="int8-blocks")
    layers = encoder.config.n_layers
    assert seen == [["blocks"] * i + ["meta"] * (layers - i) for i in range(layers)], name
    expected = encoder.encode(texts, normalize=True, precision="int8-blocks")
    batch = held.encode(texts, normalize=True)
    assert np.array_equal(batch, expected), name
    for i in (0, len(texts) // 2, len(texts) - 1):
        assert np.array_equal(held.encode([texts[i]], normalize=True)[0], batch[i]), (name, i)
    with pytest.raises(ValueError, match=r"precision must be 'int8-blocks' .* got 'int8'"):
        held.encode(texts, precision="int8")
    with pytest.raises(ValueError, match="loaded with precision='int8-blocks'"):
        held.save_pretrained(encoder.path.parent / "never-written")


@needs_kernel
def test_quantize_int8_blocks_keeps_the_skipped_layers_and_the_original():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    converted = quantize_int8_blocks(model, skip=("2",))
    assert isinstance(converted[0], Int8BlockLinear) and isinstance(converted[2], nn.Linear)
    assert isinstance(model[0], nn.Linear)  # the original is not changed
    x = torch.randn(3, 64)
    assert torch.allclose(converted(x), model(x), rtol=0.05, atol=0.02)


# --- the command line ------------------------------------------------------------------------


@needs_kernel
def test_cli_encode_in_int8_blocks(capsys, tmp_path):
    from clearformer.cli import main

    target = tmp_path / "out.npy"
    code = main(["encode", "--precision", "int8-blocks", "-o", str(target), *SENTENCES])
    assert code == 0, capsys.readouterr().err
    encoder = TextEncoder.from_pretrained()
    expected = encoder.encode(SENTENCES, precision="int8-blocks")
    assert np.array_equal(np.load(target), expected)
    assert _cosines(np.load(target), encoder.encode(SENTENCES)).min() >= 0.999


def test_cli_int8_blocks_on_another_device_is_refused_naming_both_flags(monkeypatch, capsys):
    from clearformer.cli import main

    from .test_devices import _as_if_cuda

    _as_if_cuda(monkeypatch)
    code = main(["encode", "--device", "cuda", "--precision", "int8-blocks", "a"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1
    assert "--precision int8-blocks runs on the CPU alone; with --device cuda" in err


def test_a_sparse_model_refuses_int8_blocks_by_name():
    from clearformer.commands.kind_models import kind_precision

    with pytest.raises(ValueError, match="--precision int8-blocks applies to dense models"):
        kind_precision("sparse", "int8-blocks")


@needs_kernel
def test_an_index_built_in_int8_blocks_records_it_and_finds_with_it(tmp_path, capsys):
    """``index build --precision int8-blocks`` writes its vectors from the int8-blocks rows and
    records the precision; an add in another precision is refused; search finds the text."""
    pytest.importorskip("usearch")
    from clearformer.cli import main
    from clearformer.index.layout import META, current_generation, generation_dir, read_json
    from clearformer.index.recipe import index_precision

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n")
    index = tmp_path / "index"
    code = main(["index", "build", "--corpus", str(corpus), "--out", str(index),
                 "--precision", "int8-blocks"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    meta = read_json(generation_dir(index, current_generation(index)) / META)
    assert index_precision(meta) == "int8-blocks"
    capsys.readouterr()
    code = main(["search", "--index", str(index), "--precision", "int8-blocks", "-k", "1",
                 "interest rates at the central bank"])  # fmt: skip
    assert code == 0 and "central bank raised interest rates" in capsys.readouterr().out
    more = tmp_path / "more.txt"
    more.write_text("Snow fell overnight.\n")
    code = main(["index", "add", str(index), "--corpus", str(more),
                 "--precision", "float32"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "'int8-blocks'" in err and "'float32'" in err


def test_building_the_kernel_library_says_so_first(monkeypatch, caplog):
    """The first int8-blocks call on a machine compiles the kernel library (half a minute):
    a progress line says so before the compile starts."""
    import clearformer.fast.avx512 as avx512
    import clearformer.quant.int8_blocks as int8_blocks
    from clearformer.options import Decision

    asked = []

    def load(build=True):
        asked.append(build)
        if not build:
            return Decision("not built", "no library yet")
        assert "building clearformer's AVX-512 kernels" in caplog.text  # said before
        return Decision("unavailable", "mocked compiler")

    monkeypatch.setattr(avx512, "load", load)
    monkeypatch.setattr(int8_blocks, "vnni_here", lambda: True)
    with caplog.at_level(logging.INFO, logger="clearformer.progress"):
        decision = int8_blocks._built_kernel.__wrapped__()
    assert asked == [False, True]
    assert decision.choice == "unavailable" and "mocked compiler" in decision.reason


@needs_kernel
def test_a_cross_encoder_in_int8_blocks_scores_as_float32_within_its_rounding(tmp_path):
    """predict(precision="int8-blocks"): the encoder's linear layers in int8-blocks, the head
    float32; loaded in it alone, the same scores, and no float32 linear layer left in the
    encoder; a pair's score alone equals its score in a batch."""
    from clearformer import CrossEncoder

    from .test_sequence_classification import make_classifier

    make_classifier("bert", tmp_path / "ce", num_labels=1)
    words = ["the cat", "sat on the mat", "a mat", "the cat sat on a mat on a mat", "a", "b"]
    pairs = [(words[i], words[j]) for i in range(6) for j in range(6) if i != j]
    ranker = CrossEncoder.from_pretrained(tmp_path / "ce")
    float32 = ranker.predict(pairs)
    blocks = ranker.predict(pairs, precision="int8-blocks")
    assert not np.array_equal(blocks, float32)  # really rounded
    assert np.abs(blocks - float32).max() < 2e-3 * (np.abs(float32).max() + 1)
    layers = [m for m in ranker.int8_blocks_model().modules() if isinstance(m, nn.Linear)]
    assert not layers and any(isinstance(m, nn.Linear) for m in ranker.model.modules())
    held = CrossEncoder.from_pretrained(tmp_path / "ce", precision="int8-blocks")
    assert not any(isinstance(m, nn.Linear) for m in held.model.modules())
    assert np.array_equal(held.predict(pairs), blocks)
    assert np.array_equal(held.predict(pairs[3:4])[0], blocks[3])
    with pytest.raises(ValueError, match=r"precision must be 'int8-blocks' .* got 'bf16'"):
        held.predict(pairs, precision="bf16")
