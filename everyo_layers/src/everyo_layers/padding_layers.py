"""``ReflectionPad2D`` and ``ReplicationPad2D``: PyTorch's padding layers on NHWC input.

``padding`` is PyTorch's: an int, or ``(left, right, top, bottom)`` — W's pads first, as in
PyTorch's ``F.pad`` (on NHWC they apply to axes 2 and 1). Each layer is one ``eo.pad`` with
mode ``"reflect"`` (mirror without repeating the edge) or ``"replicate"`` (repeat the edge),
so its derivatives are the ``pad_mode`` op's.
"""

from __future__ import annotations

from everyo import EveryOError, Module, pad
from everyo_layers.checks import LayerArgumentError, _is_int, check_float


def _pads(name: str, padding) -> tuple:
    values = (padding,) * 4 if _is_int(padding) else padding
    if (not isinstance(values, (tuple, list)) or len(values) != 4
            or not all(_is_int(v) and v >= 0 for v in values)):
        raise LayerArgumentError(f"{name}: padding must be a non-negative int or 4 of them "
                                 f"(left, right, top, bottom), got {padding!r}")
    return tuple(int(v) for v in values)


class _Pad2D(Module):
    mode = ""

    def __init__(self, padding):
        super().__init__()
        self.padding = _pads(type(self).__name__, padding)

    def forward(self, x):
        label = f"{type(self).__name__}{self.padding}"
        data = check_float(label, x)
        if data.ndim not in (3, 4):
            raise EveryOError(f"{label}: expected NHWC (or HWC) input, got shape {data.shape}")
        left, right, top, bottom = self.padding
        h, w = data.shape[-3:-1]
        if self.mode == "reflect" and (max(top, bottom) >= h or max(left, right) >= w):
            raise EveryOError(f"{label}: reflection pads must be smaller than the input's "
                              f"height and width, got input {data.shape}")
        widths = ((0, 0),) * (data.ndim - 3) + ((top, bottom), (left, right), (0, 0))
        return pad(x, widths, mode=self.mode)

    def extra_repr(self) -> str:
        return f"padding={self.padding}"


class ReflectionPad2D(_Pad2D):
    """Mirror NHWC input at its borders, not repeating the edge (PyTorch's
    ``ReflectionPad2d``); ``padding`` is an int or ``(left, right, top, bottom)``.

    Example:
        >>> import everyo as eo
        >>> eo.ReflectionPad2D((1, 1, 2, 0))(eo.ones(1, 3, 4, 2)).shape
        (1, 5, 6, 2)
    """

    mode = "reflect"


class ReplicationPad2D(_Pad2D):
    """Repeat the edge pixels of NHWC input (PyTorch's ``ReplicationPad2d``); ``padding`` as
    :class:`ReflectionPad2D`.

    Example:
        >>> import everyo as eo
        >>> eo.ReplicationPad2D(2)(eo.ones(1, 3, 4, 2)).shape
        (1, 7, 8, 2)
    """

    mode = "replicate"


LAYERS = {"ReflectionPad2D": ReflectionPad2D, "ReplicationPad2D": ReplicationPad2D}
