"""GradScaler's scale at its limits: ``update(new_scale=)`` took inf (every later step then
skipped, the scale staying inf), True (as 1.0) and raised Python's raw TypeError on a string;
and growth went past float32's range (2**128 and up), where the scaled float32 loss is inf, so
every growth cost a skipped step. PyTorch keeps the scale where it was when growing would make
it non-finite in float32; so does EveryO now."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -2.0, "2", [2.0], True])
def test_update_refuses_a_new_scale_that_is_no_positive_finite_number(value):
    scaler = eo.GradScaler(init_scale=8.0)
    with pytest.raises(EveryOError, match=r"new_scale"):
        scaler.update(new_scale=value)
    assert scaler.get_scale() == 8.0


def test_update_takes_a_numpy_number():
    scaler = eo.GradScaler()
    scaler.update(new_scale=np.float32(4.0))
    assert scaler.get_scale() == 4.0


def _clean_step(scaler):
    w = eo.Parameter(np.ones(3, np.float32))
    w.grad = np.ones(3, np.float32)
    assert scaler.step(eo.SGD([w], lr=0.0))
    scaler.update()


def test_growth_stops_below_float32s_overflow_as_pytorchs_does():
    scaler = eo.GradScaler(init_scale=2.0 ** 126, growth_factor=2.0, growth_interval=1)
    for expected in (2.0 ** 127, 2.0 ** 127, 2.0 ** 127):
        _clean_step(scaler)
        assert scaler.get_scale() == expected
    loss = eo.tensor(np.float32(1.5), requires_grad=True)
    assert np.isfinite(scaler.scale(loss).data)  # (2**128 * 1.5 was inf: a skipped step)
