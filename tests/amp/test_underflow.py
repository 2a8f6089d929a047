"""The underflow experiment, as a test: float16 gradients of a loss scaled into float16's
underflow range flush to zero; GradScaler rescues them and training matches float32; under
bfloat16 nothing flushes in the first place.

Independent of examples/mixed_precision.py (other data, seeds and length), so the story is not
an accident of one configuration."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_amp import ZeroCount, flushed_to_zero

LOSS_FACTOR = 2.0**-22  # dL/dprediction = 2 r / 128 * 2**-22: ~1e-9 per unit residual


def regression_data(seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((128, 6)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal(6)) + 0.5 * (x @ rng.standard_normal(6))
    return eo.tensor(x), eo.tensor(y.astype(np.float32)[:, None])


def train(mode, steps, x, y):
    model = eo.Sequential(eo.Linear(6, 12, seed=3), eo.Tanh(), eo.Linear(12, 1, seed=4))
    optimizer = eo.SGD(list(model.parameters()), lr=0.05 / LOSS_FACTOR, momentum=0.9)
    scaler = eo.GradScaler() if mode == "scaler" else None
    zeros = []
    for _ in range(steps):
        optimizer.zero_grad()
        with eo.autocast(enabled=mode != "float32",
                         dtype="bfloat16" if mode == "bfloat16" else "float16"):
            prediction = model(x)
        loss = eo.mse_loss(prediction, y) * LOSS_FACTOR
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.backward(loss)
            assert scaler.step(optimizer)  # no overflow at this scale
            scaler.update()
        zeros.append(flushed_to_zero(model.parameters()).flushed)
    with eo.no_grad():
        mse = eo.mse_loss(model(x), y).item()
    return zeros, mse, flushed_to_zero(model.parameters()).total


@pytest.fixture(scope="module")
def runs():
    x, y = regression_data()
    return {mode: train(mode, 120, x, y)
            for mode in ("autocast", "scaler", "bfloat16", "float32")}


def test_without_a_scaler_almost_every_gradient_flushes(runs):
    zeros, _, total = runs["autocast"]
    assert total == 6 * 12 + 12 + 12 + 1
    assert zeros[0] >= 0.9 * total
    assert min(zeros) >= 0.9 * total  # it never recovers


def test_the_scaler_rescues_the_gradients(runs):
    zeros, _, total = runs["scaler"]
    float32_zeros, _, _ = runs["float32"]
    assert zeros[0] == 0
    # NOTE: late in training, residuals near 1e-4 give scaled gradients near float16's
    # subnormal floor again, so an odd element can still be exactly zero (the dynamic scale
    # would only grow after growth_interval=2000 clean steps).
    assert max(zeros) <= 0.05 * total
    assert float32_zeros[0] == 0


def test_final_mse_scaler_matches_float32_bare_run_does_not(runs):
    _, bare, _ = runs["autocast"]
    _, scaled, _ = runs["scaler"]
    _, reference, _ = runs["float32"]
    x, y = regression_data()
    initial = float(np.mean(y.data ** 2))
    assert reference < 0.05 * initial  # the problem is learnable in 120 steps
    assert scaled == pytest.approx(reference, rel=0.05)
    assert bare > 10 * reference


def test_bfloat16_needs_no_scaler_nothing_flushes_and_training_matches_float32(runs):
    zeros, mse, _ = runs["bfloat16"]
    _, float16_bare, _ = runs["autocast"]
    _, reference, _ = runs["float32"]
    assert max(zeros) == 0  # float32's exponent range: a 1e-9 gradient is representable
    # NOTE: 8 significant bits against float16's 11 cost some accuracy, not the training.
    assert mse == pytest.approx(reference, rel=0.1)
    assert float16_bare > 10 * mse


def test_flushed_to_zero_counts_arrays_and_refuses_missing_grads():
    assert flushed_to_zero([np.zeros(3), np.array([1.0, 0.0])]) == ZeroCount(4, 5)
    assert str(ZeroCount(4, 5)) == "4 / 5"
    with pytest.raises(eo.EveryOError, match="tensor 1 .* no gradient"):
        flushed_to_zero([_with_grad(eo.Parameter(np.ones(2))), eo.Parameter(np.ones(3))])


def _with_grad(p):
    p.grad = np.zeros_like(p.data)
    return p
