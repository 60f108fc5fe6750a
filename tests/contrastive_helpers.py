"""Tiny sentence-transformers models and retrieval data for the contrastive training tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(60)]]


def write_sentence_transformer(directory: Path, *, dropout: float = 0.0, layers: int = 1) -> Path:
    """A random 16-wide BERT written by sentence-transformers itself (Transformer, mean
    Pooling, Normalize), so that both libraries read the very files a user would have."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    raw = directory / "raw"
    raw.mkdir(parents=True)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(WORDS),
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    BertModel(config).save_pretrained(raw)
    (raw / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    (raw / "tokenizer_config.json").write_text(
        json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"})
    )
    transformer = models.Transformer(str(raw), max_seq_length=32)
    pooling = models.Pooling(16, "mean")
    model = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    out = directory / "model"
    model.save(str(out))
    return out


def word_text(rng: np.random.Generator, topic: int, n: int) -> str:
    """Words mostly from one topic's band of the vocabulary: texts of one topic look alike."""
    words = [f"w{topic * 10 + int(rng.integers(0, 10))}" for _ in range(n)]
    return " ".join(words)


def write_retrieval_data(directory: Path, rows: int = 24, seed: int = 0) -> tuple[Path, Path]:
    """(pairs.jsonl, a BEIR folder): anchors and positives drawn from the same topic, one hard
    negative from another; the BEIR folder's queries are the anchors of the last rows."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    pairs, corpus = [], []
    for i in range(rows):
        topic = i % 6
        anchor = word_text(rng, topic, 3) + f" w{50 + i % 10}"
        positive = word_text(rng, topic, 8)
        negative = word_text(rng, (topic + 1) % 6, 8)
        pairs.append({"anchor": anchor, "positive": positive, "negative": [negative]})
        corpus.append({"_id": f"d{i}", "title": "", "text": positive})
    pairs_file = directory / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    beir = directory / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus))
    queries = [{"_id": f"q{i}", "text": p["anchor"]} for i, p in enumerate(pairs)]
    (beir / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(rows))
    (beir / "qrels" / "dev.tsv").write_text(qrels)
    (beir / "qrels" / "test.tsv").write_text(qrels)
    return pairs_file, beir
