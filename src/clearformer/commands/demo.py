"""``clearformer demo``: a short tour of the encoder core on random data."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a small encoder on a random ragged batch")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from .. import Encoder, EncoderConfig

    torch.manual_seed(args.seed)
    config = EncoderConfig(
        d_model=args.d_model,
        n_heads=args.n_heads,
        n_layers=args.n_layers,
        dim_mlp=4 * args.d_model,
    )
    encoder = Encoder(config).eval()
    lengths = torch.tensor([7, 3, 5, 1])
    T = int(lengths.max())
    x = torch.randn(len(lengths), T, config.d_model)  # (B, T, D)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T): True = real token
    with torch.no_grad():
        packed = encoder(x, mask)
        alone = [encoder(x[b : b + 1, : int(n)])[0] for b, n in enumerate(lengths)]
    print(
        f"encoder: {config.n_layers} x {config.norm}-norm blocks, d_model={config.d_model}, "
        f"{config.n_heads} heads, {sum(p.numel() for p in encoder.parameters()):,} parameters"
    )
    plan = encoder.plan_for(mask)
    print(f"batch: lengths {lengths.tolist()} padded to T={T}; path: {plan.layout}")
    print(f"attention kernel: {plan.kernel}")
    worst = max((packed[b, : int(n)] - alone[b]).abs().max().item() for b, n in enumerate(lengths))
    print(f"each sequence in the batch vs alone: max |difference| = {worst:.2e}")
    print(f"padded positions are zero: {bool((packed[~mask] == 0).all())}")
    return 0
