"""Text -> token ids with the checkpoint's own tokenizer files (the ``tokenizers`` library).

``tokenizer.json`` is used as it is, except for its padding and truncation settings, which
follow the model: truncation at the model's maximum length (all-MiniLM-L6-v2: 256 pieces,
special tokens included) and padding done here, to the longest text of each batch; and, for
BERT, DistilBERT, MPNet, RoBERTa and XLM-RoBERTa tokenizer classes, the casing, accent and
prefix-space fields of ``tokenizer_config.json``, which transformers applies over it.
A checkpoint with only a WordPiece ``vocab.txt`` gets BERT's tokenizer pipeline built from it,
and one with only a byte-level BPE ``vocab.json`` + ``merges.txt`` gets RoBERTa's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...checks import check_choice, check_unicode
from .files import CheckpointError, CheckpointFiles
from .vocab_files import ROBERTA_SPECIALS, bpe_from_vocab, token_text, wordpiece_from_vocab

log = logging.getLogger(__name__)

_UNBOUNDED = 10**6  # transformers writes a huge model_max_length when none is set


@dataclass
class TokenBatch:
    """A padded batch of tokenized texts.

    Attributes:
        input_ids: (B, T) int64, padded with the model's pad id.
        attention_mask: (B, T) bool, True = real token (special tokens included).
        token_type_ids: (B, T) int64.
        tokens: the word pieces of each row's real tokens, ``[CLS]``/``[SEP]`` included, one per
            True position of ``attention_mask``.
        truncated: whether each text lost pieces to the maximum length.
    """

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    tokens: list[list[str]]
    truncated: list[bool]

    @property
    def lengths(self) -> list[int]:
        """Real tokens per row."""
        return self.attention_mask.sum(dim=1).tolist()


def check_texts(texts: Any, name: str = "texts") -> list[str]:
    """``texts`` as a list of str, or a TypeError naming the first bad item (a ValueError for
    a str that is not valid Unicode)."""
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of str, got a single str; wrap it: [{name}]")
    if isinstance(texts, Mapping | set | frozenset):
        # A dict would give its keys, a set an order of its own: neither is a list of texts
        # whose rows line up with the results.
        raise TypeError(f"{name} must be a list of str, got {type(texts).__name__}")
    try:
        items = list(texts)
    except TypeError:
        raise TypeError(f"{name} must be a list of str, got {type(texts).__name__}") from None
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(text).__name__}")
        check_unicode(text, f"{name}[{i}]")
    return items


def check_pairs(pairs: Any, name: str = "pairs") -> list[tuple[str, str]]:
    """``pairs`` as a list of (str, str), or a TypeError naming the first bad item."""
    if (
        isinstance(pairs, tuple | list)
        and len(pairs) == 2
        and all(isinstance(p, str) for p in pairs)
    ):
        raise TypeError(f"{name} must be a list of (text, text) pairs, got a single pair; wrap it")
    if isinstance(pairs, str):
        raise TypeError(f"{name} must be a list of (text, text) pairs, got a str")
    try:
        items = list(pairs)
    except TypeError:
        raise TypeError(
            f"{name} must be a list of (text, text) pairs, got {type(pairs).__name__}"
        ) from None
    out = []
    for i, pair in enumerate(items):
        if isinstance(pair, str) or not isinstance(pair, tuple | list) or len(pair) != 2:
            raise TypeError(f"{name}[{i}] must be a (text, text) pair, got {pair!r:.60}")
        for j, text in enumerate(pair):
            if not isinstance(text, str):
                raise TypeError(f"{name}[{i}][{j}] must be a str, got {type(text).__name__}")
            check_unicode(text, f"{name}[{i}][{j}]")
        out.append((pair[0], pair[1]))
    return out


def max_length_for(files: CheckpointFiles, model_max: int) -> int:
    """The truncation length: sentence-transformers' ``max_seq_length`` if set, else the
    tokenizer's ``model_max_length``, never above what the position table covers."""
    for value in (
        files.sentence_config.get("max_seq_length"),
        files.tokenizer_config.get("model_max_length"),
    ):
        if isinstance(value, int | float) and 0 < value < _UNBOUNDED:
            return min(int(value), model_max)
    return model_max


def check_vocab_size(tokenizer, files: CheckpointFiles, vocab_size: int) -> None:
    """Refuse a tokenizer that can give ids the model has no embedding row for.

    Checked at load time, not left to the model's id check: that one fires only when a text
    happens to contain such a piece, long after the mismatched files were paired. A vocabulary
    smaller than the table is fine (tables are often padded to a multiple of 8 or 64).
    """
    pieces = tokenizer.get_vocab_size(with_added_tokens=True)
    if pieces > vocab_size:
        raise CheckpointError(
            f"tokenizer {files.tokenizer} has {pieces:,} pieces, more than config.json "
            f"'vocab_size'={vocab_size:,} in {files.path}: ids from {vocab_size:,} up would have "
            "no embedding row (the tokenizer and the weights do not belong together)"
        )


def lowercase_first(tokenizer) -> None:
    """Lowercase every text before ``tokenizer`` normalizes it, unless it lowercases already:
    sentence-transformers' ``do_lower_case`` (``sentence_bert_config.json``), which its
    Transformer module applies so, whatever the tokenizer's own casing."""
    from tokenizers import normalizers

    normalizer = tokenizer.normalizer
    steps = list(normalizer) if isinstance(normalizer, normalizers.Sequence) else [normalizer]
    if any(
        isinstance(step, normalizers.Lowercase) or getattr(step, "lowercase", False) is True
        for step in steps
        if step is not None
    ):
        return
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Lowercase(), *(step for step in steps if step is not None)]
    )


PADDING_SIDES = ("right", "left")


class TextTokenizer:
    """The checkpoint's tokenizer with the model's truncation; pads batches itself, on the
    right (real tokens first) or on the left (real tokens last, as decoder-style models are
    run in transformers: the last position is then every row's last real token)."""

    def __init__(self, tokenizer, max_length: int, pad_id: int, padding_side: str = "right"):
        check_choice(padding_side, PADDING_SIDES, "padding_side")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_id = pad_id
        self.padding_side = padding_side
        check_room_for_specials(tokenizer, max_length, pair=False)
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=max_length)

    @classmethod
    def from_files(
        cls,
        files: CheckpointFiles,
        max_length: int,
        pad_id: int,
        *,
        vocab_size: int | None = None,
        padding_side: str | None = None,
    ) -> TextTokenizer:
        """The checkpoint's tokenizer; ``vocab_size`` (the model's embedding rows), when given,
        bounds its vocabulary. ``padding_side`` None = tokenizer_config.json's
        ``padding_side`` (right when it has none).

        Raises:
            CheckpointError: unreadable tokenizer files, a vocabulary with more pieces than the
                model has embedding rows, or left padding without a pad token.
        """
        from tokenizers import Tokenizer

        try:
            if files.tokenizer.name == "tokenizer.json":
                tokenizer = Tokenizer.from_file(str(files.tokenizer))
                follow_tokenizer_class(tokenizer, files.tokenizer_config, files.tokenizer)
            elif files.merges is not None:
                tokenizer = bpe_from_vocab(files.tokenizer, files.merges, files.tokenizer_config)
            else:
                tokenizer = wordpiece_from_vocab(files.tokenizer, files.tokenizer_config)
        except CheckpointError:
            raise
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise CheckpointError(f"cannot read tokenizer {files.tokenizer}: {exc}") from None
        if vocab_size is not None:
            check_vocab_size(tokenizer, files, vocab_size)
        if files.sentence_config.get("do_lower_case") is True:
            lowercase_first(tokenizer)
        side = padding_side_for(files, padding_side)
        if side == "left":
            pad_id = left_pad_id(tokenizer, files)
        return cls(tokenizer, max_length, pad_id, side)

    def encode(self, texts: list[str], *, with_tokens: bool = False) -> list:
        """``tokenizers.Encoding`` per text (special tokens added, truncated, unpadded).
        ``with_tokens=False`` leaves the token strings and character offsets out (the ids,
        types and overflow are the same), which is what the model needs."""
        return self._encode_batch(texts, with_tokens)

    def encode_pairs(
        self, pairs: list[tuple[str, str]], *, with_tokens: bool = False, prompt: str | None = None
    ) -> list:
        """``tokenizers.Encoding`` per (first, second) pair, as the checkpoint's pair template
        joins them (``[CLS] A [SEP] B [SEP]``, second segment token type 1, for BERT); the
        longer side loses pieces first when a pair is too long. A ``prompt`` goes before each
        first text (sentence-transformers' rule for pairs)."""
        check_room_for_specials(self.tokenizer, self.max_length, pair=True)
        if prompt is not None:
            pairs = [(prompt + first, second) for first, second in pairs]
        return self._encode_batch(pairs, with_tokens)

    def _encode_batch(self, items: list, with_tokens: bool) -> list:
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets and leaves the
        # token strings empty: the same ids, types and overflow in about 80 % of the time.
        fast = None if with_tokens else getattr(self.tokenizer, "encode_batch_fast", None)
        if fast is not None:
            return fast(items, add_special_tokens=True)
        return self.tokenizer.encode_batch(items, add_special_tokens=True)

    def pad(self, encodings: list, *, with_tokens: bool = True) -> TokenBatch:
        """Pad encodings to the longest of them (``with_tokens=False``: leave ``tokens`` empty,
        which spares building strings when only the ids are needed; ``with_tokens=True`` needs
        encodings made with ``encode(..., with_tokens=True)``)."""
        B = len(encodings)
        T = max((len(e.ids) for e in encodings), default=0)
        ids = np.full((B, T), self.pad_id, dtype=np.int64)
        types = np.zeros((B, T), dtype=np.int64)
        mask = np.zeros((B, T), dtype=bool)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            # Real tokens first (right padding) or last (left padding); T - n pads either way.
            at = slice(T - n, T) if self.padding_side == "left" else slice(0, n)
            ids[row, at] = enc.ids
            types[row, at] = enc.type_ids
            mask[row, at] = True
        return TokenBatch(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            token_type_ids=torch.from_numpy(types),
            tokens=[list(e.tokens) for e in encodings] if with_tokens else [],
            truncated=[bool(e.overflowing) for e in encodings],
        )

    def __call__(self, texts: list[str]) -> TokenBatch:
        return self.pad(self.encode(check_texts(texts), with_tokens=True))


def padding_side_for(files: CheckpointFiles, padding_side: str | None) -> str:
    """``padding_side`` if given, else tokenizer_config.json's (right when absent)."""
    if padding_side is not None:
        return check_choice(padding_side, PADDING_SIDES, "padding_side")
    side = files.tokenizer_config.get("padding_side", "right")
    if side not in PADDING_SIDES:
        raise CheckpointError(
            f"{files.path / 'tokenizer_config.json'} 'padding_side' must be 'right' or 'left', "
            f"got {side!r}"
        )
    return side


def left_pad_id(tokenizer, files: CheckpointFiles) -> int:
    """The pad token's id for left padding: tokenizer_config.json's ``pad_token``, else
    config.json's ``pad_token_id``. transformers refuses to pad without one, and so does this:
    a left-padded row's first positions must hold a token the model knows as padding."""
    name = token_text(files.tokenizer_config.get("pad_token"), "")
    if name:
        found = tokenizer.token_to_id(name)
        if found is None:
            raise CheckpointError(
                f"{files.path / 'tokenizer_config.json'} 'pad_token'={name!r} is not in the "
                f"vocabulary of {files.tokenizer}"
            )
        return found
    pad_id = files.config.get("pad_token_id")
    if isinstance(pad_id, int) and not isinstance(pad_id, bool) and pad_id >= 0:
        return pad_id
    raise CheckpointError(
        f"left padding needs a pad token, but {files.path / 'tokenizer_config.json'} has no "
        f"'pad_token' and {files.path / 'config.json'} 'pad_token_id' is {pad_id!r}; name one "
        "there, or pad on the right (padding_side='right')"
    )


# tokenizer_config.json 'tokenizer_class' values (without "Fast") whose transformers class builds
# a BertNormalizer from the config's fields, whatever normalizer tokenizer.json holds.
_BERT_CLASSES = ("BertTokenizer", "DistilBertTokenizer", "MPNetTokenizer")


def follow_tokenizer_class(tokenizer, config: dict[str, Any], path: Path) -> None:
    """Apply tokenizer_config.json's ``do_lower_case``, ``strip_accents``,
    ``tokenize_chinese_chars``, ``add_prefix_space`` and ``trim_offsets`` to a tokenizer read
    from ``tokenizer.json``, for the classes whose transformers tokenizer (and so
    sentence-transformers) rebuilds those steps from them, with that class's defaults where a
    field is absent: the config wins where the two files disagree. Other classes
    (``PreTrainedTokenizerFast``, ...) use tokenizer.json as it is."""
    from tokenizers import normalizers, pre_tokenizers, processors

    name = config.get("tokenizer_class")
    name = name.removesuffix("Fast") if isinstance(name, str) else None
    if name in _BERT_CLASSES:
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
            strip_accents=config.get("strip_accents"),
            lowercase=bool(config.get("do_lower_case", True)),
        )
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    elif name == "RobertaTokenizer":
        add_prefix_space = bool(config.get("add_prefix_space", False))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        ends = {
            key: token_text(config.get(key), ROBERTA_SPECIALS[key])
            for key in ("sep_token", "cls_token")
        }
        ids = {key: tokenizer.token_to_id(text) for key, text in ends.items()}
        if None in ids.values():
            raise CheckpointError(
                f"{path} lacks the special tokens cls_token={ends['cls_token']!r} and "
                f"sep_token={ends['sep_token']!r} that every sequence starts and ends with"
            )
        tokenizer.post_processor = processors.RobertaProcessing(  # positional: (sep, cls, ...)
            (ends["sep_token"], ids["sep_token"]),
            (ends["cls_token"], ids["cls_token"]),
            trim_offsets=bool(config.get("trim_offsets", True)),
            add_prefix_space=add_prefix_space,
        )
    elif name == "XLMRobertaTokenizer":
        scheme = "always" if config.get("add_prefix_space", True) else "never"
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme),
            ]
        )


def check_room_for_specials(tokenizer, limit: int, *, pair: bool, name: str = "max_length") -> None:
    """``limit`` (the argument ``name``) must leave room for the special tokens the
    ``tokenizers.Tokenizer``'s template adds to a text (``pair``: to a pair): below their
    count the tokenizers library does not truncate at all, and every text would run whole
    under a limit that claims otherwise."""
    processor = tokenizer.post_processor
    specials = 0 if processor is None else processor.num_special_tokens_to_add(pair)
    if limit < specials:
        what = "pair" if pair else "text"
        raise ValueError(
            f"{name} must be at least {specials}, the special tokens this tokenizer adds to "
            f"every {what}, got {limit}"
        )
