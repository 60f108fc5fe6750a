"""``Seq2SeqTransformer``: the encoder-decoder Transformer of Vaswani et al. (2017).

Source ids -> embeddings -> :class:`~clearformer.encoder.Encoder` -> memory; target ids ->
embeddings -> :class:`~clearformer.decoder.Decoder` over the memory -> logits through the
target embedding matrix (tied output projection). Decoding lives in :mod:`clearformer.generation`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_bool, check_choice, check_int, check_positive_int
from .config import EncoderConfig
from .decoder import Decoder, DecoderCache, DecoderConfig
from .embeddings import Embeddings
from .masks import from_attention_mask
from .model import EncoderModel, check_token_ids
from .routes import projection_route


@dataclass(frozen=True)
class Seq2SeqConfig:
    """An encoder-decoder Transformer with token embeddings on both sides."""

    src_vocab_size: int = 1000
    tgt_vocab_size: int | None = None  # None: one vocabulary shared by source and target
    d_model: int = 256
    n_heads: int = 4
    encoder_layers: int = 3
    decoder_layers: int = 3
    dim_mlp: int = 1024
    dropout: float = 0.1
    norm: str = "pre"  # "pre" trains without warm-up; "post" is the paper's
    activation: str = "relu"
    norm_eps: float = 1e-5
    max_positions: int = 256  # longest source or target sequence
    positions: str = "learned"  # learned | sinusoidal
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    tie_output: bool = True  # logits through the target embedding matrix (Press & Wolf, 2017)
    backend: str = "auto"

    def __post_init__(self) -> None:
        check_positive_int(self.src_vocab_size, "Seq2SeqConfig.src_vocab_size")
        check_positive_int(self.tgt_vocab_size, "Seq2SeqConfig.tgt_vocab_size", optional=True)
        check_choice(self.positions, ("learned", "sinusoidal"), "Seq2SeqConfig.positions")
        check_bool(self.tie_output, "Seq2SeqConfig.tie_output")
        for name in ("pad_id", "bos_id", "eos_id"):
            check_int(
                getattr(self, name),
                f"Seq2SeqConfig.{name}",
                high=min(self.src_vocab_size, self.target_vocab),
                high_name="the vocabulary size",
            )
        # The stacks' own configs check the rest, naming each field.
        self.encoder_config()
        self.decoder_config()

    @property
    def target_vocab(self) -> int:
        return self.src_vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def shared_vocab(self) -> bool:
        return self.tgt_vocab_size is None

    def encoder_config(self, vocab: int | None = None) -> EncoderConfig:
        return EncoderConfig(
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.encoder_layers,
            dim_mlp=self.dim_mlp,
            dropout=self.dropout,
            norm=self.norm,
            activation=self.activation,
            norm_eps=self.norm_eps,
            backend=self.backend,
            vocab_size=self.src_vocab_size if vocab is None else vocab,
            max_positions=self.max_positions,
            positions=self.positions,
            pad_token_id=self.pad_id,
        )

    def decoder_config(self) -> DecoderConfig:
        return DecoderConfig(
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.decoder_layers,
            dim_mlp=self.dim_mlp,
            dropout=self.dropout,
            norm=self.norm,
            activation=self.activation,
            norm_eps=self.norm_eps,
            backend="auto" if self.backend == "varlen" else self.backend,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Seq2SeqConfig:
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown Seq2SeqConfig fields: {unknown}")
        return cls(**data)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer: ``forward(src, src_mask, tgt, tgt_mask) -> logits``."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        if not isinstance(config, Seq2SeqConfig):
            raise TypeError(f"config must be a Seq2SeqConfig, got {type(config).__name__}")
        self.config = config
        self.encoder = EncoderModel(config.encoder_config())
        self.target_embeddings = Embeddings(config.encoder_config(vocab=config.target_vocab))
        if config.shared_vocab:
            # One table for source and target words (and, tied, the output projection). It is
            # registered once, under the encoder, so that a state dict holds it once (safetensors
            # refuses two names for one tensor); the target side only refers to it.
            del self.target_embeddings.word
            object.__setattr__(self.target_embeddings, "word", self.encoder.embeddings.word)
        self.decoder = Decoder(config.decoder_config())
        # Word vectors of norm about 1 (std D^-1/2, Vaswani et al.'s scale): the tied output
        # projection then starts with logits of order 1, not of order D.
        # Source first, then the target table where it is a separate one: a fixed order, so a
        # seed gives the same weights in every process (a set would follow memory addresses).
        tables = dict.fromkeys([self.encoder.embeddings.word, self.target_embeddings.word])
        for table in tables:
            nn.init.normal_(table.weight, std=config.d_model**-0.5)
            with torch.no_grad():
                table.weight[config.pad_id].zero_()
        self.output = (
            None
            if config.tie_output
            else nn.Linear(config.d_model, config.target_vocab, bias=False)
        )

    # -- the two halves ------------------------------------------------------------------------
    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, *, checkpointing: bool | None = None
    ) -> Tensor:
        """(B, S) source ids and (B, S) mask (True/1 = real) -> (B, S, D) memory, zero at pads.
        ``checkpointing``: the encoder's call recomputes its activations in backward."""
        mask = None if src_mask is None else from_attention_mask(src_mask, "src_mask")
        return self.encoder(src, mask, checkpointing=checkpointing)

    def logits(self, hidden: Tensor) -> Tensor:
        """(..., D) decoder states -> (..., V_tgt) logits."""
        projection = self.output if self.output is not None else self.target_embeddings.word
        # Inside generate, the weights reordered once for the call: each step's few rows would
        # otherwise stream the whole (V, D) table through F.linear's kernel.
        route = projection_route(hidden, projection)
        if route.choice == "reordered":
            return route.impl(hidden, projection)
        if self.output is not None:
            return self.output(hidden)
        return F.linear(hidden, projection.weight)  # the tied embedding table

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        cache: DecoderCache | None = None,
    ) -> Tensor | tuple[Tensor, DecoderCache]:
        """Target ids (B, T) (with a cache: the new ids only) -> logits (B, T, V_tgt) (and the
        cache). Positions continue after the cached tokens. ``memory``: the encoder's output,
        or None with a cache, which holds its keys and values."""
        check_token_ids(tgt, self.target_embeddings.config, "tgt")
        past = 0 if cache is None else cache.length
        if past + tgt.shape[1] > self.config.max_positions:
            raise ValueError(
                f"target of {past + tgt.shape[1]} tokens exceeds max_positions="
                f"{self.config.max_positions}"
            )
        positions = torch.arange(past, past + tgt.shape[1], device=tgt.device)  # (T,)
        x = self.target_embeddings(tgt, positions=positions)  # (B, T, D)
        mask = None if tgt_mask is None else from_attention_mask(tgt_mask, "tgt_mask")
        mmask = None if memory_mask is None else from_attention_mask(memory_mask, "memory_mask")
        out = self.decoder(x, memory, mask, mmask, cache=cache)
        if cache is None:
            return self.logits(out)
        hidden, cache = out
        return self.logits(hidden), cache

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None,
        tgt: Tensor,
        tgt_mask: Tensor | None = None,
        *,
        checkpointing: bool | None = None,
    ) -> Tensor:
        """Teacher forcing: logits (B, T, V_tgt) for target ids (B, T) (``tgt[:, t]`` predicts
        ``tgt[:, t + 1]``). ``checkpointing``: the source encoder recomputes its activations
        in backward (the decoder keeps its own)."""
        memory = self.encode(src, src_mask, checkpointing=checkpointing)
        return self.decode(tgt, memory, tgt_mask, src_mask)

    def generate(self, src: Tensor, src_mask: Tensor | None = None, **options):
        """Decode ``src``; see :func:`clearformer.generation.generate` for the options."""
        from .generation import generate

        return generate(self, src, src_mask, **options)
