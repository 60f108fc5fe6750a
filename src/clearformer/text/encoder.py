"""``TextEncoder``: texts in, sentence embeddings out, on a pretrained BERT-family checkpoint.

The pipeline: tokenize every text once; sort by length so each batch holds texts of similar
length; run each batch through :class:`~clearformer.EncoderModel` (which packs the real tokens
of a ragged batch, so padding costs nothing); pool; normalise; put rows back in input order.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..checks import check_bool, check_choice
from ..config import EncoderConfig
from ..devices import check_device, model_device
from ..fast.reordered_weights import (
    KeptReordering,
    ReorderedWeights,
    use_reordered_weights,
)
from ..heads import POOLING_MODES, pool
from ..heads.sentence import SentenceHead, SentenceHeadConfig
from ..interop.hf import (
    LoadedModel,
    LoadReport,
    TextTokenizer,
    TokenBatch,
)
from ..interop.hf.sentence_transformers import Prompts
from ..interop.hf.tokenizer import check_texts
from ..model import EncoderModel
from ..options import Decision
from ..precision.names import is_int8
from .batching import (
    balance_batches,
    check_batch_limits,
    default_max_tokens,
    plan_batches,
)
from .encoder_files import EncoderParts, place_parts, read_encoder_parts, write_encoder_files
from .encoder_precision import EncoderPrecisionMethods
from .kernel_builds import attention_kernel_for, attention_work
from .precision_models import OFFERED, PrecisionModels
from .precisions import held_precision
from .progress import ProgressFn, check_progress, progress_reporter
from .prompts import choose_prompt, prompt_length
from .workers import auto_workers, check_workers, map_in_workers

log = logging.getLogger(__name__)

# encode(precision="int8") compiles the int8 layers' element-wise steps (a one-time cost per
# process: seconds with Inductor's disk cache warm, about half a minute cold; docs/int8.md) for
# calls of at least this many tokens (word pieces, special tokens included), where the time
# they save per token repays a warm compile within the call. Counted in tokens, not texts: the
# saving is per token, and texts differ in length by a hundredfold.
FUSED_INT8_MIN_TOKENS = 500_000


class TextEncoder(EncoderPrecisionMethods):
    """A pretrained encoder with its tokenizer and pooling.

    Attributes:
        model: the :class:`~clearformer.EncoderModel`, in eval mode: float32, or the one model
            of the precision the encoder was loaded in (``from_pretrained(precision=...)``).
        config: its :class:`~clearformer.EncoderConfig`.
        pooling: one of :data:`clearformer.heads.POOLING_MODES` (``"mean"``, ``"cls"``,
            ``"weightedmean"``, ...).
        head: the :class:`~clearformer.heads.sentence.SentenceHead`: the pooling, then the
            checkpoint's sentence-transformers ``Dense`` and ``Normalize`` modules.
        include_prompt: whether a ``prompt`` given to :meth:`encode` counts in the pooling
            (the checkpoint's pooling config says; false leaves its tokens out).
        normalize: whether :meth:`encode` L2-normalises by default (the checkpoint's
            sentence-transformers modules end in ``Normalize``).
        truncate_dim: the width :meth:`encode` cuts embeddings to by default (Matryoshka);
            None = the full width.
        max_length: texts are truncated to this many pieces, special tokens included.
        prompts: the checkpoint's named prompts and its default one
            (``config_sentence_transformers.json``), for ``encode(prompt_name=...)``.
        path: the checkpoint directory.
        report: what the load did (:class:`~clearformer.interop.hf.LoadReport`).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        tokenizer: TextTokenizer,
        *,
        pooling: str,
        normalize: bool,
        include_prompt: bool = True,
        prompts: Prompts | None = None,
        head: SentenceHead | None = None,
        truncate_dim: int | None = None,
        held: Decision | None = None,
        held_as: str | None = None,
    ) -> None:
        self._loaded = loaded
        self.prompts = Prompts() if prompts is None else prompts
        self.model: EncoderModel = loaded.model
        self.config: EncoderConfig = loaded.model.config
        self.tokenizer = tokenizer
        check_choice(pooling, POOLING_MODES, "TextEncoder pooling")
        self.include_prompt = include_prompt
        self.normalize = normalize
        if head is None:
            head = SentenceHead(SentenceHeadConfig(self.config.d_model, pooling)).eval()
        if head.config.pooling != pooling or head.config.d_model != self.config.d_model:
            raise ValueError(
                f"head must pool with {pooling!r} from width {self.config.d_model}, got "
                f"{head.config.pooling!r} from width {head.config.d_model}"
            )
        self.head = head
        head.check_dimensions(truncate_dim, "truncate_dim")
        self.truncate_dim = truncate_dim
        self.max_length = tokenizer.max_length
        self.path: Path = loaded.files.path
        self.report: LoadReport = loaded.report
        # Loaded in int8: the model, converted in place, is the int8 one from here on.
        self._models = PrecisionModels(self.model, tokenizer, held, held_as, loaded.deferred)
        # Every layer is read now; the plan (and the checkpoint it reads from) can go.
        loaded.deferred = None
        # The weights in oneDNN's layout, kept once the calls repay it.
        self._reordering = KeptReordering(self.model)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike | None = None,
        *,
        backend: str = "auto",
        strict: bool = True,
        padding_side: str | None = None,
        truncate_dim: int | None = None,
        precision: str | None = None,
        device: str | torch.device | None = None,
    ) -> TextEncoder:
        """Load a checkpoint directory (None: the bundled all-MiniLM-L6-v2).

        Args:
            device: where the model and its head run (None: the CPU; ``"cuda"``,
                ``"cuda:1"``, a ``torch.device``; :func:`clearformer.devices.check_device`),
                checked before any weight is read. Texts are tokenized on the CPU and each
                padded batch goes to the device; ``encode`` returns NumPy arrays whatever the
                device. ``precision="int8"`` and ``"int8-blocks"`` run on the CPU alone.
            precision: None = the float32 model, and every call may ask for any precision
                (the bfloat16 and int8 models are built on first need and kept beside it);
                ``"float32"``, ``"bf16"``, ``"int8"``, ``"int8-blocks"`` or ``"auto"``
                (decided now, as :meth:`precision_for` decides): the encoder holds that
                precision's model alone and every call runs it. ``"bf16"`` builds the
                bfloat16 model straight from the checkpoint, never holding the float32 one;
                ``"int8"`` and ``"int8-blocks"`` read and convert one layer at a time and
                never hold the float32 model whole. A call that asks for another precision
                is refused.
            padding_side: ``"right"`` or ``"left"``; None = tokenizer_config.json's
                ``padding_side`` (right when absent). Embeddings do not depend on it:
                positions count each row's real tokens either way.
            truncate_dim: the width :meth:`encode` cuts embeddings to by default; None =
                config_sentence_transformers.json's ``truncate_dim``, else the full width.

        Raises:
            FileNotFoundError: no such directory (or the bundled model is not installed).
            CheckpointError: incomplete, unsupported, corrupt or mismatched checkpoint.
            ValueError: a ``truncate_dim`` wider than the embeddings or outside the model's
                Matryoshka dimensions; an unknown ``precision``.
        """
        device = check_device(device)
        held, held_as = held_precision(precision, OFFERED, device)
        parts = read_encoder_parts(
            path,
            backend=backend,
            strict=strict,
            padding_side=padding_side,
            truncate_dim=truncate_dim,
            precision="bf16" if held is not None and held.choice == "bf16" else "float32",
            # Held in int8: each layer read as it is converted, never the float32 model whole.
            defer_layers=held is not None and is_int8(held.choice),
        )
        return cls.from_parts(parts, held=held, held_as=held_as, device=device)

    @classmethod
    def from_parts(
        cls,
        parts: EncoderParts,
        held: Decision | None = None,
        held_as: str | None = None,
        device: str | torch.device | None = None,
    ) -> TextEncoder:
        """An encoder of a checkpoint's parts as :func:`~.encoder_files.read_encoder_parts`
        reads them (or with the model and head swapped for trained ones); ``held``: the
        precision it holds alone (``from_pretrained(precision=...)``'s decision), ``held_as``
        the name that load asked for; ``device``: where the parts' model and head are moved
        (None: left where they are)."""
        if device is not None:
            place_parts(parts, device, held)
        return cls(
            parts.loaded,
            parts.tokenizer,
            pooling=parts.pooling.mode,
            normalize=parts.head.config.normalize,
            include_prompt=parts.pooling.include_prompt,
            prompts=parts.prompts,
            head=parts.head,
            truncate_dim=parts.truncate_dim,
            held=held,
            held_as=held_as,
        )

    @property
    def pooling(self) -> str:
        """The pooling mode (:attr:`head`'s); setting it changes how later calls pool."""
        return self.head.config.pooling

    @pooling.setter
    def pooling(self, mode: str) -> None:
        check_choice(mode, POOLING_MODES, "TextEncoder pooling")
        self.head.config = dataclasses.replace(self.head.config, pooling=mode)

    @property
    def device(self) -> torch.device:
        """Where the model runs (``from_pretrained(device=...)``; the CPU by default)."""
        return model_device(self.model)

    @property
    def dim(self) -> int:
        """Width of the embeddings :meth:`encode` gives by default: :attr:`truncate_dim`, else
        the head's (the last Dense module's, else the model's width D)."""
        return self.head.width if self.truncate_dim is None else self.truncate_dim

    def tokenize(self, texts: list[str]) -> TokenBatch:
        """Tokenize and pad ``texts`` as :meth:`encode` does (one batch, input order)."""
        return self.tokenizer(texts)

    def pool(self, hidden: Tensor, attention_mask: Tensor, skip: int = 0) -> Tensor:
        """(B, T, D) token states + (B, T) bool mask -> (B, D) with the checkpoint's pooling,
        the first ``skip`` tokens (a prompt's) left out; the pooling only, before any Dense
        module (:attr:`head` runs them all)."""
        return pool(hidden, attention_mask, self.pooling, skip=skip)

    def prompt_length(self, prompt: str) -> int:
        """Tokens a ``prompt`` takes at the start of a text: its pieces and the opening special
        token, not a closing one (sentence-transformers' count)."""
        return prompt_length(self.tokenizer, prompt)

    def encode(
        self,
        texts: list[str],
        batch_size: int | None = None,
        normalize: bool | None = None,
        progress: bool | ProgressFn | None = None,
        *,
        max_tokens: int | None = None,
        workers: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        precision: str | None = None,
        fuse_int8: bool | None = None,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """Sentence embeddings of ``texts``.

        Args:
            texts: the texts (an empty list gives a (0, D) array).
            batch_size: texts per forward pass; None = as many as fit in ``max_tokens``.
            normalize: L2-normalise each row; None = as the checkpoint says (:attr:`normalize`).
            progress: None = log progress at INFO level for long inputs; True = a tqdm bar when
                tqdm is installed (else log); False = silent; a callable gets (done, total).
            max_tokens: padded tokens per forward pass when ``batch_size`` is None (see
                :mod:`clearformer.text.batching`); None = 4096 in float32, 2048 in int8
                (:func:`~clearformer.text.batching.default_max_tokens`).
            workers: forward passes run side by side on a CPU, its threads split between
                them; 1 = one at a time; None = :func:`~clearformer.text.workers.auto_workers`
                (two on a CPU with at least two threads when there are two batches or more,
                and none while a trace records; see :mod:`clearformer.text.workers`). With
                more than one worker and no ``batch_size``, the batches are cut again into a
                multiple of the workers of about equal cost, within ``max_tokens``
                (:func:`~clearformer.text.batching.balance_batches`), so the workers finish
                together.
            prompt: text put before every text (``"query: "``), as sentence-transformers'
                ``encode(prompt=...)``; with :attr:`include_prompt` false its tokens are left
                out of the pooling.
            prompt_name: one of the checkpoint's named prompts (:attr:`prompts`); with neither
                ``prompt`` nor ``prompt_name``, the checkpoint's default prompt, if any, is
                applied, as sentence-transformers does. ``prompt`` wins over ``prompt_name``.
            precision: None = the precision the encoder was loaded in (float32 unless
                ``from_pretrained(precision=...)`` named one); ``"float32"``; ``"bf16"`` (or
                ``"bfloat16"``, :meth:`bf16_model`: bfloat16 products, float32 norms, softmax,
                pooling; cosine >= 0.995 to float32, ``docs/performance.md``); ``"int8"``
                (:meth:`int8_model`: int8 products, cosine >= 0.99, ``docs/int8.md``);
                ``"int8-blocks"`` (:mod:`clearformer.quant.int8_blocks`: int8 weights scaled
                per block of 32, 16-bit activations; closer to float32, slower on batches);
                ``"auto"`` (:func:`clearformer.precision.auto_precision`). A name this
                machine cannot run (int8 without int8 instructions, int8-blocks without
                AVX512-VNNI) runs float32 with a logged warning; :meth:`precision_for` says
                which a name runs and why.
            fuse_int8: with ``precision="int8"``, run the int8 layers' element-wise steps
                compiled (``torch.compile``: the same arithmetic in fewer passes, after a
                one-time compile; ``docs/int8.md`` has the costs and the gain); None = for
                calls of at least :data:`FUSED_INT8_MIN_TOKENS` tokens.
            dimensions: keep the first this many values of each embedding (a Matryoshka
                model's shorter embedding), then normalise if the call normalises; None =
                :attr:`truncate_dim`. At most the width, and one of the model's Matryoshka
                dimensions where its files list them.

        Returns:
            (n, dimensions or width) float32, row i for ``texts[i]``. Batching changes speed
            and memory, never the result: a text's embedding does not depend on its
            batch-mates (to the bit, with one condition where clearformer's AVX-512 linear
            kernel is built: its verdict for a batch's rows and its verdict for a sentence's
            few rows, at most 64, take the same side, else a batch of at most 64 tokens and
            a larger one differ in the last bit; docs/serving.md, "Batching").

        On a CPU in float32 or bfloat16, once this encoder's calls have carried
        :data:`~clearformer.fast.reordered_weights.REORDER_MIN_TOKENS` tokens in all, it keeps a
        copy of every linear weight in oneDNN's layout (:mod:`clearformer.fast.reordered_weights`)
        for its later calls: as much memory again as those weights, until
        :meth:`drop_reordered_weights`.
        """
        texts = check_texts(texts)
        # Flags are real bools: normalize="no" would read as True and silently normalise.
        check_bool(normalize, "normalize", optional=True)
        check_bool(fuse_int8, "fuse_int8", optional=True)
        check_progress(progress)
        prompt, skip = self.resolve_prompt(prompt, prompt_name)
        if prompt is not None:
            texts = [prompt + text for text in texts]
        normalize = self.normalize if normalize is None else normalize
        dimensions = self.truncate_dim if dimensions is None else dimensions
        self.head.check_dimensions(dimensions)
        n = len(texts)
        out = np.empty((n, dimensions or self.head.width), dtype=np.float32)
        precision = self._models.check(precision)  # before any work
        check_batch_limits(batch_size, max_tokens if max_tokens is not None else 1)
        check_workers(workers)
        if n == 0:
            return out
        chosen = self._models.decide(precision).choice
        if max_tokens is None:
            max_tokens = default_max_tokens(chosen)
        encodings = self.tokenizer.encode(texts)
        lengths = [len(e.ids) for e in encodings]
        tokens = sum(lengths)  # sets the int8 fusion, the kernel build and the weight reordering
        log.info("encode: %d texts, %d tokens, in %s", n, tokens, chosen)
        fused = tokens >= FUSED_INT8_MIN_TOKENS if fuse_int8 is None else fuse_int8
        model = self._model_for(chosen, fused)
        work = attention_work(lengths, getattr(model, "config", None))
        attention_kernel_for(tokens, model_device(model), attention=work)
        # Longest first: texts of similar length share a batch, and the longest batch (the peak
        # of memory) comes first, so a memory problem shows at once.
        batches = plan_batches(lengths, batch_size, max_tokens)
        if workers is None:
            workers = auto_workers(len(batches), model_device(model))
        if batch_size is None:  # a batch size the caller named is kept as it is
            batches = balance_batches(lengths, batches, workers, self.config.d_model, max_tokens)
        report = progress_reporter(progress, n)
        # Each fused linear call would reorder its weight into oneDNN's layout again: reorder
        # each weight once and keep it for later calls, once the calls are large enough to repay it.
        packed = self._reordering.for_call(tokens) if not is_int8(chosen) else None

        def embed(rows: list[int]) -> tuple[list[int], np.ndarray]:
            chosen = [encodings[i] for i in rows]
            vectors = self._forward(
                chosen, model, packed, skip=skip, normalize=normalize, dimensions=dimensions
            )
            return rows, vectors

        done = 0
        for rows, vectors in map_in_workers(embed, batches, workers):
            out[rows] = vectors
            done += len(rows)
            report(done, n)
        return out

    def embed_batch(
        self,
        encodings: list,
        *,
        normalize: bool,
        skip: int = 0,
        precision: str | None = None,
        dimensions: int | None = None,
    ) -> np.ndarray:
        """One forward pass over texts already tokenized (``tokenizer.encode``), as
        :meth:`encode` runs each of its batches: (B, D) float32, row i for ``encodings[i]``.

        For callers that form their own batches, such as ``clearformer serve``, which merges
        the texts of many requests: the rows are computed by the same code as ``encode``'s, and
        a row does not depend on its batch-mates, so they are ``encode``'s rows for the same
        texts. ``skip`` leaves a prompt's first tokens out of the pooling (see
        :meth:`resolve_prompt`); ``precision`` as for ``encode``, where ``"int8"`` runs
        :meth:`int8_model` unfused, as ``encode`` does for calls under
        :data:`FUSED_INT8_MIN_TOKENS` tokens. Safe to call from several threads at once, each
        at its own intra-op thread count.
        """
        check_bool(normalize, "normalize")
        precision = self._models.check(precision)
        dimensions = self.truncate_dim if dimensions is None else dimensions
        self.head.check_dimensions(dimensions)
        if not encodings:
            return np.empty((0, dimensions or self.head.width), dtype=np.float32)
        tokens = sum(len(e.ids) for e in encodings)
        chosen = self._models.decide(precision).choice
        model = self._model_for(chosen, fused=False)
        packed = self._reordering.for_call(tokens) if not is_int8(chosen) else None
        return self._forward(
            encodings, model, packed, skip=skip, normalize=normalize, dimensions=dimensions
        )

    def _forward(
        self,
        encodings: list,
        model: EncoderModel,
        packed: ReorderedWeights | None,
        *,
        skip: int,
        normalize: bool,
        dimensions: int | None,
    ) -> np.ndarray:
        """Pad, run, pool, the Dense modules, cut and normalise one batch: (B, width) float32
        (encode's and embed_batch's one path)."""
        batch = self.tokenizer.pad(encodings, with_tokens=False)
        device = model_device(model)
        ids, mask, types = (
            t.to(device) for t in (batch.input_ids, batch.attention_mask, batch.token_type_ids)
        )  # (B, T) each; mask bool
        # Grad mode and the reordered weights are per thread: each worker enters both itself.
        with torch.inference_mode(), use_reordered_weights(packed):
            # The mask goes as it is: the Encoder's plan drops one without padding itself.
            # Each text's vector must not depend on its batch-mates: the plan packs a batch
            # with padding (rows_alone).
            hidden = model(ids, mask, types, rows_alone=True)
            # The head (pooling, Dense modules, cut, normalisation) in float32 whatever the
            # model's rows (bfloat16): a mean over hundreds of tokens would otherwise round at
            # every partial sum.
            vectors = self.head(
                hidden.float(), mask, skip=skip, normalize=normalize, dimensions=dimensions
            )  # (B, dimensions or width)
        return vectors.float().cpu().numpy()

    def resolve_prompt(
        self, prompt: str | None = None, prompt_name: str | None = None
    ) -> tuple[str | None, int]:
        """The text :meth:`encode` puts before every text for these arguments (None: none) and
        how many of its tokens the pooling leaves out (non-zero only where the checkpoint's
        pooling excludes the prompt)."""
        prompt = choose_prompt(self.prompts, prompt, prompt_name)
        if prompt is None:
            return None, 0
        return prompt, 0 if self.include_prompt else self.prompt_length(prompt)

    def build_index(self, path: str | os.PathLike, texts: list[str], **kwargs):
        """Build a persistent vector index of ``texts`` at ``path`` with this encoder and return
        it opened for search (:func:`clearformer.index.build_index`; ``ids=``, ``options=``
        :class:`~clearformer.index.IndexOptions`, and ``encode``'s batching options)."""
        from ..index import build_index

        return build_index(path, texts, self, **kwargs)

    def open_index(self, path: str | os.PathLike):
        """The index at ``path``, opened to search with this encoder; refused
        (:class:`~clearformer.index.ModelMismatchError`) unless this is the model that built
        it (:class:`~clearformer.index.VectorIndex`)."""
        from ..index import VectorIndex

        return VectorIndex.open(path, self)

    def predict(self, *args, **kwargs):
        """Not available: scoring text pairs needs a classification head."""
        raise TypeError(
            f"TextEncoder embeds texts (encode) and has no classification head to score pairs "
            f"with; load a *ForSequenceClassification checkpoint with "
            f"CrossEncoder.from_pretrained to rerank (got {self.path})"
        )

    rank = predict

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write the checkpoint back in Hugging Face format, with tokenizer and pooling files
        (an encoder loaded in bf16 writes bfloat16 weights; one loaded in int8 cannot be
        written: its linear layers have no float weights left)."""
        if self._models.held is not None and is_int8(self._models.held.choice):
            raise ValueError(
                f"save_pretrained needs float weights: this encoder was loaded with "
                f"precision={self._models.held.choice!r} and holds int8 layers alone; load "
                f"{self.path} without precision= to save it"
            )
        return write_encoder_files(self, directory)

    def __repr__(self) -> str:
        return (
            f"TextEncoder(path={str(self.path)!r}, architecture="
            f"{self._loaded.architecture.model_type!r}, dim={self.dim}, pooling={self.pooling!r}, "
            f"normalize={self.normalize}, max_length={self.max_length})"
        )
