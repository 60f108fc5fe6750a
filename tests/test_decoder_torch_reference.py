"""clearformer's decoder held to PyTorch's own hard-coded TransformerDecoder test values.

The inputs and expected outputs come from pytorch/pytorch ``test/test_nn.py`` (commit
74f2fa66feec00335f72813782f4802e80bff4cb): ``TestNN.test_transformerdecoderlayer``,
``test_transformerdecoderlayer_gelu`` and ``test_transformerdecoder``; they live in
``tests/data/torch_decoder_reference.py``. Each case runs with ``batch_first`` False and True, as
PyTorch's test loops over both, and with every activation spelling the test uses. PyTorch runs
test_transformerdecoderlayer_gelu in float64; here everything is float32, and (a) shows that the
literal values hold there too.

The checks:

(a) ``test_torch_reproduces_pytorch_reference``: the ``torch.nn`` module built as PyTorch's test
    builds it gives the hard-coded values (atol 1e-5). This proves the setup is reproduced.
(b) clearformer's twin, from ``from_torch(module)``, on every backend. clearformer's decoder
    self-attention is always causal, and PyTorch's tests pass no ``tgt_mask``. With one target
    token a causal mask changes nothing, so those cases compare with the literal values
    (``test_clearformer_matches_pytorch_reference``):
        layer-relu-one, layer-gelu-one, stack1-relu-one, stack1-gelu-one, stack2-relu-one,
        stack2-norm-relu-one.
    Every other case has two or three target tokens, so clearformer is compared with torch given
    ``tgt_mask=generate_square_subsequent_mask(T), tgt_is_causal=True`` on the same inputs
    (``test_clearformer_matches_causal_torch_on_pytorch_inputs``):
        layer-relu-{two, two-small, batch, batch-tgt-pad-none, batch-tgt-padded,
        batch-mem-pad-none, batch-mem-padded}, layer-gelu-{two, two-small, batch}, the same
        seven for stack1-relu and three for stack1-gelu, stack6-relu-batch and
        stack6-norm-relu-batch.
    In the two-token and six-layer cases the cosine weights saturate the output (the expected rows
    repeat), so those hardly depend on the mask; (d) is the check with teeth for causality.
(c) clearformer returns zeros at padded target positions (torch returns values there that mean
    nothing), so outputs are compared at real positions only and the padded ones must be 0.
(d) ``test_clearformer_matches_causal_torch_on_random_weights``: random weights, pre and post
    norm, relu and gelu, both layouts, ragged target and memory padding, causal torch.

clearformer takes batch-first tensors and bool masks, True = real token:
``block(x, memory, mask=tgt_keep, memory_mask=memory_keep, backend=...)``. That is the inverse of
torch's ``tgt_key_padding_mask`` / ``memory_key_padding_mask`` (True = ignore).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .data import torch_decoder_reference as ref
from .helpers import lengths_mask

BACKENDS = ("math", "sdpa", "auto")
TOL = dict(atol=1e-5, rtol=0)

# The activation arguments each of PyTorch's tests passes to TransformerDecoderLayer.
LAYER_RELU = ("relu",)  # test_transformerdecoderlayer leaves the default, "relu"
LAYER_GELU = ("gelu", F.gelu, nn.GELU())  # test_transformerdecoderlayer_gelu tries all three
# (Not for stacks: TransformerDecoder deep-copies its layer, and in torch 2.13 the copy of a layer
# built with nn.GELU() runs ReLU, as TransformerDecoderLayer.__setstate__ sets F.relu over it.)
STACK_RELU = (F.relu,)  # test_transformerdecoder
STACK_GELU = ("gelu",)  # test_transformerdecoder's gelu part


@dataclass(frozen=True)
class Case:
    """One call of PyTorch's test; tensors sequence first, as written there."""

    name: str
    activations: tuple
    tgt: list  # (T, B, D)
    memory: list  # (S, B, D)
    expected: list  # (T, B, D)
    n_layers: int | None = None  # None: a bare TransformerDecoderLayer; else a stack of that many
    final_norm: bool = False
    tgt_padding: tuple | None = None  # (batch, position) pairs; None: no mask, (): all False
    memory_padding: tuple | None = None

    @property
    def single_target(self) -> bool:
        """One target token: a causal mask changes nothing, so the literal values apply."""
        return len(self.tgt) == 1


def _relu_cases(prefix: str, activations: tuple, n_layers: int | None) -> list[Case]:
    batch = dict(tgt=ref.TGT_BATCH, memory=ref.MEM_BATCH, n_layers=n_layers)
    return [
        Case(f"{prefix}-one", activations, ref.TGT_ONE, ref.MEM_ONE, ref.RELU_ONE, n_layers),
        Case(f"{prefix}-two", activations, ref.TGT_TWO, ref.MEM_TWO_ONE, ref.RELU_TWO, n_layers),
        Case(
            f"{prefix}-two-small",
            activations,
            ref.TGT_TWO_SMALL,
            ref.MEM_TWO,
            ref.RELU_TWO_SMALL,
            n_layers,
        ),
        Case(f"{prefix}-batch", activations, expected=ref.RELU_BATCH, **batch),
        Case(
            f"{prefix}-batch-tgt-pad-none",
            activations,
            expected=ref.RELU_BATCH,
            tgt_padding=(),
            **batch,
        ),
        Case(
            f"{prefix}-batch-tgt-padded",
            activations,
            expected=ref.RELU_BATCH_TGT_PADDED,
            tgt_padding=ref.TGT_BATCH_PADDING,
            **batch,
        ),
        Case(
            f"{prefix}-batch-mem-pad-none",
            activations,
            expected=ref.RELU_BATCH,
            memory_padding=(),
            **batch,
        ),
        Case(
            f"{prefix}-batch-mem-padded",
            activations,
            expected=ref.RELU_BATCH_MEM_PADDED,
            memory_padding=ref.MEM_BATCH_PADDING,
            **batch,
        ),
    ]


def _gelu_cases(prefix: str, activations: tuple, n_layers: int | None) -> list[Case]:
    return [
        Case(f"{prefix}-one", activations, ref.TGT_ONE, ref.MEM_ONE, ref.GELU_ONE, n_layers),
        Case(f"{prefix}-two", activations, ref.TGT_TWO, ref.MEM_TWO_ONE, ref.GELU_TWO, n_layers),
        Case(
            f"{prefix}-two-small",
            activations,
            ref.TGT_TWO_SMALL,
            ref.MEM_TWO,
            ref.GELU_TWO_SMALL,
            n_layers,
        ),
        Case(
            f"{prefix}-batch", activations, ref.TGT_BATCH, ref.MEM_BATCH, ref.GELU_BATCH, n_layers
        ),
    ]


CASES = [
    # test_transformerdecoderlayer, test_transformerdecoderlayer_gelu
    *_relu_cases("layer-relu", LAYER_RELU, None),
    *_gelu_cases("layer-gelu", LAYER_GELU, None),
    # test_transformerdecoder: one layer gives the layer's values; then deeper stacks
    *_relu_cases("stack1-relu", STACK_RELU, 1),
    *_gelu_cases("stack1-gelu", STACK_GELU, 1),
    Case("stack2-relu-one", STACK_RELU, ref.TGT_ONE, ref.MEM_ONE, ref.RELU_2_LAYERS_ONE, 2),
    Case("stack6-relu-batch", STACK_RELU, ref.TGT_BATCH, ref.MEM_BATCH, ref.RELU_6_LAYERS_BATCH, 6),
    Case(
        "stack2-norm-relu-one",
        STACK_RELU,
        ref.TGT_ONE,
        ref.MEM_ONE,
        ref.RELU_2_LAYERS_NORM_ONE,
        2,
        final_norm=True,
    ),
    Case(
        "stack6-norm-relu-batch",
        STACK_RELU,
        ref.TGT_BATCH,
        ref.MEM_BATCH,
        ref.RELU_6_LAYERS_NORM_BATCH,
        6,
        final_norm=True,
    ),
]


def _activation_id(activation) -> str:
    if isinstance(activation, str):
        return activation
    if isinstance(activation, nn.Module):
        return f"nn.{type(activation).__name__}"
    return f"F.{activation.__name__}"


def _params(cases: list[Case]) -> list:
    return [
        pytest.param(
            case,
            activation,
            batch_first,
            id=f"{case.name}-{_activation_id(activation)}-"
            + ("batch_first" if batch_first else "seq_first"),
        )
        for case in cases
        for activation in case.activations
        for batch_first in (False, True)
    ]


def torch_module(case: Case, activation, batch_first: bool) -> nn.Module:
    """The torch.nn module exactly as PyTorch's test builds it, in eval mode."""
    layer = nn.TransformerDecoderLayer(
        4, 2, dim_feedforward=16, dropout=0.0, activation=activation, batch_first=batch_first
    )
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.cos(torch.arange(0, p.numel()).float().view(p.shape)))
    if case.n_layers is None:
        return layer.eval()
    norm = nn.LayerNorm(4) if case.final_norm else None
    return nn.TransformerDecoder(layer, case.n_layers, norm=norm).eval()


def to_clearformer(module: nn.Module) -> nn.Module:
    """clearformer's twin of a torch.nn decoder layer (a DecoderBlock) or stack (a Decoder)."""
    from clearformer import Decoder, DecoderBlock
    from clearformer.interop.torch_nn import from_torch

    ours = from_torch(module)
    layer = isinstance(module, nn.TransformerDecoderLayer)
    assert isinstance(ours, DecoderBlock if layer else Decoder), type(ours)
    return ours


def _keep(padding: tuple | None, B: int, T: int) -> torch.Tensor | None:
    """clearformer's (B, T) mask, True = real token, from PyTorch's padded (batch, position)s."""
    if padding is None:
        return None
    keep = torch.ones(B, T, dtype=torch.bool)
    for b, t in padding:
        keep[b, t] = False
    return keep


def batch_first_inputs(case: Case):
    """(tgt (B, T, D), memory (B, S, D), expected (B, T, D), tgt_keep, memory_keep)."""
    tgt, memory, expected = (
        torch.tensor(v).transpose(0, 1) for v in (case.tgt, case.memory, case.expected)
    )
    B, T, S = tgt.shape[0], tgt.shape[1], memory.shape[1]
    return tgt, memory, expected, _keep(case.tgt_padding, B, T), _keep(case.memory_padding, B, S)


def run_torch(module, batch_first, tgt, memory, tgt_keep=None, memory_keep=None, causal=False):
    """torch.nn's output (B, T, D) for batch-first inputs, in the module's own layout."""
    kwargs = {}
    if tgt_keep is not None:
        kwargs["tgt_key_padding_mask"] = ~tgt_keep
    if memory_keep is not None:
        kwargs["memory_key_padding_mask"] = ~memory_keep
    if causal:
        T = tgt.shape[1]
        kwargs["tgt_mask"] = nn.Transformer.generate_square_subsequent_mask(T)
        kwargs["tgt_is_causal"] = True
        if tgt_keep is not None:  # additive like the causal mask: torch.nn warns on mixed types
            kwargs["tgt_key_padding_mask"] = torch.zeros(tgt_keep.shape).masked_fill(
                ~tgt_keep, float("-inf")
            )
    if not batch_first:
        tgt, memory = tgt.transpose(0, 1), memory.transpose(0, 1)
    with torch.no_grad():
        out = module(tgt, memory, **kwargs)
    return out if batch_first else out.transpose(0, 1)


def run_clearformer(ours, tgt, memory, tgt_keep, memory_keep, backend):
    with torch.no_grad():
        return ours(tgt, memory, mask=tgt_keep, memory_mask=memory_keep, backend=backend)


def assert_real_close_padded_zero(got, want, tgt_keep) -> None:
    """Equal at real target positions (1e-5), exactly 0 at padded ones."""
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    keep = torch.ones(got.shape[:2], dtype=torch.bool) if tgt_keep is None else tgt_keep
    torch.testing.assert_close(got[keep], want[keep], **TOL)
    assert (got[~keep] == 0).all(), got[~keep]


# (a) -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "activation", "batch_first"), _params(CASES))
def test_torch_reproduces_pytorch_reference(case, activation, batch_first):
    module = torch_module(case, activation, batch_first)
    tgt, memory, expected, tgt_keep, memory_keep = batch_first_inputs(case)
    got = run_torch(module, batch_first, tgt, memory, tgt_keep, memory_keep)
    assert got.shape == expected.shape
    # All positions, padded ones too: this is torch.nn against its own recorded output.
    torch.testing.assert_close(got, expected, **TOL)


# (b), (c) --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("case", "activation", "batch_first"), _params([c for c in CASES if c.single_target])
)
def test_clearformer_matches_pytorch_reference(case, activation, batch_first, backend):
    ours = to_clearformer(torch_module(case, activation, batch_first))
    tgt, memory, expected, tgt_keep, memory_keep = batch_first_inputs(case)
    got = run_clearformer(ours, tgt, memory, tgt_keep, memory_keep, backend)
    assert_real_close_padded_zero(got, expected, tgt_keep)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("case", "activation", "batch_first"), _params([c for c in CASES if not c.single_target])
)
def test_clearformer_matches_causal_torch_on_pytorch_inputs(case, activation, batch_first, backend):
    module = torch_module(case, activation, batch_first)
    ours = to_clearformer(module)
    tgt, memory, _, tgt_keep, memory_keep = batch_first_inputs(case)
    want = run_torch(module, batch_first, tgt, memory, tgt_keep, memory_keep, causal=True)
    got = run_clearformer(ours, tgt, memory, tgt_keep, memory_keep, backend)
    assert_real_close_padded_zero(got, want, tgt_keep)


# (d) -------------------------------------------------------------------------------------------

D, HEADS, DIM_FF = 32, 4, 64
TGT_LENGTHS = [7, 3, 1, 5]  # a full row, ragged rows and a single real token
MEMORY_LENGTHS = [9, 2, 6, 1]


def random_torch_module(n_layers, norm_first, activation, batch_first) -> nn.Module:
    layer = nn.TransformerDecoderLayer(
        D,
        HEADS,
        DIM_FF,
        dropout=0.1,  # eval mode: both sides must leave it off
        activation=activation,
        batch_first=batch_first,
        norm_first=norm_first,
    )
    module = layer
    if n_layers is not None:
        module = nn.TransformerDecoder(layer, n_layers, norm=nn.LayerNorm(D))
    with torch.no_grad():  # every layer its own weights; non-trivial biases and norms
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            elif p.dim() > 1:
                nn.init.xavier_uniform_(p)
            else:
                p.uniform_(-0.5, 0.5)
    return module.eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("n_layers", [None, 3], ids=["layer", "stack3-norm"])
def test_clearformer_matches_causal_torch_on_random_weights(
    n_layers, norm_first, activation, batch_first, backend
):
    module = random_torch_module(n_layers, norm_first, activation, batch_first)
    ours = to_clearformer(module)
    tgt = torch.randn(len(TGT_LENGTHS), max(TGT_LENGTHS), D)
    memory = torch.randn(len(MEMORY_LENGTHS), max(MEMORY_LENGTHS), D)
    tgt_keep, memory_keep = lengths_mask(TGT_LENGTHS), lengths_mask(MEMORY_LENGTHS)
    want = run_torch(module, batch_first, tgt, memory, tgt_keep, memory_keep, causal=True)
    got = run_clearformer(ours, tgt, memory, tgt_keep, memory_keep, backend)
    assert_real_close_padded_zero(got, want, tgt_keep)
