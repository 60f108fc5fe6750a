"""``rerank``: train a cross-encoder on (query, positive, negatives) rows, with one of two
losses (``rerank_loss``):

* ``bce``, as sentence-transformers' ``CrossEncoderTrainer`` with ``BinaryCrossEntropyLoss``:
  each row gives one pair labelled 1 (the query and its positive) and one labelled 0 per hard
  negative, each pair an example; ``pos_weight`` is the negatives per positive, so that
  positives and negatives weigh the same in the loss whatever their ratio.
* ``listwise``, as sentence-transformers' cross-encoder ``MultipleNegativesRankingLoss`` with
  the row's hard negatives and no in-batch ones: a row is one example, its pairs scored
  together; ``sigmoid(logit) x 10`` over the positive and its negatives, softmax
  cross-entropy toward the positive. It asks the question a reranker answers (which of these
  documents is the relevant one), where binary cross-entropy asks each pair alone.

The base ``model`` is a cross-encoder to go on training, or an encoder without a classification
head (the bundled embedding model, say), which gets a new one-label head. With ``eval_data``,
the model reranks the first ``rerank_top`` documents a fixed first stage (``retriever``, the
bundled model by default) finds for each query, and NDCG@10 of the reranked run picks the best
checkpoint; without it, the loss on a held-out ``eval_fraction`` of the rows does.
``RUN/model/`` is the trained cross-encoder, which ``CrossEncoder.from_pretrained``, sentence-
transformers' ``CrossEncoder`` and ``clearformer rerank`` / ``serve`` load.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import TrainConfig
from ..pairs import read_pairs
from .contrastive import _split
from .model_files import record_max_length, training_length

log = logging.getLogger(__name__)


RERANK_METRICS = ("ndcg@10", "mrr@10", "recall@10")  # of the reranked run, with eval_data
# sentence-transformers' own files of a cross-encoder it saved: kept in RUN/model.
ST_CROSS_ENCODER_FILES = (
    "config_sentence_transformers.json",
    "modules.json",
    "sentence_bert_config.json",
)

# sentence-transformers' cross-encoder MultipleNegativesRankingLoss defaults: the logits go
# through a sigmoid and are multiplied by 10 before the softmax.
LISTWISE_SCALE = 10.0

# One example: (query, its documents, their labels). bce: one pair; listwise: a row's
# positive first, then its negatives.
Example = tuple[str, tuple[str, ...], tuple[int, ...]]


@dataclass(frozen=True)
class PairBatch:
    """Text pairs padded: ids, types and mask (P, T); labels (P,) float (1 relevant, 0 not).

    ``groups`` (listwise only): (G, S) rows of the pairs, one row per example, its positive
    first; -1 where an example has fewer than S pairs.
    """

    input_ids: Tensor
    token_type_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    groups: Tensor | None = None

    def to(self, device: torch.device) -> PairBatch:
        return PairBatch(
            *(
                t.to(device)
                for t in (self.input_ids, self.token_type_ids, self.attention_mask, self.labels)
            ),
            None if self.groups is None else self.groups.to(device),
        )


def group_scores(logits: Tensor, groups: Tensor) -> Tensor:
    """(P,) pair logits -> (G, S) per example, its positive in column 0, -inf where absent."""
    present = groups >= 0  # (G, S)
    picked = logits[groups.clamp(min=0)]  # (G, S)
    return picked.masked_fill(~present, float("-inf"))


def listwise_loss_sum(logits: Tensor, groups: Tensor) -> Tensor:
    """Softmax cross-entropy toward each example's positive over ``sigmoid(logit) x 10`` of
    its pairs, summed over the examples."""
    scores = group_scores(torch.sigmoid(logits.float()) * LISTWISE_SCALE, groups)  # (G, S)
    target = torch.zeros(len(groups), dtype=torch.int64, device=logits.device)  # positive: 0
    return F.cross_entropy(scores, target, reduction="sum")


class PairScorer(nn.Module):
    """(query, document) token pairs -> EncoderModel -> SequenceClassifier -> (B,) logits."""

    def __init__(self, model, head) -> None:
        super().__init__()
        self.model = model
        self.head = head
        self.token_types = model.config.type_vocab_size > 1

    def forward(self, batch: PairBatch, checkpointing: bool | None = None) -> Tensor:
        types = batch.token_type_ids if self.token_types else None
        hidden = self.model(
            batch.input_ids, batch.attention_mask, types, checkpointing=checkpointing
        )  # (B, T, D)
        return self.head(hidden, batch.attention_mask)[:, 0]  # (B, 1) -> (B,)


class RerankTask:
    name = "rerank"

    def __init__(self, config: TrainConfig) -> None:
        from ...interop.hf import find_checkpoint
        from ...interop.hf.loading import load_model, read_family
        from ...interop.hf.tokenizer import TextTokenizer

        self.config = config
        pairs = read_pairs(config.train_file)
        self.files = find_checkpoint(None if config.model == "bundled" else config.model)
        self.family, encoder_config = read_family(self.files, "auto")
        if self.family.classifier is None:
            raise ValueError(
                f"model {self.files.path}: model_type={self.family.model_type!r} has no "
                "sequence-classification head in clearformer"
            )
        self._load_base(load_model)
        pad_id = encoder_config.pad_token_id if encoder_config.pad_token_id is not None else 0
        max_length = training_length(config.max_length, encoder_config.max_length)
        self.tokenizer = TextTokenizer.from_files(
            self.files, max_length, pad_id, vocab_size=encoder_config.vocab_size
        )
        self.pad_id = pad_id
        self.metric, reported = self.reported_metrics(config)
        self.metrics = tuple(m for m in reported if m != "loss")  # measures beside the loss
        if config.eval_data:
            from ...retrieval import load_beir

            self.eval_data = load_beir(config.eval_data, config.eval_split)
            train_rows, eval_rows = pairs, []
            self.evaluate_before_training = True
            self._first_stage = None
        else:
            self.eval_data = None
            train_rows, eval_rows = _split(pairs, config.eval_fraction, config.split_seed)
            self.evaluate_before_training = False
        self.listwise = config.rerank_loss == "listwise"
        self.train_examples = self._examples(train_rows, f"train_file {config.train_file}")
        self.eval_examples = self._examples(
            eval_rows,
            f"the rows of train_file {config.train_file} held out for evaluation "
            f"(eval_fraction={config.eval_fraction}, split_seed={config.split_seed})",
        )
        labels = [label for _, _, row_labels in self.train_examples for label in row_labels]
        positives = sum(labels)
        self.pos_weight = (len(labels) - positives) / max(positives, 1)
        self.labels = ()
        self._ids = self._tokenize(self.train_examples + self.eval_examples)
        # An example's padded length is its longest pair's (bucketing groups like lengths).
        self.train_lengths = [
            max(len(self._ids[(q, d)][0]) for d in docs) for q, docs, _ in self.train_examples
        ]

    @staticmethod
    def reported_metrics(config: TrainConfig) -> tuple[str, tuple[str, ...]]:
        """(the default metric, what an evaluation reports): with ``eval_data`` the reranked
        run's retrieval measures (no loss: nothing is held out), else the held-out rows' loss
        and accuracy."""
        if config.eval_data:
            return "ndcg@10", RERANK_METRICS
        return "loss", ("loss", "accuracy")

    def _load_base(self, load_model) -> None:
        """The encoder and its head: the checkpoint's own, or a new one-label head."""
        from ...interop.hf.classifier_saving import classifier_config, new_head
        from ...interop.hf.heads import load_classifier

        architectures = self.files.config.get("architectures") or []
        if any(str(a).endswith("ForSequenceClassification") for a in architectures):
            loaded = load_classifier(self.files)
            self.base_model, self.base_head = loaded.loaded.model, loaded.head
            self.hf_config = dict(self.files.config)
            if self.base_head.config.num_labels != 1:
                raise ValueError(
                    f"model {self.files.path}: a reranker scores with one label, this "
                    f"cross-encoder has num_labels={self.base_head.config.num_labels}"
                )
            return
        loaded = load_model(self.files)
        self.hf_config = classifier_config(self.files.config, self.family)
        self.base_model = loaded.model
        self.base_head = new_head(self.family, self.hf_config, loaded.kept, self.config.seed)

    def _examples(self, rows, source: str) -> list[Example]:
        """The examples of ``rows``; ``source`` names them (the training file, or its held-out
        rows) where listwise finds none to rank."""
        out: list[Example] = []
        limit = self.config.negatives
        dropped = 0
        for row in rows:
            negatives = tuple(row.negatives[:limit] if limit > 0 else row.negatives)
            if self.listwise:
                if not negatives:  # a positive alone has nothing to be ranked above
                    dropped += 1
                    continue
                out.append((row.anchor, (row.positive, *negatives), (1,) + (0,) * len(negatives)))
                continue
            out.append((row.anchor, (row.positive,), (1,)))
            out += [(row.anchor, (negative,), (0,)) for negative in negatives]
        if dropped:
            log.info("rerank: %d row(s) without a negative left out of the listwise loss", dropped)
        if self.listwise and rows and not out:
            raise ValueError(
                f"{source}: rerank_loss='listwise' needs rows with hard negatives; none of "
                f"these {len(rows)} has one"
            )
        return out

    def _tokenize(self, examples) -> dict:
        pairs = sorted({(q, d) for q, docs, _ in examples for d in docs})
        encodings = self.tokenizer.encode_pairs(pairs)
        return {p: (list(e.ids), list(e.type_ids)) for p, e in zip(pairs, encodings, strict=True)}

    def _collate(self, examples: Sequence[Example]) -> PairBatch:
        pairs = [
            (q, d, label)
            for q, docs, labels in examples
            for d, label in zip(docs, labels, strict=True)
        ]
        rows = [self._ids[(q, d)] for q, d, _ in pairs]
        T = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.int64)  # (B, T)
        types = torch.zeros((len(rows), T), dtype=torch.int64)  # (B, T)
        mask = torch.zeros((len(rows), T), dtype=torch.bool)  # (B, T)
        for i, (row_ids, row_types) in enumerate(rows):
            ids[i, : len(row_ids)] = torch.tensor(row_ids)
            types[i, : len(row_types)] = torch.tensor(row_types)
            mask[i, : len(row_ids)] = True
        labels = torch.tensor([float(label) for _, _, label in pairs])
        groups = None
        if self.listwise:
            width = max(len(docs) for _, docs, _ in examples)
            groups = torch.full((len(examples), width), -1, dtype=torch.int64)  # (G, S)
            at = 0
            for g, (_, docs, _) in enumerate(examples):
                groups[g, : len(docs)] = torch.arange(at, at + len(docs))
                at += len(docs)
        return PairBatch(ids, types, mask, labels, groups)

    # -- what the trainer asks ---------------------------------------------------------------

    def build_model(self) -> PairScorer:
        return PairScorer(copy.deepcopy(self.base_model), copy.deepcopy(self.base_head)).train()

    def train_batch(self, indices: Sequence[int]) -> PairBatch:
        return self._collate([self.train_examples[i] for i in indices])

    def loss_sum(self, logits: Tensor, batch: PairBatch) -> Tensor:
        """Summed over the batch's examples: binary cross-entropy with positives weighed by
        ``pos_weight`` (bce), or each row's softmax cross-entropy (listwise)."""
        if batch.groups is not None:
            return listwise_loss_sum(logits, batch.groups)
        weight = torch.tensor(self.pos_weight, device=logits.device)
        return F.binary_cross_entropy_with_logits(
            logits.float(), batch.labels, pos_weight=weight, reduction="sum"
        )

    def eval_batches(self, batch_size: int) -> Iterator[PairBatch]:
        for start in range(0, len(self.eval_examples), batch_size):
            yield self._collate(self.eval_examples[start : start + batch_size])

    @torch.no_grad()
    def evaluate(self, model, *, batch_size: int, precision, metrics, device) -> dict[str, float]:
        from ..distributed import unwrap

        model = unwrap(model)
        if self.eval_data is None:
            return self._held_out(model, batch_size, precision, device)
        from ...retrieval import evaluate_run, mean_measures
        from ...retrieval.stages import rerank_run

        first = self._first_stage_run()
        cross = self.cross_encoder(model.state_dict())
        data = self.eval_data
        run = rerank_run(
            first,
            dict(zip(data.query_ids, data.query_texts, strict=True)),
            dict(zip(data.corpus_ids, data.corpus_texts, strict=True)),
            lambda pairs: cross.predict(pairs, activation="identity"),
            self.config.rerank_top,
            fusion=self.config.rerank_fusion,
        )
        return mean_measures(evaluate_run(run, data.qrels, self.metrics))

    def _first_stage_run(self):
        """The fixed first stage's run, computed once: the retriever does not train."""
        if self._first_stage is None:
            from ...retrieval import EvalSettings, evaluate
            from ...text import TextEncoder
            from ..rng import rng_state, set_rng_state

            retriever = None if self.config.retriever == "bundled" else self.config.retriever
            # Loading the retriever draws from the global generators (its layers are made
            # before its weights are read). Built at the first evaluation, which is step 0's
            # in a whole run and a later one in a resumed run: the training's draws must not
            # depend on which.
            state = rng_state()
            try:
                # As deep as the reranker reaches: a first stage of 100 would cap a
                # --rerank-top above it without a word.
                settings = EvalSettings(depth=max(EvalSettings().depth, self.config.rerank_top))
                result = evaluate(self.eval_data, TextEncoder.from_pretrained(retriever), settings)
            finally:
                set_rng_state(state)
            self._first_stage = result.run
            log.info("rerank: first stage ndcg@10 %.4f", result.metrics["ndcg@10"])
        return self._first_stage

    def _held_out(self, model, batch_size, precision, device) -> dict[str, float]:
        was_training = model.training
        model.eval()
        total, right, count = 0.0, 0, 0
        for batch in self.eval_batches(batch_size):
            batch = batch.to(device)
            with precision.autocast():
                logits = model(batch).float()
            total += self.loss_sum(logits, batch).item()
            if batch.groups is None:  # each pair on the right side of 0
                right += int(((logits > 0).float() == batch.labels).sum())
                count += len(batch.labels)
            else:  # each row's positive above its negatives
                right += int((group_scores(logits, batch.groups).argmax(dim=1) == 0).sum())
                count += len(batch.groups)
        model.train(was_training)
        return {"loss": total / max(count, 1), "accuracy": right / max(count, 1)}

    def cross_encoder(self, weights: dict):
        """A :class:`~clearformer.CrossEncoder` holding ``weights`` (a PairScorer's)."""
        import tempfile

        from ...text import CrossEncoder

        with tempfile.TemporaryDirectory(prefix="clearformer-rerank-") as folder:
            self._write(weights, Path(folder))
            return CrossEncoder.from_pretrained(folder)

    def _write(self, weights: dict, directory: Path) -> Path:
        from ...interop.hf.classifier_saving import save_classifier

        scorer = self.build_model()
        scorer.load_state_dict({k: v.detach().cpu() for k, v in weights.items()})
        out = save_classifier(
            scorer.model, scorer.head, directory, self.family, self.hf_config, self.files.path
        )
        # The base cross-encoder's sentence-transformers files, where it has them: its score
        # activation (an identity one would otherwise become a plain classifier's sigmoid),
        # which sentence-transformers reads only beside its modules.json.
        if _saved_as_cross_encoder(self.files.path):  # not an embedding model's modules
            for name in ST_CROSS_ENCODER_FILES:
                source = self.files.path / name
                if source.is_file() and not (out / name).exists():
                    (out / name).write_bytes(source.read_bytes())
        # The pairs were cut to the tokenizer's max length in training: the directory says so,
        # so that every library that loads it cuts them the same way.
        record_max_length(out, self.tokenizer.max_length)
        return out

    def export(self, weights: dict, run_dir: Path) -> None:
        """``RUN/model/``: the best checkpoint's weights (else the final ones)."""
        from .. import checkpoint as ckpt

        best = ckpt.read_pointer(run_dir / "checkpoints", ckpt.BEST)
        if best is not None:
            loaded = ckpt.load_checkpoint(run_dir / "checkpoints" / best)
            if loaded.weights is not None:
                weights = loaded.weights
        self._write(weights, run_dir / "model")

    def describe(self) -> dict:
        labels = [label for _, _, row_labels in self.train_examples for label in row_labels]
        return {
            "task": self.name,
            "loss": self.config.rerank_loss,
            "train_file": self.config.train_file,
            "train_examples": len(self.train_examples),
            "train_pairs": len(labels),
            "positives": sum(labels),
            "pos_weight": self.pos_weight,
            "model": str(self.files.path),
            "max_length": self.tokenizer.max_length,
        }


def _saved_as_cross_encoder(path: Path) -> bool:
    """Whether sentence-transformers saved ``path`` as a CrossEncoder (its config says so)."""
    import json

    config = path / "config_sentence_transformers.json"
    try:
        settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, ValueError):
        return False
    return isinstance(settings, dict) and settings.get("model_type") == "CrossEncoder"
