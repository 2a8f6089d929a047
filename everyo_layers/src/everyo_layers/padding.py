"""The one padding resolver of 2-D windows (convolution and pooling), shared with the ONNX
exporter: ``"valid"``, ``"same"`` (TensorFlow's rule) or explicit pads."""

from __future__ import annotations

import math
import numbers

from everyo import EveryOError


def effective_kernel(kernel: int, dilation: int) -> int:
    """Extent of a dilated kernel: ``(k - 1) * d + 1``."""
    return (kernel - 1) * dilation + 1


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple:
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + effective_kernel(kernel, dilation) - size, 0)
    # NOTE: TensorFlow puts the odd extra pad on the bottom/right (PyTorch's "same" agrees).
    return total // 2, total - total // 2


def resolve_padding(padding, input_hw, kernel_hw, stride_hw=(1, 1), dilation_hw=(1, 1)) -> tuple:
    """Turn a user's ``padding`` into ``((top, bottom), (left, right))``.

    Args:
        padding: ``"valid"`` (no padding), ``"same"`` (output ``ceil(in / stride)``, odd extra
            pad on the bottom/right, as TensorFlow), an int, ``(ph, pw)``, or
            ``((top, bottom), (left, right))``.
        input_hw, kernel_hw, stride_hw, dilation_hw: ``(height, width)`` pairs.

    Returns:
        ``((top, bottom), (left, right))`` as ints.

    Example:
        >>> resolve_padding("same", (8, 8), (4, 4), (1, 1))
        ((1, 2), (1, 2))
        >>> resolve_padding("same", (7, 7), (3, 3), (2, 2))
        ((1, 1), (1, 1))
        >>> resolve_padding(1, (5, 5), (3, 3))
        ((1, 1), (1, 1))
    """
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return (0, 0), (0, 0)
        if mode == "same":
            return tuple(_same_pads(*dims) for dims in
                         zip(input_hw, kernel_hw, stride_hw, dilation_hw))
        raise EveryOError(f"padding must be 'valid', 'same', an int or pairs, got {padding!r}")
    try:
        # NOTE: numbers.Integral also admits NumPy integers (pads computed with NumPy).
        if isinstance(padding, numbers.Integral):
            pads = ((int(padding),) * 2,) * 2
        elif all(isinstance(p, numbers.Integral) for p in padding):
            ph, pw = (int(p) for p in padding)
            pads = ((ph, ph), (pw, pw))
        else:
            (top, bottom), (left, right) = padding
            pads = ((int(top), int(bottom)), (int(left), int(right)))
    except (TypeError, ValueError):
        raise EveryOError(f"padding must be 'valid', 'same', an int, (ph, pw) or "
                          f"((top, bottom), (left, right)), got {padding!r}") from None
    if min(pads[0] + pads[1]) < 0:
        raise EveryOError(f"padding must not be negative, got {padding!r}")
    return pads


def output_size(size: int, kernel: int, stride: int, dilation: int, pads: tuple) -> int:
    """Output length along one axis: ``(size + pads - effective kernel) // stride + 1``.

    Example:
        >>> output_size(8, 3, 2, 1, (1, 1))
        4
    """
    return (size + pads[0] + pads[1] - effective_kernel(kernel, dilation)) // stride + 1
