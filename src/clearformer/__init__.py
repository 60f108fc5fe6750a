"""clearformer: a readable, verified and fast Transformer encoder for PyTorch.

Dimensions used throughout: B batch, T sequence (Tq queries, Tk keys), S source/memory length,
D model width, H heads, Dh head width, N real tokens of a packed batch.
"""

from .attention import MultiHeadAttention
from .blocks import EncoderBlock
from .config import EncoderConfig
from .encoder import Encoder
from .explainer import explain
from .feedforward import FeedForward
from .model import EncoderModel
from .text import TextEncoder

__version__ = "0.1.0"

__all__ = [
    "Encoder",
    "EncoderBlock",
    "EncoderConfig",
    "EncoderModel",
    "FeedForward",
    "MultiHeadAttention",
    "TextEncoder",
    "explain",
    "__version__",
]
