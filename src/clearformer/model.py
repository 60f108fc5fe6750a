"""``EncoderModel``: token ids in, hidden states out (embeddings + encoder stack)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import EncoderConfig
from .embeddings import Embeddings
from .encoder import Encoder, EncoderOutput
from .masks import from_attention_mask
from .positions import padded_positions, past_pad_ids


class EncoderModel(nn.Module):
    """Embeddings followed by an :class:`~clearformer.encoder.Encoder`."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderConfig):
            raise TypeError(f"config must be an EncoderConfig, got {type(config).__name__}")
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        backend: str | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        cu_seqlens: Tensor | None = None,
        checkpointing: bool | None = None,
        rows_alone: bool = False,
    ) -> Tensor | EncoderOutput:
        """Encode token ids.

        Args:
            input_ids: (B, T) int64 token ids; or (N,) packed ids with ``cu_seqlens``.
            attention_mask: (B, T), bool or 0/1 integers (Hugging Face style): 1/True = token.
            token_type_ids: (B, T) segment ids, when the model has token types.
            backend: this call's attention kernel; default the config's.
            output_attentions: also return every layer's attention probabilities.
            output_hidden_states: also return the embeddings' output and every layer's output.
            cu_seqlens: (B + 1,) int cumulative lengths of packed ``input_ids``: sequence b is
                ids ``cu_seqlens[b]:cu_seqlens[b + 1]`` (what a training collator makes, so
                that no padding reaches the model). Then no ``attention_mask``.
            checkpointing: recompute every block's activations in backward instead of keeping
                them (training: less memory, more compute); default the config's.
            rows_alone: each text's result must not depend on the texts beside it in the
                batch (the text applications' rule: a batch with padding is packed).

        Returns:
            (B, T, D) hidden states, zero at padded positions ((N, D) for packed ids); an
            :class:`~clearformer.encoder.EncoderOutput` when more is asked for.
        """
        if cu_seqlens is not None:
            return self._forward_packed(
                input_ids,
                cu_seqlens,
                attention_mask,
                token_type_ids,
                backend=backend,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                checkpointing=checkpointing,
                rows_alone=rows_alone,
            )
        check_token_ids(input_ids, self.config)
        B, T = input_ids.shape
        mask = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor):
                raise TypeError(
                    f"attention_mask must be a torch.Tensor or None, "
                    f"got {type(attention_mask).__name__}"
                )
            mask = from_attention_mask(attention_mask)
        if token_type_ids is not None:
            self._check_token_types(token_type_ids, B, T)
        # Planned before any work: the mask is checked here, once, for every layer.
        plan = self.encoder.plan_for(
            mask,
            shape=(B, T),
            device=input_ids.device,
            backend=backend,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            checkpointing=checkpointing,
            dtype=self.embeddings.word.weight.dtype,
            mask_name="attention_mask",
            rows_alone=rows_alone,
        )
        # Positions count each sequence's real tokens, as on the packed layout and for rotary
        # tables: a text padded on the left gets the positions it has alone. Without a mask,
        # the plain 0 .. T-1.
        positions = None if plan.token_mask is None else padded_positions(plan.token_mask)
        if self.counts_past_pads:
            positions = past_pad_ids(
                input_ids, positions, self.config.pad_token_id, real=plan.token_mask
            )
        x = self.embeddings(input_ids, token_type_ids, positions)  # (B, T, D)
        return self.encoder.run(x, plan)

    def _forward_packed(
        self,
        input_ids: Tensor,
        cu_seqlens: Tensor,
        attention_mask: Tensor | None,
        token_type_ids: Tensor | None,
        **flags,
    ) -> Tensor | EncoderOutput:
        if attention_mask is not None:
            raise ValueError(
                "attention_mask must be None with cu_seqlens: packed ids are all real tokens"
            )
        check_token_ids(input_ids, self.config, packed=True)
        plan = self.encoder.plan_for(
            None,
            cu_seqlens=cu_seqlens,
            dtype=self.embeddings.word.weight.dtype,
            mask_name="attention_mask",
            **flags,
        )
        N = input_ids.shape[0]
        if plan.packing.num_tokens != N or cu_seqlens.device != input_ids.device:
            raise ValueError(
                f"cu_seqlens must end at N={N} (the number of packed ids) on input_ids' device "
                f"{input_ids.device}, got {plan.packing.num_tokens} on {cu_seqlens.device}"
            )
        if plan.packing.max_seqlen > self.config.max_length:
            raise ValueError(
                f"cu_seqlens holds a sequence of {plan.packing.max_seqlen} tokens, above the "
                f"model's limit max_length={self.config.max_length}; truncate the input"
            )
        if token_type_ids is not None:
            self._check_token_types(token_type_ids, N)
        positions = plan.packing.positions  # (N,)
        if self.counts_past_pads:
            positions = past_pad_ids(
                input_ids, positions, self.config.pad_token_id, cu_seqlens=cu_seqlens
            )
        x = self.embeddings(input_ids, token_type_ids, positions)  # (N, D)
        return self.encoder.run(x, plan)

    @property
    def counts_past_pads(self) -> bool:
        """RoBERTa's learned positions (offset pad_token_id + 1) skip pad ids in a text."""
        config = self.config
        return (
            config.positions == "learned"
            and config.pad_token_id is not None
            and config.position_offset == config.pad_token_id + 1
        )

    def _check_token_types(self, token_type_ids: Tensor, *shape: int) -> None:
        if not isinstance(token_type_ids, Tensor) or tuple(token_type_ids.shape) != shape:
            got = getattr(token_type_ids, "shape", type(token_type_ids).__name__)
            form = "(B, T)" if len(shape) == 2 else "(N,)"
            raise ValueError(f"token_type_ids must have shape {form} = {shape}, got {got}")
        dtype = token_type_ids.dtype
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            # An embedding lookup would fail deep inside, naming neither the argument nor why.
            raise TypeError(f"token_type_ids must be integer segment ids, got dtype {dtype}")
        if not token_type_ids.numel():
            return
        low, high = int(token_type_ids.min()), int(token_type_ids.max())
        types = self.config.type_vocab_size
        if types == 0 and (low, high) != (0, 0):
            # Zeros are what a tokenizer gives for single texts; anything else would be dropped.
            raise ValueError(
                "token_type_ids must be all 0: the model has no token type embeddings "
                f"(type_vocab_size=0), got values in [{low}, {high}]"
            )
        if types > 0 and (low < 0 or high >= types):
            raise ValueError(
                f"token_type_ids must be in [0, {types}) (type_vocab_size), "
                f"got values in [{low}, {high}]"
            )


def check_token_ids(
    input_ids: Tensor, config: EncoderConfig, name: str = "input_ids", *, packed: bool = False
) -> None:
    """Raise unless ``input_ids`` is a (B, T) integer tensor of ids the model can embed (or
    (N,) packed ids when ``packed``; their sequences' lengths are checked with cu_seqlens).

    The one check of token ids, for the model and for every entry point that takes ids.
    """
    if not isinstance(input_ids, Tensor):
        raise TypeError(
            f"{name} must be a (B, T) tensor of integer token ids, got {type(input_ids).__name__}"
        )
    if (
        input_ids.dtype.is_floating_point
        or input_ids.dtype.is_complex
        or (input_ids.dtype == torch.bool)
    ):
        raise TypeError(f"{name} must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() != (1 if packed else 2):
        form = "(N,) with cu_seqlens" if packed else "(B, T)"
        raise ValueError(
            f"{name} must be integer token ids of shape {form}, got shape {tuple(input_ids.shape)}"
        )
    T = input_ids.shape[-1]
    if not packed and config.max_length < T:
        raise ValueError(
            f"{name} has T={T} tokens, above the model's limit max_length={config.max_length}; "
            "truncate the input"
        )
    vocab = config.vocab_size
    if not input_ids.numel():
        return
    # Both ends in one pass and one read back to the host (a synchronisation on a GPU, where
    # an id out of range would otherwise end in a device-side assert that spoils the context).
    low, high = torch.stack(torch.aminmax(input_ids)).tolist()
    if low < 0 or high >= vocab:
        raise ValueError(
            f"{name} must be token ids in [0, vocab_size={vocab}), got values in [{low}, {high}]"
        )
