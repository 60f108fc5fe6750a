"""What gets exported: the encoder's padded path as one traceable module, and ``torch.export``.

:class:`ExportableEncoder` runs the same modules as :class:`~clearformer.EncoderModel` (its
``embeddings`` and ``encoder``, shared, not copied) on one fixed plan choice: the padded layout
with a named kernel (``sdpa`` or ``math``). It leaves out the two things of an eager call that
read tensor *values* on the host, which a tracer cannot follow:

* ``check_token_ids``' range check (``int(input_ids.min())``): an exported graph gets no Python
  check; an id outside the vocabulary fails inside the runtime's gather instead;
* Hugging Face 0/1 mask validation (``torch.unique``): here any non-zero ``attention_mask``
  value is a real token, as in an ONNX Runtime BERT graph.

What the plan itself decides from values (``bool(mask.all())`` to drop a mask without padding,
the share of padding that picks packed rows, whether every query row has a key) it already skips
while ``torch.compiler.is_compiling()`` is true, and that flag is true under ``torch.export``
too: the traced graph always keeps the mask, stays padded, and zeroes rows without a key, so a
single graph serves every batch. A fixed ``sdpa`` or ``math`` backend also keeps ``auto`` from
choosing packed rows, whose shapes depend on the data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_bool, check_choice
from ..config import EncoderConfig
from ..fast.local import BANDED_MIN_LENGTH, use_banded
from ..heads import POOLING_MODES, pool
from ..model import EncoderModel
from ..positions import padded_past_pads, padded_positions

__all__ = [
    "EXPORT_BACKENDS",
    "ExportableEncoder",
    "dynamic_shapes_for",
    "example_inputs",
    "export_backend",
    "export_program",
]

# The kernels an exported graph can run: both on the padded layout with static shapes. varlen
# needs packed rows (data-dependent shapes); auto may choose it.
EXPORT_BACKENDS = ("sdpa", "math")


def export_backend(config: EncoderConfig, backend: str | None = None) -> str:
    """The kernel to trace: ``backend`` if given, else ``sdpa``; ``math`` for a model with
    local layers whose sdpa path changes with the sequence length, or with a relative position
    bias (MPNet), which torch.onnx translates on math only.

    On sdpa a local layer runs long rows slab by slab and short rows with the band folded into
    the mask (:func:`clearformer.fast.local.use_banded`): a branch on T that one graph with
    a dynamic T cannot hold. On math the band is always folded into the mask.

    Raises:
        ValueError: ``sdpa`` asked for such a model, or a kernel that cannot be exported.
    """
    slabbed = [
        window
        for window in (config.window_of(t) for t in config.layer_types)
        if window is not None and use_banded(config.max_length, window)
    ]
    if backend is None:
        # A relative position bias reaches sdpa as a float mask, whose head merge torch.onnx
        # (torch 2.13) cannot translate; math runs the same formula and translates.
        return "math" if slabbed or config.relative_attention_buckets else "sdpa"
    check_choice(backend, EXPORT_BACKENDS, "export backend")
    if backend == "sdpa" and slabbed:
        raise ValueError(
            f"backend='sdpa' runs the local layers (window {slabbed[0]}) of sequences longer "
            f"than {BANDED_MIN_LENGTH} tokens slab by slab and shorter ones with the band in the "
            "mask: a branch on the sequence length that a graph with a dynamic length cannot "
            "hold; export with backend='math' (the band always in the mask) or None (chooses it)"
        )
    return backend


class ExportableEncoder(nn.Module):
    """(input_ids, attention_mask[, token_type_ids]) -> last hidden state[, sentence embedding].

    Args:
        model: the encoder; its ``embeddings`` and ``encoder`` are used as they are (shared).
        backend: the attention kernel of the graph, ``sdpa`` or ``math``; None: chosen by
            :func:`export_backend` (``sdpa``, or ``math`` for long local layers).
        pooling: also return a sentence embedding pooled this way (one of
            :data:`clearformer.heads.POOLING_MODES`); None: hidden states only.
        normalize: L2-normalise the sentence embedding (sentence-transformers' ``Normalize``).

    Inputs of :meth:`forward` are (B, T) int64 tensors; ``token_type_ids`` exactly when the
    model has token type embeddings (``type_vocab_size > 0``).
    """

    def __init__(
        self,
        model: EncoderModel,
        *,
        backend: str | None = None,
        pooling: str | None = None,
        normalize: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(model, EncoderModel):
            raise TypeError(f"model must be an EncoderModel, got {type(model).__name__}")
        self.backend = export_backend(model.config, backend)
        if pooling is not None:
            check_choice(pooling, POOLING_MODES, "pooling")
        check_bool(normalize, "normalize")  # bool("no") is True: it would normalise
        self.pooling = pooling
        self.normalize = normalize
        self.config = model.config
        self.counts_past_pads = model.counts_past_pads  # RoBERTa's positions skip pad ids
        self.train(model.training)  # a new module trains by default; follow the model's mode
        self.embeddings = model.embeddings
        self.encoder = model.encoder

    @property
    def input_names(self) -> tuple[str, ...]:
        names = ("input_ids", "attention_mask")
        return names + ("token_type_ids",) if self.config.type_vocab_size > 0 else names

    @property
    def output_names(self) -> tuple[str, ...]:
        names = ("last_hidden_state",)
        return names + ("sentence_embedding",) if self.pooling is not None else names

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        """Encode a padded batch.

        Args:
            input_ids: (B, T) int64 token ids in [0, vocab_size).
            attention_mask: (B, T) integers (or bools), non-zero = real token.
            token_type_ids: (B, T) int64 segment ids, for a model with token types.

        Returns:
            ``(last_hidden_state,)``, (B, T, D), zero at padded positions; with pooling also
            the (B, D) sentence embedding.
        """
        B, T = input_ids.shape
        mask = attention_mask != 0  # (B, T) bool, True = real token
        # Planned as EncoderModel plans a call; under tracing the plan keeps the mask and the
        # padded layout whatever the values (see the module's docstring).
        plan = self.encoder.plan_for(
            mask,
            shape=(B, T),
            device=input_ids.device,
            backend=self.backend,
            dtype=self.embeddings.word.weight.dtype,
            mask_name="attention_mask",
        )
        # Each token's index among its row's real tokens, as EncoderModel counts them: a row
        # padded on the left gets the positions it has alone. RoBERTa's also skip a pad id in
        # the text (computed whatever the ids hold: the graph must not branch on them).
        positions = padded_positions(mask)  # (B, T)
        if self.counts_past_pads:
            pads = (input_ids == self.config.pad_token_id) & mask  # (B, T)
            positions = padded_past_pads(positions, pads)
        x = self.embeddings(input_ids, token_type_ids, positions)  # (B, T, D)
        hidden = self.encoder.run(x, plan)  # (B, T, D)
        if self.pooling is None:
            return (hidden,)
        vectors = pool(hidden, mask, self.pooling)  # (B, D)
        if self.normalize:
            vectors = F.normalize(vectors, p=2.0, dim=-1)
        return hidden, vectors


def example_inputs(
    module: ExportableEncoder, batch: int = 2, length: int = 8
) -> tuple[Tensor, ...]:
    """A small (B, T) batch to trace with: ids in the vocabulary, the last row padded.

    B and T are at least 2: a tracer specialises a dimension it sees as 1 (or 0) to that
    constant, and the graph would then refuse every other size.
    """
    if batch < 2 or length < 2:
        raise ValueError(f"batch and length must be at least 2, got {batch} and {length}")
    config = module.config
    length = min(length, config.max_length)
    device = module.embeddings.word.weight.device
    ids = torch.arange(batch * length, device=device).reshape(batch, length) % config.vocab_size
    mask = torch.ones(batch, length, dtype=torch.int64, device=device)
    mask[-1, length // 2 :] = 0
    inputs = (ids, mask)
    if config.type_vocab_size > 0:
        inputs += (torch.zeros_like(ids),)
    return inputs


def dynamic_shapes_for(module: ExportableEncoder) -> tuple[dict[int, object], ...]:
    """``torch.export`` dynamic shapes: every input's dim 0 is ``batch``, dim 1 ``sequence``
    (1 to the model's ``max_length``, the longest its positions allow)."""
    batch = torch.export.Dim("batch", min=1)
    sequence = torch.export.Dim("sequence", min=1, max=module.config.max_length)
    return tuple({0: batch, 1: sequence} for _ in module.input_names)


def export_program(
    model: EncoderModel | ExportableEncoder,
    *,
    backend: str | None = None,
    pooling: str | None = None,
    normalize: bool = False,
    strict: bool = False,
) -> torch.export.ExportedProgram:
    """``torch.export.export`` of the encoder's padded path, with dynamic batch and sequence.

    Args:
        model: an :class:`~clearformer.EncoderModel` (wrapped as :class:`ExportableEncoder`
            with ``backend``, ``pooling`` and ``normalize``) or an :class:`ExportableEncoder`.
        strict: trace with TorchDynamo (``strict=True``), which refuses any graph break, or
            with torch.export's default non-strict tracer.

    Returns:
        the ExportedProgram; ``program.module()(input_ids, attention_mask[, token_type_ids])``
        returns what :meth:`ExportableEncoder.forward` returns, for any B and T in range.
    """
    # Checked before tracing, whatever ``model`` is: strict="no" would be read as True.
    check_bool(normalize, "normalize")
    check_bool(strict, "strict")
    if not isinstance(model, ExportableEncoder):
        model = ExportableEncoder(model, backend=backend, pooling=pooling, normalize=normalize)
    with eval_mode(model), torch.no_grad():
        return torch.export.export(
            model,
            example_inputs(model),
            dynamic_shapes=dynamic_shapes_for(model),
            strict=strict,
        )


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """Run the block with ``module`` in eval mode (no dropout in a traced graph), then give
    every submodule back the mode it had: the caller's model may be training."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training
