"""Window helpers shared by the convolution and pooling ops: padding NHWC arrays, strided
views of every window (im2col without copies), the slice one kernel position meets, the
one validation of a window geometry (kernel, stride, dilation), and the same padding and
windows on Tensors, which the ops' ``composite`` methods differentiate (second derivatives)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from everyo import EveryOError, dispatch
from everyo_layers.checks import pair
from everyo_layers.padding import resolve_padding


def check_geometry(owner: str, kernel, stride, dilation=(1, 1),
                   kernel_name: str = "kernel_size") -> tuple:
    """``(kernel, stride, dilation)`` as positive int pairs, or an error naming ``owner``.

    Example:
        >>> check_geometry("Conv2D", 3, 1, 2)
        ((3, 3), (1, 1), (2, 2))
    """
    kernel, stride = pair(kernel, f"{owner} {kernel_name}"), pair(stride, f"{owner} stride")
    dilation = pair(dilation, f"{owner} dilation")
    if min(kernel + stride + dilation) <= 0:
        raise EveryOError(f"{owner}: {kernel_name}, stride and dilation must be positive, got "
                          f"{kernel}, {stride}, {dilation}")
    return kernel, stride, dilation


def pad_hw(x: np.ndarray, pads: tuple, value=0) -> np.ndarray:
    """``x`` (NHWC) with ``pads = ((top, bottom), (left, right))`` added around H and W."""
    (top, bottom), (left, right) = pads
    if not (top or bottom or left or right):
        return x
    n, h, w, c = x.shape
    out = np.full((n, h + top + bottom, w + left + right, c), value, dtype=x.dtype)
    out[:, top:top + h, left:left + w, :] = x
    return out


def window_view(xp: np.ndarray, kernel: tuple, stride: tuple, dilation: tuple,
                out_hw: tuple) -> np.ndarray:
    """A read-only ``(N, Ho, Wo, kh, kw, C)`` view of every window of padded NHWC ``xp``."""
    sn, sh, sw, sc = xp.strides
    n, _, _, c = xp.shape
    shape = (n, out_hw[0], out_hw[1], kernel[0], kernel[1], c)
    strides = (sn, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1], sc)
    return as_strided(xp, shape, strides, writeable=False)


def window_slices(offset: tuple, stride: tuple, dilation: tuple, out_hw: tuple) -> tuple:
    """Index of the input elements that kernel position ``offset`` meets in every window."""
    (i, j), (sh, sw), (dh, dw), (ho, wo) = offset, stride, dilation, out_hw
    return (slice(None), slice(i * dh, i * dh + sh * (ho - 1) + 1, sh),
            slice(j * dw, j * dw + sw * (wo - 1) + 1, sw), slice(None))


def window_arguments(op: str, x: np.ndarray, kernel, stride, padding, dilation=(1, 1)) -> tuple:
    """``(kernel, stride, pads, dilation)`` of a window op called directly (``eo.conv2d``,
    ``eo.max_pool2d``...) with the layers' argument forms: ints or pairs, and any ``padding``
    :func:`resolve_padding` accepts ("valid", "same", ints, explicit pads).

    Example:
        >>> window_arguments("conv2d", np.zeros((1, 5, 5, 1)), 3, 2, "same")
        ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1))
    """
    if x.ndim != 4:
        raise EveryOError(f"{op}: expected NHWC input (4 axes), got shape {x.shape}")
    kernel, stride, dilation = check_geometry(op, kernel, stride, dilation, "kernel size")
    return kernel, stride, resolve_padding(padding, x.shape[1:3], kernel, stride, dilation), \
        dilation


def pad_hw_tensor(x, pads: tuple, value: float):
    """NHWC Tensor ``x`` padded on H and W by ``((top, bottom), (left, right))``."""
    if not any(pads[0] + pads[1]):
        return x
    return dispatch("pad", x, pad_width=((0, 0), pads[0], pads[1], (0, 0)), value=value)


def window_tensors(padded, kernel: tuple, stride: tuple, dilation: tuple, out_hw: tuple) -> list:
    """One ``(N, Ho, Wo, C)`` Tensor per kernel position: the elements it meets in each window."""
    return [dispatch("getitem", padded, index=window_slices((i, j), stride, dilation, out_hw))
            for i in range(kernel[0]) for j in range(kernel[1])]
