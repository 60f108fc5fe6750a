"""Export for deployment: the encoder's padded path as a ``torch.export`` program or ONNX.

* :mod:`.module` -- :class:`ExportableEncoder` (the traced module) and :func:`export_program`;
* :mod:`.onnx` -- :func:`export_onnx`: ``model.onnx`` with the tokenizer and configs beside it,
  checked against clearformer under onnxruntime, written atomically.

See docs/export.md.
"""

from .module import EXPORT_BACKENDS, ExportableEncoder, export_program
from .onnx import DEFAULT_OPSET, INSTALL_HINT, TOLERANCE, ExportError, OnnxExport, export_onnx

__all__ = [
    "DEFAULT_OPSET",
    "EXPORT_BACKENDS",
    "INSTALL_HINT",
    "TOLERANCE",
    "ExportError",
    "ExportableEncoder",
    "OnnxExport",
    "export_onnx",
    "export_program",
]
