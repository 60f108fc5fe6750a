"""Print the plans of documented examples, to hold two checkouts' plans side by side:

PYTHONPATH=<checkout>/src python benchmarks/print_plans.py > plans.txt
"""

import torch

from clearformer import Encoder, EncoderConfig
from clearformer.attention import MultiHeadAttention

torch.manual_seed(0)


def mask_of(lengths, T=None):
    T = T or max(lengths)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


cases = {
    "bert ragged": (
        dict(d_model=384, n_heads=12, n_layers=2, dim_mlp=1536, norm="post", activation="gelu"),
        mask_of([10, 4, 7]),
    ),
    "bert little padding": (
        dict(d_model=384, n_heads=12, n_layers=2, dim_mlp=1536, norm="post", activation="gelu"),
        mask_of([40, 40, 39]),
    ),
    "bert full": (
        dict(d_model=64, n_heads=4, n_layers=2, dim_mlp=128),
        torch.ones(2, 9, dtype=torch.bool),
    ),
    "modernbert": (
        dict(
            d_model=64,
            n_heads=4,
            n_layers=3,
            dim_mlp=96,
            norm="pre",
            activation="geglu",
            positions="rotary",
            local_window=4,
            global_every=3,
            rope_theta=160000.0,
            local_rope_theta=10000.0,
            first_attn_norm=False,
            bias=False,
        ),
        mask_of([9, 5, 7]),
    ),
    "qwen3": (
        dict(
            d_model=64,
            n_heads=4,
            n_layers=2,
            dim_mlp=96,
            norm="pre",
            activation="swiglu",
            norm_kind="rms",
            qk_norm=True,
            n_kv_heads=2,
            head_dim=24,
            causal=True,
            positions="rotary",
            bias=False,
        ),
        mask_of([9, 5, 7]),
    ),
}
for name, (cfg, mask) in cases.items():
    enc = Encoder(EncoderConfig(**cfg)).eval()
    for backend in (None, "math", "sdpa", "varlen"):
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                print(f"== {name} backend={backend} grad={grad}")
                print(enc.plan_for(mask, backend=backend))
    with torch.no_grad():
        print(f"== {name} weights")
        print(enc.plan_for(mask, output_attentions=True))
attn = MultiHeadAttention(64, 64, 64, 64, 4).eval()
x = torch.randn(3, 9, 64)
with torch.no_grad():
    print("== lone attention")
    print(attn.plan_for(x, mask=mask_of([9, 5, 7])))
    print(attn.plan_for(x, need_weights=True))
