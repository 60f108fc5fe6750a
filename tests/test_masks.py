"""Mask conversions at the edges, and the normalisation helper."""

from __future__ import annotations

import pytest
import torch

from clearformer.masks import (
    from_attention_mask,
    from_key_padding_mask,
    prepare_attention_mask,
)


def test_torch_key_padding_mask_is_inverted():
    ignore = torch.tensor([[False, False, True]])
    assert from_key_padding_mask(ignore).tolist() == [[True, True, False]]
    additive = torch.tensor([[0.0, float("-inf"), 0.0]])
    assert from_key_padding_mask(additive).tolist() == [[True, False, True]]


def test_hugging_face_mask_is_converted_and_checked():
    assert from_attention_mask(torch.tensor([[1, 1, 0]])).tolist() == [[True, True, False]]
    with pytest.raises(ValueError, match="only 0 and 1.*2"):
        from_attention_mask(torch.tensor([[1, 2, 0]]))
    with pytest.raises(TypeError, match="float"):
        from_attention_mask(torch.tensor([[1.0, 0.0]]))


@pytest.mark.parametrize(
    "shape,expected",
    [((2, 5), (2, 1, 1, 5)), ((2, 3, 5), (2, 1, 3, 5)), ((2, 4, 3, 5), (2, 4, 3, 5))],
)
def test_prepare_normalises_to_4d(shape, expected):
    mask = torch.rand(shape) > 0.5
    out = prepare_attention_mask(mask, batch=2, heads=4, tq=3, tk=5, device=mask.device)
    assert tuple(out.shape) == expected


def test_prepare_folds_causal_into_key_padding():
    keys = torch.tensor([[True, True, False]])
    out = prepare_attention_mask(
        keys, batch=1, heads=1, tq=3, tk=3, device=keys.device, is_causal=True
    )
    assert out[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert prepare_attention_mask(None, batch=1, heads=1, tq=3, tk=3, device=keys.device) is None
