"""Validation shared by the layers: constructor arguments (:func:`argument`) and inputs,
with clear errors naming the layer, the argument and, for inputs, both shapes."""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Tensor
from everyo.kernels import is_floating
from everyo.validation import ARGUMENT_KINDS, ArgumentError, checked_argument, is_int


def array_of(x) -> np.ndarray:
    """The NumPy array behind ``x`` (a Tensor, an array or anything array-like); a ragged
    nested list is an ``EveryOError``, not NumPy's ``ValueError``."""
    if isinstance(x, Tensor):
        return x.data
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise EveryOError(f"the input is not an array (nested lists of different lengths?): "
                          f"{exc}") from None


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


class LayerArgumentError(ArgumentError):
    """A layer was constructed with an argument of the wrong type or outside its range.

    Also a ``TypeError``, the exception PyTorch raises for such arguments, so code written
    for either catches it.
    """


_is_int = is_int


def argument(layer: str, name: str, value, kind: str):
    """``value`` of constructor argument ``name`` of ``layer``, checked against ``kind``.

    Args:
        layer: the layer class name the error names.
        name: the argument's name.
        value: what the caller passed.
        kind: one of ``"int"``, ``"positive int"``, ``"non-negative int"``, ``"float"``,
            ``"positive float"``, ``"non-negative float"``, ``"probability"``.

    Returns:
        ``value`` as a Python ``int`` (the int kinds) or ``float`` (the others). Floats are
        never truncated to ints and bools are never numbers: both raise
        :class:`LayerArgumentError` naming ``layer`` and ``name``.

    Example:
        >>> argument("Linear", "in_features", 3, "positive int")
        3
        >>> argument("Dropout", "p", 1, "probability")
        1.0
    """
    if isinstance(value, np.ndarray):  # NOTE: the core also takes 0-d arrays (loaded states)
        raise LayerArgumentError(f"{layer}: {name} must be {ARGUMENT_KINDS[kind][2]}, got "
                                 f"{value!r} (ndarray)")
    return checked_argument(layer, name, value, kind, LayerArgumentError)


def optional_argument(layer: str, name: str, value, kind: str):
    """:func:`argument`, letting ``None`` (the argument's "not given") through."""
    return None if value is None else argument(layer, name, value, kind)


def normalized_shape_argument(layer: str, value) -> tuple:
    """A norm layer's ``normalized_shape``: a positive int or a non-empty sequence of them."""
    dims = (value,) if _is_int(value) else value
    if (not isinstance(dims, (tuple, list)) or not dims
            or not all(_is_int(n) and n > 0 for n in dims)):
        raise LayerArgumentError(f"{layer}: normalized_shape must be a positive int or a "
                                 f"non-empty tuple of positive ints, got {value!r}")
    return tuple(int(n) for n in dims)


def pair(value, name: str) -> tuple:
    """``3`` -> ``(3, 3)``; ``(2, 3)`` stays; anything else (floats included) is a
    :class:`LayerArgumentError` naming ``name``."""
    if _is_int(value):
        return int(value), int(value)
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = tuple(value.tolist())  # a NumPy pair, as PyTorch accepts
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(map(_is_int, value)):
        return int(value[0]), int(value[1])
    raise LayerArgumentError(f"{name} must be an int or a pair of ints, got {value!r}")


def check_groups(layer: str, groups, in_channels: int, out_channels: int) -> int:
    """``groups`` as a positive int dividing both channel counts, or an error naming ``layer``."""
    groups = argument(layer, "groups", groups, "positive int")
    if in_channels % groups or out_channels % groups:
        raise EveryOError(f"{layer}: groups={groups} must divide both in_channels "
                          f"({in_channels}) and out_channels ({out_channels})")
    return groups
