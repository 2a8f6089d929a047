"""``eo.init``: PyTorch's parameter initialisers, in place, for EveryO's weight layouts.

The names, arguments and distributions are PyTorch's (``torch.nn.init``). Two differences:
the random numbers come from a NumPy ``Generator`` (``generator=``, default: the global one
that ``eo.manual_seed`` seeds), and fan-in/fan-out are read from EveryO's layouts, where the
*last* axis counts outputs and the one before it inputs: ``Linear.weight`` is ``(in, out)``,
``Conv2D.weight`` ``(kh, kw, in, out)``. So ``kaiming_uniform_(linear.weight)`` draws from the
same distribution as PyTorch's on the same layer.

Example:
    >>> import everyo as eo, numpy as np
    >>> layer = eo.Linear(256, 128)
    >>> _ = eo.init.kaiming_normal_(layer.weight, nonlinearity="relu",
    ...                             generator=np.random.default_rng(0))
    >>> round(float(layer.weight.data.std()), 2)  # sqrt(2 / fan_in) = 0.088
    0.09
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from everyo.dtypes import is_floating
from everyo.errors import EveryOError
from everyo.random import resolve_generator
from everyo.tensor import Tensor
from everyo.versioning import bump_version

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The recommended gain for ``nonlinearity`` (PyTorch's table).

    Example:
        >>> import everyo as eo
        >>> eo.init.calculate_gain("relu")
        1.4142135623730951
    """
    if nonlinearity in _LINEAR or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise EveryOError(f"calculate_gain: negative_slope {param!r} is not a number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise EveryOError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def calculate_fan_in_and_fan_out(tensor) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight in EveryO's layout (``(..., in, out)``).

    Example:
        >>> import everyo as eo
        >>> eo.init.calculate_fan_in_and_fan_out(eo.zeros(3, 3, 16, 32))  # Conv2D
        (144, 288)
    """
    shape = _array(tensor, "calculate_fan_in_and_fan_out").shape
    if len(shape) < 2:
        raise EveryOError(f"fan in and fan out need a weight with at least 2 axes, got shape "
                          f"{shape}")
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


def _fan(tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise EveryOError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def _array(tensor, name: str) -> np.ndarray:
    if not isinstance(tensor, Tensor):
        raise EveryOError(f"init.{name}: expected a Parameter or Tensor, got "
                          f"{type(tensor).__name__}")
    if not is_floating(tensor.data.dtype):
        raise EveryOError(f"init.{name}: the tensor must be floating, got {tensor.dtype}")
    return tensor.data


def _fill(tensor, values, name: str):
    """Write ``values`` into ``tensor`` in place (its dtype kept) and return the tensor."""
    target = _array(tensor, name)
    target[...] = values
    bump_version(tensor)
    return tensor


def _zero_elements(tensor, name: str) -> bool:
    """True (with PyTorch's warning) for a tensor with no elements: initialising it is a no-op
    (its fan is 0, so the scale would divide by zero)."""
    if _array(tensor, name).size:
        return False
    warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
    return True


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None):
    """Fill with samples of U(a, b)."""
    if not a <= b:
        raise EveryOError(f"init.uniform_: needs a <= b, got a={a}, b={b}")
    rng = resolve_generator(generator)
    return _fill(tensor, rng.uniform(a, b, _array(tensor, "uniform_").shape), "uniform_")


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None):
    """Fill with samples of N(mean, std²)."""
    if not std >= 0:
        raise EveryOError(f"init.normal_: std must be >= 0, got {std}")
    rng = resolve_generator(generator)
    return _fill(tensor, rng.normal(mean, std, _array(tensor, "normal_").shape), "normal_")


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator=None):
    """Fill with N(mean, std²) truncated to [a, b] (redrawing the samples that fall outside:
    the same distribution PyTorch's inverse-CDF sampling gives)."""
    if not std > 0:
        raise EveryOError(f"init.trunc_normal_: std must be > 0, got {std}")
    rng = resolve_generator(generator)
    shape = _array(tensor, "trunc_normal_").shape

    def cdf(x):
        return (1.0 + math.erf((x - mean) / std / math.sqrt(2.0))) / 2.0

    if not a < b or cdf(b) - cdf(a) < 1e-3:
        raise EveryOError(f"init.trunc_normal_: [a, b] = [{a}, {b}] holds too little of "
                          f"N({mean}, {std}²) to sample from")
    values = rng.normal(mean, std, shape)
    outside = (values < a) | (values > b)
    while outside.any():
        values[outside] = rng.normal(mean, std, int(outside.sum()))
        outside = (values < a) | (values > b)
    return _fill(tensor, values, "trunc_normal_")


def constant_(tensor, val: float):
    """Fill with ``val``."""
    return _fill(tensor, val, "constant_")


def zeros_(tensor):
    """Fill with zeros."""
    return constant_(tensor, 0.0)


def ones_(tensor):
    """Fill with ones."""
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor, gain: float = 1.0, generator=None):
    """Glorot uniform: U(-a, a) with ``a = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    if _zero_elements(tensor, "xavier_uniform_"):
        return tensor
    bound = gain * math.sqrt(2.0 / float(fan_in + fan_out)) * math.sqrt(3.0)
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None):
    """Glorot normal: N(0, std²) with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    if _zero_elements(tensor, "xavier_normal_"):
        return tensor
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator=None):
    """He uniform: U(-b, b) with ``b = gain * sqrt(3 / fan)`` (``a``: leaky_relu's slope)."""
    if _zero_elements(tensor, "kaiming_uniform_"):
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator=None):
    """He normal: N(0, std²) with ``std = gain / sqrt(fan)``."""
    if _zero_elements(tensor, "kaiming_normal_"):
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor, gain: float = 1.0, generator=None):
    """A (semi-)orthogonal matrix, scaled by ``gain``.

    Orthogonal in PyTorch's orientation for the same layer: the ``out`` axis (last here)
    against everything else flattened, so ``W.T @ W``-style identities hold as they would for
    the PyTorch weight.
    """
    array = _array(tensor, "orthogonal_")
    if array.ndim < 2:
        raise EveryOError(f"init.orthogonal_: needs at least 2 axes, got shape {array.shape}")
    rows = array.shape[-1]
    cols = array.size // rows
    flat = resolve_generator(generator).standard_normal((rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q *= np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    # NOTE: q is (out, everything else) as PyTorch's weight; move out back to the last axis.
    values = np.moveaxis((gain * q).reshape((rows,) + array.shape[:-1]), 0, -1)
    return _fill(tensor, values, "orthogonal_")


__all__ = ["calculate_gain", "calculate_fan_in_and_fan_out", "uniform_", "normal_",
           "trunc_normal_", "constant_", "zeros_", "ones_", "xavier_uniform_",
           "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_"]
