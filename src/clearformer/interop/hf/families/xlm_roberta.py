"""XLM-RoBERTa (Conneau et al., 2020): RoBERTa's layout with a SentencePiece vocabulary.

The weights, names and numerics are RoBERTa's (see :mod:`.bert`): pad token 1, positions
numbered from ``pad_token_id + 1``, post-norm blocks, the encoder under ``roberta.`` inside
task models (transformers' ``XLMRobertaFor*`` classes keep RoBERTa's attribute name). Only
the vocabulary differs: a SentencePiece Unigram model, which checkpoints ship as
``tokenizer.json`` and which the ``tokenizers`` library reads as it is
(:mod:`..tokenizer`), so this family needs nothing of its own beyond its names.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from .bert import ROBERTA, write_config

XLM_ROBERTA = replace(
    ROBERTA,
    model_type="xlm-roberta",
    hf_class="XLMRobertaModel",
    write_config=partial(write_config, family="xlm-roberta"),
)
FAMILIES = (XLM_ROBERTA,)
