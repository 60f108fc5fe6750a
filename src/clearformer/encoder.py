"""The encoder stack: N blocks, one plan for the whole stack, a final norm for pre-norm.

A call is planned once at the stack's edge (:mod:`clearformer.plan`): the mask is validated, the
layout and kernel are chosen, and every block receives the same plan. On a ragged batch the
stack unpads once (``(B, T, D)`` -> ``(N, D)`` real tokens), runs every block on the packed rows
and repads once at the end. Either way the output at padded positions is **zero**, so the
padded and packed paths give the same tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from . import reference
from .blocks import EncoderBlock
from .config import EncoderConfig
from .dtypes import rows_dtype
from .norms import make_norm
from .padding import repad
from .plan import Ask, CallPlan, Rows, plan_stack
from .relative_bias import RelativePositionBias


@dataclass(frozen=True)
class EncoderOutput:
    """A stack call's results when more than the last layer is asked for.

    Attributes:
        last_hidden_state: (B, T, D), zero at padded positions (after the final norm).
        hidden_states: with ``output_hidden_states``: the stack's input and every block's
            output, ``n_layers + 1`` tensors (B, T, D), zero at padded positions (as Hugging
            Face's ``output_hidden_states``; a final norm applies to ``last_hidden_state`` only).
        attentions: with ``output_attentions``: every block's attention probabilities
            (B, H, T, T), from the reference kernel.
    """

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class Encoder(nn.Module):
    """A stack of :class:`~clearformer.blocks.EncoderBlock` built from an :class:`EncoderConfig`.

    Each block is initialised independently (no clones of one initialisation).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderConfig):
            raise TypeError(f"config must be an EncoderConfig, got {type(config).__name__}")
        self.config = config
        self.layers = nn.ModuleList(
            EncoderBlock(
                config.d_model,
                config.n_heads,
                config.dim_mlp,
                config.dropout,
                norm=config.norm,
                activation=config.activation,
                attn_dropout=config.attn_dropout,
                norm_eps=config.norm_eps,
                bias=config.bias,
                backend=config.backend,
                attn_norm=config.first_attn_norm or index > 0,
                n_kv_heads=config.n_kv_heads,
                head_dim=config.head_width,
                attn_scale=config.attn_scale,
                qk_norm=config.qk_norm,
                norm_kind=config.norm_kind,
                norm_unit_offset=config.norm_unit_offset,
                branch_norm=config.branch_norm,
            )
            for index in range(config.n_layers)
        )
        self.final_norm = (
            make_norm(
                config.norm_kind,
                config.d_model,
                config.norm_eps,
                bias=config.bias,
                unit_offset=config.norm_unit_offset,
            )
            if config.use_final_norm
            else nn.Identity()
        )
        # One relative position bias for all layers (MPNet), or none.
        self.relative_bias = (
            RelativePositionBias(
                config.relative_attention_buckets,
                config.relative_attention_max_distance,
                config.n_heads,
            )
            if config.relative_attention_buckets
            else None
        )

    def plan_for(
        self,
        mask: Tensor | None,
        *,
        shape: tuple[int, int] | None = None,
        device: torch.device | None = None,
        backend: str | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        dtype: torch.dtype | None = None,
        mask_name: str = "mask",
        cu_seqlens: Tensor | None = None,
        checkpointing: bool | None = None,
        rows_alone: bool = False,
    ) -> CallPlan:
        """The plan of a call with this (B, T) mask: layout, kernel and the reason for each.

        Printed, the plan says what will run and why. ``shape`` and ``device``
        default to the mask's; with no mask they describe the batch. ``dtype`` defaults to the
        parameters' (the input's, in a forward). With ``cu_seqlens`` (rows packed by the
        caller) the mask must be None and the layout gives the shape and device.
        ``checkpointing`` (recompute activations in backward) defaults to the config's.
        ``rows_alone``: each row's result must not depend on its batch-mates (a batch with
        padding is packed).
        """
        ask = self._ask(
            backend, output_attentions, output_hidden_states, checkpointing, rows_alone, mask_name
        )
        dtype = self._dtype() if dtype is None else dtype
        rows = Rows.described(mask, shape, device, dtype, cu_seqlens)
        return plan_stack(self, rows, mask, ask, cu_seqlens=cu_seqlens)

    def _ask(
        self,
        backend: str | None,
        output_attentions: bool,
        output_hidden_states: bool,
        checkpointing: bool | None,
        rows_alone: bool = False,
        mask_name: str = "mask",
    ) -> Ask:
        """What a call asks for, the config's defaults filled in."""
        return Ask.checked(
            backend=self.config.backend if backend is None else backend,
            need_weights=output_attentions,
            output_hidden_states=output_hidden_states,
            checkpointing=self.config.checkpointing if checkpointing is None else checkpointing,
            rows_alone=rows_alone,
            mask_name=mask_name,
        )

    def _dtype(self) -> torch.dtype:
        """The dtype the stack computes in (its products' parameters'), for the plan's kernel
        choice."""
        dtype = rows_dtype(self)
        return torch.float32 if dtype is None else dtype

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        backend: str | None = None,
        plan: CallPlan | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        cu_seqlens: Tensor | None = None,
        checkpointing: bool | None = None,
        rows_alone: bool = False,
    ) -> Tensor | EncoderOutput:
        """Encode a batch.

        Args:
            x: (B, T, D) input vectors; or (N, D) packed rows with ``cu_seqlens``.
            mask: (B, T) bool, True = real token, False = padding.
            cu_seqlens: (B + 1,) int cumulative lengths of packed rows ``x`` (sequence b is
                rows ``cu_seqlens[b]:cu_seqlens[b + 1]``); then the output is packed too.
            backend: this call's kernel (``auto``, ``math``, ``sdpa``, ``varlen``); default the
                config's.
            plan: a plan from :meth:`plan_for` for this batch (then no mask, backend or flags).
            output_attentions: also return every layer's attention probabilities.
            output_hidden_states: also return the input and every layer's output.
            checkpointing: recompute every block's activations in backward instead of keeping
                them (less memory, about a third more compute); default the config's. Only in
                training mode with gradients enabled.
            rows_alone: each row's result must not depend on its batch-mates.

        Returns:
            (B, T, D) hidden states, zero at padded positions ((N, D) for packed rows); an
            :class:`EncoderOutput` when attentions or hidden states are asked for.
        """
        ask = None
        if plan is None:
            ask = self._ask(
                backend, output_attentions, output_hidden_states, checkpointing, rows_alone
            )
        elif any((output_attentions, output_hidden_states, rows_alone)) or any(
            given is not None for given in (mask, backend, checkpointing, cu_seqlens)
        ):
            raise ValueError(
                "give either a plan or mask/backend/output/checkpointing flags/cu_seqlens, not "
                "both: the plan holds them"
            )
        plan = plan_stack(self, x, mask, ask, cu_seqlens=cu_seqlens, given=plan)
        return self.run(x, plan)

    def run(self, x: Tensor, plan: CallPlan) -> Tensor | EncoderOutput:
        """The stack on a (B, T, D) batch (or (N, D) packed rows) as ``plan`` says; the plan is
        trusted as it is."""
        recompute = plan.checkpointing and self.training and torch.is_grad_enabled()
        if plan.kernel.choice == "math" and not plan.packed and not recompute:
            return self._run_reference(x, plan)
        hidden: list[Tensor] = []
        attentions: list[Tensor] = []
        bias = None
        if plan.score_bias:
            # The bias comes from parameters: computed once per call, handed to every layer.
            longest = plan.packing.max_seqlen if plan.packed else plan.tq
            bias = self.relative_bias(longest)  # (H, L, L)
        if plan.packed and not plan.packed_input:
            x = x.reshape(-1, x.shape[-1]).index_select(0, plan.packing.indices)  # (N, D)
        elif plan.token_mask is not None:
            # Padded rows become zeros once, here: whatever they held (NaN included) can then
            # never reach a real token through a zero attention weight (0 * NaN is NaN).
            x = torch.where(plan.token_mask[..., None], x, 0.0)
        if plan.output_hidden_states:
            hidden.append(_padded_output(x, plan))
        for index, block in enumerate(self.layers):
            layer_plan = plan.layer(index)
            # Through the module's __call__ (not block.run), so that hooks fire per block.
            if recompute:
                # Only the block's input is kept for backward; the rest is computed again then.
                out = checkpoint(
                    block, x, plan=layer_plan, stacked=True, bias=bias, use_reentrant=False
                )
            else:
                out = block(x, plan=layer_plan, stacked=True, bias=bias)
            x = out.hidden
            if plan.output_hidden_states:
                hidden.append(_padded_output(x, plan))
            if plan.need_weights:
                attentions.append(out.attention)
        last = _padded_output(self.final_norm(x), plan)
        return _outputs(last, hidden, attentions, plan)

    def _run_reference(self, x: Tensor, plan: CallPlan) -> Tensor | EncoderOutput:
        """The ``math`` kernel on the padded layout: the reference encoder
        (:func:`clearformer.reference.encoder`), which ``explain`` records."""
        last, hidden, attentions = reference.encoder(self, x, plan.token_mask)
        return _outputs(last, list(hidden), list(attentions), plan)


def _outputs(
    last: Tensor, hidden: list[Tensor], attentions: list[Tensor], plan: CallPlan
) -> Tensor | EncoderOutput:
    if not (plan.output_hidden_states or plan.need_weights):
        return last
    return EncoderOutput(
        last,
        tuple(hidden) if plan.output_hidden_states else None,
        tuple(attentions) if plan.need_weights else None,
    )


def _padded_output(rows: Tensor, plan: CallPlan) -> Tensor:
    """(N, D) packed or (B, T, D) padded rows -> (B, T, D) with zeros at padded positions;
    rows the caller packed stay packed."""
    if plan.packed_input:
        return rows
    if plan.packed:
        return repad(rows, plan.packing)
    if plan.token_mask is None:
        return rows
    return torch.where(plan.token_mask[..., None], rows, 0.0)  # one pass (masked_fill clones)
