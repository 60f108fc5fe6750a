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
from .options import ACTIVATIONS, BACKENDS, LAYER_TYPES, NORM_KINDS, NORMS, POSITIONS

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
    n_heads: int = 8  # attention (query) heads; d_model must be divisible by it unless head_dim
    n_layers: int = 6  # encoder blocks
    dim_mlp: int = 2048  # feed-forward hidden width (4 * d_model is customary)
    dropout: float = 0.0  # after attention and feed-forward (and on embeddings)
    attn_dropout: float | None = None  # on attention probabilities; None: same as dropout
    norm: str = "pre"  # "pre": stable without warm-up; "post": BERT and the original paper
    # relu (as torch.nn) | gelu (exact, BERT) | gelu_tanh | swiglu (Qwen3) | geglu (ModernBERT)
    # | geglu_tanh (Gemma). Gated: fc_in's rows are the gate's, then the value's (FeedForward).
    activation: str = "relu"
    norm_eps: float = 1e-5  # epsilon of every norm; BERT checkpoints use 1e-12, Qwen3 1e-6
    bias: bool = True  # biases in linear layers and norms; False is a bit faster
    final_norm: bool | None = None  # norm after the last block; None: only for pre-norm
    # Attention kernel and layout, one choice: auto (packed varlen when padding makes it pay,
    # else sdpa) | math (reference, padded) | sdpa (fused, padded) | varlen (always packed).
    # A call can override it: model(x, mask, backend="math").
    backend: str = "auto"
    # Recompute activations in backward to save memory (training): the default of calls that
    # do not choose, per call, with forward(..., checkpointing=...).
    checkpointing: bool = False
    # Local (sliding-window) layers: local_window is the window in keys as checkpoints state
    # it. A bidirectional local layer's query i sees keys j with |i - j| <= local_window // 2
    # (ModernBERT; EmbeddingGemma's config.json value); a causal one sees the local_window most
    # recent keys, i - local_window < j <= i (Gemma, Qwen3). None: every layer global.
    local_window: int | None = None
    # Without layer_pattern, layer i is global when i % global_every == 0, else local.
    global_every: int = 1  # ModernBERT: 3
    # Rotary positions (positions="rotary"): the frequency base of global and of local layers.
    rope_theta: float = 10_000.0  # the paper's; ModernBERT's global layers: 160,000
    local_rope_theta: float | None = None  # None: rope_theta; ModernBERT: 10,000
    first_attn_norm: bool = True  # False: layer 0 has no attention norm (ModernBERT)
    # A learned score bias by relative distance, shared by all layers (MPNet: 32 buckets up
    # to distance 128; T5-style buckets, clearformer.relative_bias). 0: none.
    relative_attention_buckets: int = 0
    relative_attention_max_distance: int = 128

    # The layer kinds of decoder-born embedders (Qwen3, Gemma3); the defaults are BERT's.
    # Grouped-query attention: keys and values have n_kv_heads heads, each shared by
    # n_heads / n_kv_heads query heads (Ainslie et al., 2023). None: n_heads (plain multi-head);
    # 1: multi-query attention. Fewer keys and values to project and keep, same queries.
    n_kv_heads: int | None = None
    # Width Dh of each head; None: d_model / n_heads. Qwen3 and Gemma widen the attention past
    # the model (Qwen3-0.6B: d_model 1024, 16 heads of 128), then out_proj maps H * Dh back to D.
    head_dim: int | None = None
    attn_scale: float | None = None  # scores' scale; None: Dh ** -0.5 (Gemma3: 256 ** -0.5)
    # RMS-normalise each head's queries and keys over its Dh features, after the head split
    # and before rotary positions (Qwen3, Gemma3): the scores stay bounded as weights grow.
    qk_norm: bool = False
    # Every norm of the stack (blocks, final, embeddings, q/k): "layer" (LayerNorm) or "rms"
    # (RMSNorm, no centring and no bias: Qwen3, Gemma3).
    norm_kind: str = "layer"
    # RMSNorm scaled by (1 + weight), computed in float32 and cast back once: Gemma's weights
    # are stored as offsets from 1. False: by weight, the normed rows cast back first (Qwen3).
    norm_unit_offset: bool = False
    # A norm on each branch's output before its residual add (pre-norm only): Gemma3's
    # post_attention_layernorm and post_feedforward_layernorm.
    branch_norm: bool = False
    # Query i sees only keys j <= i of its own sequence (decoder-born embedders and rerankers:
    # Qwen3); every backend, packed rows included. With a local window: the local_window most
    # recent keys, itself included.
    causal: bool = False
    # Every layer's type, "global" or "local" (n_layers entries: Gemma3's 5 local : 1 global
    # as its config.json lists them); None: from global_every.
    layer_pattern: tuple[str, ...] | None = None

    # Embeddings (EncoderModel only).
    vocab_size: int | None = None  # token vocabulary; None: the model takes vectors, not ids
    max_positions: int = 512  # longest sequence the position table covers
    positions: str = "learned"  # learned | sinusoidal | rotary (in attention) | none
    type_vocab_size: int = 0  # BERT's segment (token type) embeddings; 0: none
    pad_token_id: int | None = 0  # its embedding row starts at zero and gets no gradient
    position_offset: int = 0  # RoBERTa counts positions from pad_token_id + 1
    embedding_norm: bool = False  # a norm on the summed embeddings (BERT: yes)
    # Token embeddings times sqrt(d_model), the factor rounded to the embedding dtype first, as
    # Gemma's checkpoints were trained (in bfloat16: 16.0 for d_model 256, 27.75 for 768).
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "dim_mlp", "max_positions"):
            check_positive_int(getattr(self, name), f"EncoderConfig.{name}")
        check_positive_int(self.head_dim, "EncoderConfig.head_dim", optional=True)
        if self.head_dim is None:
            check_divisible(self.d_model, self.n_heads, "EncoderConfig.d_model", "n_heads")
        check_positive_int(self.n_kv_heads, "EncoderConfig.n_kv_heads", optional=True)
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(
                "EncoderConfig.n_kv_heads must divide n_heads (each key/value head serves a "
                f"group of query heads), got n_kv_heads={self.n_kv_heads}, "
                f"n_heads={self.n_heads}"
            )
        if self.attn_scale is not None:
            check_positive_float(self.attn_scale, "EncoderConfig.attn_scale")
        check_probability(self.dropout, "EncoderConfig.dropout")
        check_probability(self.attn_dropout, "EncoderConfig.attn_dropout", optional=True)
        check_positive_float(self.norm_eps, "EncoderConfig.norm_eps")
        for name, allowed in (
            ("norm", NORMS),
            ("activation", ACTIVATIONS),
            ("backend", BACKENDS),
            ("positions", POSITIONS),
            ("norm_kind", NORM_KINDS),
        ):
            check_choice(getattr(self, name), allowed, f"EncoderConfig.{name}")
        for name in (
            "bias",
            "checkpointing",
            "embedding_norm",
            "qk_norm",
            "norm_unit_offset",
            "branch_norm",
            "causal",
            "scale_embeddings",
        ):
            check_bool(getattr(self, name), f"EncoderConfig.{name}")
        check_bool(self.final_norm, "EncoderConfig.final_norm", optional=True)
        check_bool(self.first_attn_norm, "EncoderConfig.first_attn_norm")
        if not self.first_attn_norm and self.norm == "post":
            raise ValueError(
                "EncoderConfig.first_attn_norm=False needs norm='pre', got norm='post'"
            )
        if self.norm_unit_offset and self.norm_kind != "rms":
            raise ValueError(
                "EncoderConfig.norm_unit_offset=True scales an RMSNorm by (1 + weight) and needs "
                f"norm_kind='rms', got norm_kind={self.norm_kind!r}"
            )
        if self.branch_norm and self.norm != "pre":
            raise ValueError(
                "EncoderConfig.branch_norm=True norms each branch before its residual add and "
                f"needs norm='pre', got norm={self.norm!r}"
            )
        check_positive_int(self.local_window, "EncoderConfig.local_window", optional=True)
        check_positive_int(self.global_every, "EncoderConfig.global_every")
        self._check_layer_pattern()
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
            if "local" in self.layer_types:
                raise ValueError(
                    "EncoderConfig.relative_attention_buckets needs global attention "
                    f"(no local layers), got local_window={self.local_window}"
                )
        check_positive_float(self.rope_theta, "EncoderConfig.rope_theta")
        if self.local_rope_theta is not None:
            check_positive_float(self.local_rope_theta, "EncoderConfig.local_rope_theta")
        if self.positions == "rotary" and self.head_width % 2:
            raise ValueError(
                "EncoderConfig.positions='rotary' needs an even head width (head_dim, or "
                f"d_model / n_heads), got {self.head_width}"
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

    def _check_layer_pattern(self) -> None:
        pattern = self.layer_pattern
        if pattern is None:
            return
        if isinstance(pattern, list):  # from JSON (to_dict / from_dict): a tuple, as declared
            pattern = tuple(pattern)
            object.__setattr__(self, "layer_pattern", pattern)
        if not isinstance(pattern, tuple) or len(pattern) != self.n_layers:
            raise ValueError(
                f"EncoderConfig.layer_pattern must be a tuple of n_layers={self.n_layers} layer "
                f"types {LAYER_TYPES}, got {pattern!r}"
            )
        unknown = sorted({str(t) for t in pattern} - set(LAYER_TYPES))
        if unknown:
            raise ValueError(
                f"EncoderConfig.layer_pattern entries must be one of {LAYER_TYPES}, got {unknown}"
            )
        if self.global_every != 1:
            raise ValueError(
                "EncoderConfig.layer_pattern and global_every both say which layers are local: "
                f"give one, got global_every={self.global_every}"
            )
        if "local" in pattern and self.local_window is None:
            raise ValueError(
                "EncoderConfig.layer_pattern has local layers and needs local_window, got None"
            )

    @property
    def head_width(self) -> int:
        """Dh, the width of every attention head (``head_dim``, else d_model / n_heads)."""
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def kv_heads(self) -> int:
        """The key/value heads (``n_kv_heads``, else ``n_heads``)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def layer_types(self) -> tuple[str, ...]:
        """``global`` or ``local`` for every layer."""
        if self.layer_pattern is not None:
            return self.layer_pattern
        if self.local_window is None:
            return ("global",) * self.n_layers
        return tuple(
            "global" if i % self.global_every == 0 else "local" for i in range(self.n_layers)
        )

    def window_of(self, layer_type: str) -> int | None:
        """How far a layer type's query reaches: it sees keys j with |i - j| <= this (and
        j <= i when causal); None: everywhere (global)."""
        if layer_type == "global":
            return None
        # The checkpoints' own conventions (see local_window): a causal window counts the query
        # and the keys before it, a bidirectional one as many on each side.
        return self.local_window - 1 if self.causal else self.local_window // 2

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
