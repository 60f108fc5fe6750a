"""``clearformer.explain(model, inputs, mask=None) -> Trace``: record the real forward pass."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks import EncoderBlock
from ..tracing import recording
from .inputs import Prepared, prepare
from .recorder import TraceRecorder, summarize
from .reference import REFERENCE, REFERENCE_BACKEND, eval_mode, production_path
from .source import Source, display_path
from .steps import ModelFacts
from .trace import Fidelity, Trace

TOLERANCE = 1e-5  # float32: the reference and the fused kernels differ by rounding only


def explain(
    model: Any,
    inputs: Any,
    mask: Tensor | None = None,
    *,
    tokens: list[str] | list[list[str]] | None = None,
    tolerance: float = TOLERANCE,
) -> Trace:
    """Run ``model`` on ``inputs`` and narrate every step of its forward pass.

    Args:
        model: a ``TextEncoder`` (given texts), an ``EncoderModel`` (given token ids), or an
            ``Encoder`` / ``EncoderBlock`` (given vectors).
        inputs: a text or list of texts; (B, T) or (T,) token ids; (B, T, D) or (T, D) vectors.
        mask: (B, T), True (or 1) = real token; None = every position is real. Text encoders
            make their own.
        tokens: labels of the positions (one list, or B lists of T strings) for ids or vectors.
        tolerance: the largest |traced - production| accepted before the trace says it drifted.

    Returns:
        A :class:`~clearformer.explainer.trace.Trace`. The model is run twice under
        ``torch.no_grad()`` in eval mode: once as in production, once on the reference
        kernel (``backend="math"`` for that call) with recording on; the trace holds the second
        run's values and how far they are from the first. No module or config is changed, so the
        same model can serve other threads meanwhile (a model in training mode is switched to
        eval for the two runs and back).
    """
    prepared = prepare(model, inputs, mask, tokens)
    module = prepared.module
    facts = _facts(module, prepared.text_encoder)
    first_layer = 0 if isinstance(module, EncoderBlock) else None
    notes: list[str] = []
    with torch.no_grad(), eval_mode(module) as was_training:
        production = prepared.forward()
        described, why, switched = production_path(
            module, prepared.token_mask, prepared.layout_mask
        )
        recorder = TraceRecorder(facts, prepared.token_mask, first_layer)
        # The reference kernel for this one call only: no module or config is changed.
        with recording(recorder):
            traced = prepared.forward(backend=REFERENCE_BACKEND)
        pooled, production_pooled = _pool(prepared, recorder, traced, production)

    info = _model_info(module, facts, prepared)
    if len(recorder.attention) != info["n_layers"]:
        raise RuntimeError(
            f"the trace saw {len(recorder.attention)} attention maps for "
            f"{info['n_layers']} blocks; the reference path was not taken"
        )
    diff = float((traced - production).abs().max()) if traced.numel() else 0.0
    if pooled is not None:
        diff = max(diff, float((pooled - production_pooled).abs().max()))
    fidelity = Fidelity(described, REFERENCE, switched, diff, tolerance)
    # A note is read as one sentence: the plan's reasons, which carry parentheses of their
    # own, go into a note of their own rather than inside this one's.
    if switched:
        notes.append(
            f"production runs {described}, which cannot return attention weights, so this "
            f"trace ran the reference path, {REFERENCE}, with the same modules and "
            f"parameters: max |trace - production| = {diff:.1e}"
        )
    else:
        notes.append(f"traced on the production path: {described}")
    if why:
        notes.append(f"why production takes that path: {why}")
    if not fidelity.ok:
        notes.append(
            f"warning: the traced output differs from production by {diff:.2e}, above the "
            f"tolerance {tolerance:g}"
        )
    if was_training:
        notes.append("the model was in training mode: explained in eval mode (dropout off)")
    for i, cut in enumerate(prepared.truncated):
        if cut:
            limit = (
                getattr(prepared.text_encoder, "max_length", None) or prepared.token_mask.shape[1]
            )
            notes.append(f"text {i} is longer than the model's limit: truncated to {limit} tokens")
    return Trace(
        model=info,
        tokens=prepared.tokens,
        token_mask=prepared.token_mask.cpu(),
        texts=prepared.texts,
        truncated=prepared.truncated or [False] * prepared.token_mask.shape[0],
        notes=notes,
        steps=recorder.steps,
        attention=recorder.attention,
        output=traced.cpu(),
        pooled=None if pooled is None else pooled.cpu(),
        fidelity=fidelity,
        output_stats=summarize(traced, ("B", "T", "D"), prepared.token_mask),
    )


def _pool(
    prepared: Prepared, recorder: TraceRecorder, traced: Tensor, production: Tensor
) -> tuple[Tensor | None, Tensor | None]:
    """Pool (and normalise) both runs' hidden states as the text encoder does; record the
    traced run's."""
    encoder = prepared.text_encoder
    if encoder is None or not callable(getattr(encoder, "pool", None)):
        return None, None
    mask = prepared.token_mask
    pooled = encoder.pool(traced, mask)  # (B, D)
    production_pooled = encoder.pool(production, mask)
    recorder.add("pooling", pooled, _source_of(encoder.pool, "return "))
    if getattr(encoder, "normalize", False):
        pooled = F.normalize(pooled, p=2, dim=-1)
        production_pooled = F.normalize(production_pooled, p=2, dim=-1)
        recorder.add("normalize", pooled, _source_of(_pool, "F.normalize("))
    return pooled, production_pooled


def _source_of(fn: Any, anchor: str | None = None) -> Source:
    """Where ``fn`` lives: its first line containing ``anchor``, else its ``def`` line."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        path = inspect.getsourcefile(fn) or ""
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return Source("?", 0, "", getattr(fn, "__name__", ""))
    offset = next((i for i, text in enumerate(lines) if anchor and anchor in text), 0)
    return Source(display_path(path), start + offset, lines[offset].strip(), fn.__name__)


def _facts(module: nn.Module, text_encoder: Any) -> ModelFacts:
    if isinstance(module, EncoderBlock):
        return ModelFacts(
            norm=module.norm,
            activation=module.mlp.activation,
            gated=module.mlp.gated,
            final_norm=False,
        )
    cfg = module.config
    return ModelFacts(
        norm=cfg.norm,
        activation=cfg.activation,
        gated=cfg.activation in ("swiglu", "geglu"),
        final_norm=cfg.use_final_norm,
        embedding_norm=cfg.embedding_norm,
        token_types=cfg.type_vocab_size > 0,
        pooling=getattr(text_encoder, "pooling", None),
        normalize=bool(getattr(text_encoder, "normalize", False)),
    )


def _model_info(module: nn.Module, facts: ModelFacts, prepared: Prepared) -> dict[str, Any]:
    if isinstance(module, EncoderBlock):
        d_model, n_heads, n_layers = module.d_model, module.attn.n_heads, 1
        dim_mlp, backend = module.mlp.fc_out.in_features, module.attn.backend
    else:
        cfg = module.config
        d_model, n_heads, n_layers = cfg.d_model, cfg.n_heads, cfg.n_layers
        dim_mlp, backend = cfg.dim_mlp, cfg.backend
    return {
        "kind": prepared.kind,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "d_model": d_model,
        "head_dim": d_model // n_heads,
        "dim_mlp": dim_mlp,
        "norm": facts.norm,
        "activation": facts.activation,
        "final_norm": facts.final_norm,
        "backend": backend,
        "pooling": facts.pooling,
        "normalize": facts.normalize,
        "parameters": sum(p.numel() for p in module.parameters()),
    }
