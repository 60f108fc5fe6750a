"""``CrossEncoder``: (text, text) pairs in, relevance scores out, on a pretrained
``*ForSequenceClassification`` checkpoint (a reranker).

A cross-encoder reads both texts of a pair together, so it scores how well they go together
(a query and a passage) better than two separate embeddings can, at the price of one forward
pass per pair. The pipeline is :class:`~clearformer.text.TextEncoder`'s (tokenize once, sort by
length, batch to a token budget, put rows back in input order) with the checkpoint's pair
template and its classification head (:class:`~clearformer.heads.SequenceClassifier`) in place
of pooling; the scores are ``sentence_transformers.CrossEncoder.predict``'s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..checks import check_bool, check_choice, check_positive_int
from ..devices import check_device, model_device
from ..fast.reordered_weights import (
    REORDER_MIN_TOKENS,
    KeptReordering,
    ReorderedWeights,
    use_reordered_weights,
)
from ..heads import SequenceClassifier
from ..interop.hf import LoadReport, TextTokenizer, find_checkpoint
from ..interop.hf.heads import LoadedClassifier, load_classifier, read_classifier
from ..interop.hf.sentence_transformers import Prompts, prompts_from_files, score_activation
from ..interop.hf.tokenizer import check_pairs, check_texts, max_length_for
from ..model import EncoderModel
from ..options import Decision
from ..precision.names import CROSS_ENCODER_PRECISIONS
from .batching import (
    DEFAULT_MAX_TOKENS,
    balance_batches,
    check_batch_limits,
    plan_batches,
)
from .kernel_builds import attention_kernel_for, attention_work
from .llm_reranker import is_causal_lm, load_llm_reranker
from .precisions import Precisions, held_precision
from .prompts import choose_prompt
from .workers import auto_workers, check_workers, map_in_workers

log = logging.getLogger(__name__)

OFFERED = CROSS_ENCODER_PRECISIONS  # the precisions predict runs

# What predict may apply to the logits, by name: (B, L) -> (B, L).
ACTIVATIONS = {
    "sigmoid": torch.sigmoid,
    "identity": lambda x: x,
    "tanh": torch.tanh,
}


class CrossEncoder:
    """A pretrained encoder with its classification head and tokenizer, scoring text pairs.

    Attributes:
        model: the :class:`~clearformer.EncoderModel`, in eval mode.
        head: the :class:`~clearformer.heads.SequenceClassifier`, in eval mode.
        num_labels: scores per pair (1 for a reranker).
        labels: the label names from config.json (empty when it names none).
        activation: what :meth:`predict` applies to the logits by default: ``sigmoid`` for one
            label, ``identity`` for several, unless the checkpoint's sentence-transformers
            config names another (as sentence-transformers decides).
        max_length: pairs are truncated to this many pieces, special tokens included.
        path: the checkpoint directory.
        report: what the load did, the head's tensors included.
        prompts: the checkpoint's named prompts and its default one, for ``predict``.
    """

    def __init__(
        self,
        loaded: LoadedClassifier,
        tokenizer: TextTokenizer,
        activation: str,
        prompts: Prompts | None = None,
        held: Decision | None = None,
        held_as: str | None = None,
        device: torch.device | None = None,
    ):
        if held is not None and held.choice == "bf16":
            # The bfloat16 encoder and head alone: the float32 ones go once copied.
            from ..precision import bf16_copy

            model, head = bf16_copy(loaded.loaded.model), bf16_copy(loaded.head)
            loaded = dataclasses.replace(
                loaded, loaded=dataclasses.replace(loaded.loaded, model=model), head=head
            )
        if held is not None and held.choice == "int8-blocks":
            # The encoder's linear layers converted in place (the float32 ones go); the small
            # classification head stays float32.
            from .int8_models import int8_blocks_model

            int8_blocks_model(loaded.loaded.model, in_place=True)
        if device is not None:  # after the bf16 copy: never float32 and bf16 on the device
            place(loaded, device)
        self._loaded = loaded
        self.prompts = Prompts() if prompts is None else prompts
        self.model: EncoderModel = loaded.loaded.model
        self.head: SequenceClassifier = loaded.head
        self.tokenizer = tokenizer
        self.activation = activation
        self.num_labels: int = loaded.head.config.num_labels
        self.labels: tuple[str, ...] = loaded.head.config.labels
        self.max_length = tokenizer.max_length
        self.path: Path = loaded.loaded.files.path
        self.report: LoadReport = loaded.loaded.report
        # Token types go in only where the model was trained with more than one: RoBERTa-style
        # tables have a single row, ModernBERT none, and their tokenizers (in transformers) do
        # not return token_type_ids even when a tokenizer.json template numbers the segments.
        self._token_types = self.model.config.type_vocab_size > 1
        self._reordering = KeptReordering(
            self.model
        )  # weights in oneDNN's layout, once calls repay it
        # int8 (per-row activations) is for embeddings: scores take float32, bf16 or
        # int8-blocks, whose rounding is about a quarter of int8's.
        self._precisions: Precisions[tuple[EncoderModel, SequenceClassifier]] = Precisions(
            OFFERED,
            lambda: self.device,
            self._copy_bf16,
            held=held,
            held_as=held_as,
            copy_int8_blocks=self._copy_int8_blocks,
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        backend: str = "auto",
        strict: bool = True,
        precision: str | None = None,
        device: str | torch.device | None = None,
    ) -> CrossEncoder:
        """Load a ``*ForSequenceClassification`` checkpoint directory, or a ``*ForCausalLM``
        reranker (Qwen3-Reranker: its chat template, its yes/no logits; see
        :mod:`~.llm_reranker`).

        ``precision``: None = the float32 model, and a call may ask for bf16 or int8-blocks (the
        copy is then built and kept beside it); ``"float32"``, ``"bf16"``, ``"int8-blocks"``
        or ``"auto"`` (decided now): that precision's model and head alone (the float32 ones
        let go once converted), every call runs it, and a call asking for another is refused.

        ``device``: where the model and head run (None: the CPU; ``"cuda"``, ``"cuda:1"``, a
        ``torch.device``), checked before any weight is read; pairs are tokenized on the CPU,
        each padded batch goes to the device, and ``predict`` returns NumPy arrays.

        Raises:
            FileNotFoundError: no such directory.
            CheckpointError: a checkpoint without a classification head (say, a
                sentence-embedding model), or an incomplete, unsupported or mismatched one.
        """
        device = check_device(device)
        held, held_as = held_precision(precision, OFFERED, device)
        started = time.perf_counter()
        files = find_checkpoint(path)
        prompts = prompts_from_files(files)
        if is_causal_lm(files):  # a *ForCausalLM reranker: scored by its yes/no logits
            loaded, tokenizer, activation = load_llm_reranker(files, backend=backend, strict=strict)
            log.info("loaded LLM reranker %s in %.2fs", files.path, time.perf_counter() - started)
            return cls(loaded, tokenizer, activation, prompts, held, held_as, device)
        # The tokenizer and the score activation from the config files alone: a refusal comes
        # before the weights are read, which can take minutes.
        _, config, layout = read_classifier(files, backend)
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        tokenizer = TextTokenizer.from_files(
            files, max_length_for(files, config.max_length), pad_id, vocab_size=config.vocab_size
        )
        activation = score_activation(files, layout.config.num_labels)
        loaded = load_classifier(files, backend=backend, strict=strict)
        log.info("loaded cross-encoder %s in %.2fs", files.path, time.perf_counter() - started)
        return cls(loaded, tokenizer, activation, prompts, held, held_as, device)

    def logits(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor,
        *,
        precision: str | None = None,
        backend: str | None = None,
        rows_alone: bool = False,
    ) -> Tensor:
        """(B, T) ids, bool mask and token types -> (B, L) float32 logits, computed in
        ``precision`` (``"float32"``, ``"bf16"``, ``"int8-blocks"`` or ``"auto"``, as
        :meth:`predict` takes it), on
        ``backend`` (None: the model's); ``rows_alone``: a row's logits must not depend on its
        batch-mates (the plan packs a batch with padding)."""
        chosen = self._precisions.decide(self._precisions.check(precision)).choice
        if chosen == "int8-blocks":
            model, head = self._precisions.int8_blocks()
        else:
            model, head = self.bf16_model() if chosen == "bf16" else (self.model, self.head)
        types = token_type_ids if self._token_types else None
        hidden = model(
            input_ids, attention_mask, types, backend=backend, rows_alone=rows_alone
        )  # (B, T, D)
        return head(hidden, attention_mask).float()  # (B, L)

    def precision_for(self, precision: str | None = "auto") -> Decision:
        """The precision ``predict(precision=...)`` runs in here, and why (``"auto"``: bf16
        where :func:`clearformer.precision.auto_precision` takes it, else float32)."""
        return self._precisions.decide(self._precisions.check(precision))

    def bf16_model(self) -> tuple[EncoderModel, SequenceClassifier]:
        """The bfloat16 copies of :attr:`model` and :attr:`head` that
        ``predict(precision="bf16")`` runs, built once (:func:`clearformer.precision.bf16_copy`);
        the float32 ones are not changed. One loaded with ``precision="bf16"`` holds them as
        :attr:`model` and :attr:`head`."""
        self._precisions.check("bf16")
        return self._precisions.bf16()

    def int8_blocks_model(self) -> EncoderModel:
        """The encoder with int8-blocks linear layers that ``predict(precision="int8-blocks")``
        runs (:mod:`clearformer.quant.int8_blocks`; the head stays float32), built once; one
        loaded with ``precision="int8-blocks"`` holds it as :attr:`model`."""
        return self._precisions.int8_blocks()[0]

    def _copy_int8_blocks(self) -> tuple[EncoderModel, SequenceClassifier]:
        if self._precisions.held is not None:  # loaded in int8-blocks: the model is converted
            return self.model, self.head
        from .int8_models import int8_blocks_model

        return int8_blocks_model(self.model), self.head

    def _copy_bf16(self) -> tuple[EncoderModel, SequenceClassifier]:
        from ..precision import bf16_copy

        if self._precisions.held is not None:  # loaded in bf16: these are the copies
            return self.model, self.head
        return bf16_copy(self.model), bf16_copy(self.head)

    @property
    def device(self) -> torch.device:
        """Where the model runs (``from_pretrained(device=...)``; the CPU by default)."""
        return model_device(self.model)

    def predict(
        self,
        pairs: list[tuple[str, str]],
        batch_size: int | None = None,
        *,
        activation: str | None = None,
        apply_softmax: bool = False,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        workers: int | None = None,
        precision: str | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> np.ndarray:
        """Scores of (first, second) text pairs, as ``sentence_transformers.CrossEncoder``
        ``.predict`` gives them.

        Args:
            pairs: the pairs (an empty list gives an empty array).
            batch_size: pairs per forward pass; None = as many as fit in ``max_tokens``.
            activation: applied to the logits: ``sigmoid``, ``identity`` or ``tanh``; None =
                :attr:`activation` (the checkpoint's default).
            apply_softmax: with several labels, softmax over them after the activation.
            max_tokens: padded tokens per forward pass when ``batch_size`` is None.
            workers: forward passes run side by side on a CPU, its threads split between
                them, as ``TextEncoder.encode`` does (:mod:`clearformer.text.workers`); 1 = one
                at a time; None = two on a CPU with at least two threads and two batches or
                more. With more than one worker and no ``batch_size``, the batches are cut
                again into a multiple of the workers of about equal cost
                (:func:`~clearformer.text.batching.balance_batches`). A pair's score does not
                depend on its batch-mates, so the scores are the same either way (to float32
                rounding: a thread count can change how a kernel splits its sums).
            precision: ``"float32"``; ``"bf16"`` (or ``"bfloat16"``): :meth:`bf16_model`,
                bfloat16 matrix products with float32 norms and softmax, logits in float32;
                ``"int8-blocks"``: :meth:`int8_blocks_model`, int8 weights scaled per block of
                32 and int16 activations (CPU only; float32 where its kernel cannot run);
                ``"auto"``: bf16 where this CPU runs it faster (:meth:`precision_for` says
                which and why; logged at INFO level); None = the precision the model was
                loaded in (``from_pretrained(precision=...)``), else float32.
            prompt: text put before each first text (an LLM reranker's instruction: a system
                message of its chat template); ``prompt_name``: one of :attr:`prompts`; with
                neither, the checkpoint's default prompt, if any (sentence-transformers' rule).

        Returns:
            float32 (n,) with one label, (n, L) with L labels; row i for ``pairs[i]``.
        """
        pairs = check_pairs(pairs)
        check_batch_limits(batch_size, max_tokens)
        check_bool(apply_softmax, "apply_softmax")
        name = self.activation if activation is None else activation
        check_choice(name, tuple(ACTIVATIONS), "activation")  # TypeError for a non-str
        check_workers(workers)
        precision = self._precisions.check(precision)  # before any work
        chosen_prompt = choose_prompt(self.prompts, prompt, prompt_name)
        n, L = len(pairs), self.num_labels
        out = np.empty((n, L), dtype=np.float32)
        encodings = self.tokenizer.encode_pairs(pairs, prompt=chosen_prompt) if n else []
        lengths = [len(e.ids) for e in encodings]
        tokens = sum(lengths)
        device = self.device
        chosen = self._precisions.decide(precision).choice if n else "float32"
        work = attention_work(lengths, getattr(self.model, "config", None))
        attention_kernel_for(tokens, device, attention=work)
        batches = plan_batches(lengths, batch_size, max_tokens)
        if workers is None:
            workers = auto_workers(len(batches), device)
        if batch_size is None:  # a batch size the caller named is kept as it is
            d_model = self.model.config.d_model
            batches = balance_batches(lengths, batches, workers, d_model, max_tokens)
        # Each weight reordered for oneDNN once and kept for later calls, once calls repay it.
        packed = self._reordering.for_call(tokens)

        if n:
            log.info("predict: %d pairs in %s", n, chosen)

        def score(rows: list[int]) -> tuple[list[int], np.ndarray]:
            chosen = [encodings[i] for i in rows]
            return rows, self._forward(chosen, packed, name, apply_softmax, precision)

        for rows, scores in map_in_workers(score, batches, workers):
            out[rows] = scores
        return out[:, 0] if L == 1 else out

    def score_batch(
        self,
        encodings: list,
        *,
        activation: str | None = None,
        apply_softmax: bool = False,
        precision: str | None = None,
    ) -> np.ndarray:
        """One forward pass over pairs already tokenized (``tokenizer.encode_pairs``), as
        :meth:`predict` runs each of its batches: (B, L) float32, row i for ``encodings[i]``.

        For callers that form their own batches, such as ``clearformer serve``, which merges
        the pairs of many requests: the same code as ``predict``'s, and a row does not depend
        on its batch-mates, so the rows are ``predict``'s for the same pairs. Safe to call from
        several threads at once.
        """
        name = self.activation if activation is None else activation
        check_choice(name, tuple(ACTIVATIONS), "activation")
        check_bool(apply_softmax, "apply_softmax")
        precision = self._precisions.check(precision)
        if not encodings:
            return np.empty((0, self.num_labels), dtype=np.float32)
        packed = self._reordering.for_call(sum(len(e.ids) for e in encodings))
        return self._forward(encodings, packed, name, apply_softmax, precision)

    def _forward(
        self,
        encodings: list,
        packed: ReorderedWeights | None,
        activation: str,
        apply_softmax: bool,
        precision: str,
    ) -> np.ndarray:
        """Pad, run the model and the head, apply the activation: (B, L) float32 (predict's
        and score_batch's one path)."""
        batch = self.tokenizer.pad(encodings, with_tokens=False)
        device = self.device
        ids, mask, types = (
            t.to(device) for t in (batch.input_ids, batch.attention_mask, batch.token_type_ids)
        )  # (B, T) each; mask bool
        # A row's score must not depend on its batch-mates (score_batch): packed wherever the
        # batch has padding, as encode's batches are.
        # Grad mode and the reordered weights are per thread: each worker enters both itself.
        with torch.inference_mode(), use_reordered_weights(packed):
            logits = self.logits(
                ids,
                mask,
                types,
                precision=precision,
                rows_alone=True,
            )  # (B, L) float32
            scores = ACTIVATIONS[activation](logits)
            if apply_softmax and self.num_labels > 1:
                scores = torch.softmax(scores, dim=-1)
        return scores.float().cpu().numpy()

    def keep_weights_reordered(self) -> None:
        """Keep the linear weights in oneDNN's layout from now on, as ``predict`` does once its
        calls have carried :data:`~clearformer.fast.reordered_weights.REORDER_MIN_TOKENS`
        tokens: for a long-lived caller of many small calls (``clearformer serve``), whose calls
        then take
        the same products from the first one on (where clearformer's AVX-512 library is
        loaded, reordered weights route some products to its kernel, which rounds differently)."""
        self._reordering.for_call(REORDER_MIN_TOKENS)

    def drop_reordered_weights(self) -> None:
        """Free the copies of the linear weights that ``predict`` keeps in oneDNN's layout
        (:class:`~clearformer.fast.reordered_weights.KeptReordering`)."""
        self._reordering.drop()

    def rank(
        self,
        query: str,
        documents: list[str],
        top_k: int | None = None,
        **predict_options,
    ) -> list[tuple[int, float]]:
        """(index into ``documents``, score) of the best-scoring documents for ``query``,
        highest first; equal scores keep the documents' order. Needs a one-label head."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        documents = check_texts(documents, "documents")
        check_positive_int(top_k, "top_k", optional=True)
        if self.num_labels != 1:
            raise ValueError(
                f"rank needs one score per pair, but this cross-encoder's head gives "
                f"num_labels={self.num_labels}; use predict() for per-label scores"
            )
        scores = self.predict([(query, d) for d in documents], **predict_options)  # (n,)
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [(int(i), float(scores[i])) for i in order]

    def encode(self, *args, **kwargs):
        """Not available: a cross-encoder scores pairs and has no embeddings to give."""
        raise TypeError(
            f"CrossEncoder scores text pairs (predict, rank) and does not embed texts; load an "
            f"embedding checkpoint with TextEncoder.from_pretrained for encode (got {self.path})"
        )

    def __repr__(self) -> str:
        return (
            f"CrossEncoder(path={str(self.path)!r}, architecture="
            f"{self._loaded.loaded.architecture.model_type!r}, num_labels={self.num_labels}, "
            f"activation={self.activation!r}, max_length={self.max_length})"
        )


def place(loaded: LoadedClassifier, device: torch.device) -> LoadedClassifier:
    """``loaded``'s encoder and head moved to ``device`` (in place; returned for chaining)."""
    loaded.loaded.model.to(device)
    loaded.head.to(device)
    return loaded
