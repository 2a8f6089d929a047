"""Resizing NHWC input: ``UpSampling2D`` (nearest/bilinear), ``AdaptiveAvgPool2D`` and the global
poolings ``GlobalAvgPool2D``/``GlobalMaxPool2D``.

Nearest and bilinear resizing and adaptive average pooling are all linear maps applied
separately along H and W: ``out = rows @ x @ cols.T`` per sample and channel, with small
interpolation matrices. One op, ``resample2d``, applies any such pair with two batched matmuls;
its gradient is the same op with the transposed matrices.
"""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Module, Op, dispatch
from everyo_layers.checks import check_float, pair
from everyo_layers.precision import accumulation_dtype


def nearest_matrix(size: int, out: int, scale=None) -> np.ndarray:
    """``(out, size)`` selection: output i takes input ``floor(i * scale)``, ``scale`` being
    ``size / out`` unless given (PyTorch's ``nearest``, which uses ``1 / scale_factor`` when
    one is given, and Keras's integer upsampling).

    PyTorch's index rule exactly: an axis that keeps its length is copied and a doubled one
    repeats each pixel whatever the scale factor, and the product is rounded in float32 (its
    kernel's arithmetic for every dtype), which picks another pixel than exact arithmetic for
    some lengths (2 resized to 82)."""
    if out == size or out == 2 * size:
        scale = size / out
    step = np.float32(size) / np.float32(out) if scale is None else np.float32(scale)
    matrix = np.zeros((out, size))
    source = np.floor(np.arange(out, dtype=np.float32) * step).astype(int)
    matrix[np.arange(out), np.minimum(source, size - 1)] = 1.0
    return matrix


def bilinear_matrix(size: int, out: int, scale=None, align_corners: bool = False) -> np.ndarray:
    """``(out, size)`` linear interpolation.

    Half-pixel centres by default (PyTorch's ``align_corners=False``, TensorFlow's
    ``half_pixel_centers=True``): output i samples input ``(i + 0.5) * scale - 0.5`` (clamped
    at 0), ``scale`` being ``size / out`` unless given (PyTorch uses ``1 / scale_factor``,
    except on an axis that keeps its length, which it copies).
    ``align_corners=True`` maps the corner pixels onto each other: ``i * (size - 1) / (out -
    1)``.
    """
    if align_corners:
        src = np.arange(out) * ((size - 1) / (out - 1) if out > 1 else 0.0)
    else:
        scale = size / out if scale is None or out == size else scale
        src = np.maximum((np.arange(out) + 0.5) * scale - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(int), size - 1)
    high = np.minimum(low + 1, size - 1)
    frac = src - low
    matrix = np.zeros((out, size))
    np.add.at(matrix, (np.arange(out), low), 1.0 - frac)
    np.add.at(matrix, (np.arange(out), high), frac)
    return matrix


def adaptive_average_matrix(size: int, out: int) -> np.ndarray:
    """``(out, size)`` averaging: output i is the mean of inputs ``floor(i*size/out)`` to
    ``ceil((i+1)*size/out)`` (PyTorch's adaptive pooling windows)."""
    matrix = np.zeros((out, size))
    for i in range(out):
        start, end = (i * size) // out, math.ceil((i + 1) * size / out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


class Resample2DOp(Op):
    """``out[n, :, :, c] = rows @ x[n, :, :, c] @ cols.T`` for NHWC ``x``; ``rows`` is
    ``(Ho, H)`` and ``cols`` ``(Wo, W)`` (constant attributes, not differentiated)."""

    __slots__ = ("rows", "cols")
    saved_inputs = ()
    saves_output = False

    def forward(self, x, rows=None, cols=None):
        if x.ndim != 4 or rows.shape[1] != x.shape[1] or cols.shape[1] != x.shape[2]:
            raise EveryOError(f"resample2d: matrices {rows.shape} and {cols.shape} do not fit "
                              f"NHWC input {x.shape}")
        self.rows, self.cols = rows, cols
        return self.apply_arrays(x, rows, cols)

    @staticmethod
    def apply_arrays(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        compute = accumulation_dtype(x.dtype)
        n, h, w, c = x.shape
        xc = x.astype(compute, copy=False)
        tall = np.matmul(rows.astype(compute), xc.reshape(n, h, w * c))  # (N, Ho, W*C)
        ho = rows.shape[0]
        wide = np.matmul(cols.astype(compute), tall.reshape(n * ho, w, c))  # (N*Ho, Wo, C)
        return wide.reshape(n, ho, cols.shape[0], c).astype(x.dtype, copy=False)

    def backward(self, g):
        return (self.apply_arrays(g, self.rows.T, self.cols.T),)

    def backward_graph(self, g, out):
        return (dispatch("resample2d", g, rows=self.rows.T, cols=self.cols.T),)


def _check_nhwc(label: str, x) -> np.ndarray:
    data = check_float(label, x)
    if data.ndim != 4:
        raise EveryOError(f"{label}: expected NHWC input (4 axes), got shape {data.shape}")
    if 0 in data.shape[1:3]:  # no pixel to interpolate, average or take the maximum of
        raise EveryOError(f"{label}: expected NHWC input with at least one pixel, got shape "
                          f"{data.shape}")
    return data


class UpSampling2D(Module):
    """Enlarge NHWC input by integer factors ``size`` (Keras's ``UpSampling2D``).

    Args:
        size: int or (sh, sw) factor.
        interpolation: ``"nearest"`` (repeat each pixel) or ``"bilinear"`` (half-pixel
            centres, as ``torch.nn.Upsample(mode="bilinear", align_corners=False)``).

    Example:
        >>> import everyo as eo
        >>> eo.UpSampling2D(2)(eo.ones(1, 3, 4, 5)).shape
        (1, 6, 8, 5)
    """

    def __init__(self, size=2, interpolation: str = "nearest"):
        super().__init__()
        self.size = pair(size, "UpSampling2D size")
        if min(self.size) <= 0:
            raise EveryOError(f"UpSampling2D: size must be positive, got {self.size}")
        if interpolation not in ("nearest", "bilinear"):
            raise EveryOError(f"UpSampling2D: interpolation must be 'nearest' or 'bilinear', "
                              f"got {interpolation!r}")
        self.interpolation = interpolation

    def forward(self, x):
        data = _check_nhwc(f"UpSampling2D{self.size}", x)
        make = nearest_matrix if self.interpolation == "nearest" else bilinear_matrix
        (h, w), (sh, sw) = data.shape[1:3], self.size
        return dispatch("resample2d", x, rows=make(h, h * sh), cols=make(w, w * sw))

    def extra_repr(self) -> str:
        return f"size={self.size}, interpolation={self.interpolation!r}"


class AdaptiveAvgPool2D(Module):
    """Average pooling of NHWC input to a fixed ``output_size`` (PyTorch's windows).

    Example:
        >>> import everyo as eo
        >>> eo.AdaptiveAvgPool2D((2, 3))(eo.ones(4, 7, 9, 5)).shape
        (4, 2, 3, 5)
    """

    def __init__(self, output_size):
        super().__init__()
        self.output_size = pair(output_size, "AdaptiveAvgPool2D output_size")
        if min(self.output_size) <= 0:
            raise EveryOError(f"AdaptiveAvgPool2D: output_size must be positive, got "
                              f"{self.output_size}")

    def forward(self, x):
        data = _check_nhwc(f"AdaptiveAvgPool2D{self.output_size}", x)
        (h, w), (ho, wo) = data.shape[1:3], self.output_size
        return dispatch("resample2d", x, rows=adaptive_average_matrix(h, ho),
                        cols=adaptive_average_matrix(w, wo))

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class _GlobalPool2D(Module):
    reduction = ""

    def __init__(self, keepdims: bool = False):
        super().__init__()
        self.keepdims = bool(keepdims)

    def forward(self, x):
        _check_nhwc(type(self).__name__, x)
        return dispatch(self.reduction, x, axis=(1, 2), keepdims=self.keepdims)

    def extra_repr(self) -> str:
        return f"keepdims={self.keepdims}"


class GlobalAvgPool2D(_GlobalPool2D):
    """Mean over H and W of NHWC input: ``(N, C)``, or ``(N, 1, 1, C)`` with ``keepdims``.

    Example:
        >>> import everyo as eo
        >>> eo.GlobalAvgPool2D()(eo.ones(2, 4, 4, 3)).shape
        (2, 3)
    """

    reduction = "mean"


class GlobalMaxPool2D(_GlobalPool2D):
    """Maximum over H and W of NHWC input: ``(N, C)``, or ``(N, 1, 1, C)`` with ``keepdims``
    (tied maxima share the gradient).

    Example:
        >>> import everyo as eo
        >>> eo.GlobalMaxPool2D(keepdims=True)(eo.ones(2, 4, 4, 3)).shape
        (2, 1, 1, 3)
    """

    reduction = "max"


OPS = {"resample2d": Resample2DOp}
LAYERS = {"UpSampling2D": UpSampling2D, "AdaptiveAvgPool2D": AdaptiveAvgPool2D,
          "GlobalAvgPool2D": GlobalAvgPool2D, "GlobalMaxPool2D": GlobalMaxPool2D}
