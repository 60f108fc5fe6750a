"""Choosing a prompt (:func:`clearformer.text.prompts.choose_prompt`): an unknown name is
refused with the names there are, and a long one is shown by its start only (a server request
may send megabytes as a name)."""

from __future__ import annotations

import pytest

from clearformer.interop.hf.sentence_transformers import Prompts
from clearformer.text.prompts import choose_prompt

PROMPTS = Prompts({"query": "query: ", "document": ""}, default=None)


def test_named_default_and_given_prompts():
    assert choose_prompt(PROMPTS, None, "query") == "query: "
    assert choose_prompt(PROMPTS, None, "document") is None  # an empty prompt is none
    assert choose_prompt(PROMPTS, None, None) is None
    assert choose_prompt(PROMPTS, "passage: ", None) == "passage: "


def test_an_unknown_name_is_refused_and_shown_short():
    with pytest.raises(ValueError, match=r"\['document', 'query'\], got 'passage'$"):
        choose_prompt(PROMPTS, None, "passage")
    with pytest.raises(ValueError) as refused:
        choose_prompt(PROMPTS, None, "x" * 100_000)
    assert len(str(refused.value)) < 200 and str(refused.value).endswith("...")
    with pytest.raises(TypeError, match=r"got \['query', 'query', .*\.\.\.$") as refused:
        choose_prompt(PROMPTS, None, ["query"] * 10_000)
    assert len(str(refused.value)) < 120
