"""A hand-assigned ``.grad`` narrower than its parameter (float16 or bfloat16 on float32,
float32 on float64) is accepted by the optimizers (``checked_gradients``: "a step converts");
it must step exactly as its exact conversion to the parameter's dtype does. Computed in the
gradient's own dtype (``lr * g``, ``g * g`` in float16) a small step underflowed to nothing:
SGD with lr 1e-5 on a float16 gradient of 1e-3 left a float32 weight unchanged, silently."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.dtypes import resolve_dtype

OPTIMIZERS = [lambda ps: eo.SGD(ps, lr=1e-5),
              lambda ps: eo.SGD(ps, lr=1e-5, momentum=0.9, maximize=True),
              lambda ps: eo.Adam(ps, lr=1e-3),
              lambda ps: eo.RMSprop(ps, lr=1e-3)]


@pytest.mark.parametrize("make", OPTIMIZERS, ids=["sgd", "sgd-momentum-max", "adam", "rmsprop"])
@pytest.mark.parametrize("narrow, wide", [("float16", "float32"), ("bfloat16", "float32"),
                                          ("float32", "float64")])
def test_a_narrow_gradient_steps_as_its_exact_conversion(make, narrow, wide):
    rng = np.random.default_rng(0)
    start = (rng.standard_normal(64) * 1e-6).astype(wide)
    grad = (rng.standard_normal(64) * 1e-4).astype(resolve_dtype(narrow, "test"))
    results = []
    for g in (grad, grad.astype(wide)):  # (the conversion is exact: a wider dtype)
        w = eo.Parameter(start.copy())
        optimizer = make([w])
        for _ in range(2):
            w.grad = g.copy()
            optimizer.step()
        results.append(w.data)
    assert results[0].dtype == np.dtype(wide)
    assert np.array_equal(results[0], results[1])
    assert not np.array_equal(results[1], start)
