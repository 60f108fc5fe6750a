"""How much each rounding of an int8 linear layer costs, by the granularity of its scales.

Every linear layer of the model at ``--model`` (a sentence-transformers directory) is replaced
by a simulation in float32: the weights rounded to int8 with one scale per output channel or
per block of G inputs, the activations rounded at every call to int8 with one scale per row or
per block of G, or to int16 per row, or not at all. The embeddings of ``--sentences`` BBC
sentences are compared with the float32 model's (min and mean cosine). The products are float32
products of the rounded values, so the figures are the roundings' cost alone, not any kernel's.

These are the figures behind ``precision="int8-blocks"`` (docs/int8.md): the per-channel,
per-row int8 of ``precision="int8"`` against blocks of 32 on one side or both (GGUF's Q8_0
rounds both), and int16 activations.

Run: ``python benchmarks/int8_schemes.py --model DIR [--sentences 128]
[--out benchmarks/results/int8-schemes]``; the Qwen3-Embedding-0.6B shape of
``llm_embedders.py`` is ``~/.cache/clearformer-bench/llm-embedders/qwen3-full``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from clearformer.io import write_text_atomically

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (label, activation rounding, weight rounding): "row" / "channel" one scale per row / output
# channel, an int G blocks of G inputs, "int16" int16 per row, None not rounded.
SCHEMES = (
    ("int8 rows x int8 channels (precision int8)", "row", "channel"),
    ("int8 blocks of 32 x int8 channels", 32, "channel"),
    ("int8 rows x int8 blocks of 32", "row", 32),
    ("int8 blocks of 32 x int8 blocks of 32 (as Q8_0)", 32, 32),
    ("float32 x int8 channels", None, "channel"),
    ("int16 rows x int8 channels", "int16", "channel"),
    ("int16 rows x int8 blocks of 64", "int16", 64),
    ("int16 rows x int8 blocks of 32 (precision int8-blocks)", "int16", 32),
)


def rounded(t: torch.Tensor, how, peak: int = 127) -> torch.Tensor:
    """``t`` (M, K) rounded symmetrically with one scale per row (``"row"``, ``"channel"``) or
    per block of ``how`` values along K, and returned in float32."""
    if how is None:
        return t
    if how == "int16":
        how, peak = "row", 32767
    M, K = t.shape
    group = K if how in ("row", "channel") else int(how)
    blocks = t.reshape(M, K // group, group)  # (M, K) -> (M, K/G, G)
    scale = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-30) / peak
    return ((blocks / scale).round() * scale).reshape(M, K)


class SimulatedLinear(nn.Module):
    """A float linear layer whose weight and input are rounded as a scheme says."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight.detach().float()
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        self.scheme = ("row", "channel")
        self._rounded: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activations, weights = self.scheme
        if weights not in self._rounded:
            self._rounded[weights] = rounded(self.weight, weights)
        rows = rounded(x.reshape(-1, x.shape[-1]).float(), activations)  # (..., K) -> (M, K)
        out = rows @ self._rounded[weights].t()
        out = out if self.bias is None else out + self.bias
        return out.view(*x.shape[:-1], -1)  # (M, N) -> (..., N)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="sentence-transformers dir")
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None, help="write OUT.md")
    args = parser.parse_args(argv)

    from clearformer import TextEncoder
    from clearformer.cpu import cpu_description
    from llm_embedders import sentences

    texts = sentences(args.sentences)
    encoder = TextEncoder.from_pretrained(args.model)
    with torch.inference_mode():
        reference = encoder.encode(texts, progress=False)
    layers = []
    for name, module in list(encoder.model.named_modules()):
        if isinstance(module, nn.Linear):
            parent_name, _, child = name.rpartition(".")
            parent = encoder.model.get_submodule(parent_name) if parent_name else encoder.model
            layers.append(SimulatedLinear(module))
            setattr(parent, child, layers[-1])
    lines = [
        f"# Rounding costs by scale granularity: {args.model.name}",
        "",
        f"{len(texts)} BBC sentences, {len(layers)} linear layers simulated in float32; "
        f"cosine to the float32 model. {cpu_description()['summary']}, torch {torch.__version__}.",
        f"Command: `python benchmarks/int8_schemes.py --model {args.model} "
        f"--sentences {args.sentences}`",
        "",
        "| activations x weights | min cosine | mean cosine | mean 1 - cosine |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, activations, weights in SCHEMES:
        for layer in layers:
            layer.scheme = (activations, weights)
        with torch.inference_mode():
            rows = encoder.encode(texts, progress=False)
        c = cosines(rows, reference)
        lines.append(f"| {label} | {c.min():.5f} | {c.mean():.5f} | {1 - c.mean():.2e} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        write_text_atomically(args.out.with_suffix(".md"), text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
