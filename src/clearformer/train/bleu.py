"""Corpus BLEU (Papineni et al., 2002) as sacreBLEU computes it by default.

BLEU = BP * exp(mean over n = 1..4 of log p_n), in percent, where

* ``p_n`` is the corpus n-gram precision: every hypothesis n-gram counts as correct at most as
  many times as it occurs in one of its references (the most in any one, "clipping"), summed
  over the corpus before dividing;
* ``BP`` is the brevity penalty, ``exp(1 - r / c)`` when the hypotheses' total length ``c`` is
  below the references' ``r`` (else 1): precision alone would reward saying little. ``r`` sums,
  per sentence, the reference length closest to the hypothesis's (the shorter one on a tie).

sacreBLEU's defaults are kept so that the numbers can be compared: the ``13a`` tokenisation
(mteval-v13a's, used by WMT: punctuation split off, a period or comma inside a number kept),
case kept unless ``lowercase``, and the ``exp`` smoothing (NIST's: the k-th order with no
match counts ``1 / (2^k * total)`` instead of 0, so one missing 4-gram does not zero a corpus).
An order with no n-gram at all (every hypothesis shorter than 4 words) makes BLEU 0, as
sacreBLEU's log floor does. ``tests/test_train_translate.py`` holds this to sacreBLEU itself.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_ORDER = 4
TOKENIZERS = ("13a", "none")

# mteval-v13a's rules, in order (sacreBLEU's TokenizerRegexp).
_RULES_13A = (
    # ASCII punctuation and symbols except ' , - . (those depend on their neighbours)
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),  # a period or comma after a non-digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),  # ... or before one
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),  # a dash after a digit
)


@dataclass(frozen=True)
class BleuScore:
    score: float  # BLEU in percent, 0 to 100
    precisions: tuple[float, ...]  # p_1 .. p_4 in percent (smoothed where no n-gram matched)
    brevity_penalty: float
    hypothesis_length: int  # c: words of all hypotheses (after tokenisation)
    reference_length: int  # r: the closest reference's words, summed

    def __str__(self) -> str:
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (
            f"BLEU {self.score:.2f} ({p}; BP {self.brevity_penalty:.3f}, "
            f"ratio {self.hypothesis_length / max(self.reference_length, 1):.3f})"
        )


def tokenize_13a(line: str) -> list[str]:
    """mteval-v13a's tokenisation, as sacreBLEU's ``tokenize="13a"``."""
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&")
        line = line.replace("&lt;", "<").replace("&gt;", ">")
    line = f" {line} "
    for pattern, replacement in _RULES_13A:
        line = pattern.sub(replacement, line)
    return line.split()


def _words(line: str, tokenize: str, lowercase: bool) -> list[str]:
    line = line.rstrip()
    if lowercase:
        line = line.lower()
    return tokenize_13a(line) if tokenize == "13a" else line.split()


def _ngrams(words: list[str]) -> Counter:
    return Counter(
        tuple(words[i : i + n]) for n in range(1, MAX_ORDER + 1) for i in range(len(words) - n + 1)
    )


def _closest(length: int, candidates: list[int]) -> int:
    return min(candidates, key=lambda r: (abs(r - length), r))


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
) -> BleuScore:
    """BLEU of ``hypotheses`` (one string per sentence) against ``references`` (for each
    sentence, one or more reference strings).

    ``tokenize``: ``"13a"`` (sacreBLEU's default) or ``"none"`` (split on white space only).
    """
    if tokenize not in TOKENIZERS:
        raise ValueError(f"tokenize must be one of {TOKENIZERS}, got {tokenize!r}")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"references must give one list per hypothesis ({len(hypotheses)}), "
            f"got {len(references)}"
        )
    correct, total = [0] * MAX_ORDER, [0] * MAX_ORDER
    c = r = 0
    for number, (hypothesis, refs) in enumerate(zip(hypotheses, references, strict=True)):
        if isinstance(refs, str) or not refs:
            raise ValueError(
                f"references[{number}] must be a non-empty list of strings, got {refs!r}"
            )
        words = _words(hypothesis, tokenize, lowercase)
        ref_words = [_words(ref, tokenize, lowercase) for ref in refs]
        best: Counter = Counter()  # each n-gram's largest count in any one reference
        for ref in ref_words:
            best |= _ngrams(ref)
        c += len(words)
        r += _closest(len(words), [len(ref) for ref in ref_words])
        for gram, count in _ngrams(words).items():
            total[len(gram) - 1] += count
            correct[len(gram) - 1] += min(count, best[gram])
    bp = 1.0 if c >= r else (math.exp(1 - r / c) if c > 0 else 0.0)
    precisions = [0.0] * MAX_ORDER
    if not any(correct):
        return BleuScore(0.0, tuple(precisions), bp, c, r)
    unmatched = 0
    for n in range(MAX_ORDER):
        if total[n] == 0:
            break  # no n-gram of this order at all: the mean below has a log 0
        if correct[n] == 0:
            unmatched += 1
            precisions[n] = 100.0 / (2**unmatched * total[n])
        else:
            precisions[n] = 100.0 * correct[n] / total[n]
    if min(precisions) == 0.0:
        return BleuScore(0.0, tuple(precisions), bp, c, r)
    score = bp * math.exp(sum(math.log(p) for p in precisions) / MAX_ORDER)
    return BleuScore(score, tuple(precisions), bp, c, r)
