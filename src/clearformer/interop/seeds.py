"""The project's two seed layers, loaded from their own parameter names.

* Seed 000 ``EncoderLayer(d_model, num_heads, dim_ff)``: post-norm, ReLU, LayerNorm eps 1e-5,
  parameters ``W_Q``, ``W_K``, ``W_V``, ``W_O``, ``attn_ln``, ``ffn_ln``, ``ffn.0``, ``ffn.2``.
* Seed 001 ``EncoderBlock(d_model, n_heads, dim_mlp, dropout)``: pre-norm, ReLU, parameters
  ``attn.Q``, ``attn.K``, ``attn.V`` (no bias), ``attn.Wo``, ``attn_norm``, ``mlp.0``,
  ``mlp.2``, ``mlp_norm``. clearformer runs it as *standard* pre-norm,
  ``x + Attn(Norm(x))``, as the seed documents, not the seed's code, which adds the residual to
  the normalised input.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..blocks import EncoderBlock


def _width(state: dict[str, Tensor], key: str, dim: int) -> int:
    """A size read from ``state[key]``, the key's absence reported like any other."""
    if key not in state:
        raise ValueError(f"seed state_dict: missing keys [{key!r}] (needed to read the sizes)")
    return state[key].shape[dim]


def _take(state: dict[str, Tensor], expected: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"seed state_dict: missing keys {missing}, unexpected keys {unexpected}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(
                f"seed state_dict[{name!r}] must have shape {shape}, got {tuple(state[name].shape)}"
            )
    return state


@torch.no_grad()
def block_from_seed000(
    state: dict[str, Tensor], num_heads: int, backend: str = "auto"
) -> EncoderBlock:
    """Seed 000's ``EncoderLayer`` as a post-norm :class:`EncoderBlock` with its weights."""
    d_model = _width(state, "W_Q.weight", 0)
    dim_ff = _width(state, "ffn.0.weight", 0)
    shapes = {
        f"{w}.{p}": ((d_model, d_model) if p == "weight" else (d_model,))
        for w in ("W_Q", "W_K", "W_V", "W_O")
        for p in ("weight", "bias")
    }
    shapes |= {f"{n}.{p}": (d_model,) for n in ("attn_ln", "ffn_ln") for p in ("weight", "bias")}
    shapes |= {
        "ffn.0.weight": (dim_ff, d_model),
        "ffn.0.bias": (dim_ff,),
        "ffn.2.weight": (d_model, dim_ff),
        "ffn.2.bias": (d_model,),
    }
    s = _take(state, shapes)
    block = EncoderBlock(
        d_model, num_heads, dim_ff, norm="post", activation="relu", backend=backend
    )
    block.attn.in_proj.weight.copy_(torch.cat([s["W_Q.weight"], s["W_K.weight"], s["W_V.weight"]]))
    block.attn.in_proj.bias.copy_(torch.cat([s["W_Q.bias"], s["W_K.bias"], s["W_V.bias"]]))
    _copy_linear(block.attn.out_proj, s, "W_O")
    _copy_linear(block.attn_norm, s, "attn_ln")
    _copy_linear(block.mlp_norm, s, "ffn_ln")
    _copy_linear(block.mlp.fc_in, s, "ffn.0")
    _copy_linear(block.mlp.fc_out, s, "ffn.2")
    return block


@torch.no_grad()
def block_from_seed001(
    state: dict[str, Tensor], n_heads: int, dropout: float = 0.0, backend: str = "auto"
) -> EncoderBlock:
    """Seed 001's ``EncoderBlock`` as a standard pre-norm :class:`EncoderBlock`."""
    d_model = _width(state, "attn.Q.weight", 1)
    dim_mlp = _width(state, "mlp.0.weight", 0)
    shapes = {f"attn.{w}.weight": (d_model, d_model) for w in ("Q", "K", "V", "Wo")}
    shapes |= {"attn.Wo.bias": (d_model,)}
    shapes |= {
        f"{n}.{p}": (d_model,) for n in ("attn_norm", "mlp_norm") for p in ("weight", "bias")
    }
    shapes |= {
        "mlp.0.weight": (dim_mlp, d_model),
        "mlp.0.bias": (dim_mlp,),
        "mlp.2.weight": (d_model, dim_mlp),
        "mlp.2.bias": (d_model,),
    }
    s = _take(state, shapes)
    block = EncoderBlock(
        d_model, n_heads, dim_mlp, dropout, norm="pre", activation="relu", backend=backend
    )
    block.attn.in_proj.weight.copy_(
        torch.cat([s["attn.Q.weight"], s["attn.K.weight"], s["attn.V.weight"]])
    )
    block.attn.in_proj.bias.zero_()  # the seed's Q, K, V projections have no bias
    _copy_linear(block.attn.out_proj, s, "attn.Wo")
    _copy_linear(block.attn_norm, s, "attn_norm")
    _copy_linear(block.mlp_norm, s, "mlp_norm")
    _copy_linear(block.mlp.fc_in, s, "mlp.0")
    _copy_linear(block.mlp.fc_out, s, "mlp.2")
    return block


def _copy_linear(module, state: dict[str, Tensor], prefix: str) -> None:
    module.weight.copy_(state[f"{prefix}.weight"])
    module.bias.copy_(state[f"{prefix}.bias"])
