"""The learning-rate schedule against its closed forms."""

from __future__ import annotations

import math

import pytest

from clearformer.train.schedule import learning_rate

LR, WARM, TOTAL = 3e-4, 10, 110


def lr(step, decay="cosine", floor=0.0):
    return learning_rate(
        step, lr=LR, warmup_steps=WARM, total_steps=TOTAL, decay=decay, min_lr_ratio=floor
    )


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_warm_up_is_linear_and_reaches_the_peak(decay):
    for step in range(WARM):
        assert lr(step, decay) == pytest.approx(LR * (step + 1) / WARM, rel=1e-12)
    assert lr(WARM - 1, decay) == pytest.approx(LR)
    assert lr(WARM, decay) == pytest.approx(LR)  # decay starts from the peak


@pytest.mark.parametrize("floor", [0.0, 0.1])
def test_cosine_decay_is_the_closed_form(floor):
    for step in range(WARM, TOTAL):
        p = (step - WARM) / (TOTAL - WARM)
        expected = floor * LR + (LR - floor * LR) * (1 + math.cos(math.pi * p)) / 2
        assert lr(step, "cosine", floor) == pytest.approx(expected, rel=1e-12)
    halfway = WARM + (TOTAL - WARM) // 2
    assert lr(halfway, "cosine", floor) == pytest.approx((LR + floor * LR) / 2)


@pytest.mark.parametrize("floor", [0.0, 0.25])
def test_linear_decay_is_the_closed_form(floor):
    for step in range(WARM, TOTAL):
        p = (step - WARM) / (TOTAL - WARM)
        assert lr(step, "linear", floor) == pytest.approx(LR - (LR - floor * LR) * p, rel=1e-12)
    # beyond the end (a resumed run with more steps) it stays at the floor
    assert lr(TOTAL + 50, "linear", floor) == pytest.approx(floor * LR)


def test_constant_after_warm_up_and_no_warm_up():
    assert all(lr(s, "constant") == LR for s in range(WARM, TOTAL))
    assert learning_rate(0, lr=LR, warmup_steps=0, total_steps=5, decay="constant") == LR


def test_schedule_is_monotone_after_warm_up():
    values = [lr(s) for s in range(WARM, TOTAL)]
    assert all(a >= b for a, b in zip(values[:-1], values[1:], strict=True))


def test_unknown_decay_is_an_error():
    with pytest.raises(ValueError, match="decay must be one of"):
        learning_rate(20, lr=LR, warmup_steps=0, total_steps=30, decay="exp")
