"""NumPy functions on tensors: those with an EveryO op of the same meaning dispatch to it (and
differentiate); others run on the arrays, and refuse to hand out floating values computed
from a tensor that records gradients (the gradient would silently be lost)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def _x(requires_grad=True):
    return eo.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=requires_grad)


def test_np_exp_times_a_weight_differentiates_through_the_exp():
    x, w = _x(), eo.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    (np.exp(x) * w).sum().backward()
    np.testing.assert_allclose(x.grad, np.exp(x.data) * w.data, rtol=1e-12)
    np.testing.assert_allclose(w.grad, np.exp(x.data), rtol=1e-12)


@pytest.mark.parametrize("call, ours", [
    (lambda x: np.add(x, 2.0), lambda x: x + 2.0),
    (lambda x: np.multiply(np.ones(3), x), lambda x: x * 1.0),
    (lambda x: np.sqrt(x * x), lambda x: eo.sqrt(x * x)),
    (lambda x: np.matmul(x, np.ones((3, 2))), lambda x: x @ eo.tensor(np.ones((3, 2)))),
    (lambda x: np.sum(x * x), lambda x: (x * x).sum()),
    (lambda x: np.mean(x, axis=0, keepdims=True), lambda x: x.mean(axis=0, keepdims=True)),
    (lambda x: np.maximum(x, 0.0), lambda x: eo.maximum(x, 0.0)),
    (lambda x: np.where(x.data > 0, x, 0.0), lambda x: eo.where(x.data > 0, x, 0.0)),
    (lambda x: np.tanh(x), eo.tanh),
    (lambda x: np.ones(3) ** x, lambda x: eo.tensor(np.ones(3)) ** x),
])
def test_numpy_functions_with_an_everyo_op_dispatch_to_it(call, ours):
    x, y = _x(), _x()
    got, want = call(x), ours(y)
    assert isinstance(got, eo.Tensor) and got.requires_grad
    np.testing.assert_allclose(got.data, want.data, rtol=1e-12)
    got.sum().backward()
    want.sum().backward()
    np.testing.assert_allclose(x.grad, y.grad, rtol=1e-12)


@pytest.mark.parametrize("call, label", [
    (lambda x: np.sin(x), "np.sin"),
    (lambda x: np.add.reduce(x), "np.add.reduce"),
    (lambda x: np.sum(x, dtype=np.float32), "np.sum"),
    (lambda x: np.cumprod(x), "np.cumprod"),
    (lambda x: np.linalg.norm(x), "np.linalg.norm"),
])
def test_other_numpy_functions_refuse_a_tensor_that_records_gradients(call, label):
    with pytest.raises(eo.EveryOError, match=f"{label} on a tensor that records gradients"):
        call(_x())


def test_inference_time_numpy_keeps_working():
    x = _x(requires_grad=False)
    assert isinstance(np.sin(x), np.ndarray)
    np.testing.assert_allclose(np.sin(x), np.sin(x.data))
    np.testing.assert_allclose(np.cumprod(x), np.cumprod(x.data))
    p = _x()
    with eo.no_grad():
        np.testing.assert_allclose(np.sin(p), np.sin(p.data))
    # results that carry no gradient are handed out even from a tensor that records them
    assert np.isfinite(p).all() and np.allclose(p, p.data) and int(np.argmax(p)) == 2
    assert np.shape(p) == (3,)


def test_numpy_cannot_write_into_a_tensor():
    t = eo.zeros(3)
    with pytest.raises(eo.EveryOError, match="out=tensor"):
        np.add(np.ones(3), 1.0, out=t)
    a = np.ones(3)
    a += eo.ones(3)  # an ndarray written with a tensor's values: NumPy's business
    assert a.tolist() == [2.0, 2.0, 2.0]


def test_a_one_element_result_converts_to_a_python_number_as_numpy_s_did():
    t = eo.tensor(np.array([0.5, 1.5]))
    total = np.sum(t)  # (a Tensor now, where NumPy gave a float64)
    assert float(total) == 2.0 and int(total) == 2 and f"{total:.2f}" == "2.00"
    with pytest.raises(eo.EveryOError, match="one element"):
        float(t)


@pytest.mark.parametrize("write", [
    lambda t: np.copyto(t, 7.0),
    lambda t: np.put(t, [0], 9.0),
    lambda t: np.place(t, np.array([True, False, True]), 9.0),
    lambda t: np.putmask(t, np.array([True, False, True]), 9.0),
    lambda t: np.add.at(t, [0], 1.0),
    lambda t: np.negative.at(t, [0]),
    lambda t: np.cumsum(np.ones(3), out=t),
    lambda t: np.put_along_axis(t, np.array([0]), 9.0, axis=0),
    lambda t: np.fill_diagonal(t.reshape(1, 3), 9.0),
], ids=["copyto", "put", "place", "putmask", "add.at", "negative.at", "cumsum_out",
        "put_along_axis", "fill_diagonal_of_a_view"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_numpy_functions_that_would_write_into_a_tensor_are_refused(write, requires_grad):
    t = eo.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=requires_grad)
    version = t._version
    with pytest.raises(eo.EveryOError, match="write into a Tensor"):
        write(t)
    np.testing.assert_array_equal(t.data, [1.0, 2.0, 3.0])
    assert t._version == version


@pytest.mark.parametrize("call", [
    lambda x: np.max(x, 0, np.empty(3)),         # out= given positionally
    lambda x: np.amin(x, 0, np.empty((1, 3)), True),
    lambda x: np.sum(x, 0, None, np.empty(3)),
    lambda x: np.var(x, 0, None, None, 1),       # ddof positionally
    lambda x: np.sum(x, 1, None, None, True),    # keepdims positionally
    lambda x: np.mean(x, 1, np.float32),         # dtype positionally
])
def test_numpy_s_positional_arguments_mean_what_they_mean_in_numpy(call):
    # the translation took np.max(t, 0, out)'s third argument for keepdims (a raw ValueError:
    # "truth value of an array ... is ambiguous")
    data = np.arange(6.0).reshape(2, 3) + 1
    want = call(data.copy())
    got = call(eo.tensor(data))
    np.testing.assert_allclose(got.data if isinstance(got, eo.Tensor) else got, want)
    assert np.shape(got) == np.shape(want)
