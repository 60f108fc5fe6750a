"""clearformer: a readable, verified and fast Transformer encoder for PyTorch.

Dimensions used throughout: B batch, T sequence (Tq queries, Tk keys), S source/memory length,
D model width, H heads, Dh head width, N real tokens of a packed batch.
"""

from .attention import MultiHeadAttention
from .blocks import EncoderBlock
from .config import EncoderConfig
from .encoder import Encoder, EncoderOutput
from .explainer import explain
from .feedforward import FeedForward
from .interop.torch_nn import from_torch, to_torch
from .model import EncoderModel
from .plan import ForwardPlan
from .text import TextEncoder

__version__ = "0.1.0"

__all__ = [
    "Encoder",
    "EncoderBlock",
    "EncoderConfig",
    "EncoderModel",
    "EncoderOutput",
    "FeedForward",
    "ForwardPlan",
    "MultiHeadAttention",
    "TextEncoder",
    "explain",
    "from_torch",
    "to_torch",
    "__version__",
]
