"""A checkpoint's chat template: the Jinja text that turns messages into the model's input, as
LLM rerankers (Qwen3-Reranker) ship it for sentence-transformers 6.

sentence-transformers hands a cross-encoder's (query, document) pair to the template as two
messages with the roles ``query`` and ``document`` (a prompt before them as a ``system``
message), and the template lays them out: Qwen3-Reranker's system line, ``<Instruct>: ...``,
``<Query>: ...``, ``<Document>: ...`` and the assistant's opening, whose last token is where the
"yes" / "no" logits are read. Rendering follows transformers' ``apply_chat_template``: a
sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the special tokens'
texts as variables, then tokenizing the text without adding special tokens.

The template comes from ``chat_template.jinja`` (transformers 5) or tokenizer_config.json's
``chat_template``. Rendering needs the ``jinja2`` package (a dependency of transformers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .files import CheckpointError, CheckpointFiles

# What a template that reads a message's content as a list of typed parts contains
# (sentence-transformers' test for its "structured" message format).
_STRUCTURED = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token")


def read_chat_template(files: CheckpointFiles) -> tuple[str, Path] | None:
    """The checkpoint's chat template and the file it came from; None without one."""
    jinja = files.path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), jinja
    value = files.tokenizer_config.get("chat_template")
    source = files.path / "tokenizer_config.json"
    if value is None:
        return None
    if isinstance(value, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if not isinstance(value, str) or not value:
        raise CheckpointError(
            f"{source} 'chat_template' must be a template text (or a list with one named "
            f"'default'), got {str(value)[:60]!r}"
        )
    return value, source


class ChatTemplate:
    """A compiled chat template and the special tokens' texts it may name.

    Args:
        text: the Jinja source.
        source: the file it came from (for errors).
        special_tokens: ``bos_token`` and so on, as tokenizer_config.json names them.
    """

    def __init__(self, text: str, source: Path, special_tokens: Mapping[str, Any]) -> None:
        try:
            import jinja2
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise CheckpointError(
                f"{source} holds a chat template, and rendering it needs the jinja2 package: "
                "pip install jinja2"
            ) from None

        def raise_exception(message: str):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value, indent=None):
            return json.dumps(value, indent=indent, ensure_ascii=False)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        try:
            self._template = env.from_string(text)
        except jinja2.exceptions.TemplateError as exc:
            raise CheckpointError(f"{source}: the chat template does not compile: {exc}") from None
        self.source = source
        self.structured = any(pattern in text for pattern in _STRUCTURED)
        self._specials = {
            key: _token_text(special_tokens.get(key))
            for key in _SPECIAL_KEYS
            if _token_text(special_tokens.get(key))
        }
        self._check_pair_roles()

    def messages(self, query: str, document: str, prompt: str | None) -> list[dict[str, Any]]:
        """The messages sentence-transformers makes of a pair (a prompt first, as a system
        message), in the content format the template reads."""
        roles = [("query", query), ("document", document)]
        if prompt is not None:
            roles.insert(0, ("system", prompt))
        if self.structured:
            return [{"role": r, "content": [{"type": "text", "text": t}]} for r, t in roles]
        return [{"role": r, "content": t} for r, t in roles]

    def render(self, query: str, document: str, prompt: str | None = None) -> str:
        """The text of one pair (no generation prompt added: the template writes its own)."""
        import jinja2

        try:
            return self._template.render(
                messages=self.messages(query, document, prompt),
                add_generation_prompt=False,
                **self._specials,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise CheckpointError(
                f"{self.source}: rendering the chat template failed: {exc}"
            ) from None

    def _check_pair_roles(self) -> None:
        """A template that ignores the ``query`` and ``document`` roles would give the model
        neither text: refuse it, as sentence-transformers does."""
        query, document = "\x01query-probe\x01", "\x01document-probe\x01"
        try:
            text = self.render(query, document)
        except CheckpointError:
            text = ""
        if query not in text or document not in text:
            raise CheckpointError(
                f"{self.source}: the chat template does not lay out the 'query' and "
                "'document' messages of a pair (a reranker's template must; see "
                "docs/pretrained.md)"
            )


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None
