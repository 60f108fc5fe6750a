"""A causal language model (``*ForCausalLM``, Qwen3-Reranker) as a cross-encoder, the way
sentence-transformers 6 runs one (:class:`~.cross_encoder.CrossEncoder` loads it from here):
each (query, document) pair is laid out by the checkpoint's chat template, and its score is
``logit("yes") - logit("no")`` at the last real token (:class:`~clearformer.heads.LogitScore`).

Where the pieces come from, as in sentence-transformers:

* the template: the checkpoint's chat template with the pair as ``query`` and ``document``
  messages (:mod:`clearformer.interop.hf.chat_template`); without one, the tokenizer's own pair
  template (``query`` then ``document``);
* a prompt (Qwen3-Reranker's instruction): ``predict(prompt=...)``, ``prompt_name=...`` or the
  directory's default prompt; a system message for a chat template, else put before the query
  (:meth:`ChatPairTokenizer.encode_pairs`);
* the two tokens: ``1_LogitScore/config.json`` (``true_token_id``, ``false_token_id``) when
  modules.json lists a LogitScore module, else the tokenizer's ``yes`` and ``no``;
* the activation on the score: the checkpoint's, else sigmoid (one score per pair).

A pair the model's maximum length cuts keeps the template's tail (the assistant's opening whose
last token is scored): its last tokens are written back over the cut text, as
sentence-transformers does. Rows are padded on the left by default, as sentence-transformers
pads causal models; the scores do not depend on it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor

from ..heads import LogitScore, LogitScoreConfig
from ..interop.hf import TextTokenizer
from ..interop.hf.chat_template import ChatTemplate, read_chat_template
from ..interop.hf.files import CheckpointError, CheckpointFiles, read_json
from ..interop.hf.heads import LoadedClassifier
from ..interop.hf.loading import build_model, read_family
from ..interop.hf.sentence_transformers import score_activation
from ..interop.hf.st_modules import module_kind
from ..interop.hf.tokenizer import max_length_for
from ..interop.hf.weights import open_tensors

log = logging.getLogger(__name__)


def is_causal_lm(files: CheckpointFiles) -> bool:
    """Whether config.json's ``architectures`` names a ``*ForCausalLM`` model."""
    architectures = files.config.get("architectures") or []
    return any(str(a).endswith("ForCausalLM") for a in architectures)


@dataclass
class RenderedEncoding:
    """A tokenized pair as :meth:`TextTokenizer.pad` reads it."""

    ids: list[int]
    type_ids: list[int]
    tokens: list[str] = field(default_factory=list)
    overflowing: list = field(default_factory=list)


class ChatPairTokenizer(TextTokenizer):
    """A :class:`TextTokenizer` whose ``encode_pairs`` lays each pair out with a chat
    template (or, with none, the tokenizer's pair template after a prompt)."""

    def __init__(self, base: TextTokenizer, template: ChatTemplate | None) -> None:
        super().__init__(base.tokenizer, base.max_length, base.pad_id, base.padding_side)
        self.template = template
        self._suffixes: dict[str | None, list[int]] = {}
        self._lock = threading.Lock()
        # The template's tail is found from whole renders: a copy that never truncates.
        self._untruncated = type(base.tokenizer).from_str(base.tokenizer.to_str())
        self._untruncated.no_truncation()

    def encode_pairs(
        self, pairs: list[tuple[str, str]], *, with_tokens: bool = False, prompt: str | None = None
    ) -> list:
        if self.template is None:  # the pair template, the prompt before each query
            return super().encode_pairs(pairs, with_tokens=with_tokens, prompt=prompt)
        texts = [self.template.render(q, d, prompt) for q, d in pairs]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        out = []
        for encoding in encodings:
            ids = list(encoding.ids)
            if encoding.overflowing:
                suffix = self._suffix(prompt)
                keep = min(len(suffix), len(ids))
                if keep:
                    ids[-keep:] = suffix[-keep:]  # the scored tail back over the cut text
            tokens = list(encoding.tokens) if with_tokens else []
            out.append(RenderedEncoding(ids, [0] * len(ids), tokens, list(encoding.overflowing)))
        return out

    def _suffix(self, prompt: str | None) -> list[int]:
        """The template's fixed tail: the longest common token suffix of two whole renders whose
        query and document are other texts, "0" and "1 2 3 4" (sentence-transformers' fillers,
        so that both cut the same pairs the same way); none when the renders never differ."""
        with self._lock:
            if prompt not in self._suffixes:
                first, second = (
                    self._untruncated.encode(
                        self.template.render(filler, filler, prompt), add_special_tokens=False
                    ).ids
                    for filler in ("0", "1 2 3 4")
                )
                n = 0
                while n < min(len(first), len(second)) and first[-1 - n] == second[-1 - n]:
                    n += 1
                tail = first[len(first) - n :] if 0 < n < min(len(first), len(second)) else []
                self._suffixes[prompt] = list(tail)
            return self._suffixes[prompt]


def score_token_ids(files: CheckpointFiles, tokenizer: TextTokenizer) -> tuple[int, int | None]:
    """(true, false) token ids: a LogitScore module's config, else the tokenizer's "yes" and
    "no"."""
    for module in files.modules or []:
        if module_kind(module) != "LogitScore":
            continue
        file = files.path / str(module.get("path", "")) / "config.json"
        config = read_json(file, "LogitScore config") if file.is_file() else None
        if not isinstance(config, dict) or not isinstance(config.get("true_token_id"), int):
            raise CheckpointError(f"{file} must give an int 'true_token_id', got {config!r}")
        return config["true_token_id"], config.get("false_token_id")
    yes, no = (tokenizer.tokenizer.token_to_id(word) for word in ("yes", "no"))
    if yes is None or no is None:
        missing = [w for w, i in (("yes", yes), ("no", no)) if i is None]
        raise CheckpointError(
            f"{files.tokenizer} has no token {' or '.join(map(repr, missing))}, which an LLM "
            "reranker scores by (logit('yes') - logit('no')); give the ids in a LogitScore "
            "module's config.json (true_token_id, false_token_id) listed in modules.json"
        )
    return yes, no


def load_llm_reranker(
    files: CheckpointFiles, *, backend: str = "auto", strict: bool = True
) -> tuple[LoadedClassifier, ChatPairTokenizer, str]:
    """The parts :class:`~.cross_encoder.CrossEncoder` runs a ``*ForCausalLM`` reranker with:
    the model and its :class:`~clearformer.heads.LogitScore` head, the tokenizer that lays
    pairs out, the activation on the scores.

    Raises:
        CheckpointError: a family clearformer does not run causally, no yes/no tokens, no
            language-model head, a chat template without the pair's roles.
    """
    family, config = read_family(files, backend)
    if not config_is_causal(config):
        raise CheckpointError(
            f"{files.path / 'config.json'}: an LLM reranker needs a causal model clearformer "
            f"runs causally (qwen3), got model_type={family.model_type!r}"
        )
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    base = TextTokenizer.from_files(
        files,
        max_length_for(files, config.max_length),
        pad_id,
        vocab_size=config.vocab_size,
        padding_side="left",  # as sentence-transformers pads causal models; scores do not care
    )
    found = read_chat_template(files)
    template = None if found is None else ChatTemplate(found[0], found[1], files.tokenizer_config)
    tokenizer = ChatPairTokenizer(base, template)
    true_id, false_id = score_token_ids(files, tokenizer)
    head = LogitScore(LogitScoreConfig(config.d_model, config.vocab_size, true_id, false_id))
    tensors = open_tensors(files.weights)  # each tensor read when it is copied
    loaded = build_model(files, family, config, tensors, strict=strict)
    head.load_rows(_lm_head(files, tensors, loaded))
    loaded.report.unused = [k for k in loaded.report.unused if k != "lm_head.weight"]
    loaded.report.loaded.append("head.rows")
    return LoadedClassifier(loaded, head.eval()), tokenizer, score_activation(files, 1)


def config_is_causal(config) -> bool:
    """Whether the model attends causally (a query sees only the keys before it)."""
    return bool(getattr(config, "causal", False))


def _lm_head(files: CheckpointFiles, tensors: Mapping[str, Tensor], loaded) -> Tensor:
    """The (V, D) language-model head: ``lm_head.weight``, or the word embeddings where
    config.json ties them (``tie_word_embeddings``)."""
    if "lm_head.weight" in tensors:
        return tensors["lm_head.weight"]
    if files.config.get("tie_word_embeddings", False):
        return loaded.model.embeddings.word.weight.detach()
    raise CheckpointError(
        f"{files.weights} lacks 'lm_head.weight', and config.json 'tie_word_embeddings' is "
        f"{files.config.get('tie_word_embeddings')!r}: the reranker's yes/no rows are missing"
    )
