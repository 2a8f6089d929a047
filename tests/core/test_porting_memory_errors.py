"""A tensor too large to allocate is an ``EveryOMemoryError`` (an ``EveryOError`` and a
``MemoryError``, as NumPy and PyTorch raise) naming the function, the shape and the bytes,
never NumPy's raw ``ArrayMemoryError`` or ``ValueError``.

The sizes are past any machine's address space (>= 10**15 elements), so no allocation can
succeed and no memory is touched."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError, EveryOMemoryError, allocating

HUGE = 10**15


@pytest.mark.parametrize("name, call", [
    ("zeros", lambda: eo.zeros(HUGE)),
    ("zeros", lambda: eo.zeros(10**8, 10**8)),
    ("ones", lambda: eo.ones((10**8, 10**8))),
    ("full", lambda: eo.full((HUGE,), 0.5)),
    ("randn", lambda: eo.randn(HUGE)),
    ("rand", lambda: eo.rand(10**8, 10**8)),
    ("arange", lambda: eo.arange(HUGE)),
    ("zeros", lambda: eo.zeros(10**30)),  # past what an index counts: NumPy's ValueError
])
def test_creation_functions_name_what_cannot_be_allocated(name, call):
    with pytest.raises(EveryOMemoryError, match=rf"^{name}: .* tensor of shape \(.*\) needs "
                                                r"[0-9.e+]+ bytes") as caught:
        call()
    assert isinstance(caught.value, MemoryError) and isinstance(caught.value, EveryOError)


def test_the_shape_and_bytes_are_the_requested_ones():
    with pytest.raises(EveryOMemoryError) as caught:
        eo.zeros(10**8, 10**8, dtype="float64")
    assert "float64 tensor of shape (100000000, 100000000) needs 8e+16 bytes" in str(caught.value)


def test_other_value_errors_are_not_taken_for_memory():
    with pytest.raises(ValueError, match="something else"):
        with allocating("zeros", (2,), np.dtype("float32")):
            raise ValueError("something else")


def test_numpys_own_error_supplies_the_shape():
    with pytest.raises(EveryOMemoryError, match=r"^f: a float64 tensor of shape "
                                                r"\(100000000, 100000000\)"):
        with allocating("f"):
            np.empty((10**8, 10**8))
