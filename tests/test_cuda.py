"""The documented semantics on a CUDA device, in every dtype: the backends agree with the
float64 reference on the CPU, a row's real tokens do not depend on its padding (left, right or
none), padded positions and fully masked rows are zeros and never NaN, and decoding with a
cache gives what decoding without one gives.

Skipped without a CUDA device (CI has none). ``CLEARFORMER_TEST_DEVICE=cpu`` runs the same
checks on the CPU, to try them where no GPU is lent.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from clearformer import EncoderConfig, EncoderModel, Seq2SeqConfig, Seq2SeqTransformer

DEVICE = os.environ.get("CLEARFORMER_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(),
    reason="no CUDA device (set CLEARFORMER_TEST_DEVICE=cpu to run these checks on the CPU)",
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Largest difference to the float64 reference, relative to the reference's largest value.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}
T = 24
# Real tokens of each row: right-padded, left-padded, full, a short right-padded one, none.
ROWS = [("right", 17), ("left", 9), ("right", T), ("left", 1), ("right", 0)]


def _mask() -> torch.Tensor:
    steps = torch.arange(T)
    rows = [(steps >= T - n) if side == "left" else (steps < n) for side, n in ROWS]
    return torch.stack(rows)  # (B, T) bool


def _model(positions: str) -> EncoderModel:
    torch.manual_seed(0)
    config = EncoderConfig(
        d_model=64, n_heads=4, n_layers=2, dim_mlp=128, vocab_size=50, positions=positions
    )
    return EncoderModel(config).eval()


@pytest.mark.parametrize("positions", ["learned", "rotary"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_backend_matches_the_reference_and_ignores_padding(dtype, positions):
    model = _model(positions)
    ids = torch.randint(1, 50, (len(ROWS), T), generator=torch.Generator().manual_seed(1))
    mask = _mask()
    with torch.no_grad():
        want = model.double()(ids, mask.long(), backend="math")  # (B, T, D) float64, CPU
        scale = want.abs().max().item()
        gpu = model.to(DEVICE, dtype)
        for backend in ("math", "sdpa", "varlen"):
            got = gpu(ids.to(DEVICE), mask.long().to(DEVICE), backend=backend)  # (B, T, D)
            assert got.dtype == dtype and not got.isnan().any(), backend
            got = got.double().cpu()
            assert (got[~mask] == 0).all(), f"{backend}: padded positions are not zeros"
            worst = (got - want).abs().max().item() / scale
            assert worst < TOLERANCE[dtype], f"{backend}: {worst:.2e} from the reference"
            for b, (_, n) in enumerate(ROWS):
                if n == 0:
                    continue
                alone = gpu(ids[b][mask[b]][None].to(DEVICE), backend=backend)[0]  # (n, D)
                diff = (alone.double().cpu() - got[b][mask[b]]).abs().max().item() / scale
                assert diff < TOLERANCE[dtype], f"{backend}, row {b}: {diff:.2e} from alone"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decoding_with_a_cache_equals_decoding_without(dtype):
    torch.manual_seed(0)
    config = Seq2SeqConfig(
        src_vocab_size=40, d_model=64, n_heads=4, encoder_layers=2, decoder_layers=2,
        dim_mlp=128, dropout=0.0, max_positions=64,
    )  # fmt: skip
    model = Seq2SeqTransformer(config).eval().to(DEVICE, dtype)
    src = torch.randint(3, 40, (3, 11), generator=torch.Generator().manual_seed(2))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[1, 7:] = False
    src, src_mask = src.to(DEVICE), src_mask.to(DEVICE)
    for beams in (1, 3):
        cached = model.generate(src, src_mask, max_new_tokens=10, num_beams=beams)
        full = model.generate(src, src_mask, max_new_tokens=10, num_beams=beams, use_cache=False)
        assert not cached.scores.isnan().any()
        if dtype == torch.float32:  # in half precision a near tie may resolve either way
            assert torch.equal(cached.sequences, full.sequences), beams
        else:
            agree = (cached.sequences == full.sequences).float().mean().item()
            assert agree > 0.5, f"{beams} beams: {agree:.0%} of the tokens agree"


WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat"]
# Ragged on purpose: the batch has padding, so the encoder packs it on the device.
TEXTS = ["the cat sat", "a cat on the mat sat on a mat the cat sat on", "mat", "on a mat"]


@pytest.mark.parametrize("precision", ["float32", "bf16", "auto"])
def test_text_encoder_on_the_device_equals_the_cpu(tmp_path, precision):
    from clearformer import TextEncoder

    from .helpers import write_tiny_bert

    path = write_tiny_bert(tmp_path / "bert", WORDS, n_layers=2, width=32, heads=2)
    on_cpu = TextEncoder.from_pretrained(path).encode(TEXTS)  # float32 on the CPU
    encoder = TextEncoder.from_pretrained(path, device=DEVICE, precision=precision)
    assert encoder.device.type == torch.device(DEVICE).type
    got = encoder.encode(TEXTS, batch_size=4)  # one ragged batch: packed
    alone = [encoder.encode([text])[0] for text in TEXTS]  # no padding at all
    assert got.dtype == np.float32 and np.isfinite(got).all()
    runs = encoder.precision_for(precision).choice  # auto: bf16 from Ampere on, or float32
    floor = 0.99999 if runs == "float32" else 0.995
    assert (got * on_cpu).sum(1).min() > floor  # both unit length: the cosines
    assert (got * np.stack(alone)).sum(1).min() > floor


def test_cross_encoder_on_the_device_equals_the_cpu(tmp_path):
    from clearformer import CrossEncoder

    from .test_sequence_classification import make_classifier

    make_classifier("bert", tmp_path / "ce", num_labels=1)
    pairs = [("the cat", "sat on the mat"), ("a mat", "the cat sat on a mat on a mat"), ("a", "b")]
    on_cpu = CrossEncoder.from_pretrained(tmp_path / "ce").predict(pairs)
    got = CrossEncoder.from_pretrained(tmp_path / "ce", device=DEVICE).predict(pairs)
    assert np.allclose(got, on_cpu, atol=1e-5), (got, on_cpu)
    # auto: bf16 on a GPU from Ampere on (scores within bf16's rounding), float32 elsewhere.
    auto = CrossEncoder.from_pretrained(tmp_path / "ce", device=DEVICE, precision="auto")
    tolerance = 1e-5 if auto.precision_for("auto").choice == "float32" else 2e-2
    assert np.allclose(auto.predict(pairs), on_cpu, atol=tolerance)


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_a_qwen3_layout_with_a_dense_head_on_the_device(tmp_path, precision):
    """Grouped keys and values, rotary positions, RMSNorm, last-token pooling and a Dense
    module after the pooling: the head goes to the device with the model."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("sentence_transformers")
    from clearformer import TextEncoder

    from .family_helpers import perturb, sentence_dir, word_tokenizer
    from .test_family_qwen3 import qwen3_config

    torch.manual_seed(0)
    model = transformers.Qwen3Model(qwen3_config()).eval()
    perturb(model, seed=5)
    model.save_pretrained(tmp_path / "base")
    word_tokenizer(tmp_path / "base", template="$A <eos>")
    path = sentence_dir(
        tmp_path / "base", tmp_path / "st", pooling="lasttoken", dense=[(64, 32, True, "Tanh")]
    )
    texts = ["the cat sat on the mat", "a dog", "the cat and the dog sat on a mat"]
    on_cpu = TextEncoder.from_pretrained(path).encode(texts, normalize=True)
    got = TextEncoder.from_pretrained(path, device=DEVICE, precision=precision).encode(
        texts, normalize=True
    )
    assert got.shape == on_cpu.shape == (3, 32)
    floor = 0.99999 if precision == "float32" else 0.995
    assert (got * on_cpu).sum(1).min() > floor


def test_a_server_on_the_device_answers_as_the_cpu(tmp_path):
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from clearformer import CrossEncoder, TextEncoder
    from clearformer.serve import ModelSpec, ServeConfig

    from .helpers import write_tiny_bert
    from .test_sequence_classification import make_classifier
    from .test_serve_api import running_server

    path = write_tiny_bert(tmp_path / "bert", WORDS, n_layers=2, width=32, heads=2)
    make_classifier("bert", tmp_path / "ce", num_labels=1)
    on_cpu = TextEncoder.from_pretrained(path).encode(TEXTS)
    pairs = ["w1 w2 w3", "w4", "w1 w2", "w9 w8 w7 w6"]
    scores = CrossEncoder.from_pretrained(tmp_path / "ce").predict([("w1 w2", t) for t in pairs])
    config = ServeConfig(port=0, device=DEVICE)
    specs = [
        ModelSpec(path=str(path), name="tiny"),
        ModelSpec(path=str(tmp_path / "ce"), name="ce"),
    ]
    with running_server(config, specs) as server:
        embedded = httpx.post(
            server.url + "/embed", json={"model": "tiny", "inputs": TEXTS}, timeout=60
        )
        ranked = httpx.post(
            server.url + "/rerank",
            json={"model": "ce", "query": "w1 w2", "texts": pairs},
            timeout=60,
        )
    assert embedded.status_code == 200, embedded.text
    got = np.asarray(embedded.json(), dtype=np.float32)
    assert (got * on_cpu).sum(1).min() > 0.99999
    assert ranked.status_code == 200, ranked.text
    by_index = {r["index"]: r["score"] for r in ranked.json()}
    assert np.allclose([by_index[i] for i in range(len(pairs))], scores, atol=1e-5)
