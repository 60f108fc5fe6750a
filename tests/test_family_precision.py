"""bf16 and int8 encoding for every family, against the same model in float32.

The int8 route (per-channel weight scales, per-token dynamic activation scales,
:mod:`clearformer.quant.int8`) and the bf16 copy (:mod:`clearformer.precision.bf16`) were
first measured on BERT-family layers. These tests hold each family's own layer kinds to the
same floor: RMSNorm and SwiGLU (Qwen3, Gemma3), grouped-query attention (Qwen3 with 2 key/value
heads for 4 query heads, Gemma3 with 1), sliding windows (Gemma3, ModernBERT), rotary
positions (all but BERT), GLU feed-forwards without biases (GTE, Nomic). Each model is a small
random one written by transformers and wrapped by sentence-transformers, with its family's
pooling.

The floor is a cosine to float32 of at least 0.995 for every text. The negative control breaks
one thing, the weight scales of every fourth output channel of each int8 layer (off by 1.5x,
as a wrong per-channel reduction would make them), and the floor must catch it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from clearformer import TextEncoder
from clearformer.quant.int8 import Int8Linear, int8_support

from .family_helpers import TEXTS, WORDS, perturb, sentence_dir, word_tokenizer
from .test_family_gemma3 import gemma3_config
from .test_family_gte_nomic import SIZES
from .test_family_qwen3 import qwen3_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

MIN_COSINE = 0.995
needs_int8 = pytest.mark.skipif(
    not int8_support().available, reason=f"no int8 here: {int8_support().reason}"
)


def _qwen3():
    return transformers.Qwen3Model(qwen3_config()), "$A <eos>", "lasttoken"


def _gemma3():
    return transformers.Gemma3TextModel(gemma3_config()), "<bos> $A <eos>", "mean"


SMALL = SIZES  # the GTE / Nomic tests' small widths, for the BERT-era families here too


def _gte():
    config = transformers.GteConfig(**SMALL, type_vocab_size=1)
    return transformers.GteModel(config), "<bos> $A <eos>", "cls"


def _nomic():
    model = transformers.NomicBertModel(transformers.NomicBertConfig(**SMALL))
    return model, "<bos> $A <eos>", "mean"


def _modernbert():
    config = transformers.ModernBertConfig(
        **{**SMALL, "num_hidden_layers": 5},
        local_attention=8,  # layers 0 and 3 global, the others a window of 8
        global_attn_every_n_layers=3,
        bos_token_id=2,
        eos_token_id=3,
        cls_token_id=2,
        sep_token_id=3,
    )
    return transformers.ModernBertModel(config), "<bos> $A <eos>", "mean"


def _bert():
    return transformers.BertModel(transformers.BertConfig(**SMALL)), "<bos> $A <eos>", "mean"


FAMILIES = {
    "qwen3": _qwen3,
    "gemma3": _gemma3,
    "gte": _gte,
    "nomic": _nomic,
    "modernbert": _modernbert,
    "bert": _bert,
}


def _texts() -> list[str]:
    """The ragged family texts and 40 random word sentences of 3 to 40 words."""
    rng = np.random.default_rng(3)
    words = [w for w in WORDS if w not in ("", " ")]
    random = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(3, 41, size=40)]
    return [*TEXTS, *random]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    torch.manual_seed(0)
    model, template, pooling = FAMILIES[request.param]()
    perturb(model.eval(), seed=5)
    base = tmp_path_factory.mktemp(f"{request.param}-base")
    model.save_pretrained(base)
    word_tokenizer(base, template=template)
    path = sentence_dir(base, tmp_path_factory.mktemp(f"{request.param}-st"), pooling=pooling)
    encoder = TextEncoder.from_pretrained(path)
    texts = _texts()
    return request.param, encoder, texts, encoder.encode(texts, normalize=True)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_bf16_holds_the_floor(family):
    name, encoder, texts, float32 = family
    rows = encoder.encode(texts, normalize=True, precision="bf16")
    cosine = _cosines(rows, float32)
    assert cosine.min() >= MIN_COSINE, f"{name}: {cosine.min():.5f} at {texts[cosine.argmin()]!r}"
    assert np.abs(rows - float32).max() > 1e-4, f"{name}: the bf16 rows are float32's"


# The compiled steps around the int8 product depend on the widths and the activation, not on
# the family: the two families with new ones (SwiGLU, GeGLU, grouped-query widths) run them;
# the compile costs seconds per family.
FUSED_FAMILIES = ("qwen3", "gemma3")


@needs_int8
@pytest.mark.parametrize("fuse", [False, True], ids=["eager", "fused"])
def test_int8_holds_the_floor(family, fuse):
    name, encoder, texts, float32 = family
    if fuse and name not in FUSED_FAMILIES:
        pytest.skip(f"fused int8 steps are checked on {', '.join(FUSED_FAMILIES)}")
    quantized = [m for m in encoder.int8_model().modules() if isinstance(m, Int8Linear)]
    assert quantized, f"{name}: no layer was converted to int8"
    rows = encoder.encode(texts, normalize=True, precision="int8", fuse_int8=fuse)
    cosine = _cosines(rows, float32)
    assert cosine.min() >= MIN_COSINE, f"{name}: {cosine.min():.5f} at {texts[cosine.argmin()]!r}"
    assert np.abs(rows - float32).max() > 1e-4, f"{name}: the int8 rows are float32's"


@needs_int8
def test_a_broken_weight_scale_falls_below_the_floor(family):
    """Negative control: the floor is tight enough to see one wrong scale per four channels."""
    name, encoder, texts, float32 = family
    model = encoder.int8_model()
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    saved = [m.weight_scale.clone() for m in layers]
    try:
        with torch.no_grad():
            for m in layers:
                m.weight_scale[::4] *= 1.5
        broken = encoder.encode(texts, normalize=True, precision="int8", fuse_int8=False)
    finally:
        with torch.no_grad():
            for m, scale in zip(layers, saved, strict=True):
                m.weight_scale.copy_(scale)
    assert _cosines(broken, float32).min() < MIN_COSINE, name
    # Restored: the same call holds the floor again.
    rows = encoder.encode(texts, normalize=True, precision="int8", fuse_int8=False)
    assert _cosines(rows, float32).min() >= MIN_COSINE


# --- loaded in one precision -----------------------------------------------------------------


def test_loaded_in_bf16_runs_the_bf16_copy(family):
    """``from_pretrained(precision="bf16")`` holds the bfloat16 model alone, built from the
    file without the float32 one: its rows are the float32 encoder's bf16 rows, bit for bit."""
    name, encoder, texts, _ = family
    held = TextEncoder.from_pretrained(encoder.path, precision="bf16")
    linear = [m.weight.dtype for m in held.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linear and set(linear) == {torch.bfloat16}, name
    expected = encoder.encode(texts, normalize=True, precision="bf16")
    assert np.array_equal(held.encode(texts, normalize=True), expected), name
    assert held.bf16_model() is held.model
    with pytest.raises(ValueError, match=r"precision must be 'bf16' .* got 'float32'"):
        held.encode(texts, precision="float32")
    with pytest.raises(ValueError, match=r"precision must be 'bf16' .* got 'int8'"):
        held.int8_model()


@needs_int8
def test_loaded_in_int8_runs_the_int8_model_and_lets_float32_go(family):
    """``precision="int8"`` builds the int8 model as ``encode(precision="int8")`` does, then
    keeps no float32 linear layer: the float32 model is unreachable once the parts go."""
    import gc
    import weakref

    from clearformer.options import Decision
    from clearformer.text.encoder_files import read_encoder_parts

    name, encoder, texts, _ = family
    parts = read_encoder_parts(
        encoder.path, backend="auto", strict=True, padding_side=None, truncate_dim=None
    )
    float_layers = [
        weakref.ref(m) for m in parts.loaded.model.modules() if isinstance(m, torch.nn.Linear)
    ]
    held = TextEncoder.from_parts(parts, held=Decision("int8", "test"))
    del parts
    gc.collect()
    alive = [ref() for ref in float_layers if ref() is not None]
    assert float_layers and not alive, f"{name}: {len(alive)} float32 linear layers kept"
    expected = encoder.encode(texts, normalize=True, precision="int8", fuse_int8=False)
    assert np.array_equal(held.encode(texts, normalize=True, fuse_int8=False), expected), name
    assert held.int8_model() is held.model
    with pytest.raises(ValueError, match=r"precision must be 'int8' .* got 'bf16'"):
        held.encode(texts, precision="bf16")
    with pytest.raises(ValueError, match="loaded with precision='int8'"):
        held.save_pretrained(encoder.path.parent / "never-written")
    assert not (encoder.path.parent / "never-written").exists()


@needs_int8
def test_loaded_in_int8_reads_one_layer_at_a_time(family, monkeypatch):
    """``from_pretrained(precision="int8")`` reads each encoder layer from the checkpoint as
    the calibration run reaches it and converts it once it has run: when layer i is read, the
    layers before it are int8 and the layers after it unread (meta), so no two layers' float32
    weights are ever held at once; the model is the one ``encode(precision="int8")`` builds
    from the whole float32 model, to the bit."""
    name, encoder, texts, _ = family
    seen = spy_layer_reads(monkeypatch, Int8Linear, "int8")
    held = TextEncoder.from_pretrained(encoder.path, precision="int8")
    layers = encoder.config.n_layers
    assert seen == [["int8"] * i + ["meta"] * (layers - i) for i in range(layers)], name
    expected = encoder.encode(texts, normalize=True, precision="int8", fuse_int8=False)
    assert np.array_equal(held.encode(texts, normalize=True, fuse_int8=False), expected), name


def spy_layer_reads(monkeypatch, converted: type, label: str) -> list[list[str]]:
    """Each read of a deferred encoder layer appends the state of every layer just before it:
    "meta" (unread), "float" (a float linear layer left), ``label`` (layers of ``converted``
    alone) or "?"."""
    from clearformer.interop.hf.deferred import DeferredLayers

    seen: list[list[str]] = []
    read = DeferredLayers.read

    def state(layer) -> str:
        if any(p.is_meta for p in layer.parameters()):
            return "meta"
        kinds = {type(m) for m in layer.modules()}
        return "float" if torch.nn.Linear in kinds else label if converted in kinds else "?"

    def spy(self, index):
        seen.append([state(layer) for layer in self.model.encoder.layers])
        read(self, index)

    monkeypatch.setattr(DeferredLayers, "read", spy)
    return seen


def test_int8_asked_where_the_cpu_has_none_loads_float32_and_takes_int8_calls(monkeypatch):
    """Loaded with precision="int8" on a CPU without int8 products, the encoder holds the
    float32 model (as encode(precision="int8") runs there) and calls that ask for int8 run
    it; the refusal of another precision names what was asked and what runs."""
    import clearformer.quant
    from clearformer.quant.int8 import Int8Support

    monkeypatch.setattr(clearformer.quant, "int8_support", lambda: Int8Support(False, "mocked"))
    held = TextEncoder.from_pretrained(precision="int8")
    assert held.precision_for("int8").choice == "float32"
    texts = _texts()[:8]
    expected = TextEncoder.from_pretrained().encode(texts)
    assert np.array_equal(held.encode(texts, precision="int8"), expected)
    assert np.array_equal(held.encode(texts), expected)
    with pytest.raises(ValueError, match=r"loaded with precision='int8', run as float32 .* 'bf16'"):
        held.encode(texts, precision="bf16")
