"""Activation checkpointing is a per-call choice (``model(..., checkpointing=True)``, carried
in the plan; the config's field is the default): the same gradients, fewer saved activations,
every block run again in backward. And the stack calls its blocks through ``__call__``, so
module hooks fire per block."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from clearformer import EncoderConfig, EncoderModel

from .helpers import lengths_mask

CONFIG = EncoderConfig(
    d_model=32, n_heads=4, n_layers=3, dim_mlp=64, vocab_size=50, max_positions=16, dropout=0.0
)


def run(model, checkpointing, *, packed=False):
    """One forward and backward; (gradients, block calls in forward, in backward, tensors
    saved for backward)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (3, 12))
    mask = lengths_mask([12, 7, 3], 12)
    calls = {"forward": 0, "backward": 0}
    phase = ["forward"]
    hooks = [
        block.register_forward_pre_hook(lambda *_: calls.__setitem__(phase[0], calls[phase[0]] + 1))
        for block in model.encoder.layers
    ]
    saved = [0]

    def pack(tensor):
        saved[0] += 1
        return tensor

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if packed:
            cu = torch.tensor([0, 12, 19, 22], dtype=torch.int32)
            out = model(ids[mask], cu_seqlens=cu, checkpointing=checkpointing)
        else:
            out = model(ids, mask, checkpointing=checkpointing)
    phase[0] = "backward"
    (out.square().sum()).backward()
    for hook in hooks:
        hook.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return grads, calls["forward"], calls["backward"], saved[0]


@pytest.mark.parametrize("packed", [False, True])
def test_checkpointing_per_call_gives_the_same_gradients_and_recomputes(packed):
    torch.manual_seed(1)
    model = EncoderModel(CONFIG).train()
    plain, f0, b0, saved0 = run(model, False, packed=packed)
    again, f1, b1, saved1 = run(model, True, packed=packed)
    assert (f0, b0) == (3, 0)  # each block once, through its hooks
    assert (f1, b1) == (3, 3)  # and once more in backward: recomputed
    assert saved1 < saved0 / 2  # only each block's input is kept
    for name, grad in plain.items():
        torch.testing.assert_close(again[name], grad, rtol=0, atol=1e-6, msg=name)


def test_the_config_is_the_default_and_a_call_overrides_it():
    torch.manual_seed(1)
    model = EncoderModel(dataclasses.replace(CONFIG, checkpointing=True)).train()
    assert run(model, None)[2] == 3  # the config's default: recomputed
    assert run(model, False)[2] == 0  # this call says no
    assert model.config.checkpointing  # nothing on the module changed
    mask = lengths_mask([4, 2], 4)
    assert model.encoder.plan_for(mask).checkpointing
    assert not model.encoder.plan_for(mask, checkpointing=False).checkpointing
    with torch.no_grad():  # no gradients: nothing to recompute for
        model(torch.zeros(2, 4, dtype=torch.long), mask, checkpointing=True)


def test_a_plan_holds_the_choice_and_a_bad_value_is_refused():
    model = EncoderModel(CONFIG).train()
    x = torch.randn(2, 4, 32)
    plan = model.encoder.plan_for(None, shape=(2, 4), device=x.device, checkpointing=True)
    with pytest.raises(ValueError, match="give either a plan or mask/backend/output/checkpoint"):
        model.encoder(x, plan=plan, checkpointing=True)
    with pytest.raises(TypeError, match="checkpointing must be a bool"):
        model.encoder(x, checkpointing="yes")
