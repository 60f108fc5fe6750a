"""``TextEncoder``'s methods that name and build the model of each precision, and keep the
linear weights in oneDNN's layout (:class:`~clearformer.fast.reordered_weights.KeptReordering`)."""

from __future__ import annotations

from ..fast.reordered_weights import REORDER_MIN_TOKENS
from ..model import EncoderModel
from ..options import Decision


class EncoderPrecisionMethods:
    """Mixed into :class:`~.encoder.TextEncoder`, whose ``_models``
    (:class:`~.precision_models.PrecisionModels`) and ``_reordering`` they read."""

    def _model_for(self, chosen: str, fused: bool) -> EncoderModel:
        """The model a call decided as ``chosen`` runs (``fused``: int8's compiled variant)."""
        if chosen == "int8":
            return self.int8_model(fused=fused)
        if chosen == "int8-blocks":
            return self._models.int8_blocks()
        return self.bf16_model() if chosen == "bf16" else self.model

    def keep_weights_reordered(self) -> None:
        """Keep the linear weights in oneDNN's layout from now on, as ``encode`` does once its
        calls have carried :data:`~clearformer.fast.reordered_weights.REORDER_MIN_TOKENS`
        tokens: for a long-lived caller of many small calls (``clearformer serve``), whose calls
        then take
        the same products from the first one on (where clearformer's AVX-512 library is
        loaded, reordered weights route some products to its kernel, which rounds differently)."""
        self._reordering.for_call(REORDER_MIN_TOKENS)

    def drop_reordered_weights(self) -> None:
        """Free the copies of the linear weights that ``encode`` keeps in oneDNN's layout
        (:class:`~clearformer.fast.reordered_weights.KeptReordering`); later calls make them again
        once they have carried enough tokens to repay it."""
        self._reordering.drop()

    def precision_for(self, precision: str | None = "auto") -> Decision:
        """The precision ``encode(precision=...)`` runs in on this machine, and why: a
        :class:`~clearformer.options.Decision` (``print`` shows both). ``"auto"`` is decided
        on its first use and kept (:func:`clearformer.precision.auto_precision`)."""
        return self._models.decide(self._models.check(precision))

    def bf16_model(self) -> EncoderModel:
        """The bfloat16 copy of :attr:`model` that ``encode(precision="bf16")`` runs.

        Built once per encoder (:func:`clearformer.precision.bf16_copy`: bfloat16 weights,
        the norms' parameters in float32); :attr:`model` is not changed. On a CPU without
        bfloat16 instructions it runs, with products PyTorch emulates (slower than float32).
        An encoder loaded with ``precision="bf16"`` holds it as :attr:`model`.
        """
        return self._models.bf16()

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
        return self._models.int8(fused)
