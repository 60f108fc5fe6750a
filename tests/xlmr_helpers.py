"""Small XLM-RoBERTa checkpoints for the tests: a Unigram ``tokenizer.json`` trained here with
the ``tokenizers`` library, laid out as XLM-R's (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3,
Metaspace pieces, ``<s> A </s></s> B </s>`` for pairs), and random transformers weights."""

from __future__ import annotations

from pathlib import Path

import torch

# Accents, CJK and emoji in the training text, so the vocabulary holds pieces of each.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café au lait, déjà vu, naïve résumé à Zürich.",
    "東京は日本の首都です。北京是中国的首都。",
    "Wir sprechen Deutsch, Français und Español.",
    "emoji 🙂 are fun 🎉 and so are flags 🇫🇷",
    "hello world, hello again",
]
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


def unigram_tokenizer(directory: Path):
    """Train a tiny Unigram tokenizer on :data:`CORPUS` and save ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    metaspace = {"replacement": "▁", "prepend_scheme": "always"}
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(**metaspace)]
    )
    tok.decoder = decoders.Metaspace(**metaspace)
    trainer = trainers.UnigramTrainer(
        vocab_size=150, special_tokens=SPECIALS, unk_token="<unk>", shrinking_factor=0.75
    )
    tok.train_from_iterator(CORPUS * 5, trainer)
    tok.add_special_tokens(["<mask>"])  # last, as in XLM-R
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.save(str(directory / "tokenizer.json"))
    return tok


def make_xlmr(directory: Path, *, head: str | None = None, vocab_size: int | None = None, **kw):
    """A random XLM-R (``head="classification"``: ``XLMRobertaForSequenceClassification``)
    saved in ``directory`` with its tokenizer; returns the transformers model."""
    import transformers

    tok = unigram_tokenizer(directory)
    config = transformers.XLMRobertaConfig(
        vocab_size=vocab_size or tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        **kw,
    )
    torch.manual_seed(0)
    cls = (
        transformers.XLMRobertaForSequenceClassification
        if head == "classification"
        else transformers.XLMRobertaModel
    )
    model = cls(config)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # off the initial values, so a swapped LayerNorm cannot hide
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    model.eval().save_pretrained(str(directory))
    return model


def make_bge_m3(
    directory: Path,
    *,
    seed: int,
    sparse: tuple[float, float] = (1.0, 1.0),
    colbert: tuple[float, float] = (1.0, 1.0),
):
    """A bge-m3 directory at width 32: :func:`make_xlmr`'s backbone and random
    ``sparse_linear.pt`` (1 x 32) and ``colbert_linear.pt`` (32 x 32) head files, drawn in that
    order from ``seed``, each head's weight and bias scaled by its (weight, bias) pair. Returns
    (the transformers model, the heads' state dicts)."""
    model = make_xlmr(directory)
    gen = torch.Generator().manual_seed(seed)
    heads = {}
    for name, rows, (weight, bias) in (
        ("sparse_linear", 1, sparse),
        ("colbert_linear", 32, colbert),
    ):
        heads[name] = {
            "weight": weight * torch.randn(rows, 32, generator=gen),
            "bias": bias * torch.randn(rows, generator=gen),
        }
        torch.save(heads[name], directory / f"{name}.pt")
    return model, heads
