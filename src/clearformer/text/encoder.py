"""``TextEncoder``: texts in, sentence embeddings out, on a pretrained BERT-family checkpoint.

The pipeline: tokenize every text once; sort by length so each batch holds texts of similar
length; run each batch through :class:`~clearformer.EncoderModel` (which packs the real tokens
of a ragged batch, so padding costs nothing); pool; normalise; put rows back in input order.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_bool, check_choice, check_unicode
from ..config import EncoderConfig
from ..fast.packed_weights import PACK_MIN_TOKENS, KeptPacking, PackedWeights, use_packed_weights
from ..heads import POOLING_MODES, pool
from ..interop.hf import (
    LoadedModel,
    LoadReport,
    TextTokenizer,
    TokenBatch,
    find_checkpoint,
    load_model,
    normalize_from_modules,
    pooling_from_config,
    save_model,
)
from ..interop.hf.files import CHECKPOINT_FILES
from ..interop.hf.sentence_transformers import Prompts, prompts_from_files
from ..interop.hf.tokenizer import check_texts, max_length_for
from ..io import atomic_write
from ..model import EncoderModel
from ..options import Decision
from .batching import (
    balance_batches,
    check_batch_limits,
    default_max_tokens,
    plan_batches,
    row_backend,
)
from .int8_models import Int8Models
from .precisions import Precisions
from .progress import ProgressFn, progress_reporter
from .workers import auto_workers, check_workers, map_in_workers

log = logging.getLogger(__name__)

# encode(precision="int8") compiles the int8 layers' element-wise steps (a one-time cost per
# process: seconds with Inductor's disk cache warm, about half a minute cold; docs/int8.md) for
# calls of at least this many tokens (word pieces, special tokens included), where the time
# they save per token repays a warm compile within the call. Counted in tokens, not texts: the
# saving is per token, and texts differ in length by a hundredfold.
FUSED_INT8_MIN_TOKENS = 500_000


class TextEncoder:
    """A pretrained encoder with its tokenizer and pooling.

    Attributes:
        model: the :class:`~clearformer.EncoderModel`, in eval mode.
        config: its :class:`~clearformer.EncoderConfig`.
        pooling: one of :data:`clearformer.heads.POOLING_MODES` (``"mean"``, ``"cls"``,
            ``"weightedmean"``, ...).
        include_prompt: whether a ``prompt`` given to :meth:`encode` counts in the pooling
            (the checkpoint's pooling config says; false leaves its tokens out).
        normalize: whether :meth:`encode` L2-normalises by default (the checkpoint's
            sentence-transformers modules include ``Normalize``).
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
    ) -> None:
        self._loaded = loaded
        self.prompts = Prompts() if prompts is None else prompts
        self.model: EncoderModel = loaded.model
        self.config: EncoderConfig = loaded.model.config
        self.tokenizer = tokenizer
        self.pooling = check_choice(pooling, POOLING_MODES, "TextEncoder pooling")
        self.include_prompt = include_prompt
        self.normalize = normalize
        self.max_length = tokenizer.max_length
        self.path: Path = loaded.files.path
        self.report: LoadReport = loaded.report
        self._int8 = Int8Models(self.model, tokenizer)  # built on the first int8 call
        self._precisions: Precisions[EncoderModel] = Precisions(
            ("float32", "bf16", "int8"), self._device, self._copy_bf16
        )
        self._packing = KeptPacking()  # weights in oneDNN's layout, once calls repay it

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike | None = None,
        *,
        backend: str = "auto",
        strict: bool = True,
    ) -> TextEncoder:
        """Load a checkpoint directory (None: the bundled all-MiniLM-L6-v2).

        Raises:
            FileNotFoundError: no such directory (or the bundled model is not installed).
            CheckpointError: incomplete, unsupported, corrupt or mismatched checkpoint.
        """
        started = time.perf_counter()
        files = find_checkpoint(path)
        pooling = pooling_from_config(files.pooling_config)
        normalize = normalize_from_modules(files.modules, files.path)
        loaded = load_model(files, backend=backend, strict=strict)
        config = loaded.model.config
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        tokenizer = TextTokenizer.from_files(
            files, max_length_for(files, config.max_length), pad_id, vocab_size=config.vocab_size
        )
        log.info("loaded %s in %.2fs", files.path, time.perf_counter() - started)
        architectures = files.config.get("architectures") or []
        if any(str(a).endswith("ForSequenceClassification") for a in architectures):
            log.warning(
                "%s is a %s checkpoint: its encoder was trained to score pairs (CrossEncoder), "
                "not to embed texts, so its embeddings may mean little",
                files.path,
                architectures[0],
            )
        return cls(
            loaded,
            tokenizer,
            pooling=pooling.mode,
            normalize=normalize,
            include_prompt=pooling.include_prompt,
            prompts=prompts_from_files(files),
        )

    @property
    def dim(self) -> int:
        """Width D of the embeddings."""
        return self.config.d_model

    def tokenize(self, texts: list[str]) -> TokenBatch:
        """Tokenize and pad ``texts`` as :meth:`encode` does (one batch, input order)."""
        return self.tokenizer(texts)

    def pool(self, hidden: Tensor, attention_mask: Tensor, skip: int = 0) -> Tensor:
        """(B, T, D) token states + (B, T) bool mask -> (B, D) with the checkpoint's pooling,
        the first ``skip`` tokens (a prompt's) left out."""
        return pool(hidden, attention_mask, self.pooling, skip=skip)

    def prompt_length(self, prompt: str) -> int:
        """Tokens a ``prompt`` takes at the start of a text: its pieces and the opening special
        token, not a closing one (sentence-transformers' count)."""
        check_unicode(prompt, "prompt")
        (encoding,) = self.tokenizer.encode([prompt])
        closing = bool(encoding.special_tokens_mask) and encoding.special_tokens_mask[-1] == 1
        return len(encoding.ids) - int(closing)

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
        precision: str = "float32",
        fuse_int8: bool | None = None,
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
            precision: ``"float32"``; ``"bf16"`` (or ``"bfloat16"``): :meth:`bf16_model`,
                bfloat16 weights and matrix products with float32 norms, softmax, pooling and
                normalisation, embeddings within cosine 0.995 of float32 ones (see
                ``docs/performance.md``); ``"int8"``: the linear layers' matrix products in
                int8 (:meth:`int8_model`, built on the first such call and reused), with
                embeddings within cosine 0.99 of float32 ones (see ``docs/int8.md``; where
                this CPU has no int8 instructions, float32 with a logged warning,
                :func:`clearformer.quant.int8_support` says why); ``"auto"``: the fastest
                of them whose accuracy floor holds on this CPU
                (:func:`clearformer.precision.auto_precision`). :meth:`precision_for` says
                which a name runs and why; ``encode`` logs it at INFO level.
            fuse_int8: with ``precision="int8"``, run the int8 layers' element-wise steps
                compiled (``torch.compile``: the same arithmetic in fewer passes, after a
                one-time compile; ``docs/int8.md`` has the costs and the gain); None = for
                calls of at least :data:`FUSED_INT8_MIN_TOKENS` tokens.

        Returns:
            (n, D) float32, row i for ``texts[i]``. Batching changes speed and memory, never
            the result: a text's embedding does not depend on its batch-mates.

        On a CPU in float32 or bfloat16, once this encoder's calls have carried
        :data:`~clearformer.fast.packed_weights.PACK_MIN_TOKENS` tokens in all, it keeps a copy
        of every linear weight in oneDNN's layout (:mod:`clearformer.fast.packed_weights`) for its
        later calls: as much memory again as those weights, until :meth:`drop_packed_weights`.
        """
        texts = check_texts(texts)
        # Flags are real bools: normalize="no" would read as True and silently normalise.
        check_bool(normalize, "normalize", optional=True)
        check_bool(fuse_int8, "fuse_int8", optional=True)
        if not (progress is None or isinstance(progress, bool) or callable(progress)):
            raise TypeError(
                f"progress must be None, True, False or a callable (done, total), got {progress!r}"
            )
        prompt, skip = self.resolve_prompt(prompt, prompt_name)
        if prompt is not None:
            texts = [prompt + text for text in texts]
        normalize = self.normalize if normalize is None else normalize
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        precision = self._precisions.check(precision)  # before any work
        check_batch_limits(batch_size, max_tokens if max_tokens is not None else 1)
        check_workers(workers)
        if n == 0:
            return out
        chosen = self._precisions.decide(precision).choice
        if max_tokens is None:
            max_tokens = default_max_tokens(chosen)
        encodings = self.tokenizer.encode(texts)
        lengths = [len(e.ids) for e in encodings]
        tokens = sum(lengths)  # sets the int8 fusion, the kernel build and the weight packing
        log.info("encode: %d texts, %d tokens, in %s", n, tokens, chosen)
        if chosen == "int8":
            auto = tokens >= FUSED_INT8_MIN_TOKENS
            model = self.int8_model(fused=auto if fuse_int8 is None else fuse_int8)
        else:
            model = self.bf16_model() if chosen == "bf16" else self.model
        if chosen != "bf16":  # clearformer's AVX-512 kernels take float32 rows only
            attention_kernel_for(tokens, next(model.parameters()).device)
        # Longest first: texts of similar length share a batch, and the longest batch (the peak
        # of memory) comes first, so a memory problem shows at once.
        batches = plan_batches(lengths, batch_size, max_tokens)
        if workers is None:
            workers = auto_workers(len(batches), next(model.parameters()).device)
        if batch_size is None:  # a batch size the caller named is kept as it is
            batches = balance_batches(lengths, batches, workers, self.config.d_model, max_tokens)
        report = progress_reporter(progress, n)
        # Each fused linear call would reorder its weight into oneDNN's layout again: reorder
        # each weight once and keep it for later calls, once the calls are large enough to repay it.
        packed = self._packing.for_call(tokens) if chosen != "int8" else None

        def embed(rows: list[int]) -> tuple[list[int], np.ndarray]:
            chosen = [encodings[i] for i in rows]
            return rows, self._forward(chosen, model, packed, skip=skip, normalize=normalize)

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
        precision: str = "float32",
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
        precision = self._precisions.check(precision)
        if not encodings:
            return np.empty((0, self.dim), dtype=np.float32)
        tokens = sum(len(e.ids) for e in encodings)
        chosen = self._precisions.decide(precision).choice
        if chosen == "int8":
            model, packed = self.int8_model(fused=False), None
        else:
            model = self.bf16_model() if chosen == "bf16" else self.model
            packed = self._packing.for_call(tokens)
        return self._forward(encodings, model, packed, skip=skip, normalize=normalize)

    def _forward(
        self,
        encodings: list,
        model: EncoderModel,
        packed: PackedWeights | None,
        *,
        skip: int,
        normalize: bool,
    ) -> np.ndarray:
        """Pad, run, pool and normalise one batch: (B, D) float32 (encode's and embed_batch's
        one path)."""
        batch = self.tokenizer.pad(encodings, with_tokens=False)
        mask = batch.attention_mask  # (B, T) bool
        backend = row_backend(model.config.backend, mask)
        # Grad mode and the packed weights are per thread: each worker enters both itself.
        with torch.inference_mode(), use_packed_weights(packed):
            # The mask goes as it is: the Encoder's plan drops one without padding itself.
            hidden = model(batch.input_ids, mask, batch.token_type_ids, backend=backend)
            # Pooling and normalisation in float32 whatever the model's rows (bfloat16): a
            # mean over hundreds of tokens would otherwise round at every partial sum.
            vectors = self.pool(hidden.float(), mask, skip)  # (B, D)
            if normalize:
                vectors = F.normalize(vectors, p=2.0, dim=-1)
        return vectors.float().numpy()

    def resolve_prompt(
        self, prompt: str | None = None, prompt_name: str | None = None
    ) -> tuple[str | None, int]:
        """The text :meth:`encode` puts before every text for these arguments (None: none) and
        how many of its tokens the pooling leaves out (non-zero only where the checkpoint's
        pooling excludes the prompt)."""
        prompt = self._resolve_prompt(prompt, prompt_name)
        if prompt is None:
            return None, 0
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str or None, got {type(prompt).__name__}")
        return prompt, 0 if self.include_prompt else self.prompt_length(prompt)

    def keep_weights_packed(self) -> None:
        """Keep the linear weights in oneDNN's layout from now on, as ``encode`` does once its
        calls have carried :data:`~clearformer.fast.packed_weights.PACK_MIN_TOKENS` tokens: for a
        long-lived caller of many small calls (``clearformer serve``), whose calls then take
        the same products from the first one on (where clearformer's AVX-512 library is
        loaded, packed weights route some products to its kernel, which rounds differently)."""
        self._packing.for_call(PACK_MIN_TOKENS)

    def drop_packed_weights(self) -> None:
        """Free the copies of the linear weights that ``encode`` keeps in oneDNN's layout
        (:class:`~clearformer.fast.packed_weights.KeptPacking`); later calls make them again once
        they have carried enough tokens to repay it."""
        self._packing.drop()

    def precision_for(self, precision: str = "auto") -> Decision:
        """The precision ``encode(precision=...)`` runs in on this machine, and why: a
        :class:`~clearformer.options.Decision` (``print`` shows both). ``"auto"`` is decided
        on its first use and kept (:func:`clearformer.precision.auto_precision`)."""
        return self._precisions.decide(self._precisions.check(precision))

    def bf16_model(self) -> EncoderModel:
        """The bfloat16 copy of :attr:`model` that ``encode(precision="bf16")`` runs.

        Built once per encoder (:func:`clearformer.precision.bf16_copy`: bfloat16 weights,
        the norms' parameters in float32); :attr:`model` is not changed. On a CPU without
        bfloat16 instructions it runs, with products PyTorch emulates (slower than float32).
        """
        return self._precisions.bf16()

    def _copy_bf16(self) -> EncoderModel:
        from ..precision import bf16_copy

        return bf16_copy(self.model)

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def int8_model(self, fused: bool = False) -> EncoderModel:
        """The int8 copy of :attr:`model` that ``encode(precision="int8")`` runs.

        Built once per encoder (later calls return the same module): every linear layer becomes
        an :class:`~clearformer.quant.Int8Linear`, with the two input channels of largest
        activation on a few calibration texts kept in float32
        (:func:`~clearformer.quant.quantize_int8_calibrated`). :attr:`model` is not changed.
        Where int8 is not available here, a float32 copy (and a logged warning).

        Args:
            fused: the variant whose layers run their element-wise steps compiled
                (:mod:`clearformer.quant.fused`); it shares every tensor with the other one
                and is compiled and warmed up here, before any worker thread runs it.
        """
        return self._int8.get(fused)

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

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        named = self.prompts.prompts
        if prompt_name is not None and not isinstance(prompt_name, str):
            raise TypeError(f"prompt_name must be a str or None, got {prompt_name!r}")
        if prompt_name is not None and prompt_name not in named:
            raise ValueError(
                f"prompt_name must be one of the checkpoint's prompts {sorted(named)}, got "
                f"{prompt_name!r}"
            )
        if prompt is not None:
            if prompt_name is not None:
                log.warning("both prompt and prompt_name given: prompt_name is ignored")
            return prompt
        name = prompt_name if prompt_name is not None else self.prompts.default
        return None if name is None else named[name]

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write the checkpoint back in Hugging Face format, with tokenizer and pooling files."""
        out = save_model(
            self.model,
            directory,
            self._loaded.architecture,
            base_config=self._loaded.hf_config,
            kept=self._loaded.kept,
        )
        sources = [self.path / name for name in CHECKPOINT_FILES]
        modules = self._loaded.files.modules or []
        sources += [
            self.path / str(m.get("path", "")) / "config.json"
            for m in modules
            if str(m.get("type", "")).endswith(".Pooling")
        ]
        for source in sources:
            if source.is_file():
                target = out / source.relative_to(self.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                with atomic_write(target, "wb") as handle:
                    handle.write(source.read_bytes())
        return out

    def __repr__(self) -> str:
        return (
            f"TextEncoder(path={str(self.path)!r}, architecture="
            f"{self._loaded.architecture.model_type!r}, dim={self.dim}, pooling={self.pooling!r}, "
            f"normalize={self.normalize}, max_length={self.max_length})"
        )


def attention_kernel_for(tokens: int, device: torch.device) -> None:
    """On a CPU that can build clearformer's AVX-512 kernels, with no switch off
    (:func:`clearformer.fast.avx512.preferred`), build them for a call of at least
    ``BUILD_MIN_TOKENS`` tokens, which repays the build, and measure them against PyTorch's
    routes if this CPU has no verdict yet (:mod:`clearformer.calibration`): the forward plan
    takes each kernel where it measured faster."""
    from ..fast import avx512

    if (
        device.type == "cpu"
        and tokens >= avx512.BUILD_MIN_TOKENS
        and avx512.preferred()
        and avx512.load(build=True).choice == "loaded"
    ):
        from ..calibration.kernels import measure_if_missing

        measure_if_missing()
