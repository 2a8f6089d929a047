"""Input validation shared by the layers: clear errors naming the layer and both shapes."""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Tensor
from everyo.kernels import is_floating


def array_of(x) -> np.ndarray:
    """The NumPy array behind ``x`` (a Tensor, an array or anything array-like)."""
    return x.data if isinstance(x, Tensor) else np.asarray(x)


def check_float(layer: str, x) -> np.ndarray:
    """Refuse integer/bool input to a layer that computes in floating point."""
    data = array_of(x)
    if not is_floating(data.dtype) or data.dtype.kind == "c":
        raise EveryOError(f"{layer}: expected floating-point input, got {data.dtype.name} "
                          f"(shape {data.shape}); convert it with x.astype('float32')")
    return data


def check_last_axis(layer: str, x, size: int, what: str = "features",
                    min_ndim: int = 1) -> np.ndarray:
    """Float input whose last axis has ``size`` entries and at least ``min_ndim`` axes."""
    data = check_float(layer, x)
    if data.ndim < min_ndim or data.shape[-1] != size:
        raise EveryOError(f"{layer}: expected input with {size} {what} on the last axis, "
                          f"got shape {data.shape}")
    return data


def pair(value, name: str) -> tuple:
    """``3`` -> ``(3, 3)``; ``(2, 3)`` stays; anything else is an error naming ``name``."""
    if isinstance(value, (int, np.integer)):
        return int(value), int(value)
    try:
        a, b = value
        return int(a), int(b)
    except (TypeError, ValueError):
        raise EveryOError(f"{name} must be an int or a pair of ints, got {value!r}") from None


def check_groups(layer: str, groups, in_channels: int, out_channels: int) -> int:
    """``groups`` as a positive int dividing both channel counts, or an error naming ``layer``."""
    if not isinstance(groups, (int, np.integer)) or groups <= 0:
        raise EveryOError(f"{layer}: groups must be a positive int, got {groups!r}")
    if in_channels % groups or out_channels % groups:
        raise EveryOError(f"{layer}: groups={groups} must divide both in_channels "
                          f"({in_channels}) and out_channels ({out_channels})")
    return int(groups)
