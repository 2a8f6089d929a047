"""A .grad sharing memory with a parameter's data (its own or another's) is refused by every
step that writes the parameters, naming the parameter: the step would read a gradient it is
overwriting (the NumPy reference and the compiled step then disagree, and neither means
anything). Gradients in memory apart from the data, even in one shared buffer, are accepted."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo

OPTIMIZERS = {
    "SGD": lambda ps: eo.SGD(ps, lr=0.1, momentum=0.9),
    "Adam": lambda ps: eo.Adam(ps, lr=0.1),
    "AdamW": lambda ps: eo.AdamW(ps, lr=0.1),
    "RMSprop": lambda ps: eo.RMSprop(ps, lr=0.1),
    "Adagrad": lambda ps: eo.Adagrad(ps, lr=0.1),
    "Adadelta": lambda ps: eo.Adadelta(ps),
}


def _params():
    rng = np.random.default_rng(0)
    return [eo.Parameter(rng.standard_normal(shape).astype(np.float32))
            for shape in ((3, 4), (4,), (3, 4))]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("alias", ["own data", "own data's view", "another's data"])
def test_a_gradient_aliasing_a_stepped_parameter_is_refused(name, alias):
    params = _params()
    for p in params:
        p.grad = np.ones_like(p.data)
    if alias == "own data":
        params[2].grad = params[2].data
    elif alias == "own data's view":
        params[2].grad = params[2].data[::-1]
    else:
        params[2].grad = params[0].data
    before = [p.data.copy() for p in params]
    with pytest.raises(eo.EveryOError, match=rf"{name}\.step: the \.grad of parameter 2 "
                                             r"shares memory with the data of parameter [02]"):
        OPTIMIZERS[name](params).step()
    for p, b in zip(params, before, strict=True):  # refused before anything changed
        np.testing.assert_array_equal(p.data, b)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_gradients_beside_the_data_in_one_buffer_are_accepted(name):
    arena = np.random.default_rng(1).standard_normal(24).astype(np.float32)
    p = eo.Parameter(np.zeros(12, np.float32))
    p.data = arena[:12]  # the data and the gradient: two halves of one buffer
    p.grad = arena[12:]
    before = p.data.copy()
    OPTIMIZERS[name]([p]).step()
    assert np.shares_memory(p.data, arena) and not np.array_equal(p.data, before)


def test_clip_grad_norm_refuses_a_gradient_aliasing_its_data():
    p = eo.Parameter(np.ones(3, np.float32))
    p.grad = p.data
    with pytest.raises(eo.EveryOError, match=r"clip_grad_norm_: the \.grad of parameter 0 "
                                             r"shares memory with the data of parameter 0"):
        eo.clip_grad_norm_([p], 1.0)
