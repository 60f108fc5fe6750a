"""The new layer kinds as a stack runs them, on every backend: causal attention sees no later
token (padded and packed rows alike, left padding included), a text's states do not depend on
its batch-mates, packed ids equal padded ids, and the configuration refuses what it cannot run
with an error naming the field."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from clearformer import EncoderConfig, EncoderModel

BACKENDS = ["math", "sdpa", "varlen", "auto"]
VOCAB = 50

KINDS = {
    "qwen3": dict(
        norm="pre",
        activation="swiglu",
        norm_kind="rms",
        qk_norm=True,
        n_kv_heads=2,
        head_dim=12,
        causal=True,
        positions="rotary",
        bias=False,
    ),
    "gemma3": dict(
        norm="pre",
        activation="geglu_tanh",
        norm_kind="rms",
        norm_unit_offset=True,
        branch_norm=True,
        qk_norm=True,
        n_kv_heads=1,
        head_dim=12,
        attn_scale=0.2,
        positions="rotary",
        rope_theta=1_000_000.0,
        local_rope_theta=10_000.0,
        layer_pattern=("local", "global"),
        local_window=4,
        scale_embeddings=True,
        bias=False,
    ),
    "gemma3-causal": dict(
        norm="pre",
        activation="geglu_tanh",
        norm_kind="rms",
        norm_unit_offset=True,
        branch_norm=True,
        n_kv_heads=2,
        positions="rotary",
        layer_pattern=("local", "global"),
        local_window=3,
        causal=True,
        bias=False,
    ),
}


def model_of(kind: str, **overrides) -> EncoderModel:
    torch.manual_seed(0)
    fields = {**KINDS[kind], **overrides}
    config = EncoderConfig(
        d_model=32, n_heads=4, n_layers=2, dim_mlp=48, vocab_size=VOCAB, **fields
    )
    model = EncoderModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


def padded(texts: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(t) for t in texts)
    ids = torch.zeros(len(texts), T, dtype=torch.long)
    mask = torch.zeros(len(texts), T, dtype=torch.bool)
    for row, text in enumerate(texts):
        cols = slice(T - len(text), T) if left else slice(0, len(text))
        ids[row, cols] = torch.tensor(text, dtype=torch.long)
        mask[row, cols] = True
    return ids, mask


def run(model, ids, mask, backend):
    with torch.no_grad():
        return model(ids, mask, backend=backend)


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["qwen3", "gemma3-causal"])
def test_causal_attention_sees_no_later_token(kind, backend, left):
    """Changing the tokens after position i leaves the states up to i as they were; a padded
    and a packed batch alike."""
    model = model_of(kind)
    g = torch.Generator().manual_seed(1)
    texts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (8, 5, 8, 3)]
    changed = [t[:4] + [(x % (VOCAB - 1)) + 1 for x in t[4:]] for t in texts]
    ids, mask = padded(texts, left)
    ids2, _ = padded(changed, left)
    a, b = run(model, ids, mask, backend), run(model, ids2, mask, backend)
    for row, text in enumerate(texts):
        first = mask.shape[1] - len(text) if left else 0
        keep = slice(first, first + min(4, len(text)))  # the first 4 tokens, unchanged
        assert (a[row, keep] - b[row, keep]).abs().max() <= 1e-6
        if len(text) > 4:  # the later ones did change, so the test could fail
            later = slice(first + 4, first + len(text))
            assert (a[row, later] - b[row, later]).abs().max() > 1e-3


def test_a_causal_model_run_bidirectionally_sees_later_tokens():
    """Negative control for the test above."""
    model = model_of("qwen3", causal=False)
    ids, mask = padded([[5, 6, 7, 8, 9, 10]], left=False)
    ids2 = ids.clone()
    ids2[0, 5] = 11
    a, b = run(model, ids, mask, "sdpa"), run(model, ids2, mask, "sdpa")
    assert (a[0, :5] - b[0, :5]).abs().max() > 1e-3


@pytest.mark.parametrize("backend", ["math", "varlen", "auto"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_packed_ids_equal_padded_ids(kind, backend):
    """Ids packed by the caller (cu_seqlens) give the padded call's rows."""
    model = model_of(kind)
    texts = [[3, 4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16]]
    ids, mask = padded(texts, left=False)
    want = run(model, ids, mask, "math")[mask]  # (N, D)
    flat = torch.tensor([x for t in texts for x in t])
    cu = torch.tensor([0, 7, 9, 14], dtype=torch.int32)
    with torch.no_grad():
        got = model(flat, cu_seqlens=cu, backend=backend)
    assert (got - want).abs().max() <= 1e-5


_MODELS: dict[str, EncoderModel] = {}  # one model per kind for every Hypothesis example


@given(
    lengths=st.lists(st.integers(1, 11), min_size=2, max_size=5),
    left=st.booleans(),
    kind=st.sampled_from(sorted(KINDS)),
    backend=st.sampled_from(BACKENDS),
)
def test_a_text_alone_equals_it_in_a_ragged_batch(lengths, left, kind, backend):
    model = _MODELS.get(kind) or _MODELS.setdefault(kind, model_of(kind))
    g = torch.Generator().manual_seed(sum(lengths))
    texts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]
    ids, mask = padded(texts, left)
    batch = run(model, ids, mask, backend)
    for row, text in enumerate(texts):
        alone = run(model, *padded([text], left), backend)[0]  # (n, D)
        # 1e-6 of the states' scale: normed rows reach 2.5 and more, where float32's own
        # rounding (kernels choose their blocking by shape) is a few 1e-7.
        scale = max(1.0, alone.abs().max().item())
        assert (batch[row][mask[row]] - alone).abs().max() <= 1e-6 * scale


@pytest.mark.parametrize(
    "backend, method", [("sdpa", None), ("varlen", "sequence"), ("varlen", "padded")]
)
def test_grouped_keys_are_not_repeated_in_memory(backend, method):
    """The fast routes hand grouped keys and values to the fused kernel as they are: no
    repeat, and no fall-back to the unfused kernel."""
    import dataclasses

    from torch.profiler import profile

    from clearformer.options import Decision

    model = model_of("qwen3", causal=False)
    ids, mask = padded([[3, 4, 5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15]], left=False)
    with torch.no_grad():
        plan = model.encoder.plan_for(mask, backend=backend)
        if method is not None:  # every layer's plan takes the method
            choice = Decision(method, "chosen by the test")
            layers = tuple(dataclasses.replace(p, method=choice) for p in plan.layers)
            plan = dataclasses.replace(plan, layers=layers)
        x = model.embeddings(ids)
        with profile() as prof:
            model.encoder.run(x, plan)
    ops = {event.name for event in prof.events()}
    assert "aten::repeat_interleave" not in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops, sorted(ops)
    assert any("scaled_dot_product_flash_attention" in op for op in ops), sorted(ops)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gradients_agree_on_every_backend(kind):
    """Training runs the same kinds on packed rows (varlen) and padded ones (sdpa): their
    gradients equal the reference kernel's, left padding included."""
    grads = {}
    for backend in ("math", "sdpa", "varlen"):
        model = model_of(kind).train()
        ids, mask = padded([[3, 4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16]], left=True)
        model(ids, mask, backend=backend).pow(2).sum().backward()
        grads[backend] = torch.cat([p.grad.flatten() for p in model.parameters()])
    scale = grads["math"].abs().max()
    for backend in ("sdpa", "varlen"):
        assert (grads[backend] - grads["math"]).abs().max() <= 2e-6 * scale, backend


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_layer_kinds_export_to_onnx(kind, tmp_path):
    """The exported graph (padded layout, sdpa) gives the model's states under onnxruntime."""
    for name in ("onnx", "onnxscript"):
        pytest.importorskip(name)
    ort = pytest.importorskip("onnxruntime")
    from clearformer.export.onnx import export_onnx

    model = model_of(kind)
    ids, mask = padded([[3, 4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15], [16]], left=False)
    with torch.no_grad():
        want = model(ids, mask)
    result = export_onnx(model, tmp_path / kind, pooling=False)
    session = ort.InferenceSession(str(result.model), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy()}
    (hidden,) = session.run(None, feed)
    assert abs(torch.from_numpy(hidden)[mask] - want[mask]).max() <= 1e-5


# -- the configuration's checks ---------------------------------------------------------------
BASE = dict(d_model=32, n_heads=4, n_layers=2, dim_mlp=48)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(n_kv_heads=3), "n_kv_heads must divide n_heads.*got n_kv_heads=3, n_heads=4"),
        (dict(n_kv_heads=0), "n_kv_heads must be a positive int or None, got 0"),
        (dict(head_dim=0), "head_dim must be a positive int or None, got 0"),
        (dict(attn_scale=-1.0), "attn_scale"),
        (dict(norm_kind="batch"), "norm_kind.*'batch'"),
        (dict(norm_unit_offset=True), "norm_unit_offset=True.*needs norm_kind='rms'"),
        (dict(branch_norm=True, norm="post"), "branch_norm=True.*needs norm='pre'"),
        (dict(causal=1), "causal must be a bool"),
        (dict(layer_pattern=("global",)), "layer_pattern must be a tuple of n_layers=2"),
        (dict(layer_pattern=("global", "sliding")), r"layer_pattern entries.*\['sliding'\]"),
        (dict(layer_pattern=("global", "local")), "local layers and needs local_window"),
        (
            dict(layer_pattern=("global", "local"), local_window=4, global_every=2),
            "layer_pattern and global_every",
        ),
        (dict(positions="rotary", head_dim=7), "even head width.*got 7"),
    ],
)
def test_bad_layer_kind_fields_are_named(fields, match):
    with pytest.raises((ValueError, TypeError), match=match):
        EncoderConfig(**{**BASE, **fields})


def test_head_dim_frees_d_model_from_the_head_count():
    config = EncoderConfig(d_model=30, n_heads=4, head_dim=8, n_layers=1, dim_mlp=16)
    assert config.head_width == 8
    with pytest.raises(ValueError, match="d_model"):
        EncoderConfig(d_model=30, n_heads=4, n_layers=1, dim_mlp=16)


def test_layer_pattern_round_trips_through_a_dict():
    config = EncoderConfig(**BASE, layer_pattern=("local", "global"), local_window=4)
    data = config.to_dict()
    data["layer_pattern"] = list(data["layer_pattern"])  # as JSON gives it back
    assert EncoderConfig.from_dict(data) == config


def test_defaults_keep_the_existing_layout():
    """The new fields at their defaults build the modules and parameters of before."""
    from clearformer import Encoder

    encoder = Encoder(EncoderConfig(**BASE))
    names = {n for n, _ in encoder.named_parameters()}
    assert not any("q_norm" in n or "out_norm" in n for n in names)
    assert encoder.layers[0].attn.in_proj.weight.shape == (96, 32)
    assert isinstance(encoder.layers[0].mlp_norm, torch.nn.LayerNorm)
    grouped = Encoder(EncoderConfig(**BASE, n_kv_heads=1, head_dim=12))
    # rows: 4 query heads of 12, then one key head and one value head of 12
    assert grouped.layers[0].attn.in_proj.weight.shape == (48 + 12 + 12, 32)
    assert grouped.layers[0].attn.out_proj.weight.shape == (32, 48)


def test_the_plan_says_which_method_serves_grouped_keys():
    model = model_of("qwen3")
    mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4], dtype=torch.bool)
    plan = model.encoder.plan_for(mask, backend="varlen")
    assert plan.layer(0).is_causal
    assert plan.packed and plan.method.choice != "avx512", str(plan)
