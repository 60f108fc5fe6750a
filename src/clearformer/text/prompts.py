"""Prompts: the text put before every input (``"query: "``, Qwen3-Embedding's
``"Instruct: ...\nQuery:"``), chosen per call among a checkpoint's named prompts.

sentence-transformers keeps the named prompts and a default in
``config_sentence_transformers.json`` (:class:`~clearformer.interop.hf.sentence_transformers.
Prompts`); ``encode(prompt=...)`` gives one as text, ``prompt_name=...`` picks a named one, and
with neither the default applies. The embedding models (:class:`~.encoder.TextEncoder`) and
the cross-encoders (:class:`~.cross_encoder.CrossEncoder`, LLM rerankers included) choose
theirs here.
"""

from __future__ import annotations

import logging

from ..checks import check_unicode, shortened
from ..interop.hf.sentence_transformers import Prompts

log = logging.getLogger(__name__)


def choose_prompt(prompts: Prompts, prompt: str | None, prompt_name: str | None) -> str | None:
    """The prompt text for a call: ``prompt`` if given, else the one ``prompt_name`` names,
    else the checkpoint's default (None: no prompt). An empty prompt is none, as
    sentence-transformers applies a prompt only when it has text (its version 6 saves an empty
    ``"query"`` and ``"document"`` prompt in every model): a pooling that leaves the prompt out
    then leaves nothing out, not the opening token.

    Raises:
        TypeError: a ``prompt`` or ``prompt_name`` that is not a str.
        ValueError: a ``prompt_name`` the checkpoint does not have.
    """
    named = prompts.prompts
    shown = shortened(repr(prompt_name), 60)  # a request may send megabytes as a name
    if prompt_name is not None and not isinstance(prompt_name, str):
        raise TypeError(f"prompt_name must be a str or None, got {shown}")
    if prompt_name is not None and prompt_name not in named:
        raise ValueError(
            f"prompt_name must be one of the checkpoint's prompts {sorted(named)}, got {shown}"
        )
    if prompt is not None:
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str or None, got {type(prompt).__name__}")
        check_unicode(prompt, "prompt")
        if prompt_name is not None:
            log.warning("both prompt and prompt_name given: prompt_name is ignored")
        return prompt or None
    name = prompt_name if prompt_name is not None else prompts.default
    return None if name is None else named[name] or None


def prompt_length(tokenizer, prompt: str) -> int:
    """Tokens a ``prompt`` takes at the start of a text (``tokenizer``: a
    :class:`~clearformer.interop.hf.TextTokenizer`): its pieces and the opening special token,
    not a closing one (sentence-transformers' count)."""
    check_unicode(prompt, "prompt")
    (encoding,) = tokenizer.encode([prompt])
    closing = bool(encoding.special_tokens_mask) and encoding.special_tokens_mask[-1] == 1
    return len(encoding.ids) - int(closing)


# The prompt each side of a retrieval takes when a call names none, as sentence-transformers'
# encode_query and encode_document choose it (its InformationRetrievalEvaluator embeds with
# them): the model's "query" or "document" prompt; where the model has none of that name, no
# prompt at all (sentence-transformers gives every model an empty "query" and "document"
# prompt), not the model's default one.
SIDE_PROMPTS = ("query", "document")


def side_prompt_name(named, side: str) -> str | None:
    """The prompt name (of ``named``, the model's prompts) that ``side`` (``"query"`` or
    ``"document"``) takes when a call names none, or None: then no prompt (see
    :func:`side_prompt_options`)."""
    if side not in SIDE_PROMPTS:
        raise ValueError(f"side must be one of {SIDE_PROMPTS}, got {side!r}")
    return side if side in named else None


def side_prompt_options(prompt_name: str | None) -> dict:
    """``encode``'s prompt options for a side of a retrieval: the named prompt, or none at
    all (an empty ``prompt``: the checkpoint's default prompt is not a side's prompt)."""
    return {"prompt": ""} if prompt_name is None else {"prompt_name": prompt_name}
