"""A layer too large to create is an ``EveryOMemoryError`` (also a ``MemoryError``) naming the
layer, its arguments, the shape and the bytes of what could not be allocated. Sizes past any
address space, so nothing is allocated."""

from __future__ import annotations

import pytest

import everyo as eo
from everyo.errors import EveryOMemoryError


@pytest.mark.parametrize("name, args", [
    ("Linear", (3, 10**16)), ("Linear", (10**8, 10**8)), ("Embedding", (10**15, 8)),
    ("Conv2D", (10**7, 10**7, 3)), ("LSTM", (10**8, 10**8)), ("BatchNorm2D", (10**16,)),
    ("LayerNorm", (10**16,)),
])
def test_a_layer_too_large_names_itself_the_shape_and_bytes(name, args):
    with pytest.raises(EveryOMemoryError, match=rf"^{name}\({args[0]}[,)].*creating its "
                                                rf"parameters: a \w+ tensor of shape .* needs "
                                                r"[0-9.e+]+ bytes") as caught:
        getattr(eo, name)(*args)
    assert isinstance(caught.value, MemoryError)
