"""clearformer: a readable, verified and fast Transformer encoder for PyTorch.

Dimensions used throughout: B batch, T sequence (Tq queries, Tk keys), S source/memory length,
D model width, H heads, Dh head width, N real tokens of a packed batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy_exports import lazy_exports as _lazy_exports
from .version import __version__

# The public names and the modules that define them. They are imported on first use (PEP 562),
# so that ``import clearformer.cli`` -- which every ``clearformer`` command runs, ``--help``
# included -- does not import torch and the model code before it has parsed its arguments.
_EXPORTS = {
    "MultiHeadAttention": ".attention",
    "EncoderBlock": ".blocks",
    "EncoderConfig": ".config",
    "Encoder": ".encoder",
    "EncoderOutput": ".encoder",
    "explain": ".explainer",
    "FeedForward": ".feedforward",
    "from_torch": ".interop.torch_nn",
    "to_torch": ".interop.torch_nn",
    "EncoderModel": ".model",
    "ForwardPlan": ".plan",
    "TextEncoder": ".text",
    "CrossEncoder": ".text",
    "MultiVectorEncoder": ".text",
    "BGEM3Encoder": ".text",
    "SparseEncoder": ".text",
    "DecoderBlock": ".decoder_block",
    "LayerCache": ".decoder_block",
    "Decoder": ".decoder",
    "DecoderCache": ".decoder",
    "DecoderConfig": ".decoder",
    "Seq2SeqConfig": ".seq2seq",
    "Seq2SeqTransformer": ".seq2seq",
    "Generated": ".generation",
    "TrainConfig": ".train",
}

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # for type checkers and editors: the names as if imported eagerly
    from .attention import MultiHeadAttention
    from .blocks import EncoderBlock
    from .config import EncoderConfig
    from .decoder import Decoder, DecoderCache, DecoderConfig
    from .decoder_block import DecoderBlock, LayerCache
    from .encoder import Encoder, EncoderOutput
    from .explainer import explain
    from .feedforward import FeedForward
    from .generation import Generated
    from .interop.torch_nn import from_torch, to_torch
    from .model import EncoderModel
    from .plan import ForwardPlan
    from .seq2seq import Seq2SeqConfig, Seq2SeqTransformer
    from .text import BGEM3Encoder, CrossEncoder, MultiVectorEncoder, SparseEncoder, TextEncoder
    from .train import TrainConfig


__all__ = [
    "BGEM3Encoder",
    "CrossEncoder",
    "MultiVectorEncoder",
    "Decoder",
    "DecoderBlock",
    "DecoderCache",
    "DecoderConfig",
    "Generated",
    "LayerCache",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "SparseEncoder",
    "Encoder",
    "EncoderBlock",
    "EncoderConfig",
    "EncoderModel",
    "EncoderOutput",
    "FeedForward",
    "ForwardPlan",
    "MultiHeadAttention",
    "TextEncoder",
    "TrainConfig",
    "explain",
    "from_torch",
    "to_torch",
    "__version__",
]
