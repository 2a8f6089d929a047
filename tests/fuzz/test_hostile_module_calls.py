"""Misuses of the Module machinery that raised Python's plain TypeError/IndexError, not an
EveryO error (still TypeError/IndexError, for code that catches those, as PyTorch raises)."""

from __future__ import annotations

import pytest

import everyo as eo


def test_assigning_a_tensor_over_a_parameter_is_an_everyo_type_error():
    layer = eo.Linear(2, 2)
    with pytest.raises(eo.EveryOError, match=r"Linear.weight, which is a Parameter") as caught:
        layer.weight = eo.ones(2, 2)
    assert isinstance(caught.value, TypeError)


@pytest.mark.parametrize("register", [
    lambda t: t.register_hook(5),
    lambda t: t.register_post_accumulate_grad_hook("f"),
])
def test_a_hook_that_is_not_callable_is_an_everyo_type_error(register):
    t = eo.Parameter([1.0, 2.0])
    with pytest.raises(eo.EveryOError, match=r"callable") as caught:
        register(t)
    assert isinstance(caught.value, TypeError)


def test_a_module_list_index_out_of_range_is_an_everyo_index_error():
    layers = eo.ModuleList([eo.ReLU(), eo.Tanh()])
    with pytest.raises(eo.EveryOError, match=r"index 5 out of range") as caught:
        layers[5]
    assert isinstance(caught.value, IndexError)
    assert [type(m).__name__ for m in layers] == ["ReLU", "Tanh"]  # (iteration still ends)
