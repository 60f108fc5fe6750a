"""Configuration at the model boundary: one frozen, validated dataclass per model."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .checks import (
    check_bool,
    check_choice,
    check_divisible,
    check_int,
    check_positive_float,
    check_positive_int,
    check_probability,
)
from .options import ACTIVATIONS, BACKENDS, NORMS, POSITIONS

# Fields that earlier versions had, and what replaced them (for a clear error on old configs).
_RENAMED = {
    "packing": "backend ('auto' packs when it pays, 'varlen' always packs, 'sdpa' or 'math' "
    "never packs)",
}


@dataclass(frozen=True)
class EncoderConfig:
    """An encoder stack, and optionally its token embeddings.

    The stack alone (``Encoder``) needs the first block of fields; ``EncoderModel`` also reads
    the embedding fields (``vocab_size`` set).
    """

    d_model: int = 512  # width D of every token's vector
    n_heads: int = 8  # attention heads; d_model must be divisible by it
    n_layers: int = 6  # encoder blocks
    dim_mlp: int = 2048  # feed-forward hidden width (4 * d_model is customary)
    dropout: float = 0.0  # after attention and feed-forward (and on embeddings)
    attn_dropout: float | None = None  # on attention probabilities; None: same as dropout
    norm: str = "pre"  # "pre": stable without warm-up; "post": BERT and the original paper
    activation: str = "relu"  # relu (as torch.nn) | gelu (exact, BERT) | gelu_tanh | swiglu | geglu
    norm_eps: float = 1e-5  # LayerNorm epsilon; BERT checkpoints use 1e-12
    bias: bool = True  # biases in linear layers and norms; False is a bit faster
    final_norm: bool | None = None  # norm after the last block; None: only for pre-norm
    # Attention kernel and layout, one choice: auto (packed varlen when padding makes it pay,
    # else sdpa) | math (reference, padded) | sdpa (fused, padded) | varlen (always packed).
    # A call can override it: model(x, mask, backend="math").
    backend: str = "auto"
    # Recompute activations in backward to save memory (training): the default of calls that
    # do not choose, per call, with forward(..., checkpointing=...).
    checkpointing: bool = False
    # Layer types (ModernBERT): layer i is global when i % global_every == 0, else local; a
    # local layer's query i sees keys j with |i - j| <= local_window // 2. None: all global.
    local_window: int | None = None
    global_every: int = 1  # ModernBERT: 3
    # Rotary positions (positions="rotary"): the frequency base of global and of local layers.
    rope_theta: float = 10_000.0  # the paper's; ModernBERT's global layers: 160,000
    local_rope_theta: float | None = None  # None: rope_theta; ModernBERT: 10,000
    first_attn_norm: bool = True  # False: layer 0 has no attention norm (ModernBERT)
    # A learned score bias by relative distance, shared by all layers (MPNet: 32 buckets up
    # to distance 128; T5-style buckets, clearformer.relative_bias). 0: none.
    relative_attention_buckets: int = 0
    relative_attention_max_distance: int = 128

    # Embeddings (EncoderModel only).
    vocab_size: int | None = None  # token vocabulary; None: the model takes vectors, not ids
    max_positions: int = 512  # longest sequence the position table covers
    positions: str = "learned"  # learned | sinusoidal | rotary (in attention) | none
    type_vocab_size: int = 0  # BERT's segment (token type) embeddings; 0: none
    pad_token_id: int | None = 0  # its embedding row starts at zero and gets no gradient
    position_offset: int = 0  # RoBERTa counts positions from pad_token_id + 1
    embedding_norm: bool = False  # LayerNorm on the summed embeddings (BERT: yes)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "dim_mlp", "max_positions"):
            check_positive_int(getattr(self, name), f"EncoderConfig.{name}")
        check_divisible(self.d_model, self.n_heads, "EncoderConfig.d_model", "n_heads")
        check_probability(self.dropout, "EncoderConfig.dropout")
        check_probability(self.attn_dropout, "EncoderConfig.attn_dropout", optional=True)
        check_positive_float(self.norm_eps, "EncoderConfig.norm_eps")
        for name, allowed in (
            ("norm", NORMS),
            ("activation", ACTIVATIONS),
            ("backend", BACKENDS),
            ("positions", POSITIONS),
        ):
            check_choice(getattr(self, name), allowed, f"EncoderConfig.{name}")
        for name in ("bias", "checkpointing", "embedding_norm"):
            check_bool(getattr(self, name), f"EncoderConfig.{name}")
        check_bool(self.final_norm, "EncoderConfig.final_norm", optional=True)
        check_bool(self.first_attn_norm, "EncoderConfig.first_attn_norm")
        if not self.first_attn_norm and self.norm == "post":
            raise ValueError(
                "EncoderConfig.first_attn_norm=False needs norm='pre', got norm='post'"
            )
        check_positive_int(self.local_window, "EncoderConfig.local_window", optional=True)
        check_positive_int(self.global_every, "EncoderConfig.global_every")
        check_int(self.relative_attention_buckets, "EncoderConfig.relative_attention_buckets")
        check_positive_int(
            self.relative_attention_max_distance, "EncoderConfig.relative_attention_max_distance"
        )
        if self.relative_attention_buckets:
            buckets = self.relative_attention_buckets
            if buckets < 4 or buckets % 2:
                raise ValueError(
                    "EncoderConfig.relative_attention_buckets must be 0 or an even int >= 4, "
                    f"got {buckets}"
                )
            if self.relative_attention_max_distance <= buckets // 4:
                raise ValueError(
                    "EncoderConfig.relative_attention_max_distance must exceed "
                    f"relative_attention_buckets / 4 = {buckets // 4}, got "
                    f"{self.relative_attention_max_distance}"
                )
            if self.local_window is not None:
                raise ValueError(
                    "EncoderConfig.relative_attention_buckets needs global attention "
                    f"(local_window=None), got local_window={self.local_window}"
                )
        check_positive_float(self.rope_theta, "EncoderConfig.rope_theta")
        if self.local_rope_theta is not None:
            check_positive_float(self.local_rope_theta, "EncoderConfig.local_rope_theta")
        if self.positions == "rotary" and (self.d_model // self.n_heads) % 2:
            raise ValueError(
                "EncoderConfig.positions='rotary' needs an even head width (d_model / n_heads), "
                f"got {self.d_model // self.n_heads}"
            )
        check_positive_int(self.vocab_size, "EncoderConfig.vocab_size", optional=True)
        check_int(self.type_vocab_size, "EncoderConfig.type_vocab_size")
        check_int(
            self.position_offset,
            "EncoderConfig.position_offset",
            high=self.max_positions,
            high_name="max_positions",
        )
        # Without a vocabulary (vectors in) the pad id is never used as an index, but it still
        # must be an int: a fractional or negative id is a mistake wherever it comes from.
        check_int(
            self.pad_token_id,
            "EncoderConfig.pad_token_id",
            high=self.vocab_size,
            high_name="vocab_size",
            optional=True,
        )

    @property
    def layer_types(self) -> tuple[str, ...]:
        """``global`` or ``local`` for every layer."""
        if self.local_window is None:
            return ("global",) * self.n_layers
        return tuple(
            "global" if i % self.global_every == 0 else "local" for i in range(self.n_layers)
        )

    def window_of(self, layer_type: str) -> int | None:
        """The half-window of a layer type: query i sees keys j with |i - j| <= it."""
        return None if layer_type == "global" else self.local_window // 2

    def rope_theta_of(self, layer_type: str) -> float | None:
        """The rotary base of a layer type (None without rotary positions)."""
        if self.positions != "rotary":
            return None
        if layer_type == "local" and self.local_rope_theta is not None:
            return self.local_rope_theta
        return self.rope_theta

    @property
    def use_final_norm(self) -> bool:
        return self.norm == "pre" if self.final_norm is None else self.final_norm

    @property
    def max_length(self) -> int:
        """The longest sequence the embeddings accept."""
        return self.max_positions - self.position_offset

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> EncoderConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        renamed = [f"{name!r} is now {_RENAMED[name]}" for name in unknown if name in _RENAMED]
        if renamed:
            raise ValueError(f"unknown EncoderConfig fields: {unknown}; {'; '.join(renamed)}")
        if unknown:
            raise ValueError(f"unknown EncoderConfig fields: {unknown}")
        return cls(**data)
