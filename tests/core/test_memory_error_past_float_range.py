"""A shape whose byte count is past a float's range (more than ~1.8e308 bytes) is still an
``EveryOMemoryError`` naming the shape: formatting its bytes as a float raised Python's raw
``OverflowError`` from inside the error's own message."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOMemoryError, allocating


@pytest.mark.parametrize("call", [lambda: eo.zeros((10**160, 10**160)),
                                  lambda: eo.ones(10**200, 10**200, dtype="float64")])
def test_bytes_past_a_float_are_still_named(call):
    with pytest.raises(EveryOMemoryError, match=r"tensor of shape \(.*\) needs about \de\+\d{3} bytes"):
        call()


def test_the_context_itself_formats_any_size():
    shape = (10**200, 10**200)
    with pytest.raises(EveryOMemoryError, match=r"needs about 8e\+400 bytes"):
        with allocating("zeros", shape, np.dtype("float64")):
            raise MemoryError("stand-in for NumPy's refusal")


def test_a_size_of_thousands_of_digits_is_formatted_too():
    with pytest.raises(EveryOMemoryError, match=r"needs about 4e\+6000 bytes"):
        with allocating("zeros", (10**3000, 10**3000), np.dtype("float32")):
            raise MemoryError("stand-in for NumPy's refusal")
