"""A model whose encoder layers stay unread until they are first run: for a load that turns
each layer into something smaller (int8) as soon as it has run once, so that the float32
model is never in memory as a whole.

``load_model(..., defer_layers=True)`` builds the model on the meta device, reads everything
outside ``encoder.layers`` (embeddings, final norm) as usual, and hands back the
:class:`DeferredLayers` that reads layer ``i``'s float32 weights when asked
(:meth:`DeferredLayers.read`). Every check of the checkpoint (names, shapes, missing and
unexpected keys) is made before any weight is read, as for a whole load.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...model import EncoderModel
from ...precision.bf16 import empty_parameters
from .mapping import StatePlan, fill_state

LAYERS = "encoder.layers."


@dataclass
class DeferredLayers:
    """The layers of ``model`` still on the meta device, and where their weights are."""

    model: EncoderModel
    plan: StatePlan

    def read(self, index: int) -> None:
        """Make layer ``index``'s parameters real (float32, on the CPU) and fill them from the
        checkpoint. Grad mode as a whole load leaves it: parameters that require gradients,
        made outside any inference mode (so that they keep version counters)."""
        layer = self.model.encoder.layers[index]
        with torch.inference_mode(False):
            empty_parameters(
                layer.modules(), lambda tensor, _module: tensor.dtype, requires_grad=True
            )
            fill_state(self.model, self.plan, self.names(index))
        left = [name for name, p in layer.named_parameters() if p.is_meta]
        if left:
            raise RuntimeError(f"layer {index} kept {left[:3]} on the meta device")

    def names(self, index: int) -> list[str]:
        """The parameter names of layer ``index`` that the checkpoint fills."""
        prefix = f"{LAYERS}{index}."
        return [target for target, _ in self.plan.fills if target.startswith(prefix)]

    def read_all(self) -> None:
        """Every layer still unread (a caller that needs the float32 model after all)."""
        for index, layer in enumerate(self.model.encoder.layers):
            if any(p.is_meta for p in layer.parameters()):
                self.read(index)


def fill_outside_layers(model: EncoderModel, plan: StatePlan) -> None:
    """Make every parameter and buffer outside ``encoder.layers`` real (float32 as built) and
    fill the parameters from the checkpoint."""
    layers = {id(m) for m in model.encoder.layers.modules()}
    outside = [m for m in model.modules() if id(m) not in layers]
    empty_parameters(outside, lambda tensor, _module: tensor.dtype, requires_grad=True)
    fill_state(model, plan, [t for t, _ in plan.fills if not t.startswith(LAYERS)])


__all__ = ["LAYERS", "DeferredLayers", "fill_outside_layers"]
