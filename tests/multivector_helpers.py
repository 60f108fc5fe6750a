"""Small ColBERT-style directories for the tests: a random BERT whose vocabulary holds
punctuation (the skiplist's tokens), saved as sentence-transformers 6 writes a
MultiVectorEncoder, or in PyLate's layout as PyLate writes it (its [Q] / [D] markers added to the
vocabulary, a ``1_Dense`` projection, its fields in ``config_sentence_transformers.json``)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

_WORD_TEXT = (
    "the a cat dog sat on mat and ran far away quick brown fox jumps over lazy hello world is "
    "this text one two three four five"
)
WORDS = _WORD_TEXT.split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXTS = [
    "the cat, sat on the mat!",
    "hello",
    "",
    "quick brown fox jumps over the lazy dog; and the cat ran far, far away " * 2,
    "unknownword the dog?",
    "one two three four five.",
]
QUERY_LENGTH = 12
DOCUMENT_LENGTH = 20


def bert_base(directory: Path, *, markers: bool = False, seed: int = 0):
    """A random BERT (width 32, 2 layers) and its fast tokenizer in ``directory``; with
    ``markers``, PyLate's "[Q] " and "[D] " added to the vocabulary as it adds them (and the
    embeddings grown to hold them). Returns the transformers model."""
    import transformers

    vocab = SPECIALS + WORDS + list(string.punctuation)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizerFast(str(directory / "vocab.txt"))
    if markers:
        tokenizer.add_tokens(["[Q] ", "[D] "])
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = transformers.BertModel(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # off the initial values, so a swapped LayerNorm cannot hide
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    model.eval().save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return model


def st_multivector_dir(
    base: Path,
    out: Path,
    *,
    expansion: dict | None = None,
    mask: bool = True,
    normalize: bool = True,
    prompts: dict | None = None,
    width: int = 16,
) -> Path:
    """A MultiVectorEncoder directory written by sentence-transformers itself: Transformer ->
    Dense (32 -> ``width``, no bias, on token embeddings) -> MultiVectorMask (punctuation) ->
    Normalize."""
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    torch.manual_seed(1)
    transformer = Transformer(
        str(base),
        query_length=QUERY_LENGTH,
        document_length=DOCUMENT_LENGTH,
        query_expansion=expansion,
    )
    modules = [
        transformer,
        Dense(
            32,
            width,
            bias=False,
            activation_function=torch.nn.Identity(),
            module_input_name="token_embeddings",
        ),
    ]
    if mask:
        modules.append(MultiVectorMask(skiplist_words=list(string.punctuation)))
    if normalize:
        modules.append(Normalize(module_input_name="token_embeddings"))
    model = MultiVectorEncoder(modules=modules, prompts=prompts, device="cpu")
    model.save(str(out))
    return out


def pylate_dir(out: Path, *, attend: bool = False, expansion: bool = True, seed: int = 0) -> Path:
    """A directory in PyLate 1.x's layout: the backbone with "[Q] " / "[D] " in its vocabulary,
    ``modules.json`` [Transformer, pylate.models.Dense.Dense], ``1_Dense`` (32 -> 16, no bias,
    identity), and PyLate's fields in ``config_sentence_transformers.json``."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    bert_base(out, markers=True, seed=seed)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": DOCUMENT_LENGTH - 1, "do_lower_case": False})
    )
    (out / "config_sentence_transformers.json").write_text(
        json.dumps(
            {
                "model_type": "ColBERT",
                "prompts": {},
                "default_prompt_name": None,
                "similarity_fn_name": "MaxSim",
                "query_prefix": "[Q] ",
                "document_prefix": "[D] ",
                "query_length": QUERY_LENGTH,
                "document_length": DOCUMENT_LENGTH,
                "attend_to_expansion_tokens": attend,
                "skiplist_words": list(string.punctuation),
                "do_query_expansion": expansion,
            },
            indent=2,
        )
    )
    dense = out / "1_Dense"
    dense.mkdir(exist_ok=True)
    (dense / "config.json").write_text(
        json.dumps(
            {
                "in_features": 32,
                "out_features": 16,
                "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity",
            }
        )
    )
    gen = torch.Generator().manual_seed(seed + 7)
    save_file(
        {"linear.weight": torch.randn(16, 32, generator=gen) * 0.2}, dense / "model.safetensors"
    )
    return out


def pylate_reference(directory: Path, texts, *, query: bool) -> list[torch.Tensor]:
    """PyLate's encoding written out on transformers' BertModel: tokenize to length - 1
    (queries padded to it with [MASK] when expanding), insert the marker after [CLS], run,
    project, keep (queries: every token when expanding; documents: real tokens outside the
    skiplist), normalise."""
    import transformers
    from safetensors.torch import load_file

    config = json.loads((directory / "config_sentence_transformers.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    model = transformers.BertModel.from_pretrained(str(directory)).eval()
    weight = load_file(directory / "1_Dense" / "model.safetensors")["linear.weight"]
    length = config["query_length" if query else "document_length"]
    expand = query and config["do_query_expansion"]
    marker = tokenizer.convert_tokens_to_ids(config["query_prefix" if query else "document_prefix"])
    skiplist = torch.tensor(tokenizer.convert_tokens_to_ids(config["skiplist_words"]))
    out = []
    for text in texts:
        ids = tokenizer(text, truncation=True, max_length=length - 1)["input_ids"]
        mask = [1] * len(ids)
        if expand:  # PyLate sets the pad token to [MASK] and pads queries to the length
            ids += [tokenizer.mask_token_id] * (length - 1 - len(ids))
            mask += [0] * (length - 1 - len(mask))
        ids.insert(1, marker)
        mask.insert(1, 1)
        ids_t, mask_t = torch.tensor([ids]), torch.tensor([mask])
        if query and config["attend_to_expansion_tokens"]:
            mask_t = torch.ones_like(mask_t)
        with torch.no_grad():
            hidden = model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state[0]
        vectors = hidden @ weight.T
        if expand:
            keep = torch.ones(len(ids), dtype=torch.bool)
        else:
            keep = torch.tensor(mask, dtype=torch.bool)
            if not query:
                keep &= ~torch.isin(ids_t[0], skiplist)
        out.append(torch.nn.functional.normalize(vectors[keep], dim=-1))
    return out
