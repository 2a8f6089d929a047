"""The gradient a backward pass starts from (``y.backward(grad)``, ``eo.grad(y, x, grad)``):
a complex one for a real output lost its imaginary part with only NumPy's ComplexWarning (a
silent wrong number), and ``eo.grad`` took a NumPy scalar for a sequence (Python's raw
"'numpy.float32' object is not iterable")."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError


def _graph():
    x = eo.tensor(np.arange(1.0, 4.0, dtype=np.float32), requires_grad=True)
    return x, x * x


@pytest.mark.parametrize("how", ["backward", "eo.grad"])
def test_a_complex_gradient_for_a_real_output_is_refused(how):
    x, y = _graph()
    seed = np.array([1 + 2j, 1, 1], np.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (not a ComplexWarning either)
        with pytest.raises(EveryOError, match=r"complex.*float32"):
            y.backward(seed) if how == "backward" else eo.grad(y, x, seed)


def test_eo_grad_takes_a_numpy_scalar_or_a_number_as_the_one_outputs_gradient():
    x = eo.tensor(np.float32(3.0), requires_grad=True)
    for seed in (np.float32(2.0), 2.0, 2):
        (dx,) = eo.grad(x * x, x, seed)
        assert float(np.asarray(dx)) == 12.0


def test_eo_grad_refuses_a_string_seed_by_name():
    x, y = _graph()
    with pytest.raises(EveryOError, match=r"not numeric"):
        eo.grad(y, x, "abc")


def test_a_zero_dimensional_parameters_gradient_is_an_array_that_steps_and_clips():
    """NumPy's 0-d arithmetic gives scalars: a 0-d leaf's .grad was an np.float32, which
    clip_grad_norm_ 'scaled in place' by rebinding a local (the gradient stayed unclipped,
    silently), and eo.grad's result held a scalar, not the array a Tensor holds."""
    w = eo.Parameter(np.float32(3.0))
    (w * w).backward()
    assert type(w.grad) is np.ndarray and w.grad.shape == () and float(w.grad) == 6.0
    assert eo.clip_grad_norm_([w], 1.0) == pytest.approx(6.0)
    assert float(w.grad) == pytest.approx(1.0, rel=1e-5)
    eo.SGD([w], lr=1.0).step()
    assert float(w.data) == pytest.approx(2.0, rel=1e-5)
    (dw,) = eo.grad((w * 2.0).exp(), w)
    assert type(dw.data) is np.ndarray and dw.data.shape == ()
