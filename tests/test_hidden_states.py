"""Every layer on request, as data: hidden states and attention weights of the bundled model
against transformers' ``output_hidden_states=True`` and eager ``output_attentions=True``."""

from __future__ import annotations

import os

import pytest
import torch

from clearformer import EncoderOutput, TextEncoder
from clearformer.pretrained import bundled_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

TEXTS = [
    "A man is eating food.",
    "short",
    "The weather today is sunny with a light breeze from the west, perfect for a walk.",
    "机器学习是人工智能的一个分支。",
]


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder.from_pretrained()


@pytest.fixture(scope="module")
def hf_model():
    model = transformers.AutoModel.from_pretrained(
        str(bundled_model_dir()), attn_implementation="eager"
    )
    return model.eval()


@pytest.fixture(scope="module")
def batch(encoder):
    return encoder.tokenize(TEXTS)


def hf_outputs(hf_model, batch):
    with torch.no_grad():
        return hf_model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask.long(),
            token_type_ids=batch.token_type_ids,
            output_hidden_states=True,
            output_attentions=True,
        )


@pytest.mark.parametrize("backend", [None, "math", "sdpa", "varlen"])
def test_every_hidden_state_equals_transformers(encoder, hf_model, batch, backend):
    mask = batch.attention_mask
    assert not bool(mask.all())  # the batch is ragged: padding is really there
    want = hf_outputs(hf_model, batch).hidden_states
    with torch.no_grad():
        got = encoder.model(
            batch.input_ids,
            mask,
            batch.token_type_ids,
            backend=backend,
            output_hidden_states=True,
        )
    assert isinstance(got, EncoderOutput) and got.attentions is None
    assert len(got.hidden_states) == len(want) == encoder.config.n_layers + 1
    for layer, (ours, theirs) in enumerate(zip(got.hidden_states, want, strict=True)):
        torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-5, rtol=0, msg=f"{layer}")
        assert bool((ours[~mask] == 0).all()), layer
    torch.testing.assert_close(got.last_hidden_state, got.hidden_states[-1])  # post-norm


def test_every_layer_attention_equals_transformers_eager(encoder, hf_model, batch):
    mask = batch.attention_mask
    want = hf_outputs(hf_model, batch).attentions
    with torch.no_grad():
        got = encoder.model(
            batch.input_ids, mask, batch.token_type_ids, output_attentions=True
        ).attentions
    assert len(got) == len(want) == encoder.config.n_layers
    rows = mask[:, None, :, None]  # (B, 1, T, 1): real queries
    for layer, (ours, theirs) in enumerate(zip(got, want, strict=True)):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(
            torch.where(rows, ours, 0.0),
            torch.where(rows, theirs, 0.0),
            atol=1e-5,
            rtol=0,
            msg=f"layer {layer}",
        )
        # padded keys get exactly zero weight (Hugging Face's additive mask gives ~0)
        assert bool((ours.masked_select(~mask[:, None, None, :]) == 0).all())


def test_attentions_need_the_math_kernel(encoder, batch):
    with pytest.raises(ValueError, match="cannot return attention weights"):
        encoder.model(batch.input_ids, batch.attention_mask, output_attentions=True, backend="sdpa")


def test_plain_call_still_returns_a_tensor(encoder, batch):
    with torch.no_grad():
        out = encoder.model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    assert isinstance(out, torch.Tensor) and out.shape[:2] == batch.input_ids.shape
