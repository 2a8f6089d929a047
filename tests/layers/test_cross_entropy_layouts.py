"""``cross_entropy`` with class-index targets picks and subtracts one entry per position
through a flat index: every layout of the logits and every shape of the targets must give the
gradient of the same values laid out contiguously, and PyTorch's."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def _loss_and_grad(logits: np.ndarray, target: np.ndarray, **options):
    x = eo.tensor(logits, requires_grad=True)
    loss = eo.cross_entropy(x, target, **options)
    upstream = np.linspace(0.5, 2.0, loss.data.size).reshape(loss.shape)
    loss.backward(upstream.astype(loss.data.dtype))  # (upstream: 0.5 for a scalar loss)
    return loss.data, x.grad


@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.1}, {"reduction": "sum"},
                                     {"reduction": "none"}, {"ignore_index": 2}])
@pytest.mark.parametrize("layout", ["transposed", "strided", "reversed"])
def test_every_layout_of_the_logits_gives_the_contiguous_loss_and_gradient(layout, options):
    rng = np.random.default_rng(0)
    base = rng.standard_normal((3, 4, 7)).astype(np.float32)  # (3-D: the flat index reshapes)
    target = rng.integers(0, 7, (3, 4))
    logits = {"transposed": np.asfortranarray(base),
              "strided": np.repeat(base, 2, axis=-1)[..., ::2],
              "reversed": base[::-1][::-1]}[layout]
    assert layout == "reversed" or not logits.flags.c_contiguous
    loss, grad = _loss_and_grad(logits, target, **options)
    expected_loss, expected_grad = _loss_and_grad(np.ascontiguousarray(base), target, **options)
    np.testing.assert_array_equal(loss, expected_loss)
    np.testing.assert_array_equal(grad, expected_grad)


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)])
@pytest.mark.parametrize("ignored", [False, True])
def test_targets_of_any_shape_match_torch(torch, shape, ignored):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal(shape + (6,))
    target = rng.integers(0, 6, shape)
    if ignored and target.size > 1:
        target.flat[1] = -100
    loss, grad = _loss_and_grad(logits, target)
    # (PyTorch's classes are on axis 1: move ours there)
    t = torch.tensor(np.moveaxis(logits, -1, 1) if logits.ndim > 1 else logits,
                     requires_grad=True)
    expected = torch.nn.functional.cross_entropy(t, torch.tensor(target))
    expected.backward(torch.tensor(0.5, dtype=torch.float64))
    np.testing.assert_allclose(loss, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    expected_grad = t.grad.numpy()
    np.testing.assert_allclose(grad, np.moveaxis(expected_grad, 1, -1) if logits.ndim > 1
                               else expected_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int64", ">i8", "uint8", ">u4"])
@pytest.mark.parametrize("value", [-1, 6, 2 ** 56, "ignored"])
def test_a_class_outside_the_range_is_refused_in_every_integer_dtype(dtype, value):
    # NOTE: the check reads the targets' unsigned view first: a negative class, one past the
    # last and one whose bytes swapped would look in range must all be refused
    info = np.iinfo(np.dtype(dtype))
    if value != "ignored" and not info.min <= value <= info.max:
        pytest.skip(f"{value} is not a {dtype}")
    target = np.array([1, 0, 5, 3], dtype=dtype)
    ignore = -100 if info.min <= -100 else 200
    target[2] = ignore if value == "ignored" else value
    logits = eo.tensor(np.zeros((4, 6), np.float32), requires_grad=True)
    if value == "ignored":
        eo.cross_entropy(logits, target, ignore_index=ignore).backward()
        assert not logits.grad[2].any() and logits.grad[0].any()
        return
    with pytest.raises(eo.EveryOError, match=f"target {value} is outside the 6 classes"):
        eo.cross_entropy(logits, target)
