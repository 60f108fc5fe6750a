"""The forward plan: made once per call, trusted below, chosen per call, never stored."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from clearformer import Encoder, EncoderBlock, EncoderConfig, EncoderModel, MultiHeadAttention
from clearformer import masks as masks_module
from clearformer.kernels import sdpa as sdpa_module
from clearformer.padding import repad, unpad
from clearformer.plan import Ask, Rows, plan_stack

from .helpers import lengths_mask

D, H = 32, 4
LENGTHS = [6, 1, 0, 4]  # mostly padding, an empty row: auto packs


def small_config(**overrides) -> EncoderConfig:
    base = dict(d_model=D, n_heads=H, n_layers=6, dim_mlp=64)
    return EncoderConfig(**{**base, **overrides})


@pytest.fixture
def validation_calls(monkeypatch):
    """Counts every call of the one mask validator, wherever it is called from."""
    calls = []
    real = masks_module.prepare_attention_mask

    def counting(*args, **kwargs):
        calls.append(kwargs.get("name", "mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(masks_module, "prepare_attention_mask", counting)
    return calls


@pytest.mark.parametrize(
    "backend,packed", [("auto", True), ("varlen", True), ("sdpa", False), ("math", False)]
)
def test_one_encoder_forward_validates_its_mask_exactly_once(validation_calls, backend, packed):
    encoder = Encoder(small_config(backend=backend)).eval()
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), mask.shape[1], D)
    with torch.no_grad():
        out = encoder(x, mask)
    assert encoder.plan_for(mask).packed is packed  # the path the count was taken on
    assert len(validation_calls) == 1 + 1  # the forward's one, and plan_for's own just above
    assert (out[~mask] == 0).all()


def test_model_forward_validates_once_and_names_its_argument(validation_calls):
    model = EncoderModel(small_config(vocab_size=50)).eval()
    ids = torch.randint(0, 50, (len(LENGTHS), 6))
    with torch.no_grad():
        model(ids, lengths_mask(LENGTHS).long())
    assert validation_calls == ["attention_mask"]
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, T\) = \(4, 6\)"):
        model(ids, torch.ones(4, 5, dtype=torch.long))


def test_sdpa_reads_which_rows_have_a_key_from_the_plan(monkeypatch):
    """The per-layer host sync is gone: the plan looks at the mask once for all layers."""
    looks = []
    real = masks_module.rows_with_key

    def counting(*args, **kwargs):
        looks.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(masks_module, "rows_with_key", counting)
    monkeypatch.setattr(sdpa_module, "rows_with_key", counting)
    encoder = Encoder(small_config(backend="sdpa")).eval()
    mask = lengths_mask(LENGTHS)
    with torch.no_grad():
        encoder(torch.randn(len(LENGTHS), 6, D), mask)
    assert len(looks) == 1


def test_a_lone_block_or_attention_validates_a_raw_mask_once(validation_calls):
    block = EncoderBlock(D, H, 64).eval()
    x = torch.randn(len(LENGTHS), 6, D)
    with torch.no_grad():
        block(x, lengths_mask(LENGTHS))
        assert len(validation_calls) == 1
        block.attn(x, mask=lengths_mask(LENGTHS))
    assert len(validation_calls) == 2


def test_plan_says_what_runs_and_why():
    encoder = Encoder(small_config())
    text = str(encoder.plan_for(lengths_mask(LENGTHS)))
    assert "layout: packed" in text and "padding" in text
    assert "kernel: varlen" in text and "varlen method:" in text
    full = str(encoder.plan_for(torch.ones(2, 5, dtype=torch.bool)))
    assert "layout: padded (no padding" in full and "kernel: sdpa" in full
    weights = encoder.plan_for(lengths_mask(LENGTHS), output_attentions=True)
    assert weights.kernel.choice == "math" and "weights" in weights.kernel.reason


def test_packed_plan_gives_positions_that_restart_in_every_sequence():
    plan = Encoder(small_config(backend="varlen")).plan_for(lengths_mask([3, 0, 2, 1]))
    assert plan.positions.tolist() == [0, 1, 2, 0, 1, 0]
    assert plan.packing.cu_seqlens.tolist() == [0, 3, 3, 5, 6]


@pytest.mark.parametrize("backend", ["math", "sdpa", "varlen"])
def test_per_call_backend_overrides_the_config_and_changes_nothing(backend):
    encoder = Encoder(small_config(n_layers=2)).eval()
    config_before = encoder.config
    state_before = {name: m.__dict__.copy() for name, m in encoder.named_modules()}
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), 6, D)
    with torch.no_grad():
        want = encoder(x, mask)
        got = encoder(x, mask, backend=backend)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert encoder.plan_for(mask, backend=backend).kernel.choice == backend
    assert encoder.config is config_before
    for name, m in encoder.named_modules():
        assert m.__dict__.keys() == state_before[name].keys(), name
        for key, value in m.__dict__.items():
            if key not in ("_parameters", "_buffers", "_modules"):
                assert value == state_before[name][key], (name, key)


def test_backend_is_read_only_on_modules():
    attn = MultiHeadAttention(D, D, D, D, H, backend="math")
    block = EncoderBlock(D, H, 64, backend="sdpa")
    with pytest.raises(AttributeError):
        attn.backend = "sdpa"
    with pytest.raises(AttributeError):
        block.backend = "math"
    assert attn.backend == "math" and block.backend == "sdpa"


def test_an_explicit_plan_is_used_as_given_and_checked_against_the_batch():
    encoder = Encoder(small_config(n_layers=2)).eval()
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), 6, D)
    plan = encoder.plan_for(mask, backend="math")
    with torch.no_grad():
        torch.testing.assert_close(encoder(x, plan=plan), encoder(x, mask, backend="math"))
        with pytest.raises(ValueError, match="plan was made for a batch of"):
            encoder(torch.randn(2, 6, D), plan=plan)
        with pytest.raises(ValueError, match="either a plan or"):
            encoder(x, mask, plan=plan)


def test_plan_is_frozen():
    plan = Encoder(small_config()).plan_for(lengths_mask(LENGTHS))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.kernel = None


def stack_plan(mask, *, backend: str, causal: bool = False):
    """A one-layer stack's plan for ``mask``: its layer's plan is what a block runs."""
    encoder = Encoder(small_config(n_layers=1, causal=causal)).eval()
    rows = Rows(*mask.shape, mask.device, torch.float32)
    return plan_stack(encoder, rows, mask, Ask(backend=backend))


def test_causal_plans_agree_across_layouts_and_kernels():
    """The causal flag rides on the plan: packed rows, padded math and padded sdpa agree."""
    block = EncoderBlock(D, H, 64).eval()
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), 6, D)
    outs = {}
    with torch.no_grad():
        for backend in ("math", "sdpa", "varlen"):
            plan = stack_plan(mask, backend=backend, causal=True).layer(0)
            rows = x.reshape(-1, D)[plan.packing.indices] if plan.packed else x
            out = block.run(rows, plan).hidden
            if plan.packed:
                out = repad(out, plan.packing)
            outs[backend] = torch.where(mask[..., None], out, 0.0)
    torch.testing.assert_close(outs["sdpa"], outs["math"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["varlen"], outs["math"], atol=1e-5, rtol=1e-5)
    # and causal really masks: a sequence's first token ignores every later one
    later = x.clone()
    later[:, 1:] += 1.0
    causal = stack_plan(mask, backend="math", causal=True).layer(0)
    full = stack_plan(mask, backend="math").layer(0)
    with torch.no_grad():
        moved = block.run(later, causal).hidden[:, 0]
        plain = block.run(later, full).hidden[:, 0]
    real = mask[:, 0]  # sequences with a first token
    torch.testing.assert_close(moved[real], outs["math"][real, 0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(plain[0], outs["math"][0, 0], atol=1e-3)


def test_packed_rows_through_a_lone_attention_module():
    attn = MultiHeadAttention(D, D, D, D, H).eval()
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), 6, D)
    rows, layout = unpad(x, mask)
    with torch.no_grad():
        want, _ = attn(x, mask=mask, backend="math")
        got, _ = attn(rows, layout=layout)
        ref, _ = attn(rows, layout=layout, backend="math")  # reference formula per sequence
    torch.testing.assert_close(got, want[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref, want[mask], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="need_weights=True on packed rows"):
        attn(rows, layout=layout, need_weights=True)


def test_cross_attention_stores_its_projections_by_role():
    cross = MultiHeadAttention(D, D, D, D, H, cross=True).eval()
    assert cross.in_proj is None and cross.q_proj is not None and cross.kv_proj is not None
    queries, memory = torch.randn(2, 3, D), torch.randn(2, 7, D)
    (wq, bq), (wk, bk), (wv, bv) = cross.projection_weights()
    with torch.no_grad():
        out, w = cross(queries, memory, memory, need_weights=True)
        q = torch.nn.functional.linear(queries, wq, bq).view(2, 3, H, -1).transpose(1, 2)
        k = torch.nn.functional.linear(memory, wk, bk).view(2, 7, H, -1).transpose(1, 2)
        v = torch.nn.functional.linear(memory, wv, bv).view(2, 7, H, -1).transpose(1, 2)
        ref = torch.softmax(q @ k.transpose(-1, -2) / (D // H) ** 0.5, dim=-1)
        want = cross.out_proj((ref @ v).transpose(1, 2).reshape(2, 3, D))
    torch.testing.assert_close(w, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


class _ListRecorder:
    def __init__(self) -> None:
        self.steps: list[tuple[str, torch.Tensor]] = []

        self.files: set[str] = set()

    def on_step(self, name, value, meta, file, line) -> None:
        self.steps.append((name, value.detach().clone()))
        self.files.add(file)


def test_record_points_live_in_the_reference_only():
    """The reference encoder is what ``explain`` records: the math run passes every record
    point of every layer, from clearformer/reference.py; the other kernels record no attention
    step."""
    from clearformer.tracing import recording

    encoder = Encoder(small_config(n_layers=2)).eval()
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), 6, D)
    runs = {}
    for backend in ("math", "sdpa", "varlen"):
        recorder = _ListRecorder()
        with torch.no_grad(), recording(recorder):
            encoder(x, mask, backend=backend)
        runs[backend] = recorder
    for backend in ("sdpa", "varlen"):
        # Their kernels hold no scores to show; their feed-forward network is the reference's.
        assert not any(n.startswith("attn.") for n, _ in runs[backend].steps), backend
        assert {Path(f).name for f in runs[backend].files} <= {"reference.py"}
    names = [n for n, _ in runs["math"].steps]
    assert sum(n == "attn.q_proj" for n in names) == 2  # every layer
    assert {"attn.scores", "attn.masked_scores", "attn.weights", "encoder.output"} <= set(names)
    assert {Path(f).name for f in runs["math"].files} == {"reference.py"}


def test_an_explicit_plan_is_checked_against_what_it_is_given():
    attn = MultiHeadAttention(D, D, D, D, H).eval()
    block = EncoderBlock(D, H, 64).eval()
    encoder = Encoder(small_config(n_layers=1)).eval()
    x = torch.randn(2, 5, D)
    mask = lengths_mask([5, 2])
    plan = attn.plan_for(x, mask=mask)
    with pytest.raises(ValueError, match="is_causal/need_weights, not both"):
        attn(x, plan=plan, is_causal=True)
    with pytest.raises(ValueError, match="is_causal/need_weights, not both"):
        attn(x, plan=plan, need_weights=True)
    with pytest.raises(ValueError, match=r"plan was made for \(B, T\) = \(2, 5\)"):
        attn(torch.randn(1, 5, D), plan=plan)
    with pytest.raises(ValueError, match=r"plan was made for \(B, T\) = \(2, 5\)"):
        block(torch.randn(3, 5, D), plan=block.plan_for(x, mask))
    with pytest.raises(ValueError, match="must be a stack's plan"):
        encoder(x, plan=block.plan_for(x, mask))  # it would not zero the padded rows
    with pytest.raises(ValueError, match="on meta, got x of shape .* on cpu"):
        encoder(x, plan=dataclasses.replace(encoder.plan_for(mask), device=torch.device("meta")))


def test_packed_rows_refuse_a_padded_kernel():
    attn = MultiHeadAttention(D, D, D, D, H)
    rows, layout = unpad(torch.randn(2, 5, D), lengths_mask([5, 2]))
    with pytest.raises(ValueError, match="backend='sdpa' runs on the padded layout"):
        attn(rows, layout=layout, backend="sdpa")


def test_the_printed_plan_is_the_plan_that_runs_for_half_precision(monkeypatch):
    """plan_for without an input takes the dtype and head width from the model itself."""
    from clearformer import attention_routes
    from clearformer.options import Decision

    asked = []
    monkeypatch.setattr(
        attention_routes,  # where varlen_method asks it
        "flash_serves",
        lambda call: asked.append((call.dtype, call.head_dim)) or Decision("declines", "spy"),
    )
    encoder = Encoder(small_config(n_layers=1)).to(torch.bfloat16).eval()
    mask = lengths_mask(LENGTHS)
    encoder.plan_for(mask)
    with torch.no_grad():
        encoder(torch.randn(len(LENGTHS), 6, D, dtype=torch.bfloat16), mask)
    attn = MultiHeadAttention(D, D, D, D, H).to(torch.float16)
    rows, layout = unpad(torch.randn(4, 6, D, dtype=torch.float16), mask)
    attn.plan_for(rows, layout=layout)
    assert asked == [(torch.bfloat16, D // H)] * 2 + [(torch.float16, D // H)]


def test_varlen_under_compile_is_refused_with_a_reason(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(ValueError, match="torch.compile"):
        stack_plan(lengths_mask(LENGTHS), backend="varlen")


def test_two_explains_of_one_training_model_keep_dropout_off():
    import threading

    from clearformer import explain

    encoder = Encoder(small_config(n_layers=2, dropout=0.5)).train()
    x = torch.randn(2, 6, D)
    want = explain(encoder, x).output
    outputs, errors = [], []

    def run():
        try:
            for _ in range(5):
                outputs.append(explain(encoder, x).output)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(outputs) == 10
    for out in outputs:  # dropout 0.5 on would change every output
        torch.testing.assert_close(out, want)
    assert all(m.training for m in encoder.modules())


@pytest.mark.parametrize("kernels", ["on", "off"])
def test_a_plan_reused_in_another_mode_is_made_again(monkeypatch, kernels):
    """A plan made for inference (no gradients, eval mode) reused in a training call: the
    call gets its own routes, dropout and gradients included, whatever the inference plan
    chose (clearformer's inference kernels where built); a hook keeps the linear layers eager,
    so the linear route alone would not tell."""
    monkeypatch.setenv("CLEARFORMER_AVX512", kernels)
    torch.manual_seed(0)
    config = EncoderConfig(d_model=64, n_heads=2, n_layers=1, dim_mlp=64, attn_dropout=0.5)
    model = Encoder(config).eval()
    model.layers[0].mlp.register_forward_hook(lambda module, args, out: None)
    x = torch.randn(2, 8, 64)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 4:] = False
    with torch.no_grad():
        plan = model.plan_for(mask)
        same = model(x, plan=plan)
        assert torch.equal(same, model(x, plan=plan))  # inference: the plan as it is
        model.train()
        first, second = model(x, plan=plan), model(x, plan=plan)
    assert not torch.equal(first, second)  # attention dropout drew its masks
    out = model(x, plan=plan)  # gradients: trained through, not refused by an inference kernel
    out[mask].sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
