"""Left truncation that keeps a prompt.

A prompt goes before the text it introduces, and the tokenizer's left truncation cuts from the
start: it would take the prompt's tokens first, and a pooling that leaves the prompt out
(``include_prompt`` false: the first tokens skipped) would then skip the text's first tokens
instead. Here the tokenizer still decides how many tokens each input (each side of a pair)
keeps; only the cut moves: the prompt's tokens stay, and the text loses its tokens after them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CutTokens:
    """An input cut here: what the models read of a ``tokenizers.Encoding``."""

    ids: list[int]
    type_ids: list[int]
    # Truthy, as an Encoding's overflow list is when its input was cut (the models count it).
    overflowing: tuple = ("cut",)


# Characters of an input's text (after its prompt) tokenized to find the prompt's tokens as
# they stand before the text: a piece at the join may take in the text's first characters.
# A bound, so that a text megabytes long is not tokenized a second time.
CONTEXT_CHARS = 1024


def prompt_tokens(tokenizer, prompt: str, *, add_special_tokens: bool = True) -> int:
    """Tokens a ``prompt`` takes at the start of an input (``tokenizer``: a
    ``tokenizers.Tokenizer``): its pieces and the opening special token, not a closing one
    (sentence-transformers' count, the one the pooling skips)."""
    encoding = tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    mask = encoding.special_tokens_mask
    return len(encoding.ids) - int(bool(mask) and mask[-1] == 1)


def input_head(prompt: str, text: str) -> str:
    """The start of ``text`` (an input that begins with ``prompt``) that decides the prompt's
    tokens in it."""
    return text[: len(prompt) + CONTEXT_CHARS]


def keep_prompts(encodings: list, head_encoding, keep: int) -> list:
    """``encodings`` (cut on the left by the tokenizer) with each cut one's first ``keep``
    tokens (the prompt's) taken back from the untruncated start of its input
    (``head_encoding(i)``, of :func:`input_head`), in place of the text's tokens that follow
    them; the lengths stay the tokenizer's."""
    out = []
    for i, encoding in enumerate(encodings):
        if not encoding.overflowing or keep <= 0:
            out.append(encoding)
            continue
        # The prompt is at the start of the first sequence: it keeps at most that one's room.
        first = [j for j, s in enumerate(encoding.sequence_ids) if s == 0]
        k = min(keep, first[-1] + 1) if first else 0
        head = head_encoding(i)
        out.append(
            CutTokens(
                ids=list(head.ids[:k]) + list(encoding.ids[k:]),
                type_ids=list(head.type_ids[:k]) + list(encoding.type_ids[k:]),
            )
        )
    return out
