"""Shared by the tests of the embedding and reranker families (not a test module): a word-level
tokenizer built offline, sentence-transformers directories around a saved transformers model,
and the texts they run on.

Everything is built in temporary directories from random weights: no download.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

WORDS = (
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "and",
    "ran",
    "far",
    "away",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "hello",
    "world",
    "is",
    "this",
    "text",
    "one",
    "two",
    "three",
    "four",
    "five",
    "0",
    "1",
    "2",
    "3",
    "4",
    "query",
    "document",
    "instruct",
    "yes",
    "no",
    "relevant",
    "answer",
)
# Ragged on purpose: an empty text, a one-word one, a long one (many pads for the others).
TEXTS = [
    "the cat sat on the mat",
    "hello",
    "",
    "quick brown fox jumps over the lazy dog and the cat ran far far away " * 3,
    "unknownword the dog",
    "one two three",
]
SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>")
BACKENDS = ("auto", "math", "sdpa", "varlen")


def word_tokenizer(
    directory: Path,
    *,
    template: str = "$A <eos>",
    pair: str | None = None,
    padding_side: str = "right",
    pad_token: str | None = "<pad>",
    words: Sequence[str] = WORDS,
    extra: dict | None = None,
) -> int:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for a whitespace word-level
    tokenizer over ``SPECIALS + words`` to ``directory``: ``template`` (and ``pair``, for two
    texts) say where the special tokens go (a decoder embedder appends ``<eos>``; Gemma also
    opens with ``<bos>``). Returns the vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate([*SPECIALS, *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIALS))
    pieces = {p.split(":")[0] for p in f"{template} {pair or ''}".split()}
    used = [t for t in SPECIALS if t in pieces]
    tok.post_processor = processors.TemplateProcessing(
        single=template, pair=pair, special_tokens=[(t, vocab[t]) for t in used]
    )
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "eos_token": "<eos>",
        "bos_token": "<bos>",
        "padding_side": padding_side,
        "model_max_length": 64,
        **(extra or {}),
    }
    if pad_token is not None:
        config["pad_token"] = pad_token
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return len(vocab)


def set_padding_side(directory: Path, side: str) -> None:
    """Change the padding side a directory's tokenizer_config.json asks for."""
    file = directory / "tokenizer_config.json"
    config = json.loads(file.read_text())
    config["padding_side"] = side
    file.write_text(json.dumps(config, indent=2))


def perturb(model: torch.nn.Module, seed: int = 0, scale: float = 0.1) -> None:
    """Move every parameter off its initial value: ones and zeros (norm weights, biases)
    would hide a swapped or dropped tensor."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def sentence_dir(
    base: Path,
    out: Path,
    *,
    pooling: str = "mean",
    dense: Sequence[tuple[int, int, bool, str | None]] = (),
    normalize: bool = False,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    include_prompt: bool = True,
    seed: int = 0,
) -> Path:
    """Save the transformers model in ``base`` as a sentence-transformers directory at ``out``
    (written by sentence-transformers itself): Transformer -> Pooling -> each ``dense``
    (in_features, out_features, bias, activation as a torch.nn class name or None for
    identity) -> Normalize."""
    import sentence_transformers as st
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )

    torch.manual_seed(seed)
    transformer = Transformer(str(base))
    width = transformer.get_embedding_dimension()
    modules = [transformer, Pooling(width, pooling_mode=pooling, include_prompt=include_prompt)]
    for in_features, out_features, bias, activation in dense:
        act = None if activation is None else getattr(torch.nn, activation)()
        modules.append(Dense(in_features, out_features, bias=bias, activation_function=act))
    if normalize:
        modules.append(Normalize())
    model = st.SentenceTransformer(
        modules=modules, prompts=prompts, default_prompt_name=default_prompt_name, device="cpu"
    )
    model.save(str(out))
    return out


def st_encode(path: Path, texts: Sequence[str], **kwargs) -> np.ndarray:
    """``SentenceTransformer(path).encode(texts, **kwargs)`` on the CPU, as float32."""
    import sentence_transformers as st

    model = st.SentenceTransformer(str(path), device="cpu")
    return np.asarray(model.encode(list(texts), **kwargs), dtype=np.float32)


def assert_batch_invariant(encoder, texts: Sequence[str], atol: float = 1e-6, **kwargs) -> None:
    """Each text's embedding inside the ragged batch equals it encoded alone."""
    together = encoder.encode(list(texts), **kwargs)
    for i, text in enumerate(texts):
        alone = encoder.encode([text], **kwargs)
        np.testing.assert_allclose(together[i : i + 1], alone, atol=atol, rtol=0)
