"""A tokenizer built from vocabulary files, for checkpoints without ``tokenizer.json``: BERT's
WordPiece pipeline from ``vocab.txt``, RoBERTa's byte-level BPE from ``vocab.json`` and
``merges.txt``, each as transformers builds it (its special tokens, their strip flags and ids).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .files import CheckpointError

log = logging.getLogger(__name__)


def wordpiece_from_vocab(vocab: Path, config: dict[str, Any]):
    """BERT's tokenizer pipeline built from a ``vocab.txt`` (as transformers' BertTokenizer)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    unk = token_text(config.get("unk_token"), "[UNK]")
    cls_token = token_text(config.get("cls_token"), "[CLS]")
    sep = token_text(config.get("sep_token"), "[SEP]")
    tokenizer = Tokenizer(models.WordPiece.from_file(str(vocab), unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
        strip_accents=config.get("strip_accents"),
        lowercase=bool(config.get("do_lower_case", True)),
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    ids = {t: tokenizer.token_to_id(t) for t in (cls_token, sep)}
    if None in ids.values():
        raise CheckpointError(f"{vocab} lacks the special tokens {cls_token} and {sep}")
    specials = [
        token_text(config.get(k), d) for k, d in (("pad_token", "[PAD]"), ("mask_token", "[MASK]"))
    ]
    tokenizer.add_special_tokens([unk, cls_token, sep, *specials])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls_token} $A {sep}",
        pair=f"{cls_token} $A {sep} $B:1 {sep}:1",
        special_tokens=list(ids.items()),
    )
    return tokenizer


# RoBERTa's special tokens: tokenizer_config.json key -> default text, in the order
# transformers adds them (which decides the ids of any missing from vocab.json).
ROBERTA_SPECIALS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "sep_token": "</s>",
    "pad_token": "<pad>",
    "cls_token": "<s>",
    "mask_token": "<mask>",
}


def bpe_from_vocab(vocab: Path, merges: Path, config: dict[str, Any]):
    """RoBERTa's byte-level BPE pipeline built from ``vocab.json`` + ``merges.txt``, as
    transformers' ``RobertaTokenizer`` builds it, for checkpoints without ``tokenizer.json``.

    ``<s> A </s>`` for one text, ``<s> A </s></s> B </s>`` for a pair; the special tokens are
    registered as such, so text that spells them is never split into byte pieces.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    names = {key: token_text(config.get(key), text) for key, text in ROBERTA_SPECIALS.items()}
    add_prefix_space = bool(config.get("add_prefix_space", False))
    log.debug("no tokenizer.json: building byte-level BPE from %s and %s", vocab, merges)
    try:
        pieces, pairs = models.BPE.read_file(str(vocab), str(merges))
        # Text the vocabulary cannot spell becomes <unk>, as in RobertaTokenizer, not nothing.
        unk = names["unk_token"] if names["unk_token"] in pieces else None
        tokenizer = Tokenizer(models.BPE(pieces, pairs, unk_token=unk))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise CheckpointError(f"cannot read BPE tokenizer {vocab} with {merges}: {exc}") from None
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    ends = {key: tokenizer.token_to_id(names[key]) for key in ("cls_token", "sep_token")}
    if None in ends.values():
        raise CheckpointError(
            f"{vocab} lacks the special tokens cls_token={names['cls_token']!r} and "
            f"sep_token={names['sep_token']!r} that every sequence starts and ends with"
        )
    _add_special_tokens(tokenizer, names, config, vocab)
    tokenizer.post_processor = processors.RobertaProcessing(  # positional: (sep, cls, ...)
        (names["sep_token"], ends["sep_token"]),
        (names["cls_token"], ends["cls_token"]),
        trim_offsets=bool(config.get("trim_offsets", True)),
        add_prefix_space=add_prefix_space,
    )
    return tokenizer


def token_text(value: Any, default: str) -> str:
    """A special token's text from tokenizer_config.json, where transformers writes either the
    text or a serialized ``AddedToken`` (``{"content": ..., "lstrip": ...}``)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else default


def _add_special_tokens(tokenizer, names: dict[str, str], config: dict[str, Any], vocab: Path):
    """Register the special tokens with their strip flags, so the ids match transformers'.

    The flags come from tokenizer_config.json (``added_tokens_decoder``, or a serialized
    ``AddedToken`` under the token's key); otherwise RobertaTokenizer's defaults, where
    ``<mask>`` swallows the space before it (``lstrip``) as RoBERTa was trained.
    """
    from tokenizers import AddedToken

    declared = config.get("added_tokens_decoder")
    declared = declared if isinstance(declared, dict) else {}
    flags = {
        str(entry["content"]): (key, entry)
        for key, entry in declared.items()
        if isinstance(entry, dict) and isinstance(entry.get("content"), str)
    }
    for key in ROBERTA_SPECIALS:
        if names[key] not in flags and isinstance(config.get(key), dict):
            flags[names[key]] = (None, config[key])
    specials, others = [], []
    for text in dict.fromkeys([*names.values(), *flags]):
        entry = flags[text][1] if text in flags else {"lstrip": text == names["mask_token"]}
        token = AddedToken(
            text,
            single_word=bool(entry.get("single_word", False)),
            lstrip=bool(entry.get("lstrip", False)),
            rstrip=bool(entry.get("rstrip", False)),
            normalized=bool(entry.get("normalized", False)),
            special=bool(entry.get("special", True)),
        )
        (specials if token.special else others).append(token)
    tokenizer.add_special_tokens(specials)
    tokenizer.add_tokens(others)
    _check_declared_ids(tokenizer, flags, vocab)


def _check_declared_ids(tokenizer, flags: dict[str, tuple[Any, dict]], vocab: Path) -> None:
    """Refuse an ``added_tokens_decoder`` whose ids disagree with the vocabulary: the model
    would silently read other embedding rows than the ones the tokens were trained with."""
    for text, (key, _) in flags.items():
        if key is None:
            continue
        actual = tokenizer.token_to_id(text)
        if str(actual) != str(key):
            raise CheckpointError(
                f"tokenizer_config.json added_tokens_decoder gives {text!r} id {key}, but with "
                f"{vocab} it gets id {actual}"
            )
