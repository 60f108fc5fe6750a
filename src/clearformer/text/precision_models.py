"""Which model a ``TextEncoder`` call runs, by precision.

An encoder loaded without a precision holds the float32 model and builds the others on first
need, kept beside it: the bfloat16 copy (:func:`clearformer.precision.bf16_copy`) and the int8
model (:class:`~.int8_models.Int8Models`). An encoder loaded in one precision
(``from_pretrained(precision=...)``) holds that precision's model alone, and a call that asks
for another is refused before any work: bf16 is then the model the loader built in bfloat16,
int8 the float32 model converted in place.
"""

from __future__ import annotations

import torch

from ..devices import model_device
from ..model import EncoderModel
from ..options import Decision
from .int8_models import Int8Models, int8_blocks_model
from .precisions import Precisions

OFFERED = ("float32", "bf16", "int8", "int8-blocks")


class PrecisionModels:
    """The models of each precision for one encoder, and each call's decision.

    Args:
        model: the model as loaded (float32, or bfloat16 when ``held`` is bf16).
        tokenizer: the encoder's tokenizer (the int8 conversion calibrates on a few texts).
        held: the one precision the encoder was loaded in (its decision), or None.
        held_as: the name the load asked for (``"int8"`` where the decision is float32
            because this CPU has no int8 products); None: the decision's.
        deferred: with ``held`` int8, the model's encoder layers still unread
            (:class:`~clearformer.interop.hf.deferred.DeferredLayers`), read one at a time as
            they are converted.

    Attributes:
        model: the model the encoder holds: float32, or the held precision's.
    """

    def __init__(
        self,
        model: EncoderModel,
        tokenizer,
        held: Decision | None = None,
        held_as: str | None = None,
        deferred=None,
    ) -> None:
        held_choice = None if held is None else held.choice
        holds_int8 = held_choice == "int8"
        if deferred is not None and held_choice not in ("int8", "int8-blocks"):
            deferred.read_all()  # only the int8 conversions read layers one at a time
        # Built on the first int8 call; loaded in int8, its layers may still be unread.
        self._int8 = Int8Models(model, tokenizer, deferred if holds_int8 else None)
        if held_choice == "int8-blocks":  # the float32 model converted in place, forgotten
            self.model = int8_blocks_model(model, deferred, in_place=True)
        else:  # loaded in int8: the float32 model converted in place, layer by layer
            self.model = self._int8.hold() if holds_int8 else model
        self._precisions: Precisions[EncoderModel] = Precisions(
            OFFERED,
            lambda: self._device(),  # where the model is at each call
            self._copy_bf16,
            held=held,
            held_as=held_as,
            copy_int8_blocks=self._copy_int8_blocks,
        )

    @property
    def held(self) -> Decision | None:
        return self._precisions.held

    def check(self, precision: object, name: str = "precision") -> str:
        """The canonical name a call's ``precision`` runs as (None: the held one, else
        float32), or the argument error."""
        return self._precisions.check(precision, name)

    def decide(self, precision: str) -> Decision:
        """What a checked ``precision`` runs in on this machine, and why (kept per name)."""
        return self._precisions.decide(precision)

    def bf16(self) -> EncoderModel:
        """The bfloat16 model: the copy, built once, or the model loaded in bf16."""
        self._precisions.check("bf16")
        return self._precisions.bf16()

    def int8(self, fused: bool) -> EncoderModel:
        """The int8 model (``fused``: its compiled variant), built once each."""
        self._precisions.cpu_only("int8")
        return self._int8.get(fused)

    def int8_blocks(self) -> EncoderModel:
        """The int8-blocks model, built once (the float32 model is not changed), or the model
        loaded in int8-blocks."""
        return self._precisions.int8_blocks()

    def _copy_int8_blocks(self) -> EncoderModel:
        if self.held is not None:  # loaded in int8-blocks: the model is the converted one
            return self.model
        return int8_blocks_model(self.model)

    def _copy_bf16(self) -> EncoderModel:
        from ..precision import bf16_copy

        if self.held is not None:  # loaded in bf16: the model is the copy
            return self.model
        return bf16_copy(self.model)

    def _device(self) -> torch.device:
        return model_device(self.model)
