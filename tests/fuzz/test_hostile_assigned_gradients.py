"""Gradients assigned by hand (``p.grad = ...``, as PyTorch code does) that are not a floating
array of the parameter's shape: every consumer (the optimizers, L-BFGS, ``clip_grad_norm_``,
``GradScaler``) refuses them by name, never NumPy's raw error nor a silent broadcast (a scalar
or one row assigned as the gradient of a matrix stepped every element alike)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
import everyo.kernels as K
from everyo.errors import EveryOError


def _need(provider: str) -> None:
    if provider != "numpy" and provider not in K.kernel.registry.providers():
        pytest.skip(f"kernel provider {provider} not installed")


def _read_only(array):
    array.flags.writeable = False
    return array


HOSTILE = {
    "transposed": lambda: np.ones((4, 3), np.float32),
    "scalar": lambda: np.float32(1.0),
    "0-d array": lambda: np.ones((), np.float32),
    "one row": lambda: np.ones(4, np.float32),
    "integers": lambda: np.ones((3, 4), np.int64),
    "complex": lambda: np.ones((3, 4), np.complex64),
    "objects": lambda: np.ones((3, 4), object),
    "list": lambda: [[1.0] * 4] * 3,
    "Tensor": lambda: eo.ones(3, 4),
}

CONSUMERS = {
    "SGD": lambda p: eo.SGD([p], lr=0.1, momentum=0.9).step(),
    "Adam": lambda p: eo.Adam([p], lr=0.1).step(),
    "AdamW": lambda p: eo.AdamW([p]).step(),
    "RMSprop": lambda p: eo.RMSprop([p]).step(),
    "Adagrad": lambda p: eo.Adagrad([p]).step(),
    "Adadelta": lambda p: eo.Adadelta([p]).step(),
    "LBFGS": lambda p: eo.LBFGS([p]).step(lambda: eo.tensor(0.0)),
    "clip_grad_norm_": lambda p: eo.clip_grad_norm_([p], 0.5),
    "GradScaler": lambda p: eo.GradScaler().step(eo.SGD([p], lr=0.1)),
}


@pytest.mark.parametrize("provider", ["numpy", "numba"])
@pytest.mark.parametrize("consumer", list(CONSUMERS))
@pytest.mark.parametrize("grad", list(HOSTILE))
def test_a_hand_assigned_gradient_that_does_not_fit_is_refused_by_name(grad, consumer, provider):
    _need(provider)
    p = eo.Parameter(np.ones((3, 4), np.float32))
    p.grad = HOSTILE[grad]()
    with K.use(provider), pytest.raises(EveryOError, match=r"\.grad.*\(3, 4\)"):
        CONSUMERS[consumer](p)
    np.testing.assert_array_equal(p.data, np.ones((3, 4), np.float32))  # nothing stepped


def test_a_refused_gradient_in_a_later_group_leaves_every_group_and_the_count_unstepped():
    good, bad = (eo.Parameter(np.ones((3, 4), np.float32)) for _ in range(2))
    good.grad, bad.grad = np.ones((3, 4), np.float32), np.float32(1.0)
    opt = eo.SGD([{"params": [good]}, {"params": [bad]}], lr=0.5)
    with pytest.raises(EveryOError, match=r"parameter 1 \(shape \(3, 4\)"):
        opt.step()
    np.testing.assert_array_equal(good.data, np.ones((3, 4), np.float32))
    assert opt.step_count == 0


@pytest.mark.parametrize("provider", ["numpy", "numba"])
@pytest.mark.parametrize("consumer", ["clip_grad_norm_", "GradScaler"])
def test_a_read_only_gradient_is_refused_where_it_is_written_in_place(consumer, provider):
    """(The numba GradScaler kernel raised Numba's TypingError on it; the reference NumPy's
    'output array is read-only'.)"""
    _need(provider)
    p = eo.Parameter(np.ones((3, 4), np.float32))
    p.grad = _read_only(np.full((3, 4), 4.0, np.float32))
    with K.use(provider), pytest.raises(EveryOError, match=r"read-only"):
        CONSUMERS[consumer](p)


@pytest.mark.parametrize("provider", ["numpy", "numba"])
def test_gradients_that_fit_in_any_floating_dtype_or_layout_still_step(provider):
    """What the check lets through: another floating dtype, a strided view, a read-only array
    where nothing writes it (an optimizer only reads the gradient)."""
    _need(provider)
    fits = [np.full((3, 4), 0.5), np.full((3, 4), 0.5, np.float16),
            np.full((4, 3), 0.5, np.float32).T, _read_only(np.full((3, 4), 0.5, np.float32))]
    with K.use(provider):
        for grad in fits:
            p = eo.Parameter(np.ones((3, 4), np.float32))
            p.grad = grad
            eo.SGD([p], lr=1.0).step()
            np.testing.assert_array_equal(p.data, np.full((3, 4), 0.5, np.float32))


def test_the_numba_scaler_kernel_leaves_read_only_gradients_to_the_reference():
    """unscale_all_finite with inverse 1 (a bfloat16 scaler's check) writes nothing, so the
    reference takes read-only gradients; the compiled kernel raised Numba's TypingError on a
    read-only array beside a writable one (two array types in one tuple)."""
    _need("numba")
    grads = [np.ones(5, np.float32), _read_only(np.array([1.0, np.inf], np.float32))]
    with K.use("numba"):
        assert K.kernel.unscale_all_finite(grads, 1.0) is False
        assert K.kernel.unscale_all_finite(grads[1:], 1.0) is False


ALIASES = {
    "the same array": lambda g: g,
    "a view of all of it": lambda g: g[:],
    "reversed": lambda g: g.reshape(-1)[::-1].reshape(3, 4),
}


@pytest.mark.parametrize("provider", ["numpy", "numba"])
@pytest.mark.parametrize("consumer", ["clip_grad_norm_", "GradScaler"])
@pytest.mark.parametrize("alias", list(ALIASES))
def test_two_parameters_sharing_one_gradient_array_are_refused_where_it_is_scaled(
        alias, consumer, provider):
    """``q.grad = p.grad`` (two names for one array): scaled in place once per parameter, it
    was scaled twice, silently (the scaler's step moved both parameters by grad/scale**2)."""
    _need(provider)
    p, q = (eo.Parameter(np.ones((3, 4), np.float32)) for _ in range(2))
    p.grad = np.full((3, 4), 4.0, np.float32)
    q.grad = ALIASES[alias](p.grad)
    scale = {"clip_grad_norm_": lambda: eo.clip_grad_norm_([p, q], 0.5),
             "GradScaler": lambda: eo.GradScaler(init_scale=2.0).step(eo.SGD([p, q], lr=1.0))}
    with K.use(provider), pytest.raises(EveryOError, match=r"parameters 0 and 1 .*share"):
        scale[consumer]()
    np.testing.assert_array_equal(p.grad, np.full((3, 4), 4.0, np.float32))


def test_gradients_that_are_disjoint_views_of_one_buffer_are_scaled_once_each():
    """What data-parallel buckets hand out (each .grad a slice of one flat buffer) is fine."""
    flat = np.arange(1.0, 25.0, dtype=np.float32)
    params = [eo.Parameter(np.ones((3, 4), np.float32)) for _ in range(2)]
    params[0].grad, params[1].grad = flat[:12].reshape(3, 4), flat[12:].reshape(3, 4)
    eo.GradScaler(init_scale=2.0).unscale_(eo.SGD(params, lr=1.0))
    np.testing.assert_array_equal(flat, np.arange(1.0, 25.0, dtype=np.float32) / 2)


def _read_only_ones():
    return _read_only(np.ones((3, 4), np.float32))


@pytest.mark.parametrize("provider", ["numpy", "numba"])
@pytest.mark.parametrize("data", [_read_only_ones,
                                  lambda: np.broadcast_to(np.ones(4, np.float32), (3, 4))],
                         ids=["read-only", "broadcast view"])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "LBFGS"])
def test_a_read_only_parameter_is_refused_before_any_parameter_moves(optimizer, data, provider):
    """``p.data = <a read-only array>`` (a memory-mapped file, a broadcast view): the step
    raised NumPy's 'output array is read-only' after updating the parameters before it."""
    _need(provider)
    first, second = (eo.Parameter(np.ones((3, 4), np.float32)) for _ in range(2))
    second.data = data()
    for p in (first, second):
        p.grad = np.full((3, 4), 0.5, np.float32)
    with K.use(provider), pytest.raises(EveryOError, match=r"parameter 1 .*read-only"):
        _step(optimizer, [first, second])
    np.testing.assert_array_equal(first.data, np.ones((3, 4), np.float32))


def _step(optimizer, params):
    if optimizer == "LBFGS":
        return eo.LBFGS(params).step(lambda: eo.tensor(0.0))
    return getattr(eo, optimizer)(params, lr=0.1).step()
