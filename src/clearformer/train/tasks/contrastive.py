"""``contrastive``: fine-tune an embedding model for retrieval on (anchor, positive, negatives).

The loss is in-batch negatives plus the rows' hard negatives (:mod:`..contrastive_loss`),
optionally symmetric and at several Matryoshka widths; GradCache (:mod:`..gradcache`,
``mini_batch_size``) makes a large batch fit in memory; batches never hold one text twice
(:mod:`..duplicate_free_sampler`). With ``eval_data`` (a BEIR folder), the model is scored
before training and at every evaluation by ``clearformer eval``'s own code (NDCG@10 picks the
best checkpoint and drives early stopping); without it, a held-out ``eval_fraction`` of the rows
is scored by the loss. The run's model is written to ``RUN/model/`` as a sentence-transformers
directory (the best checkpoint's weights when there is one) with a model card.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from ..collate import pack_sequences
from ..config import TrainConfig
from ..contrastive_loss import matryoshka_loss, multiple_negatives_loss
from ..duplicate_free_sampler import DuplicateFreeSampler
from ..gradcache import contrastive_step
from ..models import SentenceEmbedder
from ..pairs import Pair, read_pairs
from .model_files import training_length

log = logging.getLogger(__name__)

RETRIEVAL_METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100")


def matryoshka_dimensions(text: str, width: int) -> tuple[int, ...]:
    """``"384,256,128"`` -> (384, 256, 128), each in [1, width]; "" -> ()."""
    if not text.strip():
        return ()
    try:
        dims = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"matryoshka_dims must be comma-separated integers, got {text!r}"
        ) from None
    for d in dims:
        if not 1 <= d <= width:
            raise ValueError(f"matryoshka_dims must be in [1, {width}] (the width), got {d}")
    return dims


class ContrastiveTask:
    name = "contrastive"

    def __init__(self, config: TrainConfig) -> None:
        from ...interop.hf.tokenizer import TextTokenizer
        from ...text.encoder_files import read_encoder_parts

        self.config = config
        pairs = read_pairs(config.train_file)
        self.parts = read_encoder_parts(
            None if config.model == "bundled" else config.model,
            backend="auto",
            strict=True,
            padding_side=None,
            truncate_dim=None,
        )
        model_config = self.parts.loaded.model.config
        self.dims = matryoshka_dimensions(config.matryoshka_dims, self.parts.head.width)
        pad_id = model_config.pad_token_id if model_config.pad_token_id is not None else 0
        max_length = training_length(config.max_length, model_config.max_length)
        self.tokenizer = TextTokenizer.from_files(
            self.parts.loaded.files, max_length, pad_id, vocab_size=model_config.vocab_size
        )
        self.metric, reported = self.reported_metrics(config)
        self.metrics = tuple(m for m in reported if m != "loss")  # measures beside the loss
        if config.eval_data:
            from ...retrieval import load_beir

            self.eval_data = load_beir(config.eval_data, config.eval_split)
            self.train_pairs, self.eval_pairs = pairs, []
            self.evaluate_before_training = True
        else:
            self.eval_data = None
            self.train_pairs, self.eval_pairs = _split(
                pairs, config.eval_fraction, config.split_seed
            )
            self.evaluate_before_training = False
        self.labels = ()
        self._ids: dict[str, list[int]] = {}
        self._tokenize([*self.train_pairs, *self.eval_pairs])
        self.train_lengths = [
            len(self._ids[self._query(p.anchor)]) + len(self._ids[self._document(p.positive)])
            for p in self.train_pairs
        ]

    @staticmethod
    def reported_metrics(config: TrainConfig) -> tuple[str, tuple[str, ...]]:
        """(the default metric, what an evaluation reports): with ``eval_data`` the retrieval
        measures of its queries (no loss: nothing is held out), else the held-out rows' loss."""
        if config.eval_data:
            return "ndcg@10", RETRIEVAL_METRICS
        return "loss", ("loss",)

    # -- texts -------------------------------------------------------------------------------

    def _query(self, text: str) -> str:
        return self.config.query_prompt + text

    def _document(self, text: str) -> str:
        return self.config.document_prompt + text

    def _negatives(self, pair: Pair) -> tuple[str, ...]:
        limit = self.config.negatives
        return pair.negatives[:limit] if limit > 0 else pair.negatives

    def _tokenize(self, pairs: Sequence[Pair]) -> None:
        texts = {self._query(p.anchor) for p in pairs}
        texts |= {self._document(t) for p in pairs for t in (p.positive, *self._negatives(p))}
        ordered = sorted(texts)
        for text, encoding in zip(ordered, self.tokenizer.encode(ordered), strict=True):
            self._ids[text] = list(encoding.ids)

    def _texts(self, pairs: Sequence[Pair]) -> tuple[list[list[int]], tuple[int, int, int]]:
        anchors = [self._ids[self._query(p.anchor)] for p in pairs]
        positives = [self._ids[self._document(p.positive)] for p in pairs]
        negatives = [self._ids[self._document(t)] for p in pairs for t in self._negatives(p)]
        return anchors + positives + negatives, (len(anchors), len(positives), len(negatives))

    @staticmethod
    def _collate(ids: Sequence[Sequence[int]]):
        return pack_sequences(ids, [0] * len(ids))  # no padding; the labels are unused

    def loss_fn(self, anchors, candidates):
        options = {"scale": self.config.scale, "symmetric": self.config.symmetric}
        if self.dims:
            return matryoshka_loss(anchors, candidates, self.dims, **options)
        return multiple_negatives_loss(anchors, candidates, **options)

    # -- what the trainer asks ---------------------------------------------------------------

    def build_model(self) -> SentenceEmbedder:
        parts = copy.deepcopy(self.parts)  # the task keeps the base weights for its export
        return SentenceEmbedder(parts.loaded.model, parts.head).train()

    def make_sampler(self, batch_size: int, seed: int) -> DuplicateFreeSampler:
        texts = [(p.anchor, p.positive, *self._negatives(p)) for p in self.train_pairs]
        try:
            return DuplicateFreeSampler(texts, batch_size, seed=seed)
        except ValueError as exc:  # the rows share too many texts: the file is the cause
            raise ValueError(f"train_file {self.config.train_file}: {exc}") from None

    def train_step(self, model, indices, *, context, **step_options) -> tuple[float, float]:
        step_options.pop("accumulation", None)  # GradCache's mini-batches replace it
        step_options.pop("step", None)
        local = context.shard(list(indices))
        texts, counts = self._texts([self.train_pairs[i] for i in local])
        return contrastive_step(
            model,
            texts,
            counts,
            self._collate,
            self.loss_fn,
            mini_batch_size=self.config.mini_batch_size,
            context=context,
            **step_options,
        )

    def train_batch(self, indices: Sequence[int]):
        texts, _ = self._texts([self.train_pairs[i] for i in indices])
        return self._collate(texts)

    def eval_batches(self, batch_size: int) -> Iterator:
        return iter(())

    @torch.no_grad()
    def evaluate(self, model, *, batch_size: int, precision, metrics, device) -> dict[str, float]:
        from ..distributed import unwrap

        model = unwrap(model)
        if self.eval_data is None:
            return {"loss": self._held_out_loss(model, batch_size, precision, device)}
        from ...retrieval import EvalSettings, evaluate

        # Queries and documents embedded as in training: with its prompts, where it had any.
        settings = EvalSettings(
            measures=self.metrics,
            query_prompt_name="query" if self.config.query_prompt else None,
            document_prompt_name="document" if self.config.document_prompt else None,
        )
        result = evaluate(self.eval_data, self.text_encoder(model.state_dict()), settings)
        return dict(result.metrics)

    def _held_out_loss(self, model, batch_size, precision, device) -> float:
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        for start in range(0, len(self.eval_pairs), batch_size):
            chunk = self.eval_pairs[start : start + batch_size]
            texts, (b, _, _) = self._texts(chunk)
            with precision.autocast():
                embeddings = model(self._collate(texts).to(device)).float()
            candidates = embeddings[b:]
            total += self.loss_fn(embeddings[:b], candidates).item() * b
            count += b
        model.train(was_training)
        return total / max(count, 1)

    def text_encoder(self, weights: dict):
        """A :class:`~clearformer.TextEncoder` holding ``weights`` (a SentenceEmbedder's) that
        embeds texts as the training did: cut to its ``max_length``, its prompts named
        ``query`` and ``document``, and no default prompt (the training put none before its
        texts)."""
        from ...interop.hf.sentence_transformers import Prompts
        from ...text import TextEncoder

        parts = copy.deepcopy(self.parts)
        embedder = SentenceEmbedder(parts.loaded.model, parts.head)
        embedder.load_state_dict({k: v.detach().cpu() for k, v in weights.items()})
        embedder.eval()  # the weights loaded in place: parts now hold the trained model and head
        parts.tokenizer = self.tokenizer  # the checkpoint's, cut at the training's max_length
        parts.prompts = Prompts(self._prompts())
        return TextEncoder.from_parts(parts)

    def _prompts(self) -> dict[str, str]:
        """The training's prompts under the names sentence-transformers' ``encode_query`` and
        ``encode_document`` look for ("": none, which it applies as none)."""
        return {"query": self.config.query_prompt, "document": self.config.document_prompt}

    def export(self, weights: dict, run_dir: Path) -> None:
        """``RUN/model/``: the best checkpoint's weights (else the final ones) as a
        sentence-transformers directory, with a model card."""
        from .. import checkpoint as ckpt
        from .contrastive_card import write_model_card

        chosen, source = weights, "final"
        best = ckpt.read_pointer(run_dir / "checkpoints", ckpt.BEST)
        if best is not None:
            loaded = ckpt.load_checkpoint(run_dir / "checkpoints" / best)
            if loaded.weights is not None:
                chosen, source = loaded.weights, best
        out = self.text_encoder(chosen).save_pretrained(run_dir / "model")
        self._record_settings(out)
        write_model_card(out, self, run_dir, source)

    def _record_settings(self, out: Path) -> None:
        """What the training did to texts, in the files every loader reads: the length they
        were cut to, and its prompts as the query and document prompts (so that
        ``encode_query`` / ``encode_document`` add them; the base's other prompts are kept)."""
        from ...interop.hf.sentence_transformers import prompts_from_files
        from .model_files import record_max_length, update_json

        record_max_length(out, self.tokenizer.max_length)
        path = out / "config_sentence_transformers.json"
        prompts = prompts_from_files(out).prompts if path.is_file() else {}
        update_json(path, {"prompts": {**prompts, **self._prompts()}})

    def describe(self) -> dict:
        negatives = sum(len(self._negatives(p)) for p in self.train_pairs)
        return {
            "task": self.name,
            "train_file": self.config.train_file,
            "train_rows": len(self.train_pairs),
            "hard_negatives": negatives,
            "eval": (
                {
                    "data": str(self.eval_data.folder),
                    "split": self.eval_data.split,
                    "queries": len(self.eval_data.query_ids),
                }
                if self.eval_data is not None
                else {"held_out_rows": len(self.eval_pairs)}
            ),
            "model": str(self.parts.loaded.files.path),
            "max_length": self.tokenizer.max_length,
            "loss": {
                "scale": self.config.scale,
                "symmetric": self.config.symmetric,
                "matryoshka_dims": list(self.dims),
                "mini_batch_size": self.config.mini_batch_size,
            },
        }

    def run_files(self) -> dict[str, bytes]:
        return {}


def _split(pairs: list[Pair], fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """Rows held out by anchor (every row of one anchor on the same side)."""
    anchors = sorted({p.anchor for p in pairs})
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(anchors), generator=generator).tolist()
    held = {anchors[i] for i in order[: max(1, round(fraction * len(anchors)))]}
    if len(held) == len(anchors):
        raise ValueError("train_file has too few distinct anchors to hold some out")
    return [p for p in pairs if p.anchor not in held], [p for p in pairs if p.anchor in held]
