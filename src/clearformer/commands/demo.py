"""``clearformer demo``: a short tour of the encoder core on random data."""

from __future__ import annotations

import argparse

# The demo is a tour of a few seconds, not a benchmark: its encoder is built in memory, so a
# size that cannot be allocated (or takes minutes to build) is refused before torch loads.
MAX_PARAMETERS = 2**28  # 1 GiB of float32
MAX_LAYERS = 256  # each layer is a few Python objects and calls: thousands take minutes
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed accepts


def check_seed(seed: int) -> None:
    """--seed within what torch.manual_seed accepts (explain --random's too)."""
    from ..cli import CliError

    low, high = SEED_RANGE
    if not low <= seed <= high:
        raise CliError(f"--seed must be an int in [{low}, {high}], got {seed}")


def check_parameters(parameters: int, sizes: str, bound: str) -> None:
    """A random model of about ``parameters`` (from the flags ``sizes`` names) is at most
    MAX_PARAMETERS; ``bound`` says whose limit it is (explain --random's too)."""
    from ..cli import CliError

    if parameters > MAX_PARAMETERS:
        raise CliError(
            f"{sizes} make about {parameters:,} parameters; {bound} at most {MAX_PARAMETERS:,}"
        )


def check_sizes(sizes: dict[str, int]) -> None:
    """Each size flag positive, and ``--d-model`` split evenly among ``--n-heads`` (explain
    --random's too): checked here so the message names the flags typed, not EncoderConfig's
    fields."""
    from ..cli import CliError

    for flag, value in sizes.items():
        if value <= 0:
            raise CliError(f"{flag} must be positive, got {value}")
    d_model, n_heads = sizes["--d-model"], sizes["--n-heads"]
    if d_model % n_heads:
        raise CliError(
            "--d-model must be divisible by --n-heads (each head takes an equal share), "
            f"got --d-model {d_model} and --n-heads {n_heads}"
        )


def _check_arguments(args: argparse.Namespace) -> None:
    from ..cli import CliError

    check_seed(args.seed)
    check_sizes({"--d-model": args.d_model, "--n-heads": args.n_heads, "--n-layers": args.n_layers})
    # Per layer: 4 D^2 in attention and 8 D^2 in the MLP (dim_mlp = 4 D).
    parameters = 12 * args.n_layers * args.d_model**2
    if args.n_layers > MAX_LAYERS:  # thin layers are cheap in parameters, not in time
        raise CliError(f"--n-layers must be at most {MAX_LAYERS}, got {args.n_layers}")
    sizes = f"--d-model {args.d_model} and --n-layers {args.n_layers}"
    check_parameters(parameters, sizes, "the demo builds")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a small encoder on a random ragged batch")
    p.add_argument("--d-model", type=int, default=64, help="width D")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads")
    p.add_argument("--n-layers", type=int, default=2, help="blocks")
    p.add_argument("--seed", type=int, default=0, help="initialises the parameters and the batch")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check_arguments(args)
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
        plan = encoder.plan_for(mask)  # under no_grad, as the call above ran
    print(
        f"encoder: {config.n_layers} x {config.norm}-norm blocks, d_model={config.d_model}, "
        f"{config.n_heads} heads, {sum(p.numel() for p in encoder.parameters()):,} parameters"
    )
    print(f"batch: lengths {lengths.tolist()} padded to T={T}; path: {plan.layout}")
    print(f"attention kernel: {plan.kernel}")
    worst = max((packed[b, : int(n)] - alone[b]).abs().max().item() for b, n in enumerate(lengths))
    print(f"each sequence in the batch vs alone: max |difference| = {worst:.2e}")
    print(f"padded positions are zero: {bool((packed[~mask] == 0).all())}")
    return 0
