"""Word-level tokens and vocabularies for translation.

Tokenisation: lower-case, then every run of letters and digits (Unicode ``\\w``: ä, ß and é are
letters) is a word and every other non-space character a token of its own:
``"Wie geht's, Anna?"`` -> ``wie geht ' s , anna ?``. Lower-casing halves a German vocabulary
(every noun is capitalised, and so is every sentence's first word) at the price of case in the
output. :func:`join_words` undoes the splitting well enough for BLEU's own tokeniser to see the
words it would have seen in the reference.

A :class:`Vocabulary` is the four special tokens (``<pad> <s> </s> <unk>``: ids 0-3) and then
the training words by falling count (ties alphabetical, so the same pairs always give the same
ids). Words seen fewer than ``min_count`` times, or beyond ``max_size``, read as ``<unk>``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD, BOS, EOS, UNK = 0, 1, 2, 3
TOKENIZER = "lower-case; words are runs of \\w, every other non-space character is a token"

_TOKEN = re.compile(r"\w+|[^\w\s]")
_NO_SPACE_BEFORE = frozenset(".,!?;:%)]}")
_NO_SPACE_AFTER = frozenset("([{")
_JOINS_NEIGHBOURS = frozenset("'’-")  # don ' t -> don't, o ' clock -> o'clock, e - mail -> e-mail


def split_words(text: str) -> list[str]:
    """``text`` as lower-case word and punctuation tokens."""
    return _TOKEN.findall(text.lower())


def join_words(words: Sequence[str]) -> str:
    """Tokens back into text: no space before closing punctuation or after an opening bracket,
    apostrophes and hyphens joined to both neighbours. Lossy where the tokens cannot tell:
    ``a - b`` becomes ``a-b`` and a quoting ``' ch '`` becomes ``'ch'`` glued to its
    neighbours; on the auf-deutsch references, text -> tokens -> text scores BLEU 98.1
    against the text (the ceiling of :func:`held_out_bleu` there)."""
    out = ""
    for i, word in enumerate(words):
        glued = (
            i == 0
            or word in _NO_SPACE_BEFORE
            or word in _JOINS_NEIGHBOURS
            or words[i - 1] in _NO_SPACE_AFTER
            or words[i - 1] in _JOINS_NEIGHBOURS
        )
        out += word if glued else " " + word
    return out


@dataclass(frozen=True)
class Vocabulary:
    tokens: tuple[str, ...]  # id -> token; the specials first

    def __post_init__(self) -> None:
        if tuple(self.tokens[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(
                f"a vocabulary must start with {list(SPECIALS)}, got {list(self.tokens[:4])}"
            )
        if len(set(self.tokens)) != len(self.tokens):
            repeated = sorted(t for t, n in Counter(self.tokens).items() if n > 1)
            raise ValueError(f"a vocabulary must hold each token once, got repeats {repeated[:5]}")
        object.__setattr__(self, "_ids", {t: i for i, t in enumerate(self.tokens)})

    @classmethod
    def build(
        cls, sentences: Iterable[Sequence[str]], *, min_count: int = 1, max_size: int = 0
    ) -> Vocabulary:
        """The words of ``sentences`` (token lists) seen at least ``min_count`` times, the
        ``max_size`` most frequent (0: all), after the specials."""
        counts = Counter(word for words in sentences for word in words)
        for special in SPECIALS:
            counts.pop(special, None)  # a literal "<unk>" in the text is not the special
        kept = sorted(
            (w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w)
        )
        if max_size:
            kept = kept[:max_size]
        return cls((*SPECIALS, *kept))

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, word: str) -> bool:
        return word in self._ids

    def encode(self, words: Sequence[str]) -> list[int]:
        """Token ids; a word not in the vocabulary is ``<unk>`` (3)."""
        return [self._ids.get(w, UNK) for w in words]

    def decode(self, ids: Sequence[int]) -> list[str]:
        return [self.tokens[i] for i in ids]

    def unknown(self, words: Sequence[str]) -> list[str]:
        """The words of ``words`` that this vocabulary reads as ``<unk>``."""
        return [w for w in words if w not in self._ids]


VOCABULARY_FORMAT = "clearformer word vocabularies 1"


def dump_vocabularies(source: Vocabulary, target: Vocabulary) -> str:
    """Both vocabularies as one JSON document (a run's ``vocabulary.json``)."""
    import json

    data = {
        "format": VOCABULARY_FORMAT,
        "tokenizer": TOKENIZER,
        "source": list(source.tokens),
        "target": list(target.tokens),
    }
    return json.dumps(data, ensure_ascii=False, indent=0) + "\n"


def load_vocabularies(text: str, where: str) -> tuple[Vocabulary, Vocabulary]:
    """(source, target) from :func:`dump_vocabularies`'s JSON; ValueError naming ``where``."""
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict) or data.get("format") != VOCABULARY_FORMAT:
        raise ValueError(f"{where} is not a vocabulary file of format {VOCABULARY_FORMAT!r}")
    try:
        return Vocabulary(tuple(data["source"])), Vocabulary(tuple(data["target"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
