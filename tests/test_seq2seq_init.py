"""A seed fixes a sequence-to-sequence model's weights, whatever the memory layout."""

from __future__ import annotations

import torch

from clearformer import Seq2SeqConfig, Seq2SeqTransformer


def test_a_seed_gives_the_same_weights_with_separate_source_and_target_tables():
    config = Seq2SeqConfig(
        src_vocab_size=50, tgt_vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1
    )
    weights = []
    keep = []  # live allocations between the builds move the tables to other addresses
    for i in range(12):
        keep.append([torch.empty(13 * i + 1) for _ in range(i)])
        torch.manual_seed(0)
        model = Seq2SeqTransformer(config)
        weights.append(
            (model.encoder.embeddings.word.weight.detach(), model.target_embeddings.word.weight)
        )
    source, target = weights[0]
    assert source.shape[0] == 50 and target.shape[0] == 40  # two tables, not one shared
    for other_source, other_target in weights[1:]:
        torch.testing.assert_close(other_source, source, rtol=0, atol=0)
        torch.testing.assert_close(other_target.detach(), target.detach(), rtol=0, atol=0)
