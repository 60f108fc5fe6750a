"""Shared by the sparse-encoder tests (not a test module): tiny random BertForMaskedLM
checkpoints written as SPLADE and inference-free SPLADE directories by sentence-transformers
itself, and the comparison of two sparse outputs.

Everything is built in temporary directories from random weights: no download.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "dog",
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
    "rates",
    "rose",
    "bank",
    "inflation",
    "central",
    "sharply",
    "interest",
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
V = len(SPECIALS) + len(WORDS)
# Ragged on purpose: an empty text, a one-word one, a long one (many pads for the others),
# repeated words (a static query counts a token once), an unknown word, one cut to the limit.
TEXTS = [
    "the cat sat on the mat",
    "hello",
    "",
    "quick brown fox jumps over the lazy dog and the cat ran far far away " * 2,
    "unknownword the dog",
    "interest rates rose sharply as the central bank fought inflation",
    "one two three four five " * 20,  # 100 words: truncated at the tokenizer's 64 tokens
]


def write_mlm(directory: Path, *, seed: int = 0, padding_side: str = "right") -> Path:
    """A 2-layer, 32-wide random ``BertForMaskedLM`` with a WordPiece vocabulary. The decoder
    bias is pushed down so that most logits are negative: the weights are sparse, as a trained
    SPLADE model's are, and a wrong mask or activation shows as other non-zero entries."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        layer_norm_eps=1e-3,
    )
    model = transformers.BertForMaskedLM(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
        model.cls.predictions.bias.sub_(0.4)
    model.save_pretrained(directory)
    (directory / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": True,
        "model_max_length": 64,
        "padding_side": padding_side,
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return directory


def splade_dir(
    base: Path,
    out: Path,
    *,
    pooling: str = "max",
    activation: str = "relu",
    max_active_dims: int | None = None,
) -> Path:
    """``base`` (a masked-LM checkpoint) saved by sentence-transformers as a SPLADE directory."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    modules = [
        Transformer(str(base), transformer_task="fill-mask"),
        SpladePooling(pooling, activation),
    ]
    SparseEncoder(modules=modules, device="cpu", max_active_dims=max_active_dims).save(str(out))
    return out


def inference_free_dir(base: Path, out: Path, *, seed: int = 1) -> Path:
    """``base`` saved by sentence-transformers as an inference-free SPLADE directory: a Router
    sending queries to a SparseStaticEmbedding (random weights, some zero) and documents to
    the masked-LM transformer with SPLADE max pooling."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling

    document = Transformer(str(base), transformer_task="fill-mask")
    gen = torch.Generator().manual_seed(seed)
    weight = torch.rand(V, generator=gen) * (torch.rand(V, generator=gen) > 0.2)
    query = SparseStaticEmbedding(tokenizer=document.tokenizer, weight=weight, frozen=True)
    router = Router.for_query_document(
        query_modules=[query], document_modules=[document, SpladePooling("max")]
    )
    SparseEncoder(modules=[router], device="cpu").save(str(out))
    return out


def st_encode(path: Path, texts: Sequence[str], task: str, **kwargs) -> torch.Tensor:
    """sentence-transformers' SparseEncoder on ``path``: (n, V) coalesced sparse."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(path), device="cpu")
    method = model.encode_query if task == "query" else model.encode_document
    return method(list(texts), convert_to_sparse_tensor=True, **kwargs).coalesce()


def assert_same_sparse(ours: torch.Tensor, theirs: torch.Tensor, atol: float = 1e-5) -> None:
    """The same shape, the same non-zero entries and values within ``atol``."""
    assert ours.is_sparse and ours.is_coalesced() and ours.dtype == torch.float32
    assert ours.shape == theirs.shape
    theirs = theirs.coalesce()
    assert torch.equal(ours.indices(), theirs.indices()), "the non-zero entries differ"
    torch.testing.assert_close(ours.values(), theirs.values(), atol=atol, rtol=0)
