"""The precision of a token-level application's backbone (``MultiVectorEncoder``,
``BGEM3Encoder``): the model each call runs, float32 or bfloat16.

Only the backbone changes precision: its heads (a ColBERT projection, bge-m3's sparse and
ColBERT linears) are a few thousand weights applied once per token, and run in float32 on the
backbone's states made float32, so pooling, projection and normalisation round as in float32.
As for ``TextEncoder``: loaded without ``precision=``, the float32 backbone is held and a call
may ask for bf16 (a bfloat16 copy, built once and kept beside it); loaded with one, that
precision's backbone alone is held (bf16 is read from the file into bfloat16 parameters: the
float32 model never exists) and a call asking for the other is refused before any work.
"""

from __future__ import annotations

import torch

from ..interop.hf import LoadedModel, load_model
from ..model import EncoderModel
from ..options import Decision
from ..precision import check_precision
from .precisions import Precisions, held_precision

OFFERED = ("float32", "bf16")


def load_backbone(files, precision: str | None) -> tuple[LoadedModel, Decision | None, str | None]:
    """The backbone of ``files`` as ``precision`` asks (checked and decided before any weight
    is read), with the decision held and the name asked (both None without ``precision``)."""
    held, held_as = held_precision(precision, OFFERED)
    in_bf16 = held is not None and held.choice == "bf16"
    return load_model(files, precision="bf16" if in_bf16 else "float32"), held, held_as


class BackbonePrecision:
    """Each call's precision and the backbone it runs.

    Args:
        model: the backbone as loaded (bfloat16 where ``held`` is bf16).
        held, held_as: what :func:`load_backbone` returned.
    """

    def __init__(
        self, model: EncoderModel, held: Decision | None = None, held_as: str | None = None
    ) -> None:
        self.model = model
        self._precisions: Precisions[EncoderModel] = Precisions(
            OFFERED, self._device, self._copy_bf16, held=held, held_as=held_as
        )

    @staticmethod
    def check_name(precision: object) -> str:
        """A load's ``precision`` by its canonical name, or the argument error (before any
        file is read)."""
        return check_precision(precision, "precision", (*OFFERED, "auto"))

    @property
    def held(self) -> str | None:
        """The precision the backbone was loaded in (None: float32, bf16 on request)."""
        held = self._precisions.held
        return None if held is None else held.choice

    def check(self, precision: object) -> str:
        """A call's precision by its canonical name (None: the held one, else float32), or the
        argument error naming what is allowed."""
        return self._precisions.check(precision)

    def decide(self, precision: object = "auto") -> Decision:
        """What a call asking for ``precision`` runs in here, and why."""
        return self._precisions.decide(self._precisions.check(precision))

    def model_for(self, precision: object) -> EncoderModel:
        """The backbone a call asking for ``precision`` runs (checked first)."""
        chosen = self.decide(precision).choice
        return self._precisions.bf16() if chosen == "bf16" else self.model

    def _copy_bf16(self) -> EncoderModel:
        from ..precision import bf16_copy

        if self._precisions.held is not None:  # loaded in bf16: the model is the copy
            return self.model
        return bf16_copy(self.model)

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device
