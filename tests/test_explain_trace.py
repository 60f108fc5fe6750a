"""explain records the real forward pass: same output as production, no state left behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from clearformer import Encoder, EncoderBlock, EncoderConfig, EncoderModel, explain, tracing
from clearformer.attention import MultiHeadAttention
from clearformer.explainer.recorder import TraceRecorder
from clearformer.explainer.steps import BLOCK_STEPS

from .helpers import lengths_mask, needs_avx512_library

SRC = Path(__file__).resolve().parents[1] / "src"


def raises(exc, *fragments):
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=re.compile(pattern, re.S))


def small_config(**kw) -> EncoderConfig:
    base = dict(d_model=32, n_heads=4, n_layers=2, dim_mlp=64, activation="gelu")
    base.update(kw)
    return EncoderConfig(**base)


def production(model, *args):
    with torch.no_grad():
        return model.eval()(*args)


# -- fidelity ----------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "varlen"])
@pytest.mark.parametrize("lengths", [None, [6, 3, 1], [4, 0, 6]])
def test_trace_output_equals_production_encoder(norm, backend, lengths):
    encoder = Encoder(small_config(norm=norm, backend=backend)).eval()
    x = torch.randn(3, 6, 32)
    mask = None if lengths is None else lengths_mask(lengths, 6)
    want = production(encoder, x, mask)
    trace = explain(encoder, x, mask)
    torch.testing.assert_close(trace.output, want, atol=1e-5, rtol=0)
    assert trace.fidelity.max_abs_diff <= 1e-5 and trace.fidelity.ok
    if mask is not None:
        assert bool((trace.output[~mask] == 0).all())


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_trace_output_equals_production_model_with_ids(norm, activation):
    model = EncoderModel(small_config(norm=norm, activation=activation, vocab_size=100)).eval()
    ids = torch.randint(1, 100, (2, 7))
    mask = lengths_mask([7, 4], 7)
    want = production(model, ids, mask)
    trace = explain(model, ids, mask)
    torch.testing.assert_close(trace.output, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_trace_output_equals_production_block(norm):
    block = EncoderBlock(32, 4, 64, norm=norm).eval()
    x = torch.randn(2, 5, 32)
    mask = lengths_mask([5, 2], 5)
    want = production(block, x, mask)
    trace = explain(block, x, mask)
    torch.testing.assert_close(trace.output, want, atol=1e-5, rtol=0)
    assert [s.layer for s in trace.steps] == [0] * len(trace.steps)


@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    norm=st.sampled_from(["pre", "post"]),
    backend=st.sampled_from(["auto", "math", "sdpa", "varlen"]),
    seed=st.integers(0, 2**16),
)
def test_fidelity_and_lost_keys_on_random_ragged_batches(lengths, norm, backend, seed):
    torch.manual_seed(seed)
    T = max(max(lengths), 1)
    encoder = Encoder(small_config(d_model=16, n_heads=2, norm=norm, backend=backend)).eval()
    x, mask = torch.randn(len(lengths), T, 16), lengths_mask(lengths, T)
    trace = explain(encoder, x, mask)
    torch.testing.assert_close(trace.output, production(encoder, x, mask), atol=1e-5, rtol=0)
    for attention in trace.attention:
        for b, n in enumerate(lengths):
            lost = attention.lost_keys[b, :, :n]  # (H, real queries)
            assert bool((lost == T - n).all())


# -- the steps ---------------------------------------------------------------------------------
def test_every_block_records_every_step_in_order():
    model = EncoderModel(small_config(vocab_size=50)).eval()
    trace = explain(model, torch.randint(1, 50, (2, 5)), lengths_mask([5, 3], 5))
    for layer in range(2):  # a model without a relative position bias has no bias step
        want = [name for name in BLOCK_STEPS if name != "attn.biased_scores"]
        assert [s.name for s in trace.steps_for(layer)] == want
    assert [s.name for s in trace.steps_for(None)] == [
        "embeddings.sum",
        "embeddings.output",
        "encoder.output",
    ]
    # Without padding there is no masking step.
    trace = explain(model, torch.randint(1, 50, (2, 5)))
    names = [s.name for s in trace.steps_for(0)]
    assert "attn.masked_scores" not in names and "attn.weights" in names


def test_a_relative_position_bias_is_its_own_step_between_scores_and_mask():
    config = small_config(vocab_size=50, norm="post", relative_attention_buckets=8)
    model = EncoderModel(config).eval()
    trace = explain(model, torch.randint(1, 50, (2, 5)), lengths_mask([5, 3], 5))
    names = [s.name for s in trace.steps_for(0)]
    at = names.index("attn.biased_scores")
    assert names[at - 1 : at + 2] == ["attn.scores", "attn.biased_scores", "attn.masked_scores"]


def test_shapes_carry_named_dims():
    model = EncoderModel(small_config(vocab_size=50, dim_mlp=48)).eval()
    trace = explain(model, torch.randint(1, 50, (2, 5)))
    sizes = {"B": 2, "T": 5, "Tq": 5, "Tk": 5, "H": 4, "Dh": 8, "D": 32, "Dff": 48}
    for step in trace.steps:
        assert len(step.dims) == len(step.shape), step.name
        assert [sizes[d] for d in step.dims] == list(step.shape), step.name


def test_weights_are_the_math_backends_and_masked_keys_get_zero():
    encoder = Encoder(small_config(backend="sdpa")).eval()
    x, mask = torch.randn(2, 6, 32), lengths_mask([6, 2], 6)
    trace = explain(encoder, x, mask)
    block = encoder.layers[0]
    with torch.no_grad():
        ref = MultiHeadAttention(32, 32, 32, 32, 4, backend="math").eval()
        ref.load_state_dict(block.attn.state_dict())
        # The stack zeroes its padded input rows once at entry (so that nothing they hold can
        # reach a real token); padded queries' weights are computed from those zeros.
        entered = torch.where(mask[..., None], x, 0.0)
        _, want = ref(block.attn_norm(entered), mask=mask, need_weights=True)
    weights = trace.attention[0].weights
    torch.testing.assert_close(weights, want, atol=1e-6, rtol=0)
    assert bool((weights[1, :, :, 2:] == 0).all())
    sums = weights[1, :, :2].sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums))
    lost = trace.attention[1].lost_keys  # (B, H, Tq)
    assert bool((lost[0] == 0).all()) and bool((lost[1] == 4).all())


def test_stats_cover_real_tokens_only():
    encoder = Encoder(small_config()).eval()
    x, mask = torch.randn(2, 6, 32), lengths_mask([6, 2], 6)
    x[1, 2:] = 1e3  # padding that would dominate the statistics if counted
    trace = explain(encoder, x, mask)
    out = next(s for s in trace.steps if s.name == "encoder.output")
    real = trace.output[mask]
    assert out.stats.count == real.numel()
    assert out.stats.mean == pytest.approx(float(real.mean()), abs=1e-5)
    assert out.stats.max == pytest.approx(float(real.max()), abs=1e-5)
    assert out.stats.norm == pytest.approx(float(real.norm()), rel=1e-5)
    first = trace.steps_for(0)[0]
    assert first.name == "block.input" and first.stats.max < 100


@pytest.mark.parametrize(
    "name,snippet",
    [
        ("attn.scores", "torch.matmul(q * scale, k.transpose(-2, -1))"),
        ("attn.masked_scores", "masked_fill(~mask"),
        ("attn.weights", "F.softmax(scores"),
        ("attn.context", "torch.matmul(probs, v)"),
        ("attn.out_proj", "attn.out_proj(out)"),
        ("attn.q_proj", "attn.in_proj(x)"),
        ("ffn.hidden", "mlp.fc_in(x)"),
        ("ffn.output", "mlp.fc_out(h)"),
        ("encoder.output", "stack.final_norm(x)"),
        ("block.attn_input", "block.attn_norm(x)"),
        ("block.mlp_input", "block.mlp_norm(x)"),
        ("ffn.activation", "mlp.act("),
    ],
)
def test_source_lines_point_at_the_code_that_ran(name, snippet):
    model = Encoder(small_config()).eval()
    trace = explain(model, torch.randn(2, 4, 32), lengths_mask([4, 2], 4))
    step = next(s for s in trace.steps if s.name == name)
    assert snippet in step.source.code
    lines = (SRC / step.source.file).read_text().splitlines()
    assert lines[step.source.line - 1].strip() == step.source.code.splitlines()[0].strip()


# -- no state, no cost -------------------------------------------------------------------------
def _state(model: torch.nn.Module) -> list:
    return [
        (
            name,
            sorted(vars(m)),
            m.training,
            getattr(m, "backend", None),
            getattr(m, "config", None),
            len(m._forward_hooks) + len(m._forward_pre_hooks),
        )
        for name, m in model.named_modules()
    ]


@pytest.mark.parametrize("backend", ["auto", "varlen"])
def test_explain_leaves_no_state_on_the_model(backend):
    model = EncoderModel(small_config(vocab_size=50, backend=backend)).train()
    before = _state(model)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = torch.randint(1, 50, (2, 5)), lengths_mask([5, 2], 5)
    trace = explain(model, ids, mask)
    assert _state(model) == before
    for key, value in model.state_dict().items():
        assert torch.equal(value, params[key])
    assert not tracing.is_recording()
    assert any("training mode" in n for n in trace.notes)
    torch.testing.assert_close(trace.output, production(model, ids, mask), atol=1e-5, rtol=0)


def test_state_is_restored_when_the_recording_fails(monkeypatch):
    model = EncoderModel(small_config(vocab_size=50, backend="sdpa"))
    before = _state(model)

    def broken(self, name, value, meta, file, line):
        if name == "attn.scores":
            raise RuntimeError("recorder failed")

    monkeypatch.setattr(TraceRecorder, "on_step", broken)
    with pytest.raises(RuntimeError, match="recorder failed"):
        explain(model, torch.randint(1, 50, (1, 4)))
    assert _state(model) == before
    assert not tracing.is_recording()


def test_recording_off_calls_no_recorder(monkeypatch):
    calls = []

    class Counter:
        def on_step(self, name, value, meta, file, line):
            calls.append(name)

    class NoFrames:
        """``record`` with no recorder must return before looking up its caller."""

        def _getframe(self, depth=0):
            raise AssertionError("record() did work while no recorder was active")

    model = Encoder(small_config()).eval()
    x = torch.randn(1, 4, 32)
    with torch.no_grad():
        monkeypatch.setattr(tracing, "sys", NoFrames())
        model(x)
        monkeypatch.undo()
        with tracing.recording(Counter()):
            model(x)
    # Production (sdpa) has no explicit scores to show; its feed-forward network is the
    # reference's (FeedForward.forward is clearformer.reference.feed_forward).
    assert not any(name.startswith("attn.") for name in calls)
    assert "ffn.activation" in calls


def test_notes_say_when_the_reference_path_replaced_production():
    model = Encoder(small_config(backend="varlen")).eval()
    trace = explain(model, torch.randn(2, 4, 32), lengths_mask([4, 1], 4))
    assert trace.fidelity.switched
    assert any("cannot return attention weights" in n and "reference" in n for n in trace.notes)
    math_model = Encoder(small_config(backend="math")).eval()
    trace = explain(math_model, torch.randn(2, 4, 32), lengths_mask([4, 1], 4))
    assert not trace.fidelity.switched
    assert any("production path" in n for n in trace.notes)


def _paren_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        deepest = max(deepest, depth)
    return deepest


class TestNotesOfAMeasuredMachine:
    # The kernels' verdicts (or their absence) are what the plan's reasons name.
    pytestmark = needs_avx512_library

    @pytest.mark.parametrize("speed", [None, 0.5, 2.0], ids=["unmeasured", "slower", "faster"])
    @pytest.mark.parametrize("lengths", [[4, 4], [4, 1]], ids=["padded", "packed"])
    def test_notes_read_plainly_and_name_no_folder_of_this_machine(
        self, measured, tmp_path, speed, lengths
    ):
        # A report is mailed around: its notes say why production took its path without
        # parentheses three deep, and name the verdicts' file without this machine's folders.
        from clearformer.explainer import render_html

        if speed is not None:
            measured(avx512_attention=speed, avx512_linear=speed, avx512_attention_bf16=speed)
        model = Encoder(small_config(n_heads=2)).eval()  # Dh 16: the AVX-512 kernel's width
        trace = explain(model, torch.randn(2, 4, 32), lengths_mask(lengths, 4))
        assert any(n.startswith("why production takes that path: ") for n in trace.notes)
        for note in trace.notes:
            assert _paren_depth(note) <= 2, note
            assert str(tmp_path) not in note, note
        assert str(tmp_path) not in render_html(trace) and str(tmp_path) not in trace.to_json()
        if speed is not None:
            assert any("cached $CLEARFORMER_CACHE/calibration/verdicts-" in n for n in trace.notes)


# -- bad input ---------------------------------------------------------------------------------
def test_bad_inputs_fail_before_any_work():
    model = EncoderModel(small_config(vocab_size=50, max_positions=8)).eval()
    encoder = Encoder(small_config()).eval()
    with raises(TypeError, "model", "EncoderModel", "Linear"):
        explain(torch.nn.Linear(2, 2), torch.randn(1, 2))
    with raises(TypeError, "integer token ids", "float32"):
        explain(model, torch.randn(1, 4))
    with raises(ValueError, "T=9", "max_length=8"):
        explain(model, torch.ones(1, 9, dtype=torch.long))
    with raises(ValueError, "vocab_size=50", "77"):
        explain(model, torch.tensor([[1, 77]]))
    with raises(ValueError, "mask", "(1, 3)", "(1, 4)"):
        explain(model, torch.ones(1, 3, dtype=torch.long), torch.ones(1, 4, dtype=torch.bool))
    with raises(ValueError, "inputs", "D=32", "(1, 4, 16)"):
        explain(encoder, torch.randn(1, 4, 16))
    with raises(TypeError, "inputs", "float tensor"):
        explain(encoder, [[1.0]])
    with raises(ValueError, "at least one token", "T=0"):
        explain(encoder, torch.randn(1, 0, 32))
    with raises(ValueError, "tokens", "1 list(s) of 3 labels", "[2]"):
        explain(encoder, torch.randn(1, 3, 32), tokens=["a", "b"])
    assert not tracing.is_recording()
