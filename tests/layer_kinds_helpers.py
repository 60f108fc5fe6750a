"""Tiny random Qwen3 and Gemma3 models of transformers, and their clearformer twins with the
weights copied by hand (the mapping a checkpoint loader makes, written out for the tests).

The parameter names on clearformer's side are the documented ones (EncoderBlock): ``in_proj``
is ``cat([q_proj, k_proj, v_proj])``, ``fc_in`` is ``cat([gate_proj, up_proj])``.
"""

from __future__ import annotations

import os

import torch

from clearformer import EncoderConfig, EncoderModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 61
D, H, DH = 64, 4, 24  # head width 24, not D / H = 16: the attention is wider than the model


def qwen3(n_kv_heads: int = 2, layers: int = 3, seed: int = 0):
    """A random ``Qwen3Model``: causal, GQA, per-head q/k RMSNorm, SwiGLU, no biases."""
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=H,
        num_key_value_heads=n_kv_heads,
        head_dim=DH,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        pad_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return _noisy(transformers.Qwen3Model(config).eval())


def qwen3_config(hf, **overrides) -> EncoderConfig:
    c = hf.config
    fields = dict(
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        n_layers=c.num_hidden_layers,
        dim_mlp=c.intermediate_size,
        norm="pre",
        norm_kind="rms",
        norm_eps=c.rms_norm_eps,
        activation="swiglu",
        bias=False,
        qk_norm=True,
        causal=True,
        positions="rotary",
        rope_theta=c.rope_parameters["rope_theta"],
        vocab_size=c.vocab_size,
        pad_token_id=c.pad_token_id,
        max_positions=c.max_position_embeddings,
    )
    fields.update(overrides)
    return EncoderConfig(**fields)


def gemma3(
    n_kv_heads: int = 1,
    bidirectional: bool = True,
    window: int = 4,
    pattern=("local", "local", "global"),
    seed: int = 0,
):
    """A random ``Gemma3TextModel``: local and global layers with their own rotary bases,
    GQA, q/k norms, (1 + weight) RMSNorms on both sides of each branch, GeGLU (tanh), embeddings
    times sqrt(D), a score scale of its own. ``window`` as config.json states it."""
    import transformers

    names = {"local": "sliding_attention", "global": "full_attention"}
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=96,
        num_hidden_layers=len(pattern),
        num_attention_heads=H,
        num_key_value_heads=n_kv_heads,
        head_dim=DH,
        query_pre_attn_scalar=20,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        sliding_window=window,
        layer_types=[names[t] for t in pattern],
        use_bidirectional_attention=bidirectional,
        pad_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return _noisy(transformers.Gemma3TextModel(config).eval())


def gemma3_config(hf, pattern=("local", "local", "global"), **overrides) -> EncoderConfig:
    c = hf.config
    bidirectional = bool(c.use_bidirectional_attention)
    fields = dict(
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        attn_scale=c.query_pre_attn_scalar**-0.5,
        n_layers=c.num_hidden_layers,
        dim_mlp=c.intermediate_size,
        norm="pre",
        norm_kind="rms",
        norm_unit_offset=True,
        branch_norm=True,
        norm_eps=c.rms_norm_eps,
        activation="geglu_tanh",
        bias=False,
        qk_norm=True,
        causal=not bidirectional,
        positions="rotary",
        rope_theta=c.rope_parameters["full_attention"]["rope_theta"],
        local_rope_theta=c.rope_parameters["sliding_attention"]["rope_theta"],
        layer_pattern=tuple(pattern),
        # config.json's window: to_dict undoes the halving Gemma3TextConfig makes in memory.
        local_window=c.to_dict()["sliding_window"],
        scale_embeddings=True,
        vocab_size=c.vocab_size,
        pad_token_id=c.pad_token_id,
        max_positions=c.max_position_embeddings,
    )
    fields.update(overrides)
    return EncoderConfig(**fields)


def twin(hf, config: EncoderConfig) -> EncoderModel:
    """An ``EncoderModel`` of ``config`` holding ``hf``'s weights (Qwen3 or Gemma3 names)."""
    ours = EncoderModel(config).eval()
    theirs = hf.state_dict()
    sandwich = config.branch_norm
    names = {
        "embeddings.word.weight": "embed_tokens.weight",
        "encoder.final_norm.weight": "norm.weight",
    }
    for i in range(config.n_layers):
        a, b = f"encoder.layers.{i}", f"layers.{i}"
        names.update(
            {
                f"{a}.attn_norm.weight": f"{b}.input_layernorm.weight",
                f"{a}.attn.out_proj.weight": f"{b}.self_attn.o_proj.weight",
                f"{a}.attn.q_norm.weight": f"{b}.self_attn.q_norm.weight",
                f"{a}.attn.k_norm.weight": f"{b}.self_attn.k_norm.weight",
                f"{a}.mlp.fc_out.weight": f"{b}.mlp.down_proj.weight",
            }
        )
        if sandwich:  # Gemma3: four norms per block
            names[f"{a}.attn_out_norm.weight"] = f"{b}.post_attention_layernorm.weight"
            names[f"{a}.mlp_norm.weight"] = f"{b}.pre_feedforward_layernorm.weight"
            names[f"{a}.mlp_out_norm.weight"] = f"{b}.post_feedforward_layernorm.weight"
        else:
            names[f"{a}.mlp_norm.weight"] = f"{b}.post_attention_layernorm.weight"
    state = {ours_name: theirs[name] for ours_name, name in names.items()}
    for i in range(config.n_layers):
        a, b = f"encoder.layers.{i}", f"layers.{i}.self_attn"
        qkv = [theirs[f"{b}.{p}_proj.weight"] for p in "qkv"]
        state[f"{a}.attn.in_proj.weight"] = torch.cat(qkv)  # rows: q, then k, then v
        gate, up = (theirs[f"layers.{i}.mlp.{p}_proj.weight"] for p in ("gate", "up"))
        state[f"{a}.mlp.fc_in.weight"] = torch.cat([gate, up])  # the gate's half first
    ours.load_state_dict(state, strict=True)
    return ours


def ragged(lengths: list[int], left: bool = False, seed: int = 3):
    """(B, T) ids and their 0/1 mask, padded right (or ``left``), pad id 0, and the positions
    transformers must be given to count real tokens as clearformer does."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for row, n in enumerate(lengths):
        cols = slice(T - n, T) if left else slice(0, n)
        ids[row, cols] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[row, cols] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return ids, mask, positions


def max_diff_on_tokens(ours, theirs, mask) -> float:
    keep = mask.bool()
    return (ours[keep].double() - theirs[keep].double()).abs().max().item()


def _noisy(model):
    """Every parameter moved off its initial value (norm weights off 1, or off 0 for Gemma's
    offsets), so that a weight mapped to the wrong place or a norm computed the wrong way shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model
