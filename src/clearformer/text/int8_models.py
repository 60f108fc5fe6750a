"""The int8 copies of a ``TextEncoder``'s model that ``encode(precision="int8")`` runs: built
once per encoder, calibrated on a few texts, and a compiled variant for large calls; and the
``"int8-blocks"`` model (:func:`int8_blocks_model`), which needs no calibration."""

from __future__ import annotations

import copy
import logging
import threading
import time

import torch

from ..model import EncoderModel
from .workers import run_at_worker_shares

log = logging.getLogger(__name__)


class Int8Models:
    """The eager int8 copy of ``model`` and, on request, its compiled variant, each built once.

    Args:
        model: the float32 model (never changed, except by :meth:`hold`).
        tokenizer: the encoder's tokenizer, for the calibration texts.
        deferred: the model's encoder layers still unread (``load_model(defer_layers=True)``),
            for :meth:`hold` to read and convert one at a time; None: all read.
    """

    def __init__(self, model: EncoderModel, tokenizer, deferred=None) -> None:
        self._model: EncoderModel | None = model
        self._deferred = deferred
        self._tokenizer = tokenizer
        self._built: dict[bool, EncoderModel] = {}  # fused or not -> model, built once each
        self._lock = threading.Lock()
        self._calibration = None

    def hold(self) -> EncoderModel:
        """Convert the float32 model itself into the eager int8 one and forget it (an encoder
        loaded in int8 holds that model alone): each float layer goes as its int8 layer
        replaces it, so the conversion never holds a second copy of what stays float32. With
        the layers deferred, each encoder layer is read as the calibration run reaches it and
        converted once it has run (:func:`clearformer.quant.streamed.quantize_int8_by_block`):
        one layer's float32 weights at a time, the same int8 model to the bit."""
        with self._lock:
            if self._built:
                raise RuntimeError("hold() converts the float32 model before any int8 call")
            if self._deferred is not None and self._model.config.backend == "math":
                self._deferred.read_all()  # the reference stack calls no block's hooks
            elif self._deferred is not None:
                self._built[False] = self._quantize_by_layer()
            if not self._built:
                self._built[False] = self._quantize(in_place=True)
            self._model = self._deferred = None
            return self._built[False]

    def _quantize_by_layer(self) -> EncoderModel:
        from ..quant.smoothing_texts import SMOOTHING_TEXTS
        from ..quant.streamed import quantize_int8_by_block
        from ..runtime import release_freed_memory

        started = time.perf_counter()
        self._calibration = self._tokenizer(list(SMOOTHING_TEXTS))
        layers = self._model.encoder.layers
        blocks = [(f"encoder.layers.{i}", layer) for i, layer in enumerate(layers)]
        deferred = self._deferred

        def read(index: int) -> None:
            read_layer(deferred, index)

        model = quantize_int8_by_block(self._model, self._calibrate, blocks, read).eval()
        release_freed_memory()
        log.info(
            "read and built the int8 model layer by layer in %.2fs", time.perf_counter() - started
        )
        return model

    def _quantize(self, in_place: bool) -> EncoderModel:
        from ..quant import quantize_int8_calibrated
        from ..quant.smoothing_texts import SMOOTHING_TEXTS

        started = time.perf_counter()
        self._calibration = self._tokenizer(list(SMOOTHING_TEXTS))
        model = quantize_int8_calibrated(self._model, self._calibrate, in_place=in_place).eval()
        log.info("built the int8 model in %.2fs", time.perf_counter() - started)
        return model

    def get(self, fused: bool) -> EncoderModel:
        """The eager (``fused`` False) or compiled variant; see ``TextEncoder.int8_model``."""
        with self._lock:
            if False not in self._built:
                self._built[False] = self._quantize(in_place=False)
            if fused and True not in self._built:
                from ..quant import Int8Linear

                started = time.perf_counter()
                eager = self._built[False]
                # A second module tree over the same tensors: only the modules are copied.
                shared = {id(t): t for t in (*eager.parameters(), *eager.buffers())}
                model = copy.deepcopy(eager, memo=shared)
                for module in model.modules():
                    if isinstance(module, Int8Linear):
                        module.fused = True
                self._calibrate(model)  # compiles now, in the calling thread ...
                # ... and at the thread count of encode's default workers, which the compiled
                # code guards on: otherwise each worker would recompile on its first batch.
                run_at_worker_shares(lambda: self._calibrate(model))
                self._built[True] = model
                log.info("compiled the int8 steps in %.2fs", time.perf_counter() - started)
            return self._built[fused]

    @torch.inference_mode()
    def _calibrate(self, model: EncoderModel) -> None:
        batch = self._calibration
        model(batch.input_ids, batch.attention_mask, batch.token_type_ids)


def int8_blocks_model(model: EncoderModel, deferred=None, in_place: bool = False) -> EncoderModel:
    """``model`` with every linear layer as an
    :class:`~clearformer.quant.int8_blocks.Int8BlockLinear` (a copy, or ``model`` itself
    ``in_place``). With ``deferred`` (an int8-blocks load, ``in_place``), each encoder layer is
    read, converted and its float32 weights freed before the next is read."""
    from ..quant.int8_blocks import quantize_int8_blocks
    from ..runtime import release_freed_memory

    if deferred is not None and not in_place:
        raise ValueError(
            "int8_blocks_model reads a deferred load's layers into model itself: pass "
            "in_place=True with deferred"
        )
    started = time.perf_counter()
    if deferred is not None:
        for index, layer in enumerate(model.encoder.layers):
            read_layer(deferred, index)
            quantize_int8_blocks(layer, in_place=True)
        release_freed_memory()
    result = quantize_int8_blocks(model, in_place=in_place).eval()
    log.info("built the int8-blocks model in %.2fs", time.perf_counter() - started)
    return result


def read_layer(deferred, index: int) -> None:
    """Read encoder layer ``index`` of a deferred load (an int8 load converts each before the
    next is read)."""
    from ..runtime import release_freed_memory

    # The layer before was just converted and its float32 weights freed: their pages go back
    # before this layer's are read, or the heap would keep every layer's.
    release_freed_memory()
    deferred.read(index)
