"""Every token's last hidden state (:func:`clearformer.text.token_states.token_states`): the
route for rows whose appended tokens nobody attends to (ColBERT query expansion with
``attend=False``) agrees with the packed route on the rows' own tokens."""

from __future__ import annotations

import pytest
import torch

from clearformer.interop.hf import load_model
from clearformer.text.token_states import TokenRow, pad_rows, token_states

from .xlmr_helpers import make_xlmr

pytest.importorskip("transformers")

MASK_ID, PAD_ID = 5, 1  # an ordinary token as the expansion id; XLM-R's <pad>


@pytest.mark.parametrize("literal_pad", [False, True])
def test_unattended_expansion_leaves_a_rows_own_tokens_as_they_are_alone(tmp_path, literal_pad):
    # Tokens nobody attends to change nothing for the others: a row's own tokens must come out
    # as the row alone gives them on the packed route. RoBERTa's positions skip a pad id
    # inside a text (a literal "<pad>"), on both routes.
    make_xlmr(tmp_path)
    model = load_model(tmp_path).model.eval()
    middle = PAD_ID if literal_pad else 9
    texts = [[0, 7, middle, 8, 11, 2], [0, 12, 2]]
    expanded = [TokenRow(ids, [0] * len(ids), extra=4, extra_attended=False) for ids in texts]
    alone = [TokenRow(ids, [0] * len(ids)) for ids in texts]
    with torch.inference_mode():
        got = token_states(model, pad_rows(expanded, PAD_ID, MASK_ID))  # (B, T, D)
        want = token_states(model, pad_rows(alone, PAD_ID, MASK_ID))  # (B, T', D)
    for b, ids in enumerate(texts):
        n = len(ids)
        torch.testing.assert_close(got[b, :n], want[b, :n], rtol=1e-5, atol=1e-5)
